#!/usr/bin/env bash
# The LSE layout is declared, never inferred (seed 001). With the attention kernel handing its LSE
# back as [B,S,H] (`--lse-layout bsh`, what ROCm's flash kernels return) instead of [B,H,S] (CUDA),
# the ring code converts it explicitly and every ring layout still reproduces the single-rank
# run; and the lse-layout bug (code that assumes the other layout) is caught under either
# native layout. Model: the built-in default (8 heads), 35 image + 13 text tokens, 2 steps.
. "$(dirname "$0")/lib.sh"
run() { timeout 300 mpirun -np "$1" "${FLUX_BUILD:-build}/flux-sim" --grid 5x7 --txt-len 13 --steps 2 --check -q "${@:2}" </dev/null 2>&1; }
for lay in bhs bsh; do
  for L in "2|--ring 2" "3|--ring 3 --ring-rotate p2p" "4|--ulysses 2 --ring 2" "4|--tp 2 --ring 2"; do
    n=${L%%|*}; args=${L#*|}
    out=$(run "$n" $args --lse-layout $lay); rc=$?
    if [ $rc -eq 0 ] && grep -q "check: OK" <<<"$out"; then ok "--lse-layout $lay $args: --check OK"
    else bad "--lse-layout $lay $args: exit $rc"; grep -E "DIVERGED|error" <<<"$out" | head -3; fi
    out=$(run "$n" $args --lse-layout $lay --inject lse-layout); rc=$?
    if [ $rc -eq 1 ] && grep -qxF "flux-sim --check: DIVERGED at step 0, transformer_blocks.0.attn.to_out.0" <<<"$out"; then
      ok "--lse-layout $lay $args --inject lse-layout: caught at step 0 transformer_blocks.0.attn.to_out.0"
    else bad "--lse-layout $lay $args --inject lse-layout: exit $rc"; grep -E "DIVERGED|error" <<<"$out" | head -3; fi
  done
done
finish
