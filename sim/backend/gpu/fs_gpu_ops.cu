/* fs_gpu_ops.cu — the element-wise, normalisation, RoPE, LSE and ring-merge ops of the GPU
 * backend, for float32, float64 and bfloat16 storage (fs_backend.h states each op's rounding).
 *
 * Every kernel is one template over the storage type S (gio<S>: load widens to the compute type,
 * store rounds once) and mirrors the CPU kernel's expression (sim/backend/fs_kernels_cpu.inc) term for
 * term, so that float64 and float32 results agree with the CPU to the last bit where no
 * transcendental function is involved. This file is compiled without floating-point contraction
 * (nvcc -fmad=false, hipcc -ffp-contract=off; see the Makefile): a·b + c stays two roundings,
 * as on the CPU and as the bfloat16 contract spells out. Grid-stride loops, 256 threads. */
#include "fs_gpu_internal.h"

#include <math.h>

#define THREADS 256

/* ------------------------------------------------------------------ math in the compute type */

__device__ __forceinline__ float g_exp(float x) { return expf(x); }
__device__ __forceinline__ double g_exp(double x) { return exp(x); }
__device__ __forceinline__ float g_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double g_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float g_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double g_log1p(double x) { return log1p(x); }
__device__ __forceinline__ float g_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double g_sqrt(double x) { return sqrt(x); }

#define GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* ------------------------------------------------------------------ host-side checks */

static int bad(fs_err *e, const char *op, const char *what)
{
    return fs_errf(e, FS_E_INTERNAL, "%s backend: %s: %s", FS_GPU_VENDOR, op, what);
}

/* Same dtype and element count (the ops' common precondition; fs_layers.c checks shapes). */
static int same(fs_err *e, const char *op, const fs_tensor *a, const fs_tensor *b)
{
    if (a->dtype != b->dtype)
        return fs_errf(e, FS_E_INTERNAL, "%s backend: %s: dtypes differ (%s vs %s)", FS_GPU_VENDOR, op,
                       gpu_dtname(a->dtype), gpu_dtname(b->dtype));
    if (gpu_numel(a) != gpu_numel(b))
        return fs_errf(e, FS_E_INTERNAL, "%s backend: %s: %lld vs %lld elements", FS_GPU_VENDOR, op,
                       (long long)gpu_numel(a), (long long)gpu_numel(b));
    return FS_OK;
}

/* ------------------------------------------------------------------ convert */

template <typename SY, typename SX> __global__ void k_convert(SY *y, const SX *x, int64_t n)
{
    GRID_STRIDE(i, n) gio<SY>::st(y, i, gio<SX>::ld(x, i));
}

int fs_gpu_convert(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e)
{
    const int64_t n = gpu_numel(y);
    if (n != gpu_numel(x)) return bad(e, "convert", "element counts differ");
    if (!n) return FS_OK;
    cudaStream_t st = gpu_ctx(be)->stream;
    if (y->dtype == x->dtype) {
        if (y->data == x->data) return FS_OK;
        cudaError_t r = cudaMemcpyAsync(y->data, x->data, (size_t)n * gpu_esize(x->dtype), cudaMemcpyDeviceToDevice, st);
        return r == cudaSuccess ? fs_gpu_after(be, "convert", e) : fs_gpu_rt_err(e, "convert", r);
    }
    return gpu_dispatch(y->dtype, "convert", e, [&](auto ty) {
        typedef typename decltype(ty)::type SY;
        return gpu_dispatch(x->dtype, "convert", e, [&](auto tx) {
            typedef typename decltype(tx)::type SX;
            auto k = &k_convert<SY, SX>;
            FS_LAUNCH(k, gpu_blocks(n, THREADS), THREADS, 0, st, (SY *)y->data, (const SX *)x->data, n);
            return fs_gpu_after(be, "convert", e);
        });
    });
}

/* ------------------------------------------------------------------ add, add_bias */

template <typename S> __global__ void k_add(S *y, const S *x, const S *z, int64_t n)
{
    GRID_STRIDE(i, n) gio<S>::st(y, i, gio<S>::ld(x, i) + gio<S>::ld(z, i));
}

