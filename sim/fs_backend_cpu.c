/* fs_backend_cpu.c — the CPU backend: OpenBLAS for every matmul, plain C for the rest.
 * Each kernel is written once in fs_kernels_cpu.inc and instantiated for float and double. */
#include <cblas.h>
#include <malloc.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "fs_backend.h"

#define T float
#define SFX f32
#define GEMM cblas_sgemm
#define EXP expf
#define LOG logf
#define TANH tanhf
#define LOG1P log1pf
#include "fs_kernels_cpu.inc"
#undef T
#undef SFX
#undef GEMM
#undef EXP
#undef LOG
#undef TANH
#undef LOG1P

#define T double
#define SFX f64
#define GEMM cblas_dgemm
#define EXP exp
#define LOG log
#define TANH tanh
#define LOG1P log1p
#include "fs_kernels_cpu.inc"
#undef T
#undef SFX
#undef GEMM
#undef EXP
#undef LOG
#undef TANH
#undef LOG1P

/* Dispatch on the dtype of the first tensor argument. */
#define DISPATCH(dt, fn, ...) ((dt) == FS_F64 ? fn##_f64(__VA_ARGS__) : fn##_f32(__VA_ARGS__))

static void cpu_gemm(fs_dtype dt, int trans_b, int64_t M, int64_t N, int64_t Kd, double alpha, const void *A,
                     int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc)
{
    DISPATCH(dt, gemm, trans_b, M, N, Kd, alpha, A, lda, B, ldb, beta, C, ldc);
}
static void cpu_copy2d(fs_dtype dt, void *dst, int64_t ld_dst, const void *src, int64_t ld_src, int64_t rows,
                       int64_t cols)
{
    size_t es = fs_dtype_size(dt);
    for (int64_t r = 0; r < rows; r++)
        memcpy((char *)dst + (size_t)(r * ld_dst) * es, (const char *)src + (size_t)(r * ld_src) * es,
               (size_t)cols * es);
}
static void cpu_add_bias(fs_tensor *y, const void *b, int64_t N) { DISPATCH(y->dtype, add_bias, y, b, N); }
static void cpu_add(fs_tensor *y, const fs_tensor *x, const fs_tensor *z) { DISPATCH(y->dtype, add, y, x, z); }
static void cpu_silu(fs_tensor *y, const fs_tensor *x) { DISPATCH(y->dtype, silu, y, x); }
static void cpu_gelu_tanh(fs_tensor *y, const fs_tensor *x) { DISPATCH(y->dtype, gelu_tanh, y, x); }
static void cpu_layernorm(fs_tensor *y, const fs_tensor *x, int64_t D, double eps)
{
    DISPATCH(y->dtype, layernorm, y, x, D, eps);
}
static void cpu_rmsnorm(fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps)
{
    DISPATCH(y->dtype, rmsnorm, y, x, w, eps);
}
static void cpu_modulate(fs_tensor *y, const fs_tensor *x, const fs_tensor *scale, const fs_tensor *shift)
{
    DISPATCH(y->dtype, modulate, y, x, scale, shift);
}
static void cpu_gated_add(fs_tensor *x, const fs_tensor *gate, const fs_tensor *y)
{
    DISPATCH(x->dtype, gated_add, x, gate, y);
}
static void cpu_rope(fs_tensor *x, const fs_tensor *cos, const fs_tensor *sin) { DISPATCH(x->dtype, rope, x, cos, sin); }
static int cpu_attention(fs_tensor *out, fs_tensor *lse, fs_lse_layout layout, const fs_tensor *q, const fs_tensor *k,
                         const fs_tensor *v, double scale, fs_err *e)
{
    return DISPATCH(q->dtype, attention, out, lse, layout, q, k, v, scale, e);
}

static void cpu_ring_merge(fs_tensor *out, fs_tensor *lse, const fs_tensor *out_i, const fs_tensor *lse_i,
                           fs_lse_layout layout)
{
    DISPATCH(out->dtype, ring_merge, out, lse, out_i, lse_i, layout);
}

static fs_backend cpu = {
    .name = "cpu-openblas",
    .gemm = cpu_gemm,
    .copy2d = cpu_copy2d,
    .add_bias = cpu_add_bias,
    .add = cpu_add,
    .silu = cpu_silu,
    .gelu_tanh = cpu_gelu_tanh,
    .layernorm = cpu_layernorm,
    .rmsnorm = cpu_rmsnorm,
    .modulate = cpu_modulate,
    .gated_add = cpu_gated_add,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .ring_merge = cpu_ring_merge,
};

fs_backend *fs_backend_cpu(void)
{
    static int tuned;
    if (!tuned) {
        /* glibc serves blocks above its mmap threshold (at most 32 MiB) with fresh mmaps, so a
         * FLUX-width activation ([4608, 12288] fp32 = 226 MB) would be page-faulted and zeroed by
         * the kernel again at every op: 12% of a forward's time in clear_page. With the threshold
         * raised, freed activations go back to the heap and are reused; trimming is raised too
         * so the heap is not returned to the OS between ops. */
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
        tuned = 1;
    }
    return &cpu;
}

void fs_backend_cpu_set_threads(int threads)
{
    if (threads > 0) {
        openblas_set_num_threads(threads);
        omp_set_num_threads(threads);
    }
}
