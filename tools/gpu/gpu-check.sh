#!/usr/bin/env bash
# gpu-check.sh — the GPU backend's checks, in one log (docs/gpu.md, "make gpu-check"):
#   1. per-op conformance against the CPU backend (gpu_check: every op, f64/f32/bf16, odd shapes,
#      both LSE layouts, both GEMM paths on CUDA)
#   2. the reference configs (tiny, odd) through the GPU backend, single rank, judged against
#      diffusers' dump_fp64.h5 with the CPU conformance bounds (rel L2 1e-4 fp32, 1e-10 fp64);
#      bf16: the GPU run against flux-sim's CPU bf16 run with the matched float64 truth as arbiter
#   3. the layout matrix: --check on 2-4 ranks sharing the GPU (tp, ulysses, ring both rotations,
#      meshes), fp32 and fp64, and the ring under both declared LSE layouts
#   4. the --inject table of tests/inject_check.sh on the GPU: the same step, module and ranks
#   5. bench_forward: the FLUX.1-dev-width forward (1 double + 1 single block) in fp32 and bf16
# Not part of `make test`. Without a GPU it says SKIPPED and exits 0; exit 1 if anything failed.
#
#   make GPU=cuda gpu-check                  from the repository (build/ binaries)
#   bundle/run.sh bundle/gpu-check.sh        from tools/gpu/gpu-bundle.sh's folder (PATH binaries)
# Environment: BACKEND (cuda; hip for a HIP build), FLUX_REFERENCE_DIR (../shared/reference),
# LOG (build/gpu-check.log, or gpu-check.log beside the bundle), QUICK=1 (steps 1-4 shortened,
# no bench), NO_BENCH=1 (steps 1-4 in full, no bench), MPIRUN (mpirun).
set -u
if [ -n "${FLUX_BUNDLE:-}" ]; then
  SIM=flux-sim ORACLE=flux-oracle CHECK=gpu_check BENCH=bench_forward INJ="$FLUX_BUNDLE/inject_check.sh"
  LOG=${LOG:-$PWD/gpu-check.log}
else
  cd "$(dirname "$0")/../.."
  SIM=build/flux-sim ORACLE=build/flux-oracle CHECK=build/gpu_check BENCH=build/bench_forward INJ=tests/inject_check.sh
  LOG=${LOG:-build/gpu-check.log}