int fs_gpu_add(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *z, fs_err *e)
{
    if (same(e, "add", y, x) || same(e, "add", y, z)) return e->code;
    const int64_t n = gpu_numel(y);
    if (!n) return FS_OK;
    return gpu_dispatch(y->dtype, "add", e, [&](auto t) {
        typedef typename decltype(t)::type S;
        auto k = &k_add<S>;
        FS_LAUNCH(k, gpu_blocks(n, THREADS), THREADS, 0, gpu_ctx(be)->stream, (S *)y->data, (const S *)x->data,
                  (const S *)z->data, n);
        return fs_gpu_after(be, "add", e);
    });
}

template <typename S> __global__ void k_mul(S *y, const S *x, const S *z, int64_t n)
{
    GRID_STRIDE(i, n) gio<S>::st(y, i, gio<S>::ld(x, i) * gio<S>::ld(z, i));
}

int fs_gpu_mul(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *z, fs_err *e)
{
    if (same(e, "mul", y, x) || same(e, "mul", y, z)) return e->code;
    const int64_t n = gpu_numel(y);
    if (!n) return FS_OK;
    return gpu_dispatch(y->dtype, "mul", e, [&](auto t) {
        typedef typename decltype(t)::type S;
        auto k = &k_mul<S>;
        FS_LAUNCH(k, gpu_blocks(n, THREADS), THREADS, 0, gpu_ctx(be)->stream, (S *)y->data, (const S *)x->data,
                  (const S *)z->data, n);
        return fs_gpu_after(be, "mul", e);
    });
}

template <typename S> __global__ void k_add_bias(S *y, const S *b, int64_t n, int64_t N)
{
    GRID_STRIDE(i, n) gio<S>::st(y, i, gio<S>::ld(y, i) + gio<S>::ld(b, i % N));
}

int fs_gpu_add_bias(fs_backend *be, fs_tensor *y, const fs_tensor *b, fs_err *e)
{
    if (y->dtype != b->dtype) return bad(e, "add_bias", "bias dtype differs from y's");
    if (y->ndim < 1) return bad(e, "add_bias", "y has no dimensions");
    const int64_t N = y->shape[y->ndim - 1], n = gpu_numel(y);
    if (gpu_numel(b) != N) return bad(e, "add_bias", "bias length is not y's last dimension");
    if (!n) return FS_OK;
    return gpu_dispatch(y->dtype, "add_bias", e, [&](auto t) {
        typedef typename decltype(t)::type S;
        auto k = &k_add_bias<S>;
        FS_LAUNCH(k, gpu_blocks(n, THREADS), THREADS, 0, gpu_ctx(be)->stream, (S *)y->data, (const S *)b->data, n, N);
        return fs_gpu_after(be, "add_bias", e);
    });
}

/* ------------------------------------------------------------------ axpby */

/* float64/float32: a·y + b·x with a, b in the storage type (0-dim tensors of the run dtype).
 * bfloat16: b rounded to float32 then bfloat16, b·x rounded to bfloat16, a·y + that in float32,
 * rounded once (torch's promotion of a 0-dim float32 with a bf16 tensor). */
template <typename S> __global__ void k_axpby(S *y, const S *x, double a, double b, int64_t n)
{
    typedef typename gio<S>::acc A;
    if constexpr (sizeof(S) == 2) {
        const float ta = (float)a, tb = bf16_round((float)b);
        GRID_STRIDE(i, n)
        {
            const float p = bf16_round(tb * gio<S>::ld(x, i));
            gio<S>::st(y, i, ta * gio<S>::ld(y, i) + p);
        }
    } else {
        const A ta = (A)a, tb = (A)b;
        GRID_STRIDE(i, n) gio<S>::st(y, i, ta * gio<S>::ld(y, i) + tb * gio<S>::ld(x, i));
    }
}

int fs_gpu_axpby(fs_backend *be, fs_tensor *y, double a, const fs_tensor *x, double b, fs_err *e)
{
    if (same(e, "axpby", y, x)) return e->code;
    const int64_t n = gpu_numel(y);
    if (!n) return FS_OK;
    return gpu_dispatch(y->dtype, "axpby", e, [&](auto t) {
        typedef typename decltype(t)::type S;
        auto k = &k_axpby<S>;
        FS_LAUNCH(k, gpu_blocks(n, THREADS), THREADS, 0, gpu_ctx(be)->stream, (S *)y->data, (const S *)x->data, a, b, n);
        return fs_gpu_after(be, "axpby", e);
    });
}

