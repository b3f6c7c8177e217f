#!/usr/bin/env bash
# diffusers' own context parallelism beyond 2 ranks and even chunks, and seed 001 as the customer
# hit it (issue 18). Each run is diffusers' `transformer.enable_parallelism(config=
# ContextParallelConfig(...))` on the CPU over gloo (tests/peer_cp.py, one process per rank, fp32,
# 2 steps, the run-time patches of docs/peers.md), dumped per rank with flux_dump and judged by the
# one documented command: `flux-oracle diff DIR REF.h5`, REF = `flux-sim --weights W --inputs
# DIR/rank_0.h5 --dump REF.h5`.
#   a. degree 3, uneven chunks (no token count divides by 3): ring 3 with ring_anything on FLUX.1
#      tiny (16 + 64 tokens) and FLUX.2 flux2-tiny (24 + 64); Ulysses 3 with ulysses_anything on a
#      FLUX.1 config of 5 heads (padded to 6 by diffusers), 7 + 25 tokens, batch 2 (the references'
#      4 heads cannot: diffusers asserts that the heads padded to a multiple of 3 be fewer than the
#      heads per rank). PASS, and the map's chunks are diffusers' tensor_split ones.
#   b. the unified mode, ulysses_degree=2 x ring_degree=2 (4 processes), FLUX.1 tiny: PASS; seed
#      000 planted there (every rank but 0 embeds timestep 0): exit 1 at step 0
#      time_text_embed.time_proj, ranks [1, 2, 3].
#   c. a reduced LSE planted into 0.42.1 (the attention op returns the heads' mean LSE to the ring
#      merge; patched at run time), ring 3: exit 1 at step 0 transformer_blocks.0.attn.to_out.0
#      (the first recorded output of the first ring attention), ranks [0, 1, 2].
#   d. seed 001 as the customer hit it: diffusers 0.37.1 (its version test `is_torch_version("<",
#      "2.9.0")` instead of `lse.ndim`) on torch 2.15, whose CPU flash kernel returns the LSE 3-D:
#      ring 2 on FLUX.1 tiny crashes at attention_dispatch.py:1909 with the customer's error (H 4
#      against head_dim 32 at dimension 3); on a config where S_local == H == head_dim (8 heads of
#      8, 4 + 12 tokens: 8 per rank) the shapes broadcast and it runs to the end, silently wrong:
#      exit 1 at step 0 transformer_blocks.0.attn.to_out.0, ranks [0, 1], while 0.42.1 on the same
#      config PASSes. 0.37.1 comes from tools/install-peer.sh (beside the venv, on PYTHONPATH);
#      without it this part alone is SKIPPED.
# FLUX_PEER_VENV: the venv (default .venv-peer); FLUX_PEER_OLD: diffusers 0.37.1's folder (default
# $FLUX_PEER_VENV/diffusers-0.37.1).
. "$(dirname "$0")/lib.sh"
VENV=${FLUX_PEER_VENV:-.venv-peer}
VPY=$VENV/bin/python
OLD=${FLUX_PEER_OLD:-$VENV/diffusers-0.37.1}
if [ ! -x "$VPY" ] || [ ! -f "$VENV/peer-stamp" ]; then
  skip_all "peer_cp: no peer venv at $VENV (tools/install-peer.sh makes it: PyPI torch + diffusers, ~2 min) — diffusers' degree-3, uneven, unified CP runs and seed 001 were NOT judged"
fi
if ! "$VPY" -c "import torch, diffusers, h5py, safetensors; from diffusers import ContextParallelConfig" 2>/dev/null; then
  bad "peer venv $VENV does not import torch/diffusers (rerun tools/install-peer.sh)"; finish
fi
for d in tiny flux2-tiny; do
  [ -f "$REF/$d/weights.safetensors" ] && [ -f "$REF/$d/dump_fp32.h5" ] ||
    skip_all "peer_cp: $REF/$d missing — diffusers' CP runs were NOT judged"
done
tmpdir peercp
ROOT=$PWD
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore
echo "peer venv: $(sed -n 2p "$VENV/peer-stamp")"

