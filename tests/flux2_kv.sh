#!/usr/bin/env bash
# FLUX.2's KV cache for reference images (issue 19): diffusers' Flux2KleinKVPipeline runs step 0
# with kv_cache_mode "extract" on [reference; noise] (the reference tokens modulated at timestep 0,
# attending only to themselves, their K/V after RoPE stored per block) and the later steps
# "cached" (the stored K/V between the text's and the image's). flux-sim --ref-grid / an
# /inputs/image_latents replay against the REAL diffusers 0.42.1 (its Flux2KVAttnProcessor and
# Flux2KVParallelSelfAttnProcessor, run by tests/peer_diffusers.py --kv in the peer venv), on the
# flux2-tiny reference weights, 3 steps:
#   1. fp64 (diffusers with the reference's float32 islands promoted): flux-oracle diff PASS at the
#      fp64 bound (1e-10), worst relative L2 printed;
#   2. fp32: PASS at the fp32 bound, and flux-sim's fp32 within 1e-4 (relative L2, every module,
#      every step) of diffusers' fp64, the conformance bound;
#   3. bf16 (torch's CPU bf16 kernels): the documented verdict `diff RUN SIM_BF16 --truth MATCHED`;
#   4. the names: step 0 records the reference embedding's second calls (time_guidance_embed@1,
#      time_proj@2/@3, double_stream_modulation_img@1, single_stream_modulation@1) as diffusers'
#      hooks do, step 1 none of them;
#   4b. two reference images (--ref-grid 2x3,1x2: ids at t = 10 and 20, as _prepare_image_ids makes
#      them): diffusers' fp64 run against flux-sim's replay, PASS at the fp64 bound;
#   5. layouts: --tp 2, --tp 4, --ulysses 2, --tp 2 x --ulysses 2 and an uneven --ulysses 2 --check
#      OK at fp64 1e-13 and their global dumps equal the single-rank one; fp32 and bf16 --ulysses 2
#      --check OK; --ring 2, --dump-per-rank under Ulysses, true CFG, FLUX.1, --text replicated and
#      --pad refused up front
#      (exit 2, one line), and a Ulysses degree that leaves rank 0 only reference tokens.
# Without the peer venv parts 1-4 are SKIPPED loudly; part 5 runs.
. "$(dirname "$0")/lib.sh"
VENV=${FLUX_PEER_VENV:-.venv-peer}
VPY=$VENV/bin/python
W=$REF/flux2-tiny/weights.safetensors
[ -f "$W" ] || skip_all "flux2_kv: $REF/flux2-tiny missing — the KV cache was NOT checked"
tmpdir kv
ROOT=$PWD
export OMP_NUM_THREADS=1 PYTHONPATH=$ROOT/python PYTHONWARNINGS=ignore
cp "$REF/flux2-tiny/config.json" "$W" "$T/"

# the inputs: a 3x4 image, 5 text tokens, a 2x3 reference image, 3 steps (fp32, as a pipeline's)
"$SIM" --weights "$T/weights.safetensors" --config "$T/config.json" --grid 3x4 --txt-len 5 --ref-grid 2x3 --steps 3 \
  --dump "$T/in.h5" -q </dev/null >"$T/in.log" 2>&1 || { bad "flux-sim --ref-grid: $(tail -1 "$T/in.log")"; finish; }
n=$("$PY" -c "import h5py; f = h5py.File('$T/in.h5'); print(f['inputs/image_latents'].shape, f['inputs/image_latent_ids'][0].tolist())")
[ "$n" = "(1, 6, 16) [10.0, 0.0, 0.0, 0.0]" ] && ok "/inputs/image_latents [1, 6, 16], image_latent_ids from (10, 0, 0, 0)" ||
  bad "the reference inputs: $n"

replay() { timeout 300 "$SIM" --weights "$T/weights.safetensors" --inputs "$1" --dump "$2" -q "${@:3}" </dev/null >"$2.log" 2>&1; }
worst() { # worst A B: the worst relative L2 of B against A over every common dataset of every step, and where
  "$PY" - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
w, at, n = 0.0, "", 0
for s in a:
    if not s.startswith("step_"):
        continue
    for k in a[s]:
        x = a[s][k][...].astype(np.float64); y = b[s][k][...].astype(np.float64)
        r = np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-300); n += 1
        if r > w:
            w, at = r, f"{s}/{k}"
print(f"{w:.3g} {n} {at}")
PY
}

if [ ! -x "$VPY" ] || [ ! -f "$VENV/peer-stamp" ]; then
  skip "no peer venv at $VENV (tools/install-peer.sh): diffusers' KV cache was NOT run — parts 1-4 did NOT run"
