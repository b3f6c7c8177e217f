#!/usr/bin/env bash
# flux-sim on hostile input (../shared/reliability-probe.md defects 1, 2, 10, 11, 12, 15, 16, 18): every
# case must exit 2 within seconds, print exactly ONE line on stderr naming the culprit (option,
# config key, file), and leave no output file or temporary behind. Each case here crashed, hung,
# ran for minutes, ran silently wrong, or exited 1/139/136 before its fix.
. "$(dirname "$0")/lib.sh"
tmpdir hostile
# A case that is not refused may try to allocate terabytes on a machine shared with others: cap
# the address space (not under ASan, which reserves terabytes of shadow memory up front).
limit_mem() { [ -n "${FLUX_SANITIZE:-}" ] || ulimit -v 8000000; }
check() { # name, expected-substring, args...
  local name=$1 want=$2; shift 2
  local out="$T/out-$name.h5" rc lines leftovers secs kib
  # "within seconds" is CPU seconds (measured): the wall clock of a loaded machine says nothing
  # about what the process did; timeout 60 only ends a hang
  ( limit_mem; measured "$T/cost" timeout 60 "$SIM" -q "$@" --dump "$out" ) >"$T/stdout" 2>"$T/stderr" </dev/null; rc=$?
  read -r kib secs <"$T/cost"
  lines=$(wc -l <"$T/stderr")
  leftovers=$(ls "$T" | grep -c "^out-$name.h5" || true)
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" "$T/stderr" && [ "$leftovers" -eq 0 ] && awk -v s="$secs" 'BEGIN { exit !(s <= 20) }'; then
    ok "$name: $(cat "$T/stderr")"
  else
    bad "$name: rc=$rc lines=$lines leftovers=$leftovers ${secs}s (CPU) want '$want'"; head -5 "$T/stderr"
  fi
  rm -f "$T/out-$name.h5"*
}

# ---- command line (probe #1, #11, #15) ----
check grid-junk        "'16x16junk'"             --grid 16x16junk --steps 1
check grid-int-wrap    "--grid 46341x46341"      --grid 46341x46341 --steps 1
check grid-heap-ovf    "--grid 65536x65537"      --grid 65536x65537 --steps 1
check grid-huge        "--grid 100000x100000"    --grid 100000x100000 --steps 1
check grid-sign        "'3x-4'"                  --grid 3x-4
check grid-llong       "'99999999999999999999x1'" --grid 99999999999999999999x1
check seed-erange      "--seed"                  --seed 99999999999999999999999
check seed-blank-neg   "--seed"                  --seed " -1"
check wseed-erange     "--weights-seed"          --weights-seed 18446744073709551616
check threads-32768    "--threads"               --threads 32768 --grid 2x2 --steps 1
check threads-1e6      "--threads"               --threads 1000000 --grid 2x2 --steps 1
check batch-65         "--batch"                 --batch 65 --grid 2x2 --steps 1
check batch-1e6        "--batch"                 --batch 1000000 --grid 2x2 --steps 1
check guidance-1e308   "--guidance"              --guidance 1e308
check guidance-neg     "--guidance"              --guidance -20000
check txt-len-huge     "--txt-len"               --txt-len 5000000
check steps-huge       "--steps"                 --steps 1000001
check rtol-inf         "--rtol"                  --check --rtol inf

