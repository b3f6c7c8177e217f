#!/usr/bin/env bash
# flux-sim --estimate against what the code does (issue 13):
#  1. memory: the per-rank total is within 10% of the peak RSS the same run reaches (maximum RSS
#     from /usr/bin/time, every rank), single rank and under TP, Ulysses, ring and TP x ring,
#     fp32 and bf16 (64x64 tokens at batch 4: the activations of 16384 token rows, a quarter of
#     a 128x128 grid's attention work);
#  2. collectives: the calls and bytes per step of every collective equal what --comm-stats counts
#     (rank 0, 2 steps; the latents' final all-gather is once per run, not per step);
#  3. the seed's GPU figures (FLUX.1-dev bf16 at 1024², ../shared/seeds/001): the "GPU holding every
#     weight" column within 10% of 11.18 GB per GPU at TP 4 and of ~24 GB on one GPU;
#  4. a run that cannot fit is refused before any weight is made; bad --device-mem is an error.
# 1c and 2 also cover the layouts of issue 20 (--text replicated, --pad, true CFG, --cfg-parallel,
# --cfg-batched), FLUX.2's blocks (one rank, TP, Ulysses) and its KV cache (--ref-grid).
. "$(dirname "$0")/lib.sh"
tmpdir estimate

# Peak RSS per rank: each rank's /usr/bin/time writes its own file (rss.RANK), so nothing depends
# on how the ranks' output lines interleave (in one stream they did: "RRSS SS 270192").
# rss_run NP ARGS... runs the job; then rss_lines prints "RANK KiB" for each rank that wrote one.
rss_run() {
  local np=$1; shift
  rm -f "$T"/rss.*
  mpirun -np "$np" sh -c 'exec /usr/bin/time -f "%M" -o "$0/rss.$OMPI_COMM_WORLD_RANK" "$@"' "$T" "$SIM" -q "$@" </dev/null >"$T/out" 2>&1
}
rss_lines() { for f in "$T"/rss.*; do [ -f "$f" ] && echo "${f##*.} $(tail -1 "$f")"; done; }

# "1.8 GiB" / "317 MiB" -> MiB
to_mib() { awk -v v="$1" -v u="$2" 'BEGIN { f = u == "GiB" ? 1024 : u == "KiB" ? 1 / 1024 : u == "MiB" ? 1 : 0; printf "%.1f", v * f }'; }

# 1. memory (ASan's shadow memory makes RSS meaningless: skipped under make sanitize)
if [ -n "${FLUX_SANITIZE:-}" ]; then
  skip "the RSS comparisons under the sanitizers — they did NOT run"
