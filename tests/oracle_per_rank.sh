#!/usr/bin/env bash
# tests/oracle_per_rank.sh — flux-oracle on per-rank dumps (docs/oracle.md, "Per-rank dumps"):
#   - `diff DIR REF.h5` / `diff rank_0.h5 ... REF.h5` / `diff rank_1.h5 REF.h5`: flux-sim's own
#     --dump-per-rank files of --tp 2, --ring 2 (uneven: 5x7 grid, 13 text tokens: 18/17 image
#     and 7/6 text tokens, two intervals per rank in the single blocks), --ulysses 2 and
#     --tp 2 --ring 2 against a single-rank REF: exit 0; --json / --junit / --html;
#   - planted bugs: --inject missing-allreduce (TP), --inject ring-no-lse (ring), a piece edited
#     with h5py on one rank (sharded and replicated): exit 1 at the expected module and ranks,
#     and the same first divergence as `diff GLOBAL.h5 REF.h5` of the run's own --dump;
#   - `assemble DIR -o G.h5` reproduces the run's global --dump bit for bit (every dataset, every
#     attribute but `producer`), replays with `flux-sim --inputs G.h5`, and diffs as DIR does;
#     gaps, disagreeing overlaps, differing replicated copies and a missing rank: exit 2, one
#     line saying where, nothing left at OUT (no temporary either);
#   - a `partial` (sum before a reduction) entry is reported not comparable per rank; a partial
#     sum the reference lacks (Megatron's local product) is only in A, not undeclared;
#   - per-rank dumps and a reference with no comparable dataset (every one a partial sum, or
#     everything narrowed out by --modules): exit 2 "nothing compared", never a PASS;
#   - consistency with ranks 1-3 wrong (4 ranks): the split without --ref, ranks 1, 2, 3 with it.
. "$(dirname "$0")/lib.sh"
[ -x "$SIM" ] && [ -x "$ORACLE" ] || skip_all "oracle_per_rank: build $SIM and $ORACLE first"
command -v mpirun >/dev/null || skip_all "oracle_per_rank: no mpirun"
"$PY" -c 'import h5py, numpy' 2>/dev/null || skip_all "oracle_per_rank: $PY lacks h5py/numpy"
tmpdir oracle-per-rank
GEN=(-q --grid 5x7 --txt-len 13 --steps 2)
MPI=(timeout 300 mpirun --allow-run-as-root --oversubscribe)

"$SIM" "${GEN[@]}" --dump "$T/ref.h5" || { bad "single-rank reference"; finish; }

# run NAME NP LAYOUT...: DIR $T/NAME (per rank) and $T/NAME.h5 (global)
run() {
  local name=$1 np=$2; shift 2
  "${MPI[@]}" -np "$np" "$SIM" "${GEN[@]}" "$@" --dump-per-rank "$T/$name" --dump "$T/$name.h5" </dev/null >"$T/$name.log" 2>&1
}

# same_dump A B: every dataset bitwise equal (shape, dtype, bytes) and every attribute equal but `producer`
same_dump() {
  "$PY" - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
def walk(f):
    out = {}
    f.visititems(lambda n, o: out.__setitem__(n, o))
    return out
wa, wb = walk(a), walk(b)
assert set(wa) == set(wb), sorted(set(wa) ^ set(wb))[:5]
for n, x in wa.items():
    y = wb[n]
    assert type(x) == type(y), n
    if isinstance(x, h5py.Dataset):
        assert x.shape == y.shape and x.dtype == y.dtype, (n, x.shape, y.shape)
        assert x[()].tobytes() == y[()].tobytes(), n
    ka, kb = dict(x.attrs), dict(y.attrs)
    assert set(ka) == set(kb), (n, set(ka) ^ set(kb))
    for k in ka:
        assert np.array_equal(np.asarray(ka[k]), np.asarray(kb[k])), (n, k)
ra, rb = dict(a.attrs), dict(b.attrs)
ra.pop("producer", None), rb.pop("producer", None)
assert set(ra) == set(rb), set(ra) ^ set(rb)
for k in ra: assert np.array_equal(np.asarray(ra[k]), np.asarray(rb[k])), k
PY
}

