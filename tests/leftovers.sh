#!/usr/bin/env bash
# What a killed run leaves, and how it goes away (reliability probe 3: T6, T10; docs/reliability.md).
#   T6   SIGKILL of rank 1 (and of rank 0) in `mpirun -np 2 --dump --dump-per-rank`: the
#        survivors delete the dead rank's per-rank temporary too (every rank learns every
#        rank's temporary at creation): nothing left
#   T10  SIGKILL of mpirun: the ranks die with it (SIGTERM from the kernel, PR_SET_PDEATHSIG)
#        and delete their temporaries: nothing left
#   SIGKILL of a 1-rank run (no handler runs): the temporary <path>.tmp.<pid>.<host> stays,
#        never complete-looking; the next run writing the path removes it, and so does
#        `flux-sim --clean PATH` (a directory: every stale temporary in it); a temporary whose
#        writer is alive, or of another host, is kept
. "$(dirname "$0")/lib.sh"
tmpdir leftovers
cd "$T" || exit 2
SIM=$OLDPWD/$SIM
A=(--steps 30 --grid 16x16 --dump o.h5 --dump-per-rank pr)
host=$(hostname | cut -d. -f1 | cut -c1-32 | sed 's/[^A-Za-z0-9_-]/_/g')

wait_tmp() { # PID GLOB: until a temporary exists (while PID runs); 0 when one appeared
  while kill -0 "$1" 2>/dev/null; do compgen -G "$2" >/dev/null && return 0; sleep 0.2; done; return 1
}
rank_pid() { # MPIRUN-PID RANK
  local p; for p in $(pgrep -P "$1"); do tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo "$p"; done
}
left() { find . \( -name '*.h5' -o -name '*.tmp.*' -o -name pr \) | sort | tr '\n' ' '; }
gone_within() { # PIDS...: 30 s for every one to exit (a zombie counts as gone)
  local i p alive
  for i in $(seq 150); do alive=0
    for p in "$@"; do [ -r "/proc/$p/stat" ] && [ "$(cut -d' ' -f3 "/proc/$p/stat")" != Z ] && alive=1; done
    [ $alive = 0 ] && return 0; sleep 0.2; done; return 1
}

for victim in "rank 1" "rank 0" mpirun; do
  rm -rf ./*
  timeout 300 mpirun -np 2 "$SIM" "${A[@]}" </dev/null >log 2>&1 & t=$!   # timeout: the hang guard
  if ! wait_tmp $t 'pr/rank_1.h5.tmp.*'; then bad "kill $victim: no per-rank temporary appeared: $(tail -3 log)"; continue; fi
  m=$(pgrep -P $t); ranks=$(pgrep -P "$m" | tr '\n' ' ')
  case $victim in mpirun) kill -9 "$m" ;; *) kill -9 "$(rank_pid "$m" "${victim#rank }")" ;; esac
  wait $t 2>/dev/null; rc=$?
  gone_within $ranks || bad "kill $victim: ranks $ranks still running"
  l=$(left)
  [ -z "$l" ] && ok "SIGKILL of $victim (rc $rc): nothing left" || bad "SIGKILL of $victim (rc $rc): left $l; $(tail -2 log)"
done

# ---- a 1-rank run killed with SIGKILL: no handler; the temporary is named, never complete ----
rm -rf ./*
"$SIM" --steps 30 --grid 16x16 --dump k.h5 -q </dev/null & p=$!
wait_tmp $p 'k.h5.tmp.*'; kill -9 $p; wait $p 2>/dev/null
t=$(ls k.h5.tmp.* 2>/dev/null)
[ "$t" = "k.h5.tmp.$p.$host" ] && ok "SIGKILL, 1 rank: $t left (the writer's pid and host), nothing at k.h5" || bad "SIGKILL, 1 rank: left '$t' $(ls)"
[ ! -e k.h5 ] || bad "a file at k.h5 after SIGKILL"
"$SIM" --steps 1 --grid 2x2 --txt-len 4 --dump k.h5 -q </dev/null
[ -f k.h5 ] && [ -z "$(ls k.h5.tmp.* 2>/dev/null)" ] && ok "the next run writing k.h5 removed the stale temporary" || bad "next run: $(ls)"

# ---- flux-sim --clean ----
rm -rf ./*
"$SIM" --steps 30 --grid 16x16 --dump c.h5 -q </dev/null & p=$!
wait_tmp $p 'c.h5.tmp.*'; kill -9 $p; wait $p 2>/dev/null
cp c.h5.tmp.$p.$host c.h5.tmp.$$.$host               # a live writer: this shell
cp c.h5.tmp.$p.$host c.h5.tmp.$p.otherhost           # another host's: not judged here
echo notes >c.h5.tmp.999999.$host                      # not an HDF5 file
mkdir pr && cp c.h5.tmp.$p.$host pr/rank_3.h5.tmp.$p.$host
"$SIM" --clean c.h5 >out 2>err; rc=$?
if [ $rc -eq 0 ] && [ ! -e c.h5.tmp.$p.$host ] && [ -e c.h5.tmp.$$.$host ] && [ -e c.h5.tmp.$p.otherhost ] && [ -e c.h5.tmp.999999.$host ] &&
   grep -q "^removed c.h5.tmp.$p.$host" out && grep -q "^kept c.h5.tmp.$$.$host (its writer, process $$, is running)" out &&
   grep -q "^kept c.h5.tmp.$p.otherhost (written on host otherhost" out; then ok "--clean c.h5: $(tr '\n' ';' <out)"
else bad "--clean c.h5: rc $rc: $(cat out err) | $(ls)"; fi
"$SIM" --clean pr >out 2>err && [ -z "$(ls pr)" ] && grep -q '^removed pr/rank_3.h5' out && ok "--clean DIR: $(cat out)" || bad "--clean pr: $(cat out err) $(ls pr)"
"$SIM" --clean nothing.h5 >out 2>err && grep -q 'no temporary found' out && ok "--clean with nothing to do: $(cat out)" || bad "--clean nothing: $(cat out err)"
"$SIM" --clean /nonexistent/dir/x.h5 >out 2>err; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <err)" -eq 1 ] && ok "--clean of an unreadable directory: $(cat err)" || bad "--clean /nonexistent: rc $rc $(cat err)"
finish
