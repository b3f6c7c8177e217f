/* fs_backend_cpu.c — the CPU backend: OpenBLAS for every matmul, plain C for the rest, memory
 * that is ordinary host memory (host_addressable: MPI and recorders use it in place; uploads and
 * downloads are memcpy, or nothing when source and destination coincide).
 * Each kernel is written once in fs_kernels_cpu.inc and compiled per dtype (cpu_<op>_f32 in
 * fs_kernels_cpu_f32.c, cpu_<op>_f64 in fs_kernels_cpu_f64.c; fs_kernels_cpu.h); this file has the
 * bfloat16 paths (cpu_<op>_bf16), the dtype dispatch (cpu_<op>, the table's ops) and the memory. */
#include <cblas.h>
#include <malloc.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_backend_cpu.h"
#include "fs_gemm.h"
#include "fs_kernels_cpu.h"

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
#define PAR_BYTES (4u << 20) /* memsets and copies from this size on use the OpenMP threads */
#define CHUNK_BYTES (1u << 20)
static int cpu_memset(fs_backend *be, void *p, int v, size_t n, fs_err *e)
{
    if (n < PAR_BYTES) {
        if (n) memset(p, v, n);
        return FS_OK;
    }
    const int64_t nc = (int64_t)((n + CHUNK_BYTES - 1) / CHUNK_BYTES);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nc; c++) {
        const size_t o = (size_t)c * CHUNK_BYTES;
        memset((char *)p + o, v, n - o < CHUNK_BYTES ? n - o : CHUNK_BYTES);
    }
    return FS_OK;
}
/* One 2-D copy for all three directions: host memory on both sides. Rows may overlap (memmove);
 * a big copy between disjoint ranges is split over the OpenMP threads. */
static int cpu_copy2d(fs_backend *be, void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t rows, fs_err *e)
{
    if (!w || !rows || dst == src) return FS_OK;
    const char *d0 = dst, *s0 = src, *d1 = d0 + dp * (rows - 1) + w, *s1 = s0 + sp * (rows - 1) + w;
    const int par = w * rows >= PAR_BYTES && (d1 <= s0 || s1 <= d0);
    if (dp == w && sp == w) {
        const size_t n = w * rows;
        if (!par) {
            memmove(dst, src, n);
            return FS_OK;
        }
        const int64_t nc = (int64_t)((n + CHUNK_BYTES - 1) / CHUNK_BYTES);
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < nc; c++) {
            const size_t o = (size_t)c * CHUNK_BYTES;
            memcpy((char *)dst + o, (const char *)src + o, n - o < CHUNK_BYTES ? n - o : CHUNK_BYTES);
        }
        return FS_OK;
    }
    if (par) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < (int64_t)rows; r++) memcpy((char *)dst + r * dp, (const char *)src + r * sp, w);
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

/* ---------------------------------------------------------------- bfloat16
 *
 * bf16 is storage: every op loads bf16, computes in float32 and rounds what it stores, once per
 * torch op — PyTorch's CUDA kernels' arithmetic ("opmath" float, round on store). Here each op
 * upcasts its bf16 operands into float scratch (exact), runs the float32 kernel above, and rounds
 * the result with c10's round-to-nearest-even; the ops that are several torch ops in diffusers
 * (modulate, gated_add, the scheduler's axpby) round after each of them. What can differ from a
 * GPU is only the order of float additions inside reductions (GEMM, softmax, norms): single
 * bf16 ulps (docs/bf16.md). */

#define PAR_BIG 65536 /* element loops worth threads */

/* n bf16 values as float into f (exact). */
static void up_into(float *f, const void *src, int64_t n)
{
    const uint16_t *h = src;
#pragma omp parallel for simd if (n > PAR_BIG) schedule(static)
    for (int64_t i = 0; i < n; i++) f[i] = fs_bf16_to_float(h[i]);
}