/* ------------------------------------------------------------------ silu, gelu_tanh */

template <typename S> __global__ void k_silu(S *y, const S *x, int64_t n)
{
    typedef typename gio<S>::acc A;
    GRID_STRIDE(i, n)
    {
        const A v = gio<S>::ld(x, i);
        gio<S>::st(y, i, v / ((A)1 + g_exp(-v)));
    }
}

int fs_gpu_silu(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e)
{
    if (same(e, "silu", y, x)) return e->code;
    const int64_t n = gpu_numel(y);
    if (!n) return FS_OK;
    return gpu_dispatch(y->dtype, "silu", e, [&](auto t) {
        typedef typename decltype(t)::type S;
        auto k = &k_silu<S>;
        FS_LAUNCH(k, gpu_blocks(n, THREADS), THREADS, 0, gpu_ctx(be)->stream, (S *)y->data, (const S *)x->data, n);
        return fs_gpu_after(be, "silu", e);
    });
}

/* torch: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), the CPU kernel's order of operations */
template <typename S> __global__ void k_gelu_tanh(S *y, const S *x, int64_t n)
{
    typedef typename gio<S>::acc A;
    const A kBeta = (A)0.7978845608028654, kKappa = (A)0.044715;
    GRID_STRIDE(i, n)
    {
        const A v = gio<S>::ld(x, i);
        const A inner = kBeta * (v + kKappa * v * v * v);
        gio<S>::st(y, i, (A)0.5 * v * ((A)1 + g_tanh(inner)));
    }
}

int fs_gpu_gelu_tanh(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e)
{
    if (same(e, "gelu_tanh", y, x)) return e->code;
    const int64_t n = gpu_numel(y);
    if (!n) return FS_OK;
    return gpu_dispatch(y->dtype, "gelu_tanh", e, [&](auto t) {
        typedef typename decltype(t)::type S;
        auto k = &k_gelu_tanh<S>;
        FS_LAUNCH(k, gpu_blocks(n, THREADS), THREADS, 0, gpu_ctx(be)->stream, (S *)y->data, (const S *)x->data, n);
        return fs_gpu_after(be, "gelu_tanh", e);
    });
}

/* ------------------------------------------------------------------ layernorm, rmsnorm */

/* Statistics (mean, variance, sum of squares) accumulate in double for every storage type, as
 * the CPU kernels do (fs_kernels_cpu.inc; its bfloat16 path runs the float32 kernel on upcast
 * values): mean and rstd are then rounded to the compute type, and the output computed in it. */

/* Sum over the block (every thread calls it; the result is returned to all). sh: 33 slots. */
template <typename V> __device__ V block_sum(V v, V *sh)
{
    const int ws = warpSize;
    for (int o = ws / 2; o > 0; o >>= 1) v += FS_SHFL_XOR(v, o, ws);
    const int lane = (int)threadIdx.x % ws, w = (int)threadIdx.x / ws;
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        V t = 0;
        const int nw = ((int)blockDim.x + ws - 1) / ws;
        for (int i = 0; i < nw; i++) t += sh[i];
        sh[32] = t;
    }
    __syncthreads();
    return sh[32];
}

/* One block per row of D: two-pass mean and biased variance, then (x − mean)·rstd in the compute
 * type with mean and rstd rounded to it first (the CPU kernel's expression). */
template <typename S> __global__ void k_layernorm(S *y, const S *x, int64_t D, double eps)
{
    typedef typename gio<S>::acc A;
    typedef double V; /* statistics */
    __shared__ V sh[33];
    const S *a = x + (int64_t)blockIdx.x * D;
    S *o = y + (int64_t)blockIdx.x * D;
    V s = 0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += (V)gio<S>::ld(a, d);
    const V mean = block_sum(s, sh) / (V)D;
    V q = 0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        const V t = (V)gio<S>::ld(a, d) - mean;
        q += t * t;
    }
    const V var = block_sum(q, sh) / (V)D;
    const A rstd = (A)((V)1 / g_sqrt(var + (V)eps)), mu = (A)mean;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) gio<S>::st(o, d, (gio<S>::ld(a, d) - mu) * rstd);
}

