#!/usr/bin/env bash
# Issue 20's CFG parallel (the cond and uncond transformer calls of true CFG on two rank groups,
# sglang's and xDiT's CFG parallel; --cfg-parallel) and the verdict that tells a CFG bug from the
# batch-size-dependent GEMM noise (B16, xDiT#510):
#   1. --check passes for --cfg-parallel alone and with TP, Ulysses and ring inside each group,
#      FLUX.1 (default) and FLUX.2 (flux2-default, klein-style true CFG), fp32 and bf16 (the
#      matched-fp64 arbiter), uneven shards (35 image + 13 text tokens);
#   2. CFG parallel alone computes exactly what the sequential single-rank run computes: its
#      global and per-rank dumps equal the sequential dump bit for bit, the uncond call's records
#      named name@k as the sequential run names them, held by the ranks that computed them;
#   3. --inject cfg-uncond-sees-cond (B23, vllm-omni#3646) is caught at step 0 in the uncond
#      call's first module that reads the text (context_embedder@1), on the uncond group's ranks;
#   4. B16: a batched sequential run (--cfg-batched, one forward of batch 2, diffusers' classic
#      CFG) and the CFG-parallel batch-1 run differ (fp32: OpenBLAS's own M-dependence; bf16: a
#      split-K kernel for the bigger M, FS_GEMM_SPLITK_ROWS) and are judged not a bug — fp32 by
#      --check's layout rule, bf16 by the matched-fp64 arbiter — while the injection is a bug;
#   5. impossible combinations are refused: one line, exit 2.
. "$(dirname "$0")/lib.sh"
tmpdir cfgpar
S=(--grid 5x7 --txt-len 13 --steps 2 --true-cfg-scale 4)
run() { timeout 300 mpirun -np "$1" "$SIM" "${@:2}" </dev/null; }