static float *up_buf(const void *src, fs_dtype dt, int64_t n)
{
    float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!f) return NULL;
    if (dt == FS_F32) {
        if (n) memcpy(f, src, sizeof(float) * (size_t)n);
        return f;
    }
    up_into(f, src, n);
    return f;
}
static void down_buf(uint16_t *dst, const float *f, int64_t n)
{
#pragma omp parallel for if (n > PAR_BIG) schedule(static)
    for (int64_t i = 0; i < n; i++) dst[i] = fs_bf16_from_float(f[i]);
}
/* A float32 tensor over `buf` with t's shape. */
static fs_tensor as_f32(const fs_tensor *t, float *buf)
{
    fs_tensor v = *t;
    v.dtype = FS_F32;
    v.data = buf;
    v.owns = 0;
    v.be = NULL;
    return v;
}
/* t's values as float32 (a new buffer, exact), or NULL when out of memory. */
static float *up(const fs_tensor *t) { return up_buf(t->data, t->dtype, fs_tensor_numel(t)); }

#define NOMEM(op) fs_errf(e, FS_E_NOMEM, "cpu backend: %s on bfloat16: out of memory for float32 scratch", op)

/* M rows of K values at row stride ld (a column slice of a bigger matrix) as dense float into f. */
static void up_rows_into(float *f, const void *src, int64_t M, int64_t K, int64_t ld)
{
    const uint16_t *h = src;
#pragma omp parallel for if (M * K > PAR_BIG) schedule(static)
    for (int64_t m = 0; m < M; m++) {
        float *fm = f + m * K;
        const uint16_t *hm = h + m * ld;
#pragma omp simd /* a shift per element: exact at any width (the bf16 path widens every weight) */
        for (int64_t k = 0; k < K; k++) fm[k] = fs_bf16_to_float(hm[k]);
    }
}

/* The bf16 gemm without native bf16 instructions: A and W widened to float32 (exact), sgemm,
 * + bias in float32, C rounded once. */
static int cpu_gemm_bf16_sgemm(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W,
                               int64_t ldw, const void *bias, void *C, int64_t ldc, fs_err *e)
{
    float *a = malloc(sizeof(float) * (size_t)(M * K > 0 ? M * K : 1)),
          *w = malloc(sizeof(float) * (size_t)(N * K > 0 ? N * K : 1)), *b = bias ? malloc(sizeof(float) * (size_t)N) : NULL,
          *c = malloc(sizeof(float) * (size_t)(M * N));
    int rc = FS_OK;
    if (!a || !w || (bias && !b) || !c) rc = NOMEM("gemm");
    else {
        up_rows_into(a, A, M, K, lda);
        up_rows_into(w, W, N, K, ldw);
        if (bias) up_into(b, bias, N);
        cpu_gemm_f32(M, N, K, a, K, w, K, b, c, N); /* float32 accumulation, + bias in float32 */
        uint16_t *o = C;
#pragma omp parallel for if (M * N > PAR_BIG) schedule(static)
        for (int64_t m = 0; m < M; m++) {
            uint16_t *om = o + m * ldc;
            const float *cm = c + m * N;
#pragma omp simd
            for (int64_t n = 0; n < N; n++) om[n] = fs_bf16_from_float(cm[n]); /* one rounding */
        }
    }
    free(a);
    free(w);
    free(b);
    free(c);
    return rc;
}

/* The bf16 gemm op: oneDNN's bf16 matmul where fs_gemm.h says (AMX; AVX512-BF16 for few rows),
 * else the widened float32 path. Both are float32 accumulation of exact products, + bias
 * in float32, one rounding; only the order of the float32 additions differs. K == 0 (C = bias)
 * stays on the sgemm path. */
static int cpu_gemm_bf16(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W, int64_t ldw,
                         const void *bias, void *C, int64_t ldc, fs_err *e)
{
    if (M == 0 || N == 0) return FS_OK;
    if (K > 0 && fs_gemm_bf16_native(M)) return fs_gemm_bf16_onednn(M, N, K, A, lda, W, ldw, bias, C, ldc, e);
    return cpu_gemm_bf16_sgemm(M, N, K, A, lda, W, ldw, bias, C, ldc, e);
}

