#!/usr/bin/env bash
# Tensor parallelism on diffusers' real FluxTransformer2DModel, written as users write it, dumped
# per rank with flux_dump and judged by the one documented command (issue 18): 2 gloo processes on
# the CPU, ../shared/reference/tiny (config, weights, the inputs of dump_fp32.h5), FluxPipeline's
# loop for 2 steps in fp32 (tests/peer_tp.py); REF = flux-sim --weights W --inputs DIR/rank_0.h5
# --dump REF.h5; verdict = flux-oracle diff DIR REF.h5.
#   a. Megatron TP the seeds' way: the Linears replaced at run time by seed 000's _Col/_Row
#      (dist.all_reduce), heads split, declared with declare_shard/declare_partial and
#      default_entry="replicated": PASS (the _Row partial products, which a global reference
#      lacks, listed only in A); with _Row's product inline (--row-inline: nothing partial)
#      `flux-oracle assemble` takes the dumps and the global one passes. Seed 000's TP-1 planted (the single blocks' proj_out sliced by
#      contiguous columns): exit 1 at step 0 single_transformer_blocks.0.proj_out, ranks 0,1.
#      Seed 000's TP-2 planted (the schedule broadcast into a temporary: ranks > 0 keep zeros):
#      exit 1 at /inputs/timesteps, rank 1 (the recipe records what rank 1 passed), and the
#      first module out is step 0 time_text_embed.time_proj, rank 1 alone.
#   b. torch DTensor TP: parallelize_module with ColwiseParallel/RowwiseParallel(use_local_output=
#      False) on the blocks' Linears over DeviceMesh("cpu", (2,)), the map from the placements:
#      PASS; `flux-oracle assemble DIR -o G.h5` gives a global dump that passes against REF.
#      Plain RowwiseParallel on the single blocks' proj_out (contiguous Shard(1) of its input
#      columns, i.e. seed 000's TP-1): exit 1 at step 0 single_transformer_blocks.0.proj_out.
#   c. diffusers' own TP (enable_parallelism(config=TensorParallelConfig(tp_degree=2)), the class's
#      `_tp_plan`) on the CPU after two run-time patches, mapped by FluxDumper itself: PASS.
#   d. FLUX.2 (flux2-tiny): diffusers' own TP 2 (tests/peer_diffusers.py --tp), its packed
#      column-parallel Linears mapped as a piece of each block per rank: PASS; assembled: PASS.
#   flux_dump.declare_flux_tp (the map from a `_tp_plan`) declares what part a declares by hand,
#   and refuses a style it cannot map.
# Without the peer venv (tools/install-peer.sh) or the reference: SKIPPED. FLUX_PEER_VENV: the
# venv (default .venv-peer). The hook is this checkout's python/flux_dump (PYTHONPATH).
. "$(dirname "$0")/lib.sh"
VENV=${FLUX_PEER_VENV:-.venv-peer}
VPY=$VENV/bin/python
if [ ! -x "$VPY" ] || [ ! -f "$VENV/peer-stamp" ]; then
  skip_all "peer_tp: no peer venv at $VENV (tools/install-peer.sh makes it: PyPI torch + diffusers, ~2 min) — Megatron and DTensor TP on diffusers' FLUX were NOT judged"
fi
if ! "$VPY" -c "import torch, diffusers, h5py, safetensors; from torch.distributed.tensor.parallel import parallelize_module; from diffusers import FluxTransformer2DModel" 2>/dev/null; then
  bad "peer venv $VENV does not import torch/diffusers/DTensor TP (rerun tools/install-peer.sh)"; finish
fi
[ -f "$REF/tiny/weights.safetensors" ] && [ -f "$REF/tiny/dump_fp32.h5" ] ||
  skip_all "peer_tp: $REF/tiny missing — Megatron and DTensor TP on diffusers' FLUX were NOT judged"
