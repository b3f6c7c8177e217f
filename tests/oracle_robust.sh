#!/usr/bin/env bash
# flux-oracle on the reliability probe's inputs (/work/shared/reliability-probe.md), each a
# regression test of one defect; self-contained (a small flux-sim dump altered with h5py):
#   #5   a dataset with a zero-length trailing axis: no SIGFPE; stats says "empty (0 elements)"
#   #6b  a tiny file whose chunked dataset claims 10^13 values: refused at once, one line
#   #13  stdout write errors (diff --json > /dev/full) exit 2; --html/--junit on a file-size
#        limit (EFBIG, as ENOSPC) exit 2 and leave neither the report nor a temporary behind
#   #14  a directory as the dump: one clean line
#   #16  `version = 1e300`: a clean error (the range is checked before the float->int cast)
#   the --truth summary line; /inputs datasets named by path ("/inputs/hidden_states", not
#   "step in hidden_states"); flux-sim and flux-oracle report one version; two all-NaN dumps do
#   not pass; a NaN facing a NaN is reported as non-finite on both sides; an `order` listing a
#   name twice compares it once.
. "$(dirname "$0")/lib.sh"
OR=${OR:-${FLUX_BUILD:-build}/flux-oracle}
tmpdir robust
# run LABEL WANT_RC WANT_STDERR_SUBSTRING -- args: rc, and for rc 2 exactly one stderr line;
# cpu = the CPU seconds it used (timeout only ends a hang)
run() {
  local label=$1 want_rc=$2 want=$3; shift 4
  measured "$T/cost" timeout -s KILL 30 "$OR" "$@" >"$T/out" 2>"$T/err"; local rc=$?
  read -r _ cpu <"$T/cost"
  local lines; lines=$(wc -l <"$T/err")
  if [ $rc -eq "$want_rc" ] && { [ "$want_rc" -ne 2 ] || [ "$lines" -eq 1 ]; } && { [ -z "$want" ] || grep -qF -- "$want" "$T/err" "$T/out"; }
  then ok "$label"; else bad "$label: rc=$rc (want $want_rc), stderr lines $lines, want '$want'"; head -c 600 "$T/out"; cat "$T/err"; fi
}
if ! $PY -c "import h5py, numpy" 2>/dev/null; then
  skip_all "oracle robustness tests: python3-h5py/numpy not installed — they did NOT run"
fi
cat >"$T/mini.json" <<'JSON'
{"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 8, "out_channels": null,
 "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16, "num_attention_heads": 2,
 "joint_attention_dim": 16, "pooled_projection_dim": 16, "guidance_embeds": false, "axes_dims_rope": [4, 6, 6]}
JSON
"$SIM" -q --config "$T/mini.json" --grid 2x2 --txt-len 3 --steps 2 --dump "$T/A.h5" || { bad "flux-sim"; finish; }
$PY - "$T" <<'PY' || { bad "fixtures"; finish; }
import sys, shutil, h5py, numpy as np
T = sys.argv[1]; A = f"{T}/A.h5"
def copy(dst, fn):
    shutil.copy(A, f"{T}/{dst}")
    with h5py.File(f"{T}/{dst}", "r+") as f: fn(f)
def add(f, name, **kw):
    g = f["step_0000"]; g.create_dataset(name, **kw)
    g.attrs["order"] = np.array(list(g.attrs["order"]) + [name], dtype=h5py.string_dtype())
copy("zero_trailing.h5", lambda f: add(f, "zero_trailing", shape=(1, 0), dtype="f4"))
copy("huge.h5", lambda f: add(f, "huge", shape=(1, 8, 2 ** 40), chunks=(1, 8, 4096), dtype="f4"))
copy("v1e300.h5", lambda f: f.attrs.__setitem__("version", 1e300))
def allnan(f):
    def v(name, o):
        if isinstance(o, h5py.Dataset): o[...] = np.nan
    f.visititems(v)
copy("nan.h5", allnan)
def one_nan(f):
    x = f["step_0001/proj_out"]; y = x[()]; y.flat[3] = np.nan; x[...] = y
copy("onenan.h5", one_nan)
def dup_order(f):
    g = f["step_0000"]; o = list(g.attrs["order"]); g.attrs["order"] = np.array(o + o[:3], dtype=h5py.string_dtype())
copy("dup_order.h5", dup_order)
PY
mkdir -p "$T/adir"

