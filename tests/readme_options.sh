#!/usr/bin/env bash
# README's CLI reference says what the CLIs accept (issue 9). For flux-sim and flux-oracle, the
# options (--name tokens) of three sources are compared:
#   H  what `--help` prints;
#   C  what the option parser accepts (getopt_long's table in sim/main_flux_sim.c, the
#      strcmp(a, "--x") chain in oracle/main_flux_oracle.c);
#   R  the first column of the tables under "### flux-sim" / "### flux-oracle" in README's
#      "## CLI reference" section (up to the next "## " heading).
# Checks: H is in C (help lists nothing the parser refuses); H is in R and R is in H ∪ C (README
# lists every option of --help, and nothing the program lacks); an option in C but not in H is in
# R, in a row saying "Not listed by `--help`", and a row saying so is for such an option; no option
# has two rows; every --token anywhere in the section is an option of one of the two CLIs; every
# environment variable sim/ and oracle/ read is in the section, and every FLUX_* variable the
# section names is used in the tree.
# Usage: tests/readme_options.sh [README.md]   (binaries from ${FLUX_BUILD:-build})
export LC_ALL=C
README=$(realpath -- "${1:-$(dirname "$0")/../README.md}") || exit 2
. "$(dirname "$0")/lib.sh"
tmpdir readme
opts() { grep -oE -- '--[a-z][a-z0-9-]*' | sort -u; }
words() { tr '\n' ' ' | sed 's/ *$//'; }
only_in() { comm -23 "$1" "$2" | words; } # lines of sorted file $1 not in $2

# the CLI reference section, and one ### subsection of it
awk '/^## CLI reference/ {on = 1; next} on && /^## / {exit} on' "$README" >"$T/section"
sub_of() { awk -v h="### $1" '$0 == h {on = 1; next} on && /^##/ {exit} on' "$T/section"; }
# table rows (not the header or separator row) of stdin; `\|` inside a cell is not a separator
rows() { grep -E '^\|' | grep -vE '^\|[ -]*\|[ -]*\|$' | grep -vE '^\| *(option|command|variable) *\|' | sed 's/\\|/\x01/g'; }
first_col() { awk -F'|' '{print $2}'; }

for cli in flux-sim flux-oracle; do
  if [ ! -x "$B/$cli" ]; then
    bad "$B/$cli not built (make, or set FLUX_BUILD)"
    finish
  fi
done
if [ ! -s "$T/section" ]; then
  bad "$README has no '## CLI reference' section"
  finish
fi

