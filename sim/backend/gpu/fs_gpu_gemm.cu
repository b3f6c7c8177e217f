/* fs_gpu_gemm.cu — nn.Linear on the GPU: C[M, N] = A[M, K] · W[N, K]ᵀ (+ bias[N]), row-major,
 * leading dimensions in elements.
 *
 * Two paths, the same contract (fs_backend.h):
 *  - cuBLAS (CUDA, the default there): float64 cublasDgemm, float32 cublasSgemm (default math
 *    mode: no TF32), then the bias added in the storage type by a kernel — the CPU backend's two
 *    steps. bfloat16: cublasGemmEx with bf16 operands, CUBLAS_COMPUTE_32F and a float32 result
 *    in a scratch buffer (in row blocks of at most 64 MiB), then one kernel adds the bias in
 *    float32 and rounds once to bfloat16.
 *  - tiled (HIP, which has no BLAS on Debian 12; FLUX_SIM_GPU_GEMM=tiled on CUDA, so both paths
 *    can be checked on one GPU): 64×64 output tiles, K in steps of 16 through shared memory,
 *    256 threads each owning a 4×4 micro-tile; operands widened to the compute type as they are
 *    loaded (float32 for float32/bfloat16, float64 for float64), each output's K terms summed in
 *    order with fused multiply-adds, the bias added in the compute type, one rounding on store.
 * Row-major C = A·Wᵀ is, to column-major BLAS, Cᵀ = W·Aᵀ: op(W) = T, op(A) = N, m = N, n = M. */
#include "fs_gpu_internal.h"

#if FS_GPU_HAVE_BLAS
#include <cublas_v2.h>
#endif

#include <string.h>

#define WS_BYTES ((size_t)64 << 20) /* the bfloat16 cuBLAS path's float32 scratch */

/* ------------------------------------------------------------------ tiled kernel */

#define TBM 64
#define TBN 64
#define TBK 16
#define TTHREADS 256 /* 16 × 16 threads, 4 × 4 outputs each: rows ty + 16i, columns tx + 16j */

template <typename S>
__global__ void __launch_bounds__(TTHREADS)
    k_gemm_tiled(int64_t M, int64_t N, int64_t K, const S *__restrict__ A, int64_t lda, const S *__restrict__ W,
                 int64_t ldw, const S *__restrict__ bias, S *__restrict__ C, int64_t ldc)
{
    typedef typename gio<S>::acc T;
    __shared__ T As[TBK][TBM + 1]; /* As[k][m]: +1 keeps the transposing stores off one bank */
    __shared__ T Ws[TBK][TBN + 1];
    const int tx = (int)threadIdx.x % 16, ty = (int)threadIdx.x / 16, tid = (int)threadIdx.x;
    const int64_t m0 = (int64_t)blockIdx.y * TBM, n0 = (int64_t)blockIdx.x * TBN;
    T acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = (T)0;

    for (int64_t k0 = 0; k0 < K; k0 += TBK) {
        /* 64 rows × 16 k of A and of W, 4 elements per thread; consecutive threads read
         * consecutive k of a row (coalesced); out-of-range elements are zeros */
#pragma unroll
        for (int r = 0; r < (TBM * TBK) / TTHREADS; r++) {
            const int idx = tid + r * TTHREADS, row = idx / TBK, kk = idx % TBK;
            const int64_t gm = m0 + row, gn = n0 + row, gk = k0 + kk;
            As[kk][row] = (gm < M && gk < K) ? gio<S>::ld(A, gm * lda + gk) : (T)0;
            Ws[kk][row] = (gn < N && gk < K) ? gio<S>::ld(W, gn * ldw + gk) : (T)0;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TBK; kk++) {
            T a[4], w[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) w[j] = Ws[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * w[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t m = m0 + ty + 16 * i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t n = n0 + tx + 16 * j;
            if (n >= N) continue;
            T v = acc[i][j];
            if (bias) v = v + gio<S>::ld(bias, n);
            gio<S>::st(C, m * ldc + n, v);
        }
    }
}

static int gemm_tiled(fs_backend *be, fs_dtype dt, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                      const void *W, int64_t ldw, const void *bias, void *C, int64_t ldc, fs_err *e)
{
    const int64_t gx = (N + TBN - 1) / TBN, gy = (M + TBM - 1) / TBM;
    if (gx > 0x7fffffff || gy > 65535)
        return fs_errf(e, FS_E_INTERNAL, "%s backend: gemm: %lld×%lld output is too large for the tiled kernel's grid",
                       FS_GPU_VENDOR, (long long)M, (long long)N);
    const dim3 grid((unsigned)gx, (unsigned)gy);
    return gpu_dispatch(dt, "gemm", e, [&](auto t) {
        typedef typename decltype(t)::type S;
        auto k = &k_gemm_tiled<S>;
        FS_LAUNCH(k, grid, TTHREADS, 0, gpu_ctx(be)->stream, M, N, K, (const S *)A, lda, (const S *)W, ldw,
                  (const S *)bias, (S *)C, ldc);
        return fs_gpu_after(be, "gemm (tiled)", e);
    });
}

/* ------------------------------------------------------------------ epilogues of the BLAS path */

/* C[m, n] += bias[n] in the storage type (float32/float64: what the CPU backend does after its
 * BLAS call). */
template <typename S> __global__ void k_bias_rows(S *C, int64_t ldc, const S *bias, int64_t M, int64_t N)
{
    const int64_t n = M * N;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / N, c = i % N;
        C[m * ldc + c] = C[m * ldc + c] + bias[c];
    }
}

/* C[m, n] = bf16(acc[m, n] + bias[n]): the bias in float32, one rounding. */
__global__ void k_bias_round_bf16(bf16_t *C, int64_t ldc, const float *acc, const bf16_t *bias, int64_t M, int64_t N)
{
    const int64_t n = M * N;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / N, c = i % N;
        float v = acc[i];
        if (bias) v = v + bf16_to_f(bias[c]);
        C[m * ldc + c] = f_to_bf16(v);
    }
}

