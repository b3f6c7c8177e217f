/* fs_vmath.h — float32 exp and tanh on vectors, for the CPU backend's float32 kernels: the
 * attention softmax and the tanh GELU. float64 never comes here.
 *
 * glibc's scalar expf and tanhf are not vectorised by the compiler (without -ffast-math), and at
 * FLUX width they cost more than the GEMMs around them: the softmax of one attention call is 57 M
 * exps, a single block's GELU 19 M tanhs (9% of a FLUX-width forward went to tanhf alone). These
 * are the Cephes single-precision algorithms (S. Moshier: Cody-Waite reduction, minimax
 * polynomials), written once with GCC vector extensions (fs_vmath.inc) and built twice: 4 lanes
 * for the build's baseline ISA (SSE at -march=x86-64-v2) and 8 lanes for AVX2, picked at run time.
 * Only IEEE +, -, *, / and bit operations, no libm, no table, no FMA: both builds give the same
 * bits (tests/test_ops.c checks it), on any machine. (A build whose -march lets the compiler
 * contract a*b+c into FMA rounds differently, within the bounds below.)
 *
 * Accuracy against the exact value, measured on every float (docs/performance.md; test_ops checks
 * a stride of them):
 *   exp:  < 1 ulp (max 0.990) over [-87.336, 88.722]; below -87.336 (where expf is denormal) the
 *         result is +0, above 88.7228 +inf; NaN gives NaN.
 *   tanh: < 1.5 ulp (max 1.330) on every float; |x| >= 10 gives +-1 (the rounded value); NaN
 *         gives NaN; tanh(-0) = -0.
 * For comparison: glibc's expf is correctly rounded and its tanhf within 2 ulp; PyTorch's CPU
 * kernels (the diffusers reference) use SLEEF's 1-ulp expf and tanhf. */
#ifndef FS_VMATH_H
#define FS_VMATH_H

#include <stdint.h>

/* max of x[0..n), NaNs skipped, -inf if none (exact: the same value as any scalar loop) */
float fs_vmath_rowmax(const float *x, int64_t n);
/* x[j] = exp(x[j] - mx) in place; returns their sum, accumulated in 8 float partial sums
 * (element j into partial j mod 8) added in a fixed order at the end. */
float fs_vmath_expsum(float *x, int64_t n, float mx);
/* o[i] = 0.5·a·(1 + tanh(√(2/π)·(a + 0.044715·a³))), PyTorch's expression and order, tanh above */
void fs_vmath_gelu_tanh(float *o, const float *a, int64_t n);
/* y[i] = exp(x[i]), y[i] = tanh(x[i]) (tests, accuracy measurements) */
void fs_vmath_exp(float *y, const float *x, int64_t n);
void fs_vmath_tanh(float *y, const float *x, int64_t n);

/* |got - exact| in ulps of the float nearest `exact` (denormal ulp 2^-149 at least): how the
 * bounds above are measured (tests/test_ops.c, tools/bench/bench_vmath_accuracy.c). */
double fs_vmath_ulp_err(float got, double exact);

/* The vector width in use: 16 (AVX-512F), 8 (AVX2) or 4, the widest the CPU has.
 * fs_vmath_force_width(4, 8 or 16) pins it (tests compare them: the same bits), 0 restores the
 * run-time choice; a width the CPU lacks is refused (returns -1). */
int fs_vmath_width(void);
int fs_vmath_force_width(int w);

#endif