/* An element-wise or normalisation op on bf16: upcast the inputs, the float32 kernel, round y. */
#define BF16_UNARY(op, f32, y, x, ...)                                                   \
    do {                                                                                 \
        float *fx = up(x), *fy = malloc(sizeof(float) * (size_t)fs_tensor_numel(y) + 1); \
        int rc_ = FS_OK;                                                                 \
        if (!fx || !fy) rc_ = NOMEM(op);                                                 \
        else {                                                                           \
            fs_tensor tx = as_f32(x, fx), ty = as_f32(y, fy);                            \
            f32(&ty, &tx, ##__VA_ARGS__);                                                \
            down_buf(y->data, fy, fs_tensor_numel(y));                                   \
        }                                                                                \
        free(fx);                                                                        \
        free(fy);                                                                        \
        return rc_;                                                                      \
    } while (0)

static int cpu_silu_bf16(fs_tensor *y, const fs_tensor *x, fs_err *e) { BF16_UNARY("silu", cpu_silu_f32, y, x); }
static int cpu_gelu_tanh_bf16(fs_tensor *y, const fs_tensor *x, fs_err *e)
{
    BF16_UNARY("gelu_tanh", cpu_gelu_tanh_f32, y, x);
}
static int cpu_layernorm_bf16(fs_tensor *y, const fs_tensor *x, double eps, fs_err *e)
{
    BF16_UNARY("layernorm", cpu_layernorm_f32, y, x, eps);
}

static int cpu_rmsnorm_bf16(fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps, fs_err *e)
{
    float *fw = up(w); /* the weight multiplied in float32, one rounding (the shim's RMSNorm) */
    if (!fw) return NOMEM("rmsnorm");
    fs_tensor tw = as_f32(w, fw);
    int rc;
    do {
        float *fx = up(x), *fy = malloc(sizeof(float) * (size_t)fs_tensor_numel(y) + 1);
        rc = FS_OK;
        if (!fx || !fy) rc = NOMEM("rmsnorm");
        else {
            fs_tensor tx = as_f32(x, fx), ty = as_f32(y, fy);
            cpu_rmsnorm_f32(&ty, &tx, &tw, eps);
            down_buf(y->data, fy, fs_tensor_numel(y));
        }
        free(fx);
        free(fy);
    } while (0);
    free(fw);
    return rc;
}

static int cpu_add_bf16(fs_tensor *y, const fs_tensor *x, const fs_tensor *z)
{
    uint16_t *o = y->data;
    const uint16_t *a = x->data, *b = z->data;
    const int64_t n = fs_tensor_numel(y);
#pragma omp parallel for if (n > PAR_BIG) schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = fs_bf16_from_float(fs_bf16_to_float(a[i]) + fs_bf16_to_float(b[i]));
    return FS_OK;
}

static int cpu_mul_bf16(fs_tensor *y, const fs_tensor *x, const fs_tensor *z)
{
    uint16_t *o = y->data;
    const uint16_t *a = x->data, *b = z->data;
    const int64_t n = fs_tensor_numel(y);
#pragma omp parallel for if (n > PAR_BIG) schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = fs_bf16_from_float(fs_bf16_to_float(a[i]) * fs_bf16_to_float(b[i]));
    return FS_OK;
}

static int cpu_add_bias_bf16(fs_tensor *y, const fs_tensor *bias)
{
    uint16_t *p = y->data;
    const uint16_t *b = bias->data;
    const int64_t N = y->shape[y->ndim - 1], M = N ? fs_tensor_numel(y) / N : 0;
#pragma omp parallel for if (M * N > PAR_BIG) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++)
            p[m * N + n] = fs_bf16_from_float(fs_bf16_to_float(p[m * N + n]) + fs_bf16_to_float(b[n]));
    return FS_OK;
}

/* The scheduler step on bf16 latents (torch: `sample.float() + dt * v` with dt a 0-dim float32
 * tensor, then `.to(bf16)`): dt is rounded to bf16 by type promotion, dt·v rounded to bf16, the
 * sum in float32, the result rounded to bf16. */
static int cpu_axpby_bf16(fs_tensor *y, double a, const fs_tensor *x, double b)
{
    uint16_t *o = y->data;
    const uint16_t *u = x->data;
    const float fa = (float)a, fb = fs_bf16_round((float)b);
    const int64_t n = fs_tensor_numel(y);
#pragma omp parallel for if (n > PAR_BIG) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float bx = fs_bf16_round(fb * fs_bf16_to_float(u[i]));
        o[i] = fs_bf16_from_float(fa * fs_bf16_to_float(o[i]) + bx);
    }
    return FS_OK;
}

