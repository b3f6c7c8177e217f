#!/usr/bin/env bash
# flux-oracle (and flux-sim's dump reader) on the hostile inputs of reliability probe 3
# (/work/shared/reliability-probe-3.md), each case a regression test of one defect:
#   T2   a 64 KiB dataset name (and names of 1023-1080 bytes) through diff -q, the table,
#        --json, --junit, --html, stats, stats --json and consistency: compared and reported,
#        never skipped into a false PASS; an error about such a name keeps its cause; a step
#        whose `order` is a single string is an error, not an empty step; datasets `order`
#        does not list (in the group, or in a nested group) are compared
#   T4   a FIFO as a dump: flux-oracle stats/diff, flux-sim --inputs and --check= refuse it at
#        once (one line naming a FIFO), never hang
#   T5   a closed stdout pipe: exit 2, one line, and no --html/--junit report left
#   T9   names with a surrogate, U+FFFE, an overlong form, a code point above U+10FFFF and
#        control characters: the JUnit XML and the HTML parse (minidom, html.parser)
#   T12  such names in the table and the -q verdict: no raw ESC or newline reaches the terminal
#   T21  TERM=dumb and NO_COLOR: no colour on a terminal (util-linux `script` gives the pty)
#   T22  --junit cannot be written: the --html report is not published either (all or none)
# Every error must be exactly one line on stderr, every run end within its timeout.
. "$(dirname "$0")/lib.sh"
OR=${OR:-$ORACLE}
tmpdir hostile
if ! $PY -c "import h5py, numpy" 2>/dev/null; then
  skip_all "oracle hostile-input tests: python3-h5py/numpy not installed — they did NOT run"
fi
# run LABEL WANT_RC WANT_SUBSTRING -- ARGS: rc, exactly one stderr line for rc 2, the substring
# in stdout or stderr
run() {
  local label=$1 want_rc=$2 want=$3; shift 4
  timeout -s KILL 60 "$OR" "$@" >"$T/out" 2>"$T/err" </dev/null; local rc=$?
  local lines; lines=$(wc -l <"$T/err")
  if [ $rc -eq "$want_rc" ] && { [ "$want_rc" -ne 2 ] || [ "$lines" -eq 1 ]; } &&
     { [ -z "$want" ] || grep -qF -- "$want" "$T/err" "$T/out"; }
  then ok "$label"; else bad "$label: rc=$rc (want $want_rc), stderr lines $lines, want '$want'"; head -c 400 "$T/out"; head -c 600 "$T/err"; echo; fi
}
cat >"$T/mini.json" <<'JSON'
{"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 8, "out_channels": null,
 "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16, "num_attention_heads": 2,
 "joint_attention_dim": 16, "pooled_projection_dim": 16, "guidance_embeds": false, "axes_dims_rope": [4, 6, 6]}
JSON
"$SIM" -q --config "$T/mini.json" --grid 2x2 --txt-len 3 --steps 1 --dump "$T/S.h5" </dev/null || { bad "flux-sim"; finish; }

# craft OUT RECIPE...: a copy of S.h5 altered by h5py (recipes below); A files get +0.5 where B gets 0
$PY - "$T" <<'PY' || { bad "fixtures"; finish; }
import sys, shutil, json, h5py, numpy as np
T = sys.argv[1]
S = f"{T}/S.h5"
def names(g):
    return [s.decode() if isinstance(s, bytes) else s for s in g.attrs['order']]
def rename(out, new, delta, parallel=None):
    """x_embedder of step_0000 renamed to `new` (bytes), its values + delta, `order` updated"""
    shutil.copy(S, out)
    with h5py.File(out, 'r+') as f:
        g = f['step_0000']
        d = g['x_embedder'][...] + delta
        del g['x_embedder']
        g.create_dataset(new, data=d)
        order = [new if n == 'x_embedder' else n.encode() for n in names(g)]
        g.attrs.create('order', np.array(order, dtype=object), dtype=h5py.special_dtype(vlen=bytes))
        if parallel is not None:
            f.attrs['parallel'] = json.dumps(parallel)
def tweak(out, fn):
    shutil.copy(S, out)
    with h5py.File(out, 'r+') as f: fn(f['step_0000'])
long = b'L' * 65536
rename(f"{T}/A_long.h5", long, 0.5); rename(f"{T}/B_long.h5", long, 0.0)
for n in (1023, 1050, 1080, 1100):
    rename(f"{T}/A_{n}.h5", b'M' * n, 0.5); rename(f"{T}/B_{n}.h5", b'M' * n, 0.0)
