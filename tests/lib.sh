# tests/lib.sh: what the shell tests share. Each test starts with
#   . "$(dirname "$0")/lib.sh"
# which leaves it in the repository root (so `bash tests/X.sh` works from anywhere) with:
#   ok MSG / bad MSG     count a pass / a failure and print "ok   MSG" / "FAIL MSG"
#   skip MSG             print "*** SKIPPED MSG ***" (MSG says what did NOT run and why; the
#                        runner, tools/ci/run-tests.sh, reports every line holding SKIPPED)
#   skip_all MSG         skip, then finish: the whole test did not run
#   finish               print the closing "N passed, N failed" and exit 0 when nothing failed,
#                        else 1 (runs the test's cleanup through the EXIT trap)
#   B SIM ORACLE         the build folder (FLUX_BUILD, default build) and its two CLIs
#   REF                  the diffusers reference dumps (FLUX_REFERENCE_DIR, ../shared/reference)
#   PY                   the Python interpreter: $PYTHON, else python3 from PATH (the first
#                        there with h5py and NumPy)
#   tmpdir NAME          T=a fresh /tmp/fluxsim-NAME-XXXXXX, removed when the test exits (a test
#                        with more to undo defines test_cleanup, which runs first)
#   mpirun_per_rank DIR NP [MPIRUN-OPTIONS... --] CMD...
#                        mpirun -np NP CMD..., each rank's stdout and stderr in its own file
#                        DIR/rank.N (Open MPI's world rank): figures every rank prints are read
#                        from that rank's file, never from one stream the ranks share (there,
#                        lines of two ranks can interleave mid-line). mpirun's own messages go
#                        to the caller's stdout/stderr. Under `timeout 300` (a hang guard);
#                        returns mpirun's exit status (124: the guard ended it).
#   measured FILE CMD... runs CMD under /usr/bin/time and writes "PEAK_RSS_KIB CPU_SECONDS" (user +
#                        system, children included) to FILE; returns CMD's status. A bound on
#                        what a run costs is put on these, never on wall-clock time, which
#                        depends on how loaded the machine is (CI: 2 cores, load up to 7).
# and the environment every mpirun here needs (root in a container, more ranks than cores, one
# BLAS thread per rank).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1

B=${FLUX_BUILD:-build}
SIM=$B/flux-sim
ORACLE=$B/flux-oracle
REF=${FLUX_REFERENCE_DIR:-../shared/reference}
# $PYTHON if set; else, in PATH order, the first python3 that has the tests' h5py and NumPy (a
# pyenv or venv python3 ahead of the system one often lacks them), else the first python3
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
else
  PY=
  for p in $(type -ap python3); do "$p" -c 'import h5py, numpy' 2>/dev/null && { PY=$p; break; }; done
  PY=${PY:-python3}
fi

pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
skip() { echo "*** SKIPPED $* ***"; }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ] && exit 0; exit 1; }
skip_all() { skip "$@"; finish; }

T=
_lib_tmps=() # every folder tmpdir made: a test may call it more than once
_lib_cleanup() {
  if declare -F test_cleanup >/dev/null; then test_cleanup; fi
  local d
  for d in "${_lib_tmps[@]}"; do rm -rf "$d"; done
}
trap _lib_cleanup EXIT
tmpdir() {
  T=$(mktemp -d "/tmp/fluxsim-$1-XXXXXX") || { echo "FAIL cannot make a temporary folder"; exit 1; }
  _lib_tmps+=("$T")
}

mpirun_per_rank() {
  local dir=$1 np=$2 opts=(); shift 2
  if [[ " $* " == *" -- "* ]]; then while [ "$1" != -- ]; do opts+=("$1"); shift; done; shift; fi
  mkdir -p "$dir" && rm -f "$dir"/rank.*
  timeout 300 mpirun -np "$np" "${opts[@]}" sh -c 'exec "$@" >"$0/rank.$OMPI_COMM_WORLD_RANK" 2>&1' "$dir" "$@" </dev/null
}

measured() {
  local f=$1 rc; shift
  /usr/bin/time -f '%M %U %S' -o "$f.time" "$@"; rc=$?
  tail -n 1 "$f.time" | awk '{ printf "%d %.2f\n", $1, $2 + $3 }' >"$f"
  return $rc
}

# expect_refusals SPEC...: each SPEC "NP|OPTIONS|WANT" runs `run NP OPTIONS` (the calling test's run
# function) and passes when it exits 2 with a `flux-sim: error` line containing WANT.
expect_refusals() {
  local c n opts want out rc
  for c in "$@"; do
    IFS='|' read -r n opts want <<<"$c"
    # shellcheck disable=SC2086
    out=$(run "$n" $opts); rc=$?
    if [ $rc -eq 2 ] && grep -qF -- "$want" <<<"$out" && [ "$(grep -c '^flux-sim: error' <<<"$out")" -ge 1 ]; then ok "refused: $opts"
    else bad "$opts: exit $rc, expected a refusal saying '$want'"; head -3 <<<"$out"; fi
  done
}

# expect_caught EXTRA SPEC...: each SPEC "NP|OPTIONS|MODULE[|WANT]" runs `run NP EXTRA OPTIONS` (the
# calling test's run function, with --check) and passes when it exits 1 with "flux-sim --check:
# DIVERGED at step 0, MODULE" and a line containing WANT (default: the ranks that hold it,
# "held by rank(s) N...").
expect_caught() {
  local extra=$1 c n opts mod want out rc held; shift
  for c in "$@"; do
    IFS='|' read -r n opts mod want <<<"$c"
    # shellcheck disable=SC2086
    out=$(run "$n" $extra $opts); rc=$?
    held=$(grep -o 'held by rank(s) [0-9][0-9, ]*' <<<"$out" | head -1)
    if [ $rc -eq 1 ] && grep -qxF "flux-sim --check: DIVERGED at step 0, $mod" <<<"$out" &&
       if [ -n "$want" ]; then grep -qF -- "$want" <<<"$out"; else [ -n "$held" ]; fi; then
      ok "${extra:+$extra }$opts: caught at step 0 $mod${held:+ ($held)}"
    else bad "${extra:+$extra }$opts: exit $rc, expected DIVERGED at step 0 $mod${want:+ ($want)}"; head -6 <<<"$out"; fi
  done
}

# same_as_default WHAT SPEC...: each SPEC "NP|OPTIONS": a one-step dump with OPTIONS and one with
# OPTIONS WHAT (in $T, from tmpdir) must be bit-identical (flux-oracle diff at tolerance 0).
same_as_default() {
  local what=$1 c n args; shift
  for c in "$@"; do
    IFS='|' read -r n args <<<"$c"
    # shellcheck disable=SC2086
    timeout 300 mpirun -np "$n" "$SIM" --steps 1 -q $args --dump "$T/a.h5" </dev/null >/dev/null 2>&1 &&
      timeout 300 mpirun -np "$n" "$SIM" --steps 1 -q $args $what --dump "$T/b.h5" </dev/null >/dev/null 2>&1
    if "$ORACLE" diff --rtol 0 --atol 0 --mtol 0 "$T/a.h5" "$T/b.h5" >/dev/null 2>&1; then ok "$what $args: bit-identical to the default"
    else bad "$what $args differs from the default layout"; fi
    rm -f "$T/a.h5" "$T/b.h5"
  done
}
