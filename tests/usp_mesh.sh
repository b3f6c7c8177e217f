#!/usr/bin/env bash
# USP with explicit groups (issue 20; docs/parallel.md §2, "Mesh order"; B5 of
# ../shared/field-bugs-2026.md). 1. --mesh-order ring-inner (yunchang's use_ulysses_low=False: a
# ring group is consecutive SP ranks, the Ulysses groups strided) reproduces the single-rank run
# under ulysses x ring, with TP, uneven shards, p2p rotation, replicated text, fp32/fp64/bf16,
# FLUX.1 and FLUX.2; its collectives run on other groups than ulysses-inner's (the dumps differ in
# rounding). 2. --mesh-order ulysses-inner is the default layout bit for bit. 3. a2a-world-group
# (B5, sglang#33353: the Ulysses all-to-all over the whole SP group when ring > 1) is caught at
# step 0 in the attention's output under both orders; 4. refused where it cannot fire.
. "$(dirname "$0")/lib.sh"
run() {
  local n=$1; shift
  timeout 300 mpirun -np "$n" "$SIM" --steps 1 --check -q "$@" </dev/null 2>&1
}
G="--grid 5x7 --txt-len 13"
LAYOUTS=(
  "4|--ulysses 2 --ring 2 $G|fp32"
  "4|--ulysses 2 --ring 2 $G --ring-rotate p2p|fp64"
  "4|--ulysses 2 --ring 2 --text replicated --joint rear $G|bf16"
  "8|--tp 2 --ulysses 2 --ring 2 $G|fp32"
  "4|--config odd --ulysses 2 --ring 2|fp32"
  "4|--config flux2-default --ulysses 2 --ring 2 $G|bf16"
)
for L in "${LAYOUTS[@]}"; do
  IFS='|' read -r n args prec <<<"$L"
  # shellcheck disable=SC2086
  out=$(run "$n" --mesh-order ring-inner $args --precision $prec); rc=$?
  if [ $rc -eq 0 ] && grep -q "^flux-sim --check: OK — .*, ring inner reproduces" <<<"$out"; then
    ok "--mesh-order ring-inner $args $prec: --check OK"
  else bad "--mesh-order ring-inner $args $prec: exit $rc"; grep -E "DIVERGED|error|held" <<<"$out" | head -4; fi
done

# 2. the default order bit for bit; ring-inner on other groups (other merge and exchange orders)
tmpdir usp_mesh
dump() { timeout 300 mpirun -np 4 "$SIM" --steps 1 -q --ulysses 2 --ring 2 $G "$@" </dev/null >/dev/null 2>&1; }
dump --dump "$T/default.h5" && dump --mesh-order ulysses-inner --dump "$T/uly.h5" && dump --mesh-order ring-inner --dump "$T/ring.h5"
if "$ORACLE" diff --rtol 0 --atol 0 --mtol 0 "$T/default.h5" "$T/uly.h5" >/dev/null 2>&1; then ok "--mesh-order ulysses-inner: bit-identical to the default"
else bad "--mesh-order ulysses-inner differs from the default layout"; fi
"$ORACLE" diff --rtol 0 --atol 0 --mtol 0 "$T/default.h5" "$T/ring.h5" >/dev/null 2>&1; rc=$?
if [ $rc -eq 1 ] && "$ORACLE" diff "$T/default.h5" "$T/ring.h5" >/dev/null 2>&1; then
  ok "--mesh-order ring-inner: other groups (not bit-identical to ulysses-inner), within tolerance of it"
else bad "--mesh-order ring-inner vs ulysses-inner: exit $rc (want 1 at tolerance 0, 0 at the default tolerance)"; fi

# 3. the bug, caught at step 0 in the first attention output
A1=transformer_blocks.0.attn.to_out.0
CAUGHT=(
  "4|--ulysses 2 --ring 2|$A1"
  "4|--ulysses 2 --ring 2 --mesh-order ring-inner $G --ring-rotate p2p|$A1"
  "4|--config flux2-default --ulysses 2 --ring 2 --precision bf16|transformer_blocks.0.attn.to_add_out"
)
expect_caught "--inject a2a-world-group" "${CAUGHT[@]}"

# 4. refusals (exit 2, one line)
REFUSED=(
  "2|--ulysses 2 --inject a2a-world-group|there is no ring attention"
  "4|--ulysses 2 --ring 2 --text replicated --inject a2a-world-group|the text is replicated"
  "4|--config odd --ulysses 2 --ring 2 --inject a2a-world-group|the local heads do not divide by ulysses·ring"
  "1|--mesh-order ring-outer|--mesh-order: 'ring-outer' is not ulysses-inner or ring-inner"
)
expect_refusals "${REFUSED[@]}"
finish