/* x·(1 + scale) + shift: three torch ops, three roundings. */
static int cpu_modulate_bf16(fs_tensor *y, const fs_tensor *x, const fs_tensor *scale, const fs_tensor *shift)
{
    const int64_t B = x->shape[0], S = x->shape[1], D = x->shape[2];
    for (int64_t b = 0; b < B; b++) {
        const uint16_t *sc = (const uint16_t *)scale->data + b * D, *sh = (const uint16_t *)shift->data + b * D;
#pragma omp parallel for if (S * D > PAR_BIG) schedule(static)
        for (int64_t s = 0; s < S; s++) {
            const uint16_t *a = (const uint16_t *)x->data + (b * S + s) * D;
            uint16_t *o = (uint16_t *)y->data + (b * S + s) * D;
            for (int64_t d = 0; d < D; d++) {
                const float one = fs_bf16_round(1.0f + fs_bf16_to_float(sc[d]));
                const float p = fs_bf16_round(fs_bf16_to_float(a[d]) * one);
                o[d] = fs_bf16_from_float(p + fs_bf16_to_float(sh[d]));
            }
        }
    }
    return FS_OK;
}

/* x + gate·y: the product rounds, then the sum. */
static int cpu_gated_add_bf16(fs_tensor *x, const fs_tensor *gate, const fs_tensor *y)
{
    const int64_t B = x->shape[0], S = x->shape[1], D = x->shape[2];
    for (int64_t b = 0; b < B; b++) {
        const uint16_t *g = (const uint16_t *)gate->data + b * D;
#pragma omp parallel for if (S * D > PAR_BIG) schedule(static)
        for (int64_t s = 0; s < S; s++) {
            uint16_t *o = (uint16_t *)x->data + (b * S + s) * D;
            const uint16_t *a = (const uint16_t *)y->data + (b * S + s) * D;
            for (int64_t d = 0; d < D; d++) {
                const float p = fs_bf16_round(fs_bf16_to_float(g[d]) * fs_bf16_to_float(a[d]));
                o[d] = fs_bf16_from_float(fs_bf16_to_float(o[d]) + p);
            }
        }
    }
    return FS_OK;
}

/* (x.float()·cos + rotate(x).float()·sin).to(bf16) with float32 tables */
static int cpu_rope_bf16(fs_tensor *x, const fs_tensor *cos, const fs_tensor *sin, fs_err *e)
{
    if (cos->dtype != FS_F32) return fs_errf(e, FS_E_INTERNAL, "rope on bfloat16 needs float32 tables");
    float *fx = up(x);
    if (!fx) return NOMEM("rope");
    fs_tensor tx = as_f32(x, fx);
    cpu_rope_f32(&tx, cos, sin);
    down_buf(x->data, fx, fs_tensor_numel(x));
    free(fx);
    return FS_OK;
}

/* q, k, v upcast; scores, softmax and P·V in float32; the output rounded once; LSE float32. */
static int cpu_attention_bf16(fs_tensor *out, fs_tensor *lse, fs_lse_layout layout, const fs_tensor *q,
                              const fs_tensor *k, const fs_tensor *v, double scale, fs_err *e)
{
    if (lse && lse->dtype != FS_F32) return fs_errf(e, FS_E_INTERNAL, "attention on bfloat16 writes a float32 LSE");
    float *fq = up(q), *fk = up(k), *fv = up(v), *fo = malloc(sizeof(float) * (size_t)fs_tensor_numel(out) + 1);
    int rc = FS_OK;
    if (!fq || !fk || !fv || !fo) rc = NOMEM("attention");
    else {
        fs_tensor tq = as_f32(q, fq), tk = as_f32(k, fk), tv = as_f32(v, fv), to = as_f32(out, fo);
        if (!(rc = cpu_attention_f32(&to, lse, layout, &tq, &tk, &tv, scale, e)))
            down_buf(out->data, fo, fs_tensor_numel(out));
    }
    free(fq);
    free(fk);
    free(fv);
    free(fo);
    return rc;
}

