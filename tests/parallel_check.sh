#!/usr/bin/env bash
# Every parallel layout that fits 1-4 ranks, on both diffusers reference configs (tiny: 4 heads,
# 64+16 tokens; odd: 6 heads, 35+13 tokens, B=2 — uneven on purpose), in fp32 and fp64:
#   * mpirun -np N flux-sim --check passes (the layout reproduces the single-rank run; fp32 at the
#     default tolerance, fp64 at --rtol 1e-13 --rtol-max 1e-12: see FP64_RTOL below), and
#   * the parallel run's global dump matches diffusers' dump_fp64.h5 within the conformance bound
#     (1e-4 fp32, 1e-10 fp64 relative L2 per dataset), i.e. as well as the single-rank run does;
#   * the list below says, per config, which layouts must run and which must be refused: a layout
#     that must run and is refused fails the test, and a refusal must be exactly the expected
#     line (exit 2, one flux-sim line naming the heads and the layouts that can run);
#   * the seed's TP-1 bug (plain rowwise on single-block proj_out) exits 1 at step 0,
#     single_transformer_blocks.0.proj_out.
. "$(dirname "$0")/lib.sh"
ref=${FLUX_REFERENCE_DIR:-../shared/reference}
tmpdir par
if [ ! -d "$ref/tiny" ]; then
  skip_all "parallel layout matrix: $ref not found — these tests did NOT run"
fi
# ranks | layout | tiny (4 heads) | odd (6 heads): "run", or "refuse" when tp·ulysses does not
# divide the heads (each rank must own whole heads)
LAYOUTS=(
  "2|--tp 2|run|run"                      "3|--tp 3|refuse|run"
  "2|--ulysses 2|run|run"                 "3|--ulysses 3|refuse|run"
  "2|--ring 2|run|run"                    "2|--ring 2 --ring-rotate p2p|run|run"
  "3|--ring 3|run|run"                    "3|--ring 3 --ring-rotate p2p|run|run"
  "4|--ring 4|run|run"                    "4|--ring 4 --ring-rotate p2p|run|run"
  "4|--ulysses 2 --ring 2|run|run"        "4|--tp 2 --ring 2|run|run"
  "4|--tp 2 --ulysses 2|run|refuse"
)
# the exact refusal (fs_par_init): "<cfg>|<ranks>|<layout>" -> the one line on stderr
refusal() {
  case "$1" in
    "tiny|3|--tp 3") echo "flux-sim: error: layout tp 3 x ulysses 1 x ring 1 cannot run this model: 4 heads are not divisible by tp·ulysses = 3 (each rank must own whole heads); layouts that can: --tp 1 --ulysses 1 --ring 3";;
    "tiny|3|--ulysses 3") echo "flux-sim: error: layout tp 1 x ulysses 3 x ring 1 cannot run this model: 4 heads are not divisible by tp·ulysses = 3 (each rank must own whole heads); layouts that can: --tp 1 --ulysses 1 --ring 3";;
    "odd|4|--tp 2 --ulysses 2") echo "flux-sim: error: layout tp 2 x ulysses 2 x ring 1 cannot run this model: 6 heads are not divisible by tp·ulysses = 4 (each rank must own whole heads); layouts that can: --tp 1 --ulysses 1 --ring 4; --tp 1 --ulysses 2 --ring 2; --tp 2 --ulysses 1 --ring 2";;
    *) echo "(no refusal expected for $1)";;
  esac
}
compare() { # our dump, reference dump, bound
  $PY - "$@" <<'PY'
import sys, json, h5py, numpy as np
ours, ref, bound = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), float(sys.argv[3])
par = json.loads(ours.attrs["parallel"])
worst, n = 0.0, 0
for step in [k for k in ref if k.startswith("step_")]:
    for name in ref[step].attrs["order"]:
        a, b = ours[step][name][()], ref[step][name][()]
        r = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)
        if not (r <= bound): print(f"   {step}/{name}: rel L2 {r:.3g} > {bound:g}"); sys.exit(1)
        worst = max(worst, r); n += 1
