#!/usr/bin/env bash
# The CI recipe of docs/ci.md, end to end: a "GPU run" (the diffusers reference
# ../shared/reference/tiny/dump_fp32.h5 stands in for it) is replayed by flux-sim from its own
# inputs and weights, the replay is diffed against the GPU dump, and the JSON / JUnit / HTML
# reports are checked the way a CI job would consume them:
#   - clean replay: exit 0; the JUnit parses (xml.etree), counts agree with its testcases, no
#     failure or error; the JSON parses with verdict "pass"; the HTML exists;
#   - one dataset of the reference perturbed with h5py: exit 1, exactly that testcase fails in the
#     JUnit, with rel L2, max|A-B|/max|B|, the tolerance and the coordinates in the <failure>;
#   - a reference whose producer stopped early: exit 2, one <error> testcase, JSON verdict error.
# Without ../shared/reference this test is SKIPPED, loudly.
. "$(dirname "$0")/lib.sh"
OR=${FLUX_BUILD:-build}/flux-oracle
ref=${FLUX_REFERENCE_DIR:-../shared/reference}
if [ ! -f "$ref/tiny/dump_fp32.h5" ] || [ ! -f "$ref/tiny/weights.safetensors" ]; then
  skip_all "CI recipe test: $ref/tiny not found — it did NOT run"
fi
tmpdir ci
GPU=$ref/tiny/dump_fp32.h5 W=$ref/tiny/weights.safetensors

# ---- the recipe (docs/ci.md, "The job") ----
compare() { # compare GOLDEN.h5 OUTDIR: replay the GPU run, diff against GOLDEN, publish reports
  local golden=$1 out=$2
  mkdir -p "$out"
  "$SIM" -q --inputs "$GPU" --weights "$W" --dump "$out/sim.h5" || return 2
  "$OR" diff "$out/sim.h5" "$golden" --json --junit "$out/report.xml" --html "$out/report.html" >"$out/report.json" 2>"$out/stderr"
}

s=$(date +%s%N)
compare "$GPU" "$T/clean"; rc=$?
echo "clean recipe: $(( ($(date +%s%N) - s) / 1000000 )) ms"
[ $rc -eq 0 ] && ok "clean replay vs GPU dump: exit 0" || { bad "clean: rc=$rc"; cat "$T/clean/stderr"; }
if $PY - "$T/clean" <<'PY'; then ok "clean: JUnit valid with matching counts and no failure; JSON verdict pass; HTML written"; else bad "clean reports"; fi
import sys, json, os, xml.etree.ElementTree as ET
d = sys.argv[1]
root = ET.parse(f"{d}/report.xml").getroot()
assert root.tag == "testsuites"
suite = root.find("testsuite"); cases = suite.findall("testcase")
assert int(suite.get("tests")) == len(cases) > 200, (suite.get("tests"), len(cases))
assert suite.get("failures") == "0" and suite.get("errors") == "0", suite.attrib
assert not any(c.find("failure") is not None or c.find("error") is not None for c in cases)
assert {c.get("classname") for c in cases} >= {"inputs", "step_0000", "step_0003", "final"}
j = json.load(open(f"{d}/report.json"))
assert j["verdict"] == "pass" and j["n_compared"] > 200 and j["n_failed"] == 0, (j["verdict"], j["n_compared"])
# flux-sim records every module at every step; the reference only depth<=2 after step 0 and says
# so (recorded_modules): those names are listed, as skipped testcases, not errors
assert len(j["only_in_a"]) > 0 and j["undeclared_only_in_a"] == [] and j["only_in_b"] == []
skipped = [c for c in cases if c.find("skipped") is not None]
assert len(skipped) == len(j["only_in_a"]) == int(suite.get("skipped"))
assert os.path.getsize(f"{d}/report.html") > 10000
print("testcases", len(cases), "compared", j["n_compared"], "skipped", len(skipped))
PY

# ---- a failing case: one dataset of the golden dump perturbed ----
$PY - "$GPU" "$T/perturbed.h5" "$T/stopped.h5" <<'PY' || bad "fixtures"
import sys, shutil, os, h5py, numpy as np
src, pert, stop = sys.argv[1:4]
for p in (pert, stop): shutil.copy(src, p); os.chmod(p, 0o644)
with h5py.File(pert, "r+") as f:
    x = f["step_0001/proj_out"][()]; x[0, 5, 3] += 0.05 * np.abs(x).max()
    del f["step_0001/proj_out"]; f["step_0001"].create_dataset("proj_out", data=x)
with h5py.File(stop, "r+") as f:
    del f["final"]; del f["step_0003"]      # the producer stopped after step 2
PY
compare "$T/perturbed.h5" "$T/fail"; rc=$?
[ $rc -eq 1 ] && ok "perturbed golden: exit 1" || { bad "perturbed: rc=$rc"; cat "$T/fail/stderr"; }
if $PY - "$T/fail" <<'PY'; then ok "perturbed: exactly step_0001/proj_out fails in the JUnit, with metrics, tolerance and coordinates"; else bad "perturbed reports"; fi
import sys, json, xml.etree.ElementTree as ET
d = sys.argv[1]
suite = ET.parse(f"{d}/report.xml").getroot().find("testsuite")
failed = [c for c in suite.findall("testcase") if c.find("failure") is not None]
assert [(c.get("classname"), c.get("name")) for c in failed] == [("step_0001", "proj_out")], failed
assert suite.get("failures") == "1" and suite.get("errors") == "0"
body = failed[0].find("failure").text
for k in ("rel L2", "max|A-B|/max|B|", "tolerance rtol", "at (0, 5, 3)"): assert k in body, (k, body)
assert "out of tolerance" in failed[0].find("failure").get("message")
j = json.load(open(f"{d}/report.json"))
assert j["verdict"] == "diverge" and j["first_divergence"]["name"] == "proj_out" and j["first_divergence"]["step"] == 1
print(body.replace("\n", "; "))
PY

# ---- an error: the golden run did not finish ----
compare "$T/stopped.h5" "$T/err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$T/err/stderr")" -eq 1 ] && ok "partial golden: exit 2, $(cat "$T/err/stderr")" || { bad "stopped: rc=$rc"; cat "$T/err/stderr"; }
if $PY - "$T/err" <<'PY'; then ok "partial: one <error> testcase naming the file; JSON verdict error; no HTML"; else bad "partial reports"; fi
import sys, os, json, xml.etree.ElementTree as ET
d = sys.argv[1]
suite = ET.parse(f"{d}/report.xml").getroot().find("testsuite")
cases = suite.findall("testcase")
assert len(cases) == 1 and cases[0].find("error") is not None and suite.get("errors") == "1"
assert "stopped.h5: partial dump" in cases[0].find("error").get("message")
assert json.load(open(f"{d}/report.json"))["verdict"] == "error"
assert not os.path.exists(f"{d}/report.html")
PY
finish