# a name that would drive a terminal and spoof a line (T12 -q), and a plain divergence (T21)
rename(f"{T}/A_esc.h5", b'a\x1b[31mb\nPASS: all fine\x1b[0m', 0.5); rename(f"{T}/B_esc.h5", b'a\x1b[31mb\nPASS: all fine\x1b[0m', 0.0)
tweak(f"{T}/A_delta.h5", lambda g: g['proj_out'].__setitem__(Ellipsis, g['proj_out'][...] + 0.5))
# per-rank files for consistency: the long name replicated, rank 1's copy differs
shard = {"world": 2, "mesh": {"tp": 1, "ulysses": 2, "ring": 1}, "sharding": {long.decode(): "replicated"}}
rename(f"{T}/R0.h5", long, 0.0, dict(shard, rank=0)); rename(f"{T}/R1.h5", long, 0.5, dict(shard, rank=1))
# `order` a single string ("a,b,c"): the step must not vanish
def scalar_order(delta):
    def fn(g):
        g.attrs['order'] = ','.join(names(g))
        g['proj_out'][...] = g['proj_out'][...] + delta
    return fn
tweak(f"{T}/A_sorder.h5", scalar_order(0.5)); tweak(f"{T}/B_sorder.h5", scalar_order(0.0))
# a dataset `order` does not list, and one in a nested group
for tag, delta in (("A", 0.5), ("B", 0.0)):
    tweak(f"{T}/{tag}_unlisted.h5", lambda g, d=delta: g.create_dataset('extra', data=g['proj_out'][...] + d))
    tweak(f"{T}/{tag}_nested.h5", lambda g, d=delta: g.create_dataset('sub/inner', data=g['proj_out'][...] + d))
# hostile bytes (T9, T12): all in one pair of files, each name its own dataset
hostile = [b'x\xed\xa0\x80y', b'x\xef\xbf\xbey', b'x\xe0\x80\xbcscript\xe0\x80\xbe', b'x\xf4\x90\x80\x80y',
           b'a\x01b\x1b[31m\x7fc\x0bd', b'a\nb\rc', b'x\xff\xfe\xc0\xbcy', b'<script>]]>&"\'']
for tag, delta in (("A", 0.5), ("B", 0.0)):
    out = f"{T}/{tag}_bytes.h5"
    shutil.copy(S, out)
    with h5py.File(out, 'r+') as f:
        g = f['step_0000']
        order = [n.encode() for n in names(g)]
        for h in hostile:
            g.create_dataset(h, data=g['proj_out'][...] + delta)
            order.insert(-1, h)
        g.attrs.create('order', np.array(order, dtype=object), dtype=h5py.special_dtype(vlen=bytes))
PY

# parses FILE as XML (minidom) and as HTML (html.parser, strict about nothing but still a check
# that it reads to the end); prints what failed
wellformed() {
  $PY - "$@" <<'PY'
import sys, xml.dom.minidom, html.parser
for p in sys.argv[1:]:
    xml.dom.minidom.parse(p)
    h = html.parser.HTMLParser(); h.feed(open(p, encoding='utf-8').read()); h.close()
PY
}

# ---- T2: 64 KiB names through every command ----
run "T2 diff -q, 64 KiB name: diverges there (was PASS)" 1 "DIVERGE at step 0 LLLL" -- diff "$T/A_long.h5" "$T/B_long.h5" -q
run "T2 diff table, 64 KiB name" 1 "first divergence: step 0 LLLL" -- diff "$T/A_long.h5" "$T/B_long.h5"
run "T2 diff --json, 64 KiB name" 1 "" -- diff "$T/A_long.h5" "$T/B_long.h5" --json
if $PY -c "
import json, sys; r = json.load(open('$T/out'))
fd = r['first_divergence']
sys.exit(0 if r['verdict'] == 'diverge' and fd and fd['name'] == 'L' * 65536 else 1)"; then
  ok "T2 --json names the 64 KiB dataset whole as the first divergence"
else bad "T2 --json: first divergence is not the 64 KiB dataset"; fi
run "T2 diff --junit --html, 64 KiB name" 1 "" -- diff "$T/A_long.h5" "$T/B_long.h5" --junit "$T/l.xml" --html "$T/l.html"
if wellformed "$T/l.xml" "$T/l.html" && $PY -c "
import sys, xml.dom.minidom
d = xml.dom.minidom.parse('$T/l.xml')
tc = [t for t in d.getElementsByTagName('testcase') if t.getAttribute('name') == 'L' * 65536]
sys.exit(0 if tc and tc[0].getElementsByTagName('failure') and 'L' * 65536 in open('$T/l.html').read() else 1)"; then
  ok "T2 JUnit and HTML hold the 64 KiB dataset (a failing testcase)"
