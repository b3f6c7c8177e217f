#!/usr/bin/env bash
# flux-oracle diff vs h5diff -p 1e-4 on one pair of ~300 MB dumps (docs/oracle.md, "Benchmark").
#   A: flux-sim, float32, 32x32 image tokens, 128 text tokens, 2 steps, every module recorded
#   B: A with every step/final value moved by -2..+2 ulp (h5py): float32 rounding-level
#      differences, what two float32 runs of one model differ by. (Two flux-sim runs are bitwise
#      identical, and h5diff short-cuts identical data with a memcmp, which would time nothing.)
# Both tools read the same pair from the page cache (one warm-up run each); prints the median of
# 5 wall-clock times and the peak RSS (/usr/bin/time). Standalone: tools/bench/bench_oracle.sh [DIR]
# (default $TMPDIR or /tmp; the dumps are kept there for re-runs, delete DIR/oracle-bench after).
set -eu
cd "$(dirname "$0")/../.."
DIR=${1:-${TMPDIR:-/tmp}}/oracle-bench
mkdir -p "$DIR"
OR=build/flux-oracle; SIM=build/flux-sim
[ -x "$OR" ] && [ -x "$SIM" ] || { echo "bench_oracle: build first (make)"; exit 2; }
command -v h5diff >/dev/null || { echo "bench_oracle: h5diff not found (Debian hdf5-tools)"; exit 2; }
[ -x /usr/bin/time ] || { echo "bench_oracle: /usr/bin/time not found (Debian time)"; exit 2; }
if [ ! -s "$DIR/A.h5" ] || [ ! -s "$DIR/B.h5" ]; then
  echo "== building the pair in $DIR"
  "$SIM" -q --grid 32x32 --txt-len 128 --steps 2 --dump "$DIR/A.h5"
  cp "$DIR/A.h5" "$DIR/B.tmp.h5"
  /usr/bin/python3 - "$DIR/B.tmp.h5" <<'PY'
import sys, h5py, numpy as np
rng = np.random.default_rng(0)
with h5py.File(sys.argv[1], "r+") as f:
    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and obj.dtype.kind == "f" and not name.startswith("inputs"):
            x = obj[()]
            obj[...] = x + np.spacing(np.abs(x)).astype(x.dtype) * rng.integers(-2, 3, size=x.shape).astype(x.dtype)
    f.visititems(visit)
PY
  mv "$DIR/B.tmp.h5" "$DIR/B.h5"
fi
sz() { du -m "$1" | cut -f1; }
echo "== pair: A $(sz "$DIR/A.h5") MB, B $(sz "$DIR/B.h5") MB ($(nproc) cores)"
# run NAME CMD...: warm-up, then 5 timed runs; prints the median wall time (nanosecond clock
# around the process: /usr/bin/time rounds to 10 ms, too coarse here) and the max peak RSS.
run() {
  local name=$1; shift
  "$@" >/dev/null 2>&1 || true
  local ts=() rss=0
  for _ in 1 2 3 4 5; do
    local t0 t1 r
    t0=$(date +%s%N)
    /usr/bin/time -f "%M" -o "$DIR/time.log" "$@" >/dev/null 2>&1 || true
    t1=$(date +%s%N)
    ts+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')")
    r=$(tail -n 1 "$DIR/time.log")
    [ "$r" -gt "$rss" ] && rss=$r
  done
  local med; med=$(printf "%s\n" "${ts[@]}" | sort -g | sed -n 3p)
  printf "%-30s median %6.3f s   (runs: %s)   peak RSS %5d MB\n" "$name" "$med" "${ts[*]}" $((rss / 1024))
  echo "$med" >"$DIR/$name.median"
}
run "flux-oracle diff" "$OR" diff -q "$DIR/A.h5" "$DIR/B.h5"
# h5diff is single-threaded; flux-oracle overlaps its HDF5 walk with data passes on the other
# cores (OpenMP). The one-thread run shows what that overlap is worth.
run "flux-oracle diff (1 thread)" env OMP_NUM_THREADS=1 "$OR" diff -q "$DIR/A.h5" "$DIR/B.h5"
run "h5diff -p 1e-4" h5diff -p 1e-4 "$DIR/A.h5" "$DIR/B.h5"
run "flux-oracle stats (A only)" "$OR" stats -q "$DIR/A.h5"
o=$(cat "$DIR/flux-oracle diff.median"); o1=$(cat "$DIR/flux-oracle diff (1 thread).median")
h=$(cat "$DIR/h5diff -p 1e-4.median")
awk -v o="$o" -v o1="$o1" -v h="$h" -v c="$(nproc)" 'BEGIN {
  printf "speed-up: %.1fx with %d threads (target >= 10x), %.1fx with 1 thread\n", h / o, c, h / o1 }'
"$OR" diff -q "$DIR/A.h5" "$DIR/B.h5" || true
