#!/usr/bin/env bash
# Issue 5's proof: every re-created bug (--inject) under every layout it affects makes --check
# exit 1 at the expected step and module, naming the expected ranks. Issue 9's: an injection that
# cannot act under the chosen layout and shape is refused before any compute (exit 2, one line
# naming the layouts where it shows), and one that was armed but never fired is exit 2, never a
# clean OK. The same runs without --inject pass (tests/parallel_check.sh). Model: the built-in
# default (8 heads, guidance), 35 image + 13 text tokens (uneven shards), 2 steps, fp32.
. "$(dirname "$0")/lib.sh"
# bug | ranks | layout | expected "STEP MODULE RANKS-PATTERN" (tools/gpu/gpu-check.sh reads this table too)
CASES=(
  "proj-out-contiguous|2|--tp 2|0 single_transformer_blocks.0.proj_out held by rank(s) 0, 1"
  "proj-out-contiguous|4|--tp 2 --ring 2|0 single_transformer_blocks.0.proj_out held by rank(s)"
  "timestep-temp-bcast|2|--tp 2|0 time_text_embed.time_proj rank 1 != rank 0"
  "timestep-temp-bcast|4|--ulysses 2 --ring 2|0 time_text_embed.time_proj rank 1 != rank 0; rank 2 != rank 0; rank 3 != rank 0"
  "guidance-temp-bcast|2|--ring 2|0 time_text_embed.time_proj@1 rank 1 != rank 0"
  "lse-layout|2|--ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "lse-layout|4|--ulysses 2 --ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "ring-no-lse|3|--ring 3 --ring-rotate p2p|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "rope-local-pos|2|--ring 2|0 pos_embed#0 held by rank(s) 1;"
  "rope-local-pos|2|--ulysses 2|0 pos_embed#0 held by rank(s) 1;"
  "ulysses-head-order|2|--ulysses 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "ulysses-head-order|4|--tp 2 --ulysses 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "rowwise-bias-every-rank|2|--tp 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 0, 1"
  "missing-allreduce|2|--tp 2|0 transformer_blocks.0.attn.to_out.0 rank 1 != rank 0"
  "adaln-sharded|2|--tp 2|0 transformer_blocks.0.norm1.linear rank 1 != rank 0"
  "overlap-early-read|3|--ring 3 --ring-rotate p2p|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "nan-rank:1:transformer_blocks.0.attn.to_k:1|2|--tp 2|1 transformer_blocks.0.attn.to_k held by rank(s) 1;"
  "seq-uneven-chunk|2|--ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 1;"
  "seq-uneven-chunk|3|--ring 3 --ring-rotate p2p|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 2;"
  "fused-qkv-contiguous|2|--tp 2|0 transformer_blocks.0.attn.to_q held by rank(s) 1;"
  "fused-qkv-contiguous|4|--tp 2 --ring 2|0 transformer_blocks.0.attn.to_q held by rank(s)"
  "ulysses-uneven-chunk|2|--ulysses 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 1;"
  "ulysses-uneven-chunk|4|--ulysses 2 --ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 2;"
  "ulysses-uneven-chunk|4|--tp 2 --ulysses 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 2, 3;"
  "ulysses-early-read|2|--ulysses 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 0;"
  "packed-colwise-contiguous|2|--config flux2-default --tp 2|0 transformer_blocks.0.ff.act_fn.gate_fn held by rank(s) 1;"
  "packed-colwise-contiguous|4|--config flux2-default --tp 2 --ring 2|0 transformer_blocks.0.ff.act_fn.gate_fn held by rank(s) 3;"
  "proj-out-contiguous|2|--config flux2-default --tp 2|0 single_transformer_blocks.0.attn.to_out held by rank(s) 0, 1"
  "timestep-temp-bcast|2|--config flux2-default --ring 2|0 time_guidance_embed.time_proj rank 1 != rank 0"
  "txt-ids-local|2|--config flux2-default --ring 2|0 pos_embed@1#0 held by rank(s) 1;"
  "txt-ids-local|4|--config flux2-default --ulysses 2 --ring 2|0 pos_embed@1#0 held by rank(s)"
  "ulysses-early-read|4|--ulysses 2 --ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 1;"
  "ulysses-early-read|4|--tp 2 --ulysses 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 2, 3;"
  "nan-rank:0:single_transformer_blocks.2.attn:0|2|--ring 2|0 single_transformer_blocks.2.attn held by rank(s) 0;"
  "lse-base2|2|--ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 0;"
  "lse-base2|4|--ulysses 2 --ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "lse-shard-offset|2|--ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 1;"
  "lse-shard-offset|3|--ring 3 --ring-rotate p2p|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "lse-layout-guessed|2|--ring 2 --grid 2x4 --txt-len 8|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 1;"
  "lse-layout-guessed|2|--ring 2 --grid 2x4 --txt-len 8 --lse-layout bsh|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 1;"
  "cfg-uncond-sees-cond|2|--cfg-parallel --true-cfg-scale 4|0 context_embedder@1 held by rank(s) 1;"
  "cfg-uncond-sees-cond|4|--cfg-parallel --true-cfg-scale 4 --tp 2|0 context_embedder@1 held by rank(s) 2, 3;"
  "cfg-uncond-sees-cond|4|--cfg-parallel --true-cfg-scale 4 --config flux2-default --ring 2|0 context_embedder@1 held by rank(s) 2; pieces: rank 0: dim 1 [0,0); rank 2: dim 1 [0,7); rank 3: dim 1 [7,13)"
  "replicated-text-rotated|2|--text replicated --ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 0;"
  "joint-kv-wrong-step|4|--text replicated --ulysses 2 --ring 2 --joint rear|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 0;"
  "replicated-kv-a2a|2|--text replicated --ulysses 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 0;"
  "replicated-kv-a2a|4|--text replicated --tp 2 --ulysses 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 0, 1;"
  "a2a-world-group|4|--ulysses 2 --ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 2;"
  "shard-floor-drop|2|--ring 2|0 latents_in pieces: rank 0: dim 1 [0,17); rank 1: dim 1 [17,34)"
  "pad-mask-ignored|2|--ring 2 --pad mask|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "pad-mask-ignored|4|--ulysses 2 --ring 2 --pad mask|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
)
# Refused before any compute: ranks | options | expected: "cannot fire" or "fires but cannot change anything",
# then a piece of the layout it ran under, then a piece of "it shows under ..." (the layouts named).
# Default shape 5x7 + 13 tokens, 2 steps, unless the options say otherwise.
REFUSED=(
  "2|--ulysses 2 --inject seq-uneven-chunk|cannot fire|tp 1 x ulysses 2 x ring 1: there is no ring attention|it shows under --ring >= 2 with ring chunks of unequal length"
  "2|--ring 2 --inject missing-allreduce|cannot fire|tp 1 x ulysses 1 x ring 2 (ring allgather): there is no tensor parallelism|it shows under --tp >= 2"
  "2|--ring 2 --inject proj-out-contiguous|cannot fire|ring 2 (ring allgather): there is no tensor parallelism|it shows under --tp >= 2"
  "2|--ring 2 --ring-rotate p2p --inject adaln-sharded|cannot fire|ring 2 (ring p2p): there is no tensor parallelism|it shows under --tp >= 2"
  "2|--ulysses 2 --inject rowwise-bias-every-rank|cannot fire|ulysses 2 x ring 1: there is no tensor parallelism|it shows under --tp >= 2"
  "2|--ring 2 --inject fused-qkv-contiguous|cannot fire|there is no tensor parallelism|it shows under --tp >= 2"
  "2|--tp 2 --inject lse-layout|cannot fire|tp 2 x ulysses 1 x ring 1: there is no ring attention|it shows under --ring >= 2"
  "2|--ulysses 2 --inject lse-layout|cannot fire|there is no ring attention|it shows under --ring >= 2"
  "2|--ulysses 2 --inject ring-no-lse|cannot fire|there is no ring attention|it shows under --ring >= 2"
  "2|--tp 2 --inject rope-local-pos|cannot fire|the sequence is not split|it shows under --ulysses >= 2 or --ring >= 2"
  "2|--ring 2 --inject ulysses-head-order|cannot fire|there is no Ulysses all-to-all|it shows under --ulysses >= 2"
  "3|--ring 3 --inject overlap-early-read|cannot fire|ring 3 (ring allgather): the ring rotates by all-gather|it shows under --ring >= 2 --ring-rotate p2p"
  "2|--tp 2 --inject seq-uneven-chunk|cannot fire|there is no ring attention|it shows under --ring >= 2"
  "2|--ring 2 --inject ulysses-uneven-chunk|cannot fire|there is no Ulysses all-to-all|it shows under --ulysses >= 2 with Ulysses shards of unequal length"
  "2|--tp 2 --inject ulysses-early-read|cannot fire|there is no Ulysses all-to-all|it shows under --ulysses >= 2"
  "2|--ring 2 --config odd --inject guidance-temp-bcast|cannot fire|the model has no guidance embedder|it shows under every layout of 2 or more ranks"
  "2|--ring 2 --inject txt-ids-local|fires but cannot change anything|every rank's text ids equal those at the start of the text (FLUX.1's are all zero)|it shows under --ulysses >= 2 or --ring >= 2 on a model whose text tokens have positions"
  "2|--tp 2 --inject packed-colwise-contiguous|cannot fire|tp 2 x ulysses 1 x ring 1: the model is FLUX.1|it shows under --tp >= 2 on a FLUX.2 config"
  "1|--inject timestep-temp-bcast|cannot fire|tp 1 x ulysses 1 x ring 1: a single rank broadcasts nothing|it shows under every layout of 2 or more ranks"
  "2|--tp 2 --inject nan-rank:2:transformer_blocks.0.attn.to_k:0|cannot fire|this run has no such rank|it shows under every layout that has rank RANK"
  "2|--tp 2 --inject nan-rank:1:transformer_blocks.0.attn.to_k:2|cannot fire|this run has no such step|it shows under every layout that has rank RANK"
  "2|--ring 2 --grid 4x4 --txt-len 8 --inject seq-uneven-chunk|fires but cannot change anything|ring 2 (ring allgather) with 8 text + 16 image tokens: the sequence divides evenly over the 2 ring ranks (12 tokens each)|it shows under --ring >= 2 with ring chunks of unequal length"
  "2|--ulysses 2 --grid 4x4 --txt-len 8 --inject ulysses-uneven-chunk|fires but cannot change anything|the sequence divides evenly over the 2 Ulysses ranks (12 tokens each)|it shows under --ulysses >= 2 with Ulysses shards of unequal length"
  "2|--ring 2 --guidance 0 --inject guidance-temp-bcast|fires but cannot change anything|every guidance value is 0|non-zero --guidance"
  "2|--ring 2 --grid 1x1 --txt-len 3 --inject rope-local-pos|fires but cannot change anything|every rank's token ids equal those at the start|it shows under --ulysses >= 2 or --ring >= 2"
  "2|--tp 2 --inject lse-base2|cannot fire|tp 2 x ulysses 1 x ring 1: there is no ring attention|it shows under --ring >= 2"
  "2|--ulysses 2 --inject lse-shard-offset|cannot fire|there is no ring attention|it shows under --ring >= 2"
  "2|--ring 2 --inject lse-layout-guessed|fires but cannot change anything|no rank's ring attention has as many query tokens as heads (S_local 25, 23; H = 8)|it shows under --ring >= 2 with some rank's ring-attention query length equal to its local head count"
  "4|--tp 2 --ring 2 --grid 2x4 --txt-len 8 --inject lse-layout-guessed|fires but cannot change anything|(S_local 8, 8; H = 4)|it shows under --ring >= 2 with some rank's ring-attention query length"
  "2|--tp 2 --true-cfg-scale 4 --inject cfg-uncond-sees-cond|cannot fire|tp 2 x ulysses 1 x ring 1: the cond and uncond passes are not on separate rank groups|it shows under --cfg-parallel --true-cfg-scale S"
  "2|--ring 2 --inject replicated-text-rotated|cannot fire|ring 2 (ring allgather): the text is not replicated|it shows under --text replicated --ring >= 2 --ulysses 1"
  "4|--text replicated --ulysses 2 --ring 2 --inject replicated-text-rotated|cannot fire|text replicated (joint front): with --ulysses >= 2 a dispatch keyed on the Ulysses degree|it shows under --text replicated --ring >= 2 --ulysses 1"
  "2|--text replicated --ulysses 2 --inject joint-kv-wrong-step|cannot fire|there is no ring attention|it shows under --text replicated --ring >= 2"
  "2|--text replicated --ring 2 --inject replicated-kv-a2a|cannot fire|there is no Ulysses all-to-all|it shows under --text replicated --ulysses >= 2"
  "2|--ulysses 2 --inject a2a-world-group|cannot fire|there is no ring attention|it shows under --ulysses >= 2 --ring >= 2"
  "2|--ring 2 --inject pad-mask-ignored|cannot fire|there is no mask to drop|it shows under --pad mask"
  "2|--ring 2 --grid 4x4 --txt-len 8 --inject shard-floor-drop|fires but cannot change anything|divide evenly over the 2 sequence-parallel ranks|it shows under --ulysses >= 2 or --ring >= 2 with a text or image length not divisible"
)
for c in "${REFUSED[@]}"; do
  IFS='|' read -r n opts kind where shows <<<"$c"
  if [ "$n" = 1 ]; then out=$(timeout 300 $SIM --grid 5x7 --txt-len 13 --steps 2 --check -q $opts </dev/null 2>&1); rc=$?
  else
    # shellcheck disable=SC2086
    out=$(timeout 300 mpirun -np "$n" $SIM --grid 5x7 --txt-len 13 --steps 2 $opts --check -q </dev/null 2>&1); rc=$?
  fi
  nerr=$(grep -c "^flux-sim: error" <<<"$out")
  if [ $rc -eq 2 ] && [ "$nerr" = 1 ] && grep -F -- "$kind" <<<"$out" | grep -F -- "$where" | grep -qF -- "$shows" &&
     ! grep -q "check:" <<<"$out"; then
    ok "refused, exit 2, one line: $opts ($kind; $shows)"
  else
    bad "$opts: exit $rc, $nerr error lines, want '$kind' '$where' '$shows'"; grep -E "flux-sim" <<<"$out" | head -3
  fi
