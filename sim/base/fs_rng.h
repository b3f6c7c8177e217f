/* fs_rng.h — counter-based random numbers keyed by (seed, tensor name, element index).
 *
 * Why counter-based: element i of tensor "transformer_blocks.3.attn.to_q.weight" is a pure
 * function of (seed, name, i), so a rank that owns rows [a, b) of that weight generates exactly
 * its shard, bit-identical to the same rows of the full tensor, without materialising the rest.
 *
 * THE DEFINITION (fs_rng v2). It is exact: every step is an integer operation on uint64 (mod 2^64)
 * or one IEEE 754 binary64 operation rounded to nearest even (+, -, *, /, sqrt, a conversion
 * that is exact, or a sign/exponent bit manipulation); no libm, no fused multiply-add, no excess
 * precision, evaluated in exactly the order written (parentheses as shown). So any IEEE
 * implementation — the vector loops here, a GPU kernel, tools/gen/fs_rng_ref.py (numpy) —
 * reproduces the bits. Hex constants are exact doubles (C99 %a notation), derived by
 * tools/gen/rng_coeffs.py.
 *
 *   mix(z)  = z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27; z *= 0x94d049bb133111eb;
 *             return z ^ (z >> 31)                                   (SplitMix64's finaliser)
 *   key(seed, name) = mix(h ^ mix(seed + 0x9e3779b97f4a7c15)),
 *             h = FNV-1a 64 of the name's bytes (offset 0xcbf29ce484222325, prime 0x100000001b3)
 *   element i belongs to pair k = i >> 1;   H = mix(key ^ (k * 0x9e3779b97f4a7c15))
 *   x_l = mix(H + l * 0xd1b54a32d192ed03 + 1)                        for lane l = 0, 1
 *   u_l = (double(x_l >> 11) + 0.5) * 0x1p-53     (double(m) is exact, m < 2^53; u in (0, 1);
 *                                                  the + rounds when m >= 2^52)
 *   L = ln(u_0):
 *     b = the 64 bits of u_0;  E = double(b >> 52)  (the biased exponent)
 *     m1 = the double with bits (b & 0x000fffffffffffff) | 0x3ff0000000000000   (in [1, 2))
 *     if m1 > 0x1.6a09e667f3bcdp+0 (= RN(sqrt 2)):  m = 0.5 * m1;  e = E - 1022
 *     else:                                         m = m1;        e = E - 1023
 *     f = m - 1;  s = f / (2 + f);  z = s * s
 *     R = z * (T0 + z * (T1 + z * (T2 + z * (T3 + z * (T4 + z * (T5 + z * T6))))))
 *     L = e * LN2_HI + (e * LN2_LO + ((s + s) + s * R))
 *   r = sqrt(-2 * L)
 *   (C2, S2) = (cos 2 pi u_1, sin 2 pi u_1):
 *     t8 = 8 * u_1;  k = floor(t8) (0..7);  f = t8 - k
 *     g = (k odd) ? 1 - f : f;  t = g * g
 *     S = g * (P0 + t * (P1 + t * (P2 + t * (P3 + t * (P4 + t * (P5 + t * P6))))))   sin(pi/4 g)
 *     C = sqrt(1 - S * S)                                                          cos(pi/4 g)
 *     k  :  0   1   2   3   4   5   6   7
 *     C2 :  C   S  -S  -C  -C  -S   S   C         (- is a sign-bit flip, -0 included)
 *     S2 :  S   C   C   S  -S  -C  -C  -S
 *   normal(key, 2k) = r * C2;   normal(key, 2k + 1) = r * S2
 *
 *   LN2_HI = 0x1.62e42fee00000p-1 (ln 2 truncated to 32 bits)   LN2_LO = 0x1.a39ef35793c76p-33
 *   T0..T6 = 0x1.5555555555558p-1  0x1.99999999952d7p-2  0x1.2492492df281ap-2  0x1.c71c62e3f11e6p-3
 *            0x1.7462b51cb66b1p-3  0x1.39fe51a7c18f9p-3  0x1.2b5900de53b32p-3
 *   P0..P6 = 0x1.921fb54442d18p-1 -0x1.4abbce625be41p-4  0x1.466bc677587f8p-9 -0x1.32d2cce2e5b19p-15
 *            0x1.50782fda12d96p-22 -0x1.e30071afc3e59p-30  0x1.e3f38399551bfp-38
 *
 * Every multiplication by 0.5, 8 or 2^-53 above is exact, and so are m1, f = m - 1 (Sterbenz),
 * e * LN2_HI (|e| < 2^21), k, f = t8 - k and 1 - f (u_1 is a multiple of 2^-54): an
 * implementation may compute those differently (fs_rng_kernel.h does) as long as the values are
 * these. T is a degree-6 fit of (2 atanh(sqrt z)/sqrt z - 2)/z on [0, 0.02944] (log1p(f) =
 * 2 atanh(s) = 2s + s z T(z)), P of sin(pi/4 sqrt t)/sqrt t on [0, 1]. Accuracy, measured over
 * 10^8 pairs of the generator's own uniforms (tools/bench/bench_rng_accuracy.c, docs/scale.md), largest
 * errors: L 1.46 ulp from ln u_0; C2 2.24 and S2 2.20 ulp from cos/sin(2 pi u_1); the normals
 * 4.05 ulp from the exact Box-Muller transform of the same uniforms (99.7 % within 2 ulp).
 *
 * fs_rng v1, before, used glibc's log, sin(RN(2 pi u)), cos(RN(2 pi u)): the uniforms and the pair
 * structure are the same, the normals differ by a few ulp (fp32 weights almost never change). */
#ifndef FS_RNG_H
#define FS_RNG_H

#include <stdint.h>

/* Stream key of (seed, name): FNV-1a of the name mixed with the seed. */
uint64_t fs_rng_key(uint64_t seed, const char *name);
/* Uniform u_lane of pair `index` (see above), in (0, 1), never 0 or 1. */
double fs_rng_uniform(uint64_t key, uint64_t index, uint32_t lane);
/* Standard normal for element `index` of the stream: the scalar reference, one pair per call. */
double fs_rng_normal(uint64_t key, uint64_t index);
/* out[i] = fs_rng_normal(key, first + i) for i < n, bit-identical: the vector path (AVX-512 /
 * AVX2 / SSE4.2 clones), one thread (callers thread over blocks: fs_weights_synthetic_fill). */
void fs_rng_normal_fill(uint64_t key, uint64_t first, int64_t n, double *out);
/* The same, element by element through fs_rng_normal (the plain scalar loop): the reference the
 * vector path is tested and benchmarked against. */
void fs_rng_normal_fill_scalar(uint64_t key, uint64_t first, int64_t n, double *out);

/* The definition's pieces, for accuracy measurements (tools/bench_rng_ulp.c) and tests: L above
 * for a positive normal u, and (C2, S2) for u in [0, 1). */
double fs_rng_log(double u);
void fs_rng_sincos2pi(double u, double *c, double *s);
/* Which clone of the vector loop fs_rng_normal_fill runs on this CPU: "avx512" (x86-64-v4),
 * "avx2", "sse4.2" (the x86-64-v2 baseline) or "portable" (not x86-64/GCC). Same values on all. */
const char *fs_rng_isa(void);

#endif
