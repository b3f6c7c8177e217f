#!/usr/bin/env bash
# gpu-device-run.sh — the one command for a lent GPU machine (docs/gpu.md, "Results on a GPU").
# Unpacks build/gpu-pack (tools/gpu/gpu-pack.sh), records the machine, runs bundle/gpu-check.sh
# (steps 1-5), then compute-sanitizer memcheck/racecheck/synccheck/initcheck on gpu_check and on
# a 2-rank ring --check. Every line of gpu-check.sh is prefixed with the seconds since start.
# Results go to $OUT (the device tool's return folder; ./gpu-out elsewhere):
#   machine.txt  gpu-check.log  timed.log  sanitizers.txt
# Budget (H100, 2026-11-27): unpack 3 s, gpu-check 147 s, sanitizers 30 s; limit with
# GPU_CHECK_LIMIT (s, default 400) so a hang still returns the partial log.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$here/gpu-out}; mkdir -p "$OUT"
t0=$(date +%s)
W=$(mktemp -d /tmp/fluxsim-dev-XXXXXX)
tar -C "$W" -xJf "$here/build/gpu-pack/bundle.tar.xz" && tar -C "$W" -xJf "$here/build/gpu-pack/ref.tar.xz" || {
  echo "gpu-device-run: error: build/gpu-pack not carried (make GPU=cuda gpu-pack; carry build/gpu-pack)"; exit 2; }
echo "unpacked in $(( $(date +%s) - t0 )) s"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
  nvcc --version 2>/dev/null | tail -2; echo "kernel $(uname -r), $(nproc) CPUs"; } >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
cd "$W"
export FLUX_REFERENCE_DIR=$W/ref LOG=$OUT/gpu-check.log
timeout "${GPU_CHECK_LIMIT:-400}" bundle/run.sh bundle/gpu-check.sh 2>&1 |
  while IFS= read -r l; do printf '%4d %s\n' $(( $(date +%s) - t0 )) "$l"; done >"$OUT/timed.log"
rc=${PIPESTATUS[0]}
tail -3 "$OUT/timed.log"
echo "gpu-check.sh exit $rc after $(( $(date +%s) - t0 )) s"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$CS" ] && [ -z "${NO_SANITIZE:-}" ]; then
  export FLUX_SIM_GPU_CACHE=0   # every allocation a real cudaMalloc, so memcheck sees its bounds
  for t in memcheck racecheck synccheck; do
    timeout 150 bundle/run.sh "$CS" --tool $t --error-exitcode 9 bundle/bin/gpu_check --backend cuda --quick >"$W/s.log" 2>&1
    echo "== $t on gpu_check --quick: exit $?"; grep -E "SUMMARY|^gpu_check: [0-9]" "$W/s.log"
  done >>"$OUT/sanitizers.txt"
  timeout 100 bundle/run.sh "$CS" --tool initcheck --error-exitcode 9 bundle/bin/flux-sim --backend cuda --grid 4x4 --txt-len 5 --steps 1 -q >"$W/s.log" 2>&1
  echo "== initcheck on a 1-step flux-sim run: exit $?" >>"$OUT/sanitizers.txt"; grep SUMMARY "$W/s.log" >>"$OUT/sanitizers.txt"
  timeout 100 bundle/run.sh mpirun -np 2 "$CS" --tool memcheck --error-exitcode 9 bundle/bin/flux-sim --backend cuda --grid 6x5 --txt-len 7 --steps 2 --ring 2 --check -q >"$W/s.log" 2>&1
  echo "== memcheck on mpirun -np 2 --ring 2 --check: exit $?" >>"$OUT/sanitizers.txt"; grep -E "SUMMARY|check:" "$W/s.log" >>"$OUT/sanitizers.txt"
  cat "$OUT/sanitizers.txt"
fi
rm -rf "$W"
echo "gpu-device-run: done in $(( $(date +%s) - t0 )) s"
exit $rc
