/* fs_rng_kernel.h — the inline implementation of fs_rng's definition (fs_rng.h), shared by
 * fs_rng.c (fs_rng_normal, fs_rng_normal_fill) and fs_weights_synth.c (normals generated and
 * scaled in one vector loop). Private to those two files.
 *
 * Every value is a fixed sequence of IEEE binary64 +, -, *, /, sqrt (each correctly rounded,
 * round to nearest even), a truncating conversion of a value in [0, 8), and bit manipulations.
 * Nothing calls libm. So the bits are the same on any IEEE machine and for any vector width,
 * provided the compiler neither fuses a multiply-add nor reassociates: the files that include
 * this are compiled with -ffp-contract=off and without -ffast-math (Makefile; -fno-math-errno
 * only lets sqrt vectorise — its argument is never negative, errno is never set).
 *
 * The constants are derived by tools/gen/rng_coeffs.py (mpmath): Chebyshev-interpolant polynomials of
 * degree 6 for atanh (log) and sin on the reduced intervals, ln 2 split hi/lo, sqrt 2. The log's
 * reduction u = 2^e m, f = m - 1, s = f/(2+f), log1p(f) = 2 atanh(s) = 2s + s R(s^2) is the
 * classical atanh-series method (textbook; e.g. Sun's freely redistributable fdlibm e_log.c uses
 * it); the code and coefficients here are our own. */
#ifndef FS_RNG_KERNEL_H
#define FS_RNG_KERNEL_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "fs_rng needs binary64 arithmetic without excess precision (FLT_EVAL_METHOD 0, e.g. SSE2, not x87)"
#endif
#if defined(__FAST_MATH__)
#error "fs_rng must not be compiled with -ffast-math: its values are defined operation by operation"
#endif

#define RNG_INLINE static inline __attribute__((always_inline))

RNG_INLINE double dbits(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}
RNG_INLINE uint64_t ubits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

/* SplitMix64's finaliser */
RNG_INLINE uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* ---- constants (tools/gen/rng_coeffs.py prints them) ---- */
#define RNG_LN2_HI 0x1.62e42fee00000p-1 /* ln 2 truncated to 32 significant bits */
#define RNG_LN2_LO 0x1.a39ef35793c76p-33 /* RN(ln 2 - RNG_LN2_HI) */
#define RNG_SQRT2 0x1.6a09e667f3bcdp+0  /* RN(sqrt 2) */
/* T(z) = (2 atanh(sqrt z)/sqrt z - 2)/z on [0, 0.02944]: log1p(f) = 2s + s z T(z), z = s^2 */
#define RNG_T0 0x1.5555555555558p-1
#define RNG_T1 0x1.99999999952d7p-2
#define RNG_T2 0x1.2492492df281ap-2
#define RNG_T3 0x1.c71c62e3f11e6p-3
#define RNG_T4 0x1.7462b51cb66b1p-3
#define RNG_T5 0x1.39fe51a7c18f9p-3
#define RNG_T6 0x1.2b5900de53b32p-3
/* P(t) = sin(pi/4 sqrt t)/sqrt t on [0, 1]: sin(pi/4 g) = g P(g^2) */
#define RNG_P0 0x1.921fb54442d18p-1
#define RNG_P1 -0x1.4abbce625be41p-4
#define RNG_P2 0x1.466bc677587f8p-9
#define RNG_P3 -0x1.32d2cce2e5b19p-15
#define RNG_P4 0x1.50782fda12d96p-22
#define RNG_P5 -0x1.e30071afc3e59p-30
#define RNG_P6 0x1.e3f38399551bfp-38

/* double(x >> 11) + 0.5, written so that it vectorises without a 64-bit integer conversion:
 * m = x >> 11 < 2^53; the double with bits 0x433 << 52 | (m mod 2^52) is exactly
 * 2^52 + (m mod 2^52), which is m when bit 52 of m is set and m + 2^52 otherwise. The
 * subtraction is exact, so d - sub is the same double as (double)m; then one rounded add.
 * u = v * 2^-53 exactly (a power of two, no underflow). */
RNG_INLINE double v53(uint64_t x)
{
    const uint64_t m = x >> 11;
    const double d = dbits(0x4330000000000000ULL | (m & 0xfffffffffffffULL));
    const double sub = dbits(((m >> 52) - 1) & 0x4330000000000000ULL); /* 2^52 if bit 52 clear, else 0 */
    return (d - sub) + 0.5;
}

