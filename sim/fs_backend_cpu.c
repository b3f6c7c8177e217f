/* fs_backend_cpu.c — the CPU backend: OpenBLAS for every matmul, plain C for the rest, memory
 * that is ordinary host memory (host_addressable: MPI and recorders use it in place; uploads and
 * downloads are memcpy, or nothing when source and destination coincide).
 * Each kernel is written once in fs_kernels_cpu.inc and instantiated per dtype. */
#include <cblas.h>
#include <malloc.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "fs_backend_cpu.h"

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

const char *fs_lse_layout_name(fs_lse_layout l) { return l == FS_LSE_BSH ? "bsh" : "bhs"; }

/* ---------------------------------------------------------------- memory */

static int cpu_alloc(fs_backend *be, size_t bytes, void **p, fs_err *e)
{
    /* 64-byte alignment: what OpenBLAS and AVX-512 loads like best */
    size_t n = (bytes + 63) / 64 * 64;
    *p = aligned_alloc(64, n ? n : 64);
    if (!*p) return fs_errf(e, FS_E_NOMEM, "out of memory allocating %zu bytes", bytes);
    return FS_OK;
}
static void cpu_free(fs_backend *be, void *p) { free(p); }
static int cpu_memset(fs_backend *be, void *p, int v, size_t n, fs_err *e)
{
    if (n) memset(p, v, n);
    return FS_OK;
}
/* One 2-D copy for all three directions: host memory on both sides. */
static int cpu_copy2d(fs_backend *be, void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t rows, fs_err *e)
{
    if (!w || !rows || dst == src) return FS_OK;
    if (dp == w && sp == w) {
        memmove(dst, src, w * rows);
        return FS_OK;
    }
    for (size_t r = 0; r < rows; r++) memmove((char *)dst + r * dp, (const char *)src + r * sp, w);
    return FS_OK;
}
static int cpu_sync(fs_backend *be, fs_err *e) { return FS_OK; }
static int cpu_host_alloc(fs_backend *be, size_t bytes, void **p, fs_err *e)
{
    *p = malloc(bytes ? bytes : 1);
    return *p ? FS_OK : fs_errf(e, FS_E_NOMEM, "out of memory allocating %zu bytes of staging", bytes);
}
static void cpu_host_free(fs_backend *be, void *p) { free(p); }

/* ---------------------------------------------------------------- compute */

/* The instance for the dtype of the first tensor argument; bfloat16 is not served by these
 * kernels (yet): an error naming the op, never a silent wrong answer. */
#define DISPATCH(op, dt, ...)                                                                              \
    do {                                                                                                   \
        switch (dt) {                                                                                      \
        case FS_F32: op##_f32(__VA_ARGS__); return FS_OK;                                                  \
        case FS_F64: op##_f64(__VA_ARGS__); return FS_OK;                                                  \
        default: return fs_errf(e, FS_E_INPUT, "cpu backend: %s on %s is not supported", #op, fs_dtype_name(dt)); \
        }                                                                                                  \
    } while (0)

static int cpu_gemm(fs_backend *be, fs_dtype dt, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                    const void *W, int64_t ldw, const void *bias, void *C, int64_t ldc, fs_err *e)
{
    DISPATCH(gemm, dt, M, N, K, A, lda, W, ldw, bias, C, ldc);
}
static int cpu_convert(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e) { return fs_tensor_copy(y, x, e); }
static int cpu_add(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *z, fs_err *e)
{
    DISPATCH(add, y->dtype, y, x, z);
}
static int cpu_add_bias(fs_backend *be, fs_tensor *y, const fs_tensor *b, fs_err *e) { DISPATCH(add_bias, y->dtype, y, b); }
static int cpu_axpby(fs_backend *be, fs_tensor *y, double a, const fs_tensor *x, double b, fs_err *e)
{
    DISPATCH(axpby, y->dtype, y, a, x, b);
}
static int cpu_silu(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e) { DISPATCH(silu, y->dtype, y, x); }
static int cpu_gelu_tanh(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e)
{
    DISPATCH(gelu_tanh, y->dtype, y, x);
}
static int cpu_layernorm(fs_backend *be, fs_tensor *y, const fs_tensor *x, double eps, fs_err *e)
{
    DISPATCH(layernorm, y->dtype, y, x, eps);
}
static int cpu_rmsnorm(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps, fs_err *e)
{
    DISPATCH(rmsnorm, y->dtype, y, x, w, eps);
}
static int cpu_modulate(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *scale, const fs_tensor *shift,
                        fs_err *e)
{
    DISPATCH(modulate, y->dtype, y, x, scale, shift);
}
static int cpu_gated_add(fs_backend *be, fs_tensor *x, const fs_tensor *gate, const fs_tensor *y, fs_err *e)
{
    DISPATCH(gated_add, x->dtype, x, gate, y);
}
static int cpu_rope(fs_backend *be, fs_tensor *x, const fs_tensor *cos, const fs_tensor *sin, fs_err *e)
{
    DISPATCH(rope, x->dtype, x, cos, sin);
}
static int cpu_attention(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *q, const fs_tensor *k,
                         const fs_tensor *v, double scale, fs_err *e)
{
    switch (q->dtype) {
    case FS_F32: return attention_f32(out, lse, be->lse_layout, q, k, v, scale, e);
    case FS_F64: return attention_f64(out, lse, be->lse_layout, q, k, v, scale, e);
    default: return fs_errf(e, FS_E_INPUT, "cpu backend: attention on %s is not supported", fs_dtype_name(q->dtype));
    }
}
static int cpu_lse_convert(fs_backend *be, fs_tensor *dst, fs_lse_layout dl, const fs_tensor *src, fs_lse_layout sl,
                           int64_t B, int64_t H, int64_t S, fs_err *e)
{
    if (fs_tensor_numel(dst) < B * H * S || fs_tensor_numel(src) < B * H * S)
        return fs_errf(e, FS_E_INTERNAL, "lse_convert: tensors smaller than B·H·S = %lld", (long long)(B * H * S));
    DISPATCH(lse_convert, dst->dtype, dst, dl, src, sl, B, H, S);
}
static int cpu_ring_merge(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *out_i, const fs_tensor *lse_i,
                          fs_err *e)
{
    DISPATCH(ring_merge, out->dtype, out, lse, out_i, lse_i);
}

#define CPU_OPS                                                                                              \
    .alloc = cpu_alloc, .free = cpu_free, .memset = cpu_memset, .upload2d = cpu_copy2d, .download2d = cpu_copy2d, \
    .copy2d = cpu_copy2d, .sync = cpu_sync, .host_alloc = cpu_host_alloc, .host_free = cpu_host_free,          \
    .gemm = cpu_gemm, .convert = cpu_convert, .add = cpu_add, .add_bias = cpu_add_bias, .axpby = cpu_axpby,    \
    .silu = cpu_silu, .gelu_tanh = cpu_gelu_tanh, .layernorm = cpu_layernorm, .rmsnorm = cpu_rmsnorm,          \
    .modulate = cpu_modulate, .gated_add = cpu_gated_add, .rope = cpu_rope, .attention = cpu_attention,       \
    .lse_convert = cpu_lse_convert, .ring_merge = cpu_ring_merge

static fs_backend cpu = {.name = "cpu", .host_addressable = 1, .lse_layout = FS_LSE_BHS, CPU_OPS};

/* The same kernels, for the strict backend to call with untagged pointers. */
const fs_backend *fs_backend_cpu_kernels(void) { return &cpu; }

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
