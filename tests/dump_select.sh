#!/usr/bin/env bash
# What a run records, and that a verdict is never drawn from less than it claims:
#   * --dump-modules / --dump-steps record exactly what they say — in each listed step, the
#     names of the full dump's `order` that a glob matches, plus latents_in / latents_out, in the
#     same order and bit-identical values; no other step; the selection declared
#     (recorded_steps, recorded_modules "match:...") and the completeness marker written last;
#     the same on a parallel layout's global dump and with --check (which compares exactly the
#     selected tensors);
#   * a selection that selects nothing, steps the run does not have, or a selection nothing
#     records is refused (exit 2, one line, no file);
#   * a truncated producer dump is reported partial (exit 2) by flux-oracle and by --inputs and
#     --check=REF; a reference lacking a tensor the run records, without declaring it, is an
#     error (exit 2), while the diffusers reference's declared depth<=2 steps are not.
. "$(dirname "$0")/lib.sh"
SIM=$B/flux-sim ORC=$B/flux-oracle
ref=${FLUX_REFERENCE_DIR:-../shared/reference}
tmpdir select
if ! $PY -c 'import h5py' 2>/dev/null; then
  skip_all "dump selection: python3-h5py not installed — these tests did NOT run"
fi

RUN=(--config tiny --steps 3 --grid 4x4 --txt-len 8)
"$SIM" "${RUN[@]}" --dump "$T/full.h5" -q || { bad "full dump"; exit 1; }

# selected <narrow.h5> <globs> <steps>: the narrowed dump holds exactly the selection of full.h5
selected() {
  $PY - "$T/full.h5" "$@" <<'PY'
import sys, fnmatch, h5py, numpy as np
full, nar, globs, steps = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), sys.argv[3], sys.argv[4]
exact = len(sys.argv) < 6  # a parallel layout's values are the same up to rounding
def expand(t):
    out = set()
    for it in t.split(","):
        a, _, b = it.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return sorted(out)
gl = [g for g in globs.split(",") if g]
want_steps = expand(steps) if steps != "all" else [int(k[5:]) for k in full if k.startswith("step_")]
got_steps = sorted(int(k[5:]) for k in nar if k.startswith("step_"))
assert got_steps == want_steps, f"steps {got_steps} != {want_steps}"
assert nar.attrs["complete"] == 1, "no completeness marker"
rs = nar.attrs.get("recorded_steps", "all")
assert (rs == "all") if steps == "all" else expand(rs) == want_steps, f"recorded_steps {rs}"
n = 0
for s in want_steps:
    g, fg = nar[f"step_{s:04d}"], full[f"step_{s:04d}"]
    want = [x for x in fg.attrs["order"] if x in ("latents_in", "latents_out") or not gl or any(fnmatch.fnmatchcase(x, p) for p in gl)]
    got = list(g.attrs["order"])
    assert got == want, f"step {s}: {len(got)} names recorded, {len(want)} selected; first difference " \
        f"{next(((a, b) for a, b in zip(got, want) if a != b), (got[len(want):], want[len(got):]))}"
    assert sorted(g.keys()) == sorted(want), f"step {s}: datasets are not the order"
    assert g.attrs["recorded_modules"] == ("match:" + ",".join(gl) if gl else "all"), g.attrs["recorded_modules"]
    for x in want:
        a, b = g[x][()], fg[x][()]
        assert a.shape == b.shape and (np.array_equal(a, b) if exact else
            np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)), f"step {s} {x}: values differ from the full dump"
    n += len(want)
a, b = nar["final/latents"][()], full["final/latents"][()]
assert np.array_equal(a, b) if exact else np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)
print(f"{n} datasets in {len(want_steps)} steps")
PY
}

