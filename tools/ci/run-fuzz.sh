#!/usr/bin/env bash
# Runs each libFuzzer harness given for SECONDS on its committed corpus (`make fuzz`, see
# tests/fuzz/README.md). Fails if any harness crashes, leaks, times out on an input or finds an
# invariant violation; prints each harness's executions and coverage. FUZZ_DIR (default build/fuzz,
# the Makefile's FZ) holds the work corpora, artifacts and logs.
set -u
cd "$(dirname "$0")/../.."
secs=$1; shift
fz=${FUZZ_DIR:-build/fuzz}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fail=0
for bin in "$@"; do
  h=$(basename "$bin"); h=${h#fuzz_}
  seed=tests/fuzz/corpus/$h; work=$fz/work/$h; art=$fz/artifacts/$h
  mkdir -p "$seed" "$work" "$art"
  dict=(); [ -f "tests/fuzz/$h.dict" ] && dict=(-dict="tests/fuzz/$h.dict")
  log=$fz/$h.log
  # -timeout: one input may take 10 s at most (a hang is a finding); -rss_limit_mb: a finding too
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$art/" "${dict[@]}" "$work" "$seed" >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
  if [ $rc -eq 0 ]; then
    printf "fuzz %-12s PASS  %ss, %s executions, %s, corpus %s + %s new\n" "$h" "$secs" "${execs:-?}" "${cov:-cov ?}" \
      "$(ls "$seed" | wc -l)" "$(ls "$work" | wc -l)"
  else
    fail=1
    printf "fuzz %-12s FAIL (exit %d): see %s and %s\n" "$h" $rc "$log" "$art"
    grep -E "ERROR|SUMMARY|invariant|runtime error" "$log" | head -5
  fi
done
exit $fail
