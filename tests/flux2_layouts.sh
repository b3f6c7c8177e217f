#!/usr/bin/env bash
# FLUX.2 (Flux2Transformer2DModel) under the parallel layouts, and its silent bugs:
#   1. flux2-tiny (diffusers' weights and fp64 inputs, ../shared/reference/flux2-tiny: 4 heads,
#      64 image + 24 text tokens with real text positions): every layout of 2-4 ranks passes
#      --check in fp64 at 1e-13, and a parallel run's global dump matches diffusers' dump_fp64.h5
#      within the conformance bound (1e-10) — the layouts split the 4-axis ids with their tokens;
#   2. flux2-default, synthetic weights (a FLUX.2 config kept apart from the reference: 8 heads,
#      no reference dump), uneven sequences (35 image + 13 text tokens), fp32 --check;
#   3. each FLUX.2 bug re-created inside the parallel code is caught by --check at the module
#      where it lives, in fp32 and bf16: the single block's packed-row to_out sliced contiguously
#      (sglang#21664 = seed 000's TP-1), a packed column-parallel weight split as plain colwise
#      (SwiGLU pairs gate and up of other features), the timestep zeroed on ranks > 0 (every
#      block through the shared modulation), and ranks rotating with local positions (the image
#      table at pos_embed#0; FLUX.2's text positions are real, so its text table is wrong too), and
#      the text ids not split with the text (diffusers#12737: pos_embed@1, invisible on FLUX.1).
. "$(dirname "$0")/lib.sh"
SIM=${FLUX_BUILD:-build}/flux-sim OR=${FLUX_BUILD:-build}/flux-oracle
ref=${FLUX_REFERENCE_DIR:-../shared/reference}
tmpdir flux2
run() { timeout 300 mpirun -np "$1" "$SIM" "${@:2}" </dev/null; }

