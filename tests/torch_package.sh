#!/usr/bin/env bash
# The flux_dump package (python/): installed as a user installs it, and its per-rank dumps.
#   1. `pip install --no-build-isolation --no-index --no-deps` (Debian's h5py has no metadata pip
#      sees) of a copy of python/ into a fresh venv
#      (--system-site-packages: torch, h5py, numpy from Debian) installs offline and imports there;
#      tools/torch/torch_dump.py still gives the same FluxDumper (a shim, no second copy).
#   2. diffusers-style context parallelism, 2 gloo processes (tests/torch_package_toy.py: a FLUX-named
#      toy whose `_cp_plan` is applied as diffusers' hooks apply it; real all_gathers of K/V and of
#      proj_out), *_anything (15 image, 5 text tokens: uneven) and even (16, 6) chunks: each rank's
#      file is complete and carries world/rank/mesh and a sharding map naming every dataset; the map
#      is right: every dataset of every step, reassembled through it, equals the single-process
#      run's (shards placed by their ranges, replicated copies each equal); and it is flux-sim's:
#      `mpirun -np 2 flux-sim --ring 2 --inputs rank_0.h5 --dump-per-rank` writes the same entry for
#      every name both record, except latents_in / proj_out / latents_out (flux-sim: the rank's
#      sequence shard; diffusers: the pipeline's whole latents and the gathered proj_out).
#   3. Megatron-style TP declared with declare_shard / declare_partial / declare_replicated on a
#      toy column/row-parallel attention (2 gloo processes): the shards concatenate and the
#      partial sums add up to the single-process run's tensors (default_entry="replicated" for the
#      rest); every entry is what `flux-sim --tp 2` writes for the same name (to_q/k/v, to_out.0 ...),
#      except the six modules the toy keeps whole where flux-sim shards them.
#   4. The bf16 recipe of flux_dump's docstring on tools/torch/torch_flux.py's FLUX with the tiny reference
#      weights: the dump is complete (the old recipe's /inputs/timesteps, bf16(t/1000), is refused
#      at close), flux-sim replays it and docs/bf16.md's three commands PASS it.
#   The declarations' entries without a run: declare_packed_shard (several intervals per rank, a
#   misfit refused), declare_flux_tp on a plan.
# Needs python3-torch/h5py (else SKIPPED), mpirun for flux-sim's side, the reference for part 4.
. "$(dirname "$0")/lib.sh"
PYT=/usr/bin/python3
if ! $PYT -c "import torch, torch.distributed as d, h5py, numpy; assert d.is_gloo_available()" 2>/dev/null; then
  skip_all "torch_package: $PYT lacks torch (with gloo) / h5py / numpy — it did NOT run"
