/* fs_rng.h — counter-based random numbers keyed by (seed, tensor name, element index).
 *
 * Why counter-based: element i of tensor "transformer_blocks.3.attn.to_q.weight" is a pure
 * function of (seed, name, i), so a rank that owns rows [a, b) of that weight generates exactly
 * its shard, bit-identical to the same rows of the full tensor, without materialising the rest.
 *
 * THE DEFINITION (fs_rng v2). It is exact: every step is an integer operation on uint64 (mod 2^64)
 * or one IEEE 754 binary64 operation rounded to nearest even (+, -, *, /, sqrt, floor, and sign
 * or exponent bit manipulations); no libm, no fused multiply-add, evaluated in exactly the order
 * written (parentheses as shown, left to right otherwise). So any IEEE implementation — the
 * vector path here, a GPU kernel, tools/fs_rng_ref.py (numpy) — reproduces the bits. Hex float
 * constants are exact doubles (C99 %a notation); tools/rng_coeffs.py derives them.
 *
 *   mix(z)    = z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27; z *= 0x94d049bb133111eb;
 *               z ^ (z >> 31)                                        (SplitMix64's finaliser)
 *   key(seed, name) = mix(h ^ mix(seed + 0x9e3779b97f4a7c15)), h = FNV-1a 64 of the name's bytes
 *               (offset 0xcbf29ce484222325, prime 0x100000001b3)
 *   element i belongs to pair k = i >> 1; H = mix(key ^ (k * 0x9e3779b97f4a7c15))
 *   x_l = mix(H + l * 0xd1b54a32d192ed03 + 1)  for lane l = 0, 1
 *   u_l = (double(x_l >> 11) + 0.5) * 0x1p-53   (double(m) exact: m < 2^53; u in (0, 1))
 *
 *   L = ln(u_0):  b = bits of u_0; E = b >> 52 (as a double); m1 = the double with exponent
 *               field 1023 and u_0's 52 mantissa bits ([1, 2));
 *               if m1 > 0x1.6a09e667f3bcdp+0:  m = 0.5 * m1, e = E - 1022   else m = m1, e = E - 1023
 *               f = m - 1;  s = f / (2 + f);  z = s * s;
 *               R = z * (T0 + z*(T1 + z*(T2 + z*(T3 + z*(T4 + z*(T5 + z*T6))))))
 *               h = (0.5 * f) * f
 *               L = e*LN2_HI - ((h - (s*(h + R) + e*LN2_LO)) - f)
 *   r = sqrt(-2 * L)
 *   C2, S2 = cos(2 pi u_1), sin(2 pi u_1):
 *               t8 = 8 * u_1; kd = floor(t8); f = t8 - kd; k = (int)kd (0..7)
 *               g = (k odd) ? 1 - f : f;  t = g * g
 *               S = g * (P0 + t*(P1 + t*(P2 + t*(P3 + t*(P4 + t*(P5 + t*P6))))))
 *               C = 1 + t * (Q0 + t*(Q1 + t*(Q2 + t*(Q3 + t*(Q4 + t*(Q5 + t*Q6))))))
 *               k   :  0   1   2   3   4   5   6   7
 *               C2  :  C   S  -S  -C  -C  -S   S   C     (negation = sign-bit flip, also of 0)
 *               S2  :  S   C   C   S  -S  -C  -C  -S
 *   normal(key, 2k) = r * C2,   normal(key, 2k + 1) = r * S2
 *
 *   LN2_HI 0x1.62e42fee00000p-1        LN2_LO 0x1.a39ef35793c76p-33
 *   T0..T6 0x1.5555555555558p-1  0x1.99999999952d7p-2  0x1.2492492df281ap-2  0x1.c71c62e3f11e6p-3
 *          0x1.7462b51cb66b1p-3  0x1.39fe51a7c18f9p-3  0x1.2b5900de53b32p-3
 *   P0..P6 0x1.921fb54442d18p-1 -0x1.4abbce625be41p-4  0x1.466bc677587f8p-9 -0x1.32d2cce2e5b19p-15
 *          0x1.50782fda12d96p-22 -0x1.e30071afc3e59p-30  0x1.e3f38399551bfp-38
 *   Q0..Q6 -0x1.3bd3cc9be45dep-2  0x1.03c1f081b5ac0p-6 -0x1.55d3c7e3cb241p-12  0x1.e1f5068688d5bp-19
 *          -0x1.a6d1eef479be1p-26  0x1.f9ce245cada0bp-34 -0x1.b2f3eb054afcdp-42
 *
 * Accuracy (measured by tools/bench_rng_ulp.c against glibc's libm, docs/scale.md): L, S2 and
 * C2 are within a few ulp of the true ln, sin and cos; the normals are the Box-Muller normals of
 * the same uniforms to within a few ulp. The bulk path pays one log/sqrt/sincos per two elements
 * while any single element stays addressable. (fs_rng v1, before, called libm's log, sin and
 * cos, whose last bits depend on the libm.) */
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
