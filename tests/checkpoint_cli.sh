#!/usr/bin/env bash
# make-checkpoint and flux-sim on what it writes: a pipeline folder, its transformer/ folder, the
# index json, a BFL single file, --config DIR, the config.json beside the weights, the
# pipeline's scheduler_config.json. Good cases exit 0 and print nothing with -q; the same weights
# give the same run whatever the layout; bad cases exit 2 with one line on stderr naming the
# culprit, and make-checkpoint leaves nothing behind.
. "$(dirname "$0")/lib.sh"
MK=${FLUX_BUILD:-build}/make-checkpoint
tmpdir ckpt
RUN="--grid 2x3 --txt-len 4 --steps 2"
good() { # name, flux-sim args...: exit 0, nothing on stderr
  local name=$1; shift
  if "$SIM" -q "$@" $RUN >"$T/out" 2>"$T/err" && [ ! -s "$T/err" ]; then ok "$name"
  else bad "$name: $(cat "$T/err")"; fi
}
err() { # name, expected substring, command...: exit 2, one stderr line holding it
  local name=$1 want=$2; shift 2
  "$@" >"$T/out" 2>"$T/err"; local rc=$?
  local lines; lines=$(wc -l <"$T/err")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" "$T/err"; then ok "$name: $(cat "$T/err")"
  else bad "$name: rc=$rc lines=$lines want '$want': $(cat "$T/err")"; fi
}
final() { # the "final latents" line of a (non-quiet) run
  "$SIM" "$@" $RUN 2>&1 | grep -o "final latents.*"
}

# ---- writing ----
$MK -q --config tiny --layout pipeline --max-shard-size 300KB --weights-seed 5 "$T/FLUX.1-tiny" || bad "make-checkpoint pipeline"
$MK -q --config tiny --layout bfl --weights-seed 5 "$T/flux1-tiny.safetensors" || bad "make-checkpoint bfl"
$MK -q --config odd --layout diffusers --dtype f32 "$T/odd-transformer" || bad "make-checkpoint diffusers f32"
n=$(ls "$T/FLUX.1-tiny/transformer" | grep -c '^diffusion_pytorch_model-000[0-9][0-9]-of-000[0-9][0-9]\.safetensors$')
if [ -f "$T/FLUX.1-tiny/model_index.json" ] && [ -f "$T/FLUX.1-tiny/scheduler/scheduler_config.json" ] && [ "$n" -gt 3 ] &&
   [ -f "$T/FLUX.1-tiny/transformer/diffusion_pytorch_model.safetensors.index.json" ]; then ok "pipeline folder layout ($n shards)"
else bad "pipeline folder layout: $(find "$T/FLUX.1-tiny" | head)"; fi

# ---- loading: every way of naming the weights runs, config from the checkpoint ----
good "--weights pipeline root" --weights "$T/FLUX.1-tiny"
good "--weights transformer folder" --weights "$T/FLUX.1-tiny/transformer"
good "--weights index json" --weights "$T/FLUX.1-tiny/transformer/diffusion_pytorch_model.safetensors.index.json"
good "--config pipeline root" --config "$T/FLUX.1-tiny" --weights "$T/FLUX.1-tiny/transformer"
good "--config transformer folder" --config "$T/FLUX.1-tiny/transformer" --weights "$T/flux1-tiny.safetensors"
good "--config config.json" --config "$T/odd-transformer/config.json" --weights "$T/odd-transformer"
good "config.json beside --weights (odd: no guidance, 8 channels)" --weights "$T/odd-transformer"
good "BFL file + --config tiny" --config tiny --weights "$T/flux1-tiny.safetensors"

# ---- the values: same weights, same run ----
a=$(final --weights "$T/odd-transformer"); b=$(final --config odd)
if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "F32 checkpoint runs exactly as the synthetic weights ($a)"
else bad "F32 checkpoint vs synthetic: '$a' vs '$b'"; fi
a=$(final --weights "$T/FLUX.1-tiny"); b=$(final --config tiny --weights "$T/flux1-tiny.safetensors")
c=$(final --config tiny --weights-seed 5)
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ]; then ok "BF16 pipeline folder = BF16 BFL file (!= unrounded synthetic)"
else bad "BF16 layouts: '$a' / '$b' / unrounded '$c'"; fi

# ---- scheduler_config.json of the pipeline is what the run uses ----
cp -r "$T/FLUX.1-tiny" "$T/static"
cat >"$T/static/scheduler/scheduler_config.json" <<'EOF'
{"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 1.0, "use_dynamic_shifting": false}
EOF
a=$(final --weights "$T/static"); b=$(final --weights "$T/FLUX.1-tiny" --scheduler schnell)
c=$(final --weights "$T/FLUX.1-tiny")
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ]; then ok "scheduler_config.json read (static shift 1 = --scheduler schnell)"
else bad "scheduler_config.json: '$a' / schnell '$b' / dev '$c'"; fi
a=$(final --weights "$T/static" --scheduler dev)
if [ "$a" = "$c" ]; then ok "--scheduler overrides scheduler_config.json"; else bad "--scheduler override: '$a' vs '$c'"; fi