else
  for L in "1|--config default --grid 64x64 --batch 4 --steps 1" "1|--config default --grid 64x64 --batch 4 --steps 1 --precision bf16" \
           "2|--config default --grid 64x64 --batch 4 --steps 1 --tp 2" "2|--config default --grid 64x64 --batch 4 --steps 1 --ulysses 2" \
           "2|--config default --grid 64x64 --batch 4 --steps 1 --ring 2 --ring-rotate p2p" \
           "4|--config default --grid 64x64 --batch 4 --steps 1 --tp 2 --ring 2"; do
    np=${L%%|*}; args=${L#*|}
    tot=$("$SIM" --estimate $args | awk '/^    total/ {print $2, $3}')
    est=$(to_mib $tot)
    rss_run "$np" $args
    worst=$(rss_lines | awk -v e="$est" '{ m = $2 / 1024; d = (e - m) / m; if (d < 0) d = -d; if (d > w) { w = d; at = m } }
                              END { printf "%.3f %.0f", w, at }')
    n=$(rss_lines | grep -c .)
    if [ "$n" -eq "$np" ] && awk -v w="${worst% *}" 'BEGIN { exit !(w <= 0.10) }'; then
      ok "np $np $args: estimate $est MiB per rank, measured peak RSS within $(awk -v w="${worst% *}" 'BEGIN{printf "%.1f", 100*w}')% on every rank"
    else bad "np $np $args: estimate $est MiB, worst rank off by ${worst% *} (RSS ${worst#* } MiB; $n of $np ranks measured)"; cat "$T/out" | tail -3; fi
  done
fi

# 1b. rank 0 of a bf16 in-job --check from a BF16 checkpoint, streamed: it runs the single-rank
# reference, then the matched float64 truth (float64 weights made from views into the
# checkpoint), then its TP shard. Both were wrong before 2026-11-24: the estimate counted only the
# parallel phase (403 MiB here once all three are counted), and the truth kept every block's
# checkpoint pages mapped (718 MiB measured, growing with depth: 0.63 GiB per FLUX.1-dev block).
if [ -z "${FLUX_SANITIZE:-}" ]; then
  cat >"$T/cfg.json" <<'JSON'
{"_class_name": "FluxTransformer2DModel", "num_layers": 2, "num_single_layers": 6, "attention_head_dim": 128,
 "num_attention_heads": 8, "joint_attention_dim": 1024, "pooled_projection_dim": 256, "in_channels": 64,
 "guidance_embeds": true, "axes_dims_rope": [16, 56, 56]}
JSON
  if "$B/make-checkpoint" --config "$T/cfg.json" "$T/ck" >"$T/mk" 2>&1; then
    args="--weights $T/ck --precision bf16 --tp 2 --check --stream on --grid 8x8 --txt-len 16 --steps 1 --dump-modules proj_out"
    mpirun -np 2 "$SIM" --estimate $args </dev/null >"$T/est" 2>&1
    e0=$(to_mib $(awk '/^    rank 0 \(/ {print $(NF-1), $NF}' "$T/est")); e1=$(to_mib $(awk '/^    total/ {print $2, $3}' "$T/est"))
    rss_run 2 $args
    m0=$(awk '$1 == 0 {print $2 / 1024}' < <(rss_lines)); m1=$(awk '$1 == 1 {print $2 / 1024}' < <(rss_lines))
    if [ -n "${m0:-}" ] && [ -n "${m1:-}" ] && awk -v e0="$e0" -v m0="$m0" -v e1="$e1" -v m1="$m1" \
         'BEGIN { d0 = (e0 - m0) / m0; d1 = (e1 - m1) / m1; exit !(d0 <= 0.10 && d0 >= -0.10 && d1 <= 0.10 && d1 >= -0.10) }'; then
      ok "bf16 --tp 2 --check from a BF16 checkpoint: rank 0 estimate $e0 MiB vs $m0 MiB, rank 1 $e1 vs $m1 MiB (within 10%)"
    else bad "bf16 --tp 2 --check from a BF16 checkpoint: rank 0 estimate ${e0:-?} MiB vs ${m0:-?} MiB, rank 1 ${e1:-?} vs ${m1:-?}"; tail -3 "$T/out"; fi
  else bad "make-checkpoint of the bf16 --check case"; tail -3 "$T/mk"; fi
fi

# 1c. the layouts of issue 20 and FLUX.2's KV cache (fs_estimate.c models each): the same 10%
# bound, at 32x32 image + 512 text tokens (text a third of the sequence, so that replicating it
# shows), batch 4 (true CFG: 2). Before they were modelled (main at 393facf) the estimate was off
# by -18.5% (Ulysses 2, replicated text), -26.0% (ring 2, replicated), -9.5% (ring p2p, --pad mask,
# uneven tokens), -41.6% and -8.2% (--cfg-batched, --cfg-parallel at batch 4). --cfg-parallel runs at
# 64x64 + 512 tokens, batch 2: at 32x32 its measured peak varied 151-165 MiB from run to run (heap
# fragmentation: the CPU backend keeps freed memory in the heap, fs_backend_cpu.c) against 144
# estimated, -4.5% to -12.7%; at 64x64 it measured 300-307 against 298 (2026-11-28, 6 runs).
# mem_error NP ARGS: "relative error of the estimate vs the worst rank's peak RSS, estimate MiB,
# that RSS MiB, ranks measured"
mem_error() {
  local np=$1; shift
  local est; est=$(to_mib $("$SIM" --estimate "$@" | awk '/^    total/ {print $2, $3}'))
  rss_run "$np" "$@"
  rss_lines | awk -v e="$est" '{ m = $2 / 1024; d = (e - m) / m; if (!n++ || (d < 0 ? -d : d) > (w < 0 ? -w : w)) { w = d; at = m } }
                                END { printf "%.4f %s %.0f %d", w, e, at, n }'
}
# within_10 NP ARGS: the estimate within 10% of the worst rank's peak RSS, either way
within_10() {
  local np=$1; shift
  local args="$*" w est at n
  read -r w est at n < <(mem_error "$np" "$@")
  if [ "$n" -eq "$np" ] && awk -v w="$w" 'BEGIN { exit !(w <= 0.10 && w >= -0.10) }'; then
    ok "np $np ${args#--config }: estimate $est MiB per rank, peak RSS $at MiB on the worst rank ($(awk -v w="$w" 'BEGIN{printf "%+.1f", 100*w}')%)"
  else bad "np $np $args: estimate $est MiB, worst rank $at MiB (off by $w; $n of $np ranks measured)"; tail -3 "$T/out"; fi
}
if [ -z "${FLUX_SANITIZE:-}" ]; then
  C="--config default --grid 32x32 --txt-len 512 --batch 4 --steps 1"
  P="--config default --grid 63x65 --txt-len 31 --batch 4 --steps 1"
  for L in "2|$C --ulysses 2 --text replicated" "2|$C --ring 2 --text replicated" "2|$P --ring 2 --ring-rotate p2p --pad mask" \
           "1|${C/--batch 4/--batch 2} --true-cfg-scale 4 --cfg-batched" "2|${C/--grid 32x32 --txt-len 512 --batch 4/--grid 64x64 --txt-len 512 --batch 2} --true-cfg-scale 4 --cfg-parallel"; do
    within_10 "${L%%|*}" ${L#*|}
  done
  # FLUX.2's own blocks (fs_estimate.c flux2_dbl, flux2_sgl): before they were modelled (FLUX.1's
  # phases with F = 2·mlp_hidden) the estimate was 11-18% low (32x32 + 256 text, batch 2: one rank
  # 140 vs 164-176 MiB, --tp 2 96 vs 104-109, --ulysses 2 102 vs 117-119); now the heap's live
  # peak is counted to within 1 MiB of activations. One rank runs at 64x64: at 32x32 its peak RSS
  # also holds 10-20 MiB of glibc heap fragmentation (the arena above the live peak: M_MMAP_THRESHOLD
  # and M_TRIM_THRESHOLD are raised, fs_backend_cpu.c), which this estimate does not model:
  # -6% to -12% there, -4% to -6% at 64x64 (measured 2026-11-28).
  F2="--config flux2-default --txt-len 256 --batch 2 --steps 2"
  for L in "1|$F2 --grid 64x64" "2|$F2 --grid 32x32 --tp 2" "2|$F2 --grid 32x32 --ulysses 2"; do
    within_10 "${L%%|*}" ${L#*|}
  done
  # The KV cache on FLUX.2: it must not add to the error of the same run without reference images
  # (-6.5% under Ulysses 2 since FLUX.2's blocks are modelled; -13% before) — within 5 points of
  # it (before the KV cache was modelled: -29.1% vs -13.2% under Ulysses 2; -46.8% vs -18.2% on
  # one rank, 32x32 reference).
  K="--config flux2-default --grid 32x32 --txt-len 256 --batch 2 --steps 2"
  for L in "2|--ulysses 2 --ref-grid 16x32"; do
    np=${L%%|*}; args=${L#*|}
    read -r w0 est0 at0 n0 < <(mem_error "$np" $K ${args/--ref-grid */})
    read -r w est at n < <(mem_error "$np" $K $args)
    if [ "$n" -eq "$np" ] && [ "$n0" -eq "$np" ] && awk -v a="$w" -v b="$w0" 'BEGIN { d = a - b; exit !(d <= 0.05 && d >= -0.05) }'; then
      ok "np $np FLUX.2 $args: estimate $est MiB vs peak RSS $at MiB ($(awk -v w="$w" 'BEGIN{printf "%+.1f", 100*w}')%); without it $est0 vs $at0 MiB ($(awk -v w="$w0" 'BEGIN{printf "%+.1f", 100*w}')%)"
    else bad "np $np FLUX.2 $args: estimate $est MiB vs $at MiB (off by $w), without it $est0 vs $at0 (off by $w0)"; tail -3 "$T/out"; fi
  done
fi

# 2. collectives: --estimate's per-step figures x 2 steps == --comm-stats on rank 0
# (the layouts of issue 20 too: replicated text's image-only exchanges and its text all-gather,
# the padded blocks and chunks (uneven: 25 + 7 tokens), true CFG's two calls under TP, and CFG
# parallel's exchange of the noise predictions)
for L in "2|--tp 2" "2|--ulysses 2" "2|--ring 2" "2|--ring 2 --ring-rotate p2p" "4|--ulysses 2 --ring 2" "4|--tp 2 --ring 2 --ring-rotate p2p" \
         "2|--ulysses 2 --text replicated" "2|--ring 2 --text replicated" "2|--ring 2 --pad nomask --grid 5x5 --txt-len 7" \
         "2|--tp 2 --true-cfg-scale 3 --neg-txt-len 5" "2|--true-cfg-scale 3 --cfg-parallel"; do
  np=${L%%|*}; args=${L#*|}
  common="--config odd --batch 2 --grid 4x6 --txt-len 8 --steps 2"
  "$SIM" --estimate $common $args >"$T/est" 2>&1
  # each rank prints its own comm-stats line: rank 0's is read from rank 0's own file
  mpirun_per_rank "$T/ranks" "$np" "$SIM" -q $common $args --comm-stats >"$T/stats" 2>&1
  cat "$T/ranks/rank.0" >>"$T/stats" 2>/dev/null
  if $PY - "$T/est" "$T/ranks/rank.0" <<'PY'
import re, sys
est = open(sys.argv[1]).read(); stats = open(sys.argv[2]).read()
unit = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
line = next(l for l in est.splitlines() if l.startswith("  collectives per step"))
want = {}
for kind, calls, v, u in re.findall(r"(all-reduce|all-to-all|ring allgather|ring p2p|text all-gather|cfg all-gather) (\d+), ([\d.]+) (B|KiB|MiB|GiB)", line):
    want[kind] = (2 * int(calls), 2 * float(v) * unit[u])
m = re.search(r"comm-stats rank 0: (.*) \(calls/bytes sent\)", stats)
got = {k.strip(): tuple(map(int, v.split("/"))) for k, v in re.findall(r"([a-z0-9 ]+?) (\d+/\d+)", m.group(1))}
# odd config: latents [2, 24, 8] float32; under sequence parallelism the final all-gather sends
# this rank's share once
seqpar = re.search(r"ulysses (\d+) x ring (\d+)", est)
final = 2 * 24 * 8 * 4 if int(seqpar.group(1)) * int(seqpar.group(2)) > 1 else 0
name = {"all-reduce": "allreduce", "all-to-all": "alltoallv", "ring allgather": "allgatherv", "ring p2p": "ring p2p",
        "text all-gather": "allgatherv", "cfg all-gather": "allgatherv"}
# the kinds that are all-gathers are one counter in --comm-stats: compared as their sum
ag = [k for k in want if name[k] == "allgatherv"]
if ag:
    both = " + ".join(ag)
    total = (sum(want[k][0] for k in ag), sum(want[k][1] for k in ag))
    for k in ag: del want[k]
    name[both] = "allgatherv"
    want[both] = total
for kind, (calls, nbytes) in want.items():
    c, b = got.get(name[kind], (0, 0))
    if name[kind] == "allgatherv" and final:  # comm-stats counts the final latents gather with them
        c -= 1
    if c != calls or (name[kind] != "allgatherv" and abs(b - nbytes) > 0.051 * nbytes) or \
       (name[kind] == "allgatherv" and not (0 < nbytes - 0.051 * nbytes <= b <= nbytes * 1.051 + final)):
        print(f"   {kind}: estimate {calls} calls / {nbytes:.0f} B, --comm-stats {c} / {b}"); sys.exit(1)
if not want: print("   no collectives in the estimate"); sys.exit(1)
print("   " + "; ".join(f"{k} {v[0]} calls" for k, v in want.items()))
PY
  then ok "collectives per step, $args: --estimate equals --comm-stats (calls exact, bytes to the printed precision)"
  else bad "collectives $args"; cat "$T/est" | tail -3; tail -3 "$T/stats"; fi
done

# 3. the seed's GPU figures: FLUX.1-dev bf16, 1024² (64x64 tokens) + 512 text tokens
gpu_col() { "$SIM" --estimate --config flux-dev --precision bf16 --grid 64x64 --txt-len 512 --steps 28 "$@" |
            awk '/^    total/ {print $4, $5}'; }
g4=$(to_mib $(gpu_col --tp 4)); g1=$(to_mib $(gpu_col --tp 1))
# 11.18 GB and ~24 GB as torch reports them (GB = 10^9 bytes; 2^30 would be closer still for TP 4)
if awk -v a="$g4" -v b="$g1" 'BEGIN { t4 = 11.18e9 / 1048576; t1 = 24e9 / 1048576;
      exit !(a > 0.9 * t4 && a < 1.1 * t4 && b > 0.9 * t1 && b < 1.1 * t1) }'; then
  ok "seed 001 (FLUX.1-dev bf16 1024²): TP 4 $g4 MiB per GPU vs 11.18 GB measured, one GPU $g1 MiB vs ~24 GB"
else bad "seed 001 GPU figures: TP 4 $g4 MiB (want ~10662), one GPU $g1 MiB (want ~22888)"; fi

# 4. refusals. "Before any weight is made" is measured by what the process used, not by the wall
# clock (which a loaded machine stretches): at most 10 s of CPU, and a peak RSS under 256 MiB
# (one FLUX.1-dev double block alone is 2.5 GiB in fp64). Under make sanitize the bound is 1 GiB:
# ASan's shadow memory and quarantine and LSan's full unwinding make the same refusal ~600 MiB
RSS_MAX=$((256 * 1024)); [ -n "${FLUX_SANITIZE:-}" ] && RSS_MAX=$((1024 * 1024))
measured "$T/cost" "$SIM" -q --config flux-dev --precision fp64 --stream off --grid 2x2 --txt-len 8 --steps 1 >"$T/out" 2>&1; rc=$?
read -r kib cpu <"$T/cost"
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/out")" -eq 1 ] && grep -q "for weights in fp64" "$T/out" &&
   awk -v c="$cpu" -v m="$kib" -v x="$RSS_MAX" 'BEGIN { exit !(c <= 10 && m < x) }'; then
  ok "flux-dev in fp64 with --stream off is refused after ${cpu}s of CPU, peak RSS $((kib / 1024)) MiB: $(cat "$T/out")"
else bad "flux-dev fp64 --stream off: rc $rc after ${cpu}s of CPU, peak RSS ${kib} KiB"; cat "$T/out"; fi
"$SIM" --estimate --device-mem 16Q >"$T/out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "device-mem: '16Q' is not a size" "$T/out"; then ok "--device-mem 16Q: exit 2, one line"
else bad "--device-mem 16Q: rc $rc"; cat "$T/out"; fi
"$SIM" --estimate --config flux-dev --tp 5 >"$T/out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "24 heads do not divide over tp 5" "$T/out"; then ok "--estimate --tp 5 on 24 heads: exit 2"
else bad "--estimate --tp 5: rc $rc"; cat "$T/out"; fi
# --estimate refuses the KV-cache layouts the run refuses (fs_job.c kv_refusal; fs_sample's
# Ulysses rank 0 holding only reference tokens at step 0), one line, exit 2
for L in "rank 0 would hold only reference tokens|--config flux2-default --grid 32x32 --ref-grid 32x32 --ulysses 2" \
         "not under --ring|--config flux2-default --grid 32x32 --ref-grid 4x4 --ring 2" \
         "not on FLUX.1|--config default --grid 8x8 --ref-grid 2x2"; do
  want=${L%%|*}; args=${L#*|}
  "$SIM" --estimate $args >"$T/out" 2>&1; rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$T/out")" -eq 1 ] && grep -q "$want" "$T/out"; then ok "--estimate $args: exit 2, one line"
  else bad "--estimate $args: rc $rc"; cat "$T/out"; fi
done
out=$("$SIM" --estimate --config flux-dev --precision bf16 --grid 64x64 --txt-len 512 --tp 4 --device-mem 8G); rc=$?
if [ $rc -eq 0 ] && grep -q "fits a 8 GiB device: NO" <<<"$out"; then ok "--device-mem 8G: TP 4 does not fit an 8 GiB GPU (said, exit 0)"
else bad "--device-mem 8G verdict"; echo "$out" | tail -4; fi

finish