# 1. --check across the layouts
for L in "2|" "4|--tp 2" "4|--ulysses 2" "4|--ring 2 --ring-rotate p2p" "2|--precision bf16" "4|--tp 2 --precision bf16" \
         "2|--config flux2-default" "4|--config flux2-default --ring 2" "4|--config flux2-default --ulysses 2 --precision bf16"; do
  n=${L%%|*}; args=${L#*|}
  # shellcheck disable=SC2086
  run "$n" "${S[@]}" --cfg-parallel $args --check -q >"$T/log" 2>&1; rc=$?
  if [ $rc -eq 0 ] && grep -q "check: OK — cfg 2 x tp" "$T/log"; then ok "--cfg-parallel $args ($n ranks): --check OK"
  else bad "--cfg-parallel $args: exit $rc"; tail -4 "$T/log"; fi
done

# 2. bit-identical to the sequential run; per-rank dumps; the CFG group in the parallel attribute
# one thread, as each rank of the parallel runs has: the GEMM providers' results depend on it
"$SIM" "${S[@]}" -q --threads 1 --dump "$T/seq.h5" </dev/null || bad "sequential dump"
run 2 "${S[@]}" -q --cfg-parallel --dump "$T/par.h5" --dump-per-rank "$T/pr" >"$T/log" 2>&1 || bad "CFG-parallel dump: $(tail -2 "$T/log")"
if out=$($ORACLE diff "$T/par.h5" "$T/seq.h5" --rtol 0 --atol 0 --mtol 0 -q 2>&1) && grep -q "^PASS: 729 tensors" <<<"$out"; then
  ok "CFG-parallel global dump == sequential dump, bit for bit (729 tensors)"
else bad "CFG-parallel vs sequential exact: $out"; fi
if out=$($ORACLE diff "$T/pr" "$T/seq.h5" --rtol 0 --atol 0 --mtol 0 -q 2>&1) && grep -q "^PASS" <<<"$out"; then
  ok "per-rank dumps against the sequential dump: exact"
else bad "per-rank vs sequential: $out"; fi
shapes=$($PY - "$T/pr" <<'PY'
import h5py, sys
d = sys.argv[1]
r0, r1 = h5py.File(d + "/rank_0.h5"), h5py.File(d + "/rank_1.h5")
print(r0["step_0000/context_embedder"].shape[0], r0["step_0000/context_embedder@1"].shape[0],
      r1["step_0000/context_embedder"].shape[0], r1["step_0000/context_embedder@1"].shape[0])
PY
)
if [ "$shapes" = "1 0 0 1" ]; then ok "rank 0 holds the cond call's records, rank 1 the uncond call's (name@1), the other an empty piece"
else bad "per-rank pieces: '$shapes', want '1 0 0 1'"; fi
if h5dump -a parallel "$T/par.h5" 2>/dev/null | grep -qF '"cfg":2'; then ok "the dump's parallel attribute names the CFG degree"
else bad "parallel attribute lacks cfg"; fi
run 4 "${S[@]}" -q --cfg-parallel --tp 2 --check="$T/seq.h5" >"$T/log" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "check: OK — cfg 2 x tp 2" "$T/log"; then ok "--cfg-parallel --tp 2 --check=sequential.h5: OK"
else bad "--check=seq.h5: exit $rc"; tail -3 "$T/log"; fi

# 3. B23 caught where it lives
for L in "2||rank(s) 1;" "4|--tp 2|rank(s) 2, 3;" "4|--config flux2-default --ulysses 2|rank(s) 2; pieces: rank 0: dim 1 [0,0); rank 2: dim 1 [0,7); rank 3: dim 1 [7,13)"; do
  IFS='|' read -r n args ranks <<<"$L"
  # shellcheck disable=SC2086
  run "$n" "${S[@]}" --cfg-parallel $args --check -q --inject cfg-uncond-sees-cond >"$T/log" 2>&1; rc=$?
  if [ $rc -eq 1 ] && grep -qxF "flux-sim --check: DIVERGED at step 0, context_embedder@1" "$T/log" && grep -qF "held by $ranks" "$T/log"; then
    ok "cfg-uncond-sees-cond $args: exit 1 at step 0 context_embedder@1, $ranks"
  else bad "cfg-uncond-sees-cond $args: exit $rc"; grep -E "DIVERGED|held|error" "$T/log" | head -3; fi
done

# 4. B16: batch 2 (sequential, batched) vs batch 1 (CFG parallel) — noise, not a bug
"$SIM" "${S[@]}" -q --threads 1 --cfg-batched --dump "$T/bat32.h5" </dev/null || bad "--cfg-batched fp32 dump"
if $ORACLE diff "$T/bat32.h5" "$T/seq.h5" --rtol 0 --atol 0 --mtol 0 -q >"$T/log" 2>&1; then
  skip "fp32 batch-variance: the batched run equals the sequential one bit for bit on this BLAS (the verdict below then compares equal runs)"
else ok "fp32: the batched run differs from the sequential one (the GEMM's own M-dependence): $(grep -o 'DIVERGE at step [0-9]* [^:]*' "$T/log")"; fi
if $ORACLE diff "$T/bat32.h5" "$T/seq.h5" -q >/dev/null 2>&1; then ok "fp32 batched vs sequential: within the oracle's fp32 tolerance"
else bad "fp32 batched vs sequential out of tolerance"; fi
run 2 "${S[@]}" -q --cfg-parallel --check="$T/bat32.h5" >"$T/log" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "check: OK" "$T/log"; then ok "fp32: CFG parallel (batch 1) --check against the batched run: OK, not a bug ($(grep -o 'worst relative L2 [^ ]*' "$T/log"))"
else bad "fp32 CFG parallel vs batched: exit $rc"; tail -3 "$T/log"; fi
run 2 "${S[@]}" -q --cfg-parallel --check="$T/bat32.h5" --inject cfg-uncond-sees-cond >"$T/log" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -qxF "flux-sim --check: DIVERGED at step 0, context_embedder@1" "$T/log"; then
  ok "fp32: the injection against the batched run: a bug, at step 0 context_embedder@1"
else bad "fp32 injection vs batched: exit $rc"; fi
B16=(--precision bf16)
FS_GEMM_SPLITK_ROWS=49 "$SIM" "${S[@]}" "${B16[@]}" -q --threads 1 --cfg-batched --dump "$T/bat.h5" </dev/null || bad "--cfg-batched bf16 dump"
FS_GEMM_SPLITK_ROWS=49 run 2 "${S[@]}" "${B16[@]}" -q --cfg-parallel --dump "$T/parb.h5" >/dev/null 2>&1 || bad "CFG-parallel bf16 dump"
FS_GEMM_SPLITK_ROWS=49 run 2 "${S[@]}" "${B16[@]}" -q --cfg-parallel --inject cfg-uncond-sees-cond --dump "$T/injb.h5" >/dev/null 2>&1 || bad "injected bf16 dump"
"$SIM" "${S[@]}" --precision fp64 --match bf16 -q --threads 1 --dump "$T/truth.h5" </dev/null || bad "matched fp64 truth"
if ! $ORACLE diff "$T/parb.h5" "$T/bat.h5" --rtol 0 --atol 0 --mtol 0 -q >"$T/log" 2>&1; then
  ok "bf16 with a split-K kernel for M >= 49: batch-1 CFG parallel and the batch-2 run differ ($(grep -o 'DIVERGE at step [0-9]* [^:]*' "$T/log"))"
else bad "bf16 batch-variant runs are identical: FS_GEMM_SPLITK_ROWS had no effect"; fi
if out=$($ORACLE diff "$T/parb.h5" "$T/bat.h5" --truth "$T/truth.h5" -q 2>&1) && grep -q "^PASS" <<<"$out"; then
  ok "bf16 arbiter: CFG parallel vs the batched run, judged against the matched fp64 truth: not a bug"
else bad "bf16 arbiter on the batch-variance: $out"; fi
out=$($ORACLE diff "$T/injb.h5" "$T/bat.h5" --truth "$T/truth.h5" -q 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -q "^DIVERGE at step 0 context_embedder@1" <<<"$out"; then
  ok "bf16 arbiter: cfg-uncond-sees-cond is a bug, at step 0 context_embedder@1"
else bad "bf16 arbiter on the injection: exit $rc: $out"; fi

# the same verdict in one job: the batched run --check'ed against the sequential single-rank run
# and, in bf16, its matched-fp64 truth (the in-job arbiter of docs/bf16.md)
FS_GEMM_SPLITK_ROWS=49 "$SIM" "${S[@]}" "${B16[@]}" -q --cfg-batched --check >"$T/log" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "check: OK .*against the matched float64 truth" "$T/log"; then
  ok "bf16 --cfg-batched --check (split-K for the batched M) in one job: OK under the arbiter ($(grep -o 'at most [^ ]* x' "$T/log"))"
else bad "bf16 --cfg-batched --check: exit $rc"; tail -3 "$T/log"; fi

# 5. refused: one line, exit 2
ERRS=(
  "3|${S[*]} --cfg-parallel|--cfg-parallel needs an even number of ranks (two rank groups), the job has 3"
  "1|${S[*]} --cfg-parallel|--cfg-parallel needs an even number of ranks (two rank groups), the job has 1"
  "2|--steps 1 --cfg-parallel|--cfg-parallel splits the two calls of true CFG over two rank groups: add --true-cfg-scale"
  "2|--inputs $T/bat32.h5 --cfg-parallel --cfg-batched|choose one"
  "4|${S[*]} --cfg-parallel --tp 4|--cfg-parallel: layout tp 4 x ulysses 1 x ring 1 = 4 ranks in each of the 2 CFG groups, but the job has 4 ranks (2 per group)"
  "2|${S[*]} --cfg-batched|--cfg-batched runs on one rank (the job has 2)"
  "1|${S[*]} --neg-txt-len 5 --cfg-batched|--cfg-batched stacks the prompt and the negative prompt into one batch: they need the same length (5 vs 13 text tokens)"
)
"$SIM" --steps 1 --grid 4x4 -q --dump "$T/nocfg.h5" </dev/null
ERRS+=("2|--inputs $T/nocfg.h5 --cfg-parallel|--cfg-parallel splits the two calls of true CFG over two rank groups, but $T/nocfg.h5 has no true CFG")
for c in "${ERRS[@]}"; do
  IFS='|' read -r n opts want <<<"$c"
  # shellcheck disable=SC2086
  out=$(run "$n" $opts -q 2>&1); rc=$?
  if [ $rc -eq 2 ] && [ "$(grep -c "^flux-sim: error" <<<"$out")" = 1 ] && grep -qF -- "$want" <<<"$out"; then
    ok "refused ($n ranks: $opts): $want"
  else bad "$opts: exit $rc, want '$want'"; grep flux-sim <<<"$out" | head -3; fi
done
if "$SIM" "${S[@]}" --cfg-parallel -q </dev/null >/dev/null 2>&1; then bad "--cfg-parallel on one rank ran"; else
  rc=$?; [ $rc -eq 2 ] && ok "--cfg-parallel on one rank without mpirun: exit 2" || bad "one rank: exit $rc"; fi
finish