# ---- --verify reads a checkpoint back against the synthetic weights ----
if "$MK" -q --config tiny --weights-seed 5 --verify "$T/FLUX.1-tiny" && "$MK" -q --config tiny --weights-seed 5 --verify "$T/flux1-tiny.safetensors" &&
   "$MK" -q --config odd --dtype f32 --verify "$T/odd-transformer"; then
  ok "--verify: the three checkpoints hold exactly the synthetic weights"
else bad "--verify of fresh checkpoints"; fi
cp -r "$T/odd-transformer" "$T/flipped"
$PY - "$T/flipped/diffusion_pytorch_model.safetensors" <<'PY'
import struct, sys
p = sys.argv[1]; f = open(p, "r+b"); n = struct.unpack("<Q", f.read(8))[0]
f.seek(8 + n + 1000); b = f.read(1); f.seek(8 + n + 1000); f.write(bytes([b[0] ^ 1])); f.close()
PY
"$MK" -q --config odd --dtype f32 --verify "$T/flipped" 2>"$T/err"; rc=$?
if [ $rc -eq 1 ] && grep -q "1 tensor differs" "$T/err"; then ok "--verify finds one flipped bit: $(cat "$T/err")"
else bad "--verify of a flipped bit: rc=$rc $(cat "$T/err")"; fi

# ---- bad cases: one line, exit 2 ----
mkdir -p "$T/empty"
err "--config dir without config" "neither config.json nor transformer/config.json" "$SIM" -q --config "$T/empty" $RUN
err "--config dir (scheduler/)" "scheduler: directory holds neither" "$SIM" -q --config "$T/FLUX.1-tiny/scheduler" $RUN
cp -r "$T/FLUX.1-tiny" "$T/karras"
echo '{"_class_name": "FlowMatchEulerDiscreteScheduler", "use_karras_sigmas": true}' >"$T/karras/scheduler/scheduler_config.json"
err "unsupported scheduler option" "use_karras_sigmas" "$SIM" -q --weights "$T/karras" $RUN
cp -r "$T/odd-transformer" "$T/badcfg"
echo '{"in_channels": 8,' >"$T/badcfg/config.json"
err "malformed config.json beside weights" "badcfg/config.json: malformed JSON" "$SIM" -q --weights "$T/badcfg" $RUN
mkdir -p "$T/noweights/transformer"
err "pipeline root without weights" "holds no *.safetensors" "$SIM" -q --config tiny --weights "$T/noweights" $RUN
cp -r "$T/FLUX.1-tiny" "$T/sd3"
echo '{"_class_name": "StableDiffusion3Pipeline", "transformer": ["diffusers", "SD3Transformer2DModel"]}' >"$T/sd3/model_index.json"
err "model_index.json of another pipeline" "SD3Transformer2DModel" "$SIM" -q --weights "$T/sd3" $RUN
err "missing weights path" "/nonexistent/ckpt" "$SIM" -q --weights /nonexistent/ckpt $RUN
err "BFL file with the wrong config" "img_in.weight" "$SIM" -q --config odd --weights "$T/flux1-tiny.safetensors" $RUN
"$SIM" -q --config tiny $RUN --dump "$T/tiny.h5" || bad "dump for --inputs"
err "--inputs vs config.json beside --weights" "odd-transformer/config.json (beside --weights) differs" \
  "$SIM" -q --inputs "$T/tiny.h5" --weights "$T/odd-transformer"

# ---- make-checkpoint errors leave nothing behind ----
err "make-checkpoint: output exists" "already exists" "$MK" -q --config tiny "$T/odd-transformer"
err "make-checkpoint: bad dtype" "--dtype: 'q8'" "$MK" -q --dtype q8 "$T/x1"
err "make-checkpoint: bad shard size" "--max-shard-size: '0'" "$MK" -q --max-shard-size 0 "$T/x2"
err "make-checkpoint: no output" "no output path" "$MK" -q --config tiny
err "make-checkpoint: bad config" "cannot open config" "$MK" -q --config "$T/nope.json" "$T/x3"
err "make-checkpoint: prefix without bfl" "--bfl-prefix needs --layout bfl" "$MK" -q --bfl-prefix "$T/x4"
left=$(ls "$T" | grep -cE '^x[0-9]|tmp-' || true)
if [ "$left" -eq 0 ]; then ok "nothing left by the failed make-checkpoint runs"; else bad "left behind: $(ls "$T")"; fi

finish
