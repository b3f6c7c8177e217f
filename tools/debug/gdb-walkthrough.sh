#!/usr/bin/env bash
# The walkthrough of docs/debugging.md, as one script (CI runs it: tests/gdb_walkthrough.sh).
# A tensor-parallel run with an injected bug (the row-parallel all-reduce is missing), checked
# against the single-rank run; every rank runs under gdb in batch mode, and the rank where the
# divergence shows stops inside the layer that diverged and prints what it holds.
# `set may-call-functions off`: nothing here may run code inside the stopped process (gdb 13
# cannot restore an AMX CPU's register state after an inferior call; tools/debug/flux-sim.gdb reads
# memory instead), so a helper that tried would fail loudly on every machine, not only on those.
set -u
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
# make sanitize: LeakSanitizer cannot work under ptrace (it aborts at exit); ASan and UBSan still do
[ -n "${FLUX_SANITIZE:-}" ] && export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# FLUX_WALKTHROUGH_OUT=DIR: each rank's gdb output in its own file (Open MPI's --output-filename:
# DIR/1/rank.N/stdout), so a test reads whole lines; by default both ranks print to the terminal.
out_opt=()
[ -n "${FLUX_WALKTHROUGH_OUT:-}" ] && out_opt=(--output-filename "$FLUX_WALKTHROUGH_OUT")
timeout 300 mpirun --oversubscribe "${out_opt[@]}" -np 2 \
  gdb -q -batch -x tools/debug/flux-sim.gdb -ex 'set may-call-functions off' \
      -ex run -ex fs-divergence -ex fs-where -ex fs-layer -ex "info args" \
      --args ${FLUX_BUILD:-build}/flux-sim --tp 2 --grid 5x7 --txt-len 13 --steps 2 --check -q \
             --inject missing-allreduce --break-on-divergence