fi
BACKEND=${BACKEND:-cuda}
MPIRUN=${MPIRUN:-mpirun}
ref=${FLUX_REFERENCE_DIR:-../shared/reference}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
mkdir -p "$(dirname "$LOG")"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
T=$(mktemp -d /tmp/fluxsim-gpu-XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0; skip=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
t_start=$(date +%s)

echo "== gpu-check $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname), backend $BACKEND"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/   nvidia-smi: /'
command -v git >/dev/null && git rev-parse --short HEAD 2>/dev/null | sed 's/^/   commit: /'

# 0. is there a GPU (and a GPU build)?
out=$(timeout 120 $SIM --backend "$BACKEND" --grid 2x2 --txt-len 4 --steps 1 -q 2>&1); rc=$?
if [ $rc -ne 0 ]; then
  if grep -qE "no (CUDA|HIP) device|has no GPU backend|build's GPU backend is" <<<"$out"; then
    echo "*** SKIPPED: no GPU ($(grep -m1 -oE -- '--backend.*' <<<"$out")) — the GPU checks did NOT run ***"
    exit 0
  fi
  bad "a first small run on --backend $BACKEND: exit $rc"; echo "$out" | tail -5
  echo "$pass passed, $fail failed"; exit 1
fi
ok "a first small run on --backend $BACKEND"

# 1. per-op conformance
echo "== 1. per-op conformance against the CPU backend (gpu_check)"
timeout 600 $CHECK --backend "$BACKEND" ${QUICK:+--quick} >"$T/ops" 2>&1; rc=$?
cat "$T/ops"
if [ $rc -eq 0 ]; then ok "gpu_check: $(tail -1 "$T/ops")"; else bad "gpu_check exit $rc: $(tail -1 "$T/ops")"; fi

if [ ! -d "$ref/tiny" ]; then
  echo "*** SKIPPED steps 2-3: $ref not found (set FLUX_REFERENCE_DIR) — these checks did NOT run ***"
  skip=$((skip + 1))
else
  # 2. reference configs, single rank
  echo "== 2. reference configs through --backend $BACKEND (single rank) against diffusers' dump_fp64.h5"
  for cfg in tiny odd; do
    for prec in fp64 fp32; do
      bound=1e-4; [ $prec = fp64 ] && bound=1e-10
      o="$T/$cfg-$prec.h5"
      timeout 300 $SIM --backend "$BACKEND" --weights "$ref/$cfg/weights.safetensors" --inputs "$ref/$cfg/dump_fp64.h5" \
        --precision $prec --dump "$o" -q >"$T/log" 2>&1; rc=$?
      if [ $rc -ne 0 ]; then bad "$cfg $prec: flux-sim exit $rc"; tail -3 "$T/log"; continue; fi
      # the CPU conformance bound: rel L2 per dataset (no absolute floor, no max-rel criterion)
      timeout 300 $ORACLE diff "$o" "$ref/$cfg/dump_fp64.h5" --rtol $bound --atol 0 --mtol 0 -q >"$T/d" 2>&1; rc=$?
      if [ $rc -eq 0 ]; then ok "$cfg $prec vs diffusers fp64 (rel L2 <= $bound): $(head -1 "$T/d")"
      else bad "$cfg $prec vs diffusers fp64 (rel L2 <= $bound): exit $rc"; head -5 "$T/d"; fi
    done
    # bf16: the GPU run against flux-sim's CPU bf16 run, with the matched float64 run as truth
    # (flux-oracle's bf16 arbiter, docs/bf16.md); the same inputs, replayed in bf16
    args=(--weights "$ref/$cfg/weights.safetensors" --inputs "$ref/$cfg/dump_fp64.h5" -q)
    timeout 300 $SIM --backend "$BACKEND" "${args[@]}" --precision bf16 --dump "$T/g16.h5" >"$T/log" 2>&1 &&
      timeout 300 $SIM --backend cpu "${args[@]}" --precision bf16 --dump "$T/c16.h5" >>"$T/log" 2>&1 &&
      timeout 300 $SIM --backend cpu "${args[@]}" --precision fp64 --match bf16 --dump "$T/t64.h5" >>"$T/log" 2>&1; rc=$?
    if [ $rc -ne 0 ]; then bad "$cfg bf16 runs: exit $rc"; tail -3 "$T/log"; continue; fi
    timeout 300 $ORACLE diff "$T/g16.h5" "$T/c16.h5" --truth "$T/t64.h5" -q >"$T/d" 2>&1; rc=$?
    if [ $rc -eq 0 ]; then ok "$cfg bf16 ($BACKEND) vs cpu bf16, matched fp64 truth as arbiter: $(head -1 "$T/d")"
    else bad "$cfg bf16 ($BACKEND) vs cpu bf16 with the matched truth: exit $rc"; head -5 "$T/d"; fi
  done

  # 3. layout matrix, ranks sharing the GPU
  echo "== 3. layouts: mpirun -np N flux-sim --backend $BACKEND --check (ranks share the GPU)"
  LAYOUTS=("2|--tp 2" "2|--ulysses 2" "2|--ring 2" "2|--ring 2 --ring-rotate p2p" "3|--ring 3 --ring-rotate p2p"
           "4|--tp 2 --ring 2" "4|--ulysses 2 --ring 2" "4|--tp 2 --ulysses 2" "4|--ring 4")
  [ -n "${QUICK:-}" ] && LAYOUTS=("2|--tp 2" "2|--ring 2" "4|--tp 2 --ring 2")
  for cfg in tiny odd; do
    for prec in fp32 fp64; do
      for L in "${LAYOUTS[@]}"; do
        n=${L%%|*}; lay=${L#*|}
        timeout 300 $MPIRUN -np "$n" $SIM --backend "$BACKEND" --weights "$ref/$cfg/weights.safetensors" \
          --inputs "$ref/$cfg/dump_fp64.h5" --precision $prec $lay --check -q >"$T/log" 2>&1; rc=$?
        if [ $rc -eq 0 ] && grep -q "check: OK" "$T/log"; then ok "$cfg $prec np=$n $lay: $(grep -m1 -o 'check: OK.*' "$T/log")"
        elif [ $rc -eq 2 ] && grep -q "cannot run this model" "$T/log"; then ok "$cfg $prec np=$n $lay: refused as on the CPU"
        else bad "$cfg $prec np=$n $lay: exit $rc"; grep -E "DIVERGED|error|held by" "$T/log" | head -3; fi
      done
    done
  done
  for lse in bhs bsh; do
    for L in "2|--ring 2" "4|--ulysses 2 --ring 2"; do
      n=${L%%|*}; lay=${L#*|}
      timeout 300 $MPIRUN -np "$n" $SIM --backend "$BACKEND" --lse-layout $lse --weights "$ref/odd/weights.safetensors" \
        --inputs "$ref/odd/dump_fp64.h5" --precision fp32 $lay --check -q >"$T/log" 2>&1; rc=$?
      if [ $rc -eq 0 ] && grep -q "check: OK" "$T/log"; then ok "odd fp32 np=$n $lay, kernel LSE declared $lse: --check OK"
      else bad "odd fp32 np=$n $lay --lse-layout $lse: exit $rc"; grep -E "DIVERGED|error" "$T/log" | head -3; fi
    done
  done
  for L in "2|--tp 2" "2|--ring 2"; do
    n=${L%%|*}; lay=${L#*|}
    timeout 300 $MPIRUN -np "$n" $SIM --backend "$BACKEND" --weights "$ref/tiny/weights.safetensors" \
      --inputs "$ref/tiny/dump_fp64.h5" --precision bf16 $lay --check -q >"$T/log" 2>&1; rc=$?
    if [ $rc -eq 0 ] && grep -q "check: OK" "$T/log"; then ok "tiny bf16 np=$n $lay: --check OK (bf16 arbiter)"
    else bad "tiny bf16 np=$n $lay: exit $rc"; grep -E "DIVERGED|error" "$T/log" | head -3; fi
  done
fi

# 4. the --inject table of tests/inject_check.sh, on the GPU
echo "== 4. --inject bugs on --backend $BACKEND: the step, module and ranks of tests/inject_check.sh"
if [ -f "$INJ" ]; then
  eval "$(sed -n '/^CASES=(/,/^)/p' "$INJ")"
  [ -n "${QUICK:-}" ] && CASES=("${CASES[@]:0:8}")
  for c in "${CASES[@]}"; do
    IFS='|' read -r bug n layout want <<<"$c"
    out=$(timeout 300 $MPIRUN -np "$n" $SIM --backend "$BACKEND" --grid 5x7 --txt-len 13 --steps 2 --check -q $layout \
      --inject "$bug" 2>&1); rc=$?
    tag="$bug under $layout"
    if [ "$want" = ok ]; then
      if [ $rc -eq 0 ] && grep -q "check: OK" <<<"$out"; then ok "$tag: cannot show here, and --check passes"
      else bad "$tag: expected no divergence, exit $rc"; grep -E "DIVERGED|error" <<<"$out" | head -2; fi
      continue
    fi
    step=${want%% *}; rest=${want#* }; module=${rest%% *}; ranks=${rest#* }
    if [ $rc -eq 1 ] && grep -qxF "flux-sim --check: DIVERGED at step $step, $module" <<<"$out" && grep -qF "$ranks" <<<"$out"; then
      ok "$tag: exit 1 at step $step, $module ($ranks)"
    else
      bad "$tag: exit $rc, want step $step $module '$ranks'"; grep -E "DIVERGED|held by|disagree|error" <<<"$out" | head -3
    fi
  done
else
  echo "*** SKIPPED step 4: $INJ not found ***"; skip=$((skip + 1))
fi

# 5. throughput
if [ -z "${QUICK:-}" ] && [ -z "${NO_BENCH:-}" ]; then
  echo "== 5. bench_forward (FLUX.1-dev width, 1 double + 1 single block, 1024 + 512 tokens)"
  for prec in fp32 bf16; do
    timeout 300 $BENCH --backend "$BACKEND" --precision $prec --reps 5 >"$T/b" 2>&1; rc=$?
    cat "$T/b"
    if [ $rc -eq 0 ]; then ok "bench_forward $prec"; else bad "bench_forward $prec: exit $rc"; fi
  done
  if [ "$BACKEND" = cuda ]; then
    FLUX_SIM_GPU_GEMM=tiled timeout 300 $BENCH --backend cuda --precision bf16 --reps 3 >"$T/b" 2>&1; rc=$?
    sed 's/^/   [tiled GEMM] /' "$T/b"
    if [ $rc -eq 0 ]; then ok "bench_forward bf16 with FLUX_SIM_GPU_GEMM=tiled"; else bad "bench_forward tiled: exit $rc"; fi
  fi
fi

echo "== gpu-check: $pass passed, $fail failed, $skip steps SKIPPED, $(($(date +%s) - t_start)) s; log: $LOG"
[ $fail -eq 0 ]