# ---- config.json (probe #2, #12, #15, #16) ----
cfg() { # name, JSON overrides applied to the 'odd' shape
  $PY - "$T/$1.json" "$2" <<'PY'
import json, sys
c = {"patch_size": 1, "in_channels": 8, "out_channels": None, "num_layers": 1, "num_single_layers": 3,
     "attention_head_dim": 16, "num_attention_heads": 6, "joint_attention_dim": 40,
     "pooled_projection_dim": 24, "guidance_embeds": False, "axes_dims_rope": [4, 6, 6]}
c.update(json.loads(sys.argv[2]))
open(sys.argv[1], "w").write(json.dumps(c))
PY
}
cfg fuzz-3e79     '{"num_single_layers": 3.1e79}'
cfg axes-float    '{"axes_dims_rope": [8.9, 12.2, 12], "attention_head_dim": 32}'
cfg axes-wrap     '{"axes_dims_rope": [2147483646, 2147483646, 6], "attention_head_dim": 2}'
cfg heads-2p30    '{"num_attention_heads": 1073741824}'
cfg heads-dim-64k '{"num_attention_heads": 65536, "attention_head_dim": 65536, "axes_dims_rope": [21846, 21846, 21844]}'
cfg dim-2p30      '{"attention_head_dim": 1073741824, "axes_dims_rope": [357913942, 357913942, 357913940]}'
cfg layers-1e9    '{"num_layers": 1000000000}'
cfg pooled-max    '{"pooled_projection_dim": 2147483647}'
cfg in-max        '{"in_channels": 2147483647}'
cfg joint-max     '{"joint_attention_dim": 2147483647}'
cfg out-ne-in     '{"out_channels": 4}'
cfg params-1e12   '{"num_attention_heads": 1024, "attention_head_dim": 1024, "axes_dims_rope": [340, 342, 342], "num_layers": 1024}'
check cfg-float-int    "num_single_layers"       --config "$T/fuzz-3e79.json"
check cfg-axes-float   "axes_dims_rope[0]"       --config "$T/axes-float.json"
check cfg-axes-wrap    "axes_dims_rope[0]"       --config "$T/axes-wrap.json" --grid 2x2 --steps 1
check cfg-heads-2p30   "num_attention_heads"     --config "$T/heads-2p30.json" --grid 2x2 --steps 1
check cfg-heads-dim    "attention_head_dim"      --config "$T/heads-dim-64k.json" --grid 2x2 --steps 1
check cfg-dim-2p30     "attention_head_dim"      --config "$T/dim-2p30.json" --grid 2x2 --steps 1
check cfg-layers-1e9   "num_layers"              --config "$T/layers-1e9.json" --grid 2x2 --steps 1
check cfg-pooled-max   "pooled_projection_dim"   --config "$T/pooled-max.json" --grid 2x2 --steps 1
check cfg-in-max       "in_channels"             --config "$T/in-max.json" --grid 2x2 --steps 1
check cfg-joint-max    "joint_attention_dim"     --config "$T/joint-max.json" --grid 2x2 --steps 1
check cfg-out-ne-in    "out_channels = 4"        --config "$T/out-ne-in.json" --grid 2x2 --steps 1
check cfg-params       "parameters"              --config "$T/params-1e12.json" --grid 2x2 --steps 1
mkdir "$T/cfgdir.json"
check cfg-directory    "directory holds neither config.json"          --config "$T/cfgdir.json"

# ---- a dump whose `config` attribute was edited (the same reader, through --inputs) ----
if ( limit_mem; timeout 60 "$SIM" -q --config odd --grid 2x2 --txt-len 3 --steps 1 --dump "$T/base.h5" ) </dev/null &&
   $PY - "$T" <<'PY'
import h5py, json, shutil, sys
T = sys.argv[1]
for name, upd in [("heads", {"num_attention_heads": 1073741824}), ("floatint", {"num_layers": 3.1e79})]:
    shutil.copy(f"{T}/base.h5", f"{T}/dump-{name}.h5")
    with h5py.File(f"{T}/dump-{name}.h5", "r+") as f:
        c = json.loads(f.attrs["config"]); c.update(upd); f.attrs["config"] = json.dumps(c)
PY
then
  check dump-cfg-heads    "num_attention_heads"  --inputs "$T/dump-heads.h5"
  check dump-cfg-floatint "num_layers"           --inputs "$T/dump-floatint.h5"
else
  bad "dump fixtures (flux-sim --dump, h5py)"
fi