/* The pair's hash before the lane step: shared by both uniforms of a pair. kg = k * RNG_GOLDEN. */
#define RNG_GOLDEN 0x9e3779b97f4a7c15ULL
#define RNG_LANE 0xd1b54a32d192ed03ULL
RNG_INLINE uint64_t pair_hash(uint64_t key, uint64_t kg) { return mix64(key ^ kg); }
RNG_INLINE double lane_v(uint64_t h, uint64_t lane) { return v53(mix64(h + lane * RNG_LANE + 1)); }

/* ln u, u = v * 2^-53 for v = lane_v(...) in [0.5, 2^53) (the definition's L, in terms of v so that
 * u itself need not be formed: the exponent of u is that of v minus 53, the mantissa the same). */
RNG_INLINE double rng_log_v(double v)
{
    const uint64_t b = ubits(v);
    const double E = dbits(0x4330000000000000ULL | (b >> 52)) - 0x1p52;   /* biased exponent of v, exact */
    const double m1 = dbits((b & 0xfffffffffffffULL) | 0x3ff0000000000000ULL); /* [1, 2) */
    const uint64_t big = m1 > RNG_SQRT2;
    /* The selects below are of constants or of bits, never of an operation that only one side
     * computes: GCC then if-converts the loop on every ISA (it will not speculate a "trapping"
     * FP operation without AVX-512 masks). m = 0.5 * m1 when big, by decrementing the exponent. */
    const double m = dbits(ubits(m1) - (big << 52));          /* [sqrt(1/2), sqrt 2] */
    const double e = E - (big ? 1022.0 + 53.0 : 1023.0 + 53.0); /* u = 2^e m, exact */
    const double f = m - 1.0;                                 /* exact (Sterbenz) */
    const double s = f / (2.0 + f);
    const double z = s * s;
    const double R = z * (RNG_T0 + z * (RNG_T1 + z * (RNG_T2 + z * (RNG_T3 + z * (RNG_T4 + z * (RNG_T5 + z * RNG_T6))))));
    return e * RNG_LN2_HI + (e * RNG_LN2_LO + ((s + s) + s * R));
}

/* cos(2 pi u) and sin(2 pi u) from t8 = 8u in [0, 8): octant k = floor(t8), fraction f = t8 - k
 * (both exact); g = f in even octants, 1 - f in odd ones, so the angle is k pi/4 + (pi/4)(k odd ?
 * 1 - g : g) with g in [0, 1]; S = sin(pi/4 g) by a polynomial in t = g^2, C = cos(pi/4 g) =
 * sqrt(1 - S^2) (S <= sin(pi/4), so 1 - S^2 >= 1/2: no cancellation); then
 *   k:    0   1   2   3   4   5   6   7
 *   cos:  C   S  -S  -C  -C  -S   S   C
 *   sin:  S   C   C   S  -S  -C  -C  -S        (selects, no branches) */
RNG_INLINE void rng_sincos2pi_t8(double t8, double *c, double *s)
{
    /* floor(t8) as a truncating conversion (t8 >= 0): cvttpd2dq vectorises on every x86-64,
     * floor() does not without -fno-trapping-math */
    const int32_t ki = (int32_t)t8;
    const double f = t8 - (double)ki;
    const uint64_t k = (uint32_t)ki;
    const uint64_t odd = k & 1;
    /* g = odd ? 1 - f : f, as off + (+-f): 0 + f = f and 1 + (-f) = 1 - f, exactly those doubles */
    const double g = dbits((0 - odd) & 0x3ff0000000000000ULL) + dbits(ubits(f) ^ (odd << 63));
    const double t = g * g;
    const double S = g * (RNG_P0 + t * (RNG_P1 + t * (RNG_P2 + t * (RNG_P3 + t * (RNG_P4 + t * (RNG_P5 + t * RNG_P6))))));
    const double C = sqrt(1.0 - S * S);
    const int swap = ((k + 1) >> 1) & 1;
    const double cv = swap ? S : C, sv = swap ? C : S;
    const uint64_t cneg = ((k + 2) >> 2) & 1, sneg = k >> 2;
    *c = dbits(ubits(cv) ^ (cneg << 63));
    *s = dbits(ubits(sv) ^ (sneg << 63));
}

/* Pair k (kg = k * RNG_GOLDEN): elements 2k (cos) and 2k+1 (sin). */
RNG_INLINE void rng_pair(uint64_t key, uint64_t kg, double *even, double *odd)
{
    const uint64_t h = pair_hash(key, kg);
    const double v1 = lane_v(h, 0), v2 = lane_v(h, 1);
    const double r = sqrt(-2.0 * rng_log_v(v1));
    double c, s;
    rng_sincos2pi_t8(v2 * 0x1p-50, &c, &s); /* 8 u_1 = v2 * 2^-50 exactly */
    *even = r * c;
    *odd = r * s;
}

#endif