for sel in "single_transformer_blocks.3.*,proj_out|0,2" "transformer_blocks.1.attn*|all" "x_embedder,norm_out*|1"; do
  globs=${sel%|*}; steps=${sel#*|}
  args=(--dump-modules "$globs"); [ "$steps" != all ] && args+=(--dump-steps "$steps")
  if "$SIM" "${RUN[@]}" "${args[@]}" --dump "$T/n.h5" -q && out=$(selected "$T/n.h5" "$globs" "$steps" 2>&1); then
    ok "--dump-modules '$globs' --dump-steps $steps: exactly the selection ($out)"
  else bad "--dump-modules '$globs' --dump-steps $steps: $out"; fi
done
# only steps
if "$SIM" "${RUN[@]}" --dump-steps 1-2 --dump "$T/n.h5" -q && out=$(selected "$T/n.h5" "" "1,2" 2>&1); then
  ok "--dump-steps 1-2 alone: every module of steps 1 and 2 ($out)"
else bad "--dump-steps 1-2: $out"; fi

# parallel layouts write the same selection into their global dump; --check compares exactly it
for L in "2|--tp 2" "2|--ring 2" "4|--tp 2 --ulysses 2"; do
  n=${L%%|*}; lay=${L#*|}
  if timeout 300 mpirun -np "$n" "$SIM" "${RUN[@]}" $lay --check --dump-modules 'single_transformer_blocks.3.*,proj_out' \
      --dump-steps 0,2 --dump "$T/p.h5" >"$T/p.log" 2>&1 </dev/null && out=$(selected "$T/p.h5" 'single_transformer_blocks.3.*,proj_out' "0,2" parallel 2>&1); then
    cmp=$(grep -o "[0-9]* tensors compared" "$T/p.log" | cut -d' ' -f1)
    want=$(echo "$out" | cut -d' ' -f1)
    if [ "$cmp" = "$want" ]; then ok "mpirun -np $n $lay --check: the dump holds the selection and --check compared exactly its $cmp tensors"
    else bad "mpirun -np $n $lay: --check compared '$cmp' tensors, the selection has $want"; fi
  else bad "mpirun -np $n $lay with a selection: $(tail -n 2 "$T/p.log") $out"; fi
done

# flux-oracle: the narrowed dump against the full one passes (the rest is declared unrecorded)
"$SIM" "${RUN[@]}" --dump-modules 'transformer_blocks.0.*' --dump-steps 1 --dump "$T/n.h5" -q
if "$ORC" diff "$T/n.h5" "$T/full.h5" -q >"$T/o.log" 2>&1 && grep -q "only in B" "$T/o.log"; then
  ok "flux-oracle diff narrowed full: PASS, the rest declared unrecorded ($(cat "$T/o.log"))"
else bad "flux-oracle diff narrowed full: $(cat "$T/o.log")"; fi

# refusals: exit 2, one line, no file
refuse() { # tag expected-text args...
  local tag=$1 want=$2; shift 2
  rm -f "$T/r.h5"
  "$SIM" "$@" >"$T/r.log" 2>&1; local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$T/r.log")" -eq 1 ] && grep -q -- "$want" "$T/r.log" && [ -z "$(ls "$T"/r.h5* 2>/dev/null)" ]; then
    ok "$tag: exit 2, one line, no file ($(cut -c1-110 "$T/r.log"))"
  else bad "$tag: exit $rc: $(cat "$T/r.log")"; ls "$T"/r.h5* 2>/dev/null; fi
}
refuse "a glob that matches nothing" "matches no module" "${RUN[@]}" -q --dump "$T/r.h5" --dump-modules 'transformer_blocks.9.*'
refuse "a step the run does not have" "this run has 3 steps" "${RUN[@]}" -q --dump "$T/r.h5" --dump-steps 0,3
refuse "an empty glob list" "no glob" "${RUN[@]}" -q --dump "$T/r.h5" --dump-modules ,
refuse "a bad step list" "--dump-steps" "${RUN[@]}" -q --dump "$T/r.h5" --dump-steps 2-1
refuse "a selection nothing records" "nothing records" "${RUN[@]}" -q --dump-modules proj_out

# a truncated producer: the last step's order and the marker gone (what a kill leaves of an
# h5py writer that flushed as it went)
cp "$T/full.h5" "$T/cut.h5"
$PY -c "
import h5py; f = h5py.File('$T/cut.h5', 'a'); del f.attrs['complete']; del f['final']; del f['step_0002'].attrs['order']"
"$ORC" diff "$T/cut.h5" "$T/full.h5" -q >"$T/o.log" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "partial dump" "$T/o.log"; then ok "flux-oracle diff of a truncated dump: exit 2, partial ($(cut -c1-100 "$T/o.log"))"
else bad "flux-oracle diff of a truncated dump: exit $rc: $(cat "$T/o.log")"; fi
refuse "--inputs of a truncated dump" "partial dump" --config tiny --inputs "$T/cut.h5" -q --dump "$T/r.h5"
timeout 120 mpirun -np 2 "$SIM" --config tiny --inputs "$T/full.h5" --tp 2 --check="$T/cut.h5" -q >"$T/c.log" 2>&1 </dev/null; rc=$?
if [ $rc -eq 2 ] && grep -q "partial dump" "$T/c.log"; then ok "--check=REF of a truncated dump: exit 2, partial"
else bad "--check=REF of a truncated dump: exit $rc: $(head -3 "$T/c.log")"; fi
# a reference lacking a tensor without saying so: an error, not a skip
cp "$T/full.h5" "$T/hole.h5"
$PY -c "import h5py; f = h5py.File('$T/hole.h5', 'a'); del f['step_0001/transformer_blocks.1.ff.net.2']"
timeout 120 mpirun -np 2 "$SIM" --config tiny --inputs "$T/full.h5" --tp 2 --check="$T/hole.h5" >"$T/c.log" 2>&1 </dev/null; rc=$?
if [ $rc -eq 2 ] && grep -q "has no step 1 transformer_blocks.1.ff.net.2" "$T/c.log" && ! grep -q "check: OK" "$T/c.log"; then
  ok "--check=REF lacking an undeclared tensor: exit 2 naming it"
else bad "--check=REF lacking an undeclared tensor: exit $rc: $(grep error "$T/c.log")"; fi
# ...but a reference narrowed on purpose compares what it holds
"$SIM" "${RUN[@]}" --dump-modules 'single_transformer_blocks.*' --dump "$T/n.h5" -q
timeout 120 mpirun -np 2 "$SIM" --config tiny --inputs "$T/full.h5" --tp 2 --check="$T/n.h5" >"$T/c.log" 2>&1 </dev/null; rc=$?
if [ $rc -eq 0 ] && grep -q "more the reference declares unrecorded" "$T/c.log"; then
  ok "--check=REF of a narrowed reference: compares what it holds ($(grep -o '[0-9]* tensors compared ([^)]*)' "$T/c.log"))"
else bad "--check=REF of a narrowed reference: exit $rc: $(tail -n 2 "$T/c.log")"; fi
if [ -d "$ref/tiny" ]; then
  timeout 300 mpirun -np 2 "$SIM" --weights "$ref/tiny/weights.safetensors" --inputs "$ref/tiny/dump_fp32.h5" --tp 2 \
    --check="$ref/tiny/dump_fp32.h5" >"$T/c.log" 2>&1 </dev/null; rc=$?
  if [ $rc -eq 0 ] && grep -q "declares unrecorded" "$T/c.log"; then
    ok "--check=diffusers' dump_fp32.h5 (depth<=2 after step 0, declared): $(grep -o '[0-9]* tensors compared ([^)]*)' "$T/c.log")"
  else bad "--check=diffusers' dump: exit $rc: $(tail -n 2 "$T/c.log")"; fi
else skip "--check against the diffusers reference: $ref not found — did NOT run"; fi

finish