done
for c in "${CASES[@]}"; do
  IFS='|' read -r bug n layout want <<<"$c"
  out=$(timeout 300 mpirun -np "$n" $SIM --grid 5x7 --txt-len 13 --steps 2 --check -q $layout --inject "$bug" </dev/null 2>&1)
  rc=$?
  tag="$bug under $layout"
  step=${want%% *}; rest=${want#* }; module=${rest%% *}; ranks=${rest#* }
  if [ $rc -eq 1 ] && grep -qxF "flux-sim --check: DIVERGED at step $step, $module" <<<"$out" && grep -qF "$ranks" <<<"$out"; then
    ok "$tag: exit 1 at step $step, $module ($ranks)"
  else
    bad "$tag: exit $rc, want step $step $module '$ranks'"; grep -E "DIVERGED|held by|disagree|error" <<<"$out" | head -3
  fi
done
# armed but never fired: exit 2, never a clean OK — a nan-rank naming no module of the run, and a
# TP bug under a plan that never makes the split it corrupts (every Linear replicated)
tmpdir inj
echo "*   replicate" >"$T/replicate.plan"
NEVER=(
  "--tp 2 --inject nan-rank:1:no.such.module:0|--inject nan-rank:1:no.such.module:0 never fired"
  "--tp 2 --plan $T/replicate.plan --inject missing-allreduce|--inject missing-allreduce never fired in this run"
  "--tp 2 --plan $T/replicate.plan --inject proj-out-contiguous|--inject proj-out-contiguous never fired in this run"
)
for c in "${NEVER[@]}"; do
  IFS='|' read -r opts want <<<"$c"
  # shellcheck disable=SC2086
  out=$(timeout 300 mpirun -np 2 $SIM --grid 5x7 --txt-len 13 --steps 1 --check -q $opts </dev/null 2>&1); rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$want" <<<"$out" && [ "$(grep -c "^flux-sim: error" <<<"$out")" = 1 ]; then
    ok "armed, never fired: exit 2 ($want)"
  else bad "never-fired $opts: exit $rc"; grep flux-sim <<<"$out" | head -3; fi
done
# the offline path: flux-sim's own per-rank dumps through flux-oracle consistency
timeout 300 mpirun -np 4 $SIM --grid 5x7 --txt-len 13 --steps 1 -q --tp 2 --ring 2 --dump-per-rank "$T/ok" >/dev/null 2>&1
timeout 300 mpirun -np 2 $SIM --grid 5x7 --txt-len 13 --steps 1 -q --tp 2 --inject missing-allreduce --dump-per-rank "$T/bad" >/dev/null 2>&1
${FLUX_BUILD:-build}/flux-oracle consistency "$T"/ok/rank_*.h5 >"$T/log" 2>&1; rc=$?
if [ $rc -eq 0 ]; then ok "flux-oracle consistency: clean per-rank dumps (tp 2 x ring 2) agree"
else bad "consistency on clean per-rank dumps: exit $rc"; tail -3 "$T/log"; fi
# two ranks whose copies differ: without a reference neither is known to be right, so the split
# is reported (no culprit by majority); against the single-rank reference both partial sums differ
${FLUX_BUILD:-build}/flux-oracle consistency "$T"/bad/rank_*.h5 >"$T/log" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "first divergence: step 0 transformer_blocks.0.attn.to_out.0" "$T/log" && grep -q "copies split 0 | 1" "$T/log"; then
  ok "flux-oracle consistency: missing-allreduce per-rank dumps → step 0 transformer_blocks.0.attn.to_out.0, copies split 0 | 1"
else bad "consistency on missing-allreduce dumps: exit $rc"; tail -5 "$T/log"; fi
$SIM --grid 5x7 --txt-len 13 --steps 1 -q --dump "$T/ref.h5" </dev/null >/dev/null 2>&1
${FLUX_BUILD:-build}/flux-oracle consistency "$T"/bad/rank_*.h5 --ref "$T/ref.h5" >"$T/log" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "first divergence: step 0 transformer_blocks.0.attn.to_out.0" "$T/log" && grep -q "every copy differs from the reference" "$T/log"; then
  ok "flux-oracle consistency --ref: both ranks' partial sums differ from the single-rank reference"
else bad "consistency --ref on missing-allreduce dumps: exit $rc"; tail -5 "$T/log"; fi
finish
