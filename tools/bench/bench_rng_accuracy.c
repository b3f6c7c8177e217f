/* bench_rng_accuracy — how accurate fs_rng's libm-free normal transform is (sim/base/fs_rng.h).
 *
 *   build/bench_rng_accuracy [--n N] [--seed S]        (default N = 10^8 pairs)
 *
 * For N pairs of the generator's own uniforms (u_0, u_1) = fs_rng_uniform(key, k, 0/1), it
 * compares, in units in the last place of the double nearest the reference:
 *   fs_rng_log(u_0)              against ln(u_0)
 *   fs_rng_sincos2pi(u_1)        against cos(2 pi u_1), sin(2 pi u_1)
 *   fs_rng_normal (both halves)  against sqrt(-2 ln u_0) cos/sin(2 pi u_1)
 * The references are glibc's x87 long double logl, sinl, cosl, sqrtl (64-bit significand, 11
 * bits more than a double; sin and cos after an exact reduction of u to |r| <= 1/8), so "ulp" is
 * the error against the true value to within about 2^-10 ulp. For comparison the same is measured for fs_rng v1, the
 * transform this one replaced: glibc's double log, sin(RN(2 pi u)), cos(RN(2 pi u)) — whose
 * argument rounding costs it accuracy near the zeros of sin and cos — and the ulp distance
 * between v1's and v2's normals. Also counts how many normals differ at all, and how many differ
 * after rounding to float32 (what an fp32 run's weights see), for the same uniforms.
 * Threaded with OpenMP over pairs. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fs_rng.h"

#if LDBL_MANT_DIG < 64
#error "bench_rng_accuracy needs an extended long double (x87) for its references"
#endif

static const long double TWO_PI_L = 6.283185307179586476925286766559005768L;

/* cos(2 pi u), sin(2 pi u) in long double to about 2^-63 relative, even near their zeros: u is
 * reduced exactly (r = u - q/4, |r| <= 1/8, exact in long double), then the quadrant rotation.
 * (sinl(2 pi u) directly would lose that near u = 1/2, where 2 pi u rounds to about 2^-63 pi.) */
static void ref_sincos2pi(double u, long double *c, long double *s)
{
    const long double q = nearbyintl(4.0L * u), r = (long double)u - q / 4.0L;
    const long double ca = cosl(TWO_PI_L * r), sa = sinl(TWO_PI_L * r);
    switch ((int)q & 3) {
    case 0: *c = ca, *s = sa; break;
    case 1: *c = -sa, *s = ca; break;
    case 2: *c = -ca, *s = -sa; break;
    default: *c = sa, *s = -ca; break;
    }
}

/* |x - ref| in ulps of the double nearest ref (ref == 0: ulps of the smallest normal) */
static double ulps(double x, long double ref)
{
    double r = (double)ref;
    int ex;
    if (r == 0) return fabsl((long double)x - ref) / 0x1p-1074L;
    frexp(r, &ex); /* r = m 2^ex, m in [0.5, 1): ulp = 2^(ex - 53) */
    return (double)(fabsl((long double)x - ref) / ldexpl(1.0L, ex - 53));
}

typedef struct {
    double log, cos, sin, normal; /* worst ulps */
    double log_at, cos_at, sin_at, normal_at;
} worst;

static void upd(double e, double at, double *w, double *w_at)
{
    if (e > *w) *w = e, *w_at = at;
}

int main(int argc, char **argv)
{
    long long n = 100000000LL;
    unsigned long long seed = 2024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
        else {
            fprintf(stderr, "usage: bench_rng_accuracy [--n PAIRS] [--seed S]\n");
            return 2;
        }
    }
    const uint64_t key = fs_rng_key(seed, "bench_rng_accuracy");
    worst w2 = {0}, w1 = {0};
    double d12 = 0;                     /* worst ulp distance v1 normal vs v2 normal */
    long long diff64 = 0, diff32 = 0;   /* normals that differ between v1 and v2: as doubles, as floats */
    long long hist[5] = {0};            /* v2 normal error: < 0.5, < 1, < 2, < 4, >= 4 ulp */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