int fs_gpu_layernorm(fs_backend *be, fs_tensor *y, const fs_tensor *x, double eps, fs_err *e)
{
    if (same(e, "layernorm", y, x)) return e->code;
    if (x->ndim < 1) return bad(e, "layernorm", "x has no dimensions");
    const int64_t D = x->shape[x->ndim - 1], M = D ? gpu_numel(x) / D : 0;
    if (!M) return FS_OK;
    if (M > (1 << 24)) return bad(e, "layernorm", "more than 2^24 rows (HIP: grid × block < 2^32)");
    return gpu_dispatch(y->dtype, "layernorm", e, [&](auto t) {
        typedef typename decltype(t)::type S;
        auto k = &k_layernorm<S>;
        FS_LAUNCH(k, (unsigned)M, THREADS, 0, gpu_ctx(be)->stream, (S *)y->data, (const S *)x->data, D, eps);
        return fs_gpu_after(be, "layernorm", e);
    });
}

/* RMSNorm over rows of Dh (per head): a group of 32 lanes per row, 8 rows per block; r =
 * 1/sqrt(mean(x²) + eps) rounded to the compute type, y = (x·r)·w. */
#define RMS_LANES 32
template <typename S> __global__ void k_rmsnorm(S *y, const S *x, const S *w, int64_t M, int64_t Dh, double eps)
{
    typedef typename gio<S>::acc A;
    typedef double V; /* statistics */
    const int64_t row = (int64_t)blockIdx.x * (THREADS / RMS_LANES) + threadIdx.x / RMS_LANES;
    const int lane = (int)threadIdx.x % RMS_LANES;
    const bool live = row < M;
    const S *a = x + (live ? row : 0) * Dh;
    V ss = 0;
    if (live)
        for (int64_t d = lane; d < Dh; d += RMS_LANES) {
            const V v = (V)gio<S>::ld(a, d);
            ss += v * v;
        }
    for (int o = RMS_LANES / 2; o > 0; o >>= 1) ss += FS_SHFL_XOR(ss, o, RMS_LANES); /* every lane takes part */
    if (!live) return;
    const A r = (A)((V)1 / g_sqrt(ss / (V)Dh + (V)eps));
    S *out = y + row * Dh;
    for (int64_t d = lane; d < Dh; d += RMS_LANES) gio<S>::st(out, d, (gio<S>::ld(a, d) * r) * gio<S>::ld(w, d));
}

int fs_gpu_rmsnorm(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps, fs_err *e)
{
    if (same(e, "rmsnorm", y, x)) return e->code;
    if (w->dtype != x->dtype) return bad(e, "rmsnorm", "weight dtype differs from x's");
    const int64_t Dh = gpu_numel(w), n = gpu_numel(x);
    if (!Dh || n % Dh) return bad(e, "rmsnorm", "x's element count is not a multiple of the weight's length");
    const int64_t M = n / Dh, rows_per_block = THREADS / RMS_LANES;
    if (!M) return FS_OK;
    const int64_t blocks = (M + rows_per_block - 1) / rows_per_block;
    if (blocks > (1 << 24)) return bad(e, "rmsnorm", "more than 2^27 rows (HIP: grid × block < 2^32)");
    return gpu_dispatch(y->dtype, "rmsnorm", e, [&](auto t) {
        typedef typename decltype(t)::type S;
        auto k = &k_rmsnorm<S>;
        FS_LAUNCH(k, (unsigned)blocks, THREADS, 0, gpu_ctx(be)->stream, (S *)y->data, (const S *)x->data,
                  (const S *)w->data, M, Dh, eps);
        return fs_gpu_after(be, "rmsnorm", e);
    });
}

/* ------------------------------------------------------------------ modulate, gated_add */

