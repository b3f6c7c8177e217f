/* fs_vmath.c — fs_vmath.h: the functions of fs_vmath.inc at 4 lanes (the build's ISA), at 8
 * (AVX2) and at 16 (AVX-512F; x86-64 only), and the run-time choice between them: the widest the
 * CPU has. The ISO C build (-std=c11) does not contract a·b + c into an FMA, and only IEEE
 * + - * / and bit operations are used, so every width gives the same bits (test_ops checks). */
#include "fs_vmath.h"

#include <math.h>
#include <string.h>

#define FS_VW 4
#define FS_VATTR
#include "fs_vmath.inc"
#undef FS_VW
#undef FS_VATTR

#if defined(__x86_64__) && defined(__GNUC__)
#define FS_HAVE_W8 1
#define FS_VW 8
#define FS_VATTR __attribute__((target("avx2"))) /* AVX2 alone: no FMA, so no contraction */
#include "fs_vmath.inc"
#undef FS_VW
#undef FS_VATTR
#define FS_HAVE_W16 1
#define FS_VW 16
#define FS_VATTR __attribute__((target("avx512f")))
#include "fs_vmath.inc"
#undef FS_VW
#undef FS_VATTR
#endif

static int forced;

int fs_vmath_width(void)
{
    if (forced) return forced;
#ifdef FS_HAVE_W16
    if (__builtin_cpu_supports("avx512f")) return 16;
#endif
#ifdef FS_HAVE_W8
    if (__builtin_cpu_supports("avx2")) return 8;
#endif
    return 4;
}

int fs_vmath_force_width(int w)
{
    if (w == 0 || w == 4) forced = w;
#ifdef FS_HAVE_W8
    else if (w == 8 && __builtin_cpu_supports("avx2")) forced = 8;
#endif
#ifdef FS_HAVE_W16
    else if (w == 16 && __builtin_cpu_supports("avx512f")) forced = 16;
#endif
    else return -1;
    return 0;
}

#ifdef FS_HAVE_W16
#define PICK(f, ...)                                                                                 \
    (fs_vmath_width() == 16 ? f##_16(__VA_ARGS__) : fs_vmath_width() == 8 ? f##_8(__VA_ARGS__) : f##_4(__VA_ARGS__))
#elif defined(FS_HAVE_W8)
#define PICK(f, ...) (fs_vmath_width() == 8 ? f##_8(__VA_ARGS__) : f##_4(__VA_ARGS__))
#else
#define PICK(f, ...) f##_4(__VA_ARGS__)
#endif

float fs_vmath_rowmax(const float *x, int64_t n) { return PICK(rowmax, x, n); }
float fs_vmath_expsum(float *x, int64_t n, float mx) { return PICK(expsum, x, n, mx); }
void fs_vmath_gelu_tanh(float *o, const float *a, int64_t n) { PICK(gelu_tanh, o, a, n); }
void fs_vmath_exp(float *y, const float *x, int64_t n) { PICK(exp_array, y, x, n); }
void fs_vmath_tanh(float *y, const float *x, int64_t n) { PICK(tanh_array, y, x, n); }

double fs_vmath_ulp_err(float got, double exact)
{
    const float f = (float)exact;
    int ex;
    frexpf(fabsf(f), &ex);
    double u = f == 0 ? ldexp(1, -149) : ldexp(1, ex - 24);
    if (u < ldexp(1, -149)) u = ldexp(1, -149);
    return fabs((double)got - exact) / u;
}
