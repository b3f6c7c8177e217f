#!/usr/bin/env bash
# The device-ready core, proven on the CPU: the conformance suite, the parallel layout matrix,
# --check/--dump, every --inject bug, the communication volumes and the gdb walkthrough, all run
# on `--backend cpu-strict` — memory the host cannot dereference (a stray access faults), every
# collective staged through host buffers as on a GPU. The same scripts as for the CPU backend,
# with FLUX_SIM_BACKEND (the default of --backend) set; each must pass with the same
# expectations (same verdicts, same modules and ranks, same byte counts).
. "$(dirname "$0")/lib.sh"
export FLUX_SIM_BACKEND=cpu-strict OPENBLAS_NUM_THREADS=1
run() { # name command...
  local name=$1; shift
  if "$@" >"/tmp/fluxsim-strict-$$.log" 2>&1; then ok "$name on cpu-strict: $(tail -1 /tmp/fluxsim-strict-$$.log)"
  else bad "$name on cpu-strict"; grep -E "FAIL|error|SKIPPED" "/tmp/fluxsim-strict-$$.log" | head -10; fi
  grep -E "^\s+\[[a-z]+ float(32|64)\]|SKIPPED" "/tmp/fluxsim-strict-$$.log" | sed 's/^/  /'
}
# the backend really is the strict one (the header says where activations live)
if "${FLUX_BUILD:-build}"/flux-sim --steps 1 --grid 2x2 2>&1 | grep -q "on cpu-strict"; then ok "FLUX_SIM_BACKEND selects cpu-strict"
else bad "FLUX_SIM_BACKEND does not select cpu-strict"; fi
run test_conformance "${FLUX_BUILD:-build}"/tests/test_conformance
for t in parallel_check inject_check comm_volume dump_replay gdb_walkthrough rank_failure; do run "$t.sh" bash "tests/$t.sh"; done
rm -f "/tmp/fluxsim-strict-$$.log"
finish