# 2. (no reference needed) a FLUX.2 config of our own, uneven, fp32
for L in "2|--tp 2" "2|--ulysses 2" "2|--ring 2" "3|--ring 3 --ring-rotate p2p" "4|--tp 2 --ring 2" "4|--ulysses 2 --ring 2"; do
  n=${L%%|*}; args=${L#*|}
  run "$n" --config flux2-default --grid 5x7 --txt-len 13 --steps 2 $args --check -q >"$T/log" 2>&1; rc=$?
  if [ $rc -eq 0 ] && grep -q "check: OK" "$T/log"; then ok "flux2-default fp32 uneven 35+13 tokens $args: --check OK"
  else bad "flux2-default $args: exit $rc"; tail -5 "$T/log"; fi
done
# the plan --print-plan gives for a FLUX.2 config is diffusers' Flux2 _tp_plan
if "$SIM" --config flux2-dev --print-plan | grep "to_qkv_mlp_proj *packed_colwise *D,D,D,F,F" >/dev/null; then
  ok "--config flux2-dev --print-plan prints the FLUX.2 plan (to_qkv_mlp_proj packed_colwise D,D,D,F,F)"
else bad "--print-plan after a FLUX.2 --config"; fi

# checkpoints as shipped: the HF transformer/ folder (sharded), a pipeline folder (Flux2Pipeline),
# BFL's single file (flux2-dev.safetensors names: fused qkv, linear1/linear2, .lin, shift|scale);
# all three replay bit-identically, and a TP run reads its packed rows straight from each
MC=${FLUX_BUILD:-build}/make-checkpoint
for L in diffusers pipeline bfl; do
  out=$T/ck-$L; [ $L = bfl ] && out=$T/ck-$L.safetensors
  $MC -q --config flux2-default --layout $L --dtype bf16 --max-shard-size 1MB "$out" >"$T/log" 2>&1 || { bad "make-checkpoint flux2-default --layout $L: $(tail -1 "$T/log")"; continue; }
  if $MC --config flux2-default --dtype bf16 --verify "$out" >"$T/log" 2>&1; then ok "make-checkpoint flux2-default --layout $L: written and verified"
  else bad "make-checkpoint --verify $L: $(tail -1 "$T/log")"; fi
  cf=(); [ $L = bfl ] && cf=(--config flux2-default) # a BFL single file carries no config
  run 1 --weights "$out" "${cf[@]}" --precision bf16 --grid 4x4 --txt-len 8 --steps 1 --dump "$T/ck-$L.h5" -q >"$T/log" 2>&1 || bad "run from $L checkpoint: $(tail -1 "$T/log")"
  run 2 --weights "$out" "${cf[@]}" --precision bf16 --grid 4x4 --txt-len 8 --steps 1 --tp 2 --check -q >"$T/log" 2>&1; rc=$?
  if [ $rc -eq 0 ] && grep -q "check: OK" "$T/log"; then ok "--tp 2 --check from the $L checkpoint: OK"
  else bad "--tp 2 from $L: exit $rc"; tail -3 "$T/log"; fi
done
[ -f "$T/ck-pipeline/model_index.json" ] && grep -q Flux2Pipeline "$T/ck-pipeline/model_index.json" && ok "pipeline layout: model_index.json names Flux2Pipeline" || bad "pipeline model_index.json"
# without --config, the BFL file is named as what it is
"$SIM" --weights "$T/ck-bfl.safetensors" --steps 1 -q </dev/null >"$T/log" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "a FLUX.2 checkpoint (tensor .*) but the config is FLUX.1: give its config" "$T/log" && [ "$(grep -c . "$T/log")" -eq 1 ]; then
  ok "a FLUX.2 BFL file without --config: one line naming the family and the fix"
else bad "FLUX.2 BFL without --config: exit $rc: $(head -2 "$T/log")"; fi
for L in pipeline bfl; do
  if out=$($OR diff "$T/ck-$L.h5" "$T/ck-diffusers.h5" --rtol 0 --mtol 0 --atol 0 -q 2>&1) && grep -q "^PASS" <<<"$out"; then ok "$L checkpoint replays exactly as the diffusers folder"
  else bad "$L vs diffusers checkpoint: $out"; fi
done

# true CFG (klein base; FluxPipeline's true_cfg_scale): a second call per step on a negative
# prompt. Under every layout (TP takes a negative prompt of any length; sequence parallelism
# needs the prompt's, else refused up front); the dump replays exactly.
for L in "2|--tp 2 --neg-txt-len 6" "2|--ring 2" "2|--ulysses 2" "4|--tp 2 --ring 2"; do
  n=${L%%|*}; args=${L#*|}
  run "$n" --config flux2-default --true-cfg-scale 4 --grid 5x7 --txt-len 13 --steps 2 $args --check -q >"$T/log" 2>&1; rc=$?
  if [ $rc -eq 0 ] && grep -q "check: OK" "$T/log"; then ok "true CFG 4 $args: --check OK"
  else bad "true CFG $args: exit $rc"; tail -3 "$T/log"; fi
done
run 2 --config flux2-default --true-cfg-scale 4 --grid 5x7 --txt-len 13 --neg-txt-len 6 --steps 1 --ring 2 -q >"$T/log" 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -q "error: true CFG under sequence parallelism (--ring) needs a negative prompt as long as the prompt (6 vs 13 text tokens)" "$T/log"; then
  ok "true CFG with a shorter negative prompt under --ring 2: refused up front"
else bad "true CFG negative length under SP: exit $rc $(head -2 "$T/log")"; fi
run 1 --config flux2-default --true-cfg-scale 4 --grid 4x4 --txt-len 8 --neg-txt-len 5 --steps 2 --dump "$T/cfg.h5" -q >"$T/log" 2>&1 &&
  run 1 --inputs "$T/cfg.h5" --dump "$T/cfg2.h5" -q >"$T/log" 2>&1
if out=$($OR diff "$T/cfg2.h5" "$T/cfg.h5" --rtol 0 --mtol 0 --atol 0 -q 2>&1) && grep -q "^PASS" <<<"$out" &&
   $PY -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r'); i = f['inputs']; sys.exit(not (i['negative_encoder_hidden_states'].shape == (1, 5, 128) and i['negative_txt_ids'].shape == (5, 4) and float(i['true_cfg_scale'][0]) == 4.0 and 'x_embedder@1' in [x.decode() if isinstance(x, bytes) else x for x in f['step_0000'].attrs['order']]))" "$T/cfg.h5"; then
  ok "true CFG dump: /inputs holds the negative prompt and the scale, x_embedder@1 recorded, --inputs replays it exactly"
else bad "true CFG dump/replay: $out"; fi
"$SIM" --inputs "$T/cfg.h5" --true-cfg-scale 2 -q </dev/null >"$T/log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "cannot be combined" "$T/log" && ok "--true-cfg-scale with --inputs: refused (the dump decides)" || bad "--true-cfg-scale with --inputs: exit $rc"

# 3. the bugs, where they live (fp32 and bf16)
BUGS=("proj-out-contiguous|--tp 2|single_transformer_blocks.0.attn.to_out"
      "packed-colwise-contiguous|--tp 2|transformer_blocks.0.ff.act_fn.gate_fn"
      "timestep-temp-bcast|--ring 2|time_guidance_embed.time_proj"
      "rope-local-pos|--ulysses 2|pos_embed#0"
      "txt-ids-local|--ring 2|pos_embed@1#0")
for p in fp32 bf16; do
  for B in "${BUGS[@]}"; do
    IFS='|' read -r bug args where <<<"$B"
    run 2 --config flux2-default --grid 4x4 --txt-len 8 --steps 1 --precision $p $args --inject "$bug" --check -q >"$T/log" 2>&1; rc=$?
    got=$(grep -o "DIVERGED at step [0-9]*, [^ ]*" "$T/log" | head -1)
    if [ $rc -eq 1 ] && [ "$got" = "DIVERGED at step 0, $where" ]; then ok "$p --inject $bug ($args): caught at $where"
    else bad "$p --inject $bug ($args): exit $rc, '$got' (expected step 0, $where)"; tail -4 "$T/log"; fi
  done
done
# packed-colwise-contiguous cannot fire on FLUX.1 (nothing is packed column-parallel): refused
run 2 --config tiny --steps 1 --tp 2 --inject packed-colwise-contiguous --check -q >"$T/log" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "cannot fire under .*: the model is FLUX.1" "$T/log"; then ok "packed-colwise-contiguous on FLUX.1 is refused up front (exit 2: $(grep -m1 -o 'error: .*' "$T/log" | cut -c1-120))"
else bad "packed-colwise-contiguous on FLUX.1: exit $rc"; tail -3 "$T/log"; fi

# 1. against diffusers' own FLUX.2 numbers
if [ ! -d "$ref/flux2-tiny" ]; then
  skip "flux2-tiny layouts: $ref/flux2-tiny not found — these tests did NOT run"
  finish
fi
W=$ref/flux2-tiny/weights.safetensors R64=$ref/flux2-tiny/dump_fp64.h5
for L in "2|--tp 2" "4|--tp 4" "2|--ulysses 2" "4|--ulysses 4" "2|--ring 2" "3|--ring 3 --ring-rotate p2p" \
         "4|--ulysses 2 --ring 2" "4|--tp 2 --ring 2" "4|--tp 2 --ulysses 2"; do
  n=${L%%|*}; args=${L#*|}
  run "$n" --weights "$W" --inputs "$R64" --precision fp64 $args --check --rtol 1e-13 --rtol-max 1e-12 -q >"$T/log" 2>&1; rc=$?
  if [ $rc -eq 0 ] && grep -q "check: OK" "$T/log"; then ok "flux2-tiny fp64 $args: --check OK at 1e-13"
  else bad "flux2-tiny fp64 $args: exit $rc"; tail -5 "$T/log"; fi
done
for L in "4|--tp 2 --ring 2" "4|--ulysses 4"; do
  n=${L%%|*}; args=${L#*|}
  run "$n" --weights "$W" --inputs "$R64" --precision fp64 $args --dump "$T/par.h5" -q >"$T/log" 2>&1
  if out=$($OR diff "$T/par.h5" "$R64" -q 2>&1) && grep -q "^PASS" <<<"$out"; then
    ok "flux2-tiny fp64 $args: the global dump matches diffusers' dump_fp64.h5 (1e-10): $out"
  else bad "flux2-tiny $args dump vs diffusers: $out"; fi
done
finish
