#!/usr/bin/env bash
# Weight streaming (--stream on: each block's parameters made before the block, freed after) is
# a memory layout, not a numerical change: every dump must be bit-identical (h5diff, no
# tolerance) to the same run holding every parameter (--stream off), for
#   * both diffusers reference configs (F32 checkpoints: views in fp32, decoded shards in bf16,
#     bf16-made-then-promoted with --precision fp64 --match bf16), single rank and every kind of
#     layout (tp, ulysses, ring, tp x ring), with --check in the job (rank 0 holds the full model,
#     then remakes its shard; in bf16 also the matched fp64 truth);
#   * synthetic weights, where streaming regenerates each block every step;
#   * fused-qkv-contiguous, which needs every rank's full q|k|v and so never streams.
# And it holds less: the peak of weights held is at most the top-level parameters plus one
# block (checked against the unstreamed peak), and --stream auto leaves small models resident.
. "$(dirname "$0")/lib.sh"
ref=${FLUX_REFERENCE_DIR:-../shared/reference}
tmpdir stream

# same <tag> <np> <flux-sim args...>: the run with --stream on and off; dumps bit-identical
same() {
  local tag=$1 np=$2; shift 2
  local rc_on rc_off
  timeout 600 mpirun -np "$np" "$SIM" "$@" --stream on --dump "$T/on.h5" >"$T/on.log" 2>&1 </dev/null; rc_on=$?
  timeout 600 mpirun -np "$np" "$SIM" "$@" --stream off --dump "$T/off.h5" >"$T/off.log" 2>&1 </dev/null; rc_off=$?
  if [ $rc_on -ne 0 ] || [ $rc_off -ne 0 ]; then
    bad "$tag: exit $rc_on (streamed) / $rc_off (resident)"; tail -n 3 "$T/on.log" "$T/off.log"; return
  fi
  if ! grep -q "streamed block by block" "$T/on.log" || ! grep -q "every parameter resident" "$T/off.log"; then
    bad "$tag: the runs do not say how they held the weights"; return
  fi
  if h5diff -q "$T/on.h5" "$T/off.h5" >/dev/null 2>&1; then
    ok "$tag: streamed dump bit-identical to resident ($(grep -o 'weights held: [0-9.]* MiB' "$T/on.log" | cut -d' ' -f3) vs $(grep -o 'weights held: [0-9.]* MiB' "$T/off.log" | cut -d' ' -f3) MiB)"
  else
    bad "$tag: streamed and resident dumps differ"; h5diff -r "$T/on.h5" "$T/off.h5" 2>&1 | head -5
  fi
}

if [ -d "$ref/tiny" ]; then
  for cfg in tiny odd; do
    W="--weights $ref/$cfg/weights.safetensors --inputs $ref/$cfg/dump_fp64.h5"
    same "$cfg fp32 1 rank" 1 $W --precision fp32
    same "$cfg bf16 1 rank" 1 --weights "$ref/$cfg/weights.safetensors" --inputs "$ref/$cfg/dump_bf16.h5" --precision bf16
    same "$cfg fp64 --match bf16 1 rank" 1 $W --precision fp64 --match bf16
    same "$cfg fp32 --tp 2 --check" 2 $W --precision fp32 --tp 2 --check
    same "$cfg bf16 --tp 2 --check (with the matched truth)" 2 --weights "$ref/$cfg/weights.safetensors" \
      --inputs "$ref/$cfg/dump_bf16.h5" --precision bf16 --tp 2 --check
    same "$cfg fp32 --ulysses 2 --check" 2 $W --ulysses 2 --check
    same "$cfg fp32 --ring 2 --check" 2 $W --ring 2 --check
    same "$cfg fp64 --tp 2 --ring 2 --check" 4 $W --precision fp64 --tp 2 --ring 2 --check
  done
else
  skip "streaming on the reference checkpoints: $ref not found — these did NOT run"
fi
same "synthetic default config, 2 steps" 1 --steps 2 --grid 4x4
same "synthetic --tp 4 --check" 4 --steps 2 --grid 4x4 --tp 4 --check
same "synthetic bf16 --tp 2 --check" 2 --steps 2 --grid 4x4 --precision bf16 --tp 2 --check

# fused-qkv-contiguous: never streamed, same divergence either way
timeout 300 mpirun -np 2 "$SIM" --steps 1 --grid 4x4 --tp 2 --check --inject fused-qkv-contiguous --stream on \
  >"$T/fq.log" 2>&1 </dev/null; rc=$?
if [ $rc -eq 1 ] && grep -q "every parameter resident\|DIVERGED" "$T/fq.log" && ! grep -q "streamed block" "$T/fq.log"; then
  ok "fused-qkv-contiguous with --stream on: held resident, diverges (exit 1)"
else bad "fused-qkv-contiguous with --stream on: exit $rc"; tail -n 3 "$T/fq.log"; fi

# the peak: streamed = top-level + one block; a model of the default widths with 8 + 16 blocks
# holds 24 blocks' worth when resident
cat >"$T/deep.json" <<'JSON'
{"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 64, "out_channels": 64, "num_layers": 8,
 "num_single_layers": 16, "attention_head_dim": 32, "num_attention_heads": 8, "joint_attention_dim": 128,
 "pooled_projection_dim": 64, "guidance_embeds": true, "axes_dims_rope": [8, 12, 12]}
JSON
"$SIM" --config "$T/deep.json" --steps 1 --grid 2x2 --txt-len 4 --stream on >"$T/a.log" 2>&1 </dev/null
"$SIM" --config "$T/deep.json" --steps 1 --grid 2x2 --txt-len 4 --stream off >"$T/b.log" 2>&1 </dev/null
a=$(grep -o 'weights held: [0-9.]*' "$T/a.log" | cut -d' ' -f3); b=$(grep -o 'weights held: [0-9.]*' "$T/b.log" | cut -d' ' -f3)
if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { exit !(a > 0 && a * 6 < b) }'; then
  ok "weights held: $a MiB streamed, $b MiB resident (8 + 16 blocks)"
else bad "weights held: streamed '$a' vs resident '$b' MiB (8 + 16 blocks)"; tail -n 2 "$T/a.log"; fi
# auto: a small model stays resident
"$SIM" --steps 1 --grid 2x2 --txt-len 4 >"$T/c.log" 2>&1 </dev/null
if grep -q "every parameter resident" "$T/c.log"; then ok "--stream auto keeps a small model resident"
else bad "--stream auto streamed a small model"; fi
# bad value: exit 2, one line
"$SIM" --stream maybe >"$T/d.log" 2>&1; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/d.log")" -eq 1 ] && grep -q -- "--stream: 'maybe'" "$T/d.log"; then ok "--stream maybe: exit 2, one line"
else bad "--stream maybe: exit $rc: $(cat "$T/d.log")"; fi

finish