fi
tmpdir torchpkg
ROOT=$PWD
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# ---- 1. install into a venv, offline ----
cp -r python "$T/src" && rm -rf "$T/src/build" "$T/src"/*.egg-info
if $PYT -m venv --system-site-packages "$T/venv" >"$T/venv.log" 2>&1 &&
   timeout 300 "$T/venv/bin/pip" install -q --no-build-isolation --no-index --no-deps "$T/src" >>"$T/venv.log" 2>&1; then
  loc=$(cd "$T" && "$T/venv/bin/python" -c "import flux_dump, torch; print(flux_dump.__file__, flux_dump.__version__)" 2>&1)
  [[ "$loc" == "$T/venv/"*"/flux_dump/__init__.py "* ]] && ok "pip install ./python into a venv (offline): $loc" || bad "venv import: $loc"
else
  bad "pip install into a venv failed: $(tail -n 3 "$T/venv.log")"
fi
out=$(PYTHONPATH=tools/torch $PYT -c "import torch_dump, flux_dump.dumper as d; print(torch_dump.FluxDumper is d.FluxDumper, torch_dump.pipeline_timesteps is d.pipeline_timesteps)" 2>&1)
[ "$out" = "True True" ] && ok "tools/torch/torch_dump.py re-exports the package's FluxDumper (one copy)" || bad "shim: $out"

# the declarations' entries without a run (tests/peer_tp.sh runs them on diffusers' models): a packed
# column-parallel output (diffusers' PackedColwiseParallel: FLUX.2's q|k|v|gate|up) is a piece of
# each block per rank; blocks that do not fit the local extent are refused
out=$(PYTHONPATH=python $PYT -c "
import json, torch.nn as nn
from flux_dump.sharding import declared_entry, declare_packed_shard, declare_flux_tp, _ATTR
m = declare_packed_shard(nn.Linear(2, 2), 1, 2, -1, [1, 1, 1, 2, 2])
print(json.dumps(declared_entry(getattr(m, _ATTR), (1, 5, 28))[0]))
try:
    declared_entry(getattr(m, _ATTR), (1, 5, 27)); print('accepted')
except ValueError as e:
    print('refused:', e)
t = nn.Module(); t.transformer_blocks = nn.ModuleList([nn.Module()]); b = t.transformer_blocks[0]
b.attn = nn.Module(); b.attn.to_q = nn.Linear(2, 2); b.attn.norm_q = nn.Identity(); b.attn.to_out = nn.ModuleList([nn.Linear(2, 2)])
print(sorted(declare_flux_tp(t, 0, 2, plan={'transformer_blocks.*.attn.to_q': 'colwise', 'transformer_blocks.*.attn.to_out.0': 'rowwise'})))" 2>&1)
want='{"dim": 2, "ranges": [[[0, 4], [8, 12], [16, 20], [24, 32], [40, 48]], [[4, 8], [12, 16], [20, 24], [32, 40], [48, 56]]]}
refused: packed blocks [1, 1, 1, 2, 2] over 2 ranks do not fit a local extent of 27
['"'"'transformer_blocks.0.attn.norm_q'"'"', '"'"'transformer_blocks.0.attn.to_out.0'"'"', '"'"'transformer_blocks.0.attn.to_q'"'"']'
[ "$out" = "$want" ] && ok "declare_packed_shard: a piece of each of 5 blocks per rank, a misfit refused; declare_flux_tp declares the plan and the QK norm after it" ||
  bad "declarations: $out"

# ---- 2, 3: two gloo processes per run ----
run2() {   # run2 MODE S_IMG S_TXT DIR: the single-process run, then 2 ranks
  local mode=$1 si=$2 st=$3 dir=$4 port=$((20000 + RANDOM % 20000)) r rc=0
  mkdir -p "$dir"
  PYTHONPATH=python timeout 120 $PYT tests/torch_package_toy.py "$mode" "$si" "$st" "$dir" >"$dir/log" 2>&1 || return 1
  for r in 0 1; do
    WORLD_SIZE=2 RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port PYTHONPATH=python timeout 180 \
      $PYT tests/torch_package_toy.py "$mode" "$si" "$st" "$dir" >"$dir/log.$r" 2>&1 &
  done
  for r in 0 1; do wait %$((r + 1)) 2>/dev/null || rc=1; done
  wait
  [ $rc -eq 0 ] && [ -f "$dir/rank_0.h5" ] && [ -f "$dir/rank_1.h5" ]
}
sim_ranks() {   # sim_ranks DIR LAYOUT...: flux-sim replays DIR/rank_0.h5 under LAYOUT, per-rank dumps in DIR/sim
  timeout 300 mpirun -np 2 "$SIM" --inputs "$1/rank_0.h5" "${@:2}" --dump-per-rank "$1/sim" -q </dev/null >"$1/sim.log" 2>&1
}
CHECK=$(cat <<'PY'
import sys, json, h5py, numpy as np
d, W, sim, expect_diff = sys.argv[1], 2, sys.argv[2], set(sys.argv[3].split(",")) - {""}
g = h5py.File(f"{d}/global.h5", "r"); rs = [h5py.File(f"{d}/rank_{r}.h5", "r") for r in range(W)]
ps = [json.loads(f.attrs["parallel"]) for f in rs]
bad = []
for r, (f, p) in enumerate(zip(rs, ps)):
    if f.attrs.get("complete") != 1: bad.append(f"rank_{r}.h5 not complete")
    if p.get("rank") != r or p.get("world") != W: bad.append(f"rank_{r}.h5 parallel rank/world {p.get('rank')}/{p.get('world')}")
    if p["sharding"] != ps[0]["sharding"] or p.get("partial") != ps[0].get("partial"): bad.append(f"rank_{r}.h5: another map")
sh, part = ps[0]["sharding"], ps[0].get("partial", {})
n = 0
for step in sorted(k for k in g if k.startswith("step_")):
    for name in g[step].attrs["order"]:
        G, L = g[step][name][...], [f[step][name][...] for f in rs]
        e = sh.get(name)
        if name in part:
            ok = np.allclose(sum(L), G, rtol=1e-4, atol=1e-5); how = "partial sum"
        elif e == "replicated":
            ok = all(x.shape == G.shape and np.allclose(x, G, rtol=1e-4, atol=1e-5) for x in L); how = "replicated"
        elif isinstance(e, dict):
            A = np.full(G.shape, np.nan)
            for r, x in enumerate(L):
                off = 0
                for a, b in e["ranges"][r]:
                    dst = [slice(None)] * G.ndim; src = [slice(None)] * G.ndim
                    dst[e["dim"]] = slice(a, b); src[e["dim"]] = slice(off, off + b - a); off += b - a
                    A[tuple(dst)] = x[tuple(src)]
                ok = off == x.shape[e["dim"]]
            ok = ok and not np.isnan(A).any() and np.allclose(A, G, rtol=1e-4, atol=1e-5); how = f"dim {e['dim']}"
        else:
            ok, how = False, "not in the map"
        n += 1
        if not ok: bad.append(f"{step}/{name} ({how}) does not reassemble to the single-process run's")
print(f"{n} datasets of {len([k for k in g if k.startswith('step_')])} steps reassembled through the map"
      + (f"; unmapped: {ps[0].get('unmapped')}" if ps[0].get("unmapped") else ""))
if sim != "-":
    fs = [json.loads(h5py.File(f"{sim}/rank_{r}.h5", "r").attrs["parallel"])["sharding"] for r in range(W)][0]
    common = [k for k in sh if k in fs]
    diff = {k for k in common if fs[k] != sh[k]}
    print(f"{len(common)} names in both maps; differing: {sorted(diff)}"
          + "".join(f"\n      {k}: flux-sim {json.dumps(fs[k])}, flux_dump {json.dumps(sh[k])}" for k in sorted(diff)))
    if diff != expect_diff: bad.append(f"entries differing from flux-sim's: {sorted(diff)}, expected {sorted(expect_diff)}")
    if len(common) < 20: bad.append(f"only {len(common)} names in common with flux-sim")
for b in bad[:8]: print("BAD", b)
sys.exit(1 if bad else 0)
PY
)
for c in "anything 15 5" "even 16 6"; do
  read -r mode si st <<<"$c"; dir=$T/cp-$mode
  if ! run2 "$mode" "$si" "$st" "$dir"; then bad "CP $mode: the toy run failed: $(tail -n 2 "$dir"/log* | tr '\n' ' ')"; continue; fi
  if sim_ranks "$dir" --ring 2; then s=$dir/sim; else bad "flux-sim --ring 2 --inputs rank_0.h5 failed: $(tail -n 2 "$dir/sim.log")"; s=-; fi
  if out=$($PYT -c "$CHECK" "$dir" "$s" "latents_in,proj_out,latents_out" 2>&1); then
    ok "diffusers-style CP ring 2, $mode chunks ($si image, $st text tokens): $(echo "$out" | tr '\n' ' ' | tr -s ' ')"
  else bad "CP $mode: $out"; fi
done
dir=$T/megatron
if ! run2 megatron 16 6 "$dir"; then bad "Megatron toy failed: $(tail -n 2 "$dir"/log* | tr '\n' ' ')"
else
  if sim_ranks "$dir" --tp 2; then s=$dir/sim; else bad "flux-sim --tp 2 failed: $(tail -n 2 "$dir/sim.log")"; s=-; fi
  # the toy keeps the text projections and the single block's MLP whole on every rank (flux-sim
  # shards them too): those names, and only those, differ from flux-sim's map
  keep=transformer_blocks.0.attn.add_q_proj,transformer_blocks.0.attn.add_k_proj,transformer_blocks.0.attn.add_v_proj
  keep=$keep,single_transformer_blocks.0.proj_mlp,single_transformer_blocks.0.act_mlp,single_transformer_blocks.0.attn
  out=$($PYT -c "$CHECK" "$dir" "$s" "$keep" 2>&1); rc=$?
  m=$($PYT -c "
import h5py, json; p = json.loads(h5py.File('$dir/rank_1.h5', 'r').attrs['parallel']); sh = p['sharding']
print(p['mesh'], 'to_q', json.dumps(sh['transformer_blocks.0.attn.to_q']), 'to_out.0', sh['transformer_blocks.0.attn.to_out.0'], 'partial', sorted(p['partial']))")
  if [ $rc -eq 0 ] && grep -q "'to_out.0.linear'\|to_out.0.linear" <<<"$m"; then ok "Megatron declarations, tp 2: $m; $(echo "$out" | tr '\n' ' ')"
  else bad "Megatron: $out / $m"; fi
fi

# ---- 4. the bf16 recipe ----
if [ ! -f "$REF/tiny/weights.safetensors" ]; then skip "bf16 recipe round trip: no reference in $REF — it did NOT run"
else
  W=$REF/tiny/weights.safetensors
  OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 PYTHONPATH=tools/torch:python $PYT - "$REF/tiny" "$T" >"$T/bf16.log" 2>&1 <<'PY'
import sys, torch, numpy as np
import torch_flux as tf
from flux_dump import FluxDumper, pipeline_timesteps
REF, T = sys.argv[1], sys.argv[2]
N = tf.Numerics("bfloat16"); cfg, inp, _, _ = tf.read_inputs(f"{REF}/dump_fp32.h5")
state, _ = tf.load_state(f"{REF}/weights.safetensors", N); transformer = tf.build_model(N, cfg, state)
bf = torch.bfloat16
latents0 = torch.from_numpy(inp["hidden_states"]).float().to(bf)
prompt_embeds = torch.from_numpy(inp["encoder_hidden_states"]).float().to(bf)
pooled = torch.from_numpy(inp["pooled_projections"]).float().to(bf)
img_ids, txt_ids = (torch.from_numpy(inp[k]).float().to(bf) for k in ("img_ids", "txt_ids"))
sigmas = torch.from_numpy(inp["sigmas"]).float()            # scheduler.sigmas: N+1 values
timesteps = sigmas[:-1] * 1000                               # scheduler.timesteps
B = latents0.shape[0]
guidance = torch.full([1], float(inp["guidance"][0]), dtype=torch.float32).expand(B)

def run(path, recorded_timesteps):
    latents = latents0
    with FluxDumper(path, transformer, config=cfg) as d, torch.no_grad():
        d.write_inputs(hidden_states=latents, encoder_hidden_states=prompt_embeds, pooled_projections=pooled,
                       img_ids=img_ids, txt_ids=txt_ids, guidance=guidance, sigmas=sigmas,
                       timesteps=recorded_timesteps)
        for i, t in enumerate(timesteps):          # the docstring's loop, word for word
            timestep = t.expand(B).to(latents.dtype) / 1000
            with d.step(i, timestep=timestep, sigma=sigmas[i], sigma_next=sigmas[i + 1]):
                d.record("latents_in", latents)
                v = transformer(hidden_states=latents, timestep=timestep, guidance=guidance,
                                pooled_projections=pooled, encoder_hidden_states=prompt_embeds,
                                txt_ids=txt_ids, img_ids=img_ids)[0]
                # FlowMatchEulerDiscreteScheduler.step: float32 sample, back to v's dtype
                latents = (latents.to(torch.float32) + (sigmas[i + 1] - sigmas[i]) * v).to(v.dtype)
                d.record("latents_out", latents)
        d.final(latents)

old = (timesteps / 1000).to(bf)
new = pipeline_timesteps(timesteps, bf)
print("timesteps: old recipe", old.float().tolist(), "passed", new.float().tolist())
try:
    run(f"{T}/old.h5", old)
    print("OLD-RECIPE-ACCEPTED")
except ValueError as e:
    print("OLD-RECIPE-REFUSED", e)
run(f"{T}/run.h5", new)
print("RECIPE-DONE")
PY
  if grep -q RECIPE-DONE "$T/bf16.log"; then
    if grep -q OLD-RECIPE-REFUSED "$T/bf16.log"; then ok "the old recipe's bf16(t/1000) is refused at close: $(grep -o 'OLD-RECIPE-REFUSED.*' "$T/bf16.log" | cut -c20-180)"
    else echo "info the old recipe's timesteps equal the passed ones for these sigmas: $(grep '^timesteps' "$T/bf16.log")"; fi
    if $SIM --weights "$W" --inputs "$T/run.h5" --precision bf16 --dump "$T/sim_bf16.h5" -q >"$T/sim.log" 2>&1 &&
       $SIM --weights "$W" --inputs "$T/run.h5" --precision fp64 --match bf16 --dump "$T/sim_m64.h5" -q >>"$T/sim.log" 2>&1; then
      out=$($ORACLE diff "$T/run.h5" "$T/sim_bf16.h5" --truth "$T/sim_m64.h5" -q 2>&1); rc=$?
      [ $rc -eq 0 ] && grep -q '^PASS' <<<"$out" && ok "bf16 recipe: flux-sim replays the dump and docs/bf16.md's verdict passes it: $out" ||
        bad "bf16 recipe verdict: exit $rc: $out"
    else bad "flux-sim cannot replay the bf16 recipe's dump: $(tail -n 2 "$T/sim.log")"; fi
  else bad "the bf16 recipe run failed: $(tail -n 4 "$T/bf16.log")"; fi
fi
finish