else bad "T2 JUnit/HTML lack the 64 KiB dataset or do not parse"; fi
run "T2 stats, 64 KiB name: listed" 0 "LLLLLLLL" -- stats "$T/A_long.h5"
run "T2 stats --json, 64 KiB name" 0 "" -- stats "$T/A_long.h5" --json
if $PY -c "
import json, sys; r = json.load(open('$T/out'))
sys.exit(0 if any(d['name'] == 'L' * 65536 for d in r['datasets']) else 1)"; then
  ok "T2 stats --json lists the 64 KiB dataset"
else bad "T2 stats --json lacks the 64 KiB dataset"; fi
run "T2 consistency, 64 KiB replicated name differing on rank 1" 1 "LLLL" -- consistency "$T/R0.h5" "$T/R1.h5" -q
for n in 1023 1050 1080 1100; do
  run "T2 a $n-byte name: compared (was exit 2 with the cause cut, or PASS)" 1 "DIVERGE at step 0 MMMM" -- diff "$T/A_$n.h5" "$T/B_$n.h5" -q
done
run "T2 a 64 KiB name on one side only: the cause survives in one line" 2 "declares no reason" -- diff "$T/A_long.h5" "$T/S.h5" -q
if grep -q "LLL\.\.\.(655[0-9][0-9] bytes)" "$T/err" && [ "$(wc -c <"$T/err")" -lt 1200 ]; then
  ok "T2 the long name is shortened visibly in the error line"
else bad "T2 the error line does not shorten the name: $(head -c 300 "$T/err")"; fi
run "T2 \`order\` a single string: an error naming it (the step vanished: PASS)" 2 "attribute order is a single string" -- diff "$T/A_sorder.h5" "$T/B_sorder.h5" -q
run "T2 \`order\` a single string: stats refuses too" 2 "attribute order is a single string" -- stats "$T/A_sorder.h5"
run "T2 a dataset \`order\` does not list: compared" 1 "DIVERGE at step 0 extra" -- diff "$T/A_unlisted.h5" "$T/B_unlisted.h5" -q
run "T2 a dataset in a nested group: compared as sub/inner" 1 "DIVERGE at step 0 sub/inner" -- diff "$T/A_nested.h5" "$T/B_nested.h5" -q
run "T2 the unlisted dataset on one side only: reported" 2 "/step_0000/extra" -- diff "$T/A_unlisted.h5" "$T/S.h5" -q

# ---- T4: FIFOs ----
mkfifo "$T/fifo.h5"
run "T4 stats on a FIFO: refused at once (was a 60 s watchdog, 'corrupted HDF5')" 2 "is a FIFO" -- stats "$T/fifo.h5"
run "T4 diff against a FIFO" 2 "is a FIFO" -- diff "$T/S.h5" "$T/fifo.h5"
for args in "--inputs $T/fifo.h5" "--check=$T/fifo.h5 --config $T/mini.json --grid 2x2 --txt-len 3 --steps 1"; do
  # shellcheck disable=SC2086
  timeout -s KILL 60 "$SIM" -q $args >"$T/out" 2>"$T/err" </dev/null; rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "FIFO" "$T/err"; then ok "T4 flux-sim ${args%% *}: a FIFO refused, one line"
  else bad "T4 flux-sim ${args%% *} FIFO: rc=$rc (want 2; 124/137 = hang): $(head -c 300 "$T/err")"; fi
done

# ---- T5: a closed stdout pipe ----
for cmd in "diff $T/A_long.h5 $T/B_long.h5 --html $T/p.html --junit $T/p.xml" "stats $T/S.h5" "diff $T/S.h5 $T/S.h5 --json"; do
  # shellcheck disable=SC2086
  timeout -s KILL 60 "$OR" $cmd 2>"$T/err" </dev/null | (exec 0<&-; sleep 1); rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "standard output" "$T/err" && ! ls "$T"/p.* >/dev/null 2>&1; then
    ok "T5 ${cmd%% *} into a closed pipe: exit 2, one line, no report (was 141)"
  else bad "T5 ${cmd%% *} into a closed pipe: rc=$rc, $(cat "$T/err"), reports: $(ls "$T"/p.* 2>/dev/null)"; fi
done

# ---- T9 / T12: hostile bytes ----
run "T9 hostile names: diff --junit --html" 1 "" -- diff "$T/A_bytes.h5" "$T/B_bytes.h5" --junit "$T/b.xml" --html "$T/b.html"
if err=$(wellformed "$T/b.xml" "$T/b.html" 2>&1); then ok "T9 JUnit XML and HTML are well-formed (surrogate, U+FFFE, overlong, > U+10FFFF)"
else bad "T9 not well-formed: $(echo "$err" | tail -1)"; fi
if grep -qF 'x\xED\xA0\x80y' "$T/b.xml" && grep -qF 'x\xF4\x90\x80\x80y' "$T/b.html"; then
  ok "T9 invalid sequences shown as \\xHH text"
