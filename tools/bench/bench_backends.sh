#!/usr/bin/env bash
# make bench: a parallel run's per-step time under --tp 2 on the CPU backend and on cpu-strict
# (the test backend whose memory the host cannot touch: every collective staged through host
# buffers, every recorder download a real copy). Same shapes as bench_forward: FLUX.1-dev width,
# 1 double + 1 single block, 1024 image + 512 text tokens, fp32, synthetic weights; 2 ranks, 1
# thread each. Runs alternate between the backends; medians of the per-step times flux-sim
# prints. Usage: tools/bench/bench_backends.sh [REPS] [extra flux-sim options, e.g. --check]
set -eu
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
reps=${1:-3}; shift || true
declare -A times
for r in $(seq "$reps"); do
  for be in cpu cpu-strict; do
    t=$(mpirun -np 2 build/flux-sim --backend $be --config tools/bench/bench-flux-dev-1+1.json --tp 2 --grid 32x32 \
          --txt-len 512 --steps 2 "$@" </dev/null 2>&1 | sed -n 's/.*sampled in [0-9.]* s (\([0-9.]*\) s\/step).*/\1/p')
    [ -n "$t" ] || { echo "bench_backends: the $be run failed" >&2; exit 1; }
    times[$be]="${times[$be]:-} $t"
  done
done
med() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
c=$(echo "${times[cpu]}" | med); s=$(echo "${times[cpu-strict]}" | med)
echo "bench_backends: --tp 2, FLUX.1-dev width 1+1 blocks, 1024+512 tokens, fp32, $reps runs each (medians of s/step)"
echo "  cpu          ${c} s/step   (runs:${times[cpu]})"
echo "  cpu-strict   ${s} s/step   (runs:${times[cpu-strict]})"
awk -v c="$c" -v s="$s" 'BEGIN {printf "  cpu-strict / cpu  %.3f\n", s / c}'