# ---- --plan (probe #10); the plan is read on one rank too ----
mkdir "$T/plandir"
check plan-directory   "is a directory"          --plan "$T/plandir" --grid 2x2 --steps 1
$PY -c "
import sys
open(sys.argv[1], 'w').write(('#' + ' ' * 62 + '\n') * 16384 + 'single_transformer_blocks.*.proj_out rowwise\n')
open(sys.argv[2], 'w').write('# only comments\n\n')
open(sys.argv[3], 'wb').write(b'transformer_blocks.*.attn.to_q colwise\n\0single_transformer_blocks.*.proj_out rowwise\n')
" "$T/long.plan" "$T/empty.plan" "$T/nul.plan"
check plan-over-1mib   "at most 1048576 bytes"   --plan "$T/long.plan" --grid 2x2 --steps 1
check plan-no-rules    "no rules"                --plan "$T/empty.plan" --grid 2x2 --steps 1
check plan-nul         "NUL byte"                --plan "$T/nul.plan" --grid 2x2 --steps 1

# ---- runs too big for this machine (probe #12): refused before allocating, by fs_estimate ----
# Under `ulimit -v 8000000` (limit_mem) the limit is the same on every machine; ASan cannot run
# under ulimit -v, so make sanitize skips these (they would depend on the machine's memory).
if [ -n "${FLUX_SANITIZE:-}" ]; then
  skip "too-big-grid, too-big-txt, too-big-batch: need ulimit -v, which ASan cannot run under — these did NOT run"
else
  check too-big-grid    "--grid 2000x2000: 4,000,000 image tokens" --grid 2000x2000 --steps 1
  check too-big-txt     "--txt-len 1000000: 1,000,000 text tokens" --txt-len 1000000 --steps 1
  check too-big-batch   "at batch 64"             --grid 256x256 --batch 64 --steps 1
fi

# ---- --check=REF.h5 of another model or other inputs: an input error, not a divergence (probe #18) ----
ref=${FLUX_REFERENCE_DIR:-../shared/reference}
if [ -f "$ref/odd/dump_fp64.h5" ]; then
  check check-ref-model "--check=$ref/odd/dump_fp64.h5: the reference is a run of another model (reference vs this run: in_channels 8 vs 64" \
    --check="$ref/odd/dump_fp64.h5" --grid 2x2 --steps 1
  check check-ref-tokens "--check=$ref/odd/dump_fp64.h5: the reference was run on 35 image tokens, this run has 6" \
    --config odd --grid 2x3 --txt-len 13 --check="$ref/odd/dump_fp64.h5"
  check check-ref-batch "the reference was run on other inputs: its step 0 latents_in is [2, 35, 8], this run's is [1, 35, 8]" \
    --config odd --grid 5x7 --txt-len 13 --check="$ref/odd/dump_fp64.h5"
else
  skip "check-ref-model, check-ref-tokens, check-ref-batch: $ref/odd not found — these did NOT run"
fi
# ---- a 250-character dump name (probe #18: the temporary's suffix passed NAME_MAX), 1 and 2 ranks ----
long=$(printf 'n%.0s' $(seq 1 250)).h5
for np in 1 2; do
  rm -rf "$T/long"; mkdir -p "$T/long"
  timeout 60 mpirun --allow-run-as-root --oversubscribe -np $np "$SIM" -q --grid 2x2 --steps 1 --dump "$T/long/$long" \
    </dev/null >"$T/stderr" 2>&1; rc=$?
  if [ $rc -eq 0 ] && [ "$(ls "$T/long")" = "$long" ]; then
    ok "a 250-character --dump name, $np rank(s): written, no temporary left"
  else
    bad "a 250-character --dump name, $np rank(s): rc=$rc, files: $(ls "$T/long" | cut -c1-40)"; head -3 "$T/stderr"
  fi
done

# ---- control: the same binary runs a small valid case, with a plan file ----
printf 'single_transformer_blocks.*.proj_out packed_rowwise D,4D\n' >"$T/ok.plan"
if ( limit_mem; timeout 60 "$SIM" -q --config odd --grid 2x3 --txt-len 4 --steps 1 --threads 2 --seed 18446744073709551615 \
       --guidance 10000 --batch 64 --plan "$T/ok.plan" --dump "$T/ok.h5" ) </dev/null && [ -f "$T/ok.h5" ]; then
  ok "control: limits are inclusive (batch 64, guidance 1e4, seed 2^64-1) and a valid run dumps"
else
  bad "control run"
fi
finish
