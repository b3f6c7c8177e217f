#!/usr/bin/env bash
# gpu-pack.sh — everything a lent GPU machine needs for the GPU check, under the device tool's
# 64 MiB (repository + carried files): the bundle (tools/gpu/gpu-bundle.sh) and the reference subset
# gpu-check.sh reads (tiny and odd: weights.safetensors, dump_fp64.h5, config.json), each as
# .tar.xz in build/gpu-pack/. The weights are random floats and do not compress (28 MB of 30);
# the bundle does (44 MB -> 7 MB).
#
#   make GPU=cuda gpu-pack      (= GPU=cuda tools/gpu/gpu-pack.sh)
# then, on the GPU machine, with build/gpu-pack carried:
#   bash tools/gpu/gpu-device-run.sh      # unpack, nvidia-smi, gpu-check.sh, compute-sanitizer
# Refuses (exit 1) when the repository plus the pack would exceed LIMIT_MIB (60).
set -euo pipefail
cd "$(dirname "$0")/../.."
GPU=${GPU:-cuda}
REF=${FLUX_REFERENCE_DIR:-../shared/reference}
P=build/gpu-pack
LIMIT_MIB=${LIMIT_MIB:-60}
for c in tiny odd; do
  for f in weights.safetensors dump_fp64.h5 config.json; do
    [ -f "$REF/$c/$f" ] || { echo "gpu-pack: error: $REF/$c/$f not found (set FLUX_REFERENCE_DIR)" >&2; exit 2; }
  done
done
GPU=$GPU tools/gpu/gpu-bundle.sh build/bundle
rm -rf "$P" "$P.tmp"; mkdir -p "$P.tmp/ref"
tar -C build -cf - bundle | xz -T0 -6 >"$P.tmp/bundle.tar.xz"
for c in tiny odd; do
  mkdir -p "$P.tmp/ref/$c"
  cp "$REF/$c/weights.safetensors" "$REF/$c/dump_fp64.h5" "$REF/$c/config.json" "$P.tmp/ref/$c/"
done
tar -C "$P.tmp" -cf - ref | xz -T0 -1 >"$P.tmp/ref.tar.xz"
rm -rf "$P.tmp/ref"; mv "$P.tmp" "$P"
# what travels: tracked + untracked-not-ignored files, plus the carried pack
tree_b=$(git ls-files -co --exclude-standard -z | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s+=$1} END {print s+0}')
pack_b=$(du -sb "$P" | cut -f1)
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "gpu-pack: $P: bundle $(mib "$(stat -c %s "$P/bundle.tar.xz")") MiB + reference $(mib "$(stat -c %s "$P/ref.tar.xz")") MiB; working tree $(mib "$tree_b") MiB; total $(mib $((tree_b + pack_b))) MiB of $LIMIT_MIB"
if [ $((tree_b + pack_b)) -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "gpu-pack: error: over $LIMIT_MIB MiB: the device tool would refuse it" >&2; exit 1
fi
echo "  device: run(command='bash tools/gpu/gpu-device-run.sh', carry=['$P'], timeout_s=420)"
