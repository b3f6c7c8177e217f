#!/usr/bin/env bash
# bf16: flux-sim reproduces a bf16 GPU run's numerics, and the verdict separates bf16 noise from
# real bugs (docs/bf16.md). Against the diffusers reference (../shared/reference, "bf16 runs"):
#   1. --precision fp64 --match bf16, replaying dump_bf16.h5, equals dump_bf16_matched_fp64.h5
#      (float64 rule, rel L2 <= 1e-10) on every dataset;
#   2. --precision bf16 replaying dump_bf16.h5: diffusers' bf16 run is accepted by the documented
#      verdict `flux-oracle diff RUN.h5 SIM_BF16.h5 --truth SIM_FP64_MATCHED.h5`, and our error
#      against the matched truth is the size of diffusers' (tools/gen/bf16_noise.py, per module class);
#   3. every parallel layout of 2-4 ranks, bf16, --check: no false alarm (the arbiter against the
#      matched float64 truth rank 0 records);
#   4. correct parallel bf16 runs (TP, ring, Ulysses, TP with the all-reduce summed in another
#      order) pass the documented verdict; bugs fail it at the step and module where they live:
#      contiguous proj_out, timestep zero on ranks != 0, ring without LSE, a row-parallel bias on
#      every rank, one weight element doubled in one Linear (a global dump stores each replicated
#      tensor once, from the lowest rank holding it, so rank 1's wrong timestep first shows where
#      its own piece is written: the colwise to_q of block 0; --check, which hashes every copy,
#      stops at time_proj itself — part 5);
#   5. every --inject bug (`flux-sim --inject list`, fail-rank aside: a fault, tests/rank_failure.sh)
#      is still caught by --check in bf16, at its step and module.
# Real PyTorch bf16 runs with real bugs, judged by the same verdict: tests/bf16_torch_bugs.sh.
. "$(dirname "$0")/lib.sh"
SIM=${FLUX_BUILD:-build}/flux-sim OR=${FLUX_BUILD:-build}/flux-oracle
ref=${FLUX_REFERENCE_DIR:-../shared/reference}
tmpdir bf16
if [ ! -d "$ref/tiny" ]; then
  skip_all "bf16 checks: $ref not found — these tests did NOT run"
fi
run() { timeout 300 mpirun -np "$1" "$SIM" "${@:2}" </dev/null; }

# flux2-tiny: FLUX.2 (Flux2Transformer2DModel) on torch 2.15's CPU bf16 kernels, the same rules
for c in tiny odd flux2-tiny; do
  if [ ! -f "$ref/$c/dump_bf16.h5" ]; then bad "$c: $ref/$c/dump_bf16.h5 missing"; continue; fi
  W=$ref/$c/weights.safetensors RUN=$ref/$c/dump_bf16.h5 M=$ref/$c/dump_bf16_matched_fp64.h5
  # 1. the matched reference
  run 1 --weights "$W" --inputs "$RUN" --precision fp64 --match bf16 --dump "$T/$c-match.h5" -q >"$T/log" 2>&1 || bad "$c: --match bf16 run failed: $(tail -1 "$T/log")"
  if out=$($OR diff "$T/$c-match.h5" "$M" -q 2>&1) && grep -q "^PASS" <<<"$out"; then
    ok "$c: --precision fp64 --match bf16 == dump_bf16_matched_fp64.h5 (rel L2 <= 1e-10): $out"
  else bad "$c: --match bf16 vs the reference's matched dump: $out"; fi
  # 2. our bf16 emulation, and diffusers' bf16 run judged by the documented recipe
  run 1 --weights "$W" --inputs "$RUN" --precision bf16 --dump "$T/$c-bf16.h5" -q >"$T/log" 2>&1 || bad "$c: bf16 run failed: $(tail -1 "$T/log")"
  if out=$($OR diff "$RUN" "$T/$c-bf16.h5" --truth "$T/$c-match.h5" -q 2>&1) && grep -q "^PASS" <<<"$out"; then
    ok "$c: diffusers' bf16 run passes 'flux-oracle diff RUN SIM_BF16 --truth MATCHED': $out"
  else bad "$c: diffusers' bf16 run vs our emulation: $out"; fi
  # its error and ours against the truth, per module class (the ratio is what the rule bounds)
  $PY tools/gen/bf16_noise.py "$T/$c-match.h5" "$T/$c-bf16.h5" "$RUN" >"$T/noise" 2>&1
  worst=$(awk '$1 == "ALL" {print $5}' "$T/noise")
  if [ -n "$worst" ] && awk -v r="$worst" 'BEGIN {exit !(r < 1.5)}'; then
    ok "$c: diffusers' error vs the matched truth is at most ${worst}x ours (rel L2, worst dataset)"; sed 's/^/      /' "$T/noise"
  else bad "$c: error ratio diffusers/ours '$worst'"; cat "$T/noise"; fi