/* y = x·(1 + scale) + shift; bfloat16: (1 + scale), the product and the sum each round. */
template <typename S>
__global__ void k_modulate(S *y, const S *x, const S *scale, const S *shift, int64_t n, int64_t SD, int64_t D)
{
    typedef typename gio<S>::acc A;
    GRID_STRIDE(i, n)
    {
        const int64_t bd = (i / SD) * D + i % D;
        const A a = gio<S>::ld(x, i), sc = gio<S>::ld(scale, bd), sh = gio<S>::ld(shift, bd);
        if constexpr (sizeof(S) == 2)
            gio<S>::st(y, i, bf16_round(a * bf16_round((A)1 + sc)) + sh);
        else
            gio<S>::st(y, i, a * ((A)1 + sc) + sh);
    }
}

static int bsd_check(fs_err *e, const char *op, const fs_tensor *x, const fs_tensor *bd1, const fs_tensor *bd2)
{
    if (x->ndim != 3) return bad(e, op, "x is not [B, S, D]");
    const int64_t BD = x->shape[0] * x->shape[2];
    if (bd1->dtype != x->dtype || (bd2 && bd2->dtype != x->dtype)) return bad(e, op, "dtypes differ");
    if (gpu_numel(bd1) != BD || (bd2 && gpu_numel(bd2) != BD)) return bad(e, op, "per-batch vectors are not [B, D]");
    return FS_OK;
}

int fs_gpu_modulate(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *scale, const fs_tensor *shift,
                    fs_err *e)
{
    if (same(e, "modulate", y, x) || bsd_check(e, "modulate", x, scale, shift)) return e->code;
    const int64_t n = gpu_numel(x), S_ = x->shape[1], D = x->shape[2];
    if (!n) return FS_OK;
    return gpu_dispatch(y->dtype, "modulate", e, [&](auto t) {
        typedef typename decltype(t)::type S;
        auto k = &k_modulate<S>;
        FS_LAUNCH(k, gpu_blocks(n, THREADS), THREADS, 0, gpu_ctx(be)->stream, (S *)y->data, (const S *)x->data,
                  (const S *)scale->data, (const S *)shift->data, n, S_ * D, D);
        return fs_gpu_after(be, "modulate", e);
    });
}

/* x += gate·y; bfloat16: the product rounds, then the sum. */
template <typename S> __global__ void k_gated_add(S *x, const S *gate, const S *y, int64_t n, int64_t SD, int64_t D)
{
    typedef typename gio<S>::acc A;
    GRID_STRIDE(i, n)
    {
        const A g = gio<S>::ld(gate, (i / SD) * D + i % D), v = gio<S>::ld(y, i);
        if constexpr (sizeof(S) == 2)
            gio<S>::st(x, i, gio<S>::ld(x, i) + bf16_round(g * v));
        else
            gio<S>::st(x, i, gio<S>::ld(x, i) + g * v);
    }
}

int fs_gpu_gated_add(fs_backend *be, fs_tensor *x, const fs_tensor *gate, const fs_tensor *y, fs_err *e)
{
    if (same(e, "gated_add", x, y) || bsd_check(e, "gated_add", x, gate, NULL)) return e->code;
    const int64_t n = gpu_numel(x), S_ = x->shape[1], D = x->shape[2];
    if (!n) return FS_OK;
    return gpu_dispatch(x->dtype, "gated_add", e, [&](auto t) {
        typedef typename decltype(t)::type S;
        auto k = &k_gated_add<S>;
        FS_LAUNCH(k, gpu_blocks(n, THREADS), THREADS, 0, gpu_ctx(be)->stream, (S *)x->data, (const S *)gate->data,
                  (const S *)y->data, n, S_ * D, D);
        return fs_gpu_after(be, "gated_add", e);
    });
}

/* ------------------------------------------------------------------ rope */

/* Adjacent pairs, in place, computed in the tables' type TT and cast back (diffusers'
 * apply_rotary_emb: x.float()·cos + rotate_half(x)·sin). One thread per pair. */
template <typename S, typename TT>
__global__ void k_rope(S *x, const TT *cs, const TT *sn, int64_t pairs, int64_t S_, int64_t H, int64_t Dh)
{
    const int64_t half = Dh / 2;
    GRID_STRIDE(i, pairs)
    {
        const int64_t row = i / half, j = 2 * (i % half); /* row = (b·S + s)·H + h */
        const int64_t s = (row / H) % S_;
        S *p = x + row * Dh;
        const TT *c = cs + s * Dh, *sv = sn + s * Dh;
        const TT re = (TT)gio<S>::ld(p, j), im = (TT)gio<S>::ld(p, j + 1);
        const TT o0 = re * c[j] + (-im) * sv[j];
        const TT o1 = im * c[j + 1] + re * sv[j + 1];
        gio<S>::st(p, j, o0);
        gio<S>::st(p, j + 1, o1);
    }
}

