/* fs_backend.h — the kernels the FLUX forward is written against.
 *
 * Model code (fs_model.c) only calls these; it never touches BLAS or loops over elements. A
 * backend is a table of function pointers, like ggml-backend: the CPU one (fs_backend_cpu.c,
 * OpenBLAS) now, a GPU one (HIP, buildable with nvcc) later, without touching the model.
 *
 * Conventions: tensors are contiguous row-major in the backend's memory; every op takes the
 * dtype from its tensors (float32 or float64 — one templated source per backend, no hand-copied
 * kernel per type); shapes are checked by the caller (fs_model.c), not here. The "lse" of
 * attention has an explicit layout, FS_LSE_BHS = [B, H, Sq], because the ring merge depends on
 * it and a layout inferred from sizes is exactly the ROCm bug in ../shared/seeds/001. */
#ifndef FS_BACKEND_H
#define FS_BACKEND_H

#include "fs_tensor.h"

typedef enum fs_lse_layout { FS_LSE_BHS = 0 } fs_lse_layout;

typedef struct fs_backend fs_backend;

struct fs_backend {
    const char *name;
    /* C[M,N] = alpha * A[M,K] · op(B) + beta * C, op(B) = B[N,K]ᵀ when trans_b else B[K,N].
     * Leading dimensions allow column slices (TP shards of a weight's input columns). */
    void (*gemm)(fs_dtype dt, int trans_b, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                 int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);
    /* dst[r, 0:cols] = src[r, 0:cols] for r < rows, leading dimensions in elements (like
     * cudaMemcpy2D). Concatenations, splits and AdaLN chunking are all this one copy. */
    void (*copy2d)(fs_dtype dt, void *dst, int64_t ld_dst, const void *src, int64_t ld_src, int64_t rows,
                   int64_t cols);
    /* y[m, n] += b[n] for every row m. */
    void (*add_bias)(fs_tensor *y, const void *b, int64_t N);
    /* y = x + z (same numel). */
    void (*add)(fs_tensor *y, const fs_tensor *x, const fs_tensor *z);
    void (*silu)(fs_tensor *y, const fs_tensor *x);
    /* GELU, tanh approximation (every GELU in FLUX). */
    void (*gelu_tanh)(fs_tensor *y, const fs_tensor *x);
    /* LayerNorm over the last dim (width D), no affine, biased variance. */
    void (*layernorm)(fs_tensor *y, const fs_tensor *x, int64_t D, double eps);
    /* RMSNorm over the last dim (width Dh) with weight w[Dh] (QK norm, per head). */
    void (*rmsnorm)(fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps);
    /* y[b,s,:] = x[b,s,:] * (1 + scale[b,:]) + shift[b,:]; x is [B, S, D]. */
    void (*modulate)(fs_tensor *y, const fs_tensor *x, const fs_tensor *scale, const fs_tensor *shift);
    /* x[b,s,:] += gate[b,:] * y[b,s,:]; x and y are [B, S, D]. */
    void (*gated_add)(fs_tensor *x, const fs_tensor *gate, const fs_tensor *y);
    /* Rotary embedding on adjacent pairs, in place: x [B, S, H, Dh], cos/sin [S, Dh] (rows for
     * the S positions of x, in any dtype: the rotation is computed in the tables' dtype, as
     * diffusers does in fp32 for low-precision activations). */
    void (*rope)(fs_tensor *x, const fs_tensor *cos, const fs_tensor *sin);
    /* out[b,i,h,:] = softmax_j(scale · q[b,i,h,:]·k[b,j,h,:]) · v[b,j,h,:]. q [B,Sq,H,Dh],
     * k/v [B,Skv,H,Dh], out [B,Sq,H,Dh]. If lse is non-NULL it receives log-sum-exp of the scaled
     * scores in `layout` (natural log), what a ring merge needs. */
    int (*attention)(fs_tensor *out, fs_tensor *lse, fs_lse_layout layout, const fs_tensor *q, const fs_tensor *k,
                     const fs_tensor *v, double scale, fs_err *e);
    /* Ring-attention merge of a partial (out_i, lse_i) into the running (out, lse), exactly as
     * diffusers' TemplatedRingAttention: out ← out − σ(lse_i − lse)·(out − out_i),
     * lse ← lse − logσ(lse − lse_i). out/out_i [B,S,H,Dh]; lse/lse_i in `layout` ([B,H,S]):
     * the code indexes lse by (b, h, s) explicitly, it never infers the layout from a size. */
    void (*ring_merge)(fs_tensor *out, fs_tensor *lse, const fs_tensor *out_i, const fs_tensor *lse_i,
                       fs_lse_layout layout);
};

/* The CPU backend (OpenBLAS for GEMMs, OpenMP for attention and element-wise loops).
 * fs_backend_cpu_set_threads sets both thread counts; <= 0 leaves the defaults (OpenBLAS:
 * OPENBLAS_NUM_THREADS or all cores; OpenMP: OMP_NUM_THREADS or all cores). Several ranks
 * sharing a node should each use 1 (or cores/ranks). */
fs_backend *fs_backend_cpu(void);
void fs_backend_cpu_set_threads(int threads);

#endif
