#!/usr/bin/env bash
# tools/bench/bench-diffusers-peer.sh [K]: flux-sim's forward against issue 22's peer, the real diffusers
# FluxTransformer2DModel on PyTorch 2.x (tools/bench/bench_diffusers_peer.py in the peer venv that
# tools/install-peer.sh builds: torch 2.15.0 + diffusers 0.42.1), in fp32 and bf16, at 1 and 2 threads
# (THREADS overrides the list), same config on both sides (FLUX.1-dev width, 1 double + 1 single block,
# 1024 image + 512 text tokens, synthetic weights).
#
# The machine is shared and its load drifts, so the two sides alternate: per round and thread count,
# the peer in fp32, the peer in bf16, then build/bench_forward --bf16 (its plain fp32 forward and its
# bf16 forward), each a fresh process with a warm-up and REPS (default 3) timed forwards, medians.
# K rounds (default 1); the ratio torch/flux-sim (> 1: flux-sim faster) is printed round by round and
# of the medians. Every figure is printed with the CPU model, the ISA each side picked (flux-sim: the
# GEMM providers; torch: its ATen CPU capability) and the load. Exit 2 when the venv or a time is missing.
set -eu
cd "$(dirname "$0")/../.."
k=${1:-1}
case $k in '' | *[!0-9]* | 0) echo "usage: tools/bench/bench-diffusers-peer.sh [K >= 1]" >&2; exit 2 ;; esac
py=${PEER_PYTHON:-.venv-peer/bin/python}
bf=${BENCH_FORWARD:-build/bench_forward}
reps=${REPS:-3}
threads=${THREADS:-1 2}
[ -x "$bf" ] || { echo "bench-diffusers-peer.sh: $bf missing (run make first)" >&2; exit 2; }
"$py" -c 'import torch, diffusers' 2>/dev/null ||
  { echo "bench-diffusers-peer.sh: $py has no torch + diffusers (tools/install-peer.sh builds .venv-peer)" >&2; exit 2; }
T=$(mktemp -d /tmp/fluxsim-dpeer-XXXXXX)
trap 'rm -rf "$T"' EXIT
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
echo "bench-diffusers-peer: CPU $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //') ($(grep -o -w -m1 'amx_bf16' /proc/cpuinfo || grep -o -w -m1 'avx512_bf16' /proc/cpuinfo || grep -o -w -m1 'avx2' /proc/cpuinfo || echo 'no AVX2')), $(nproc) cores;" \
  "$k round(s), $reps timed forwards per side, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$k"); do
  for t in $threads; do
    for d in fp32 bf16; do
      OMP_NUM_THREADS=$t "$py" tools/bench/bench_diffusers_peer.py --dtype $d --threads "$t" --reps "$reps" >"$T/pt.$d" 2>"$T/pt.err" ||
        { tail -n 3 "$T/pt.err" >&2; exit 2; }
    done
    OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t "$bf" --reps "$reps" --threads "$t" --bf16 >"$T/fs.out" 2>&1 ||
      { tail -n 3 "$T/fs.out" >&2; exit 2; }
    if [ "$r" = 1 ]; then
      sed -n 's/^  threads: /  torch:    /p' "$T/pt.fp32" | head -n 1
      sed -n 's/^  OpenBLAS core /  flux-sim: OpenBLAS core /p' "$T/fs.out" | head -n 1
    fi
    p32=$(awk '$1 == "diffusers_peer_median_s" {print $2}' "$T/pt.fp32")
    p16=$(awk '$1 == "diffusers_peer_median_s" {print $2}' "$T/pt.bf16")
    f32=$(awk '$1 == "flux-sim" && $2 == "forward" {print $3}' "$T/fs.out")
    f16=$(awk '$1 == "flux-sim" && $2 == "forward," && $3 == "bf16" {print $4}' "$T/fs.out")
    for v in p32 p16 f32 f16; do
      [ -n "${!v}" ] || { echo "bench-diffusers-peer.sh: round $r, $t thread(s): no time for $v (outputs kept in $T)" >&2; trap - EXIT; exit 2; }
    done
    echo "$p32 $p16 $f32 $f16" >>"$T/t$t"
    awk -v r="$r" -v t="$t" -v a="$p32" -v b="$p16" -v c="$f32" -v d="$f16" -v l="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN {
      printf "round %d, %d thread(s), load %s: fp32 flux-sim %7.3f s torch %7.3f s torch/flux-sim %.2f | bf16 flux-sim %7.3f s torch %7.3f s torch/flux-sim %.2f\n",
        r, t, l, c, a, a / c, d, b, b / d }'
  done
done
for t in $threads; do
  mp32=$(awk '{print $1}' "$T/t$t" | median) mp16=$(awk '{print $2}' "$T/t$t" | median)
  mf32=$(awk '{print $3}' "$T/t$t" | median) mf16=$(awk '{print $4}' "$T/t$t" | median)
  awk -v t="$t" -v a="$mp32" -v b="$mp16" -v c="$mf32" -v d="$mf16" 'BEGIN {
    printf "medians, %d thread(s): fp32 torch/flux-sim %.2f (flux-sim %.3f s, torch %.3f s; target >= 1.3) | bf16 torch/flux-sim %.2f (flux-sim %.3f s, torch %.3f s; target >= 1.0)\n",
      t, a / c, c, a, b / d, d, b }'
done
