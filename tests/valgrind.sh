#!/usr/bin/env bash
# valgrind memcheck on one single-rank run of the demo model: 0 errors (invalid reads/writes,
# uninitialised values, bad frees). Leaks are not errors here: Open MPI keeps ~19 kB from
# MPI_Init/MPI_Finalize until exit (see docs/reliability.md); make sanitize checks leaks with
# LeakSanitizer instead. Takes ~2.5 minutes, so neither `make test` nor `make sanitize` runs it:
# `make valgrind`. Needs the plain build (valgrind cannot run ASan binaries).
. "$(dirname "$0")/lib.sh"
[ "$B" = build-san ] && B=build
if ! command -v valgrind >/dev/null; then
  skip "valgrind.sh: valgrind not installed (tools/install-deps.sh installs it) — this test did NOT run"
  exit 0
fi
log=$(mktemp /tmp/fluxsim-valgrind-XXXXXX)
start=$(date +%s)
OPENBLAS_NUM_THREADS=1 timeout 900 valgrind --error-exitcode=1 --suppressions=tools/ci/openmpi-valgrind.supp \
  "$B/flux-sim" --steps 1 -q </dev/null >"$log" 2>&1
rc=$?
secs=$(( $(date +%s) - start ))
summary=$(grep -E "ERROR SUMMARY" "$log" | tail -1)
if [ $rc -eq 0 ] && grep -qE "ERROR SUMMARY: 0 errors" "$log"; then
  echo "ok   valgrind $B/flux-sim --steps 1: rc 0, ${summary#*== } (${secs}s)"
  rm -f "$log"
  exit 0
fi
echo "FAIL valgrind $B/flux-sim --steps 1: rc $rc, ${summary:-no summary} (${secs}s); log: $log"
grep -E "^==[0-9]+== (Invalid|Conditional|Use of|Syscall|Mismatched|Source|  (at|by) )" "$log" | head -40
exit 1
