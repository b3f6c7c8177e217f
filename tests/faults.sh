#!/usr/bin/env bash
# Faults during a run that writes a dump: a full disk, a read-only target, a rank killed with
# SIGKILL, SIGTERM and SIGINT to mpirun or to a single-rank flux-sim. In every case the job must
# end by itself (never hang: each run has a timeout whose expiry, exit 124, fails the case), say
# what happened in exactly one flux-sim line on stderr, end with the documented exit code
# (docs/reliability.md, "Faults"), leave no file at the --dump path that could pass for a
# complete dump, and leave no *.tmp.* temporary anywhere.
#
# Two ways to fill a disk, both run when available:
#  * shim: an LD_PRELOAD library built here with cc. write/pwrite/pwritev to files under a
#    directory fail with ENOSPC once a process has written FLUX_FAULT_ENOSPC_AFTER bytes there
#    (0: full from the start); with FLUX_FAULT_EROFS, opening a file there for writing or making a
#    directory fails with EROFS. Deterministic, needs no privilege, and statvfs still shows free
#    space, so the failure comes from the writes themselves (flux-sim refuses a dump bigger than
#    the free space before it starts: fs_estimate).
#  * mount: real tmpfs file systems (root with CAP_SYS_ADMIN; skipped, saying so, where mount is
#    not permitted). A 2 MiB one: a plain dump is refused up front, a compressed or per-rank dump
#    (size unknown in advance) fills it. A 40 MiB one filled while the run is stopped (SIGSTOP)
#    right after it created its temporary. A read-only one.
#
# Probe defects covered (../shared/reliability-probe.md): #3 (parallel --check --dump on a full
# disk hung), #4 (single-rank ENOSPC: error, then SIGSEGV, exit 139), #7 (temporaries left by
# kills, signals and aborts), #8 (a signal to mpirun: nothing printed), #9 (a --dump-per-rank
# write failure: no flux-sim message, temporaries left), #14 (parallel ENOSPC said only "HDF5
# error"). FLUX_FAULTS_NO_MOUNT=1 runs without the mount cases.
. "$(dirname "$0")/lib.sh"
case $SIM in /*) ;; *) SIM=$PWD/$SIM ;; esac
tmpdir faults
test_cleanup() { # lib.sh's EXIT trap runs it, then removes T
  for m in "$T/small" "$T/big" "$T/ro"; do mountpoint -q "$m" 2>/dev/null && umount "$m"; done
}
# Under ASan (make sanitize) everything is a few times slower.
SLOW=1; [ -n "${FLUX_SANITIZE:-}" ] && SLOW=4
mkdir -p "$T/d" "$T/shim" "$T/small" "$T/big" "$T/ro"

# ---------------------------------------------------------------- the shim
cat >"$T/shim.c" <<'C'
/* LD_PRELOAD: a full or read-only file system under $FLUX_FAULT_DIR (tests/faults.sh). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
static long long limit = -2, used;
static const char *dir(void) { const char *d = getenv("FLUX_FAULT_DIR"); return d && *d ? d : NULL; }
static int path_under(const char *p) { const char *d = dir(); return d && p && !strncmp(p, d, strlen(d)); }
static int fd_under(int fd)
{
    char l[64], p[4096];
    snprintf(l, sizeof l, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(l, p, sizeof p - 1);
    if (n <= 0) return 0;
    p[n] = 0;
    return path_under(p);
}
static int full(int fd, size_t n)
{
    if (limit == -2) { const char *s = getenv("FLUX_FAULT_ENOSPC_AFTER"); limit = s && *s ? atoll(s) : -1; }
    if (limit < 0 || !fd_under(fd)) return 0;
    if (used + (long long)n > limit) { errno = ENOSPC; return 1; }
    used += (long long)n;
    return 0;
}
static int rofs(const char *p, int flags) { return getenv("FLUX_FAULT_EROFS") && path_under(p) && (flags & (O_WRONLY | O_RDWR | O_CREAT)); }
#define REAL(name) static __typeof__(&name) real_##name; if (!real_##name) real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)
ssize_t write(int fd, const void *b, size_t n) { REAL(write); return full(fd, n) ? -1 : real_write(fd, b, n); }
ssize_t pwrite(int fd, const void *b, size_t n, off_t o) { REAL(pwrite); return full(fd, n) ? -1 : real_pwrite(fd, b, n, o); }
ssize_t pwrite64(int fd, const void *b, size_t n, off_t o) { REAL(pwrite64); return full(fd, n) ? -1 : real_pwrite64(fd, b, n, o); }
static size_t iov_bytes(const struct iovec *v, int c) { size_t n = 0; for (int i = 0; i < c; i++) n += v[i].iov_len; return n; }
ssize_t writev(int fd, const struct iovec *v, int c) { REAL(writev); return full(fd, iov_bytes(v, c)) ? -1 : real_writev(fd, v, c); }
ssize_t pwritev(int fd, const struct iovec *v, int c, off_t o) { REAL(pwritev); return full(fd, iov_bytes(v, c)) ? -1 : real_pwritev(fd, v, c, o); }
ssize_t pwritev64(int fd, const struct iovec *v, int c, off_t o) { REAL(pwritev64); return full(fd, iov_bytes(v, c)) ? -1 : real_pwritev64(fd, v, c, o); }
#define OPENLIKE(name)                                                              \
    int name(const char *p, int flags, ...)                                         \
    {                                                                               \
        REAL(name);                                \
        mode_t m = 0;                                                               \
        if (flags & (O_CREAT | O_TMPFILE)) { va_list a; va_start(a, flags); m = va_arg(a, mode_t); va_end(a); } \
        if (rofs(p, flags)) { errno = EROFS; return -1; }                           \
        return real_##name(p, flags, m);                                            \
    }
OPENLIKE(open)
OPENLIKE(open64)
#define OPENATLIKE(name)                                                            \
    int name(int dfd, const char *p, int flags, ...)                                \
    {                                                                               \
        REAL(name);                           \
        mode_t m = 0;                                                               \
        if (flags & (O_CREAT | O_TMPFILE)) { va_list a; va_start(a, flags); m = va_arg(a, mode_t); va_end(a); } \
        if (rofs(p, flags)) { errno = EROFS; return -1; }                           \
        return real_##name(dfd, p, flags, m);                                       \
    }
OPENATLIKE(openat)
OPENATLIKE(openat64)
int mkdir(const char *p, mode_t m) { REAL(mkdir); if (rofs(p, O_CREAT)) { errno = EROFS; return -1; } return real_mkdir(p, m); }
C
SHIM=
if cc -shared -fPIC -O1 -o "$T/shim.so" "$T/shim.c" -ldl 2>"$T/cc.log"; then
  SHIM=$T/shim.so
  # under ASan the sanitizer runtime must come first in LD_PRELOAD
  if [ -n "${FLUX_SANITIZE:-}" ]; then SHIM="$(ldd "$SIM" | awk '/libasan/ {print $3}'):$SHIM"; fi
else
  skip "the shim cases: cc cannot build the LD_PRELOAD shim — they did NOT run"; cat "$T/cc.log"
fi
# ---------------------------------------------------------------- the mounts
MOUNT=
if [ -z "${FLUX_FAULTS_NO_MOUNT:-}" ] && mount -t tmpfs -o size=2m tmpfs "$T/small" 2>/dev/null; then
  if mount -t tmpfs -o size=40m tmpfs "$T/big" && mount -t tmpfs -o size=40m,ro tmpfs "$T/ro"; then MOUNT=1
  else skip "the mount cases: a second tmpfs could not be mounted — they did NOT run"; fi
else
  skip "the mount cases: mount -t tmpfs is not permitted here (or FLUX_FAULTS_NO_MOUNT) — they did NOT run"
fi
[ -z "$SHIM$MOUNT" ] && echo "*** neither way to fill a disk is available: only the kill and signal cases run ***"

# what a fault may leave: no dump-looking file, no temporary, anywhere under T
leftovers() { (cd "$T" && find d shim small big ro \( -name '*.h5' -o -name '*.tmp.*' \) 2>/dev/null | tr '\n' ' '); }
nlines() { grep -c "^flux-sim: " "$T/log"; }
wipe() { rm -rf "$T"/d/* "$T"/shim/* "$T"/small/* "$T"/big/* 2>/dev/null; }
# run ENV... -- CMD...: runs CMD (flux-sim or mpirun ... flux-sim) with the environment settings
# ENV (also passed to the ranks with mpirun -x); sets rc and secs, output in $T/log
run() {
  local env=() xs=() a
  while [ "$1" != -- ]; do env+=("$1"); shift; done; shift
  local cmd=("$@")
  if [ "${cmd[0]}" = mpirun ]; then for a in "${env[@]}"; do xs+=(-x "$a"); done; cmd=(mpirun "${xs[@]}" "${cmd[@]:1}"); fi
  local start=$(date +%s%N)
  env "${env[@]}" timeout $((60 * SLOW)) "${cmd[@]}" </dev/null >"$T/log" 2>&1; rc=$?
  secs=$(( ($(date +%s%N) - start) / 1000000000 ))
}
# expect TAG RC REGEX: the exit code, exactly one flux-sim line matching REGEX, nothing left.
# "Never hang" is the timeout around each run (60 s, a kill case 120 s; x4 under ASan): a run
# that hangs is ended by it, exit 124, which is never the code wanted. The seconds a run took are
# printed, not asserted: on a loaded 2-core machine the wall clock measures the load.
expect() {
  local tag=$1 want=$2 re=$3 left n
  left=$(leftovers); n=$(nlines)
  if [ $rc -eq "$want" ] && [ "$n" -eq 1 ] && grep -qE "^flux-sim: $re" "$T/log" && [ -z "$left" ]; then
    ok "$tag → exit $rc in ${secs}s: $(grep '^flux-sim: ' "$T/log" | cut -c1-150)"
  else
    bad "$tag: exit $rc (want $want; 124: hung, ended by the timeout) after ${secs}s, $n flux-sim lines (want 1 matching '$re'), left: ${left:-nothing}"
    grep -v '^ ' "$T/log" | head -12
  fi
  wipe
}

A="--grid 4x4 --txt-len 8 --steps 2"   # a 6.6 MB dump
NOSPC='.*No space left on device'
EROFS='.*Read-only file system'
if [ -n "$SHIM" ]; then
  # ------------------------------------------------------------ shim: ENOSPC after 2 MiB / from the start
  full=(LD_PRELOAD="$SHIM" FLUX_FAULT_DIR="$T/shim" FLUX_FAULT_ENOSPC_AFTER=2097152)
  full0=(LD_PRELOAD="$SHIM" FLUX_FAULT_DIR="$T/shim" FLUX_FAULT_ENOSPC_AFTER=0)
  rofs=(LD_PRELOAD="$SHIM" FLUX_FAULT_DIR="$T/shim" FLUX_FAULT_EROFS=1)
  O=$T/shim/o.h5 PR=$T/shim/pr
  run "${full[@]}" -- "$SIM" -q $A --dump "$O"
  expect "shim ENOSPC, 1 rank, --dump (probe #4: SIGSEGV, exit 139)" 2 "error: $NOSPC"
  run "${full[@]}" -- "$SIM" -q $A --dump-compress 1 --dump "$O"
  expect "shim ENOSPC at the closing flush, 1 rank, --dump-compress 1 (#4)" 2 "error: .*not written: $NOSPC"
  run "${full0[@]}" -- "$SIM" -q $A --dump "$O"
  expect "shim disk full from the start, 1 rank" 2 "error: .*cannot create dump$NOSPC"
  run "${full[@]}" -- mpirun -np 2 "$SIM" -q $A --dump "$O"
  expect "shim ENOSPC, mpirun -np 2 --dump (#14: said 'HDF5 error')" 2 "error: $NOSPC"
  run "${full0[@]}" -- mpirun -np 2 "$SIM" -q $A --check --dump "$O"
  expect "shim disk full from the start, mpirun -np 2 --check --dump (probe #3: hung)" 2 "error: $NOSPC"
  run "${full0[@]}" -- mpirun -np 2 "$SIM" -q $A --dump "$O"
  expect "shim disk full from the start, mpirun -np 2 --dump (#3)" 2 "error: $NOSPC"
  run "${full[@]}" -- mpirun -np 2 "$SIM" -q $A --check --dump "$O"
  expect "shim ENOSPC mid-run, mpirun -np 2 --check --dump" 2 "error: $NOSPC"
  run "${full[@]}" -- mpirun -np 2 "$SIM" -q $A --dump-per-rank "$PR"
  expect "shim ENOSPC, mpirun -np 2 --dump-per-rank (probe #9: no message)" 2 "error: .*rank_[01]\.h5$NOSPC"
  run "${full[@]}" -- mpirun -np 3 "$SIM" -q $A --ring 3 --dump-per-rank "$PR" --dump "$O"
  expect "shim ENOSPC, mpirun -np 3 --ring 3 --dump-per-rank + --dump" 2 "error: $NOSPC"
  run "${rofs[@]}" -- "$SIM" -q $A --dump "$O"
  expect "shim read-only target, 1 rank" 2 "error: .*cannot create dump$EROFS"
  run "${rofs[@]}" -- mpirun -np 2 "$SIM" -q $A --check --dump "$O"
  expect "shim read-only target, mpirun -np 2 --check --dump" 2 "error: .*cannot create dump$EROFS"
  run "${rofs[@]}" -- mpirun -np 2 "$SIM" -q $A --dump-per-rank "$PR"
  expect "shim read-only target, mpirun -np 2 --dump-per-rank" 2 "error: $EROFS"
fi

# fill_stopped TAG NP [flux-sim options]: runs on the 40 MiB tmpfs, stops every flux-sim process
# (SIGSTOP) as soon as the temporary exists, fills the file system, lets them go on (SIGCONT)
fill_stopped() {
  local np=$1; shift
  local cmd=("$SIM" "$@" --dump "$T/big/o.h5")
  [ "$np" -gt 0 ] && cmd=(mpirun -np "$np" "${cmd[@]}")
  local start=$(date +%s%N)
  timeout $((60 * SLOW)) "${cmd[@]}" </dev/null >"$T/log" 2>&1 &
  local job=$! procs p
  # waited for as long as the run runs (its timeout is the bound), not for a fixed count: on a
  # loaded machine the temporary can come late, and the disk must fill after it exists
  while kill -0 $job 2>/dev/null && ! ls "$T/big" | grep -q '\.tmp\.'; do sleep 0.02; done
  ls "$T/big" | grep -q '\.tmp\.' || echo "fill_stopped: the run never created its temporary"
  procs=$(pgrep -P $job); [ "$np" -gt 0 ] && procs=$(for p in $procs; do pgrep -P $p; done)
  kill -STOP $procs 2>/dev/null
  dd if=/dev/zero of="$T/big/filler" bs=1M 2>/dev/null
  kill -CONT $procs 2>/dev/null
  wait $job; rc=$?
  secs=$(( ($(date +%s%N) - start) / 1000000000 ))
  rm -f "$T/big/filler"
}
if [ -n "$MOUNT" ]; then
  # ------------------------------------------------------------ real file systems
  run -- "$SIM" -q $A --dump "$T/small/o.h5"
  expect "2 MiB tmpfs, a 6 MiB dump, 1 rank: refused before the run" 2 "error: --dump .*: the dump of 2 steps will be ~[0-9.]+ MiB; its file system has 2 MiB free"
  run -- mpirun -np 2 "$SIM" -q $A --check --dump "$T/small/o.h5"
  expect "2 MiB tmpfs, a 6 MiB dump, mpirun -np 2 --check: refused before the run" 2 "error: --dump .*: the dump of 2 steps will be ~[0-9.]+ MiB; its file system has 2 MiB free"
  run -- "$SIM" -q $A --dump-compress 1 --dump "$T/small/o.h5"
  expect "2 MiB tmpfs fills, 1 rank, --dump-compress 1 (#4)" 2 "error: $NOSPC"
  run -- mpirun -np 2 "$SIM" -q $A --dump-per-rank "$T/small/pr"
  expect "2 MiB tmpfs fills, mpirun -np 2 --dump-per-rank (#9)" 2 "error: .*rank_[01]\.h5$NOSPC"
  B="--grid 8x8 --txt-len 8 --steps 3"   # a 28.7 MB dump on the 40 MiB tmpfs
  fill_stopped 0 -q $B
  expect "40 MiB tmpfs filled during the run, 1 rank --dump (#4)" 2 "error: $NOSPC"
  fill_stopped 2 -q $B --check
  expect "40 MiB tmpfs filled during the run, mpirun -np 2 --check --dump (#3)" 2 "error: $NOSPC"
  fill_stopped 2 -q $B
  expect "40 MiB tmpfs filled during the run, mpirun -np 2 --dump (#3, #14)" 2 "error: $NOSPC"
  run -- "$SIM" -q $A --dump "$T/ro/o.h5"
  expect "read-only tmpfs, 1 rank" 2 "error: .*cannot create dump$EROFS"
  run -- mpirun -np 2 "$SIM" -q $A --check --dump "$T/ro/o.h5"
  expect "read-only tmpfs, mpirun -np 2 --check --dump" 2 "error: .*cannot create dump$EROFS"
  run -- mpirun -np 2 "$SIM" -q $A --dump-per-rank "$T/ro/pr"
  expect "read-only tmpfs, mpirun -np 2 --dump-per-rank" 2 "error: $EROFS"
fi

# ---------------------------------------------------------------- kills and signals (probe #7, #8)
# A run long enough to be caught in the middle (--check: rank 0 computes the single-rank
# reference first, the dump already exists; without: every rank is dumping).
LONG="-q --grid 16x16 --steps 30"
# kill_case TAG NP WHO SIGNAL [flux-sim options]: WHO is mpirun, or rankN. Starts the run, waits
# until its temporary exists (for as long as the run runs: the timeout bounds it) plus a second
# into the run, sends the signal, and times the end (printed, not asserted: see expect).
kill_case() {
  local tag=$1 np=$2 who=$3 sig=$4; shift 4
  rm -rf "$T/d"/*
  local cmd=("$SIM" $LONG "$@" --dump "$T/d/o.h5")
  [ "$np" -gt 0 ] && cmd=(mpirun -np "$np" "${cmd[@]}")
  # job control: a background job of a non-interactive shell would ignore SIGINT
  set -m
  timeout $((120 * SLOW)) "${cmd[@]}" </dev/null >"$T/log" 2>&1 &
  local job=$!
  set +m
  local i=0 main=$job
  # the process to signal: under timeout, mpirun (or the single flux-sim) is timeout's child
  while kill -0 $job 2>/dev/null && ! ls "$T/d" 2>/dev/null | grep -q '\.tmp\.'; do sleep 0.05; done
  local no_tmp=; ls "$T/d" 2>/dev/null | grep -q '\.tmp\.' || no_tmp=1
  sleep 1 # a moment into the run (not a synchronisation: it is mid-run whenever this ends)
  main=$(pgrep -P $job | head -1)
  local ranks=() p target=
  if [ "$np" -gt 0 ]; then
    for p in $(pgrep -P "$main"); do ranks+=("$p"); done
    if [ "$who" = mpirun ]; then target=$main
    else
      for p in "${ranks[@]}"; do
        tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=${who#rank}" && target=$p
      done
    fi
  else target=$main
  fi
  local done_early=; kill -0 "$main" 2>/dev/null || done_early=1
  local start=$(date +%s%N)
  [ -n "$target" ] && kill -"$sig" "$target"
  wait $job; rc=$?
  secs=$(( ($(date +%s%N) - start) / 1000000000 ))
  # ranks alive and not zombies (reparented ranks wait for an init that reaps) once mpirun has
  # ended: given up to 30 s to go (polled, not slept for: a loaded machine ends them late)
  local orphans= st k
  for k in $(seq 1 300); do
    orphans=
    for p in "${ranks[@]}"; do
      st=$(ps -o stat= -p "$p" 2>/dev/null); [ -n "$st" ] && [ "${st#Z}" = "$st" ] && orphans="$orphans $p"
    done
    [ -z "$orphans" ] && break; sleep 0.1
  done
  if [ -n "$no_tmp" ]; then bad "$tag: the run never created its temporary (nothing to catch mid-dump)"; return; fi
  if [ -n "$done_early" ] || [ -z "$target" ]; then bad "$tag: could not signal the run (finished early or no target)"; return; fi
  [ -n "$orphans" ] && { bad "$tag: ranks still alive after mpirun ended:$orphans"; kill -9 $orphans 2>/dev/null; return; }
}

kill_case "SIGKILL rank 1 during the --check reference (np 2)" 2 rank1 KILL --check
expect "SIGKILL of rank 1, mpirun -np 2 --check --dump (probe #7)" 137 "stopped by SIGTERM"
kill_case "SIGKILL rank 1 while dumping (np 2)" 2 rank1 KILL
expect "SIGKILL of rank 1 while every rank dumps, mpirun -np 2 --dump" 137 "stopped by SIGTERM"
# rank 0 killed: rank 1 deletes the temporary; the one message is Open MPI's, naming rank 0
kill_case "SIGKILL rank 0 (np 2)" 2 rank0 KILL --check
left=$(leftovers)
if [ $rc -eq 137 ] && [ "$(nlines)" -eq 0 ] && grep -q "process rank 0 .* exited on signal 9" "$T/log" && [ -z "$left" ]; then
  ok "SIGKILL of rank 0, mpirun -np 2 --check --dump → exit 137 in ${secs}s, Open MPI: '$(grep -o 'process rank 0 .* exited on signal 9' "$T/log")', nothing left"
else bad "SIGKILL of rank 0: exit $rc after ${secs}s, $(nlines) flux-sim lines, left: ${left:-nothing}"; grep -v '^ ' "$T/log" | head -8; fi
# mpirun exits 1 on SIGTERM/SIGINT whatever its ranks do (Open MPI's code); the ranks get SIGTERM
kill_case "SIGTERM to mpirun" 2 mpirun TERM --check
expect "SIGTERM to mpirun -np 2 --check --dump (probe #8: nothing printed)" 1 "stopped by SIGTERM"
kill_case "SIGINT to mpirun" 2 mpirun INT
expect "SIGINT to mpirun -np 2 --dump (#8)" 1 "stopped by SIGTERM"
kill_case "SIGTERM to flux-sim" 0 - TERM
expect "SIGTERM to a single-rank flux-sim --dump" 143 "stopped by SIGTERM"
kill_case "SIGINT to flux-sim" 0 - INT
expect "SIGINT (Ctrl-C) to a single-rank flux-sim --dump" 130 "stopped by SIGINT"

finish
