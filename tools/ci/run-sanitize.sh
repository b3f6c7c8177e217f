#!/usr/bin/env bash
# `make sanitize`: the whole test suite on the ASan + UBSan binaries of build-san/ (or
# $FLUX_BUILD). Any sanitizer report fails it: every
# ASan/LSan report goes to a log file under $B/san-logs/ and makes the process exit 86, every
# UBSan report exits 87 and is found in the test logs; so a report inside a test that tolerates a
# non-zero exit is still caught here.
#
# Two passes, because LeakSanitizer needs DWARF unwinding at every malloc to attribute Open MPI's
# allocations (fast_unwind_on_malloc=0: system libraries have no frame pointers), which costs
# 2-4 s per process, and the three matrix scripts start ~200 MPI jobs:
#   1. every test except the matrices, with ASan + UBSan + LSan;
#   2. the matrices (LEAK_FREE_TESTS below) with ASan + UBSan, leak detection off; their parallel
#      code paths (TP, Ulysses, ring allgather/p2p, --check, gathered and per-rank dumps) are then
#      leak-checked by the five mpirun runs of pass 3 instead. parallel_check.sh runs its 13
#      layouts x 2 configs in fp64 only (FLUX_PARCHECK_PRECISIONS=fp64): in both precisions it
#      alone takes ~9.5 minutes under ASan on a 2-core machine; fp32 runs in pass 1's conformance
#      tests and in inject_check.sh.
# No test is excluded. valgrind is not run here (make valgrind: ~2.5 minutes more would take
# make sanitize past 20 minutes). docs/reliability.md has the measured wall times.
set -u
cd "$(dirname "$0")/../.."
B=${FLUX_BUILD:-build-san}
logs=$B/san-logs
rm -rf "$logs"; mkdir -p "$logs"
LEAK_FREE_TESTS="parallel_check.sh inject_check.sh comm_volume.sh"
QUICK_TESTS="test_safetensors test_hardening test_estimate test_dump test_oracle test_ckpt test_ops test_conformance
             test_parallel cli_errors.sh hostile_inputs.sh oracle_robust.sh dump_replay.sh rank_failure.sh faults.sh dump_select.sh
             cli_hostile.sh oracle_hostile.sh leftovers.sh"
# ASan's suppressions: interceptor reports from inside libhdf5 on deliberately damaged files only
# (tools/ci/asan.supp says why)
san_opts="halt_on_error=1:exitcode=86:log_path=$(pwd)/$logs/asan:suppressions=$(pwd)/tools/ci/asan.supp"
export LSAN_OPTIONS="suppressions=$(pwd)/tools/ci/lsan.supp:print_suppressions=0"
# UBSan: gcc's runtime ignores log_path when linked with ASan, so its reports go to stderr; the
# exit code (87) fails the command, and the test logs are scanned for "runtime error:" below
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=87:suppressions=$(pwd)/tools/ci/ubsan.supp"
# keep Open MPI's and PMIx's components mapped, so leak stacks through them stay symbolised
export OMPI_MCA_mca_base_component_disable_dlclose=1 PMIX_MCA_mca_base_component_disable_dlclose=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
export FLUX_SANITIZE=1 FLUX_BUILD=$B
rc=0
start=$(date +%s)
if [ -n "${FLUX_SANITIZE_QUICK:-}" ]; then
  # make sanitize-quick (CI): pass 1 on the tests that exercise input parsing, error paths, faults
  # and the dump/oracle readers — where the probe found its crashes — then pass 3. The full run
  # (every test, ~25 minutes on 2 cores) is `make sanitize`.
  echo "== pass 1 (quick): ASan + UBSan + LSan on: $QUICK_TESTS"
  ASAN_OPTIONS="$san_opts:detect_leaks=1:fast_unwind_on_malloc=0" FLUX_TEST_ONLY="$QUICK_TESTS" tools/ci/run-tests.sh || rc=1
  echo "*** make sanitize-quick: the other tests did NOT run under the sanitizers (make sanitize runs them all) ***"
else
echo "== pass 1: ASan + UBSan + LSan, every test but: $LEAK_FREE_TESTS"
ASAN_OPTIONS="$san_opts:detect_leaks=1:fast_unwind_on_malloc=0" FLUX_TEST_EXCLUDE="$LEAK_FREE_TESTS" tools/ci/run-tests.sh || rc=1
echo "== pass 2: ASan + UBSan (no leak detection): $LEAK_FREE_TESTS"
ASAN_OPTIONS="$san_opts:detect_leaks=0" FLUX_TEST_ONLY="$LEAK_FREE_TESTS" FLUX_PARCHECK_PRECISIONS=fp64 \
  tools/ci/run-tests.sh || rc=1
fi
echo "== pass 3: LSan on the parallel code paths"
T=$(mktemp -d /tmp/fluxsim-san-XXXXXX)
n=0
for run in "2|--tp 2 --check" "2|--ulysses 2 --dump $T/u.h5" "2|--ring 2 --ring-rotate p2p --dump-per-rank $T/pr" \
           "3|--ring 3 --check --dump $T/r3.h5" "4|--tp 2 --ring 2 --check --comm-stats"; do
  np=${run%%|*}; args=${run#*|}
  if ASAN_OPTIONS="$san_opts:detect_leaks=1:fast_unwind_on_malloc=0" timeout 600 \
       mpirun -np "$np" "$B/flux-sim" -q --grid 5x7 --txt-len 13 --steps 1 $args </dev/null >"$T/log" 2>&1; then
    n=$((n + 1)); echo "ok   mpirun -np $np flux-sim $args"
  else
    rc=1; echo "FAIL mpirun -np $np flux-sim $args"; tail -5 "$T/log"
  fi
done
rm -rf "$T"
secs=$(( $(date +%s) - start ))
grep -l "runtime error:" "$B"/test-logs/*.log 2>/dev/null | while read -r f; do cp "$f" "$logs/ubsan-in-$(basename "$f")"; done
reports=$(ls "$logs" 2>/dev/null | wc -l)
if [ "$reports" -gt 0 ]; then
  echo
  echo "==== $reports sanitizer report file(s) in $logs ===="
  for f in "$logs"/*; do echo "---- $f"; head -40 "$f"; done
  rc=1
fi
echo "make sanitize: tests under the sanitizers in ${secs}s, $reports report file(s)"
exit $rc