/* ---------------------------------------------------------------- dispatch */

/* The instance for the dtype of the first tensor argument; a dtype no kernel serves is an error
 * naming the op, never a silent wrong answer. */
#define DISPATCH(dt, op, f32, f64, ...)                                                                   \
    do {                                                                                                  \
        switch (dt) {                                                                                     \
        case FS_F32: f32(__VA_ARGS__); return FS_OK;                                                      \
        case FS_F64: f64(__VA_ARGS__); return FS_OK;                                                      \
        default: return fs_errf(e, FS_E_INPUT, "cpu backend: %s on %s is not supported", op, fs_dtype_name(dt)); \
        }                                                                                                 \
    } while (0)

/* FS_GEMM_SPLITK_ROWS=M0, a test tool: float32 and bfloat16 GEMMs of at least M0 rows accumulate K
 * in two halves, summed in float32 (then + bias, one rounding) — another kernel for another M, as
 * cuBLAS picks a split-K algorithm from the full shape (NVIDIA/TransformerEngine#2986; the physics
 * of xDiT#510, docs/bugs.md B16). Batching true CFG's two calls doubles M, so with M0 between the
 * two a batched run and a batch-1 run take different kernels. Unset: never. float64 never (the
 * matched truth a bf16 run is judged against is computed in the same process). */
static int splitk_rows(int64_t *m0, fs_err *e)
{
    static int64_t v = -1;
    if (v < 0) {
        const char *s = getenv("FS_GEMM_SPLITK_ROWS");
        char *end = NULL;
        long long x = s && *s ? strtoll(s, &end, 10) : 0;
        if (s && *s && (*end || x < 1))
            return fs_errf(e, FS_E_INPUT, "FS_GEMM_SPLITK_ROWS: '%s' is not a row count >= 1", s);
        v = s && *s ? x : 0;
    }
    *m0 = v;
    return FS_OK;
}

static int cpu_gemm_splitk(fs_dtype dt, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W,
                           int64_t ldw, const void *bias, void *C, int64_t ldc, fs_err *e)
{
    const int bf = dt == FS_BF16;
    const int64_t K1 = K / 2;
    float *a = bf ? malloc(sizeof(float) * (size_t)(M * K)) : (float *)A,
          *w = bf ? malloc(sizeof(float) * (size_t)(N * K)) : (float *)W, *b = bias ? up_buf(bias, dt, N) : NULL,
          *c1 = malloc(sizeof(float) * (size_t)(M * N)), *c2 = malloc(sizeof(float) * (size_t)(M * N));
    const int64_t la = bf ? K : lda, lw = bf ? K : ldw;
    int rc = FS_OK;
    if (!a || !w || (bias && !b) || !c1 || !c2) rc = NOMEM("gemm");
    else {
        if (bf) {
            up_rows_into(a, A, M, K, lda);
            up_rows_into(w, W, N, K, ldw);
        }
        cpu_gemm_f32(M, N, K1, a, la, w, lw, NULL, c1, N);
        cpu_gemm_f32(M, N, K - K1, a + K1, la, w + K1, lw, NULL, c2, N);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                const float x = (c1[m * N + n] + c2[m * N + n]) + (b ? b[n] : 0.0f);
                if (bf) ((uint16_t *)C)[m * ldc + n] = fs_bf16_from_float(x);
                else ((float *)C)[m * ldc + n] = x;
            }
    }
    if (bf) {
        free(a);
        free(w);
    }
    free(b);
    free(c1);
    free(c2);
    return rc;
}

