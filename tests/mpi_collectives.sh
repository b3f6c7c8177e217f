#!/usr/bin/env bash
# tests/test_comm.c under mpirun at 2, 3 and 4 ranks (1 rank runs directly in make test), and
# proof that it can fail without hanging: with FLUX_TEST_COMM_BREAK=<test> the last rank sees
# one wrong element in that test's result; the test's line must say WRONG, every rank must fail
# that test and no other (the verdict is agreed before it is asserted), and the job must end on
# its own well inside the timeout.
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
BIN=${FLUX_BUILD:-build}/tests/test_comm
LOG=$(mktemp /tmp/fluxsim-comm-XXXXXX)
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
for n in 2 3 4; do
  if timeout 120 mpirun -np $n "$BIN" </dev/null >"$LOG" 2>&1; then ok "np=$n"
  else bad "np=$n (exit $?)"; fi
  grep -E "^\s+\S.*(ok|WRONG.*)$|FAILED" "$LOG" | sort -u
done
# test name in test_comm.c | its line in the table
BREAKS=("allreduce|allreduce_sum" "allgatherv|allgatherv (uneven)" "alltoallv|alltoallv (uneven)"
        "bcast|bcast (root = last)" "ring|ring sendrecv" "gather|gather to root (tiling)")
fn() { case $1 in allreduce) echo test_allreduce;; allgatherv) echo test_allgatherv_uneven;; alltoallv) echo test_alltoallv;;
       bcast) echo test_bcast;; ring) echo test_ring_p2p;; gather) echo test_gather_tiling;; esac; }
n=2
for b in "${BREAKS[@]}"; do
  name=${b%%|*}; line=${b#*|}; t=$(fn "$name")
  start=$(date +%s)
  FLUX_TEST_COMM_BREAK=$name timeout 120 mpirun -np $n -x FLUX_TEST_COMM_BREAK "$BIN" </dev/null >"$LOG" 2>&1; rc=$?
  secs=$(( $(date +%s) - start ))
  re=$(printf '%s' "$line" | sed 's/[][().*^$+?{}|]/\\&/g')
  wrong=$(grep -cE "^  $re +.*WRONG: [0-9]+ elements on [0-9]+ of $n ranks$" "$LOG")
  ranks_failed=$(grep -c "^ 1 FAILED TEST(S)$" "$LOG")         # cmocka's summary, once per rank
  others=$(grep -E "^\[  FAILED  \] test_" "$LOG" | grep -v "\] $t$" | sort -u | tr '\n' ' ')
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$wrong" -eq 1 ] && [ "$ranks_failed" -eq $n ] && [ -z "$others" ]; then
    ok "FLUX_TEST_COMM_BREAK=$name at np=$n: '$line ... WRONG', $t failed on all $n ranks and nothing else, exit $rc in ${secs}s"
  else
    bad "FLUX_TEST_COMM_BREAK=$name: exit $rc after ${secs}s, WRONG lines $wrong, ranks failing $ranks_failed/$n, other failures: ${others:-none}"
    tail -15 "$LOG"
  fi
done
rm -f "$LOG"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
