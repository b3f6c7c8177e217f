#!/usr/bin/env bash
# make bench: benchmarks, not tests. Figures go to docs/performance.md by hand, with this command.
set -eu
cd "$(dirname "$0")/../.."
# 1 and 2 threads in one process (the same weights): OpenBLAS and OpenMP set together
# (fs_backend_cpu_set_threads); BENCH_THREADS overrides the list, e.g. BENCH_THREADS=2.
echo "== CPU: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); bf16 ISA: $(grep -o -w -m1 'amx_bf16' /proc/cpuinfo || grep -o -w -m1 'avx512_bf16' /proc/cpuinfo || echo none); load $(cut -d' ' -f1-3 /proc/loadavg) =="
# the bf16 forward and the bf16 gemm op on the Linear shapes (oneDNN where the CPU has bf16 dot
# products: the header line names the path, oneDNN's ISA and kernel) at each thread count
echo "== bench_forward: fp32 forward vs sgemm, bf16 forward and bf16 gemm, threads ${BENCH_THREADS:-1,2} =="
build/bench_forward --reps 3 --threads "${BENCH_THREADS:-1,2}" --bf16 "$@"
echo
# FLUX.2 [dev] width, 1 double + 1 single block (8.7 GiB of fp32 weights, ~10 GiB peak), 64 + 64
# tokens: its modulations alone are 15·D² = 566 M parameters, GEMVs at M = 1
echo "== bench_forward --model flux2-dev: FLUX.2-dev width, fp32 forward vs sgemm, threads ${BENCH_THREADS:-1,2} =="
build/bench_forward --model flux2-dev --small --reps 3 --threads "${BENCH_THREADS:-1,2}"
echo
# issue 22's peer: the real diffusers FluxTransformer2DModel on torch 2.x (tools/install-peer.sh's venv),
# fp32 and bf16, 1 and 2 threads, alternated with bench_forward; issue 13's torch 1.13 peer where there is
# no venv
if .venv-peer/bin/python -c 'import torch, diffusers' 2>/dev/null; then
  echo "== bench-diffusers-peer: flux-sim vs diffusers on torch 2.x, fp32 and bf16, threads ${BENCH_THREADS:-1,2} =="
  THREADS=$(echo "${BENCH_THREADS:-1,2}" | tr , ' ') tools/bench/bench-diffusers-peer.sh 1
elif /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "== bench-peer: no .venv-peer (tools/install-peer.sh); flux-sim vs the torch 1.13 peer, fp32, 1 thread =="
  tools/bench/bench-peer.sh 1 --native-kernels
else
  echo "== bench-peer: skipped (no .venv-peer and no python3-torch; tools/install-deps.sh installs them) =="
fi
echo
echo "== bench_backends: --tp 2 per-step time, cpu vs cpu-strict =="
tools/bench/bench_backends.sh 3
echo
echo "== bench_oracle: flux-oracle diff vs h5diff on >= 200 MB dumps =="
tools/bench/bench_oracle.sh
echo
echo "== bench_synth: synthetic-weight generation, old libm path vs the vector path, 1 and 2 threads =="
build/bench_synth --e2e
