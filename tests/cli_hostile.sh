#!/usr/bin/env bash
# flux-sim's output channels and hostile option values (reliability probe 3: T5, T12, T14, T15,
# T16, T17, T19, T21). Each case: the exit code, exactly one flux-sim line on stderr where an
# error is expected, and no dump or temporary left.
#   T5   stdout a closed pipe (run with --dump, --estimate, --help, --print-plan): exit 2, one
#        line, no temporary (before: SIGPIPE, rc 141, the --dump temporary left)
#   T17  stdout /dev/full (--estimate, a run): exit 2 (before: rc 0, output lost)
#   T14  --estimate: a saturated total says "more than 16 EiB"; --ring beyond the tokens refused
#   T15  --device-mem 1e-300G / 0x10G / 0.0000000001G refused
#   T16  --tp/--ulysses/--ring 10^6: the right product, not a wrapped int
#   T19  a --dump-modules selection over the declaration limit refused at parse time, naming
#        the option, not the temporary; a selection that matches no module of the model refused
#        before any work (before: after step 0 ran)
#   T12  --dump-modules with a newline / ESC: one line, escaped
#   T21  TERM=dumb / NO_COLOR on a terminal: no escape sequence in the progress lines
. "$(dirname "$0")/lib.sh"
tmpdir clihostile
cd "$T" || exit 2
SIM=$OLDPWD/$SIM
RUN="--steps 2 --grid 4x4 --txt-len 8"

