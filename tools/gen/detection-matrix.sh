#!/usr/bin/env bash
# Detection matrix: every bug of `flux-sim --inject list` under every parallel layout below, each a
# real `mpirun ... flux-sim --check` run, plus one run per layout without --inject (must all pass:
# zero false positives). Prints a Markdown document on stdout (`make matrix` writes it to
# docs/detection-matrix.md); progress goes to stderr, each run's full output to $MATRIX_LOGS
# (default build/matrix-logs).
#
# A cell is the first divergence --check reports (`sN · module`), `n/a` when flux-sim refused the
# injection before any compute because it cannot fire under that layout (exit 2, "cannot fire
# under"), `no effect` when it refused it because it would fire but change nothing there (exit 2,
# "fires but cannot change anything"), `OK` when --check passed, or `ERROR(rc)` for anything else
# (any other exit 2, a timeout = 124, a missing report). Exits non-zero if the no-injection row is
# not all OK, if a bug row has an OK (an injection that ran and was not caught: a miss), or if any
# cell is ERROR.
set -u -o pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
BIN=build/flux-sim
TIMEOUT=${MATRIX_TIMEOUT:-300}
LOGS=${MATRIX_LOGS:-build/matrix-logs}
BASE="--grid 5x7 --txt-len 13 --steps 2 --check -q"
NAN_SPEC="nan-rank:1:transformer_blocks.0.attn.to_k:1"

# layout | ranks
LAYOUTS=(
  "--tp 2|2"
  "--ulysses 2|2"
  "--ring 2|2"
  "--ring 2 --ring-rotate p2p|2"
  "--ring 3 --ring-rotate p2p|3"
  "--ulysses 2 --ring 2|4"
  "--tp 2 --ring 2|4"
  "--tp 2 --ulysses 2|4"
  "--cfg-parallel --true-cfg-scale 4 --tp 2|4"
  "--cfg-parallel --true-cfg-scale 4 --ring 2|4"
  "--text replicated --ring 2|2"
  "--text replicated --ulysses 2 --ring 2|4"
  "--pad mask --ring 2|2"
)

[ -x "$BIN" ] || { echo "detection-matrix: $BIN not built (make)" >&2; exit 2; }
mkdir -p "$LOGS"
# Run a private copy, so that a rebuild of build/flux-sim during the ~3 minutes of runs cannot mix
# two binaries in one matrix (or fail a launch while the linker rewrites the file).
SNAP=$(mktemp -d "${TMPDIR:-/tmp}/detection-matrix.XXXXXX") || exit 2
trap 'rm -rf "$SNAP"' EXIT
cp "$BIN" "$SNAP/flux-sim" || exit 2
BIN=$SNAP/flux-sim

# The catalogue: first word of each indented line of `--inject list`; nan-rank gets a concrete spec;
# fail-rank is a fault that ends the job, not a bug for --check (tests/rank_failure.sh).
BUGS=()
while read -r name _; do
  case "$name" in
  nan-rank:*) BUGS+=("$NAN_SPEC") ;;
  fail-rank:*) ;;
  *) BUGS+=("$name") ;;
  esac