tmpdir peertp
ROOT=$PWD
export OMP_NUM_THREADS=1 PYTHONPATH=$ROOT/python PYTHONWARNINGS=ignore
W=$REF/tiny/weights.safetensors

tp2() {   # tp2 OUTDIR ARGS...: two gloo ranks of tests/peer_tp.py
  local port=$((20000 + RANDOM % 20000)) r rc=0 pids=()
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 300 "$VPY" tests/peer_tp.py "$REF/tiny" "$1" "${@:2}" >"$1.log.$r" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  return $rc
}
verdict() {   # verdict DIR REF: "EXIT VERDICT STEP GROUP NAME RANKS" of flux-oracle diff --json DIR REF
  local rc
  "$ORACLE" diff --json "$1" "$2" >"$1.json" 2>"$1.err"; rc=$?
  echo "$rc $("$PY" -c "
import json, sys
j = json.load(open(sys.argv[1])); d = j.get('first_divergence') or {}
print(j['verdict'], d.get('step'), d.get('group'), d.get('name'), d.get('ranks'), len(j['datasets']), len(j.get('only_in_a', [])))" "$1.json" 2>&1)"
}

proj_out_caught() {   # proj_out_caught WHAT DIR TP: seed 000's contiguous proj_out planted under --tp TP must
  # stop flux-oracle diff DIR REF with exit 1 at step 0 single_transformer_blocks.0.proj_out, ranks 0,1
  if tp2 "$2" --tp "$3" --bug proj-out-contiguous; then
    local got; got=$(verdict "$2" "$REFH")
    [[ "$got" == "1 diverge 0 /step_0000 single_transformer_blocks.0.proj_out [0, 1] "* ]] &&
      ok "$1: exit 1, first divergence step 0 single_transformer_blocks.0.proj_out, ranks 0,1" ||
      bad "$1: $got $(head -c 300 "$2.err")"
  else bad "$1: the run failed: $(tail -n 4 "$2.log.0")"; fi
}

# ---- a. Megatron, the seeds' _Col/_Row ----
M=$T/megatron REFH=$T/ref.h5
if ! tp2 "$M" --tp megatron; then
  bad "Megatron TP 2 run failed: $(tail -n 4 "$M.log.0")"
elif ! timeout 300 "$SIM" --weights "$W" --inputs "$M/rank_0.h5" --dump "$REFH" -q </dev/null >"$REFH.log" 2>&1; then
  bad "flux-sim cannot replay the Megatron run's rank_0.h5: $(tail -n 3 "$REFH.log")"