# one_err NAME RC CMD...: exit RC, exactly one stderr line, starting "flux-sim: error:"
one_err() {
  local name=$1 want=$2; shift 2
  "$@" >out 2>err </dev/null; local rc=$?
  if [ "$rc" -eq "$want" ] && [ "$(wc -l <err)" -eq 1 ] && grep -q '^flux-sim: error: ' err; then ok "$name: rc $rc: $(cut -c1-150 err)"
  else bad "$name: rc $rc (want $want), $(wc -l <err) stderr lines: $(head -c 400 err | cat -A)"; fi
}
nothing_left() { # NAME: no dump, no temporary in $T
  local l; l=$(ls -A | grep -v -e '^out$' -e '^err$' -e '^pipe' | tr '\n' ' ')
  [ -z "$l" ] && ok "$1: nothing left" || bad "$1: left: $l"
  rm -rf ./*.h5 ./*.tmp.* 2>/dev/null
}

# ---- T5: stdout a pipe whose reader has gone (closed at once) ----
closed_pipe() { # NAME CMD...: stdout into a pipe nobody reads; rc and stderr to files
  local name=$1; shift
  { "$@" 2>err </dev/null; echo $? >pipe.rc; } | (exec 0<&-; sleep 1)
  local rc; rc=$(cat pipe.rc)
  if [ "$rc" -eq 2 ] && [ "$(wc -l <err)" -eq 1 ] && grep -q 'standard output' err; then ok "$name | closed pipe: rc 2: $(cat err)"
  else bad "$name | closed pipe: rc $rc, stderr: $(head -c 300 err | cat -A)"; fi
}
closed_pipe "run --dump" "$SIM" $RUN --dump p.h5
nothing_left "run --dump into a closed pipe"
closed_pipe "--estimate" "$SIM" --estimate
closed_pipe "--help" "$SIM" --help
closed_pipe "--print-plan" "$SIM" --print-plan

# ---- T17: stdout on a full disk ----
one_err "--estimate > /dev/full" 2 sh -c 'exec "$0" --estimate >/dev/full' "$SIM"
one_err "run --dump > /dev/full" 2 sh -c 'exec "$0" $1 --dump f.h5 >/dev/full' "$SIM" "$RUN"
nothing_left "run --dump > /dev/full"

# ---- T14 ----
"$SIM" --estimate --config flux-dev --precision fp64 --grid 2048x2048 --txt-len 4194304 --batch 64 --tp 24 --ring 1000000 >out 2>err
if [ $? -eq 0 ] && grep -q 'fits here: NO (24000000 ranks on this machine need more than 16 EiB' out; then ok "--estimate: saturated total: $(grep 'fits here' out)"
else bad "--estimate saturated total: $(grep 'fits here' out) $(cat err)"; fi
"$SIM" --estimate --config flux-dev --precision fp64 --grid 2048x2048 --txt-len 4194304 --batch 64 --steps 1000000 >out 2>err
if grep -q 'for the run' out && grep 'dump:' out | grep -q 'more than 16 EiB for the run'; then ok "--estimate: saturated dump size: $(grep 'dump:' out)"
else bad "--estimate saturated dump: $(grep 'dump:' out) $(cat err)"; fi
one_err "--estimate --ring 1000000 (288 tokens)" 2 "$SIM" --estimate --ring 1000000
grep -q 'would hold no token' err || bad "--estimate --ring: not the run's reason: $(cat err)"

# ---- T15 ----
for v in 1e-300G 0x10G 0.0000000001G " 80G" 80 -1G 1.G; do one_err "--device-mem '$v'" 2 "$SIM" --estimate --device-mem "$v"; done
"$SIM" --estimate --device-mem 80G >out 2>&1 && grep -q 'fits a 80 GiB device' out && ok "--device-mem 80G" || bad "--device-mem 80G: $(cat out)"
"$SIM" --estimate --device-mem 0.5GB >out 2>&1 && grep -q 'fits a 477 MiB device' out && ok "--device-mem 0.5GB" || bad "--device-mem 0.5GB: $(grep fits out)"

# ---- T16 ----
one_err "--tp/--ulysses/--ring 10^6" 2 "$SIM" --tp 1000000 --ulysses 1000000 --ring 1000000 --steps 1
grep -q '= 1000000000000000000 ranks' err || bad "T16: wrong product: $(cat err)"
one_err "--tp 65536 --ulysses 65536" 2 "$SIM" --tp 65536 --ulysses 65536 --steps 1
grep -q '= 4294967296 ranks' err || bad "T16: wrong product: $(cat err)"

# ---- T19: the parser's limit is the writer's ----
g=$(printf '*?%.0s' $(seq 20))X; sel=$g; for i in $(seq 2 24); do sel="$sel,$g"; done
one_err "--dump-modules of 24 x 41 characters" 2 "$SIM" $RUN --dump o.h5 --dump-modules "$sel"
if grep -q -- '--dump-modules: the selection' err && ! grep -q 'tmp' err; then ok "T19: names the option, not the temporary"; else bad "T19: $(cat err)"; fi
nothing_left "T19"
# matches no module: refused from the config's names list before inputs, weights or the memory
# check (flux-dev at 2000x2000 would be refused as too big, or run for hours, if it got that far)
start=$(date +%s%N)
one_err "--dump-modules matching no module" 2 "$SIM" --config flux-dev --grid 2000x2000 --dump o.h5 --dump-modules 'transformer_blocks.19.*,nomatch'
ms=$(( ($(date +%s%N) - start) / 1000000 ))
if grep -q -- "--dump-modules transformer_blocks.19.\*,nomatch: matches no module of this model" err && [ "$ms" -lt 20000 ]; then
  ok "T19: matches no module: refused up front (${ms} ms, before the size check)"
else bad "T19: matches no module: ${ms} ms: $(cat err)"; fi
# FLUX.2 has its own list (FLUX.1's names match nothing there): flux2-dev at 2000x2000, up front
start=$(date +%s%N)
one_err "FLUX.2 --dump-modules matching no module" 2 "$SIM" --config flux2-dev --grid 2000x2000 --dump o.h5 --dump-modules 'time_text_embed*,transformer_blocks.8.*'
ms=$(( ($(date +%s%N) - start) / 1000000 ))
if grep -q -- "matches no module of this model" err && [ "$ms" -lt 20000 ]; then
  ok "T19 FLUX.2: matches no module: refused up front (${ms} ms, before the size check)"
else bad "T19 FLUX.2: matches no module: ${ms} ms: $(cat err)"; fi
one_err "FLUX.2 --estimate --dump-modules matching no module" 2 "$SIM" --config flux2-dev --tp 4 --estimate --dump o.h5 --dump-modules 'single_transformer_blocks.48.*'
grep -q 'matches no module' err || bad "T19 FLUX.2 --estimate: $(cat err)"
one_err "--check --dump-modules matching no module" 2 "$SIM" $RUN --check --dump-modules 'x_embedder.*'
grep -q 'matches no module' err || bad "T19 --check: $(cat err)"
one_err "--estimate --dump-modules matching no module" 2 "$SIM" --estimate --dump o.h5 --dump-modules 'nomatch'
grep -q 'matches no module' err || bad "T19 --estimate: $(cat err)"
nothing_left "T19 matches no module"

# ---- T12: a newline or ESC in --dump-modules stays one line ----
one_err "--dump-modules with a newline" 2 "$SIM" $RUN --dump o.h5 --dump-modules $'proj_out\nflux-sim: OK'
one_err "--dump-modules with ESC" 2 "$SIM" $RUN --dump o.h5 --dump-modules $'\e[2Jx'
if grep -q $'\e' err; then bad "T12: raw ESC on stderr"; else ok "T12: ESC escaped: $(cat err | cut -c1-80)"; fi
nothing_left "T12"

# ---- T21: TERM=dumb / NO_COLOR on a terminal ----
if command -v script >/dev/null; then
  for env in "TERM=dumb" "NO_COLOR=1 TERM=xterm" "TERM=xterm"; do
    env $env FLUX_SIM_PROGRESS_AFTER=0 script -qc "$SIM --steps 2 --grid 8x8 --txt-len 8" /dev/null >tty.out 2>&1 </dev/null
    n=$(grep -c $'\e' tty.out); cr=$(grep -c $'\r' tty.out)
    case $env in
      TERM=xterm) [ "$n" -gt 0 ] && ok "$env: the line is rewritten with ESC [K" || bad "$env: no ESC [K ($n)";;
      *) [ "$n" -eq 0 ] && ok "$env: no escape sequence" || bad "$env: $n lines with ESC";;
    esac
  done
  rm -f tty.out
else skip "T21: no script(1) to give flux-sim a terminal"; fi
finish
