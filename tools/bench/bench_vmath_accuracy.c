/* bench_vmath_accuracy — the accuracy of the CPU backend's float32 vector exp and tanh
 * (sim/backend/fs_vmath.h: the attention softmax and the tanh GELU), on every float.
 *
 *   build/bench_vmath_accuracy [--stride K]        (default 1: all 2^32 bit patterns)
 *
 * For every K-th float (NaNs skipped; for exp, the range [-87.336, 88.722] where the result is a
 * normal float) it reports the largest error of fs_vmath_exp and fs_vmath_tanh in ulps of the
 * float nearest the exact value, with glibc's double exp and tanh as the exact value (their error,
 * < 1 double ulp, is 2^-29 float ulps), and where it occurs. The same for glibc's own expf and
 * tanhf, for comparison. Both vector widths the machine runs (4 lanes, and 8 with AVX2) are
 * evaluated and must agree bit for bit; any difference is counted and makes the exit status 1.
 * Threaded with OpenMP over blocks of floats. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_vmath.h"

int main(int argc, char **argv)
{
    uint64_t stride = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--stride") && i + 1 < argc) stride = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_vmath_accuracy [--stride K]\n");
            return 2;
        }
    }
    if (!stride) stride = 1;
    int widths[3] = {4}, nw = 1; /* 4 lanes, and 8 and 16 where the CPU has them */
    if (fs_vmath_force_width(8) == 0) widths[nw++] = 8;
    if (fs_vmath_force_width(16) == 0) widths[nw++] = 16;
    fs_vmath_force_width(0);
    enum { CH = 1 << 16 };
    const uint64_t nblk = ((1ull << 32) + (uint64_t)CH * stride - 1) / ((uint64_t)CH * stride);
    uint64_t *hash[3] = {calloc(nblk, 8), calloc(nblk, 8), calloc(nblk, 8)};
    long long differ_all = 0;
    for (int fn = 0; fn < 2; fn++) {
        double worst[3] = {0, 0, 0}, worst_libm = 0;
        float at[3] = {0, 0, 0}, at_libm = 0;
        long long n = 0;
        for (int k = 0; k < nw; k++) {
            fs_vmath_force_width(widths[k]); /* process-wide: one width at a time, on all threads */
            long long n_k = 0;
#pragma omp parallel reduction(+ : n_k)
            {
                float *x = malloc(sizeof(float) * CH), *y = malloc(sizeof(float) * CH);
                double tw = 0, twl = 0;
                float ta = 0, tal = 0;
#pragma omp for schedule(dynamic, 1)
                for (uint64_t blk = 0; blk < nblk; blk++) {
                    int m = 0;
                    for (uint64_t b = blk * CH * stride; b < (blk + 1) * CH * stride && b < (1ull << 32); b += stride) {
                        const uint32_t u = (uint32_t)b;
                        float v;
                        memcpy(&v, &u, 4);
                        if (isnan(v) || (fn == 0 && (v < -87.33654f || v > 88.72283f))) continue;
                        x[m++] = v;
                    }
                    (fn ? fs_vmath_tanh : fs_vmath_exp)(y, x, m);
                    uint64_t h = 1469598103934665603ull; /* FNV-1a of the result bits */
                    for (int i = 0; i < m; i++) {
                        uint32_t bits;
                        memcpy(&bits, &y[i], 4);
                        h = (h ^ bits) * 1099511628211ull;
                        const double ex = fn ? tanh((double)x[i]) : exp((double)x[i]);
                        const double e = fs_vmath_ulp_err(y[i], ex);
                        if (e > tw) { tw = e; ta = x[i]; }
                        if (k == 0) {
                            const double el = fs_vmath_ulp_err(fn ? tanhf(x[i]) : expf(x[i]), ex);
                            if (el > twl) { twl = el; tal = x[i]; }
                        }
                    }
                    hash[k][blk] = h;
                    n_k += m;
                }
#pragma omp critical
                {
                    if (tw > worst[k]) { worst[k] = tw; at[k] = ta; }
                    if (k == 0 && twl > worst_libm) { worst_libm = twl; at_libm = tal; }
                }
                free(x);
                free(y);
            }
            n = n_k;
        }
        fs_vmath_force_width(0);
        long long differ = 0;
        for (int k = 1; k < nw; k++)
            for (uint64_t blk = 0; blk < nblk; blk++) differ += hash[0][blk] != hash[k][blk];
        differ_all += differ;
        for (int k = 0; k < nw; k++)
            printf("%-4s %11lld floats, %d lanes: max %.3f ulp at x = %.9g\n", fn ? "tanh" : "exp", n, widths[k], worst[k], at[k]);
        printf("%-4s %11lld floats, glibc %s: max %.3f ulp at x = %.9g\n", fn ? "tanh" : "exp", n, fn ? "tanhf" : "expf",
               worst_libm, at_libm);
        if (nw > 1)
            printf("%-4s 4%s lanes: %s\n", fn ? "tanh" : "exp", nw > 2 ? ", 8 and 16" : " and 8",
                   differ ? "DIFFERENT bits in some blocks" : "the same bits on every float");
        fflush(stdout);
    }
    free(hash[0]);
    free(hash[1]);
    free(hash[2]);
    return differ_all ? 1 : 0;
}