#pragma omp parallel
    {
        worst a2 = {0}, a1 = {0};
        double ad = 0;
        long long a64 = 0, a32 = 0, h[5] = {0};
#pragma omp for schedule(static)
        for (long long k = 0; k < n; k++) {
            const double u0 = fs_rng_uniform(key, (uint64_t)k, 0), u1 = fs_rng_uniform(key, (uint64_t)k, 1);
            const long double Lr = logl(u0), rr = sqrtl(-2.0L * Lr);
            long double cr, sr;
            ref_sincos2pi(u1, &cr, &sr);
            /* v2 (this definition) */
            double c2, s2;
            fs_rng_sincos2pi(u1, &c2, &s2);
            const double L2 = fs_rng_log(u0);
            const double e2 = fs_rng_normal(key, 2 * (uint64_t)k), o2 = fs_rng_normal(key, 2 * (uint64_t)k + 1);
            upd(ulps(L2, Lr), u0, &a2.log, &a2.log_at);
            upd(ulps(c2, cr), u1, &a2.cos, &a2.cos_at);
            upd(ulps(s2, sr), u1, &a2.sin, &a2.sin_at);
            const double ne = ulps(e2, rr * cr), no = ulps(o2, rr * sr);
            upd(ne, u1, &a2.normal, &a2.normal_at);
            upd(no, u1, &a2.normal, &a2.normal_at);
            h[ne < 0.5 ? 0 : ne < 1 ? 1 : ne < 2 ? 2 : ne < 4 ? 3 : 4]++;
            h[no < 0.5 ? 0 : no < 1 ? 1 : no < 2 ? 2 : no < 4 ? 3 : 4]++;
            /* v1 (glibc's double log, sin and cos of the rounded angle) */
            const double L1 = log(u0), th = 6.283185307179586476925 * u1, c1 = cos(th), s1 = sin(th);
            const double r1 = sqrt(-2.0 * L1), e1 = r1 * c1, o1 = r1 * s1;
            upd(ulps(L1, Lr), u0, &a1.log, &a1.log_at);
            upd(ulps(c1, cr), u1, &a1.cos, &a1.cos_at);
            upd(ulps(s1, sr), u1, &a1.sin, &a1.sin_at);
            upd(ulps(e1, rr * cr), u1, &a1.normal, &a1.normal_at);
            upd(ulps(o1, rr * sr), u1, &a1.normal, &a1.normal_at);
            const double de = ulps(e2, e1), dd = ulps(o2, o1);
            if (de > ad) ad = de;
            if (dd > ad) ad = dd;
            a64 += (e1 != e2) + (o1 != o2);
            a32 += ((float)e1 != (float)e2) + ((float)o1 != (float)o2);
        }
#pragma omp critical
        {
            upd(a2.log, a2.log_at, &w2.log, &w2.log_at);
            upd(a2.cos, a2.cos_at, &w2.cos, &w2.cos_at);
            upd(a2.sin, a2.sin_at, &w2.sin, &w2.sin_at);
            upd(a2.normal, a2.normal_at, &w2.normal, &w2.normal_at);
            upd(a1.log, a1.log_at, &w1.log, &w1.log_at);
            upd(a1.cos, a1.cos_at, &w1.cos, &w1.cos_at);
            upd(a1.sin, a1.sin_at, &w1.sin, &w1.sin_at);
            upd(a1.normal, a1.normal_at, &w1.normal, &w1.normal_at);
            if (ad > d12) d12 = ad;
            diff64 += a64;
            diff32 += a32;
            for (int i = 0; i < 5; i++) hist[i] += h[i];
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("bench_rng_accuracy: %lld pairs (%lld normals) of the generator's uniforms, seed %llu, %d threads, %.1f s\n",
           n, 2 * n, seed, omp_get_max_threads(), secs);
    printf("max error in ulps against the true value (x87 long double libm):\n");
    printf("                      fs_rng v2 (this)           fs_rng v1 (glibc double log/sin/cos)\n");
    printf("  ln(u0)              %8.3f (u0 = %a)   %8.3f (u0 = %a)\n", w2.log, w2.log_at, w1.log, w1.log_at);
    printf("  cos(2 pi u1)        %8.3f (u1 = %a)   %8.3g (u1 = %a)\n", w2.cos, w2.cos_at, w1.cos, w1.cos_at);
    printf("  sin(2 pi u1)        %8.3f (u1 = %a)   %8.3g (u1 = %a)\n", w2.sin, w2.sin_at, w1.sin, w1.sin_at);
    printf("  normal (r cos/sin)  %8.3f (u1 = %a)   %8.3g (u1 = %a)\n", w2.normal, w2.normal_at, w1.normal, w1.normal_at);
    printf("v2 normals by error: < 0.5 ulp %.4f%%, [0.5, 1) %.4f%%, [1, 2) %.4f%%, [2, 4) %.4f%%, >= 4 %.4f%%\n",
           100.0 * hist[0] / (2.0 * n), 100.0 * hist[1] / (2.0 * n), 100.0 * hist[2] / (2.0 * n),
           100.0 * hist[3] / (2.0 * n), 100.0 * hist[4] / (2.0 * n));
    printf("v1 vs v2 normals: %.4f%% differ as doubles (worst %.3g ulp apart), %.6f%% as float32\n",
           100.0 * (double)diff64 / (2.0 * n), d12, 100.0 * (double)diff32 / (2.0 * n));
    return 0;
}
