#!/usr/bin/env bash
# Text placement under sequence parallelism (issue 20; docs/parallel.md §3.9, "Text placement";
# B2-B4, B6, B7 of ../shared/field-bugs-2026.md). 1. --text replicated (every SP rank holds all
# text tokens, image tokens sharded; the text K/V join at one ring step, --joint front|rear; under
# Ulysses the text heads are sliced locally) reproduces the single-rank run under ring, Ulysses,
# USP and TP combinations, uneven shards, a rank without image tokens, fp32/fp64/bf16, FLUX.1
# (default, odd) and FLUX.2 (whose text positions must follow the placement). 2. --text sharded is
# today's layout, bit for bit. 3. The ring ranks' text copies are judged one by one (a NaN in one
# ring rank's copy is caught and named). 4. replicated-text-rotated (B4), joint-kv-wrong-step
# (B2/B3) and replicated-kv-a2a (B6/B7) are caught at step 0 in the attention's output;
# 5. refused where they cannot fire. One step per run.
. "$(dirname "$0")/lib.sh"
run() {
  local n=$1; shift
  timeout 300 mpirun -np "$n" "$SIM" --steps 1 --check -q "$@" </dev/null 2>&1
}
G="--grid 5x7 --txt-len 13" # 35 image + 13 text tokens: uneven shards
F2="--config flux2-default"
# 1. the layout matrix: ranks | options | precision
LAYOUTS=(
  "2|--ring 2|fp32"
  "2|--ring 2 --joint rear --ring-rotate p2p|fp64"
  "2|--ulysses 2 --joint rear|bf16"
  "3|--ring 3 $G|fp32"
  "3|--ring 3 --grid 1x2 --txt-len 4 --joint rear|fp32"
  "4|--ulysses 2 --ring 2 $G --joint rear|fp32"
  "4|--ulysses 2 --ring 2 --ring-rotate p2p --batch 2|fp64"
  "4|--tp 2 --ring 2 $G|bf16"
  "4|--tp 2 --ulysses 2|fp64"
  "2|--config odd --ring 2 $G|fp32"
  "4|--config odd --ulysses 2 --ring 2 --joint rear|bf16"
  "2|$F2 --ring 2 $G|fp32"
  "2|$F2 --ulysses 2 $G --joint rear|fp64"
  "4|$F2 --ulysses 2 --ring 2 --ring-rotate p2p|bf16"
  "4|$F2 --tp 2 --ring 2 --joint rear|fp32"
)
for L in "${LAYOUTS[@]}"; do
  IFS='|' read -r n args prec <<<"$L"
  # shellcheck disable=SC2086
  out=$(run "$n" --text replicated $args --precision $prec); rc=$?
  if [ $rc -eq 0 ] && grep -q "^flux-sim --check: OK — .*, text replicated (joint" <<<"$out"; then
    ok "--text replicated $args $prec: --check OK"
  else bad "--text replicated $args $prec: exit $rc"; grep -E "DIVERGED|error|held" <<<"$out" | head -4; fi
done

# 2. --text sharded is the default layout: the same dump bit for bit
tmpdir text_layouts
same_as_default "--text sharded" "2|--ring 2 $G" "4|$F2 --ulysses 2 --ring 2"

# 3. each ring rank's text copy is its own computation, judged on its own: a NaN in ring rank 1's
#    copy of to_add_out (rank 0's is right) is caught there, and the report says which copy
out=$(run 2 --text replicated --ring 2 --inject nan-rank:1:transformer_blocks.0.attn.to_add_out:0); rc=$?
if [ $rc -eq 1 ] && grep -qxF "flux-sim --check: DIVERGED at step 0, transformer_blocks.0.attn.to_add_out" <<<"$out" &&
   grep -q "copy 1 of the elements computed more than once (--text replicated: ring rank 1's own text)" <<<"$out"; then
  ok "ring rank 1's text copy with a NaN: caught at to_add_out, copy 1 named"
else bad "ring rank 1's text copy with a NaN: exit $rc"; head -8 <<<"$out"; fi

# 4. the bugs, caught at step 0 in the attention's output (FLUX.1: to_out.0 first; FLUX.2
#    to_add_out): ranks | options | module
A1=transformer_blocks.0.attn.to_out.0 A2=transformer_blocks.0.attn.to_add_out
CAUGHT=(
  "2|--ring 2 --inject replicated-text-rotated|$A1"
  "4|--tp 2 --ring 2 $G --precision bf16 --inject replicated-text-rotated|$A1"
  "2|$F2 --ring 2 --ring-rotate p2p --inject replicated-text-rotated|$A2"
  "2|--ring 2 --joint rear --inject joint-kv-wrong-step|$A1"
  "4|--ulysses 2 --ring 2 $G --ring-rotate p2p --inject joint-kv-wrong-step|$A1"
  "2|$F2 --ring 2 --precision fp64 --inject joint-kv-wrong-step|$A2"
  "2|--ulysses 2 --inject replicated-kv-a2a|$A1"
  "4|--config odd --ulysses 2 --ring 2 $G --inject replicated-kv-a2a|$A1"
  "2|$F2 --ulysses 2 --precision bf16 --inject replicated-kv-a2a|$A2"
)
expect_caught "--text replicated" "${CAUGHT[@]}"

# 5. refused where they cannot fire (exit 2, one line naming the cause), and the options' errors
REFUSED=(
  "4|--text replicated --ulysses 2 --ring 2 --inject replicated-text-rotated|--ulysses >= 2 a dispatch keyed on the Ulysses degree"
  "2|--ring 2 --inject joint-kv-wrong-step|the text is not replicated"
  "2|--text replicated --ring 2 --inject replicated-kv-a2a|there is no Ulysses all-to-all"
  "2|--tp 2 --text replicated --inject joint-kv-wrong-step|there is no ring attention"
  "1|--joint rear|add --text replicated"
  "1|--text both|--text: 'both' is not sharded or replicated"
  "1|--text replicated --joint middle|--joint: 'middle' is not front or rear"
)
expect_refusals "${REFUSED[@]}"
finish