done < <("$BIN" --inject list | grep -E '^  [a-z]')
[ ${#BUGS[@]} -gt 0 ] || { echo "detection-matrix: empty --inject list" >&2; exit 2; }

# Module paths shortened for the table (legend printed below it).
short() {
  sed -e 's/^single_transformer_blocks\./stb./' -e 's/^transformer_blocks\./tb./' -e 's/^time_text_embed\./tte./' <<<"$1"
}

# One run → two strings: CELL (divergence / OK / ERROR(rc)) and RANKS (what the report says about ranks).
run_case() { # bug-or-empty layout nranks
  local bug=$1 layout=$2 n=$3 slug out rc line step mod det
  slug=$(tr -c 'A-Za-z0-9.\n-' '_' <<<"${bug:-none}__${layout}")
  # shellcheck disable=SC2086
  out=$(timeout "$TIMEOUT" mpirun -np "$n" "$BIN" $BASE $layout ${bug:+--inject "$bug"} 2>&1)
  rc=$?
  printf '%s\n' "$out" >"$LOGS/$slug.log"
  CELL="ERROR($rc)"; RANKS=""
  if [ $rc -eq 0 ] && grep -q '^flux-sim --check: OK' <<<"$out"; then
    CELL=OK
  elif [ $rc -eq 2 ] && grep -q '^flux-sim: error: --inject .* cannot fire under ' <<<"$out"; then
    CELL=n/a
  elif [ $rc -eq 2 ] && grep -q '^flux-sim: error: --inject .* fires but cannot change anything under ' <<<"$out"; then
    CELL="no effect"
  elif [ $rc -eq 1 ] && line=$(grep -m1 '^flux-sim --check: DIVERGED at step ' <<<"$out"); then
    line=${line#flux-sim --check: DIVERGED at step }
    step=${line%%,*}; mod=${line#*, }
    CELL="s$step · $(short "$mod")"
    if det=$(grep -m1 -o 'element held by rank(s) [0-9, ]*' <<<"$out"); then
      RANKS="held by ${det#element held by rank(s) }"
    elif det=$(grep -m1 -o 'ranks holding the same [a-z]* piece disagree:.*' <<<"$out"); then
      local kind; kind=$(sed -E 's/ranks holding the same ([a-z]*) piece.*/\1/' <<<"$det")
      RANKS="$kind: $(grep -o 'rank [0-9]* != rank [0-9]*' <<<"$det" | sed -E 's/rank ([0-9]*) != rank ([0-9]*)/\1≠\2/' | paste -sd, - | sed 's/,/, /g')"
    elif grep -q 'incompatible shapes' <<<"$out"; then RANKS="shapes differ across ranks"
    elif grep -q 'do not tile' <<<"$out"; then RANKS="shards do not tile"
    elif grep -q 'single-rank reference has' <<<"$out"; then RANKS="shape ≠ reference"
    else RANKS="?"
    fi
  fi
  RANKS=${RANKS%, }
}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=""
if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- sim oracle Makefile 2>/dev/null; then
  dirty=" plus uncommitted changes to sim/, oracle/ or the Makefile in the working tree"
fi
started=$(date -u '+%Y-%m-%d %H:%M UTC')
t0=$(date +%s)

declare -A CELLS RANKMAP
rows=("" "${BUGS[@]}")
total=$(( ${#rows[@]} * ${#LAYOUTS[@]} )); k=0
for bug in "${rows[@]}"; do
  for l in "${LAYOUTS[@]}"; do
    layout=${l%|*}; n=${l##*|}; k=$((k + 1))
    run_case "$bug" "$layout" "$n"
    CELLS["$bug|$layout"]=$CELL; RANKMAP["$bug|$layout"]=$RANKS
    printf '[%3d/%d] %-45s %-30s %s\n' "$k" "$total" "${bug:-(no injection)}" "$layout" "$CELL" >&2
  done
done
elapsed=$(( $(date +%s) - t0 ))

# ---------------------------------------------------------------- the document
bad=0; nerr=0; nfp=0; nmiss=0
for bug in "${rows[@]}"; do
  for l in "${LAYOUTS[@]}"; do
    c=${CELLS["$bug|${l%|*}"]}
    case "$c" in ERROR*) nerr=$((nerr + 1)); bad=1 ;; esac
    if [ -z "$bug" ] && [ "$c" != OK ]; then nfp=$((nfp + 1)); bad=1; fi
    if [ -n "$bug" ] && [ "$c" = OK ]; then nmiss=$((nmiss + 1)); bad=1; fi
  done
done

header_row() {
  local h="| $1 |" s="|---|"
  for l in "${LAYOUTS[@]}"; do h+=" \`${l%|*}\` (${l##*|}) |"; s+="---|"; done
  echo "$h"; echo "$s"
}

cat <<EOF
# Detection matrix: injected bug × parallel layout

<!-- GENERATED by \`make matrix\` (tools/gen/detection-matrix.sh) from real runs. DO NOT EDIT BY HAND:
     change the script or the code and run \`make matrix\` again. -->

Generated by \`make matrix\` (\`tools/gen/detection-matrix.sh\`) from real \`mpirun\` runs; **do not edit by
hand**. flux-sim commit \`$commit\`$dirty, $started; ${total} runs in ${elapsed} s.
The catalogue, mechanisms and sources are in [bugs.md](bugs.md).

Every cell is one run of

    timeout $TIMEOUT mpirun -np RANKS build/flux-sim $BASE LAYOUT [--inject BUG]

(built-in default model, 35 image + 13 text tokens, 2 steps, fp32; \`nan-rank\` is run as
\`--inject $NAN_SPEC\`). RANKS is given in each column header.

- \`sN · module\`: \`--check\` exited 1, reporting its first divergence at step N in that module.
- \`n/a\`: flux-sim refused the injection before any compute (exit 2, one line: "cannot fire under
  LAYOUT: why; it shows under ..."): its code path does not exist in that layout.
- \`no effect\`: refused likewise because it would fire but cannot change any result in that
  layout and shape ("fires but cannot change anything under ...").
- \`OK\`: \`--check\` passed (exit 0). Expected only in the no-injection row; in a bug row it would
  be an injection that ran and was not caught (a miss), and the script fails.
- \`ERROR(rc)\`: anything else (another exit 2, 124 = timeout, no report); never expected.

\`fail-rank\` (a fault that ends the job, not a wrong result) is tested by \`tests/rank_failure.sh\`,
not here.

Module legend: \`tb.N\` = \`transformer_blocks.N\` (double-stream), \`stb.N\` =
\`single_transformer_blocks.N\`, \`tte\` = \`time_text_embed\`; other names are flux-sim's module paths
as recorded (\`pos_embed#0\` is the RoPE cos table, \`@1\` the second call of a module).

## First divergence

EOF
header_row "bug \\ layout"
for bug in "${rows[@]}"; do
  label=${bug:+\`$bug\`}; label=${label:-**no injection**}
  r="| $label |"
  for l in "${LAYOUTS[@]}"; do
    c=${CELLS["$bug|${l%|*}"]}
    case "$c" in OK) r+=" ${bug:+**}OK${bug:+**} |" ;; ERROR*) r+=" **$c** |" ;; *) r+=" $c |" ;; esac
  done
  echo "$r"
done

cat <<EOF

## What the report says about ranks

For each divergence above, how \`--check\`'s report attributes it. \`held by R\`: the ranks agree
with one another, the tensor they assemble differs from the single-rank reference, and the worst
element lies in the piece of rank(s) R (report: \`element held by rank(s) R\`; for a replicated
tensor that is every rank holding it). \`replicated: a≠b\` / \`sharded: a≠b\`: ranks that should
hold the same piece disagree (report: \`ranks holding the same replicated|sharded piece disagree:
rank a != rank b\`), caught from the pieces' hashes before any comparison with the
reference. \`—\` where the cell is OK, n/a or no effect.

EOF
header_row "bug \\ layout"
for bug in "${rows[@]}"; do
  label=${bug:+\`$bug\`}; label=${label:-**no injection**}
  r="| $label |"
  for l in "${LAYOUTS[@]}"; do
    c=${CELLS["$bug|${l%|*}"]}; x=${RANKMAP["$bug|${l%|*}"]}
    case "$c" in OK | n/a | "no effect") r+=" — |" ;; ERROR*) r+=" **$c** |" ;; *) r+=" $x |" ;; esac
  done
  echo "$r"
done

echo
if [ $bad -eq 0 ]; then
  echo "Summary: no false positive (the no-injection row is all OK), no miss (no bug row has an OK: every"
  echo "injection either diverged or was refused as unable to act) and no ERROR cell."
else
  echo "Summary: **FAILED** — $nfp no-injection cell(s) not OK, $nmiss miss(es) (a bug row with OK), $nerr"
  echo "ERROR cell(s). Logs: \`$LOGS/\`."
fi
[ $bad -eq 0 ]