int fs_gpu_rope(fs_backend *be, fs_tensor *x, const fs_tensor *cos, const fs_tensor *sin, fs_err *e)
{
    if (x->ndim != 4) return bad(e, "rope", "x is not [B, S, H, Dh]");
    const int64_t S_ = x->shape[1], H = x->shape[2], Dh = x->shape[3], n = gpu_numel(x);
    if (Dh % 2) return bad(e, "rope", "odd head dim");
    if (cos->dtype != sin->dtype || (cos->dtype != FS_F32 && cos->dtype != FS_F64))
        return bad(e, "rope", "cos/sin tables must both be float32 or both float64");
    if (gpu_numel(cos) < S_ * Dh || gpu_numel(sin) < S_ * Dh) return bad(e, "rope", "cos/sin tables smaller than [S, Dh]");
    if (!n) return FS_OK;
    const int64_t pairs = n / 2;
    return gpu_dispatch(x->dtype, "rope", e, [&](auto t) {
        typedef typename decltype(t)::type S;
        if (cos->dtype == FS_F64) {
            auto k = &k_rope<S, double>;
            FS_LAUNCH(k, gpu_blocks(pairs, THREADS), THREADS, 0, gpu_ctx(be)->stream, (S *)x->data,
                      (const double *)cos->data, (const double *)sin->data, pairs, S_, H, Dh);
        } else {
            auto k = &k_rope<S, float>;
            FS_LAUNCH(k, gpu_blocks(pairs, THREADS), THREADS, 0, gpu_ctx(be)->stream, (S *)x->data,
                      (const float *)cos->data, (const float *)sin->data, pairs, S_, H, Dh);
        }
        return fs_gpu_after(be, "rope", e);
    });
}

/* ------------------------------------------------------------------ LSE layouts */

static __device__ __forceinline__ int64_t lse_index(int layout, int64_t b, int64_t h, int64_t s, int64_t H, int64_t S)
{
    return layout == FS_LSE_BHS ? (b * H + h) * S + s : (b * S + s) * H + h;
}

/* Element i enumerates (b, h, s) in [B, H, S] order; both indices are computed from B, H, S
 * explicitly, never from a tensor's shape. */
template <typename S>
__global__ void k_lse_convert(S *dst, int dl, const S *src, int sl, int64_t n, int64_t H, int64_t S_)
{
    GRID_STRIDE(i, n)
    {
        const int64_t s = i % S_, h = (i / S_) % H, b = i / (S_ * H);
        dst[lse_index(dl, b, h, s, H, S_)] = src[lse_index(sl, b, h, s, H, S_)];
    }
}

int fs_gpu_lse_convert(fs_backend *be, fs_tensor *dst, fs_lse_layout dst_layout, const fs_tensor *src,
                       fs_lse_layout src_layout, int64_t B, int64_t H, int64_t S, fs_err *e)
{
    const int64_t n = B * H * S;
    if (B < 0 || H < 0 || S < 0) return bad(e, "lse_convert", "negative size");
    if ((dst_layout != FS_LSE_BHS && dst_layout != FS_LSE_BSH) || (src_layout != FS_LSE_BHS && src_layout != FS_LSE_BSH))
        return bad(e, "lse_convert", "unknown LSE layout");
    if (dst->dtype != src->dtype) return bad(e, "lse_convert", "dtypes differ");
    if (gpu_numel(dst) < n || gpu_numel(src) < n)
        return fs_errf(e, FS_E_INTERNAL, "%s backend: lse_convert: tensors smaller than B·H·S = %lld", FS_GPU_VENDOR,
                       (long long)n);
    if (!n) return FS_OK;
    if (dst->data == src->data) {
        if (dst_layout == src_layout) return FS_OK;
        return bad(e, "lse_convert", "in place between two layouts (dst and src must differ)");
    }
    return gpu_dispatch(dst->dtype, "lse_convert", e, [&](auto t) {
        typedef typename decltype(t)::type T;
        auto k = &k_lse_convert<T>;
        FS_LAUNCH(k, gpu_blocks(n, THREADS), THREADS, 0, gpu_ctx(be)->stream, (T *)dst->data, (int)dst_layout,
                  (const T *)src->data, (int)src_layout, n, H, S);
        return fs_gpu_after(be, "lse_convert", e);
    });
}