cp_run() {   # cp_run NP OUTDIR [PYTHONPATH-FIRST] -- FAMILY REFDIR ARGS...: NP gloo ranks of peer_cp.py
  local np=$1 out=$2 pp=$ROOT/python port=$((20000 + RANDOM % 20000)) r rc=0 pids=()
  shift 2
  if [ "$1" != -- ]; then pp=$1:$pp; shift; fi
  shift
  mkdir -p "$out"
  for ((r = 0; r < np; r++)); do
    RANK=$r WORLD_SIZE=$np LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port PYTHONPATH=$pp \
      timeout 300 "$VPY" tests/peer_cp.py "$@" "$out" >"$out.log.$r" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  return $rc
}
replay() {   # replay WEIGHTS DIR: REF = flux-sim replaying DIR/rank_0.h5 -> DIR.ref.h5
  timeout 300 "$SIM" --weights "$1" --inputs "$2/rank_0.h5" --dump "$2.ref.h5" -q </dev/null >"$2.ref.log" 2>&1
}
first_div() {   # first_div DIR REF: "rc verdict step name ranks" of flux-oracle diff --json DIR REF
  local rc
  "$ORACLE" diff --json "$1" "$2" >"$1.json" 2>"$1.err"; rc=$?
  echo "$rc $("$PY" -c "import json, sys; j = json.load(open(sys.argv[1])); d = j.get('first_divergence') or {}
print(j['verdict'], j['n_compared'], d.get('step'), d.get('name'), d.get('ranks'))" "$1.json" 2>&1)"
}
cp_pass() {   # cp_pass WHAT NP WEIGHTS DIR -- FAMILY REFDIR ARGS...: the run, its replay, diff DIR REF must PASS
  local what=$1 np=$2 w=$3 dir=$4 out rc; shift 4
  if ! cp_run "$np" "$dir" "$@"; then bad "$what: diffusers run failed: $(grep -v '^\[rank' "$dir.log.0" | tail -n 2) $(grep -m1 Error "$dir.log.0")"; return 1; fi
  if ! replay "$w" "$dir"; then bad "$what: flux-sim cannot replay rank_0.h5: $(tail -n 2 "$dir.ref.log")"; return 1; fi
  out=$("$ORACLE" diff "$dir" "$dir.ref.h5" 2>&1); rc=$?
  if [ $rc -eq 0 ] && grep -q '^PASS' <<<"$out"; then ok "$what: flux-oracle diff DIR REF exit 0: $(grep '^PASS' <<<"$out" | cut -d';' -f1)"
  else bad "$what: flux-oracle diff exit $rc: $(grep -E '^>>|^PASS|^DIVERGE|error' <<<"$out" | head -n 3)"; return 1; fi
}
synth_ref() {   # synth_ref DIR FLUX-SIM-ARGS...: a reference folder for DIR/config.json as the driver reads one:
  # make-checkpoint's float32 weights (seed 7) as DIR/weights.safetensors, flux-sim's inputs of a
  # 2-step run as DIR/dump_fp32.h5; its log in DIR/log
  local d=$1; shift
  "$B/make-checkpoint" -q --config "$d/config.json" --dtype f32 --weights-seed 7 "$d/ck" >"$d/log" 2>&1 &&
    cp "$d/ck/diffusion_pytorch_model.safetensors" "$d/weights.safetensors" &&
    "$SIM" --weights "$d/weights.safetensors" "$@" --steps 2 --dump "$d/dump_fp32.h5" -q </dev/null >>"$d/log" 2>&1
}
pmap() {   # pmap FILE EXPR: EXPR on the file's parallel attribute p
  "$PY" -c "import h5py, json, sys; p = json.loads(h5py.File(sys.argv[1], 'r').attrs['parallel']); print(eval(sys.argv[2]))" "$1" "$2" 2>&1
}
W1=$REF/tiny/weights.safetensors W2=$REF/flux2-tiny/weights.safetensors

# ---- a. degree 3, uneven chunks ----
if cp_pass "FLUX.1 tiny, ring 3 ring_anything (16 + 64 tokens)" 3 "$W1" "$T/f1-ring3" -- flux1 "$REF/tiny" --ring 3 --anything; then
  got=$(pmap "$T/f1-ring3/rank_2.h5" "(p['world'], p['rank'], p['mesh']['ring'], p['chunks'], p['sharding']['x_embedder']['ranges'], p['sharding']['context_embedder']['ranges'], p.get('unmapped', []))")
  want="(3, 2, 3, 'uneven (tensor_split: *_anything)', [[[0, 22]], [[22, 43]], [[43, 64]]], [[[0, 6]], [[6, 11]], [[11, 16]]], [])"
  [ "$got" = "$want" ] && ok "ring 3 map: tensor_split chunks 22/21/21 image, 6/5/5 text, nothing unmapped" || bad "ring 3 map: $got (want $want)"
