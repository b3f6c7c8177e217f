/* fs_backend.h — the memory and the kernels the FLUX forward is written against.
 *
 * A backend owns a memory space and the ops that work in it, as a table of function pointers
 * (ggml-backend's shape): the CPU backend (fs_backend_cpu.c, OpenBLAS), the strict CPU test
 * backend (cpu-strict: the same kernels, memory that host code cannot dereference), and the GPU
 * backends (sim/backend/gpu/, CUDA and HIP from one source). The model, the sequence-parallel code, the
 * sampler and the collectives (fs_comm) only ever touch activations through these ops; recorders
 * download what they read. docs/design.md ("Memory model") says who owns what.
 *
 * Conventions
 *  - Every op returns FS_OK or an error code with a one-line message in *e (a GPU launch can
 *    fail); ops never exit. Ops may run asynchronously on a GPU: results are visible to the host
 *    after download2d (which synchronises) or sync.
 *  - Tensors are contiguous row-major in the backend's memory; byte-addressed 2-D copies make
 *    strided slices. The caller (fs_layers.c) checks shapes.
 *  - dtype contract (the same on every backend; docs/bf16.md): float64 computes in float64;
 *    float32 in float32 (LayerNorm/RMSNorm statistics accumulate in double on the CPU); bfloat16
 *    is 16-bit storage, each op computes in float32 and rounds its result to bfloat16 once
 *    (round to nearest even), as PyTorch's CUDA kernels do. Per op below: what is rounded where.
 *  - LSE (log-sum-exp of attention) is float32 for float32 and bfloat16 runs, float64 for
 *    float64 runs, in the backend's declared convention: its native layout `lse_layout`, its log
 *    base `lse_base` and its offset semantics `lse_offset` (below). Nothing ever infers a layout
 *    from a shape (the ROCm bug of ../shared/seeds/001) nor assumes a base or an offset: the ring
 *    merge reads natural-log, uncentred [B, H, S], and the ring code (fs_seqpar.c) converts to it
 *    explicitly from the declaration.
 *
 * Adding a backend: fill every member (docs/design.md, "Adding a backend"); the registry
 * (fs_backends.h: fs_backend_open) knows it by name. Layers: fs_tensor.h (shapes, host memory)
 * below this interface; the implementations (fs_backend_cpu.c, fs_backend_strict.c, gpu/) on it;
 * the registry fs_backends.h above them. */
#ifndef FS_BACKEND_H
#define FS_BACKEND_H

#include "fs_tensor.h"

typedef enum fs_lse_layout {
    FS_LSE_BHS = 0, /* [B, H, S]: CUDA flash attention, and what the ring merge reads */
    FS_LSE_BSH = 1, /* [B, S, H]: ROCm flash / CK (pytorch#171568) */
} fs_lse_layout;
const char *fs_lse_layout_name(fs_lse_layout l); /* "bhs" / "bsh" */

/* The rest of the LSE convention (docs/parallel.md §3.4, "LSE conventions"). The real backends
 * (cpu, cpu-strict, cuda, hip) are FS_LSE_LN + FS_LSE_ABS, the zero values. The CPU backends can
 * report the others, as another vendor's kernel would, for tests only:
 * FLUX_SIM_LSE_CONVENTION=base2 | centred | base2,centred (read once, fs_backend_cpu()). */
typedef enum fs_lse_base {
    FS_LSE_LN = 0,   /* natural log: FA2/FA3, PyTorch SDPA, CK, and what the ring merge reads */
    FS_LSE_LOG2 = 1, /* base 2: lse / ln 2 (kernels that work in exp2; pytorch#181645, flashinfer#4485) */
} fs_lse_base;
typedef enum fs_lse_offset {
    FS_LSE_ABS = 0,    /* log Σ_j exp(scale·q_i·k_j): what the ring merge reads */
    FS_LSE_MEAN_K = 1, /* computed against mean-centred K (AITER Sage's K smoothing, ROCm/aiter#3334):
                          reported = true − δ_i, δ_i = scale·q_i·mean_j(k_j)ᵀ over this call's keys
                          (per head), so δ differs per ring shard; before any base conversion */
} fs_lse_offset;

typedef struct fs_backend fs_backend;

struct fs_backend {
    const char *name;
    void *ctx;                /* the backend's own state (device, stream, handles) */
    int host_addressable;     /* 1: its memory is ordinary host memory, so MPI and recorders may
                                 use pointers into it directly (CPU); 0: stage through host
                                 buffers (GPU, cpu-strict) */
    fs_lse_layout lse_layout; /* the layout attention() writes its LSE in */
    fs_lse_base lse_base;     /* ... its log base */
    fs_lse_offset lse_offset; /* ... and what it is measured against */