#if FS_GPU_HAVE_BLAS
static int blas_err(fs_err *e, const char *what, cublasStatus_t st)
{
    return fs_errf(e, st == CUBLAS_STATUS_ALLOC_FAILED ? FS_E_NOMEM : FS_E_INTERNAL, "%s backend: gemm: %s: %s",
                   FS_GPU_VENDOR, what, cublasGetStatusName(st));
}

static int gemm_blas(fs_backend *be, fs_dtype dt, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                     const void *W, int64_t ldw, const void *bias, void *C, int64_t ldc, fs_err *e)
{
    fs_gpu_ctx *c = gpu_ctx(be);
    cublasHandle_t h = (cublasHandle_t)c->blas;
    const int64_t big = 0x7fffffff;
    if (M > big || N > big || K > big || lda > big || ldw > big || ldc > big)
        return fs_errf(e, FS_E_INTERNAL, "%s backend: gemm: a dimension exceeds cuBLAS's int range", FS_GPU_VENDOR);
    const int m = (int)N, n = (int)M, k = (int)K;
    cublasStatus_t st;
    if (dt == FS_F64) {
        const double one = 1, zero = 0;
        st = cublasDgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, (const double *)W, (int)ldw, (const double *)A,
                         (int)lda, &zero, (double *)C, (int)ldc);
        if (st != CUBLAS_STATUS_SUCCESS) return blas_err(e, "cublasDgemm", st);
    } else if (dt == FS_F32) {
        const float one = 1, zero = 0;
        st = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, (const float *)W, (int)ldw, (const float *)A,
                         (int)lda, &zero, (float *)C, (int)ldc);
        if (st != CUBLAS_STATUS_SUCCESS) return blas_err(e, "cublasSgemm", st);
    } else if (dt == FS_BF16) {
        /* float32 result of a block of rows into the scratch, then bias + rounding into C */
        int64_t rows = (int64_t)(WS_BYTES / ((size_t)N * sizeof(float)));
        if (rows < 1) rows = 1;
        if (rows > M) rows = M;
        const size_t need = (size_t)rows * (size_t)N * sizeof(float);
        if (c->gemm_ws_bytes < need) {
            (void)cudaStreamSynchronize(c->stream); /* the old scratch may still be read */
            be->free(be, c->gemm_ws);
            c->gemm_ws = NULL;
            c->gemm_ws_bytes = 0;
            if (be->alloc(be, need, &c->gemm_ws, e)) return fs_err_prefix(e, "gemm scratch: ");
            c->gemm_ws_bytes = need;
        }
        const float one = 1, zero = 0;
        for (int64_t r0 = 0; r0 < M; r0 += rows) {
            const int64_t nr = M - r0 < rows ? M - r0 : rows;
            st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, (int)nr, k, &one, W, CUDA_R_16BF, (int)ldw,
                              (const bf16_t *)A + r0 * lda, CUDA_R_16BF, (int)lda, &zero, c->gemm_ws, CUDA_R_32F, m,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (st != CUBLAS_STATUS_SUCCESS) return blas_err(e, "cublasGemmEx (bf16, compute 32F)", st);
            const int64_t cnt = nr * N;
            auto kb = &k_bias_round_bf16;
            FS_LAUNCH(kb, gpu_blocks(cnt, 256), 256, 0, c->stream, (bf16_t *)C + r0 * ldc, ldc, (const float *)c->gemm_ws,
                      (const bf16_t *)bias, nr, N);
            if (fs_gpu_after(be, "gemm (bias + bf16 rounding)", e)) return e->code;
        }
        return FS_OK;
    } else {
        return fs_errf(e, FS_E_INTERNAL, "%s backend: gemm: unknown dtype %d", FS_GPU_VENDOR, (int)dt);
    }
    if (fs_gpu_after(be, "gemm (cuBLAS)", e)) return e->code;
    if (!bias) return FS_OK;
    const int64_t cnt = M * N;
    if (dt == FS_F64) {
        auto kb = &k_bias_rows<double>;
        FS_LAUNCH(kb, gpu_blocks(cnt, 256), 256, 0, c->stream, (double *)C, ldc, (const double *)bias, M, N);
    } else {
        auto kb = &k_bias_rows<float>;
        FS_LAUNCH(kb, gpu_blocks(cnt, 256), 256, 0, c->stream, (float *)C, ldc, (const float *)bias, M, N);
    }
    return fs_gpu_after(be, "gemm (bias)", e);
}
#endif

