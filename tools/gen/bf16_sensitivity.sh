#!/usr/bin/env bash
# What the bf16 verdict can and cannot see (docs/bf16.md): weight bugs of decreasing size planted in
# a copy of the reference checkpoint, each run in bf16 by flux-sim and judged by the documented
# recipe `flux-oracle diff BUG.h5 SIM_BF16.h5 --truth SIM_FP64_MATCHED.h5`, where the clean bf16
# run is the baseline. Prints, per case, where the verdict stops (or PASS: the bug is below the
# bf16 noise floor). A measurement, not a test. Usage: tools/gen/bf16_sensitivity.sh [tiny|odd]
set -eu
cd "$(dirname "$0")/../.."
c=${1:-tiny}
ref=${FLUX_REFERENCE_DIR:-../shared/reference}
T=$(mktemp -d /tmp/fluxsim-sens-XXXXXX)
W=$ref/$c/weights.safetensors RUN=$ref/$c/dump_bf16.h5
build/flux-sim --weights "$W" --inputs "$RUN" --precision bf16 --dump "$T/sim.h5" -q
build/flux-sim --weights "$W" --inputs "$RUN" --precision fp64 --match bf16 --dump "$T/truth.h5" -q
# case: tensor | how | size. "elem R C F": element (R, C) times F; "head H F": rows of head H
# (head_dim from the config) times F; "all F": the whole tensor times F.
CASES=(
  "transformer_blocks.0.attn.to_q.weight|elem 3 5|2" "transformer_blocks.0.attn.to_q.weight|elem 3 5|1.5"
  "transformer_blocks.0.attn.to_q.weight|elem 3 5|1.25" "transformer_blocks.0.attn.to_q.weight|elem 3 5|1.1"
  "transformer_blocks.0.ff.net.2.weight|elem 7 100|2" "transformer_blocks.0.ff.net.2.weight|elem 7 100|1.5"
  "single_transformer_blocks.0.proj_out.weight|elem 11 200|2"
  "transformer_blocks.0.attn.to_q.weight|head 1|1.10" "transformer_blocks.0.attn.to_q.weight|head 1|1.05"
  "transformer_blocks.0.attn.to_q.weight|head 1|1.02" "transformer_blocks.0.attn.to_q.weight|head 1|1.01"
  "transformer_blocks.0.attn.to_v.weight|head 0|1.05" "transformer_blocks.0.attn.to_v.weight|head 0|1.02"
  "single_transformer_blocks.1.proj_mlp.weight|all|1.02" "single_transformer_blocks.1.proj_mlp.weight|all|1.01"
)
printf "%-45s %-12s %-6s %s\n" "tensor" "bug" "factor" "verdict (first divergence)"
for cs in "${CASES[@]}"; do
  IFS='|' read -r name how f <<<"$cs"
  /usr/bin/python3 - "$W" "$T/bug.safetensors" "$name" "$how" "$f" "$ref/$c/config.json" <<'PY'
import json, struct, sys
import numpy as np
src, dst, name, how, f, cfgp = sys.argv[1:7]
f = float(f); cfg = json.load(open(cfgp)); hd = cfg["attention_head_dim"]
b = bytearray(open(src, "rb").read()); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
e = h[name]; o0, o1 = e["data_offsets"]; a = np.frombuffer(b[8 + n + o0:8 + n + o1], dtype="<f4").reshape(e["shape"]).copy()
k = how.split()
if k[0] == "elem": a[int(k[1]), int(k[2])] *= f
elif k[0] == "head": a[int(k[1]) * hd:(int(k[1]) + 1) * hd, :] *= f
else: a *= f
b[8 + n + o0:8 + n + o1] = a.astype("<f4").tobytes()
open(dst, "wb").write(b)
PY
  build/flux-sim --weights "$T/bug.safetensors" --inputs "$RUN" --precision bf16 --dump "$T/bug.h5" -q
  out=$(build/flux-oracle diff "$T/bug.h5" "$T/sim.h5" --truth "$T/truth.h5" -q 2>&1 || true)
  v=$(sed -E 's/^(DIVERGE at step [0-9]+ [^:]*): out of tolerance: ([^;]*);.*/\1 (\2)/; s/^(PASS).*/\1: below the bf16 noise floor/' <<<"$out")
  printf "%-45s %-12s %-6s %s\n" "${name%.weight}" "$how" "$f" "$v"
done
rm -rf "$T"
