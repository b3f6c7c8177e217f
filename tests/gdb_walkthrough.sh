#!/usr/bin/env bash
# docs/debugging.md stays true: run its walkthrough (tools/gdb-walkthrough.sh) in gdb batch mode
# and check that the rank where the injected divergence shows stops inside the layer that
# diverged, with its tensor, the reference and the assembled tensor printed.
set -u
cd "$(dirname "$0")/.."
pass=0; fail=0
if ! command -v gdb >/dev/null; then echo "*** SKIPPED: gdb not installed (tools/install-deps.sh installs it) — this test did NOT run ***"; echo "0 passed, 0 failed"; exit 0; fi
out=$(bash tools/gdb-walkthrough.sh 2>&1)
expect() {
  if grep -qF -- "$1" <<<"$out"; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL missing: $1"; fi
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
expect 'in linear (c='
expect 'name = '
# the doc shows this very script
if grep -qF 'tools/gdb-walkthrough.sh' docs/debugging.md && grep -qF -- '--inject missing-allreduce --break-on-divergence' docs/debugging.md; then
  pass=$((pass + 1)); echo "ok   docs/debugging.md quotes the walkthrough"
else fail=$((fail + 1)); echo "FAIL docs/debugging.md does not quote tools/gdb-walkthrough.sh"; fi
[ $fail -eq 0 ] || printf '%s\n' "$out" | tail -40
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