/* ------------------------------------------------------------------ ring merge */

/* out ← out − σ(lse_i − lse)·(out − out_i), element-wise (out_i upcast to T). Reads the old lse:
 * lse is updated by the next kernel, once every element has been merged. */
template <typename T, typename SI>
__global__ void k_ring_merge_out(T *out, const SI *out_i, const T *lse, const T *lse_i, int64_t n, int64_t S_, int64_t H,
                                 int64_t Dh)
{
    GRID_STRIDE(i, n)
    {
        const int64_t r = i / Dh, h = r % H, s = (r / H) % S_, b = r / (H * S_);
        const int64_t li = (b * H + h) * S_ + s;
        const T w = (T)1 / ((T)1 + g_exp(-(lse_i[li] - lse[li]))); /* sigmoid(lse_i − lse) */
        const T o = out[i], oi = (T)gio<SI>::ld(out_i, i);
        out[i] = o - w * (o - oi);
    }
}

/* lse ← lse − logσ(lse − lse_i), log-sigmoid computed stably both ways (the CPU's). */
template <typename T> __global__ void k_ring_merge_lse(T *lse, const T *lse_i, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        const T l = lse[i], x = l - lse_i[i];
        const T ls = x >= (T)0 ? -g_log1p(g_exp(-x)) : x - g_log1p(g_exp(x));
        lse[i] = l - ls;
    }
}

int fs_gpu_ring_merge(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *out_i, const fs_tensor *lse_i,
                      fs_err *e)
{
    if (out->ndim != 4) return bad(e, "ring_merge", "out is not [B, S, H, Dh]");
    if (out->dtype != FS_F32 && out->dtype != FS_F64)
        return bad(e, "ring_merge", "the running out must be float32 or float64");
    if (lse->dtype != out->dtype || lse_i->dtype != out->dtype) return bad(e, "ring_merge", "lse dtypes differ from out's");
    if (out_i->dtype != out->dtype && out_i->dtype != FS_BF16)
        return bad(e, "ring_merge", "out_i must have out's dtype or be bfloat16");
    const int64_t B = out->shape[0], S_ = out->shape[1], H = out->shape[2], Dh = out->shape[3];
    const int64_t n = gpu_numel(out), nl = B * H * S_;
    if (gpu_numel(out_i) != n) return bad(e, "ring_merge", "out_i's element count differs from out's");
    if (gpu_numel(lse) < nl || gpu_numel(lse_i) < nl) return bad(e, "ring_merge", "lse smaller than [B, H, S]");
    if (!n) return FS_OK;
    cudaStream_t st = gpu_ctx(be)->stream;
    auto run = [&](auto tt, auto ti) {
        typedef typename decltype(tt)::type T;
        typedef typename decltype(ti)::type SI;
        auto k1 = &k_ring_merge_out<T, SI>;
        FS_LAUNCH(k1, gpu_blocks(n, THREADS), THREADS, 0, st, (T *)out->data, (const SI *)out_i->data,
                  (const T *)lse->data, (const T *)lse_i->data, n, S_, H, Dh);
        auto k2 = &k_ring_merge_lse<T>;
        FS_LAUNCH(k2, gpu_blocks(nl, THREADS), THREADS, 0, st, (T *)lse->data, (const T *)lse_i->data, nl);
        return fs_gpu_after(be, "ring_merge", e);
    };
    if (out->dtype == FS_F64) return out_i->dtype == FS_BF16 ? run(gtag<double>(), gtag<bf16_t>()) : run(gtag<double>(), gtag<double>());
    return out_i->dtype == FS_BF16 ? run(gtag<float>(), gtag<bf16_t>()) : run(gtag<float>(), gtag<float>());
}
