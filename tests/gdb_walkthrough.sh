#!/usr/bin/env bash
# docs/debugging.md stays true: run its walkthrough (tools/debug/gdb-walkthrough.sh) in gdb batch mode
# and check that the rank where the injected divergence shows stops inside the layer that
# diverged, with its tensor, the reference and the assembled tensor printed.
. "$(dirname "$0")/lib.sh"
if ! command -v gdb >/dev/null; then skip_all "gdb not installed (tools/install-deps.sh installs it) — this test did NOT run"; fi
# make sanitize: every flux-sim here runs under gdb (ptrace), where LeakSanitizer cannot work (a
# rank that exits under gdb aborts with "LeakSanitizer has encountered a fatal error" and leaves a
# report file); ASan and UBSan still do. gdb-walkthrough.sh does the same for its own runs.
[ -n "${FLUX_SANITIZE:-}" ] && export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# each rank's gdb output in its own file (two processes' lines in one stream can interleave);
# the report lines (mpirun's own and rank 0's stderr) come from the launcher's stream
tmpdir gdbwt
launcher=$(FLUX_WALKTHROUGH_OUT="$T/ranks" bash tools/debug/gdb-walkthrough.sh 2>&1)
out="$launcher"
for r in 0 1; do
  for f in "$T"/ranks/*/rank."$r"/stdout "$T"/ranks/*/rank."$r"/stderr; do [ -f "$f" ] && out+=$'\n'"$(cat "$f")"; done
done
expect() {
  if grep -qF -- "$1" <<<"$out"; then ok "$1"; else bad "missing: $1"; fi
}
expect 'flux-sim --check: DIVERGED at step 0, transformer_blocks.0.attn.to_out.0'
expect 'ranks holding the same replicated piece disagree: rank 1 != rank 0'
expect 'hit Breakpoint 1, fs_check_break'
expect 'flux-sim: rank 1 diverged at step 0, transformer_blocks.0.attn.to_out.0'
expect "this rank's tensor:"
expect 'tensor [1, 35, 256] float32'
expect 'single-rank reference (global layout):'
expect 'tensor [1, 35, 256] float64'
expect 'flux-sim: step 0, module transformer_blocks.0.attn.to_out.0'
expect 'in fs_linear (c='
expect 'name = '
if grep -qF 'may-call-functions is off' <<<"$out"; then bad "a helper tried an inferior call"
else ok "no helper called into the stopped process (may-call-functions off)"; fi
# fs-tensor (Python, reads memory) prints exactly what fs_debug_print_tensor (C, in the process)
# prints, in each dtype and on cpu-strict's tagged memory. No inferior call (gdb 13 cannot make
# one on an AMX CPU: it cannot write the XSAVE state back): fs-native-print makes the stopped
# thread itself run fs_debug_print_tensor — it sets only general registers (the arguments, a
# return address into fs_check_break's breakpoint, the pc) and continues; the function returns
# onto the breakpoint. may-call-functions is off, so any inferior call would fail loudly.
# Each rank's gdb writes its own file: the culprit's lines are read whole, never interleaved
# with the other rank's.
tmpdir gdb
cat >"$T/native.gdb" <<'GDB'
define fs-native-print
  set $fs_ret = (long)$pc
  set $sp = (((long)$sp - 1024) & -16) - 8
  set *(long *)$sp = $fs_ret
  set $rdi = (long)$arg0
  set $rsi = $arg1
  set $rdx = $arg2
  set $pc = (long)&fs_debug_print_tensor
  continue
end
GDB
for v in "cpu fp32" "cpu bf16" "cpu-strict fp32"; do
  set -- $v
  mpirun_per_rank "$T/r" 2 gdb -q -batch -x tools/debug/flux-sim.gdb -x "$T/native.gdb" -ex 'set may-call-functions off' -ex run \
        -ex 'set $l = dv->local' -ex 'set $r = dv->reference' \
        -ex 'fs-tensor $l' -ex 'fs-native-print $l 0 8' -ex 'fs-tensor $r 100 5' -ex 'fs-native-print $r 100 5' \
        --args "$SIM" --backend $1 --precision $2 --tp 2 --grid 5x7 --txt-len 13 --steps 2 \
        --check -q --inject missing-allreduce --break-on-divergence >"$T/mpirun.log" 2>&1
  x=$(cat "$T"/r/rank.0 "$T"/r/rank.1)
  t=$(grep -E '^(tensor|  \[)' <<<"$x")
  if grep -qF 'may-call-functions is off' <<<"$x"; then
    bad "fs-tensor vs fs_debug_print_tensor ($1 $2): something tried an inferior call"
  elif [ "$(wc -l <<<"$t")" -eq 8 ] && [ "$(sed -n 1,2p <<<"$t")" = "$(sed -n 3,4p <<<"$t")" ] && [ "$(sed -n 5,6p <<<"$t")" = "$(sed -n 7,8p <<<"$t")" ]; then
    ok "fs-tensor = fs_debug_print_tensor on $1 $2: $(sed -n 1p <<<"$t" | cut -c1-60)..."
  else
    bad "fs-tensor differs from fs_debug_print_tensor on $1 $2:"; printf '%s\n' "$t"
  fi
done
# the doc shows this very script
if grep -qF 'tools/debug/gdb-walkthrough.sh' docs/debugging.md && grep -qF -- '--inject missing-allreduce --break-on-divergence' docs/debugging.md; then
  ok "docs/debugging.md quotes the walkthrough"
else bad "docs/debugging.md does not quote tools/debug/gdb-walkthrough.sh"; fi
[ $fail -eq 0 ] || printf '%s\n' "$out" | tail -40
finish