r = np.linalg.norm(ours["final/latents"][()] - ref["final/latents"][()]) / np.linalg.norm(ref["final/latents"][()])
assert r <= bound, r
assert "sharding" in par and par["world"] >= 2, par.keys()
print(f"   dump vs diffusers fp64: {n} datasets, worst {worst:.2e}, final {r:.2e}; {len(par['sharding'])} sharding entries")
if len(sys.argv) > 4: open(sys.argv[4], "a").write(f"{max(worst, r):.17g}\n")
PY
}
# make sanitize runs the layout matrix in fp64 only (FLUX_PARCHECK_PRECISIONS=fp64): under ASan
# the full matrix takes ~10 minutes, and the fp32 kernels run in inject_check.sh and the
# conformance tests there
precisions=${FLUX_PARCHECK_PRECISIONS:-fp32 fp64}
for p in fp32 fp64; do
  [[ " $precisions " == *" $p "* ]] || skip "the $p layout matrix (FLUX_PARCHECK_PRECISIONS=$precisions) — it did NOT run"
done
# fp64 --check tolerance of this matrix. A correct layout only reorders float64 sums, so the
# layout-vs-single-rank difference is rounding: measured worst over the whole matrix (both
# configs, the 23 fp64 layouts that run) relative L2 1.10e-15 (tiny --tp 2, tiny --tp 2 --ring 2;
# 2026-11-23, at 84e6df1) and max|Δ|/max|ref| < 3e-15 (docs/parallel.md §5.3). The bounds
# leave ~100x (rtol 1e-13) and > 300x (rtol-max 1e-12) for other BLAS builds and thread counts,
# instead of flux-sim's general 1e-10 / 1e-9, which would let a bug of 1e-11 through here; a real
# layout bug (a wrong shard, a missing LSE term) is >= 1e-3. The test prints the measured worst.
FP64_RTOL=1e-13
FP64_RTOL_MAX=1e-12
: >"$T/fp64-worst"; : >"$T/fp64-check"
for cfg in tiny odd; do
  col=3; [ $cfg = odd ] && col=4
  for prec in $precisions; do
    bound=1e-4; tol=(); [ $prec = fp64 ] && bound=1e-10 && tol=(--rtol $FP64_RTOL --rtol-max $FP64_RTOL_MAX)
    for L in "${LAYOUTS[@]}"; do
      IFS='|' read -r n args tiny_want odd_want <<<"$L"
      want=$tiny_want; [ $cfg = odd ] && want=$odd_want
      tag="$cfg $prec np=$n $args (must $want)"
      out="$T/$cfg-$prec-$n-${args// /_}.h5"
      timeout 300 mpirun -np "$n" "$SIM" --weights "$ref/$cfg/weights.safetensors" --inputs "$ref/$cfg/dump_fp64.h5" \
        --precision $prec $args "${tol[@]}" --check --dump "$out" </dev/null >"$T/log" 2>&1; rc=$?
      if [ "$want" = refuse ]; then
        expect=$(refusal "$cfg|$n|$args")
        nmsg=$(grep -c "^flux-sim: " "$T/log")
        if [ $rc -eq 2 ] && [ "$nmsg" -eq 1 ] && grep -qFx "$expect" "$T/log" && [ ! -e "$out" ]; then
          ok "$tag: refused with exit 2 and exactly: ${expect#flux-sim: error: }"
        else
          bad "$tag: expected exit 2 and the line '$expect'; got exit $rc, $nmsg flux-sim lines:"; grep "^flux-sim" "$T/log" | head -3
        fi
        continue
      fi
      if [ $rc -ne 0 ]; then bad "$tag: exit $rc"; grep -E "DIVERGED|error|Δ|pieces" "$T/log" | head -5; continue; fi
      line=$(grep -o "worst relative L2 [^ ]*" "$T/log")
      worstfile=/dev/null; [ $prec = fp64 ] && worstfile="$T/fp64-worst" && echo "${line##* } $cfg $args" >>"$T/fp64-check"
      if compare "$out" "$ref/$cfg/dump_fp64.h5" $bound "$worstfile" >"$T/cmp" 2>&1; then ok "$tag: --check OK ($line);$(cat "$T/cmp")"
      else bad "$tag: parallel dump vs reference"; cat "$T/cmp"; fi
      rm -f "$out"
    done
  done
