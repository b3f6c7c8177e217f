#!/usr/bin/env bash
# The LSE convention is declared per backend — layout, log base, offset — and the ring merge
# converts explicitly (issue 20; docs/parallel.md §3.4 "LSE conventions"; B8–B10 of
# ../shared/field-bugs-2026.md). 1. With the CPU backend reporting another vendor's convention
# (FLUX_SIM_LSE_CONVENTION=base2 / centred / base2,centred: a base-2 LSE, an LSE against
# mean-centred K as AITER Sage), every ring layout still reproduces the single-rank run, fp32 and
# fp64, as with the natural-log one. 2. The layout matrix includes a geometry with S_local == H
# (8 heads, 8 query tokens a ring rank; 4 local heads, 4 tokens), under both declared layouts.
# 3. lse-base2 (B9), lse-shard-offset (B8) and lse-layout-guessed (B10) are caught at step 0 in
# the attention's output, fp32; 4. refused where they cannot fire or change anything.
# Model: the built-in default (8 heads x 32), 2 steps.
. "$(dirname "$0")/lib.sh"
# run CONVENTION RANKS ARGS...: flux-sim --check under mpirun with the CPU backend reporting CONVENTION
run() {
  local conv=$1 n=$2; shift 2
  FLUX_SIM_LSE_CONVENTION=$conv timeout 300 mpirun -x FLUX_SIM_LSE_CONVENTION -np "$n" "$SIM" --steps 2 --check -q "$@" </dev/null 2>&1
}
G="--grid 5x7 --txt-len 13" # 48 tokens: uneven ring shards
# 1. the conversion path: --check OK as with the natural-log convention
for conv in base2 centred base2,centred; do
  LAYOUTS=("2|--ring 2|fp32" "3|--ring 3 --ring-rotate p2p|fp64")
  [ "$conv" = base2,centred ] &&
    LAYOUTS+=("4|--ulysses 2 --ring 2|fp32" "4|--tp 2 --ring 2|fp64" "2|--ring 2 --lse-layout bsh|fp64" "2|--ring 2 --backend cpu-strict|fp32")
  for L in "${LAYOUTS[@]}"; do
    IFS='|' read -r n args prec <<<"$L"
    # shellcheck disable=SC2086
    out=$(run "$conv" "$n" $G $args --precision $prec); rc=$?
    if [ $rc -eq 0 ] && grep -q "^flux-sim --check: OK" <<<"$out"; then ok "reported $conv, $args $prec: converted, --check OK"
    else bad "reported $conv, $args $prec: exit $rc"; grep -E "DIVERGED|error" <<<"$out" | head -3; fi
  done
done
# 2. the layout matrix at S_local == H: 16 tokens over ring 2 = 8 a rank, 8 heads; 8 tokens over
#    tp 2 x ring 2 or ulysses 2 x ring 2 = 4 query tokens, 4 local heads
for lay in bhs bsh; do
  for L in "2|--grid 2x4 --txt-len 8 --ring 2|" "4|--grid 2x2 --txt-len 4 --tp 2 --ring 2|" \
           "4|--grid 2x2 --txt-len 4 --ulysses 2 --ring 2|" "2|--grid 2x4 --txt-len 8 --ring 2 --ring-rotate p2p|base2,centred"; do
    IFS='|' read -r n args conv <<<"$L"
    # shellcheck disable=SC2086
    out=$(run "$conv" "$n" $args --lse-layout $lay); rc=$?
    if [ $rc -eq 0 ] && grep -q "^flux-sim --check: OK" <<<"$out"; then ok "S_local == H: --lse-layout $lay $args ${conv:+(reported $conv)}: --check OK"
    else bad "S_local == H: --lse-layout $lay $args $conv: exit $rc"; grep -E "DIVERGED|error" <<<"$out" | head -3; fi
  done
done
# 3. the injections, caught where they live: convention | ranks | options | ranks pattern
CAUGHT=(
  "|2|$G --ring 2 --inject lse-base2|held by rank(s) 0;"
  "base2|3|$G --ring 3 --ring-rotate p2p --inject lse-base2|held by rank(s)"
  "|4|$G --ulysses 2 --ring 2 --inject lse-base2|held by rank(s)"
  "centred|2|$G --ring 2 --inject lse-shard-offset|held by rank(s) 1;"
  "|2|$G --ring 2 --inject lse-shard-offset|held by rank(s) 1;"
  "centred|4|$G --tp 2 --ring 2 --inject lse-shard-offset|held by rank(s)"
  "|2|--grid 2x4 --txt-len 8 --ring 2 --inject lse-layout-guessed|held by rank(s) 1;"
  "|2|--grid 2x4 --txt-len 8 --ring 2 --lse-layout bsh --inject lse-layout-guessed|held by rank(s) 1;"
  "|4|--grid 2x2 --txt-len 4 --tp 2 --ring 2 --inject lse-layout-guessed|held by rank(s)"
)
for c in "${CAUGHT[@]}"; do
  IFS='|' read -r conv n opts ranks <<<"$c"
  # shellcheck disable=SC2086
  out=$(run "$conv" "$n" $opts); rc=$?
  if [ $rc -eq 1 ] && grep -qxF "flux-sim --check: DIVERGED at step 0, transformer_blocks.0.attn.to_out.0" <<<"$out" &&
     grep -qF "$ranks" <<<"$out"; then ok "${conv:+reported $conv, }$opts: caught at step 0 transformer_blocks.0.attn.to_out.0 ($ranks)"
  else bad "${conv:+reported $conv, }$opts: exit $rc, want step 0 transformer_blocks.0.attn.to_out.0 '$ranks'"
       grep -E "DIVERGED|held by|error" <<<"$out" | head -3; fi
done
# 4. refused before any compute (exit 2, one line): ranks | options | kind | why
REFUSED=(
  "2|$G --tp 2 --inject lse-base2|cannot fire|there is no ring attention"
  "2|$G --ulysses 2 --inject lse-shard-offset|cannot fire|there is no ring attention"
  "2|$G --ulysses 2 --inject lse-layout-guessed|cannot fire|there is no ring attention"
  "2|$G --ring 2 --inject lse-layout-guessed|fires but cannot change anything|no rank's ring attention has as many query tokens as heads (S_local 25, 23; H = 8)"
  "4|--grid 2x4 --txt-len 8 --tp 2 --ring 2 --inject lse-layout-guessed|fires but cannot change anything|(S_local 8, 8; H = 4)"
)
for c in "${REFUSED[@]}"; do
  IFS='|' read -r n opts kind why <<<"$c"
  # shellcheck disable=SC2086
  out=$(run "" "$n" $opts); rc=$?
  if [ $rc -eq 2 ] && [ "$(grep -c "^flux-sim: error" <<<"$out")" = 1 ] && grep -F -- "$kind" <<<"$out" | grep -qF -- "$why" &&
     ! grep -q "check:" <<<"$out"; then ok "refused, exit 2: $opts ($kind)"
  else bad "$opts: exit $rc, want '$kind' '$why'"; grep flux-sim <<<"$out" | head -2; fi
done
# a convention the CPU backend cannot report: one line, exit 2
out=$(run "base3" 2 $G --ring 2); rc=$?
if [ $rc -eq 2 ] && grep -q "FLUX_SIM_LSE_CONVENTION: 'base3' is not e, base2 or centred" <<<"$out"; then ok "FLUX_SIM_LSE_CONVENTION=base3: refused, exit 2"
else bad "FLUX_SIM_LSE_CONVENTION=base3: exit $rc"; grep flux-sim <<<"$out" | head -2; fi
finish
