#!/usr/bin/env bash
# Hostile checkpoints, index files and pipeline folders (probe 3: T1, T3, T4, T7, T8, T11, T12,
# T18, T20). Every bad case must exit 2 with exactly one stderr line naming the culprit, leave no
# dump temporary, and never crash or hang.
#
# T1 (a checkpoint truncated while the run reads it) is made deterministic with an LD_PRELOAD
# shim built here: it counts pread(2) / fstat(2) calls on *.safetensors descriptors and truncates
# that file right after the Nth one returned. After a pread, the next read of the shard comes back
# short (the decode path: --stream on, a BF16 checkpoint in an fp32 run); after an fstat, the size
# check before a view passed, and the view is then read by the GEMMs from a mapping whose pages
# are gone (the SIGBUS guard). N is found from a counting run of the same command.
# Under make sanitize (FLUX_SANITIZE) the ASan runtime is preloaded before the shims, and the
# strace case runs with leak detection off (LeakSanitizer does not run under ptrace).
. "$(dirname "$0")/lib.sh"
MK=$B/make-checkpoint
tmpdir weights-hostile
RUN=(--steps 2 --grid 2x2 --txt-len 4 -q)

# one <name> <expected substring> <command...>: exit 2, one stderr line holding it, no temporaries
one() {
  local name=$1 want=$2; shift 2
  timeout 120 "$@" >"$T/out" 2>"$T/err" </dev/null; local rc=$?
  local lines; lines=$(wc -l <"$T/err")
  local left; left=$(find "$T" -name '*.tmp.*' -o -name '*.tmp-*' | head -3)
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" "$T/err" && [ -z "$left" ]; then
    ok "$name: $(cut -c1-220 "$T/err")"
  else
    bad "$name: rc=$rc lines=$lines want '$want' left='$left': $(head -c 600 "$T/err")"
  fi
  find "$T" \( -name '*.tmp.*' -o -name '*.tmp-*' \) -exec rm -rf {} + 2>/dev/null
}

