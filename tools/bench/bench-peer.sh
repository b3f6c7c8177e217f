#!/usr/bin/env bash
# tools/bench/bench-peer.sh [K] [PEER_FLAG...]: flux-sim's fp32 forward against issue 13's PyTorch peer
# (tools/bench/bench_torch_peer.py: FluxTransformer2DModel as diffusers writes it, torch 1.13 CPU), both
# at bench_forward's config (FLUX.1-dev width, 1 double + 1 single block, 1024 + 512 tokens) on
# 1 thread. The machine is shared and its load drifts, so the two alternate K times (default 3),
# one fresh process each per round, and the ratio torch/flux-sim (> 1: flux-sim faster) is given
# of the medians and round by round. Each side runs one warm-up and REPS (default 3) timed
# forwards per round and reports its median (a single timed forward is at the mercy of the load;
# before bench_forward got its second warm-up, its first timed forward was also 10 % slow). A bench_forward round also runs the sgemm pass and a
# block-timed forward per rep; only its plain forward counts. PEER_FLAGs go to the peer, e.g. --native-kernels (OpenBLAS's own kernel choice, as
# flux-sim gets; see bench_torch_peer.py --help). `make` first; BENCH_FORWARD names another binary,
# REPS the timed forwards per round and side.
set -eu
cd "$(dirname "$0")/../.."
k=${1:-3}
[ $# -gt 0 ] && shift
case $k in '' | *[!0-9]* | 0) echo "usage: tools/bench/bench-peer.sh [K >= 1] [PEER_FLAG...]" >&2; exit 2 ;; esac
bf=${BENCH_FORWARD:-build/bench_forward}
reps=${REPS:-3}
case $reps in '' | *[!0-9]* | 0) echo "bench-peer.sh: REPS must be >= 1" >&2; exit 2 ;; esac
[ -x "$bf" ] || { echo "bench-peer.sh: $bf missing (run make first)" >&2; exit 2; }
# belt and braces: both tools also set their thread counts themselves (--threads 1)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
T=$(mktemp -d /tmp/fluxsim-peer-XXXXXX)
trap 'rm -rf "$T"' EXIT
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
echo "bench-peer: $k rounds of $reps forwards each side, 1 thread, load $(cut -d' ' -f1-3 /proc/loadavg); flux-sim OpenBLAS kernels:" \
  "${OPENBLAS_CORETYPE:-its own choice}"
for r in $(seq "$k"); do
  # the peer first: a bad PEER_FLAG fails before minutes of bench_forward
  /usr/bin/python3 tools/bench/bench_torch_peer.py --reps "$reps" --threads 1 "$@" >"$T/pt.out" ||
    { tail -n 3 "$T/pt.out" >&2; exit 2; }
  "$bf" --reps "$reps" --threads 1 >"$T/fs.out" || { tail -n 3 "$T/fs.out" >&2; exit 2; }
  [ "$r" = 1 ] && grep -m1 '^  threads:' "$T/pt.out" | sed 's/^  /peer /'
  pt=$(awk '$1 == "torch_peer_median_s" {print $2}' "$T/pt.out")
  fs=$(awk '$1 == "flux-sim" && $2 == "forward" {print $3}' "$T/fs.out") # not "forward," (bf16)
  if [ -z "$pt" ] || [ -z "$fs" ]; then # keep the outputs to look at
    echo "bench-peer.sh: round $r: no time in an output (kept in $T)" >&2
    trap - EXIT
    exit 2
  fi
  echo "$pt" >>"$T/pt"
  echo "$fs" >>"$T/fs"
  awk -v r="$r" -v f="$fs" -v p="$pt" 'BEGIN {printf "round %d: flux-sim %8.3f s  torch %8.3f s  torch/flux-sim %.3f\n", r, f, p, p / f}' |
    tee -a "$T/rounds"
done
mf=$(median <"$T/fs") mp=$(median <"$T/pt")
mr=$(awk '{print $NF}' "$T/rounds" | median)
awk -v f="$mf" -v p="$mp" -v m="$mr" 'BEGIN {
  printf "medians: flux-sim %.3f s  torch %.3f s  torch/flux-sim %.3f (of the medians), %.3f (median of the rounds)\n", f, p, p / f, m }'
