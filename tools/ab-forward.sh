#!/usr/bin/env bash
# tools/ab-forward.sh COMMIT [REPS]: the bench forward (FLUX.1-dev width, 1 double + 1 single
# block, 1024 + 512 tokens, fp32) of COMMIT against this tree's, alternated in one process with
# the sgemm pass, at 1 and 2 threads (tools/ab_forward.c). COMMIT's sim/model/fs_model.c and CPU
# backend (fs_backend_cpu.c + fs_kernels_cpu.inc) are compiled against this tree's headers with
# their exported names renamed old_*, and linked with this tree's build/libfluxsim.a (`make`
# first). So COMMIT must be close enough for that to compile (the same fs_model / fs_backend
# interfaces). How docs/performance.md's before/after figures were measured.
set -eu
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: tools/ab-forward.sh COMMIT [REPS]" >&2; exit 2; }
c=$1 reps=${2:-5}
T=$(mktemp -d /tmp/fluxsim-ab-XXXXXX)
mkdir -p "$T/sim"
# the files at either layout of sim/ (flat before 2026-11-27, in layer folders after)
old() { git show "$c:sim/$1" 2>/dev/null || git show "$c:sim/$2/$1"; }
for p in "fs_model.c model" "fs_backend_cpu.c backend" "fs_kernels_cpu.inc backend"; do set -- $p; old "$1" "$2" >"$T/sim/$1"; done
INC="-Isim/base -Isim/backend -Isim/parallel -Isim/weights -Isim/model -Isim/run -Ioracle"
CF="-O2 -g -march=x86-64-v2 -fopenmp -std=c11 -D_GNU_SOURCE $INC $(pkg-config --cflags openblas hdf5-openmpi libcjson)"
mpicc $CF -c "$T/sim/model/fs_model.c" -o "$T/model.o"
mpicc $CF -c "$T/sim/backend/fs_backend_cpu.c" -o "$T/backend.o" # its own fs_kernels_cpu.inc: the quoted include looks beside it first
objcopy --redefine-sym fs_model_forward=old_model_forward --redefine-sym fs_time_proj=old_time_proj \
  --redefine-sym fs_pos_embed=old_pos_embed --redefine-sym fs_bf16_embedded=old_bf16_embedded "$T/model.o"
objcopy --redefine-sym fs_backend_cpu=old_backend_cpu --redefine-sym fs_backend_cpu_kernels=old_backend_cpu_kernels \
  --redefine-sym fs_backend_cpu_set_threads=old_backend_cpu_set_threads \
  --redefine-sym fs_lse_layout_name=old_lse_layout_name "$T/backend.o"
mpicc $CF tools/ab_forward.c "$T/model.o" "$T/backend.o" build/libfluxsim.a -o "$T/ab_forward" \
  $(pkg-config --libs openblas hdf5-openmpi libcjson) -fopenmp -lm
echo "ab_forward: $(git rev-parse --short "$c") against this tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- sim || echo ', modified')), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$T/ab_forward" "$reps" "$(git rev-parse --short "$c")"
rm -rf "$T"
