#!/usr/bin/env bash
# tests/test_comm.c under mpirun at 2, 3 and 4 ranks (1 rank runs directly in make test), and
# proof that it can fail without hanging: with FLUX_TEST_COMM_BREAK=<test> the last rank sees
# one wrong element in that test's result; the test's line must say WRONG, every rank must fail
# that test and no other (the verdict is agreed before it is asserted), and the job must end on
# its own well inside the timeout.
# Every rank prints (cmocka's lines and summary; rank 0 the table): each rank writes its own file
# (mpirun_per_rank), and what is counted per rank is counted per file — in one shared stream the
# ranks' buffered output can interleave mid-line.
. "$(dirname "$0")/lib.sh"
BIN=$B/tests/test_comm
tmpdir comm
LOG=$T/log
for n in 2 3 4; do
  if mpirun_per_rank "$T/r" $n "$BIN" >"$LOG" 2>&1; then ok "np=$n"
  else bad "np=$n (exit $?)"; fi
  cat "$T"/r/rank.* >>"$LOG"
  grep -E "^\s+\S.*(ok|WRONG.*)$|FAILED" "$LOG" | sort -u
done
# test name in test_comm.c | its line in the table
BREAKS=("allreduce|allreduce_sum" "allgatherv|allgatherv (uneven)" "alltoallv|alltoallv (uneven)"
        "bcast|bcast (root = last)" "ring|ring sendrecv" "gather|gather to root (tiling)")
fn() { case $1 in allreduce) echo test_allreduce;; allgatherv) echo test_allgatherv_uneven;; alltoallv) echo test_alltoallv;;
       bcast) echo test_bcast;; ring) echo test_ring_p2p;; gather) echo test_gather_tiling;; esac; }
n=2
# make sanitize: a deliberately failed cmocka assertion longjmps past the test's frees, so leak
# detection is off for these six runs (not for the passing runs above)
[ -n "${FLUX_SANITIZE:-}" ] && export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
for b in "${BREAKS[@]}"; do
  name=${b%%|*}; line=${b#*|}; t=$(fn "$name")
  start=$(date +%s)
  FLUX_TEST_COMM_BREAK=$name mpirun_per_rank "$T/r" $n -x FLUX_TEST_COMM_BREAK -- "$BIN" >"$LOG" 2>&1; rc=$?
  secs=$(( $(date +%s) - start ))
  cat "$T"/r/rank.* >>"$LOG"
  re=$(printf '%s' "$line" | sed 's/[][().*^$+?{}|]/\\&/g')
  wrong=$(cat "$T"/r/rank.* | grep -cE "^  $re +.*WRONG: [0-9]+ elements on [0-9]+ of $n ranks$")
  ranks_failed=$(grep -lx " 1 FAILED TEST(S)" "$T"/r/rank.* | wc -l)   # cmocka's summary, in each rank's own file
  others=$(cat "$T"/r/rank.* | grep -E "^\[  FAILED  \] test_" | grep -v "\] $t$" | sort -u | tr '\n' ' ')
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$wrong" -eq 1 ] && [ "$ranks_failed" -eq $n ] && [ -z "$others" ]; then
    ok "FLUX_TEST_COMM_BREAK=$name at np=$n: '$line ... WRONG', $t failed on all $n ranks and nothing else, exit $rc in ${secs}s"
  else
    bad "FLUX_TEST_COMM_BREAK=$name: exit $rc after ${secs}s, WRONG lines $wrong, ranks failing $ranks_failed/$n, other failures: ${others:-none}"
    tail -15 "$LOG"
  fi
done
finish
