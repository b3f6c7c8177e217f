/* fs_gpu_internal.h — what the sim/backend/gpu/ .cu files share (C++ only; never included from C).
 *
 * The backend's state, bfloat16 storage, the per-dtype load/store traits every kernel is
 * written against, dtype dispatch, launch-error checks. */
#ifndef FS_GPU_INTERNAL_H
#define FS_GPU_INTERNAL_H

#include "fs_gpu_vendor.h"

#include <stdint.h>

extern "C" {
#include "../fs_backend.h"
}
#include "fs_backend_gpu.h"

/* ------------------------------------------------------------------ backend state */

struct fs_gpu_cache; /* the caching allocator (fs_gpu_mem.cu) */

struct fs_gpu_ctx {
    int device, ndev, local_rank;
    cudaStream_t stream;
    int gemm_tiled;      /* 1: the own tiled GEMM kernel (always on HIP; FLUX_SIM_GPU_GEMM=tiled on CUDA) */
    int sync_each;       /* FLUX_SIM_GPU_SYNC=1: synchronise after every op */
    void *blas;          /* cublasHandle_t (CUDA, cuBLAS path), else NULL */
    void *gemm_ws;       /* float32 scratch of the bfloat16 cuBLAS GEMM (C before bias + rounding) */
    size_t gemm_ws_bytes;
    fs_gpu_cache *cache;      /* device blocks */
    fs_gpu_cache *host_cache; /* pinned staging blocks */
    char devname[256];
    char arch[64]; /* "sm_90" / "gfx90a" */
    int sms;
    size_t mem_total;
    int rt_version, drv_version;
};

static inline fs_gpu_ctx *gpu_ctx(fs_backend *be) { return (fs_gpu_ctx *)be->ctx; }

/* ------------------------------------------------------------------ errors */

/* FS_E_NOMEM for an allocation failure, FS_E_INTERNAL for any other runtime error. */
int fs_gpu_rt_err(fs_err *e, const char *op, cudaError_t st);
/* After a launch: the launch error (cudaGetLastError), and with FLUX_SIM_GPU_SYNC=1 the error of
 * running it, both named by op. */
int fs_gpu_after(fs_backend *be, const char *op, fs_err *e);

/* ------------------------------------------------------------------ sizes */

static inline int64_t gpu_numel(const fs_tensor *t)
{
    if (t->ndim <= 0) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
static inline size_t gpu_esize(fs_dtype dt) { return dt == FS_F64 ? 8 : dt == FS_BF16 ? 2 : 4; }
static inline const char *gpu_dtname(fs_dtype dt)
{
    return dt == FS_F64 ? "float64" : dt == FS_BF16 ? "bfloat16" : dt == FS_F32 ? "float32" : "unknown dtype";
}
static inline const char *gpu_lse_name(fs_lse_layout l) { return l == FS_LSE_BSH ? "bsh" : "bhs"; }

/* Grid for a grid-stride loop over n elements with `threads` per block. */
static inline unsigned gpu_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65536) b = 65536;
    return (unsigned)b;
}

/* ------------------------------------------------------------------ bfloat16 storage */

/* bfloat16 is stored as uint16_t (HIP 5.2 has no __hip_bfloat16). Rounding is c10's
 * round_to_nearest_even, bit for bit fs_bf16_from_float of fs_common.h: NaN becomes 0x7FC0. */
typedef uint16_t bf16_t;

static __device__ __forceinline__ float bf16_to_f(bf16_t h) { return __uint_as_float((uint32_t)h << 16); }
static __device__ __forceinline__ bf16_t f_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)0x7FC0u;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}
/* round a float32 to the nearest bfloat16 value, kept in float32 */
static __device__ __forceinline__ float bf16_round(float f) { return bf16_to_f(f_to_bf16(f)); }

