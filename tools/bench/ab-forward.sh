#!/usr/bin/env bash
# tools/bench/ab-forward.sh COMMIT [REPS]: the bench forward (FLUX.1-dev width, 1 double + 1 single
# block, 1024 + 512 tokens, fp32) of COMMIT against this tree's, alternated in one process with
# the sgemm pass, at 1 and 2 threads (tools/bench/ab_forward.c). COMMIT's model code (fs_model.c, or fs_layers.c + fs_flux1.c) and CPU
# backend (fs_backend_cpu.c + fs_kernels_cpu.inc) are compiled against this tree's headers with
# their exported names renamed old_*, and linked with this tree's build/libfluxsim.a (`make`
# first). So COMMIT must be close enough for that to compile (the same fs_model / fs_backend
# interfaces). How docs/performance.md's before/after figures were measured.
set -eu
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: tools/bench/ab-forward.sh COMMIT [REPS]" >&2; exit 2; }
c=$1 reps=${2:-5}
T=$(mktemp -d /tmp/fluxsim-ab-XXXXXX)
mkdir -p "$T/old"
# COMMIT's forward and CPU kernels, at whichever layout of sim/ it has: flat (before 2026-11-27),
# layer folders, and from 0c563bd on the kernels compiled once per dtype (fs_kernels_cpu_f32.c,
# _f64.c). The quoted includes look beside each file first, so COMMIT's own .inc/.h are used.
old() { git show "$c:sim/$1" 2>/dev/null || git show "$c:sim/$2/$1" 2>/dev/null; }
srcs=()
for p in "fs_model.c model" "fs_layers.c model" "fs_flux1.c model" "fs_layers.h model" "fs_backend_cpu.c backend" "fs_kernels_cpu.inc backend" "fs_kernels_cpu.h backend" \
         "fs_kernels_cpu_f32.c backend" "fs_kernels_cpu_f64.c backend"; do
  set -- $p
  if old "$1" "$2" >"$T/old/$1"; then [ "${1##*.}" = c ] && srcs+=("$1"); else rm -f "$T/old/$1"; fi
done
INC="-I$T/old -Isim/base -Isim/backend -Isim/parallel -Isim/weights -Isim/model -Isim/run -Ioracle"
CF="-O2 -g -march=x86-64-v2 -fopenmp -std=c11 -D_GNU_SOURCE $INC $(pkg-config --cflags openblas hdf5-openmpi libcjson)"
objs=()
for f in "${srcs[@]}"; do mpicc $CF -c "$T/old/$f" -o "$T/old/${f%.c}.o"; objs+=("$T/old/${f%.c}.o"); done
# every global COMMIT's objects define gets an old_ name (the entry points ab_forward.c calls by
# the names below), so they link beside this tree's library without clashing
nm --defined-only -g "${objs[@]}" | awk 'NF == 3 {print $3}' | sort -u | while read -r s; do
  case $s in
    fs_model_forward) echo "$s old_model_forward" ;; fs_time_proj) echo "$s old_time_proj" ;;
    fs_pos_embed) echo "$s old_pos_embed" ;; fs_bf16_embedded) echo "$s old_bf16_embedded" ;;
    fs_backend_cpu) echo "$s old_backend_cpu" ;; fs_backend_cpu_kernels) echo "$s old_backend_cpu_kernels" ;;
    fs_backend_cpu_set_threads) echo "$s old_backend_cpu_set_threads" ;; fs_lse_layout_name) echo "$s old_lse_layout_name" ;;
    *) echo "$s old_$s" ;;
  esac
done >"$T/renames"
for o in "${objs[@]}"; do objcopy --redefine-syms="$T/renames" "$o"; done
mpicc $CF tools/bench/ab_forward.c "${objs[@]}" build/libfluxsim.a -o "$T/ab_forward" \
  $(pkg-config --libs openblas hdf5-openmpi libcjson) -fopenmp -lm
echo "ab_forward: $(git rev-parse --short "$c") against this tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- sim || echo ', modified')), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$T/ab_forward" "$reps" "$(git rev-parse --short "$c")"
rm -rf "$T"