    /* ---- memory; sizes and pitches in bytes ---- */
    int (*alloc)(fs_backend *be, size_t bytes, void **ptr, fs_err *e); /* not zeroed: see memset */
    void (*free)(fs_backend *be, void *ptr);                           /* NULL is a no-op */
    int (*memset)(fs_backend *be, void *ptr, int byte, size_t bytes, fs_err *e);
    /* rows × width bytes between pitched 2-D blocks, like cudaMemcpy2D: host → backend,
     * backend → host (synchronous: the host bytes are valid on return), backend → backend */
    int (*upload2d)(fs_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t rows, fs_err *e);
    int (*download2d)(fs_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      size_t rows, fs_err *e);
    int (*copy2d)(fs_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                  fs_err *e);
    int (*sync)(fs_backend *be, fs_err *e); /* wait for every op issued so far */
    /* host memory the backend transfers from fastest (pinned on a GPU), for fs_comm's staging */
    int (*host_alloc)(fs_backend *be, size_t bytes, void **ptr, fs_err *e);
    void (*host_free)(fs_backend *be, void *ptr);

    /* ---- compute ---- */
    /* nn.Linear: C[M, N] = A[M, K] · W[N, K]ᵀ (+ bias[N] if bias != NULL), leading dimensions
     * in elements (lda allows a column slice of A). Operands in `dt`; bfloat16: float32
     * accumulation, bias added in float32, C rounded once (cuBLAS with a bias epilogue). */
    int (*gemm)(fs_backend *be, fs_dtype dt, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                const void *W, int64_t ldw, const void *bias, void *C, int64_t ldc, fs_err *e);
    /* y = x converted to y's dtype (same numel): float32 → bfloat16 rounds to nearest even. */
    int (*convert)(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e);
    /* y = x + z (same numel, same dtype). */
    int (*add)(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *z, fs_err *e);
    /* y = x · z element-wise (same numel, same dtype): SwiGLU's silu(gate) · up (FLUX.2). bf16:
     * the product of the two bf16 values rounded once, as torch's CPU and CUDA mul. */
    int (*mul)(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *z, fs_err *e);
    /* y[m, n] += b[n], b of length N = y's last dim. */
    int (*add_bias)(fs_backend *be, fs_tensor *y, const fs_tensor *b, fs_err *e);
    /* y = a·y + b·x, element-wise (same numel, same dtype). The scheduler's Euler step is
     * axpby(latents, 1, v, σ_next − σ). float32: a, b rounded to float32 first (0-dim float32
     * tensors). bfloat16 (torch's type promotion of a 0-dim float32 with a bf16 tensor): b
     * rounded to bf16, b·x rounded to bf16, then a·y + that in float32, rounded to bf16. */
    int (*axpby)(fs_backend *be, fs_tensor *y, double a, const fs_tensor *x, double b, fs_err *e);
    int (*silu)(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e);
    /* GELU, tanh approximation (every GELU in FLUX). */
    int (*gelu_tanh)(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e);
    /* LayerNorm over the last dim, no affine, biased variance. */
    int (*layernorm)(fs_backend *be, fs_tensor *y, const fs_tensor *x, double eps, fs_err *e);
    /* RMSNorm over the last dim (width Dh) with weight w[Dh] (QK norm, per head). bfloat16:
     * x·rsqrt(mean(x²)+eps)·w in float32, rounded once. */
    int (*rmsnorm)(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps, fs_err *e);
    /* y[b,s,:] = x[b,s,:]·(1 + scale[b,:]) + shift[b,:]; x is [B, S, D]. bfloat16: each of the
     * three torch ops rounds ((1 + scale), then the product, then the sum). */
    int (*modulate)(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *scale, const fs_tensor *shift,
                    fs_err *e);
    /* x[b,s,:] += gate[b,:]·y[b,s,:]; x and y are [B, S, D]. bfloat16: the product rounds, then
     * the sum. */
    int (*gated_add)(fs_backend *be, fs_tensor *x, const fs_tensor *gate, const fs_tensor *y, fs_err *e);
    /* Rotary embedding on adjacent pairs, in place: x [B, S, H, Dh], cos/sin [S, Dh] in the
     * tables' dtype (float32 for float32/bfloat16 runs, float64 for float64 runs); the rotation
     * is computed in the tables' dtype and cast back, as diffusers' apply_rotary_emb does. */
    int (*rope)(fs_backend *be, fs_tensor *x, const fs_tensor *cos, const fs_tensor *sin, fs_err *e);
    /* out[b,i,h,:] = softmax_j(scale · q[b,i,h,:]·k[b,j,h,:]) · v[b,j,h,:]. q [B,Sq,H,Dh],
     * k/v [B,Skv,H,Dh], out [B,Sq,H,Dh]. If lse is non-NULL it receives log-sum-exp of the scaled
     * scores in the backend's declared convention (be->lse_layout, be->lse_base, be->lse_offset:
     * on the real backends natural log, uncentred), what a ring merge needs. bfloat16: q, k, v upcast,
     * scores, softmax and P·V in float32, out rounded once. No S×S matrix need exist in memory. */
    int (*attention)(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *q, const fs_tensor *k,
                     const fs_tensor *v, double scale, fs_err *e);
    /* dst = src re-laid out: src [B,H,S] when src_layout is FS_LSE_BHS ([B,S,H] for FS_LSE_BSH),
     * dst in dst_layout; B, H, S are given, never inferred from the tensors' shapes. */
    int (*lse_convert)(fs_backend *be, fs_tensor *dst, fs_lse_layout dst_layout, const fs_tensor *src,
                       fs_lse_layout src_layout, int64_t B, int64_t H, int64_t S, fs_err *e);
    /* Ring-attention merge of a partial (out_i, lse_i) into the running (out, lse), exactly as
     * diffusers' TemplatedRingAttention: out ← out − σ(lse_i − lse)·(out − out_i),
     * lse ← lse − logσ(lse − lse_i). out/out_i [B,S,H,Dh]; lse/lse_i [B,H,S], indexed by
     * (b, h, s) explicitly. out and lse are the running float32 (float64) accumulators; out_i may
     * be bfloat16 (convert_to_fp32=True: upcast, merged in float32). */
    int (*ring_merge)(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *out_i, const fs_tensor *lse_i,
                      fs_err *e);
};

