#!/usr/bin/env bash
# The CLI's dump, read back by independent tools (h5py + NumPy, h5dump):
#  1. replaying ../shared/reference/tiny (fp64) writes a dump that holds every dataset name of the
#     reference's step_0000, in the same order, and every common dataset at every step matches
#     dump_fp64.h5 to relative L2 <= 1e-10;
#  2. h5dump reads it;
#  3. a run killed with SIGKILL mid-dump leaves no file at the --dump path.
. "$(dirname "$0")/lib.sh"
tmpdir replay
ref=${FLUX_REFERENCE_DIR:-../shared/reference}

if [ -d "$ref/tiny" ]; then
  if "$SIM" -q --weights "$ref/tiny/weights.safetensors" --inputs "$ref/tiny/dump_fp64.h5" --precision fp64 --dump "$T/tiny.h5"; then
    if $PY - "$T/tiny.h5" "$ref/tiny/dump_fp64.h5" <<'PY'
import sys, h5py, numpy as np
ours, ref = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
assert ours.attrs["format"] == "flux-dump" and ours.attrs["version"] == 1 and ours.attrs["dtype"] == "float64"
o0, r0 = list(ours["step_0000"].attrs["order"]), list(ref["step_0000"].attrs["order"])
missing = [n for n in r0 if n not in o0]
assert not missing, f"names of reference step_0000 missing from our dump: {missing[:5]}"
assert [n for n in o0 if n in r0] == r0, "execution order differs from the reference"
worst, n = 0.0, 0
for step in [k for k in ref.keys() if k.startswith("step_")]:
    for name in ref[step].attrs["order"]:
        a, b = ours[step][name][()], ref[step][name][()]
        assert a.shape == b.shape, f"{step}/{name}: shape {a.shape} vs {b.shape}"
        r = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)
        worst = max(worst, r); n += 1
        assert r <= 1e-10, f"{step}/{name}: rel L2 {r:.3g}"
r = np.linalg.norm(ours["final/latents"][()] - ref["final/latents"][()]) / np.linalg.norm(ref["final/latents"][()])
assert r <= 1e-10, f"final latents rel L2 {r}"
print(f"   {len(r0)} names of step_0000 present in order; {n} datasets, worst rel L2 {worst:.2e}; final {r:.2e}")
PY
    then ok "tiny fp64 replay dump: names, order and values match the diffusers reference (h5py)"; else bad "tiny replay dump vs reference"; fi
    if h5dump -H "$T/tiny.h5" >/dev/null 2>&1; then ok "h5dump reads the dump"; else bad "h5dump cannot read the dump"; fi
  else bad "flux-sim replay of tiny failed"; fi
else
  skip "reference replay: $ref not found — this part did NOT run"
fi

# kill -9 in the middle of writing: nothing may appear at the final path
"$SIM" -q --grid 24x24 --txt-len 64 --steps 50 --dump "$T/killed.h5" >/dev/null 2>&1 &
pid=$!
# mid-dump = the temporary holds data and the run still runs: waited for, not slept for (a fixed
# sleep lands anywhere on a loaded machine); the cap only ends a run that never starts dumping
for _ in $(seq 1 6000); do
  [ -n "$(find "$T" -name 'killed.h5.tmp.*' -size +0 2>/dev/null)" ] && break
  kill -0 $pid 2>/dev/null || break; sleep 0.05
done
mid=; [ -n "$(find "$T" -name 'killed.h5.tmp.*' -size +0 2>/dev/null)" ] && kill -9 $pid 2>/dev/null && mid=1
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
if [ -z "$mid" ]; then bad "could not kill the run mid-dump (it ended, or never wrote its temporary)"
elif [ ! -e "$T/killed.h5" ]; then ok "SIGKILL mid-run leaves no file at the --dump path (only $(ls "$T" | grep -c tmp) temporary)"; else bad "a killed run left $T/killed.h5"; fi

finish
