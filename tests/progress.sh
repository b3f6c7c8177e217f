#!/usr/bin/env bash
# A long run says what it is doing (rank 0, stderr), and a log sees it as it happens:
#   * in a log (stderr not a terminal): one plain line per finished step, with phase, step,
#     block, elapsed, ETA and memory; the header on stdout is there while the run still runs
#     (stdout line-buffered, not held until exit);
#   * on a terminal (script(1) gives one): a single line rewritten in place (\r ... ESC[K) and
#     erased at the end;
#   * -q prints nothing; a run shorter than 2 s prints no progress; --check reports its phases
#     (single-rank reference, then the parallel run);
#   * the summary has the per-step times.
. "$(dirname "$0")/lib.sh"
tmpdir progress
# progress from the first block (the 2 s grace would make the line count depend on the
# machine's speed); the default grace is tested below
export FLUX_SIM_PROGRESS_AFTER=0
LONG=(--grid 24x24 --steps 4 --threads 1)

# a log sees the header while the run runs: a run far longer than the check, stopped after it
"$SIM" "${LONG[@]}" --steps 200 >"$T/out" 2>"$T/err" &
pid=$!
for _ in $(seq 1 600); do grep -q "step 1/200" "$T/err" 2>/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
if kill -0 $pid 2>/dev/null && grep -q "^flux-sim 0" "$T/out" && grep -q "layout:" "$T/out"; then
  ok "the header is in the log while the run runs (stdout line-buffered)"
else bad "header not in the log during the run: $(cat "$T/out")"; fi
kill $pid 2>/dev/null; wait $pid 2>/dev/null
"$SIM" "${LONG[@]}" >"$T/out" 2>"$T/err"; rc=$?
n=$(grep -c "^flux-sim: run: step [1-4]/4, block 6/6 | .* elapsed, ETA .* | RSS .* GiB (peak .* GiB)$" "$T/err")
if [ $rc -eq 0 ] && [ "$n" -eq 4 ] && ! grep -q $'\r' "$T/err"; then ok "log: one plain progress line per step ($n), no carriage returns"
else bad "log progress: exit $rc, $n step lines: $(cat "$T/err")"; fi
if grep -Eq "^  per step: [0-9.]+ [0-9.]+ [0-9.]+ [0-9.]+ s; rank 0 peak RSS" "$T/out"; then ok "summary: per-step times ($(grep 'per step' "$T/out" | sed 's/^ *//'))"
else bad "summary has no per-step times: $(cat "$T/out")"; fi

# a terminal: one line rewritten in place, erased at the end
script -qec "$SIM ${LONG[*]} --steps 2 2>&1 >/dev/null" /dev/null >"$T/tty" </dev/null; rc=$?
if [ $rc -eq 0 ] && grep -q $'\rflux-sim: run: step' "$T/tty" && grep -q $'\r\033\\[K' "$T/tty" && [ "$(grep -c . "$T/tty")" -le 1 ]; then
  ok "terminal: one line rewritten in place and erased at the end"
else bad "terminal progress (exit $rc): $(cat -v "$T/tty" | head -5)"; fi

# -q: nothing at all; a short run: no progress
"$SIM" "${LONG[@]}" --steps 2 -q >"$T/q" 2>&1
if [ ! -s "$T/q" ]; then ok "-q: nothing printed"; else bad "-q printed: $(cat "$T/q")"; fi
# (the grace is wall-clock time: on a loaded machine this small run can itself pass 2 s, and then
# it may print; what must hold is that a run that printed had run for 2 s)
start=$(date +%s%N)
FLUX_SIM_PROGRESS_AFTER= "$SIM" --grid 2x2 --steps 2 >/dev/null 2>"$T/s"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
if [ ! -s "$T/s" ]; then ok "a run under 2 s prints no progress"
elif [ $ms -ge 2000 ]; then ok "a run under 2 s prints no progress (this one took $ms ms, on a loaded machine, and then printed)"
else bad "short run printed after $ms ms: $(cat "$T/s")"; fi

# --check: the phases, each with its own steps; only rank 0 speaks
timeout 600 mpirun -np 2 "$SIM" "${LONG[@]}" --steps 2 --tp 2 --check >"$T/c.out" 2>"$T/c.err" </dev/null; rc=$?
if [ $rc -eq 0 ] && grep -q "^flux-sim: single-rank reference: step 2/2" "$T/c.err" && grep -q "^flux-sim: parallel run: step 2/2" "$T/c.err" &&
   [ "$(grep -c "parallel run: step 2/2, block 6/6" "$T/c.err")" -eq 1 ]; then
  ok "--check: the reference's and the parallel run's progress, from rank 0 only"
else bad "--check progress (exit $rc): $(cat "$T/c.err")"; fi

finish