/* ------------------------------------------------------------------ entry points */

int fs_gpu_gemm_init(fs_gpu_ctx *c, fs_err *e)
{
#if FS_GPU_HAVE_BLAS
    if (c->gemm_tiled) return FS_OK;
    cublasHandle_t h = NULL;
    cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS)
        return fs_errf(e, FS_E_INPUT, "cublasCreate failed: %s (FLUX_SIM_GPU_GEMM=tiled runs without cuBLAS)",
                       cublasGetStatusName(st));
    if ((st = cublasSetStream(h, c->stream)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED)) != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        return fs_errf(e, FS_E_INTERNAL, "cuBLAS setup failed: %s", cublasGetStatusName(st));
    }
    c->blas = h;
#else
    (void)c;
    (void)e;
#endif
    return FS_OK;
}

void fs_gpu_gemm_fini(fs_gpu_ctx *c)
{
#if FS_GPU_HAVE_BLAS
    if (c->blas) cublasDestroy((cublasHandle_t)c->blas);
#endif
    c->blas = NULL;
    /* the scratch is a block of the backend's allocator, released with the cache */
    c->gemm_ws = NULL;
    c->gemm_ws_bytes = 0;
}

int fs_gpu_gemm(fs_backend *be, fs_dtype dt, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W,
                int64_t ldw, const void *bias, void *C, int64_t ldc, fs_err *e)
{
    if (M < 0 || N < 0 || K < 0) return fs_errf(e, FS_E_INTERNAL, "%s backend: gemm: negative size", FS_GPU_VENDOR);
    if (M == 0 || N == 0) return FS_OK;
    if (ldc < N || lda < K || ldw < K)
        return fs_errf(e, FS_E_INTERNAL, "%s backend: gemm: leading dimension smaller than the row (lda %lld K %lld, ldw %lld, ldc %lld N %lld)",
                       FS_GPU_VENDOR, (long long)lda, (long long)K, (long long)ldw, (long long)ldc, (long long)N);
#if FS_GPU_HAVE_BLAS
    /* K == 0 (C = bias, or 0) goes to the tiled kernel: BLAS wants lda >= 1 */
    if (!gpu_ctx(be)->gemm_tiled && K > 0) return gemm_blas(be, dt, M, N, K, A, lda, W, ldw, bias, C, ldc, e);
#endif
    return gemm_tiled(be, dt, M, N, K, A, lda, W, ldw, bias, C, ldc, e);
}