else
  ok=1
  for p in fp64 fp32 bf16; do
    fl=(); [ $p = fp64 ] && fl=(--fp64); [ $p = bf16 ] && fl=(--bf16)
    timeout 300 "$VPY" tests/peer_diffusers.py flux2 "$T" "$T/d$p.h5" --kv --steps 3 --inputs "$T/in.h5" "${fl[@]}" \
      >"$T/d$p.log" 2>&1 || { bad "diffusers --kv $p: $(tail -3 "$T/d$p.log")"; ok=0; }
  done
  if [ $ok = 1 ]; then
    # 1. fp64
    if replay "$T/dfp64.h5" "$T/s64.h5" --precision fp64 && out=$("$ORACLE" diff "$T/dfp64.h5" "$T/s64.h5" -q 2>&1) &&
       grep -q '^PASS' <<<"$out"; then ok "fp64 vs diffusers' KV pipeline (worst rel L2 $(worst "$T/dfp64.h5" "$T/s64.h5" | cut -d' ' -f1,3)): $out"
    else bad "fp64 KV vs diffusers: ${out:-$(tail -2 "$T/s64.h5.log")}"; fi
    # 2. fp32
    if replay "$T/dfp32.h5" "$T/s32.h5" && out=$("$ORACLE" diff "$T/dfp32.h5" "$T/s32.h5" -q 2>&1) && grep -q '^PASS' <<<"$out"; then
      ok "fp32 vs diffusers' fp32 KV pipeline: $out"
    else bad "fp32 KV vs diffusers: ${out:-$(tail -2 "$T/s32.h5.log")}"; fi
    replay "$T/dfp64.h5" "$T/s32b.h5" --precision fp32
    read -r w n at < <(worst "$T/dfp64.h5" "$T/s32b.h5")
    if [ "${n:-0}" -gt 300 ] && awk -v w="$w" 'BEGIN { exit !(w <= 1e-4) }'; then
      ok "flux-sim fp32 vs diffusers fp64: worst rel L2 $w over $n datasets ($at) <= 1e-4"
    else bad "flux-sim fp32 vs diffusers fp64: worst rel L2 ${w:-?} over ${n:-0} datasets ($at)"; fi
    # 3. bf16: diffusers' bf16 run judged against ours with the matched float64 truth
    if replay "$T/dbf16.h5" "$T/s16.h5" --precision bf16 && replay "$T/dbf16.h5" "$T/m16.h5" --precision fp64 --match bf16 &&
       out=$("$ORACLE" diff "$T/dbf16.h5" "$T/s16.h5" --truth "$T/m16.h5" -q 2>&1) && grep -q '^PASS' <<<"$out"; then
      ok "bf16: diffusers' KV run passes 'flux-oracle diff RUN SIM_BF16 --truth MATCHED': $out"
    else bad "bf16 KV verdict: ${out:-$(tail -2 "$T/s16.h5.log")}"; fi
    # 4. names
    n=$(attr() { "$PY" -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r'); print(eval(sys.argv[2]))" "$@"; }
        attr "$T/dfp64.h5" "[sum(1 for x in f[s].attrs['order'] if (x.decode() if isinstance(x, bytes) else x) in ('time_guidance_embed@1', 'time_guidance_embed.time_proj@2', 'time_guidance_embed.time_proj@3', 'double_stream_modulation_img@1', 'single_stream_modulation@1')) for s in ('step_0000', 'step_0001')]")
    [ "$n" = "[5, 0]" ] && ok "diffusers' hooks name the reference embedding's calls as flux-sim does (5 at step 0, none at step 1)" ||
      bad "reference embedding names in diffusers' dump: $n (want [5, 0])"
  fi
fi

# two reference images: the pipeline's ids (t = 10 + 10·i), diffusers on them, and a layout below
"$SIM" --weights "$T/weights.safetensors" --config "$T/config.json" --grid 3x4 --txt-len 5 --ref-grid 2x3,1x2 --steps 2 \
  --dump "$T/multi.h5" -q </dev/null >"$T/multi.log" 2>&1 || bad "--ref-grid 2x3,1x2: $(tail -1 "$T/multi.log")"
n=$("$PY" -c "import h5py; f = h5py.File('$T/multi.h5'); i = f['inputs/image_latent_ids'][...]; print(f['inputs/image_latents'].shape, i[0].tolist(), i[5].tolist(), i[6].tolist(), i[7].tolist())" 2>&1)
[ "$n" = "(1, 8, 16) [10.0, 0.0, 0.0, 0.0] [10.0, 1.0, 2.0, 0.0] [20.0, 0.0, 0.0, 0.0] [20.0, 0.0, 1.0, 0.0]" ] &&
  ok "--ref-grid 2x3,1x2: 8 reference tokens, image 0 at t = 10, image 1 at t = 20" || bad "two reference images' inputs: $n"
if [ -x "$VPY" ] && [ -f "$VENV/peer-stamp" ]; then
  if timeout 300 "$VPY" tests/peer_diffusers.py flux2 "$T" "$T/dmulti.h5" --kv --steps 2 --inputs "$T/multi.h5" --fp64 \
       >"$T/dmulti.log" 2>&1 && replay "$T/dmulti.h5" "$T/smulti.h5" --precision fp64 &&
     out=$("$ORACLE" diff "$T/dmulti.h5" "$T/smulti.h5" -q 2>&1) && grep -q '^PASS' <<<"$out"; then
    ok "two reference images (ids = diffusers' _prepare_image_ids), fp64 vs diffusers' KV pipeline (worst rel L2 $(worst "$T/dmulti.h5" "$T/smulti.h5" | cut -d' ' -f1,3)): $out"
  else bad "two reference images vs diffusers: ${out:-$(tail -2 "$T/dmulti.log" "$T/smulti.h5.log" 2>/dev/null)}"; fi
fi

# 5. layouts
"$SIM" --weights "$T/weights.safetensors" --inputs "$T/in.h5" --precision fp64 --dump "$T/one.h5" -q </dev/null >"$T/one.log" 2>&1 ||
  bad "single-rank fp64 KV run: $(tail -1 "$T/one.log")"
# an uneven split too: 3x3 image + 2x2 reference = 13 image-stream tokens at step 0, 9 later, 5 text
"$SIM" --weights "$T/weights.safetensors" --config "$T/config.json" --grid 3x3 --txt-len 5 --ref-grid 2x2 --steps 2 \
  --dump "$T/odd.h5" -q </dev/null >"$T/odd.log" 2>&1 || bad "uneven inputs: $(tail -1 "$T/odd.log")"
"$SIM" --weights "$T/weights.safetensors" --inputs "$T/odd.h5" --precision fp64 --dump "$T/odd1.h5" -q </dev/null >/dev/null 2>&1
"$SIM" --weights "$T/weights.safetensors" --inputs "$T/multi.h5" --precision fp64 --dump "$T/multi1.h5" -q </dev/null >/dev/null 2>&1
for L in "2|--tp 2|in|one" "4|--tp 4|in|one" "2|--ulysses 2|in|one" "4|--tp 2 --ulysses 2|in|one" "2|--ulysses 2|odd|odd1" \
         "2|--ulysses 2|multi|multi1" \
         "3|--tp 1 --ulysses 1 --ring 1 --tp 1|skip|skip"; do
  IFS='|' read -r np lay inp one <<<"$L"; [ "$inp" = skip ] && continue
  out=$(timeout 300 mpirun -np $np "$SIM" --weights "$T/weights.safetensors" --inputs "$T/$inp.h5" --precision fp64 $lay \
        --check --rtol 1e-13 --rtol-max 1e-12 --dump "$T/par.h5" </dev/null 2>&1)
  if grep -q "flux-sim --check: OK" <<<"$out" && d=$("$ORACLE" diff "$T/par.h5" "$T/$one.h5" --rtol 1e-13 --mtol 1e-12 -q 2>&1) &&
     grep -q '^PASS' <<<"$d"; then ok "$lay with the KV cache ($inp): $(grep -o 'worst relative L2 [0-9.e+-]*' <<<"$out"); global dump = one rank's: $d"
  else bad "$lay KV ($inp): $(grep -E 'OK|DIVERG|error' <<<"$out" | head -2) ${d:-}"; fi
  rm -f "$T/par.h5"
done
# fp32 and bf16 under Ulysses at their default --check tolerances
for prec in fp32 bf16; do
  out=$(timeout 300 mpirun -np 2 "$SIM" --weights "$T/weights.safetensors" --inputs "$T/in.h5" --precision $prec --ulysses 2 --check </dev/null 2>&1)
  grep -q "flux-sim --check: OK" <<<"$out" && ok "$prec --ulysses 2 with the KV cache: $(grep -o 'worst relative L2 [0-9.e+-]*' <<<"$out")" ||
    bad "$prec --ulysses 2 KV: $(grep -E 'DIVERG|error' <<<"$out" | head -2)"
done
refused() { # refused NAME NP ARGS...: exit 2, one flux-sim line naming the KV cache
  local name=$1 np=$2; shift 2
  timeout 120 mpirun -np "$np" "$SIM" "$@" -q </dev/null >"$T/r.out" 2>"$T/r.err"; local rc=$?
  local l; l=$(grep -c '^flux-sim: error: reference images' "$T/r.err")
  if [ $rc -ne 0 ] && [ "$l" -ge 1 ] && [ "$(grep '^flux-sim' "$T/r.err" | sort -u | wc -l)" -eq 1 ]; then
    ok "$name refused: $(grep -m1 '^flux-sim' "$T/r.err" | cut -c1-160)"
  else bad "$name: rc $rc: $(head -3 "$T/r.err")"; fi
}
refused "--ring 2" 2 --weights "$T/weights.safetensors" --inputs "$T/in.h5" --ring 2
refused "--dump-per-rank under --ulysses 2" 2 --weights "$T/weights.safetensors" --inputs "$T/in.h5" --ulysses 2 --dump-per-rank "$T/pr"
timeout 120 mpirun -np 4 "$SIM" --weights "$T/weights.safetensors" --inputs "$T/in.h5" --ulysses 4 -q </dev/null >"$T/r.out" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "rank 0 would hold only reference tokens" "$T/r.out" && ok "--ulysses 4 with rank 0 all reference: refused" ||
  bad "--ulysses 4, 6 reference + 12 image tokens: rc $rc $(head -2 "$T/r.out")"
refused "--true-cfg-scale with --ref-grid" 1 --config flux2-tiny --grid 2x2 --txt-len 3 --ref-grid 2x2 --true-cfg-scale 2
refused "FLUX.1 with --ref-grid" 1 --config tiny --grid 2x2 --txt-len 3 --ref-grid 2x2
refused "--text replicated with --ref-grid" 2 --weights "$T/weights.safetensors" --inputs "$T/in.h5" --ulysses 2 --text replicated
refused "--pad mask with --ref-grid" 2 --weights "$T/weights.safetensors" --inputs "$T/in.h5" --ulysses 2 --pad mask
# --dump-modules: the reference embedding's calls are names of a run with reference images only
"$SIM" --config flux2-tiny --grid 2x2 --txt-len 3 --ref-grid 1x2 --steps 2 --dump "$T/sel.h5" \
  --dump-modules 'time_guidance_embed@1,single_stream_modulation@1' -q </dev/null >"$T/sel.log" 2>&1; rc=$?
n=$("$PY" -c "import h5py; f = h5py.File('$T/sel.h5'); print(len(f['step_0000'].attrs['order']), len(f['step_0001'].attrs['order']))" 2>&1)
[ $rc -eq 0 ] && [ "$n" = "4 2" ] && ok "--dump-modules of the reference embedding's calls: step 0 records them, step 1 only the latents" ||
  bad "--dump-modules time_guidance_embed@1 with --ref-grid: rc $rc, $n, $(tail -1 "$T/sel.log")"
"$SIM" --config flux2-tiny --grid 2x2 --txt-len 3 --steps 1 --dump "$T/sel2.h5" --dump-modules 'time_guidance_embed@1' -q \
  </dev/null >"$T/sel2.log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "matches no module" "$T/sel2.log" && [ ! -e "$T/sel2.h5" ] &&
  ok "the same selection without reference images: refused up front" || bad "time_guidance_embed@1 without --ref-grid: rc $rc"

# 6. a damaged /inputs: latents without ids, ids of the wrong length — exit 2, one line naming them
cp "$T/in.h5" "$T/bad1.h5"; cp "$T/in.h5" "$T/bad2.h5"
"$PY" -c "
import h5py
with h5py.File('$T/bad1.h5', 'a') as f: del f['inputs/image_latent_ids']
with h5py.File('$T/bad2.h5', 'a') as f:
    a = f['inputs/image_latent_ids'][...]; del f['inputs/image_latent_ids']; f['inputs/image_latent_ids'] = a[:4]"
for c in "bad1|image_latents present without /inputs/image_latent_ids" "bad2|image_latent_ids has shape"; do
  IFS='|' read -r f want <<<"$c"
  "$SIM" --weights "$T/weights.safetensors" --inputs "$T/$f.h5" -q </dev/null >"$T/r.out" 2>&1; rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$T/r.out")" -eq 1 ] && grep -q "$want" "$T/r.out"; then ok "$f: exit 2: $(cut -c1-150 "$T/r.out")"
  else bad "$f: rc $rc: $(head -2 "$T/r.out")"; fi
done
finish