else
  out=$("$ORACLE" diff "$M" "$REFH" 2>&1); rc=$?
  got=$("$PY" -c "
import h5py, json, sys
p = json.loads(h5py.File(sys.argv[1], 'r').attrs['parallel']); sh = p['sharding']
print(p['engine'], json.dumps(sh['transformer_blocks.0.attn.to_q']), json.dumps(sh['transformer_blocks.0.attn.norm_q']),
      sh['single_transformer_blocks.0.proj_out'], len(p['partial']), 'single_transformer_blocks.0.proj_out.mm' in p['partial'])" "$M/rank_1.h5" 2>&1)
  want='declared {"dim": 2, "ranges": [[[0, 64]], [[64, 128]]]} {"dim": 2, "ranges": [[[0, 2]], [[2, 4]]]} replicated 12 True'
  [ "$got" = "$want" ] && ok "Megatron map from the declarations: to_q / norm_q shards (last axis / heads), proj_out replicated, 12 _Row partial products" ||
    bad "Megatron map: $got (want $want)"
  h=$(grep -h '^declare_flux_tp' "$M.log.0" "$M.log.1" | sort -u)
  [ "$h" = "declare_flux_tp: the same declarations as by hand (64 shards, 12 partial)" ] &&
    ok "flux_dump.declare_flux_tp on the Megatron model: $h" || bad "declare_flux_tp vs the hand declarations: '$h' $(tail -n 2 "$M.log.0")"
  if [ $rc -eq 0 ] && grep -q '^PASS: 0 of 369 .*24 only in A, 0 only in B' <<<"$out"; then
    ok "Megatron TP 2 (seed 000's _Col/_Row + all_reduce), flux-oracle diff DIR REF: $(grep '^PASS' <<<"$out")"
  else bad "Megatron TP 2: exit $rc: $(tail -n 3 <<<"$out")"; fi
fi

if [ -f "$REFH" ]; then
  # _Row's product computed inline (no `mm` recorded, nothing partial): assemble takes the dumps
  if tp2 "$T/meg-inline" --tp megatron --row-inline; then
    if "$ORACLE" assemble "$T/meg-inline" -o "$T/meg-global.h5" >"$T/meg-asm.log" 2>&1 &&
       out=$("$ORACLE" diff "$T/meg-global.h5" "$REFH" 2>&1) && grep -q '^PASS: 0 of 369 .*0 only in A, 0 only in B' <<<"$out"; then
      ok "Megatron with _Row's product inline: assemble DIR -o G.h5, G vs REF: $(grep '^PASS' <<<"$out")"
    else bad "Megatron --row-inline assemble: $(tail -n 2 "$T/meg-asm.log") $(tail -n 2 <<<"$out")"; fi
  else bad "Megatron --row-inline run failed: $(tail -n 4 "$T/meg-inline.log.0")"; fi

  proj_out_caught "seed 000 TP-1 (proj_out by contiguous columns), Megatron" "$T/meg-proj" megatron

  if tp2 "$T/meg-ts" --tp megatron --bug timestep-temporary; then
    got=$(verdict "$T/meg-ts" "$REFH")
    mod=$("$PY" -c "
import json, sys
j = json.load(open(sys.argv[1])); d = [x for x in j['datasets'] if not x['pass'] and x['group'].startswith('/step')][0]
print(d['group'], d['name'], d['ranks'])" "$T/meg-ts.json" 2>&1)
    [[ "$got" == "1 diverge None /inputs timesteps [1] "* ]] && [ "$mod" = "/step_0000 time_text_embed.time_proj [1]" ] &&
      ok "seed 000 TP-2 (timesteps broadcast into a temporary), Megatron: exit 1, first divergence /inputs/timesteps rank 1; first module out: step 0 time_text_embed.time_proj, rank 1" ||
      bad "seed 000 TP-2, Megatron: $got / $mod"
  else bad "Megatron TP-2 run failed: $(tail -n 4 "$T/meg-ts.log.0")"; fi
fi

# ---- b. torch DTensor ----
D=$T/dtensor
if ! tp2 "$D" --tp dtensor; then
  bad "DTensor TP 2 run failed: $(tail -n 4 "$D.log.0")"
elif ! timeout 300 "$SIM" --weights "$W" --inputs "$D/rank_0.h5" --dump "$D.ref.h5" -q </dev/null >"$D.ref.log" 2>&1; then
  bad "flux-sim cannot replay the DTensor run's rank_0.h5: $(tail -n 3 "$D.ref.log")"
else
  REFH=$D.ref.h5
  out=$("$ORACLE" diff "$D" "$REFH" 2>&1); rc=$?
  got=$("$PY" -c "
import h5py, json, sys
p = json.loads(h5py.File(sys.argv[1], 'r').attrs['parallel']); sh = p['sharding']
print(p['engine'], p['dtensor_mesh'], json.dumps(sh['transformer_blocks.0.ff.net.0.proj']), sh['transformer_blocks.0.ff.net.2'], 'partial' in p)" "$D/rank_0.h5" 2>&1)
  want="declared,dtensor {'shape': [2], 'names': ['tp']} {\"dim\": 2, \"ranges\": [[[0, 256]], [[256, 512]]]} replicated False"
  [ "$got" = "$want" ] && ok "DTensor map: the Linears' entries from their placements (Shard(-1) -> dim 2, Replicate), mesh [2] 'tp'" ||
    bad "DTensor map: $got (want $want)"
  if [ $rc -eq 0 ] && grep -q '^PASS: 0 of 369 .*0 only in A, 0 only in B' <<<"$out"; then
    ok "DTensor TP 2 (parallelize_module, Colwise/RowwiseParallel, gloo), flux-oracle diff DIR REF: $(grep '^PASS' <<<"$out")"
  else bad "DTensor TP 2: exit $rc: $(tail -n 3 <<<"$out")"; fi
  if "$ORACLE" assemble "$D" -o "$T/dt-global.h5" >"$T/asm.log" 2>&1; then
    out=$("$ORACLE" diff "$T/dt-global.h5" "$REFH" 2>&1); rc=$?
    [ $rc -eq 0 ] && grep -q '^PASS: 0 of 369' <<<"$out" && ok "DTensor: flux-oracle assemble DIR -o G.h5, G vs REF: $(grep '^PASS' <<<"$out")" ||
      bad "DTensor assembled vs REF: exit $rc $(tail -n 2 <<<"$out")"
  else bad "DTensor assemble: $(tail -n 2 "$T/asm.log")"; fi
  proj_out_caught "plain RowwiseParallel on proj_out (seed 000 TP-1 through DTensor)" "$T/dt-proj" dtensor
fi

# ---- c. diffusers' own tensor parallelism (enable_parallelism(config=TensorParallelConfig(tp_degree=2)),
# the class's _tp_plan; two CPU patches, nothing computed changed: tests/peer_tp.py) ----
C=$T/diffusers-tp
if ! tp2 "$C" --tp diffusers; then
  bad "diffusers TensorParallelConfig(tp_degree=2) run failed: $(tail -n 4 "$C.log.0")"
elif ! timeout 300 "$SIM" --weights "$W" --inputs "$C/rank_0.h5" --dump "$C.ref.h5" -q </dev/null >"$C.ref.log" 2>&1; then
  bad "flux-sim cannot replay the diffusers TP run's rank_0.h5: $(tail -n 3 "$C.ref.log")"
else
  out=$("$ORACLE" diff "$C" "$C.ref.h5" 2>&1); rc=$?
  got=$("$PY" -c "
import h5py, json, sys
p = json.loads(h5py.File(sys.argv[1], 'r').attrs['parallel']); sh = p['sharding']
print(p['engine'], p['mesh'], json.dumps(sh['single_transformer_blocks.3.attn']), sh['single_transformer_blocks.3.proj_out'])" "$C/rank_1.h5" 2>&1)
  want="declared,diffusers-tp {'tp': 2, 'ulysses': 1, 'ring': 1} {\"dim\": 2, \"ranges\": [[[0, 64]], [[64, 128]]]} replicated"
  [ "$got" = "$want" ] && ok "diffusers TP: FluxDumper maps it by itself from the model's TensorParallelConfig and _tp_plan (nothing declared by the caller)" ||
    bad "diffusers TP map: $got (want $want)"
  if [ $rc -eq 0 ] && grep -q '^PASS: 0 of 369 .*0 only in A, 0 only in B' <<<"$out"; then
    ok "diffusers' own TP 2 (enable_parallelism + TensorParallelConfig, _tp_plan with PackedRowwiseParallel proj_out) on CPU, flux-oracle diff DIR REF: $(grep '^PASS' <<<"$out")"
  else bad "diffusers TP 2: exit $rc: $(tail -n 3 <<<"$out")"; fi
fi
# ---- d. FLUX.2: diffusers' own TP 2 on Flux2Transformer2DModel (flux2-tiny), its plan's packed
# column-parallel Linears (to_qkv_mlp_proj: q|k|v|gate|up; ff.linear_in: gate|up) mapped as a
# piece of each block per rank (several intervals), run by tests/peer_diffusers.py --tp ----
F2=$T/flux2-tp
if [ ! -f "$REF/flux2-tiny/weights.safetensors" ] || [ ! -f "$REF/flux2-tiny/dump_fp32.h5" ]; then
  skip "FLUX.2 diffusers TP: no $REF/flux2-tiny — it did NOT run"
else
  port=$((20000 + RANDOM % 20000)); pids=(); rc=0
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 300 "$VPY" tests/peer_diffusers.py flux2 "$REF/flux2-tiny" "$F2" --tp >"$F2.log.$r" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  if [ $rc -ne 0 ]; then bad "FLUX.2 diffusers TP 2 run failed: $(tail -n 4 "$F2.log.0")"
  elif ! timeout 300 "$SIM" --weights "$REF/flux2-tiny/weights.safetensors" --inputs "$F2/rank_0.h5" --dump "$F2.ref.h5" -q </dev/null >"$F2.ref.log" 2>&1; then
    bad "flux-sim cannot replay the FLUX.2 TP run's rank_0.h5: $(tail -n 3 "$F2.ref.log")"
  else
    got=$("$PY" -c "
import h5py, json, sys
p = json.loads(h5py.File(sys.argv[1], 'r').attrs['parallel']); sh = p['sharding']
print(p['engine'], json.dumps(sh['single_transformer_blocks.0.attn.to_qkv_mlp_proj']), json.dumps(sh['transformer_blocks.0.ff.act_fn']), sh['single_transformer_blocks.0.attn'])" "$F2/rank_1.h5" 2>&1)
    want='declared,diffusers-tp {"dim": 2, "ranges": [[[0, 64], [128, 192], [256, 320], [384, 576], [768, 960]], [[64, 128], [192, 256], [320, 384], [576, 768], [960, 1152]]]} {"dim": 2, "ranges": [[[0, 192]], [[192, 384]]]} replicated'
    [ "$got" = "$want" ] && ok "FLUX.2 diffusers TP map: to_qkv_mlp_proj a piece of each of q|k|v|gate|up, act_fn a shard, attn whole" ||
      bad "FLUX.2 diffusers TP map: $got (want $want)"
    out=$("$ORACLE" diff "$F2" "$F2.ref.h5" 2>&1); rc=$?
    [ $rc -eq 0 ] && grep -q '^PASS: 0 of 252 .*0 only in A, 0 only in B' <<<"$out" &&
      ok "FLUX.2 diffusers' own TP 2 (packed column-parallel plan), flux-oracle diff DIR REF: $(grep '^PASS' <<<"$out")" ||
      bad "FLUX.2 diffusers TP 2: exit $rc: $(tail -n 3 <<<"$out")"
    if "$ORACLE" assemble "$F2" -o "$F2.global.h5" >"$F2.asm.log" 2>&1 &&
       out=$("$ORACLE" diff "$F2.global.h5" "$F2.ref.h5" 2>&1) && grep -q '^PASS: 0 of 252' <<<"$out"; then
      ok "FLUX.2 TP: assemble DIR (several intervals per rank) -o G.h5, G vs REF: $(grep '^PASS' <<<"$out")"
    else bad "FLUX.2 TP assemble: $(tail -n 2 "$F2.asm.log") $(tail -n 2 <<<"$out")"; fi
  fi
fi

# a style declare_flux_tp cannot map is refused up front, not written as a wrong map
got=$(PYTHONPATH=$ROOT/python "$VPY" -c "
import torch.nn as nn
from flux_dump import declare_flux_tp
class Odd: pass
m = nn.Module(); m.transformer_blocks = nn.ModuleList([nn.Module()]); m.transformer_blocks[0].to_q = nn.Linear(4, 4)
try:
    declare_flux_tp(m, 0, 2, plan={'transformer_blocks.*.to_q': Odd()}); print('accepted')
except ValueError as e:
    print('refused', e)" 2>&1 | tail -n 1)
[[ "$got" == "refused _tp_plan 'transformer_blocks.*.to_q': style Odd is not mapped"* ]] &&
  ok "declare_flux_tp refuses a style it cannot map: ${got:8:100}" || bad "declare_flux_tp, unknown style: $got"
finish