done
if [ -s "$T/fp64-check" ]; then
  echo "   fp64 over the matrix ($(wc -l <"$T/fp64-check") layouts): --check worst relative L2 $(sort -g "$T/fp64-check" | tail -1) (tolerance $FP64_RTOL); dump vs diffusers worst $(sort -g "$T/fp64-worst" | tail -1 | xargs printf '%.3g') (bound 1e-10)"
fi

# the seed's TP-1 bug as a user plan
"$SIM" --print-plan | sed -E 's/^(single_transformer_blocks\.\*\.proj_out +)packed_rowwise +D,4D/\1rowwise/' >"$T/tp1.plan"
grep -qE "proj_out +rowwise$" "$T/tp1.plan" || bad "could not build the TP-1 plan"
for cfg in tiny odd; do
  n=2
  timeout 300 mpirun -np $n "$SIM" --weights "$ref/$cfg/weights.safetensors" --inputs "$ref/$cfg/dump_fp64.h5" --tp 2 \
    --plan "$T/tp1.plan" --check >"$T/log" 2>&1; rc=$?
  if [ $rc -eq 1 ] && grep -q "DIVERGED at step 0, single_transformer_blocks.0.proj_out$" "$T/log"; then
    ok "$cfg: TP-1 plan (rowwise proj_out) → exit 1 at step 0, single_transformer_blocks.0.proj_out"
  else bad "$cfg: TP-1 plan: exit $rc"; head -20 "$T/log"; fi
done
# --dump-per-rank: every rank's local view, reassembled from its own `sharding` map, equals the
# global dump of the same run, bit for bit (and replicated copies are identical across ranks)
timeout 300 mpirun -np 4 "$SIM" --weights "$ref/odd/weights.safetensors" --inputs "$ref/odd/dump_fp64.h5" --tp 2 --ring 2 -q \
  --dump "$T/global.h5" --dump-per-rank "$T/ranks" >"$T/log" 2>&1 || bad "per-rank dump run failed: $(tail -2 "$T/log")"
if $PY - "$T/global.h5" "$T/ranks" <<'PY'
import sys, json, h5py, numpy as np
g = h5py.File(sys.argv[1], "r")
ranks = [h5py.File(f"{sys.argv[2]}/rank_{r}.h5", "r") for r in range(4)]
pars = [json.loads(f.attrs["parallel"]) for f in ranks]
assert [p["rank"] for p in pars] == [0, 1, 2, 3]
shard = pars[0]["sharding"]
n = 0
for step in [k for k in g if k.startswith("step_")]:
    for name in g[step].attrs["order"]:
        want = g[step][name][()]
        spec = shard[name]
        for r, f in enumerate(ranks):
            local = f[step][name][()]
            if spec == "replicated":
                assert np.array_equal(local, want), (step, name, r)
                continue
            dims = spec["dims"] if "dims" in spec else [spec]
            idx = [slice(None)] * want.ndim
            for d in dims:
                idx[d["dim"]] = np.concatenate([np.arange(a, b) for a, b in d["ranges"][r]])
            sel = want[np.ix_(*[np.arange(want.shape[k]) if isinstance(i, slice) else i for k, i in enumerate(idx)])]
            assert np.array_equal(local, sel), (step, name, r)
        n += 1
print(f"   {n} datasets x 4 ranks reassemble exactly")
PY
then ok "--dump-per-rank (odd, tp 2 x ring 2): local views + sharding map == global dump"; else bad "--dump-per-rank"; fi
# that run had no --check, so every rank (rank 0 too) ran on its TP weight shard only
if compare "$T/global.h5" "$ref/odd/dump_fp64.h5" 1e-4 >"$T/cmp" 2>&1; then ok "all ranks on weight shards (no --check): dump vs diffusers$(cat "$T/cmp")"
else bad "sharded-weights run vs reference"; cat "$T/cmp"; fi
finish
