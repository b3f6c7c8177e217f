#!/usr/bin/env bash
# fs_rng's definition gives the same bits at every vector width: tests/rng/isa_check.c (the
# vector loop of fs_rng_kernel.h) compiled with fs_rng's flags for x86-64 (SSE2), -v2 (SSE4.2),
# -v3 (AVX2) and -v4 (AVX-512), each run against the library's scalar reference — where this CPU
# can run that level; the others are reported as SKIPPED. Then the same loop with
# -ffp-contract=fast on -v3 must differ: the check can fail, and the flag matters.
. "$(dirname "$0")/lib.sh"
tmpdir rng-isa
if [ "$(uname -m)" != x86_64 ]; then skip_all "rng_isa.sh: not x86-64 — this test did NOT run"; fi
# make sanitize: $B/libfluxsim.a is ASan + UBSan instrumented, so the check links with them too
SAN=; [ -n "${FLUX_SANITIZE:-}" ] && SAN="-fsanitize=address,undefined,float-cast-overflow"
FLAGS="-O2 -std=c11 -D_GNU_SOURCE -fopenmp -ffp-contract=off -fno-math-errno -fvect-cost-model=dynamic -Isim/base -Isim/backend -Isim/parallel -Isim/weights -Isim/model -Isim/run -Ioracle"
supports() { # level
  case $1 in
    x86-64) return 0 ;;
    *) "$T/cpu" "$1" ;;
  esac
}
cat >"$T/cpu.c" <<'C'
#include <string.h>
int main(int c, char **v) { __builtin_cpu_init(); return !(c > 1 && (!strcmp(v[1], "x86-64-v2") ? __builtin_cpu_supports("x86-64-v2") : !strcmp(v[1], "x86-64-v3") ? __builtin_cpu_supports("x86-64-v3") : __builtin_cpu_supports("x86-64-v4"))); }
C
gcc -O1 "$T/cpu.c" -o "$T/cpu" || { echo "FAIL cannot build the CPU probe"; exit 1; }
for m in x86-64 x86-64-v2 x86-64-v3 x86-64-v4; do
  if ! supports $m; then skip "-march=$m: this CPU cannot run it — this level did NOT run"; continue; fi
  if ! gcc $FLAGS -march=$m tests/rng/isa_check.c "$B/libfluxsim.a" $SAN -lm -o "$T/isa_$m" 2>"$T/cc.log"; then
    bad "-march=$m: compile"; head -5 "$T/cc.log"; continue
  fi
  if out=$("$T/isa_$m"); then ok "-march=$m: $out"
  else bad "-march=$m: $out"; fi
done
if supports x86-64-v3; then
  gcc ${FLAGS/-ffp-contract=off/-ffp-contract=fast} -DEXPECT_DIFFERENT -march=x86-64-v3 tests/rng/isa_check.c "$B/libfluxsim.a" $SAN -lm -o "$T/isa_fma"
  if out=$("$T/isa_fma"); then ok "-march=x86-64-v3 -ffp-contract=fast differs, as it must: $out"
  else bad "-ffp-contract=fast did not change any value: the comparison cannot fail? $out"; fi
fi
finish