done

# 3. the layout matrix in bf16, --check: no false alarm
LAYOUTS=("2|--tp 2" "3|--tp 3" "2|--ulysses 2" "3|--ulysses 3" "2|--ring 2" "2|--ring 2 --ring-rotate p2p" "3|--ring 3"
         "3|--ring 3 --ring-rotate p2p" "4|--ring 4 --ring-rotate p2p" "4|--ulysses 2 --ring 2" "4|--tp 2 --ring 2"
         "4|--tp 2 --ulysses 2" "2|--tp 2 --allreduce-order reverse" "4|--tp 4 --allreduce-order ring")
for c in tiny odd; do
  W=$ref/$c/weights.safetensors RUN=$ref/$c/dump_bf16.h5
  for L in "${LAYOUTS[@]}"; do
    n=${L%%|*}; args=${L#*|}
    run "$n" --weights "$W" --inputs "$RUN" --precision bf16 $args --check -q >"$T/log" 2>&1; rc=$?
    if [ $rc -eq 2 ] && grep -q "cannot run this model" "$T/log"; then continue; fi # heads do not divide: parallel_check.sh owns that list
    if [ $rc -eq 0 ] && grep -q "check: OK" "$T/log"; then
      ok "$c bf16 $args: --check OK ($(grep -o 'at most [0-9.]* x' "$T/log") the single-rank bf16 run's error vs the truth)"
    else bad "$c bf16 $args: exit $rc"; grep -E "DIVERGED|error|truth" "$T/log" | head -4; fi
  done
done

# 4. the documented verdict over dumps: correct parallel bf16 runs pass, bugs fail where they live
c=tiny W=$ref/tiny/weights.safetensors RUN=$ref/tiny/dump_bf16.h5
S=$T/tiny-bf16.h5 M=$T/tiny-match.h5
for L in "2|--tp 2" "2|--ring 2 --ring-rotate p2p" "2|--ulysses 2" "2|--tp 2 --allreduce-order reverse" "4|--tp 2 --ring 2"; do
  n=${L%%|*}; args=${L#*|}
  run "$n" --weights "$W" --inputs "$RUN" --precision bf16 $args --dump "$T/par.h5" -q >"$T/log" 2>&1
  if out=$($OR diff "$T/par.h5" "$S" --truth "$M" -q 2>&1) && grep -q "^PASS" <<<"$out"; then ok "correct bf16 $args passes the verdict"
  else bad "correct bf16 $args: $out"; fi
done
$PY - "$W" "$T/dbl.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read()); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
e = h["transformer_blocks.0.attn.to_q.weight"]; i = 8 + n + e["data_offsets"][0] + 4 * (3 * e["shape"][1] + 5)
b[i:i + 4] = struct.pack("<f", 2 * struct.unpack("<f", b[i:i + 4])[0])   # one weight element doubled
open(sys.argv[2], "wb").write(b)
PY
BUGS=(
  "2|--tp 2 --inject proj-out-contiguous|$W|0 single_transformer_blocks.0.proj_out"
  "2|--tp 2 --inject timestep-temp-bcast|$W|0 transformer_blocks.0.attn.to_q"
  "2|--ring 2 --inject ring-no-lse|$W|0 transformer_blocks.0.attn.to_out.0"
  "2|--tp 2 --inject rowwise-bias-every-rank|$W|0 transformer_blocks.0.attn.to_out.0"
  "1||$T/dbl.safetensors|0 transformer_blocks.0.attn.to_q"
)
for b in "${BUGS[@]}"; do
  IFS='|' read -r n args w want <<<"$b"
  run "$n" --weights "$w" --inputs "$RUN" --precision bf16 $args --dump "$T/bug.h5" -q >"$T/log" 2>&1
  out=$($OR diff "$T/bug.h5" "$S" --truth "$M" -q 2>&1); rc=$?
  step=${want%% *}; module=${want#* }
  if [ $rc -eq 1 ] && grep -q "^DIVERGE at step $step $module:" <<<"$out"; then ok "bug (${args:-one weight element doubled}): the verdict stops at step $step $module"
  else bad "bug (${args:-doubled weight}): exit $rc, want step $step $module: $out"; fi
done

# 5. the --inject bugs in bf16, --check (5x7 + 13 tokens: uneven shards)
CASES=(
  "proj-out-contiguous|2|--tp 2|0 single_transformer_blocks.0.proj_out"
  "timestep-temp-bcast|2|--tp 2|0 time_text_embed.time_proj"
  "guidance-temp-bcast|2|--ring 2|0 time_text_embed.time_proj@1"
  "lse-layout|2|--ring 2|0 transformer_blocks.0.attn.to_out.0"
  "ring-no-lse|3|--ring 3 --ring-rotate p2p|0 transformer_blocks.0.attn.to_out.0"
  "rope-local-pos|2|--ring 2|0 pos_embed#0"
  "ulysses-head-order|2|--ulysses 2|0 transformer_blocks.0.attn.to_out.0"
  "rowwise-bias-every-rank|2|--tp 2|0 transformer_blocks.0.attn.to_out.0"
  "missing-allreduce|2|--tp 2|0 transformer_blocks.0.attn.to_out.0"
  "adaln-sharded|2|--tp 2|0 transformer_blocks.0.norm1.linear"
  "overlap-early-read|3|--ring 3 --ring-rotate p2p|0 transformer_blocks.0.attn.to_out.0"
  "seq-uneven-chunk|2|--ring 2|0 transformer_blocks.0.attn.to_out.0"
  "seq-uneven-chunk|3|--ring 3 --ring-rotate p2p|0 transformer_blocks.0.attn.to_out.0"
  "fused-qkv-contiguous|2|--tp 2|0 transformer_blocks.0.attn.to_q"
  "nan-rank:1:transformer_blocks.0.attn.to_k:1|2|--tp 2|1 transformer_blocks.0.attn.to_k"
  "ulysses-uneven-chunk|2|--ulysses 2|0 transformer_blocks.0.attn.to_out.0"
  "ulysses-early-read|2|--ulysses 2|0 transformer_blocks.0.attn.to_out.0"
  "packed-colwise-contiguous|2|--config flux2-default --tp 2|0 transformer_blocks.0.ff.act_fn.gate_fn"
  "txt-ids-local|2|--config flux2-default --ulysses 2|0 pos_embed@1#0"
  "lse-base2|2|--ring 2|0 transformer_blocks.0.attn.to_out.0"
  "lse-shard-offset|2|--ring 2|0 transformer_blocks.0.attn.to_out.0"
  "lse-layout-guessed|2|--ring 2 --grid 2x4 --txt-len 8|0 transformer_blocks.0.attn.to_out.0"
  "cfg-uncond-sees-cond|2|--cfg-parallel --true-cfg-scale 4|0 context_embedder@1"
  "replicated-text-rotated|2|--text replicated --ring 2|0 transformer_blocks.0.attn.to_out.0"
  "joint-kv-wrong-step|2|--text replicated --ring 2 --joint rear|0 transformer_blocks.0.attn.to_out.0"
  "replicated-kv-a2a|2|--text replicated --ulysses 2|0 transformer_blocks.0.attn.to_out.0"
  "a2a-world-group|4|--ulysses 2 --ring 2|0 transformer_blocks.0.attn.to_out.0"
  "shard-floor-drop|2|--ring 2|0 latents_in"
  "pad-mask-ignored|2|--ring 2 --pad mask|0 transformer_blocks.0.attn.to_out.0"
)
# every kind `--inject list` names has a case here (fail-rank is a fault, not a bug: rank_failure.sh)
kinds=$($SIM --inject list | awk '/^  [a-z]/ {sub(/:.*/, "", $1); print $1}')
[ -n "$kinds" ] || bad "flux-sim --inject list named no bug"
for k in $kinds; do
  [ "$k" = fail-rank ] && continue
  printf '%s\n' "${CASES[@]}" | grep -q "^$k[|:]" || bad "--inject $k (flux-sim --inject list) has no bf16 case in part 5"
done
for cs in "${CASES[@]}"; do
  IFS='|' read -r bug n layout want <<<"$cs"
  out=$(run "$n" --precision bf16 --grid 5x7 --txt-len 13 --steps 2 --check -q $layout --inject "$bug" 2>&1); rc=$?
  step=${want%% *}; module=${want#* }
  if [ $rc -eq 1 ] && grep -qxF "flux-sim --check: DIVERGED at step $step, $module" <<<"$out"; then ok "bf16 --inject $bug under $layout: caught at step $step $module"
  else bad "bf16 --inject $bug under $layout: exit $rc, want step $step $module"; grep -E "DIVERGED|error" <<<"$out" | head -2; fi
done
finish
