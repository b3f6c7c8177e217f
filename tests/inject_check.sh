#!/usr/bin/env bash
# Issue 5's proof: every re-created bug (--inject) under every layout it affects makes --check
# exit 1 at the expected step and module, naming the expected ranks; under a layout where the
# bug cannot show, --check passes (no false alarm). The same runs without --inject pass
# (tests/parallel_check.sh). Model: the built-in default (8 heads, guidance), 35 image + 13 text
# tokens (uneven shards), 2 steps, fp32.
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
pass=0; fail=0
# bug | ranks | layout | expected: "ok" or "STEP MODULE RANKS-PATTERN"
CASES=(
  "proj-out-contiguous|2|--tp 2|0 single_transformer_blocks.0.proj_out held by rank(s) 0, 1"
  "proj-out-contiguous|4|--tp 2 --ring 2|0 single_transformer_blocks.0.proj_out held by rank(s)"
  "proj-out-contiguous|2|--ring 2|ok"
  "timestep-temp-bcast|2|--tp 2|0 time_text_embed.time_proj rank 1 != rank 0"
  "timestep-temp-bcast|4|--ulysses 2 --ring 2|0 time_text_embed.time_proj rank 1 != rank 0; rank 2 != rank 0; rank 3 != rank 0"
  "guidance-temp-bcast|2|--ring 2|0 time_text_embed.time_proj@1 rank 1 != rank 0"
  "lse-layout|2|--ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "lse-layout|4|--ulysses 2 --ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "lse-layout|2|--tp 2|ok"
  "lse-layout|2|--ulysses 2|ok"
  "ring-no-lse|3|--ring 3 --ring-rotate p2p|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "ring-no-lse|2|--ulysses 2|ok"
  "rope-local-pos|2|--ring 2|0 pos_embed#0 held by rank(s) 1;"
  "rope-local-pos|2|--ulysses 2|0 pos_embed#0 held by rank(s) 1;"
  "rope-local-pos|2|--tp 2|ok"
  "ulysses-head-order|2|--ulysses 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "ulysses-head-order|4|--tp 2 --ulysses 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "ulysses-head-order|2|--ring 2|ok"
  "rowwise-bias-every-rank|2|--tp 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 0, 1"
  "rowwise-bias-every-rank|2|--ulysses 2|ok"
  "missing-allreduce|2|--tp 2|0 transformer_blocks.0.attn.to_out.0 rank 1 != rank 0"
  "missing-allreduce|2|--ring 2|ok"
  "adaln-sharded|2|--tp 2|0 transformer_blocks.0.norm1.linear rank 1 != rank 0"
  "adaln-sharded|2|--ring 2|ok"
  "overlap-early-read|3|--ring 3 --ring-rotate p2p|0 transformer_blocks.0.attn.to_out.0 held by rank(s)"
  "overlap-early-read|3|--ring 3|ok"
  "nan-rank:1:transformer_blocks.0.attn.to_k:1|2|--tp 2|1 transformer_blocks.0.attn.to_k held by rank(s) 1;"
  "seq-uneven-chunk|2|--ring 2|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 1;"
  "seq-uneven-chunk|3|--ring 3 --ring-rotate p2p|0 transformer_blocks.0.attn.to_out.0 held by rank(s) 2;"
  "seq-uneven-chunk|2|--tp 2|ok"
  "fused-qkv-contiguous|2|--tp 2|0 transformer_blocks.0.attn.to_q held by rank(s) 1;"
  "fused-qkv-contiguous|4|--tp 2 --ring 2|0 transformer_blocks.0.attn.to_q held by rank(s)"
  "fused-qkv-contiguous|2|--ring 2|ok"
  "nan-rank:0:single_transformer_blocks.2.attn:0|2|--ring 2|0 single_transformer_blocks.2.attn held by rank(s) 0;"
)
# seq-uneven-chunk only shows when the sequence does not divide: 16 image + 8 text over 2 ranks
out=$(timeout 300 mpirun -np 2 ${FLUX_BUILD:-build}/flux-sim --grid 4x4 --txt-len 8 --steps 2 --check -q --ring 2 --inject seq-uneven-chunk 2>&1)
if [ $? -eq 0 ] && grep -q "check: OK" <<<"$out"; then pass=$((pass + 1)); echo "ok   seq-uneven-chunk, 16+8 tokens over ring 2 (even): --check passes"
else fail=$((fail + 1)); echo "FAIL seq-uneven-chunk on an even split should not diverge"; fi
for c in "${CASES[@]}"; do
  IFS='|' read -r bug n layout want <<<"$c"
  out=$(timeout 300 mpirun -np "$n" ${FLUX_BUILD:-build}/flux-sim --grid 5x7 --txt-len 13 --steps 2 --check -q $layout --inject "$bug" 2>&1)
  rc=$?
  tag="$bug under $layout"
  if [ "$want" = ok ]; then
    if [ $rc -eq 0 ] && grep -q "check: OK" <<<"$out"; then pass=$((pass + 1)); echo "ok   $tag: cannot show here, and --check passes"
    else fail=$((fail + 1)); echo "FAIL $tag: expected no divergence, exit $rc"; grep -E "DIVERGED|error" <<<"$out" | head -2; fi
    continue
  fi
  step=${want%% *}; rest=${want#* }; module=${rest%% *}; ranks=${rest#* }
  if [ $rc -eq 1 ] && grep -qxF "flux-sim --check: DIVERGED at step $step, $module" <<<"$out" && grep -qF "$ranks" <<<"$out"; then
    pass=$((pass + 1)); echo "ok   $tag: exit 1 at step $step, $module ($ranks)"
  else
    fail=$((fail + 1)); echo "FAIL $tag: exit $rc, want step $step $module '$ranks'"; grep -E "DIVERGED|held by|disagree|error" <<<"$out" | head -3
  fi
done
# a nan-rank spec that never fires is an error, not a clean pass
out=$(timeout 300 mpirun -np 2 ${FLUX_BUILD:-build}/flux-sim --grid 5x7 --txt-len 13 --steps 1 --check -q --tp 2 --inject nan-rank:1:no.such.module:0 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q "never fired" <<<"$out"; then pass=$((pass + 1)); echo "ok   nan-rank naming no module of the run: exit 2, 'never fired'"
else fail=$((fail + 1)); echo "FAIL bad nan-rank spec: exit $rc"; fi
# the offline path: flux-sim's own per-rank dumps through flux-oracle consistency
T=$(mktemp -d /tmp/fluxsim-inj-XXXXXX)
timeout 300 mpirun -np 4 ${FLUX_BUILD:-build}/flux-sim --grid 5x7 --txt-len 13 --steps 1 -q --tp 2 --ring 2 --dump-per-rank "$T/ok" >/dev/null 2>&1
timeout 300 mpirun -np 2 ${FLUX_BUILD:-build}/flux-sim --grid 5x7 --txt-len 13 --steps 1 -q --tp 2 --inject missing-allreduce --dump-per-rank "$T/bad" >/dev/null 2>&1
${FLUX_BUILD:-build}/flux-oracle consistency "$T"/ok/rank_*.h5 >"$T/log" 2>&1; rc=$?
if [ $rc -eq 0 ]; then pass=$((pass + 1)); echo "ok   flux-oracle consistency: clean per-rank dumps (tp 2 x ring 2) agree"
else fail=$((fail + 1)); echo "FAIL consistency on clean per-rank dumps: exit $rc"; tail -3 "$T/log"; fi
${FLUX_BUILD:-build}/flux-oracle consistency "$T"/bad/rank_*.h5 >"$T/log" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "first divergence: step 0 transformer_blocks.0.attn.to_out.0" "$T/log" && grep -q "rank 1 disagrees with rank 0" "$T/log"; then
  pass=$((pass + 1)); echo "ok   flux-oracle consistency: missing-allreduce per-rank dumps → step 0 transformer_blocks.0.attn.to_out.0, rank 1"
else fail=$((fail + 1)); echo "FAIL consistency on missing-allreduce dumps: exit $rc"; tail -5 "$T/log"; fi
rm -rf "$T"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
