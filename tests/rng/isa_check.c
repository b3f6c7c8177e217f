/* isa_check.c — fs_rng's vector loop compiled for one -march (tests/rng_isa.sh builds it for
 * x86-64, -v2, -v3 and -v4, with fs_rng's flags), against the library's scalar reference: the
 * definition must give the same bits at every vector width. With -DEXPECT_DIFFERENT (built with
 * -ffp-contract=fast on an FMA target) it checks that the comparison can fail: contracting the
 * definition's multiply-adds changes values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_rng.h"
#include "fs_rng_kernel.h"

__attribute__((noinline)) static void loop(uint64_t key, uint64_t k0, int64_t np, double *restrict out)
{
    const uint64_t kg0 = k0 * RNG_GOLDEN;
#pragma omp simd
    for (int64_t j = 0; j < np; j++) {
        double e, o;
        rng_pair(key, kg0 + (uint64_t)j * RNG_GOLDEN, &e, &o);
        out[2 * j] = e;
        out[2 * j + 1] = o;
    }
}

int main(void)
{
    const int64_t np = 1 << 20;
    double *a = malloc((size_t)np * 2 * sizeof *a), *b = malloc((size_t)np * 2 * sizeof *b);
    if (!a || !b) return 2;
    long long bad = 0;
    for (int s = 0; s < 4; s++) {
        const uint64_t key = fs_rng_key((uint64_t)s, "isa_check"), k0 = (uint64_t)s << 40;
        loop(key, k0, np, a);
        fs_rng_normal_fill_scalar(key, 2 * k0, 2 * np, b);
        for (int64_t i = 0; i < 2 * np; i++) bad += memcmp(&a[i], &b[i], sizeof *a) != 0;
    }
    printf("%lld of %lld values differ from the scalar reference\n", bad, 8LL * np);
    free(a);
    free(b);
#ifdef EXPECT_DIFFERENT
    return bad ? 0 : 1;
#else
    return bad ? 1 : 0;
#endif
}
