#!/usr/bin/env bash
# Runs every test: the cmocka unit/integration programs (build/tests/test_*) and the shell
# integration tests (tests/*.sh). Prints each result and a closing "N passed, N failed" line;
# exits non-zero if anything failed. Run from the repo root (make test does).
#   FLUX_BUILD=DIR      binaries from DIR instead of build/ (make sanitize: build-san); the shell
#                       tests honour it too
#   FLUX_TEST_EXCLUDE   space-separated test names not to run; each is printed as SKIPPED
#   FLUX_TEST_ONLY      space-separated test names: run only these (make sanitize's second pass)
#   PYTHON              the Python the shell tests run (default: the first python3 on PATH that
#                       has h5py and NumPy, else python3)
# The shell tests share tests/lib.sh: ok/bad/skip, the closing line, the mpirun environment, a
# temporary folder, per-rank output files (mpirun_per_rank) and CPU/RSS measurement (measured).
# tests/valgrind.sh is not run here: it takes minutes (make valgrind, make sanitize).
set -u
cd "$(dirname "$0")/../.."
B=${FLUX_BUILD:-build}
export FLUX_BUILD=$B
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
ref=${FLUX_REFERENCE_DIR:-../shared/reference}
if [ ! -d "$ref" ]; then
  echo "=================================================================="
  echo " WARNING: $ref not found: the conformance tests against the"
  echo " diffusers reference will be SKIPPED (they did NOT pass)."
  echo "=================================================================="
fi
pass=0; fail=0; skipped=0; failed=()
logdir=$B/test-logs; mkdir -p "$logdir"
excluded=0
for t in "$B"/tests/test_* tests/*.sh; do
  [ -x "$t" ] || [ "${t##*.}" = sh ] || continue
  name=$(basename "$t")
  [ "$name" = valgrind.sh ] && continue
  [ "$name" = lib.sh ] && continue # the shell tests' helpers, not a test
  if [ -n "${FLUX_TEST_ONLY:-}" ] && [[ " $FLUX_TEST_ONLY " != *" $name "* ]]; then continue; fi
  if [[ " ${FLUX_TEST_EXCLUDE:-} " == *" $name "* ]]; then
    excluded=$((excluded + 1))
    printf "%-28s *** SKIPPED (FLUX_TEST_EXCLUDE) — this test did NOT run ***\n" "$name"
    continue
  fi
  log="$logdir/$name.log"
  start=$(date +%s%N)
  if [ "${t##*.}" = sh ]; then bash "$t" >"$log" 2>&1; rc=$?; else "$t" >"$log" 2>&1; rc=$?; fi
  ms=$(( ($(date +%s%N) - start) / 1000000 )); secs="$((ms / 1000)).$(( (ms % 1000) / 100 ))"
  s=$(grep -c "SKIPPED" "$log" || true)
  if [ $rc -eq 0 ]; then
    pass=$((pass + 1)); status=PASS
    if [ "$s" -gt 0 ]; then skipped=$((skipped + 1)); status="PASS (with SKIPPED parts, see $log)"; fi
  else
    fail=$((fail + 1)); status="FAIL (exit $rc)"; failed+=("$name")
  fi
  printf "%-28s %-10s %6ss\n" "$name" "$status" "$secs"
  grep -E "^\s+\[[a-z]+ float(32|64)\]|SKIPPED" "$log" | sed 's/^/    /' || true
done
for n in "${failed[@]:-}"; do
  [ -n "$n" ] || continue
  echo "---- $n (last 40 lines of $logdir/$n.log) ----"
  tail -n 40 "$logdir/$n.log"
done
echo
if [ $excluded -gt 0 ]; then echo "$pass passed, $fail failed, $excluded excluded"; else echo "$pass passed, $fail failed"; fi
[ $fail -eq 0 ]