# #5
run "#5 stats: zero-length trailing axis, no SIGFPE" 0 "" -- stats "$T/zero_trailing.h5"
grep -q "zero_trailing .*empty (0 elements)" "$T/out" && ok "#5 stats row says 'empty (0 elements)'" || { bad "#5 stats row"; grep zero_trailing "$T/out"; }
run "#5 stats -q counts the empty dataset" 0 "1 empty (0 elements)" -- stats -q "$T/zero_trailing.h5"
run "#5 diff A B (B has the extra empty dataset, declared by nothing): exit 2, not SIGFPE" 2 "zero_trailing" -- diff -q "$T/A.h5" "$T/zero_trailing.h5"
run "#5 diff B A" 2 "zero_trailing" -- diff -q "$T/zero_trailing.h5" "$T/A.h5"
run "#5 diff B B: the empty dataset is not compared" 0 "1 empty (not compared)" -- diff -q "$T/zero_trailing.h5" "$T/zero_trailing.h5"
# #6b
# "at once": the CPU time the two runs used (not the wall clock, which a loaded machine stretches)
run "#6b stats: 10^13 claimed values in a $(stat -c %s "$T/huge.h5")-byte file refused" 2 "huge: shape claims 8796093022208 values" -- stats "$T/huge.h5"
c1=$cpu
run "#6b diff X X refused too" 2 "more than compression can expand" -- diff "$T/huge.h5" "$T/huge.h5"
ms=$(awk -v a="$c1" -v b="$cpu" 'BEGIN { printf "%d", 1000 * (a + b) }')
[ $ms -lt 10000 ] && ok "#6b both answered in ${ms} ms of CPU" || bad "#6b took ${ms} ms of CPU"
# #13
"$OR" diff --json "$T/A.h5" "$T/A.h5" >/dev/full 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "cannot write to standard output: No space left on device" "$T/err" \
  && ok "#13 diff --json > /dev/full: exit 2, $(cat "$T/err")" || { bad "#13 stdout: rc=$rc"; cat "$T/err"; }
"$OR" stats "$T/A.h5" >/dev/full 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && ok "#13 stats > /dev/full: exit 2" || bad "#13 stats stdout: rc=$rc"
for kind in html junit; do
  (trap '' XFSZ; ulimit -f 4; exec "$OR" diff -q "$T/A.h5" "$T/A.h5" --$kind "$T/r.$kind") >/dev/null 2>"$T/err"; rc=$?
  left=$(ls "$T" | grep -c "^r\.$kind" || true)
  [ $rc -eq 2 ] && [ "$left" -eq 0 ] && grep -q "cannot write the" "$T/err" \
    && ok "#13 --$kind over a 4 KB file-size limit: exit 2, no file or temporary left ($(cat "$T/err"))" \
    || { bad "#13 --$kind: rc=$rc, $left files left"; cat "$T/err"; ls "$T"; }
done
run "#13 --html into a missing directory: exit 2" 2 "cannot write the HTML report" -- diff -q "$T/A.h5" "$T/A.h5" --html "$T/nodir/r.html"
run "#13 --junit onto a directory: exit 2" 2 "cannot write the JUnit report" -- diff -q "$T/A.h5" "$T/A.h5" --junit "$T/adir"
"$OR" diff -q "$T/A.h5" "$T/A.h5" --html "$T/ok.html" --junit "$T/ok.xml" >/dev/null 2>&1
[ -s "$T/ok.html" ] && [ -s "$T/ok.xml" ] && [ -z "$(ls "$T" | grep '\.tmp\.')" ] && ok "#13 reports written whole, temporaries renamed away" || bad "#13 reports"
# #14
run "#14 a directory: one clean line" 2 "adir: is a directory, not a dump file" -- stats "$T/adir"
if grep -q "0x" "$T/err"; then bad "#14 pointer in the message"; else ok "#14 no pointer in the message"; fi
# #16
run "#16 version = 1e300: a clean error" 2 "without an integer 'version' attribute" -- stats "$T/v1e300.h5"
# messages
run "--truth summary line names the rule, not 'm )'" 0 "arbiter --truth" -- diff "$T/A.h5" "$T/A.h5" --truth "$T/A.h5"
if grep -qF "m )" "$T/out"; then bad "--truth summary still prints 'm )'"; else ok "--truth summary: $(grep -F 'arbiter' "$T/out" | head -1)"; fi
run "stats names /inputs datasets by path" 1 "NONFINITE: first at /inputs/hidden_states" -- stats -q "$T/nan.h5"
run "two all-NaN dumps do not pass" 1 "non-finite on both sides" -- diff -q "$T/nan.h5" "$T/nan.h5"
run "one NaN, against itself: non-finite on both sides at the same place" 1 "DIVERGE at step 1 proj_out: non-finite on both sides: NaN in A and B at the same places" -- diff -q "$T/onenan.h5" "$T/onenan.h5"
"$OR" diff -q "$T/A.h5" "$T/A.h5" >"$T/self" 2>&1
run "an \`order\` naming datasets twice: each compared once" 0 "$(grep -o '^PASS: [0-9]* tensors compared' "$T/self")" -- diff -q "$T/A.h5" "$T/dup_order.h5"
v1=$("$SIM" --version | grep -o '[0-9][0-9.]*' | head -1); v2=$("$OR" --version | grep -o '[0-9][0-9.]*' | head -1)
[ -n "$v1" ] && [ "$v1" = "$v2" ] && ok "one version: flux-sim $v1, flux-oracle $v2" || bad "versions differ: flux-sim '$v1', flux-oracle '$v2'"
finish