else bad "T9 invalid sequences not shown visibly"; fi
for q in "" -q; do
  # shellcheck disable=SC2086
  timeout -s KILL 60 "$OR" diff "$T/A_esc.h5" "$T/B_esc.h5" $q >"$T/out" 2>"$T/err" </dev/null; rc=$?
  if [ $rc -eq 1 ] && ! grep -q $'\x1b' "$T/out" && ! grep -q $'\r' "$T/out" && ! grep -q '^b\|^PASS' "$T/out" &&
     { [ -z "$q" ] || [ "$(wc -l <"$T/out")" -eq 1 ]; }; then
    ok "T12 diff ${q:-table}: names escaped (no ESC, CR or a line of its own)"
  else bad "T12 diff ${q:-table}: raw control characters from names reach the terminal"; fi
done
run "T12 stats table: names escaped" 0 'a\x01b\x1B[31m\x7Fc\x0Bd' -- stats "$T/A_bytes.h5"
if ! grep -q $'\x1b' "$T/out"; then ok "T12 stats: no raw ESC"; else bad "T12 stats prints raw ESC"; fi

# ---- T21: colour ----
if command -v script >/dev/null 2>&1; then
  tty_run() { env "$@" script -qec "$OR diff $T/A_delta.h5 $T/S.h5 -q" /dev/null </dev/null 2>/dev/null; }
  if tty_run TERM=xterm NO_COLOR= | grep -q $'\x1b\['; then
    if tty_run TERM=dumb | grep -q $'\x1b\['; then bad "T21 TERM=dumb: colour on a terminal"; else ok "T21 TERM=dumb: no colour"; fi
    if tty_run TERM=xterm NO_COLOR=1 | grep -q $'\x1b\['; then bad "T21 NO_COLOR=1: colour"; else ok "T21 NO_COLOR=1: no colour"; fi
    if env -u TERM script -qec "$OR diff $T/A_delta.h5 $T/S.h5 -q" /dev/null </dev/null 2>/dev/null | grep -q $'\x1b\['; then
      bad "T21 TERM unset: colour"; else ok "T21 TERM unset: no colour"; fi
    if env TERM=dumb script -qec "$OR diff $T/A_delta.h5 $T/S.h5 -q --color" /dev/null </dev/null | grep -q $'\x1b\['; then
      ok "T21 --color still forces colour"; else bad "T21 --color does not force colour"; fi
  else
    skip "T21 colour cases: no colour even with TERM=xterm under script(1) — they did NOT run"
  fi
else
  skip "T21 colour cases: util-linux script(1) not installed — they did NOT run"
fi

# ---- T22: reports all or none ----
rm -f "$T"/h.html*
run "T22 --junit into a missing folder: error" 2 "cannot write the JUnit report" -- diff "$T/A_unlisted.h5" "$T/B_unlisted.h5" --html "$T/h.html" --junit "$T/nodir/j.xml"
if ! ls "$T"/h.html* >/dev/null 2>&1; then ok "T22 ... and the HTML report is not published"; else bad "T22 HTML report left: $(ls "$T"/h.html*)"; fi
mkdir -p "$T/jdir/x"
run "T22 --junit a folder (the rename fails)" 2 "cannot write the JUnit report" -- diff "$T/A_unlisted.h5" "$T/B_unlisted.h5" --html "$T/h.html" --junit "$T/jdir"
if ! ls "$T"/h.html* >/dev/null 2>&1; then ok "T22 ... the HTML report published first is removed again"; else bad "T22 HTML report left after the JUnit rename failed"; fi
mkdir -p "$T/full"
if mount -t tmpfs -o size=64k tmpfs "$T/full" 2>/dev/null; then
  test_cleanup() { umount "$T/full" 2>/dev/null; }
  dd if=/dev/zero of="$T/full/fill" bs=4k 2>/dev/null
  run "T22 --junit onto a full disk" 2 "No space left on device" -- diff "$T/A_unlisted.h5" "$T/B_unlisted.h5" --html "$T/h.html" --junit "$T/full/j.xml"
  if ! ls "$T"/h.html* "$T"/full/j.xml* >/dev/null 2>&1; then ok "T22 full disk: neither report published, no temporary"
  else bad "T22 full disk: left $(ls "$T"/h.html* "$T"/full/j.xml* 2>/dev/null)"; fi
else
  skip "T22 full-disk case: cannot mount a tmpfs here (needs root) — it did NOT run"
fi
finish
