#!/usr/bin/env bash
# One rank fails in the middle of the run (an injected out-of-memory at a module: --inject
# fail-rank:RANK:MODULE:STEP) while the others wait in the next collective. The job must end
# by itself — no hang: a run the 120 s timeout ends exits 124, never 2 — with exit 2 on mpirun, exactly one flux-sim message naming the
# failing rank and its error, and no dump (neither the file nor its temporary) left behind.
. "$(dirname "$0")/lib.sh"
tmpdir fail
# ranks | layout | failing rank | module | extra options
CASES=(
  "3|--ring 3|2|transformer_blocks.0.attn.to_q|--dump $T/out.h5"
  "4|--tp 2 --ring 2|2|transformer_blocks.0.attn.to_k|--check --dump $T/out.h5"
  "4|--tp 2 --ulysses 2|3|single_transformer_blocks.1.proj_mlp|--dump-per-rank $T/ranks --dump $T/out.h5"
  "2|--tp 2|1|transformer_blocks.1.ff.net.0.proj|"
  "1||0|x_embedder|--dump $T/out.h5"
)
for c in "${CASES[@]}"; do
  IFS='|' read -r n layout r module extra <<<"$c"
  rm -rf "$T/out.h5" "$T/ranks" "$T"/out.h5.tmp.*
  start=$(date +%s%N)
  timeout 120 mpirun -np "$n" "$SIM" --grid 5x7 --txt-len 13 --steps 2 $layout $extra \
    --inject "fail-rank:$r:$module:1" </dev/null >"$T/log" 2>&1; rc=$?
  secs=$(( ($(date +%s%N) - start) / 1000000000 ))
  tag="np=$n ${layout:-single rank} $extra: rank $r fails at step 1 $module"
  msgs=$(grep -c "^flux-sim: error" "$T/log")
  who="on rank $r"; [ "$n" = 1 ] && who="" # a single rank says "flux-sim: error: ..."
  # nothing left: no dump, no temporary, and not the --dump-per-rank directory the job made
  left=$(ls "$T" | grep -v '^log$')
  if [ $rc -eq 2 ] && [ "$msgs" -eq 1 ] && grep -q "^flux-sim: error${who:+ $who}: step 1: $module: out of memory" "$T/log" \
     && [ -z "$left" ]; then
    ok "$tag → exit 2 in ${secs}s, one message naming rank $r, nothing left"
  else
    bad "$tag: exit $rc after ${secs}s, $msgs flux-sim messages, left: ${left:-nothing}"; grep -v "^ " "$T/log" | head -8
  fi
done
# a fail-rank that strikes nowhere is an error, never a clean run
timeout 60 mpirun -np 2 "$SIM" --grid 5x7 --txt-len 13 --steps 1 --tp 2 --inject fail-rank:1:no.such.module:0 -q \
  </dev/null >"$T/log" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "never fired" "$T/log"; then ok "fail-rank naming no module of the run: exit 2, 'never fired'"
else bad "fail-rank that never fires: exit $rc"; fi
finish