/* ---- tensors in a backend's memory (fs_tensor.h's tensor with `be` set) ----
 * These go through the backend's memory ops, so they live here, above fs_tensor.h (which knows
 * only shapes, host memory and views). */

/* A zero-filled tensor in the memory of `be` (alloc + explicit memset); be NULL is the host. */
int fs_tensor_alloc_on(fs_tensor *t, fs_backend *be, fs_dtype dt, int ndim, const int64_t *shape, fs_err *e);
/* The same without the memset: for an op's output that the op writes in full (a GEMM with
 * beta = 0, an element-wise op, a copy). Contents undefined until written. */
int fs_tensor_alloc_on_uninit(fs_tensor *t, fs_backend *be, fs_dtype dt, int ndim, const int64_t *shape, fs_err *e);
/* Frees owned data, host memory or through the backend that allocated it; clears views. Safe on
 * either kind of tensor, and on every tensor fs_tensor.h's allocators make. */
void fs_tensor_free(fs_tensor *t);
/* 1 when t->data may be read and written by host code: host memory, or a backend whose memory
 * is ordinary host memory (the CPU backend). */
int fs_tensor_is_host(const fs_tensor *t);
/* Whole-tensor transfers between a host tensor and a backend tensor of the same dtype and numel
 * (the backend's upload/download; a memcpy, or nothing, when both are host memory). */
int fs_tensor_upload(fs_tensor *dst, const fs_tensor *src_host, fs_err *e);
int fs_tensor_download(fs_tensor *dst_host, const fs_tensor *src, fs_err *e);
/* What a recorder reads: `src` itself (a view, no copy) when it is host-addressable, else a new
 * host tensor holding its downloaded bytes. fs_tensor_free(out) is right in both cases. */
int fs_tensor_host_view(const fs_tensor *src, fs_tensor *out, fs_err *e);

/* The CPU backend (OpenBLAS for GEMMs, OpenMP for attention and element-wise loops).
 * fs_backend_cpu_set_threads sets both thread counts; <= 0 leaves the defaults (OpenBLAS:
 * OPENBLAS_NUM_THREADS or all cores; OpenMP: OMP_NUM_THREADS or all cores). Several ranks
 * sharing a node should each use 1 (or cores/ranks). */
fs_backend *fs_backend_cpu(void);
void fs_backend_cpu_set_threads(int threads);
/* The strict CPU backend: the CPU kernels behind memory whose pointers are tagged so that any
 * dereference outside the backend's own ops faults (SIGSEGV), and which is not host-addressable,
 * so fs_comm stages every collective through host buffers. Ops given a host pointer fail with
 * FS_E_INTERNAL naming the op. A test tool (docs/design.md): proof that nothing reads or writes
 * backend memory behind the backend's back. */
fs_backend *fs_backend_cpu_strict(void);
/* For tests: 1 if p is a cpu-strict pointer (tagged). */
int fs_backend_strict_is_tagged(const void *p);

#endif