fi
cp_pass "FLUX.2 flux2-tiny, ring 3 ring_anything (24 + 64 tokens)" 3 "$W2" "$T/f2-ring3" -- flux2 "$REF/flux2-tiny" --ring 3 --anything
# Ulysses 3 on 5 heads (ulysses_anything pads them to 6: 2 per rank, the last rank's second one
# padding), 7 + 25 tokens, batch 2; make-checkpoint weights, flux-sim inputs
U5=$T/h5; mkdir -p "$U5"
cat >"$U5/config.json" <<'JSON'
{"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 8, "out_channels": null, "num_layers": 1, "num_single_layers": 2, "attention_head_dim": 16, "num_attention_heads": 5, "joint_attention_dim": 32, "pooled_projection_dim": 16, "guidance_embeds": true, "axes_dims_rope": [4, 6, 6]}
JSON
if synth_ref "$U5" --grid 5x5 --txt-len 7 --batch 2; then
  if cp_pass "FLUX.1 5 heads of 16, Ulysses 3 ulysses_anything (7 + 25 tokens, batch 2; heads padded to 6)" 3 "$U5/weights.safetensors" "$T/u5-uly3" -- flux1 "$U5" --ulysses 3 --anything; then
    got=$(pmap "$T/u5-uly3/rank_1.h5" "(p['mesh']['ulysses'], p['sharding']['x_embedder']['ranges'], p['sharding']['pos_embed#0']['ranges'][1])")
    [ "$got" = "(3, [[[0, 9]], [[9, 17]], [[17, 25]]], [[3, 5], [16, 24]])" ] && ok "Ulysses 3 map: image 9/8/8, rank 1's joint RoPE rows text 3-5 + image 16-24" ||
      bad "Ulysses 3 map: $got"
  fi
else bad "Ulysses 3 config setup: $(tail -n 2 "$U5/log")"; fi

# ---- b. the unified mode ----
if cp_pass "FLUX.1 tiny, unified ulysses_degree=2 x ring_degree=2 (4 processes)" 4 "$W1" "$T/f1-uni" -- flux1 "$REF/tiny" --ulysses 2 --ring 2; then
  got=$(pmap "$T/f1-uni/rank_3.h5" "(p['world'], p['mesh'], p['sharding']['x_embedder']['ranges'][3])")
  [ "$got" = "(4, {'tp': 1, 'ulysses': 2, 'ring': 2}, [[48, 64]])" ] && ok "unified map: world 4, rank 3 of the flattened (ring, ulysses) mesh holds image tokens 48-64" ||
    bad "unified map: $got"
fi
# seed 000 under the unified mode: every rank but 0 embeds timestep 0 (the broadcast into a temporary)
if cp_run 4 "$T/uni-ts" -- flux1 "$REF/tiny" --ulysses 2 --ring 2 --bug timestep-ranks && [ -f "$T/f1-uni.ref.h5" ]; then
  got=$(first_div "$T/uni-ts" "$T/f1-uni.ref.h5")
  [ "$got" = "1 diverge 369 0 time_text_embed.time_proj [1, 2, 3]" ] &&
    ok "timestep zeroed on ranks > 0 (unified 2 x 2): exit 1 at step 0 time_text_embed.time_proj, ranks [1, 2, 3]" ||
    bad "timestep zeroed on ranks > 0, unified: $got (want 1 diverge 369 0 time_text_embed.time_proj [1, 2, 3])"
else
  bad "unified planted-bug run failed: $(grep -m1 Error "$T/uni-ts.log.0" 2>/dev/null)"
fi

# ---- c. a reduced LSE planted into 0.42.1's ring merge ----
if cp_run 3 "$T/lse" -- flux1 "$REF/tiny" --ring 3 --anything --bug lse-reduced && [ -f "$T/f1-ring3.ref.h5" ]; then
  got=$(first_div "$T/lse" "$T/f1-ring3.ref.h5")
  [ "$got" = "1 diverge 369 0 transformer_blocks.0.attn.to_out.0 [0, 1, 2]" ] &&
    ok "reduced LSE (ring 3, 0.42.1 patched at run time): exit 1 at step 0 transformer_blocks.0.attn.to_out.0, ranks [0, 1, 2]" ||
    bad "reduced LSE: $got (want 1 diverge 369 0 transformer_blocks.0.attn.to_out.0 [0, 1, 2])"
else
  bad "reduced-LSE run failed: $(grep -m1 Error "$T/lse.log.0" 2>/dev/null)"
fi

# ---- d. seed 001 on diffusers 0.37.1 ----
if [ ! -f "$OLD/diffusers/__init__.py" ] ||
   [ "$(PYTHONPATH=$OLD "$VPY" -c 'import diffusers; print(diffusers.__version__)' 2>/dev/null)" != 0.37.1 ]; then
  skip "peer_cp part d: no diffusers 0.37.1 at $OLD (tools/install-peer.sh places it; offline it needs the wheel in its cache) — seed 001's crash and silent variant on the customer's diffusers were NOT run"
else
  if cp_run 2 "$T/old-crash" "$OLD" -- flux1 "$REF/tiny" --ring 2; then
    bad "diffusers 0.37.1 ring 2 on tiny ran to the end; seed 001's crash expected"
  else
    msg=$(grep -m1 -o "RuntimeError: The size of tensor a (4) must match the size of tensor b (32) at non-singleton dimension 3" "$T/old-crash.log.0")
    at=$(grep -o 'diffusers/models/attention_dispatch.py", line [0-9]*, in forward' "$T/old-crash.log.0" | tail -n 1)
    [ -n "$msg" ] && [ "$at" = 'diffusers/models/attention_dispatch.py", line 1909, in forward' ] &&
      ok "diffusers 0.37.1, ring 2, FLUX.1 tiny: crashes in the ring merge (attention_dispatch.py:1909) with the customer's error: $msg" ||
      bad "diffusers 0.37.1 crash: '$msg' at '$at' (log $(grep -m1 Error "$T/old-crash.log.0"))"
  fi
  # S_local == H == head_dim: FLUX.1, 8 heads of 8 (RoPE axes 2/2/4), 4 text + 12 image tokens
  O=$T/sil; mkdir -p "$O"
  cat >"$O/config.json" <<'JSON'
{"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 8, "out_channels": null, "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 8, "num_attention_heads": 8, "joint_attention_dim": 32, "pooled_projection_dim": 16, "guidance_embeds": true, "axes_dims_rope": [2, 2, 4]}
JSON
  if synth_ref "$O" --grid 3x4 --txt-len 4; then
    cp_pass "control: diffusers 0.42.1, ring 2, 8 heads of 8, 2 + 6 tokens per rank" 2 "$O/weights.safetensors" "$T/new-sil" -- flux1 "$O" --ring 2
    if cp_run 2 "$T/old-sil" "$OLD" -- flux1 "$O" --ring 2 && grep -q "diffusers 0.37.1: " "$T/old-sil.log.0"; then
      ok "diffusers 0.37.1, same config: runs to the end without an error ($(tail -n 1 "$T/old-sil.log.0" | cut -c1-80)...)"
      if replay "$O/weights.safetensors" "$T/old-sil"; then
        got=$(first_div "$T/old-sil" "$T/old-sil.ref.h5")
        [ "$got" = "1 diverge 183 0 transformer_blocks.0.attn.to_out.0 [0, 1]" ] &&
          ok "seed 001 silent (0.37.1, S_local = H = head_dim = 8): flux-oracle diff DIR REF exit 1 at step 0 transformer_blocks.0.attn.to_out.0, ranks [0, 1]" ||
          bad "seed 001 silent: $got (want 1 diverge 183 0 transformer_blocks.0.attn.to_out.0 [0, 1])"
      else bad "flux-sim cannot replay 0.37.1's rank_0.h5: $(tail -n 2 "$T/old-sil.ref.log")"; fi
    else
      bad "diffusers 0.37.1 on the S_local == H == head_dim config failed: $(grep -m1 Error "$T/old-sil.log.0")"
    fi
  else bad "seed 001 config setup: $(tail -n 2 "$O/log")"; fi
fi
finish