# ---- correct runs: per-rank diff passes, assemble reproduces the global dump ----
for spec in "tp2 2 --tp 2" "ring2 2 --ring 2" "uly2 2 --ulysses 2" "tp2ring2 4 --tp 2 --ring 2"; do
  set -- $spec
  name=$1 np=$2; shift 2
  if ! run "$name" "$np" "$@"; then bad "$name: flux-sim $* failed: $(tail -2 "$T/$name.log")"; continue; fi
  out=$("$ORACLE" diff -q "$T/$name" "$T/ref.h5" 2>&1); rc=$?
  if [ $rc = 0 ] && [[ $out == PASS:* ]]; then ok "$name: diff DIR REF exit 0 ($out)"; else bad "$name: diff DIR REF rc=$rc $out"; fi
  files=$(ls "$T/$name"/rank_*.h5 | sort -t_ -k2 -n)
  out=$("$ORACLE" diff -q $files "$T/ref.h5" 2>&1); rc=$?
  [ $rc = 0 ] && ok "$name: diff rank_0.h5 ... REF exit 0" || bad "$name: diff rank files REF rc=$rc $out"
  out=$("$ORACLE" diff -q "$T/$name/rank_1.h5" "$T/ref.h5" 2>&1); rc=$?
  [ $rc = 0 ] && ok "$name: diff rank_1.h5 REF (one rank) exit 0" || bad "$name: diff rank_1.h5 REF rc=$rc $out"
  out=$("$ORACLE" assemble "$T/$name" -o "$T/$name.asm.h5" 2>&1); rc=$?
  if [ $rc = 0 ] && same_dump "$T/$name.asm.h5" "$T/$name.h5" 2>"$T/err"; then ok "$name: assemble = the run's global --dump, bit for bit"
  else bad "$name: assemble rc=$rc $out $(tail -1 "$T/err")"; fi
  out=$("$ORACLE" diff -q "$T/$name.asm.h5" "$T/ref.h5" 2>&1); rc=$?
  [ $rc = 0 ] && ok "$name: diff GLOBAL REF agrees (exit 0)" || bad "$name: diff assembled REF rc=$rc $out"
  if "$SIM" -q --inputs "$T/$name.asm.h5" --dump "$T/$name.replay.h5" >"$T/err" 2>&1 &&
     "$ORACLE" diff -q "$T/$name.replay.h5" "$T/ref.h5" >/dev/null; then ok "$name: flux-sim --inputs GLOBAL.h5 replays it"
  else bad "$name: replay of the assembled dump: $(tail -1 "$T/err")"; fi
