#!/usr/bin/env bash
# Padding layouts (issue 20; docs/parallel.md §3.10; B11-B13 of ../shared/field-bugs-2026.md).
# 1. --pad mask (each stream split in torch.chunk's ceil-sized chunks, every exchanged block and
# ring chunk padded with zero tokens to the longest, the pad keys masked out) reproduces the
# single-rank run under ring, Ulysses, USP, TP, replicated text, both mesh orders, fp32/fp64/bf16,
# FLUX.1 and FLUX.2; with lengths that divide it is the default layout bit for bit. 2. --pad nomask
# (vllm-omni's mask_sp_padding=False) is measured, not judged: --check exits 0 with a MEASURED
# report, one line per module with its error against the exact run (non-zero where something is
# padded, at rounding level where nothing is), and still fails on a NaN. 3. shard-floor-drop (B11)
# and pad-mask-ignored (B12) are caught at step 0; 4. refused where they cannot fire.
. "$(dirname "$0")/lib.sh"
run() {
  local n=$1; shift
  timeout 300 mpirun -np "$n" "$SIM" --steps 1 --check -q "$@" </dev/null 2>&1
}
G="--grid 5x7 --txt-len 13"
F2="--config flux2-default"
LAYOUTS=(
  "2|--ring 2 $G|fp32"
  "2|--ulysses 2 $G|bf16"
  "4|--ulysses 2 --ring 2 $G --ring-rotate p2p|fp64"
  "4|--ulysses 2 --ring 2 $G --mesh-order ring-inner|fp32"
  "3|--ring 3 $G --text replicated --joint rear|fp32"
  "4|--ulysses 2 --ring 2 $G --text replicated --batch 2|bf16"
  "4|--tp 2 --ring 2 $G|fp32"
  "2|--config odd --ring 2|fp64"
  "2|$F2 --ulysses 2 $G|fp32"
  "4|$F2 --ulysses 2 --ring 2 $G|bf16"
)
for L in "${LAYOUTS[@]}"; do
  IFS='|' read -r n args prec <<<"$L"
  # shellcheck disable=SC2086
  out=$(run "$n" --pad mask $args --precision $prec); rc=$?
  if [ $rc -eq 0 ] && grep -q "^flux-sim --check: OK — .*, padded with a key mask" <<<"$out"; then ok "--pad mask $args $prec: --check OK"
  else bad "--pad mask $args $prec: exit $rc"; grep -E "DIVERGED|error|held" <<<"$out" | head -4; fi
done
# nothing to pad (16x16 + 32 over 2 and 4): the default layout bit for bit
tmpdir pad_layouts
same_as_default "--pad mask" "2|--ring 2" "4|--ulysses 2 --ring 2"

# 2. --pad nomask: measured. The worst relative L2 of the MEASURED line: > 1e-3 with 2 pad tokens
#    a rank (5x7 + 13 over ring 2), < 1e-5 with none (16x16 + 32); one line per module
measured_worst() { sed -n 's/^flux-sim --check: MEASURED .* worst relative L2 \([0-9.e+-]*\) (.*/\1/p' <<<"$1"; }
for L in "2|--ring 2 $G|big" "2|--ulysses 2 $G|big" "4|--ulysses 2 --ring 2 $G --text replicated|big" "2|--ring 2|small"; do
  IFS='|' read -r n args want <<<"$L"
  # shellcheck disable=SC2086
  out=$(run "$n" --pad nomask $args); rc=$?
  w=$(measured_worst "$out"); nmod=$(grep -c '^    [a-z_]' <<<"$out")
  if [ $rc -eq 0 ] && [ -n "$w" ] && [ "$nmod" -ge 100 ] && grep -q "a property of the layout, not a bug" <<<"$out" &&
     $PY -c "import sys; w=float('$w'); sys.exit(0 if (w > 1e-3 if '$want' == 'big' else w < 1e-5) else 1)"; then
    ok "--pad nomask $args: exit 0, MEASURED, worst relative L2 $w, $nmod modules listed"
  else bad "--pad nomask $args: exit $rc, worst '$w', $nmod module lines (want $want)"; head -3 <<<"$out"; fi
done
out=$(run 2 --pad nomask --ring 2 $G --inject nan-rank:1:transformer_blocks.0.attn.to_k:0); rc=$?
if [ $rc -eq 1 ] && grep -qxF "flux-sim --check: DIVERGED at step 0, transformer_blocks.0.attn.to_k" <<<"$out"; then
  ok "--pad nomask: a NaN is still a divergence (exit 1)"
else bad "--pad nomask with a NaN: exit $rc"; head -3 <<<"$out"; fi

# 3. the bugs, caught at step 0
A1=transformer_blocks.0.attn.to_out.0
CAUGHT=(
  "2|--ring 2 $G --inject shard-floor-drop|latents_in|shape: parallel run assembles [1, 34, 64], single-rank reference has [1, 35, 64]"
  "4|--ulysses 2 --ring 2 --grid 5x5 --txt-len 13 --inject shard-floor-drop|latents_in|shape: parallel run assembles [1, 24, 64]"
  "2|--ulysses 2 $G --text replicated --inject shard-floor-drop|latents_in|shape: parallel run assembles [1, 34, 64]"
  "2|--ring 2 $G --pad mask --inject pad-mask-ignored|$A1|held by rank(s)"
  "2|--ulysses 2 $G --pad mask --precision bf16 --inject pad-mask-ignored|$A1|held by rank(s)"
  "4|--ulysses 2 --ring 2 $G --pad mask --ring-rotate p2p --inject pad-mask-ignored|$A1|held by rank(s)"
  "2|$F2 --ring 2 $G --pad mask --inject pad-mask-ignored|transformer_blocks.0.attn.to_add_out|held by rank(s)"
)
expect_caught "" "${CAUGHT[@]}"

# 4. refusals (exit 2, one line)
REFUSED=(
  "2|--ring 2 $G --inject pad-mask-ignored|there is no mask to drop"
  "2|--ring 2 $G --pad nomask --inject pad-mask-ignored|there is no mask to drop"
  "2|--ring 2 --pad mask --inject pad-mask-ignored|divide evenly over the 2 sequence-parallel ranks"
  "2|--ring 2 --inject shard-floor-drop|divide evenly over the 2 sequence-parallel ranks"
  "2|--tp 2 $G --inject shard-floor-drop|the sequence is not split"
  "2|--ring 2 $G --pad mask --inject seq-uneven-chunk|the layout pads already (--pad)"
  "2|--ulysses 2 $G --pad nomask --inject ulysses-uneven-chunk|the layout pads already (--pad)"
  "1|--pad zero|--pad: 'zero' is not mask or nomask"
)
expect_refusals "${REFUSED[@]}"
finish
