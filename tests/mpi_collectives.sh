#!/usr/bin/env bash
# tests/test_comm.c under mpirun at 2, 3 and 4 ranks (1 rank runs directly in make test).
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
pass=0; fail=0
for n in 2 3 4; do
  if timeout 300 mpirun -np $n ${FLUX_BUILD:-build}/tests/test_comm >/tmp/fluxsim-comm.$$ 2>&1; then pass=$((pass + 1)); echo "ok   np=$n"
  else fail=$((fail + 1)); echo "FAIL np=$n"; fi
  grep -E "^\s+\S.*(ok|WRONG)$|FAILED" /tmp/fluxsim-comm.$$ | sort -u
done
rm -f /tmp/fluxsim-comm.$$
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