static int cpu_gemm(fs_backend *be, fs_dtype dt, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                    const void *W, int64_t ldw, const void *bias, void *C, int64_t ldc, fs_err *e)
{
    int64_t m0 = 0;
    if ((dt == FS_BF16 || dt == FS_F32) && M > 0 && N > 0 && K >= 2) {
        int rc = splitk_rows(&m0, e);
        if (rc) return rc;
        if (m0 && M >= m0) return cpu_gemm_splitk(dt, M, N, K, A, lda, W, ldw, bias, C, ldc, e);
    }
    if (dt == FS_BF16) return cpu_gemm_bf16(M, N, K, A, lda, W, ldw, bias, C, ldc, e);
    if (dt == FS_F32 && bias) {
        cpu_gemm_bias_first_f32(M, N, K, A, lda, W, ldw, bias, C, ldc);
        return FS_OK;
    }
    DISPATCH(dt, "gemm", cpu_gemm_f32, cpu_gemm_f64, M, N, K, A, lda, W, ldw, bias, C, ldc);
}
static int cpu_convert(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e)
{
    const int64_t n = fs_tensor_numel(x);
    if (n != fs_tensor_numel(y)) return fs_errf(e, FS_E_INTERNAL, "convert: %lld elements into %lld", (long long)n,
                                                (long long)fs_tensor_numel(y));
    if (y->dtype == FS_BF16 && x->dtype == FS_F32) {
        down_buf(y->data, x->data, n);
        return FS_OK;
    }
    if (y->dtype == FS_F32 && x->dtype == FS_BF16) {
        float *o = y->data;
        const uint16_t *h = x->data;
#pragma omp parallel for if (n > PAR_BIG) schedule(static)
        for (int64_t i = 0; i < n; i++) o[i] = fs_bf16_to_float(h[i]);
        return FS_OK;
    }
    return fs_tensor_copy(y, x, e);
}
static int cpu_add(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *z, fs_err *e)
{
    if (y->dtype == FS_BF16) return cpu_add_bf16(y, x, z);
    DISPATCH(y->dtype, "add", cpu_add_f32, cpu_add_f64, y, x, z);
}
static int cpu_mul(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *z, fs_err *e)
{
    if (y->dtype == FS_BF16) return cpu_mul_bf16(y, x, z);
    DISPATCH(y->dtype, "mul", cpu_mul_f32, cpu_mul_f64, y, x, z);
}
static int cpu_add_bias(fs_backend *be, fs_tensor *y, const fs_tensor *b, fs_err *e)
{
    if (y->dtype == FS_BF16) return cpu_add_bias_bf16(y, b);
    DISPATCH(y->dtype, "add_bias", cpu_add_bias_f32, cpu_add_bias_f64, y, b);
}
static int cpu_axpby(fs_backend *be, fs_tensor *y, double a, const fs_tensor *x, double b, fs_err *e)
{
    if (y->dtype == FS_BF16) return cpu_axpby_bf16(y, a, x, b);
    DISPATCH(y->dtype, "axpby", cpu_axpby_f32, cpu_axpby_f64, y, a, x, b);
}
static int cpu_silu(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e)
{
    if (y->dtype == FS_BF16) return cpu_silu_bf16(y, x, e);
    DISPATCH(y->dtype, "silu", cpu_silu_f32, cpu_silu_f64, y, x);
}
static int cpu_gelu_tanh(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e)
{
    if (y->dtype == FS_BF16) return cpu_gelu_tanh_bf16(y, x, e);
    DISPATCH(y->dtype, "gelu_tanh", cpu_gelu_tanh_f32, cpu_gelu_tanh_f64, y, x);
}
static int cpu_layernorm(fs_backend *be, fs_tensor *y, const fs_tensor *x, double eps, fs_err *e)
{
    if (y->dtype == FS_BF16) return cpu_layernorm_bf16(y, x, eps, e);
    DISPATCH(y->dtype, "layernorm", cpu_layernorm_f32, cpu_layernorm_f64, y, x, eps);
}
static int cpu_rmsnorm(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps, fs_err *e)
{
    if (y->dtype == FS_BF16) return cpu_rmsnorm_bf16(y, x, w, eps, e);
    DISPATCH(y->dtype, "rmsnorm", cpu_rmsnorm_f32, cpu_rmsnorm_f64, y, x, w, eps);
}
static int cpu_modulate(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *scale, const fs_tensor *shift,
                        fs_err *e)
{
    if (y->dtype == FS_BF16) return cpu_modulate_bf16(y, x, scale, shift);
    DISPATCH(y->dtype, "modulate", cpu_modulate_f32, cpu_modulate_f64, y, x, scale, shift);
}
static int cpu_gated_add(fs_backend *be, fs_tensor *x, const fs_tensor *gate, const fs_tensor *y, fs_err *e)
{
    if (x->dtype == FS_BF16) return cpu_gated_add_bf16(x, gate, y);
    DISPATCH(x->dtype, "gated_add", cpu_gated_add_f32, cpu_gated_add_f64, x, gate, y);
}
static int cpu_rope(fs_backend *be, fs_tensor *x, const fs_tensor *cos, const fs_tensor *sin, fs_err *e)
{
    if (x->dtype == FS_BF16) return cpu_rope_bf16(x, cos, sin, e);
    DISPATCH(x->dtype, "rope", cpu_rope_f32, cpu_rope_f64, x, cos, sin);
}
/* ---- the LSE convention this backend reports (fs_backend.h) ----
 * Natural log, uncentred by default. FLUX_SIM_LSE_CONVENTION (tests only) makes the CPU backends
 * report what another vendor's kernel would: `base2` (lse / ln 2), `centred` (against mean-centred
 * K, as AITER Sage: lse − scale·q_i·mean(K)ᵀ), or both ("base2,centred"), and declare it, so the
 * ring code's explicit conversion (fs_seqpar.c) is exercised. A value it cannot read makes every
 * attention fail with one line (ops never exit). */