done
ls "$T"/*.tmp.* >/dev/null 2>&1 && bad "assemble left a temporary" || ok "assemble leaves no temporary"

# ---- reports on a per-rank diff ----
"$ORACLE" diff "$T/ring2" "$T/ref.h5" --json --junit "$T/r.xml" --html "$T/r.html" >"$T/r.json"; rc=$?
if [ $rc = 0 ] && "$PY" - "$T/r.json" "$T/r.xml" "$T/r.html" <<'PY'; then ok "per-rank diff: --json, --junit, --html"; else bad "per-rank diff reports (rc=$rc)"; fi
import json, sys, xml.etree.ElementTree as ET
d = json.load(open(sys.argv[1]))
assert d["verdict"] == "pass" and d["per_rank"] is True and d["n_compared"] == len(d["datasets"]) > 300, d["verdict"]
by = {(x["group"], x["name"]): x for x in d["datasets"]}
assert by[("/step_0000", "single_transformer_blocks.0.proj_out")]["distribution"] == "sharded on dim 1"
assert by[("/step_0000", "norm_out.linear")]["distribution"] == "replicated"
assert by[("/step_0000", "latents_in")]["shape_a"] == [1, 35, 64]   # global coordinates
x = ET.parse(sys.argv[2]).getroot()
assert len(x.findall(".//testcase")) == d["n_compared"] and not x.findall(".//failure")
assert "<svg" in open(sys.argv[3]).read()
PY

# ---- planted bugs ----
# first_div JSON: "name ranks"
first_div() { "$PY" -c "
import json,sys; d=json.load(open(sys.argv[1])); f=d['first_divergence']
print(d['verdict'], f and f['step'], f and f['name'], f and ','.join(map(str, f['ranks'])))" "$1"; }
check_bug() { # NAME WANT_MODULE WANT_RANKS LAYOUT...
  local name=$1 mod=$2 ranks=$3 rc; shift 3
  local np=2
  if ! run "$name" "$np" "$@"; then bad "$name: flux-sim failed: $(tail -2 "$T/$name.log")"; return; fi
  "$ORACLE" diff --json "$T/$name" "$T/ref.h5" >"$T/$name.json"; local rc=$?
  local got; got=$(first_div "$T/$name.json")
  if [ $rc = 1 ] && [ "$got" = "diverge 0 $mod $ranks" ]; then ok "$name: diff DIR REF exit 1 at step 0 $mod, ranks $ranks"
  else bad "$name: rc=$rc got '$got', want 'diverge 0 $mod $ranks'"; fi
  "$ORACLE" diff --json "$T/$name.h5" "$T/ref.h5" >"$T/$name.g.json"
  local g; g=$(first_div "$T/$name.g.json")
  [ "${g% *}" = "${got% *}" ] && ok "$name: the run's global dump diverges at the same module" || bad "$name: global '$g' vs per-rank '$got'"
  "$ORACLE" assemble "$T/$name" -o "$T/$name.asm.h5" >/dev/null 2>"$T/$name.asm.err"; rc=$?
  if [ -n "$asm_refuses" ]; then
    # the replicated copies of a wrong run differ: there is no one global tensor to write
    [ $rc = 2 ] && [ ! -e "$T/$name.asm.h5" ] && grep -q "$asm_refuses" "$T/$name.asm.err" &&
      ok "$name: assemble refuses: $(cat "$T/$name.asm.err")" || bad "$name: assemble rc=$rc $(cat "$T/$name.asm.err")"
    return
  fi
  "$ORACLE" diff --json "$T/$name.asm.h5" "$T/ref.h5" >"$T/$name.a.json"
  g=$(first_div "$T/$name.a.json")
  [ "${g% *}" = "${got% *}" ] && ok "$name: diff GLOBAL REF (assembled) agrees with diff DIR REF" || bad "$name: assembled '$g' vs '$got'"
}
asm_refuses="transformer_blocks.0.attn.to_out.0: ranks 0 and 1 hold different values.*bit-identical" \
  check_bug tpbug transformer_blocks.0.attn.to_out.0 0,1 --tp 2 --inject missing-allreduce
asm_refuses= check_bug ringbug transformer_blocks.0.attn.to_out.0 0,1 --ring 2 --inject ring-no-lse

# one rank's file edited: a sharded piece (Ulysses keeps tokens split outside attention) and a
# replicated tensor
cp -r "$T/uly2" "$T/edit_sh"; cp -r "$T/uly2" "$T/edit_rep"
"$PY" - "$T" <<'PY'
import sys, h5py
T = sys.argv[1]
with h5py.File(f"{T}/edit_sh/rank_1.h5", "r+") as f:
    d = f["step_0000/transformer_blocks.1.ff.net.2"]; x = d[()]; x[0, 3, 5] += 0.5 * abs(x).max(); d[...] = x
with h5py.File(f"{T}/edit_rep/rank_1.h5", "r+") as f:
    d = f["step_0000/transformer_blocks.1.norm1.linear"]; x = d[()]; x[0, 7] += 1.0; d[...] = x
PY
"$ORACLE" diff --json "$T/edit_sh" "$T/ref.h5" >"$T/es.json"; rc=$?
got=$(first_div "$T/es.json")
[ $rc = 1 ] && [ "$got" = "diverge 0 transformer_blocks.1.ff.net.2 1" ] && ok "h5py-edited piece on rank 1: exit 1, its module, rank 1" || bad "edited piece: rc=$rc $got"
"$ORACLE" diff -q "$T/edit_sh" "$T/ref.h5" >"$T/out"
# rank 1 holds image tokens 18..34: its local token 3 is global image token 21
grep -q "at (0, 21, 5) (batch 0, image token 21, channel 5.*(A: rank 1's piece)" "$T/out" &&
  ok "edited piece: placed in global coordinates (image token 21), rank 1's piece named" || bad "edited piece message: $(cat "$T/out")"
"$ORACLE" diff --json "$T/edit_rep" "$T/ref.h5" >"$T/er.json"; rc=$?
got=$(first_div "$T/er.json")
[ $rc = 1 ] && [ "$got" = "diverge 0 transformer_blocks.1.norm1.linear 1" ] && ok "h5py-edited replicated copy on rank 1: exit 1, rank 1 only" || bad "edited replicated: rc=$rc $got"

# ---- assemble refuses what is not one global tensor ----
expect_refusal() { # WHAT DIR GREP
  local what=$1 dir=$2 want=$3
  rm -f "$T/bad.h5"
  "$ORACLE" assemble "$dir" -o "$T/bad.h5" >"$T/out" 2>"$T/err"; local rc=$?
  if [ $rc = 2 ] && [ "$(wc -l <"$T/err")" = 1 ] && grep -q -- "$want" "$T/err" && [ ! -e "$T/bad.h5" ] &&
     ! ls "$T"/bad.h5.tmp.* >/dev/null 2>&1; then ok "assemble refuses $what: $(cat "$T/err")"
  else bad "assemble $what: rc=$rc $(cat "$T/err") $(ls "$T" | grep bad)"; fi
}
for k in gap overlap; do cp -r "$T/ring2" "$T/$k"; done
"$PY" - "$T" <<'PY'
import sys, json, h5py
T = sys.argv[1]
def remap(d, name, ranges):
    for r in (0, 1):
        with h5py.File(f"{T}/{d}/rank_{r}.h5", "r+") as f:
            p = json.loads(f.attrs["parallel"]); p["sharding"][name]["ranges"] = ranges
            f.attrs["parallel"] = json.dumps(p)
remap("gap", "transformer_blocks.0.ff.net.2", [[[0, 18]], [[19, 36]]])      # token 18: nobody
remap("overlap", "transformer_blocks.0.ff.net.2", [[[0, 18]], [[17, 34]]])  # token 17: both, different
PY
expect_refusal "a gap" "$T/gap" "no rank holds element (0, 18, 0).*a gap"
expect_refusal "overlapping pieces that disagree" "$T/overlap" "ranks 0 and 1 hold different values at (0, 17, 0)"
expect_refusal "replicated copies that differ" "$T/edit_rep" "bit-identical"
cp -r "$T/tp2ring2" "$T/missing"; rm "$T/missing/rank_2.h5"
expect_refusal "a folder with a rank missing" "$T/missing" "rank_2.h5 is missing"
"$ORACLE" assemble "$T/tp2ring2/rank_0.h5" "$T/tp2ring2/rank_1.h5" -o "$T/bad.h5" 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "rank 2 of world 4 is missing" "$T/err" && [ ! -e "$T/bad.h5" ] && ok "assemble of 2 of 4 rank files: exit 2" || bad "assemble subset rc=$rc $(cat "$T/err")"
"$ORACLE" diff -q "$T/gap" "$T/ref.h5" >"$T/out" 2>&1; rc=$?
[ $rc = 1 ] && grep -q "transformer_blocks.0.ff.net.2" "$T/out" && ok "diff with a map that misplaces a piece: exit 1 there" || bad "diff of misplaced piece rc=$rc $(cat "$T/out")"

# ---- partial sums: declared, not comparable rank by rank ----
cp -r "$T/tp2" "$T/partial"
"$PY" - "$T" <<'PY'
import sys, json, h5py
for r in (0, 1):
    with h5py.File(f"{sys.argv[1]}/partial/rank_{r}.h5", "r+") as f:
        p = json.loads(f.attrs["parallel"]); p["partial"] = {"transformer_blocks.0.attn.to_out.0": "sum"}
        p["sharding"].pop("transformer_blocks.0.attn.to_out.0"); f.attrs["parallel"] = json.dumps(p)
PY
"$ORACLE" diff --json "$T/partial" "$T/ref.h5" >"$T/p.json"; rc=$?
if [ $rc = 0 ] && "$PY" -c "
import json,sys; d=json.load(open(sys.argv[1]))
x=[x for x in d['datasets'] if x['name']=='transformer_blocks.0.attn.to_out.0' and x['step']==0][0]
assert x['kind']=='empty' and 'partial sum' in x['message'], x" "$T/p.json"; then ok "a partial sum: reported not comparable per rank, the rest compared"
else bad "partial sum rc=$rc"; fi
"$ORACLE" assemble "$T/partial" -o "$T/bad.h5" 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "partial sum" "$T/err" && ok "assemble refuses a partial sum" || bad "assemble partial rc=$rc $(cat "$T/err")"

# a partial sum only the ranks hold (a row-parallel Linear's local product before its all-reduce,
# e.g. Megatron's `_Row.mm`; tests/peer_tp.sh): listed only in A, not an undeclared name (exit 0);
# the same extra dataset without the declaration: undeclared, exit 2
for decl in 1 0; do
  rm -rf "$T/extra"; cp -r "$T/tp2" "$T/extra"
  "$PY" - "$T" "$decl" <<'PY'
import sys, json, h5py, numpy as np
for r in (0, 1):
    with h5py.File(f"{sys.argv[1]}/extra/rank_{r}.h5", "r+") as f:
        x = "transformer_blocks.0.attn.to_out.0.mm"
        for g in [k for k in f if k.startswith("step_")]:
            f[g][x] = np.full(f[g]["transformer_blocks.0.attn.to_out.0"].shape, 0.5 * r, np.float32)
            f[g].attrs["order"] = np.array([o.decode() if isinstance(o, bytes) else o for o in f[g].attrs["order"]] + [x],
                                           dtype=h5py.string_dtype())
        if sys.argv[2] == "1":
            p = json.loads(f.attrs["parallel"]); p["partial"] = {x: "sum"}; f.attrs["parallel"] = json.dumps(p)
PY
  "$ORACLE" diff --json "$T/extra" "$T/ref.h5" >"$T/x.json" 2>"$T/x.err"; rc=$?
  got=$("$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['verdict'], len(d['only_in_a']), len(d['undeclared_only_in_a']))" "$T/x.json" 2>&1)
  if [ $decl = 1 ]; then
    [ $rc = 0 ] && [ "$got" = "pass 2 0" ] && ok "a declared partial sum the reference lacks: only in A (2 steps), not undeclared, exit 0" ||
      bad "declared partial only in A: rc=$rc $got $(cat "$T/x.err")"
  else
    [ $rc = 2 ] && [ "$got" = "error 2 2" ] && ok "the same extra dataset undeclared: exit 2" || bad "undeclared extra: rc=$rc $got"
  fi
done

# ---- nothing comparable: an error (exit 2, as documented), never a PASS ----
# /inputs and /final removed from every file (they are always compared), then every step dataset
# declared a partial sum (not comparable per rank), or everything narrowed out by --modules
cp -r "$T/tp2" "$T/none"; cp "$T/ref.h5" "$T/none.ref.h5"
"$PY" - "$T" <<'PY'
import sys, json, h5py
t = sys.argv[1]
for p in (f"{t}/none/rank_0.h5", f"{t}/none/rank_1.h5", f"{t}/none.ref.h5"):
    with h5py.File(p, "r+") as f:
        for g in ("inputs", "final"):
            if g in f: del f[g]
        if "parallel" in f.attrs:
            par = json.loads(f.attrs["parallel"]); names = set()
            f.visititems(lambda n, o: names.add(n.split("/", 1)[1]) if isinstance(o, h5py.Dataset) else None)
            par["partial"] = {n: "sum" for n in names}; f.attrs["parallel"] = json.dumps(par)
PY
nothing() { # NAME ARGS...: exit 2, one line naming "nothing compared"
  local name=$1; shift
  "$ORACLE" diff -q "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ $rc = 2 ] && [ "$(wc -l <"$T/err")" = 1 ] && grep -q "nothing compared" "$T/err" && ! grep -q PASS "$T/out"; then ok "$name: exit 2 ($(cat "$T/err"))"
  else bad "$name: rc=$rc $(cat "$T/out" "$T/err")"; fi
}
nothing "per-rank diff, every dataset a partial sum" "$T/none" "$T/none.ref.h5"
nothing "per-rank diff, one rank file, every dataset a partial sum" "$T/none/rank_1.h5" "$T/none.ref.h5"
nothing "per-rank diff, --modules selecting nothing" "$T/none" "$T/none.ref.h5" --modules nomatch
"$ORACLE" diff --json "$T/none" "$T/none.ref.h5" >"$T/n.json" 2>/dev/null; rc=$?
[ $rc = 2 ] && "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['verdict']=='error' and d['n_compared']==0, d" "$T/n.json" 2>/dev/null \
  && ok "per-rank diff --json with nothing compared: verdict error, exit 2" || bad "nothing compared --json rc=$rc $(head -c 300 "$T/n.json")"

# ---- consistency: no blame by majority ----
cp -r "$T/tp2ring2" "$T/cons"
"$PY" - "$T" <<'PY'
import sys, h5py
for r in (1, 2, 3):   # ranks 1-3 wrong the same way (seed 000: timestep zeroed on ranks > 0)
    with h5py.File(f"{sys.argv[1]}/cons/rank_{r}.h5", "r+") as f:
        d = f["step_0000/time_text_embed.time_proj"]; d[...] = 0 * d[()] + 0.25
PY
"$ORACLE" consistency -q "$T/cons" >"$T/c.out" 2>&1; rc=$?
if [ $rc = 1 ] && grep -q "ranks 0 | 1, 2, 3" "$T/c.out" && ! grep -q "disagrees" "$T/c.out" && grep -q "without a reference" "$T/c.out"
then ok "consistency without --ref: the split (0 | 1, 2, 3), no culprit"; else bad "consistency split rc=$rc $(cat "$T/c.out")"; fi
"$ORACLE" consistency --json "$T/cons" >"$T/c.json"
[ "$(first_div "$T/c.json")" = "diverge 0 time_text_embed.time_proj 0,1,2,3" ] && ok "consistency --json without --ref: every rank involved" || bad "consistency json: $(first_div "$T/c.json")"
"$ORACLE" consistency -q "$T/cons" --ref "$T/ref.h5" >"$T/c.out" 2>&1; rc=$?
if [ $rc = 1 ] && grep -q "ranks 1, 2, 3 differ from the reference" "$T/c.out" && grep -q "rank 0 agrees with it" "$T/c.out"
then ok "consistency --ref: ranks 1, 2, 3 blamed"; else bad "consistency --ref rc=$rc $(cat "$T/c.out")"; fi
"$ORACLE" consistency --json "$T/cons" --ref "$T/ref.h5" >"$T/c.json"
[ "$(first_div "$T/c.json")" = "diverge 0 time_text_embed.time_proj 1,2,3" ] && ok "consistency --ref --json: ranks [1, 2, 3]" || bad "consistency --ref json: $(first_div "$T/c.json")"
"$ORACLE" consistency -q "$T/tp2ring2" --ref "$T/ref.h5" >/dev/null; rc=$?
[ $rc = 0 ] && ok "consistency --ref on a correct run: exit 0" || bad "consistency --ref correct rc=$rc"

# ---- argument errors ----
"$ORACLE" diff "$T/tp2ring2/rank_0.h5" "$T/tp2/rank_1.h5" "$T/ref.h5" -q >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "not ranks of one run" "$T/err" && ok "diff of rank files of two runs: exit 2" || bad "mixed runs rc=$rc $(cat "$T/err")"
"$ORACLE" assemble "$T/tp2" >/dev/null 2>"$T/err"; rc=$?
[ $rc = 2 ] && grep -q "needs -o" "$T/err" && ok "assemble without -o: exit 2" || bad "assemble no -o rc=$rc"
finish