# ---- the shim ----
cat >"$T/shim.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
static long n_pread, n_fstat;
static int is_ckpt(int fd, char *path, size_t n)
{
    char l[64];
    snprintf(l, sizeof l, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(l, path, n - 1);
    if (k <= 0) return 0;
    path[k] = 0;
    return k > 12 && !strcmp(path + k - 12, ".safetensors");
}
static void hit(const char *env, long count, const char *path)
{
    const char *v = getenv(env), *log = getenv("SHIM_LOG");
    if (log) { FILE *f = fopen(log, "a"); if (f) { fprintf(f, "%s %ld\n", env, count); fclose(f); } }
    if (v && atol(v) == count) truncate(path, atol(getenv("SHIM_TO") ? getenv("SHIM_TO") : "0"));
}
ssize_t pread(int fd, void *b, size_t n, off_t o)
{
    static ssize_t (*real)(int, void *, size_t, off_t);
    if (!real) real = (ssize_t (*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread");
    ssize_t r = real(fd, b, n, o);
    char p[4096];
    if (is_ckpt(fd, p, sizeof p)) hit("SHIM_PREAD", ++n_pread, p);
    return r;
}
ssize_t pread64(int fd, void *b, size_t n, off_t o) { return pread(fd, b, n, o); }
int fstat(int fd, struct stat *st)
{
    static int (*real)(int, struct stat *);
    if (!real) real = (int (*)(int, struct stat *))dlsym(RTLD_NEXT, "fstat");
    int r = real(fd, st);
    char p[4096];
    if (is_ckpt(fd, p, sizeof p)) hit("SHIM_FSTAT", ++n_fstat, p);
    return r;
}
int fstat64(int fd, struct stat64 *st) { return fstat(fd, (struct stat *)st); }
C
cc -O1 -shared -fPIC -o "$T/shim.so" "$T/shim.c" -ldl || skip_all "cannot build the LD_PRELOAD shim"
# under ASan (make sanitize: FLUX_SANITIZE) the sanitizer runtime must come first in LD_PRELOAD
ASAN_PRE=
if [ -n "${FLUX_SANITIZE:-}" ]; then
  ASAN_PRE=$(ldd "$SIM" | awk '/libasan/ {print $3}')
  [ -n "$ASAN_PRE" ] && ASAN_PRE=$ASAN_PRE:
fi

# ---- checkpoints ----
$MK -q --config tiny --max-shard-size 3MB "$T/bf16" || bad "make-checkpoint bf16"
$MK -q --config tiny --dtype f32 --max-shard-size 3MB "$T/f32" || bad "make-checkpoint f32"
$MK -q --config tiny --layout pipeline "$T/pipe" || bad "make-checkpoint pipeline"
fresh() { rm -rf "$T/$2"; cp -r "$T/$1" "$T/$2"; }

# the number of <pread|fstat> calls on shard descriptors a command makes
count() {
  local kind=$1; shift
  rm -f "$T/shim.log"
  SHIM_LOG="$T/shim.log" LD_PRELOAD="$ASAN_PRE$T/shim.so" timeout 120 "$@" >/dev/null 2>&1 </dev/null
  local c; c=$(grep -c "^SHIM_$kind " "$T/shim.log" 2>/dev/null); echo "${c:-0}"
}

# ---- T1: truncated before the run: the header-vs-size check ----
fresh bf16 c0
s=$(ls "$T"/c0/*-00001-of-*.safetensors); truncate -s $(( $(stat -c%s "$s") / 2 )) "$s"
one "T1 shard truncated before the run" "truncated" "$SIM" --weights "$T/c0" "${RUN[@]}" --dump "$T/o.h5"

# ---- T1: truncated during the run, decode path (BF16 checkpoint, fp32 run, streamed) ----
fresh bf16 c1
n=$(count PREAD "$SIM" --weights "$T/c1" "${RUN[@]}" --stream on --dump "$T/probe.h5"); rm -f "$T/probe.h5"
if [ "$n" -lt 10 ]; then bad "T1 decode: only $n preads of shard bytes counted (the decode reads through the mapping: a truncation would be a SIGBUS)"; else
  one "T1 shard truncated mid-run (pread $((n / 2)) of $n), --stream on, decode" "truncated or rewritten during the run" \
    env LD_PRELOAD="$ASAN_PRE$T/shim.so" SHIM_PREAD=$((n / 2)) "$SIM" --weights "$T/c1" "${RUN[@]}" --stream on --dump "$T/o.h5"
  [ -e "$T/o.h5" ] && bad "T1 decode: o.h5 exists"
  fresh bf16 c1
  timeout 120 mpirun -np 2 env LD_PRELOAD="$ASAN_PRE$T/shim.so" SHIM_PREAD=$((n / 2)) "$SIM" --weights "$T/c1" "${RUN[@]}" \
    --stream on --dump "$T/o.h5" >"$T/out" 2>"$T/err" </dev/null; rc=$?
  left=$(find "$T" -name '*.tmp.*' | head -3)
  if [ $rc -eq 2 ] && grep -q "flux-sim: error.*truncated or rewritten during the run" "$T/err" && ! grep -qi "bus error\|signal 7" "$T/err" \
     && [ -z "$left" ] && [ ! -e "$T/o.h5" ]; then ok "T1 decode under mpirun -np 2: $(grep -m1 flux-sim "$T/err" | cut -c1-200)"
  else bad "T1 decode under mpirun -np 2: rc=$rc left='$left': $(head -c 800 "$T/err")"; fi
fi

# ---- T1: truncated during the run, views (F32 checkpoint, fp32 run): the SIGBUS guard ----
fresh f32 c2
n=$(count FSTAT "$SIM" --weights "$T/c2" "${RUN[@]}" --stream off --dump "$T/probe.h5"); rm -f "$T/probe.h5"
one "T1 shard truncated after the last view was made (fstat $n), --stream off, a GEMM reads it" "(truncated or rewritten while the run used it)" \
  env LD_PRELOAD="$ASAN_PRE$T/shim.so" SHIM_FSTAT="$n" "$SIM" --weights "$T/c2" "${RUN[@]}" --stream off --dump "$T/o.h5"
fresh f32 c2
n=$(count FSTAT "$SIM" --weights "$T/c2" "${RUN[@]}" --stream on --dump "$T/probe.h5"); rm -f "$T/probe.h5"
one "T1 shard truncated mid-run (fstat $((n / 2)) of $n), --stream on, a view" "truncated or rewritten" \
  env LD_PRELOAD="$ASAN_PRE$T/shim.so" SHIM_FSTAT=$((n / 2)) "$SIM" --weights "$T/c2" "${RUN[@]}" --stream on --dump "$T/o.h5"
fresh f32 c2
timeout 120 mpirun -np 2 env LD_PRELOAD="$ASAN_PRE$T/shim.so" SHIM_FSTAT=$((n / 2)) "$SIM" --weights "$T/c2" "${RUN[@]}" \
  --stream on --dump "$T/o.h5" >"$T/out" 2>"$T/err" </dev/null; rc=$?
left=$(find "$T" -name '*.tmp.*' | head -3)
if [ $rc -eq 2 ] && grep -q "flux-sim: error.*truncated or rewritten" "$T/err" && ! grep -qi "bus error\|signal 7" "$T/err" \
   && [ -z "$left" ] && [ ! -e "$T/o.h5" ]; then ok "T1 views under mpirun -np 2: $(grep -m1 flux-sim "$T/err" | cut -c1-200)"
else bad "T1 views under mpirun -np 2: rc=$rc left='$left': $(head -c 800 "$T/err")"; fi

# ---- T3: a 100 000-entry index is parsed in O(n log n) ----
# CPU bound 5 s (the quadratic parser took 103 s natively); under ASan + LSan (make sanitize,
# every malloc unwound in full) the linear one takes ~15 s here: 40 s there
LIM=5 TMO=60; [ -n "${FLUX_SANITIZE:-}" ] && LIM=40 TMO=180
mkdir -p "$T/big"
$PY -c 'import json,sys;json.dump({"weight_map":{"t%07d"%i:"s%07d.safetensors"%i for i in range(100000)}},open(sys.argv[1],"w"))' \
  "$T/big/m.safetensors.index.json"
measured "$T/big.m" timeout "$TMO" "$SIM" --config tiny --weights "$T/big" --steps 1 >/dev/null 2>"$T/err"; rc=$?
cpu=$(cut -d' ' -f2 "$T/big.m")
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && awk -v c="$cpu" -v l="$LIM" 'BEGIN { exit !(c < l) }'; then
  ok "T3 100000 distinct shards: exit 2 in $cpu s CPU (was 103 s)"
else bad "T3 100000 distinct shards: rc=$rc cpu=$cpu s: $(head -c 300 "$T/err")"; fi
# one real shard holding 100 000 tensors, all listed: both verification passes run in full
mkdir -p "$T/big2"
$PY - "$T/big2" <<'P'
import json, struct, sys
d = sys.argv[1]; n = 100000
h = {"t%07d" % i: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(n)}
b = json.dumps(h).encode(); b += b" " * (-len(b) % 8)
with open(d + "/s.safetensors", "wb") as f: f.write(struct.pack("<Q", len(b)) + b + bytes(4 * n))
json.dump({"weight_map": {"t%07d" % i: "s.safetensors" for i in range(n)}}, open(d + "/m.safetensors.index.json", "w"))
P
measured "$T/big2.m" timeout "$TMO" "$SIM" --config tiny --weights "$T/big2" --steps 1 >/dev/null 2>"$T/err"; rc=$?
cpu=$(cut -d' ' -f2 "$T/big2.m")
if [ $rc -eq 2 ] && grep -q "missing tensor\|unexpected tensor" "$T/err" && awk -v c="$cpu" -v l="$LIM" 'BEGIN { exit !(c < l) }'; then
  ok "T3 one shard of 100000 tensors, all in weight_map: checked in $cpu s CPU"
else bad "T3 one shard of 100000 tensors: rc=$rc cpu=$cpu s: $(head -c 300 "$T/err")"; fi

# ---- T4: a FIFO where an index is expected ----
mkdir -p "$T/fifo"; mkfifo "$T/fifo/x.safetensors.index.json"
one "T4 FIFO index in a --weights folder" "not a regular file" "$SIM" --weights "$T/fifo" "${RUN[@]}"
one "T4 FIFO index named" "not a regular file" "$SIM" --weights "$T/fifo/x.safetensors.index.json" "${RUN[@]}"

# ---- T20: shard names confined to the index's folder ----
idx=$(ls "$T"/bf16/*.index.json)
for evil in ../../../../../../etc/passwd /etc/passwd; do
  fresh bf16 c3
  $PY - "$T/c3/$(basename "$idx")" "$evil" <<'P'
import json, sys
j = json.load(open(sys.argv[1])); k = sorted(j["weight_map"])[0]; j["weight_map"][k] = sys.argv[2]
json.dump(j, open(sys.argv[1], "w"))
P
  one "T20 shard '$evil'" "shards must be inside" "$SIM" --weights "$T/c3" "${RUN[@]}"
  grep -q "root:x\|3475222254926655346" "$T/err" && bad "T20 $evil: the file's bytes were echoed"
done
fresh bf16 c3
s=$(ls "$T"/c3/*-00001-of-*.safetensors); mv "$s" "$T/outside.safetensors"; ln -s "$T/outside.safetensors" "$s"
one "T20 shard a symlink out of the folder" "outside the index's folder" "$SIM" --weights "$T/c3" "${RUN[@]}"
# a Hugging Face cache: snapshots/<rev>/ links to ../../blobs/<sha> are fine
mkdir -p "$T/hf/blobs" "$T/hf/snapshots/abc"
for f in "$T"/bf16/*; do cp "$f" "$T/hf/blobs/$(basename "$f").blob"; ln -s "../../blobs/$(basename "$f").blob" "$T/hf/snapshots/abc/$(basename "$f")"; done
if timeout 120 "$SIM" --weights "$T/hf/snapshots/abc" "${RUN[@]}" >/dev/null 2>"$T/err"; then ok "T20 a Hugging Face cache snapshot (symlinks into blobs/) still loads"
else bad "T20 HF cache snapshot refused: $(cat "$T/err")"; fi
fresh bf16 c3
$PY - "$T/c3/$(basename "$idx")" <<'P'
import json, sys
j = json.load(open(sys.argv[1])); k = sorted(j["weight_map"])[0]; j["weight_map"][k] = "x" * 5000
json.dump(j, open(sys.argv[1], "w"))
P
one "T20 a 5000-character shard name is cut" "bytes)" "$SIM" --weights "$T/c3" "${RUN[@]}"
[ "$(wc -c <"$T/err")" -lt 1200 ] || bad "T20 long name: $(wc -c <"$T/err") bytes of message"

# ---- T7: scheduler values ----
sched() { fresh pipe p7; printf '%s' "$1" >"$T/p7/scheduler/scheduler_config.json"; }
for js in '{"use_dynamic_shifting":false,"shift":1e308}' '{"use_dynamic_shifting":false,"shift":1e-320}' \
          '{"use_dynamic_shifting":true,"base_shift":1000}' '{"use_dynamic_shifting":true,"max_shift":-1000}' \
          '{"use_dynamic_shifting":true,"max_shift":1e308}' '{"use_dynamic_shifting":false,"shift":1e999}' \
          '{"use_dynamic_shifting":true,"base_shift":0.5,"max_shift":15,"base_image_seq_len":256,"max_image_seq_len":257}' \
          '{"max_image_seq_len":1e300}'; do
  sched "$js"
  one "T7 scheduler $js" "scheduler_config.json" "$SIM" --weights "$T/p7" "${RUN[@]}" --dump "$T/o.h5"
done
sched '{"use_dynamic_shifting":true,"base_shift":0.5,"max_shift":1.15,"shift":3.0}'
timeout 120 "$SIM" --weights "$T/p7" "${RUN[@]}" >/dev/null 2>"$T/err" && ok "T7 FLUX.1-dev's scheduler values accepted" || bad "T7 dev values refused: $(cat "$T/err")"

# ---- T8: present but unusable optional files ----
for f in scheduler/scheduler_config.json model_index.json transformer/config.json; do
  for kind in dangling dir fifo loop; do
    fresh pipe p8; rm -f "$T/p8/$f"
    case $kind in
      dangling) ln -s "$T/nowhere" "$T/p8/$f" ;;
      dir) mkdir "$T/p8/$f" ;;
      fifo) mkfifo "$T/p8/$f" ;;
      loop) ln -s "$(basename "$f")" "$T/p8/$f" ;;
    esac
    one "T8 $f $kind" "$(basename "$f")" "$SIM" --weights "$T/p8" "${RUN[@]}" --dump "$T/o.h5"
  done
done

# ---- T12: JSON strings escaped ----
fresh pipe p12
$PY - "$T/p12/transformer/config.json" <<'P'
import json, sys
j = json.load(open(sys.argv[1])); j["_class_name"] = "Flux\nflux-sim: OK\u001b[2J"; json.dump(j, open(sys.argv[1], "w"))
P
one "T12 _class_name with a newline and ESC" "_class_name is" "$SIM" --weights "$T/p12" "${RUN[@]}"
grep -q $'\033' "$T/err" && bad "T12: raw ESC in the message"
fresh pipe p12
$PY - "$T/p12/model_index.json" <<'P'
import json, sys
j = json.load(open(sys.argv[1])); j["transformer"] = ["diffusers", "X" * 100000 + "\n\u001b]0;t\u0007"]; json.dump(j, open(sys.argv[1], "w"))
P
one "T12 model_index class of 100000 characters and controls" "not a FLUX pipeline" "$SIM" --weights "$T/p12" "${RUN[@]}"
[ "$(wc -c <"$T/err")" -lt 1200 ] || bad "T12 long class: $(wc -c <"$T/err") bytes of message"

# ---- T18: make-checkpoint's arguments ----
one "T18 --weights-seed ' -1'" "--weights-seed" "$MK" --config tiny --weights-seed " -1" "$T/m1"
one "T18 --weights-seed 0x10" "--weights-seed" "$MK" --config tiny --weights-seed 0x10 "$T/m1"
one "T18 --max-shard-size ' 10GB'" "--max-shard-size" "$MK" --config tiny --max-shard-size " 10GB" "$T/m1"
one "T18 --max-shard-size 0x10" "--max-shard-size" "$MK" --config tiny --max-shard-size 0x10 "$T/m1"
one "T18 --max-shard-size 1e3" "--max-shard-size" "$MK" --config tiny --max-shard-size 1e3 "$T/m1"
one "T18 OUT exists, no banner first" "already exists" "$MK" --config tiny "$T/bf16"
one "T18 OUT empty" "output path is empty" "$MK" --config tiny ""
[ -e "$T/m1" ] && bad "T18: m1 was written"
"$MK" -q --config tiny --max-shard-size 1.5MB --weights-seed 007 "$T/m2" && ok "T18 1.5MB and seed 007 accepted" || bad "T18 1.5MB refused"

# ---- T11: OUT appearing while make-checkpoint writes is never replaced ----
# deterministic: the shim-free way is a FIFO-free race we control -- the first fsync of a shard
# is where OUT gets created (LD_PRELOAD on fsync)
cat >"$T/fs.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
int fsync(int fd)
{
    static int (*real)(int);
    static int done;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    const char *out = getenv("RACE_OUT"), *kind = getenv("RACE_KIND");
    if (out && !done) {
        done = 1;
        if (kind && kind[0] == 'd') mkdir(out, 0777);
        else { int f = open(out, O_WRONLY | O_CREAT | O_EXCL, 0644); if (f >= 0) { write(f, "precious\n", 9); close(f); } }
    }
    return real(fd);
}
C
cc -O1 -shared -fPIC -o "$T/fs.so" "$T/fs.c" -ldl || bad "cannot build the fsync shim"
one "T11 a file created at OUT during a bfl write" "not replaced" env LD_PRELOAD="$ASAN_PRE$T/fs.so" RACE_OUT="$T/r.safetensors" RACE_KIND=f \
  "$MK" -q --config tiny --layout bfl "$T/r.safetensors"
grep -qx precious "$T/r.safetensors" && ok "T11 the file at OUT kept" || bad "T11 the file at OUT was replaced"
one "T11 an empty directory created at OUT during a diffusers write" "not replaced" env LD_PRELOAD="$ASAN_PRE$T/fs.so" RACE_OUT="$T/rd" RACE_KIND=d \
  "$MK" -q --config tiny "$T/rd"
[ -d "$T/rd" ] && [ -z "$(ls -A "$T/rd")" ] && ok "T11 the directory at OUT kept empty" || bad "T11 the directory at OUT was replaced"
strace -V >/dev/null 2>&1 && {
  # LeakSanitizer cannot run under ptrace: leak checking off for this one traced command
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" strace -f -e trace=fsync,renameat2 -o "$T/st" "$MK" -q --config tiny "$T/s1" >/dev/null 2>&1
  nf=$(grep -c 'fsync(' "$T/st"); nr=$(grep -c 'RENAME_NOREPLACE' "$T/st")
  [ "$nf" -ge 3 ] && [ "$nr" -ge 1 ] && ok "T11 $nf fsyncs and a RENAME_NOREPLACE rename" || bad "T11 fsync $nf renameat2 $nr"
}
finish