static char lse_env_err[160];

static void lse_convention_from_env(fs_backend *be)
{
    const char *v = getenv("FLUX_SIM_LSE_CONVENTION");
    if (!v || !*v) return;
    char buf[64];
    if (strlen(v) >= sizeof buf) {
        snprintf(lse_env_err, sizeof lse_env_err, "FLUX_SIM_LSE_CONVENTION: too long (want base2, centred or base2,centred)");
        return;
    }
    strcpy(buf, v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "base2")) be->lse_base = FS_LSE_LOG2;
        else if (!strcmp(t, "e")) be->lse_base = FS_LSE_LN;
        else if (!strcmp(t, "centred")) be->lse_offset = FS_LSE_MEAN_K;
        else {
            snprintf(lse_env_err, sizeof lse_env_err,
                     "FLUX_SIM_LSE_CONVENTION: '%.40s' is not e, base2 or centred (comma-separated)", t);
            return;
        }
    }
}

static double elem(const fs_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case FS_F32: return ((const float *)t->data)[i];
    case FS_F64: return ((const double *)t->data)[i];
    default: return fs_bf16_to_float(((const uint16_t *)t->data)[i]);
    }
}

/* The natural-log, uncentred LSE the kernel wrote (layout `layout`) re-expressed in the declared
 * convention: lse ← (lse − δ_i)·log2(e) as declared; δ_i = scale·q_i·mean_j(k_j)ᵀ per (b, h), in
 * double. No keys: nothing to centre on (the LSE is −inf). */