/* Storage traits: S is the storage type (float, double, bf16_t); acc is what an op computes in
 * (float32 for float32 and bfloat16, float64 for float64). ld widens, st narrows with one
 * rounding (a double stored to bfloat16 goes through float32 first, as c10's BFloat16(float)
 * constructor does with a double). */
template <typename S> struct gio;
template <> struct gio<float> {
    typedef float acc;
    static __device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
    static __device__ __forceinline__ void st(float *p, int64_t i, float v) { p[i] = v; }
    static __device__ __forceinline__ void st(float *p, int64_t i, double v) { p[i] = (float)v; }
};
template <> struct gio<double> {
    typedef double acc;
    static __device__ __forceinline__ double ld(const double *p, int64_t i) { return p[i]; }
    static __device__ __forceinline__ void st(double *p, int64_t i, double v) { p[i] = v; }
    static __device__ __forceinline__ void st(double *p, int64_t i, float v) { p[i] = (double)v; }
};
template <> struct gio<bf16_t> {
    typedef float acc;
    static __device__ __forceinline__ float ld(const bf16_t *p, int64_t i) { return bf16_to_f(p[i]); }
    static __device__ __forceinline__ void st(bf16_t *p, int64_t i, float v) { p[i] = f_to_bf16(v); }
    static __device__ __forceinline__ void st(bf16_t *p, int64_t i, double v) { p[i] = f_to_bf16((float)v); }
};

/* ------------------------------------------------------------------ dtype dispatch */

template <typename T> struct gtag {
    typedef T type;
};
/* f(gtag<S>()) for the storage type of dt; FS_E_INTERNAL for an unknown dtype. */
template <typename F> static inline int gpu_dispatch(fs_dtype dt, const char *op, fs_err *e, F f)
{
    switch (dt) {
    case FS_F32: return f(gtag<float>());
    case FS_F64: return f(gtag<double>());
    case FS_BF16: return f(gtag<bf16_t>());
    }
    return fs_errf(e, FS_E_INTERNAL, "%s backend: %s: unknown dtype %d", FS_GPU_VENDOR, op, (int)dt);
}

/* ------------------------------------------------------------------ ops of the table */

int fs_gpu_gemm_init(fs_gpu_ctx *c, fs_err *e);
void fs_gpu_gemm_fini(fs_gpu_ctx *c);
int fs_gpu_gemm(fs_backend *be, fs_dtype dt, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W,
                int64_t ldw, const void *bias, void *C, int64_t ldc, fs_err *e);

int fs_gpu_convert(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e);
int fs_gpu_add(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *z, fs_err *e);
int fs_gpu_mul(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *z, fs_err *e);
int fs_gpu_add_bias(fs_backend *be, fs_tensor *y, const fs_tensor *b, fs_err *e);
int fs_gpu_axpby(fs_backend *be, fs_tensor *y, double a, const fs_tensor *x, double b, fs_err *e);
int fs_gpu_silu(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e);
int fs_gpu_gelu_tanh(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e);
int fs_gpu_layernorm(fs_backend *be, fs_tensor *y, const fs_tensor *x, double eps, fs_err *e);
int fs_gpu_rmsnorm(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps, fs_err *e);
int fs_gpu_modulate(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *scale, const fs_tensor *shift,
                    fs_err *e);
int fs_gpu_gated_add(fs_backend *be, fs_tensor *x, const fs_tensor *gate, const fs_tensor *y, fs_err *e);
int fs_gpu_rope(fs_backend *be, fs_tensor *x, const fs_tensor *cos, const fs_tensor *sin, fs_err *e);
int fs_gpu_lse_convert(fs_backend *be, fs_tensor *dst, fs_lse_layout dst_layout, const fs_tensor *src,
                       fs_lse_layout src_layout, int64_t B, int64_t H, int64_t S, fs_err *e);
int fs_gpu_ring_merge(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *out_i, const fs_tensor *lse_i,
                      fs_err *e);
int fs_gpu_attention(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *q, const fs_tensor *k,
                     const fs_tensor *v, double scale, fs_err *e);

#endif