for cli in flux-sim flux-oracle; do
  if ! "$B/$cli" --help >"$T/$cli.help" 2>&1; then bad "$B/$cli --help failed (exit $?)"; continue; fi
  opts <"$T/$cli.help" >"$T/$cli.H"
  if [ $cli = flux-sim ]; then
    grep -oE '\{"[a-z][a-z0-9-]*", *(no|required|optional)_argument' sim/main_flux_sim.c | sed -E 's/^\{"([^"]*)".*/--\1/'
  else
    grep -oE 'strcmp\(a, "--[a-z][a-z0-9-]*"\)' oracle/main_flux_oracle.c | grep -oE -- '--[a-z][a-z0-9-]*'
  fi | sort -u >"$T/$cli.C"
  sub_of $cli | rows >"$T/$cli.rows"
  first_col <"$T/$cli.rows" | grep -oE -- '--[a-z][a-z0-9-]*' | sort >"$T/$cli.Rall"
  sort -u "$T/$cli.Rall" >"$T/$cli.R"
  sort -u "$T/$cli.H" "$T/$cli.C" >"$T/$cli.HC"
  nh=$(wc -l <"$T/$cli.H"); nc=$(wc -l <"$T/$cli.C"); nr=$(wc -l <"$T/$cli.R")

  if [ "$nh" -lt 5 ] || [ "$nc" -lt 5 ]; then
    bad "$cli: too few options found (--help $nh, parser $nc): the extraction is broken"
    continue
  fi
  x=$(only_in "$T/$cli.H" "$T/$cli.C")
  if [ -z "$x" ]; then ok "$cli: the parser accepts all $nh options --help lists"
  else bad "$cli: --help lists options the parser does not accept: $x"; fi

  x=$(only_in "$T/$cli.H" "$T/$cli.R")
  if [ -z "$x" ]; then ok "$cli: README's tables have all $nh options of --help"
  else bad "$cli: in --help, not in README's tables: $x"; fi

  x=$(only_in "$T/$cli.R" "$T/$cli.HC")
  if [ -z "$x" ]; then ok "$cli: every one of README's $nr options is in --help or accepted by the parser"
  else bad "$cli: in README's tables, but $cli neither lists nor accepts: $x"; fi

  x=$(uniq -d "$T/$cli.Rall" | words)
  if [ -z "$x" ]; then ok "$cli: no option has two rows in README"
  else bad "$cli: options with more than one row in README: $x"; fi

  # accepted but not in --help: README must say so in the option's row, and only there
  comm -23 "$T/$cli.C" "$T/$cli.H" >"$T/$cli.hidden"
  errs=""
  while IFS= read -r row; do
    marked=0; grep -qF 'Not listed by `--help`' <<<"$row" && marked=1
    for o in $(first_col <<<"$row" | grep -oE -- '--[a-z][a-z0-9-]*'); do
      if grep -qx -- "$o" "$T/$cli.hidden"; then
        [ $marked = 1 ] || errs="$errs $o (not in --help, but its row does not say 'Not listed by \`--help\`')"
      elif [ $marked = 1 ]; then errs="$errs $o (its row says 'Not listed by \`--help\`', but --help lists it)"; fi
    done
  done <"$T/$cli.rows"
  x=$(only_in "$T/$cli.hidden" "$T/$cli.R")
  [ -z "$x" ] || errs="$errs $x (accepted, in neither --help nor README)"
  hid=$(words <"$T/$cli.hidden")
  if [ -z "$errs" ]; then ok "$cli: options accepted but not in --help are marked so in README: ${hid:-none}"
  else bad "$cli: hidden options:$errs"; fi
done

# every --token in the section is an option of one of the CLIs (no stale or misspelt names)
opts <"$T/section" >"$T/section.opts"
sort -u "$T"/*.HC >"$T/all"
x=$(only_in "$T/section.opts" "$T/all")
if [ -z "$x" ]; then ok "every one of the $(wc -l <"$T/section.opts") --options named in the CLI reference exists"
else bad "the CLI reference names options neither CLI has: $x"; fi

# environment variables: what the programs read is documented; what is documented is used
grep -rhoE '(getenv|env_int)\("[A-Z_][A-Z0-9_]*"' sim oracle | grep -oE '"[A-Z0-9_]+"' | tr -d '"' | sort -u >"$T/env.code"
# names with an underscore (FLUX_SIM_BACKEND, NO_COLOR), or any capitalised name in backquotes
# (`TERM`): a plain word in capitals in the prose is not an environment variable
{ grep -oE '\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b' "$T/section"; grep -oE '`[A-Z][A-Z0-9_]*`' "$T/section" | tr -d '`'; } | sort -u >"$T/env.readme"
x=$(only_in "$T/env.code" "$T/env.readme")
if [ -z "$x" ]; then ok "README names all $(wc -l <"$T/env.code") environment variables sim/ and oracle/ read"
else bad "environment variables read by sim/ or oracle/, not in README's CLI reference: $x"; fi
x=""
for v in $(grep -E '^FLUX_' "$T/env.readme"); do
  grep -rqw "$v" sim oracle tests tools Makefile || x="$x $v"
done
if [ -z "$x" ]; then ok "every FLUX_* variable the CLI reference names is used in the tree"
else bad "README's CLI reference names variables nothing uses:$x"; fi

finish