static int report_convention(const fs_backend *be, fs_tensor *lse, const fs_tensor *q, const fs_tensor *k, double scale,
                             fs_err *e)
{
    const int64_t B = q->shape[0], Sq = q->shape[1], H = q->shape[2], Dh = q->shape[3], Skv = k->shape[1];
    double *km = be->lse_offset == FS_LSE_MEAN_K ? calloc((size_t)(B * H * Dh) + 1, sizeof(double)) : NULL;
    if (be->lse_offset == FS_LSE_MEAN_K && !km) return fs_errf(e, FS_E_NOMEM, "cpu backend: out of memory for mean(K)");
    if (km && Skv > 0)
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < Skv; j++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t d = 0; d < Dh; d++) km[(b * H + h) * Dh + d] += elem(k, ((b * Skv + j) * H + h) * Dh + d) / (double)Skv;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                const int64_t at = be->lse_layout == FS_LSE_BHS ? (b * H + h) * Sq + i : (b * Sq + i) * H + h;
                double x = lse->dtype == FS_F64 ? ((double *)lse->data)[at] : ((float *)lse->data)[at];
                if (km && Skv > 0) {
                    double dot = 0;
                    for (int64_t d = 0; d < Dh; d++) dot += elem(q, ((b * Sq + i) * H + h) * Dh + d) * km[(b * H + h) * Dh + d];
                    x -= scale * dot;
                }
                if (be->lse_base == FS_LSE_LOG2) x *= M_LOG2E;
                if (lse->dtype == FS_F64) ((double *)lse->data)[at] = x;
                else ((float *)lse->data)[at] = (float)x;
            }
    free(km);
    return FS_OK;
}

static int cpu_attention(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *q, const fs_tensor *k,
                         const fs_tensor *v, double scale, fs_err *e)
{
    if (*lse_env_err) return fs_errf(e, FS_E_INPUT, "%s", lse_env_err);
    int rc;
    switch (q->dtype) {
    case FS_F32: rc = cpu_attention_f32(out, lse, be->lse_layout, q, k, v, scale, e); break;
    case FS_F64: rc = cpu_attention_f64(out, lse, be->lse_layout, q, k, v, scale, e); break;
    case FS_BF16: rc = cpu_attention_bf16(out, lse, be->lse_layout, q, k, v, scale, e); break;
    default: return fs_errf(e, FS_E_INPUT, "cpu backend: attention on %s is not supported", fs_dtype_name(q->dtype));
    }
    if (!rc && lse && (be->lse_base != FS_LSE_LN || be->lse_offset != FS_LSE_ABS)) rc = report_convention(be, lse, q, k, scale, e);
    return rc;
}
static int cpu_lse_convert(fs_backend *be, fs_tensor *dst, fs_lse_layout dl, const fs_tensor *src, fs_lse_layout sl,
                           int64_t B, int64_t H, int64_t S, fs_err *e)
{
    if (fs_tensor_numel(dst) < B * H * S || fs_tensor_numel(src) < B * H * S)
        return fs_errf(e, FS_E_INTERNAL, "lse_convert: tensors smaller than B·H·S = %lld", (long long)(B * H * S));
    DISPATCH(dst->dtype, "lse_convert", cpu_lse_convert_f32, cpu_lse_convert_f64, dst, dl, src, sl, B, H, S);
}
static int cpu_ring_merge(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *out_i, const fs_tensor *lse_i,
                          fs_err *e)
{
    if (out_i->dtype == FS_BF16 && out->dtype == FS_F32) { /* convert_to_fp32: the partial upcast, merged in float32 */
        float *fi = up(out_i);
        if (!fi) return NOMEM("ring_merge");
        fs_tensor ti = as_f32(out_i, fi);
        cpu_ring_merge_f32(out, lse, &ti, lse_i);
        free(fi);
        return FS_OK;
    }
    if (out_i->dtype != out->dtype)
        return fs_errf(e, FS_E_INTERNAL, "ring_merge: a %s partial into a %s accumulator", fs_dtype_name(out_i->dtype),
                       fs_dtype_name(out->dtype));
    DISPATCH(out->dtype, "ring_merge", cpu_ring_merge_f32, cpu_ring_merge_f64, out, lse, out_i, lse_i);
}

#define CPU_OPS                                                                                              \
    .alloc = cpu_alloc, .free = cpu_free, .memset = cpu_memset, .upload2d = cpu_copy2d, .download2d = cpu_copy2d, \
    .copy2d = cpu_copy2d, .sync = cpu_sync, .host_alloc = cpu_host_alloc, .host_free = cpu_host_free,          \
    .gemm = cpu_gemm, .convert = cpu_convert, .add = cpu_add, .mul = cpu_mul, .add_bias = cpu_add_bias, .axpby = cpu_axpby,    \
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
        lse_convention_from_env(&cpu); /* tests only: another vendor's LSE convention */
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
