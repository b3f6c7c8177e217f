/* gpu_check — per-op conformance of a backend (the GPU one) against the CPU backend.
 *
 *   gpu_check [--backend NAME] [--quick] [--seed N]
 *
 * Every member of the backend table is exercised: the memory ops byte for byte, convert against
 * the host's bfloat16 rule (fs_bf16_from_float) bit for bit, and every compute op against
 * fs_backend_cpu() on the same inputs, in float64, float32 and bfloat16, over shapes with odd
 * sizes (K not a multiple of 8 or of the tile, S not a multiple of the key tile, Dh 16/32/128/
 * 200, B = 2). Attention's LSE is checked in both layouts ([B,H,S] and [B,S,H]); lse_convert
 * and ring_merge (bfloat16 out_i included). On CUDA the GEMM runs twice: cuBLAS and the tiled
 * kernel (FLUX_SIM_GPU_GEMM=tiled), so both paths are checked on one GPU.
 *
 * Bounds are per element, |gpu − cpu| ≤ (c·u + R·b)·mag + tiny, with mag a magnitude of the
 * quantities the op rounds (for a GEMM Σ|a||w| + |bias|), u the unit roundoff of the compute
 * type (2^-53, 2^-24), c the op's count of roundings that may differ between two correct
 * implementations (summation order, libm vs the GPU's exp/tanh/log), R the op's bfloat16
 * roundings and b what each may differ by: one bf16 ulp (2^-7·|x|) against the CPU's bfloat16
 * kernels, half an ulp (2^-8·|x|) against the CPU's float32 kernels on the same bf16-rounded
 * inputs — the fallback while the CPU backend has no bfloat16 kernels (those cases are counted as
 * "bf16 vs cpu bf16: SKIPPED" and checked against float32 instead). docs/gpu.md derives each c.
 *
 * Without a GPU (fs_backend_open fails with FS_E_INPUT) it prints "SKIPPED: no GPU (...)" and
 * exits 0. Exit 1 when any check fails. --backend cpu-strict runs the whole suite on the CPU (a
 * self-test of this program). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fs_backend.h"
#include "fs_backends.h"
#ifdef FS_WITH_GPU
#include "gpu/fs_backend_gpu.h"
#endif

#define U64 (1.0 / 9007199254740992.0) /* 2^-53 */
#define U32 (1.0 / 16777216.0)         /* 2^-24 */
#define BF_ULP (1.0 / 128.0)           /* 2^-7: one bfloat16 ulp, relative, at most */
#define BF_HALF (1.0 / 256.0)          /* 2^-8: a bfloat16 rounding error, relative, at most */

static fs_backend *G;       /* under test */
static fs_backend *R;       /* reference: the CPU backend */
static int n_pass, n_fail, n_skip, quick;
static int cpu_bf16 = -1;   /* -1 unknown, 0: the CPU backend refuses bfloat16, 1: serves it */
static const char *gemm_path = "";

static void fail_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail_line(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    n_fail++;
}

/* ------------------------------------------------------------------ values */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) /* uniform in [-1, 1) */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* the value as stored in dt (what both backends see) */
static double quant(fs_dtype dt, double v)
{
    if (dt == FS_F32) return (double)(float)v;
    if (dt == FS_BF16) return (double)fs_bf16_to_float(fs_bf16_from_float((float)v));
    return v;
}

static double *vec(int64_t n, double scale, fs_dtype dt)
{
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = quant(dt, scale * urand());
    return v;
}

static size_t esize(fs_dtype dt) { return dt == FS_F64 ? 8 : dt == FS_BF16 ? 2 : 4; }
static const char *dtn(fs_dtype dt) { return dt == FS_F64 ? "f64" : dt == FS_BF16 ? "bf16" : "f32"; }

static void pack(fs_dtype dt, const double *v, void *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (dt == FS_F64) ((double *)out)[i] = v[i];
        else if (dt == FS_F32) ((float *)out)[i] = (float)v[i];
        else ((uint16_t *)out)[i] = fs_bf16_from_float((float)v[i]);
    }
}
static void unpack(fs_dtype dt, const void *in, double *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (dt == FS_F64) v[i] = ((const double *)in)[i];
        else if (dt == FS_F32) v[i] = ((const float *)in)[i];
        else v[i] = fs_bf16_to_float(((const uint16_t *)in)[i]);
    }
}

/* ------------------------------------------------------------------ tensors in a backend */

static int64_t numel(const fs_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* A tensor of `be` holding vals (zeros when vals is NULL). Exits on failure: the harness cannot
 * go on without memory. */
static fs_tensor mk(fs_backend *be, fs_dtype dt, int ndim, const int64_t *shape, const double *vals)
{
    fs_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
    t.be = be;
    const int64_t n = numel(&t);
    const size_t bytes = (size_t)n * esize(dt);
    fs_err e = {0};
    if (be->alloc(be, bytes ? bytes : 1, &t.data, &e)) {
        printf("FATAL alloc: %s\n", e.msg);
        exit(1);
    }
    void *h = calloc(1, bytes ? bytes : 1);
    if (vals) pack(dt, vals, h, n);
    if (bytes && be->upload2d(be, t.data, bytes, h, bytes, bytes, 1, &e)) {
        printf("FATAL upload: %s\n", e.msg);
        exit(1);
    }
    free(h);
    return t;
}
static void rm(fs_tensor *t)
{
    if (t->data) t->be->free(t->be, t->data);
    t->data = NULL;
}
/* the tensor's values as doubles (malloc'd), or NULL with the error printed */
static double *rd(const fs_tensor *t)
{
    const int64_t n = numel(t);
    const size_t bytes = (size_t)n * esize(t->dtype);
    void *h = malloc(bytes ? bytes : 1);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    fs_err e = {0};
    if (bytes && t->be->download2d(t->be, h, bytes, t->data, bytes, bytes, 1, &e)) {
        printf("     download: %s\n", e.msg);
        free(h);
        free(v);
        return NULL;
    }
    unpack(t->dtype, h, v, n);
    free(h);
    return v;
}

/* ------------------------------------------------------------------ comparison */

typedef struct bound {
    double c; /* multiples of the compute type's unit roundoff */
    int R;    /* bfloat16 roundings that may differ by an ulp from the CPU's bf16 kernels */
    int Rfb;  /* bfloat16 roundings of the op, against the CPU's float32 kernels (the fallback) */
} bound;

typedef struct cmp_res {
    double worst_ratio, max_abs;
    int64_t worst_i, identical, n, nan_bad;
} cmp_res;

/* |g − r| ≤ (c·u + R·b)·mag_i + 1e-300 per element; NaN must match NaN. */
static cmp_res compare(const double *g, const double *r, const double *mag, int64_t n, double u, bound bd, double b)
{
    cmp_res c = {0, 0, -1, 0, n, 0};
    for (int64_t i = 0; i < n; i++) {
        if (isnan(g[i]) || isnan(r[i])) {
            if (isnan(g[i]) && isnan(r[i])) c.identical++;
            else if (c.nan_bad++ == 0) c.worst_i = i;
            continue;
        }
        if (g[i] == r[i]) {
            c.identical++;
            continue;
        }
        const double d = fabs(g[i] - r[i]);
        const double lim = (bd.c * u + bd.R * b) * mag[i] + 1e-300;
        const double q = isinf(g[i]) || isinf(r[i]) ? INFINITY : d / lim;
        if (d > c.max_abs) c.max_abs = d;
        if (q > c.worst_ratio) {
            c.worst_ratio = q;
            if (!c.nan_bad) c.worst_i = i;
        }
    }
    return c;
}

/* One verdict line. ref: "cpu" or "cpu f32" (the bfloat16 fallback). */
static void verdict(const char *what, const char *ref, const double *g, const double *r, const double *mag, int64_t n,
                    double u, bound bd, double b)
{
    if (!g || !r) {
        fail_line("%s: could not read results", what);
        return;
    }
    cmp_res c = compare(g, r, mag, n, u, bd, b);
    if (c.nan_bad || c.worst_ratio > 1) {
        if (c.nan_bad)
            fail_line("%s vs %s: %lld NaN mismatches (first at %lld: gpu %g, %s %g)", what, ref, (long long)c.nan_bad,
                      (long long)c.worst_i, g[c.worst_i], ref, r[c.worst_i]);
        else
            fail_line("%s vs %s: element %lld: %.17g vs %.17g, |diff| %.3g is %.3gx the bound", what, ref,
                      (long long)c.worst_i, g[c.worst_i], r[c.worst_i], fabs(g[c.worst_i] - r[c.worst_i]), c.worst_ratio);
        return;
    }
    n_pass++;
    printf("ok   %s vs %s: %lld/%lld identical, max |diff| %.3g, worst %.3g of the bound\n", what, ref,
           (long long)c.identical, (long long)c.n, c.max_abs, c.worst_ratio);
}

/* ------------------------------------------------------------------ running one op on both sides */

#define MAXT 8
/* A case: tensors (dtype, shape, initial values); `outs` says which are results to compare. */
typedef struct tcase {
    int n;
    fs_dtype dt[MAXT];
    int nd[MAXT];
    int64_t sh[MAXT][4];
    double *val[MAXT]; /* NULL: zeros */
    int is_out[MAXT];
} tcase;

typedef int (*invoke_fn)(fs_backend *be, fs_tensor *t, void *arg, fs_err *e);

static int add_t(tcase *c, fs_dtype dt, int nd, const int64_t *sh, double *val, int is_out)
{
    int k = c->n++;
    c->dt[k] = dt;
    c->nd[k] = nd;
    for (int i = 0; i < nd; i++) c->sh[k][i] = sh[i];
    c->val[k] = val;
    c->is_out[k] = is_out;
    return k;
}

/* Runs the case on `be` with every bfloat16 tensor replaced by float32 when as_f32 (the
 * fallback reference). res[k] receives the values of tensor k (outputs only). Returns the op's
 * return code; its message in *e. */
static int run_case(fs_backend *be, const tcase *c, int as_f32, invoke_fn fn, void *arg, double **res, fs_err *e)
{
    fs_tensor t[MAXT];
    for (int k = 0; k < c->n; k++) {
        fs_dtype dt = as_f32 && c->dt[k] == FS_BF16 ? FS_F32 : c->dt[k];
        t[k] = mk(be, dt, c->nd[k], c->sh[k], c->val[k]);
    }
    int rc = fn(be, t, arg, e);
    if (!rc) rc = be->sync(be, e);
    for (int k = 0; k < c->n; k++) {
        res[k] = NULL;
        if (!rc && c->is_out[k]) res[k] = rd(&t[k]);
        rm(&t[k]);
    }
    return rc;
}

static int not_supported(const fs_err *e) { return strstr(e->msg, "not supported") != NULL; }

/* In the self-test (--backend cpu-strict) the backend under test has the CPU's gaps: a "not
 * supported" there is a SKIPPED line. A GPU backend serves every dtype: there it is a failure. */
static int n_skip_self;
static int under_test_may_skip(const fs_err *e)
{
    if (strncmp(G->name, "cpu", 3) || !not_supported(e)) return 0;
    if (!n_skip_self++) printf("SKIP (self-test) %s — further ones counted, not printed\n", e->msg);
    return 1;
}

/* mag_fn(k, mag, arg): the magnitudes of output tensor k (computed from the inputs). */
typedef void (*mag_fn)(const tcase *c, int k, double *mag, void *arg);

/* The whole comparison of one case: GPU vs CPU in the same dtype; for bfloat16 cases the CPU's
 * bfloat16 kernels if it has them, else its float32 kernels on the same values. `dt` is the
 * case's dtype (its compute type sets u). */
static int64_t numel_sh(int nd, const int64_t *sh)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= sh[i];
    return n;
}

/* ref_f32: the reference always gets float32 for the bf16 tensors (ring_merge's bf16 out_i,
 * which the CPU's kernel takes in out's dtype: the upcast is exact). */
static void check_case(const char *what, fs_dtype dt, const tcase *c, invoke_fn fn, void *arg, mag_fn magf, bound bd,
                       int ref_f32)
{
    double *g[MAXT], *r[MAXT];
    fs_err e = {0};
    if (run_case(G, c, 0, fn, arg, g, &e)) {
        if (!under_test_may_skip(&e)) fail_line("%s: %s", what, e.msg);
        return;
    }
    const double u = dt == FS_F64 ? U64 : U32;
    double b = BF_ULP;
    const char *ref = "cpu";
    fs_err er = {0};
    int rc = run_case(R, c, ref_f32, fn, arg, r, &er);
    if (rc && dt == FS_BF16 && not_supported(&er)) {
        if (cpu_bf16 != 0) printf("     (the CPU backend has no bfloat16 kernels: \"%s\"; bf16 cases are checked against its float32 kernels on the same bf16 values, and counted as SKIPPED bf16 vs cpu bf16)\n", er.msg);
        cpu_bf16 = 0;
        n_skip++;
        b = BF_HALF;
        ref = "cpu f32";
        bd.R = bd.Rfb;
        rc = run_case(R, c, 1, fn, arg, r, &er);
    } else if (!rc && dt == FS_BF16) {
        cpu_bf16 = 1;
    }
    if (rc) {
        fail_line("%s: the reference failed: %s", what, er.msg);
    } else {
        for (int k = 0; k < c->n; k++) {
            if (!c->is_out[k]) continue;
            const int64_t n = numel_sh(c->nd[k], c->sh[k]);
            double *mag = malloc(sizeof(double) * (size_t)(n ? n : 1));
            magf(c, k, mag, arg);
            char w[512];
            snprintf(w, sizeof w, "%s%s", what, c->n > 1 && k != 0 ? (k == 1 ? " [lse]" : " [2nd output]") : "");
            /* output dtype decides whether its bf16 roundings apply */
            bound bk = bd;
            if (c->dt[k] != FS_BF16) bk.R = 0;
            verdict(w, ref, g[k], r[k], mag, n, u, bk, b);
            free(mag);
        }
    }
    for (int k = 0; k < c->n; k++) {
        if (c->is_out[k]) {
            free(g[k]);
            free(r[k]);
        }
    }
}

static void free_case(tcase *c)
{
    for (int k = 0; k < c->n; k++) free(c->val[k]);
}

/* ------------------------------------------------------------------ GEMM */

typedef struct gemm_arg {
    fs_dtype dt;
    int64_t M, N, K, lda, ldw, ldc;
    int bias;
} gemm_arg;

/* tensors: 0 C [M, ldc] (out), 1 A [M, lda], 2 W [N, ldw], 3 bias [N] */
static int inv_gemm(fs_backend *be, fs_tensor *t, void *arg, fs_err *e)
{
    gemm_arg *a = arg;
    return be->gemm(be, t[1].dtype, a->M, a->N, a->K, t[1].data, a->lda, t[2].data, a->ldw, a->bias ? t[3].data : NULL,
                    t[0].data, a->ldc, e);
}
static void mag_gemm(const tcase *c, int k, double *mag, void *arg)
{
    gemm_arg *a = arg;
    const double *A = c->val[1], *W = c->val[2], *b = c->val[3];
    for (int64_t m = 0; m < a->M; m++)
        for (int64_t j = 0; j < a->ldc; j++) {
            double s = 0;
            if (j < a->N) {
                for (int64_t q = 0; q < a->K; q++) s += fabs(A[m * a->lda + q] * W[j * a->ldw + q]);
                if (a->bias) s += fabs(b[j]);
            } /* else: a column past N, which both must leave alone: bound 0 */
            mag[m * a->ldc + j] = s;
        }
    (void)k;
}

static void t_gemm(fs_dtype dt, int64_t M, int64_t N, int64_t K, int lda_pad, int ldc_pad, int bias)
{
    gemm_arg a = {dt, M, N, K, K + lda_pad > 0 ? K + lda_pad : 1, K + 1, N + ldc_pad, bias};
    tcase c = {0};
    int64_t sc[2] = {M, a.ldc}, sa[2] = {M, a.lda}, sw[2] = {N, a.ldw}, sb[1] = {N};
    add_t(&c, dt, 2, sc, vec(M * a.ldc, 1, dt), 1);
    add_t(&c, dt, 2, sa, vec(M * a.lda, 1, dt), 0);
    add_t(&c, dt, 2, sw, vec(N * a.ldw, 1.0 / sqrt((double)(K ? K : 1)), dt), 0);
    add_t(&c, dt, 1, sb, vec(N, 0.5, dt), 0);
    char w[256];
    snprintf(w, sizeof w, "gemm%s %s M=%lld N=%lld K=%lld lda=%lld ldc=%lld%s", gemm_path, dtn(dt), (long long)M,
             (long long)N, (long long)K, (long long)a.lda, (long long)a.ldc, bias ? " +bias" : "");
    /* two correct float sums of K products differ by at most 2·γ_K·Σ|a||w| (Higham 3.5); tensor
     * cores may truncate while accumulating (2u per add): 4(K+2)u, plus the bias add */
    bound bd = {4.0 * (double)(K + 2), 1, 1};
    check_case(w, dt, &c, inv_gemm, &a, mag_gemm, bd, 0);
    free_case(&c);
}

/* ------------------------------------------------------------------ element-wise ops */

typedef struct ew_arg {
    int op; /* 0 add, 1 add_bias, 2 axpby, 3 silu, 4 gelu, 5 modulate, 6 gated_add, 7 axpby with a = 1 */
    double a, b;
} ew_arg;

static int inv_ew(fs_backend *be, fs_tensor *t, void *arg, fs_err *e)
{
    ew_arg *a = arg;
    switch (a->op) {
    case 0: return be->add(be, &t[0], &t[1], &t[2], e);
    case 1: return be->add_bias(be, &t[0], &t[1], e);
    case 2:
    case 7: return be->axpby(be, &t[0], a->a, &t[1], a->b, e);
    case 3: return be->silu(be, &t[0], &t[1], e);
    case 4: return be->gelu_tanh(be, &t[0], &t[1], e);
    case 5: return be->modulate(be, &t[0], &t[1], &t[2], &t[3], e);
    case 6: return be->gated_add(be, &t[0], &t[1], &t[2], e);
    }
    return 1;
}
static void mag_ew(const tcase *c, int k, double *mag, void *arg)
{
    ew_arg *a = arg;
    const int64_t n = c->sh[0][0] * (c->nd[0] > 1 ? c->sh[0][1] : 1) * (c->nd[0] > 2 ? c->sh[0][2] : 1);
    const double *y = c->val[0], *x = c->val[1], *z = c->n > 2 ? c->val[2] : NULL, *w = c->n > 3 ? c->val[3] : NULL;
    const int64_t D = c->sh[0][c->nd[0] - 1], SD = c->nd[0] == 3 ? c->sh[0][1] * D : n;
    for (int64_t i = 0; i < n; i++) {
        double m = 0;
        switch (a->op) {
        case 0: m = fabs(x[i]) + fabs(z[i]); break;
        case 1: m = fabs(y[i]) + fabs(x[i % D]); break;
        case 2:
        case 7: m = fabs(a->a * y[i]) + fabs(a->b * x[i]); break;
        case 3: m = 2 * fabs(x[i]); break;
        case 4: { double inner = 0.7978845608028654 * (x[i] + 0.044715 * x[i] * x[i] * x[i]);
                  m = fabs(x[i]) * (1 + fabs(inner)); break; }
        case 5: { const int64_t bd = (i / SD) * D + i % D; /* x·(1 + scale) + shift */
                  m = fabs(x[i] * (1 + z[bd])) + fabs(w[bd]) + fabs(x[i]); break; }
        case 6: { const int64_t bd = (i / SD) * D + i % D; /* x += gate·y */
                  m = fabs(y[i]) + fabs(x[bd] * z[i]); break; }
        }
        mag[i] = m;
    }
    (void)k;
}

static void t_ew(fs_dtype dt, int op, int64_t B, int64_t S, int64_t D)
{
    static const char *names[] = {"add", "add_bias", "axpby", "silu", "gelu_tanh", "modulate", "gated_add", "axpby (a = 1)"};
    /* add, add_bias, axpby, modulate, gated_add: the same IEEE operations in the same order on
     * both sides (the GPU file is compiled without contraction, the CPU's -std=c11 contracts
     * nothing), each bf16 result rounded by the same round-to-nearest-even: bit-identical is the
     * only pass (c = 0, R = 0), in every dtype — this is what pins the bf16 rounding contract.
     * silu/gelu: libm's and the GPU's exp/tanh differ by a few ulp (c = 8, 16), which can move a
     * bf16 rounding by one ulp (R = 1). Rfb: the op's bf16 roundings, against float32 kernels. */
    static const double cs[] = {0, 0, 0, 8, 16, 0, 0, 0};
    static const int rs[] = {0, 0, 0, 1, 1, 0, 0, 0}, rfb[] = {1, 1, 3, 1, 1, 3, 2, 3};
    /* axpby: b = -(1 + 2^-8 + 2^-12) is no bfloat16 value and rounds up to -(1 + 2^-7), so a kernel
     * that skips b's rounding fails; a = 1 with b = σ_next − σ of the reference `tiny` is the Euler
     * step */
    ew_arg a = {op, op == 2 ? 0.75 : 1, op == 2 ? -(1.0 + 1.0 / 256 + 1.0 / 4096) : op == 7 ? 0.61479187 - 0.82722867 : 1};
    tcase c = {0};
    int64_t s3[3] = {B, S, D}, s1[1] = {D}, s2[2] = {B, D};
    const int64_t n = B * S * D;
    add_t(&c, dt, 3, s3, vec(n, 2, dt), 1); /* y (in/out) */
    switch (op) {
    case 0: add_t(&c, dt, 3, s3, vec(n, 2, dt), 0); add_t(&c, dt, 3, s3, vec(n, 2, dt), 0); break;
    case 1: add_t(&c, dt, 1, s1, vec(D, 1, dt), 0); break;
    case 2:
    case 7: add_t(&c, dt, 3, s3, vec(n, 2, dt), 0); break;
    case 3: case 4: add_t(&c, dt, 3, s3, vec(n, 4, dt), 0); break;
    case 5: add_t(&c, dt, 3, s3, vec(n, 2, dt), 0); add_t(&c, dt, 2, s2, vec(B * D, 1, dt), 0);
            add_t(&c, dt, 2, s2, vec(B * D, 1, dt), 0); break;
    case 6: add_t(&c, dt, 2, s2, vec(B * D, 1, dt), 0); add_t(&c, dt, 3, s3, vec(n, 2, dt), 0); break;
    }
    char w[200];
    snprintf(w, sizeof w, "%s %s [%lld, %lld, %lld]", names[op], dtn(dt), (long long)B, (long long)S, (long long)D);
    bound bd = {cs[op], rs[op], rfb[op]};
    check_case(w, dt, &c, inv_ew, &a, mag_ew, bd, 0);
    free_case(&c);
}

/* ------------------------------------------------------------------ norms */

typedef struct norm_arg {
    int rms;
    int64_t D;
    double eps;
} norm_arg;

static int inv_norm(fs_backend *be, fs_tensor *t, void *arg, fs_err *e)
{
    norm_arg *a = arg;
    return a->rms ? be->rmsnorm(be, &t[0], &t[1], &t[2], a->eps, e) : be->layernorm(be, &t[0], &t[1], a->eps, e);
}
static void mag_norm(const tcase *c, int k, double *mag, void *arg)
{
    norm_arg *a = arg;
    const double *x = c->val[1], *w = a->rms ? c->val[2] : NULL;
    int64_t n = 1;
    for (int i = 0; i < c->nd[1]; i++) n *= c->sh[1][i];
    const int64_t D = a->D;
    for (int64_t r = 0; r < n / D; r++) {
        const double *row = x + r * D;
        double s = 0, sa = 0, q = 0;
        for (int64_t d = 0; d < D; d++) { s += row[d]; sa += fabs(row[d]); q += row[d] * row[d]; }
        const double mean = s / D;
        double v = 0;
        for (int64_t d = 0; d < D; d++) v += (row[d] - mean) * (row[d] - mean);
        const double rstd = a->rms ? 1 / sqrt(q / D + a->eps) : 1 / sqrt(v / D + a->eps);
        for (int64_t d = 0; d < D; d++)
            mag[r * D + d] = a->rms ? fabs(row[d]) * rstd * fabs(w[d]) : (fabs(row[d]) + sa / D) * rstd;
    }
    (void)k;
}

static void t_norm(fs_dtype dt, int rms, int nd, const int64_t *shape)
{
    norm_arg a = {rms, shape[nd - 1], 1e-6};
    tcase c = {0};
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    add_t(&c, dt, nd, shape, NULL, 1);
    double *x = vec(n, 2, dt);
    for (int64_t i = 0; i < n; i++) x[i] = quant(dt, x[i] + 0.3); /* a non-zero mean */
    add_t(&c, dt, nd, shape, x, 0);
    if (rms) {
        double *w = vec(a.D, 0.1, dt);
        for (int64_t i = 0; i < a.D; i++) w[i] = quant(dt, 1 + w[i]);
        add_t(&c, dt, 1, &a.D, w, 0);
    }
    char w[200], sh[64] = "";
    for (int i = 0; i < nd; i++) snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(w, sizeof w, "%s %s [%s]", rms ? "rmsnorm" : "layernorm", dtn(dt), sh);
    /* statistics summed in another order: the mean and variance differ by up to ~D·u relative,
     * which moves every output by as much; rstd and mean rounded to the storage type: 8u */
    bound bd = {8.0 + 2.0 * (double)a.D, 1, 1};
    check_case(w, dt, &c, inv_norm, &a, mag_norm, bd, 0);
    free_case(&c);
}

/* ------------------------------------------------------------------ rope */

static int inv_rope(fs_backend *be, fs_tensor *t, void *arg, fs_err *e)
{
    (void)arg;
    return be->rope(be, &t[0], &t[1], &t[2], e);
}
static void mag_rope(const tcase *c, int k, double *mag, void *arg)
{
    const int64_t S = c->sh[0][1], H = c->sh[0][2], Dh = c->sh[0][3], n = c->sh[0][0] * S * H * Dh;
    const double *x = c->val[0], *cs = c->val[1], *sn = c->val[2];
    for (int64_t i = 0; i < n; i += 2) {
        const int64_t s = (i / (H * Dh)) % S, j = i % Dh;
        const double m = fabs(x[i] * cs[s * Dh + j]) + fabs(x[i + 1] * sn[s * Dh + j]) + fabs(x[i + 1] * cs[s * Dh + j + 1]) +
                         fabs(x[i] * sn[s * Dh + j + 1]);
        mag[i] = mag[i + 1] = m;
    }
    (void)k;
    (void)arg;
}
static void t_rope(fs_dtype dt, int64_t B, int64_t S, int64_t H, int64_t Dh)
{
    const fs_dtype tdt = dt == FS_F64 ? FS_F64 : FS_F32; /* the tables' dtype (fs_backend.h) */
    tcase c = {0};
    int64_t sx[4] = {B, S, H, Dh}, st[2] = {S, Dh};
    add_t(&c, dt, 4, sx, vec(B * S * H * Dh, 2, dt), 1);
    double *cs = malloc(sizeof(double) * (size_t)(S * Dh)), *sn = malloc(sizeof(double) * (size_t)(S * Dh));
    for (int64_t s = 0; s < S; s++)
        for (int64_t j = 0; j < Dh; j += 2) {
            const double ang = (double)s * pow(10000.0, -(double)j / (double)Dh) * 1.7;
            cs[s * Dh + j] = cs[s * Dh + j + 1] = quant(tdt, cos(ang));
            sn[s * Dh + j] = sn[s * Dh + j + 1] = quant(tdt, sin(ang));
        }
    add_t(&c, tdt, 2, st, cs, 0);
    add_t(&c, tdt, 2, st, sn, 0);
    char w[200];
    snprintf(w, sizeof w, "rope %s (tables %s) [%lld, %lld, %lld, %lld]", dtn(dt), dtn(tdt), (long long)B, (long long)S,
             (long long)H, (long long)Dh);
    bound bd = {0, 0, 1}; /* products and sums in the tables' type, in the CPU's order: bit-identical */
    check_case(w, dt, &c, inv_rope, NULL, mag_rope, bd, 0);
    free_case(&c);
}

/* ------------------------------------------------------------------ attention */

typedef struct attn_arg {
    int64_t B, Sq, Skv, H, Dh;
    double scale;
    fs_lse_layout layout; /* the GPU's layout for this run (the CPU's stays [B,H,S]) */
    int with_lse;
} attn_arg;

/* tensors: 0 out, 1 lse (layout of the backend), 2 q, 3 k, 4 v */
static int inv_attn(fs_backend *be, fs_tensor *t, void *arg, fs_err *e)
{
    attn_arg *a = arg;
    fs_lse_layout keep = be->lse_layout;
    if (be == G) be->lse_layout = a->layout;
    int rc = be->attention(be, &t[0], a->with_lse ? &t[1] : NULL, &t[2], &t[3], &t[4], a->scale, e);
    be->lse_layout = keep;
    return rc;
}
static void mag_attn(const tcase *c, int k, double *mag, void *arg)
{
    attn_arg *a = arg;
    const double *q = c->val[2], *kk = c->val[3], *v = c->val[4];
    const int64_t H = a->H, Dh = a->Dh;
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < H; h++) {
            double qn = 0, kn = 0, vm = 0;
            for (int64_t i = 0; i < a->Sq; i++) {
                double s = 0;
                for (int64_t d = 0; d < Dh; d++) s += q[((b * a->Sq + i) * H + h) * Dh + d] * q[((b * a->Sq + i) * H + h) * Dh + d];
                qn = fmax(qn, sqrt(s));
            }
            for (int64_t j = 0; j < a->Skv; j++) {
                double s = 0;
                for (int64_t d = 0; d < Dh; d++) {
                    const double x = kk[((b * a->Skv + j) * H + h) * Dh + d];
                    s += x * x;
                    vm = fmax(vm, fabs(v[((b * a->Skv + j) * H + h) * Dh + d]));
                }
                kn = fmax(kn, sqrt(s));
            }
            /* a score is off by at most 2·Dh·u·scale·‖q‖‖k‖ (two dot products in different
             * orders); it moves its weight by twice that, relatively, and the output by that
             * times max|v|; exp/log and the P·V sum (≤ Skv terms, tiles rescaled) add
             * (2·Skv + 32)u. Both outputs scale with the magnitude below (in units of u). */
            const double smax = a->scale * qn * kn, units = 4.0 * (double)Dh * smax + 2.0 * (double)a->Skv + 32.0;
            if (k == 0) {
                for (int64_t i = 0; i < a->Sq; i++)
                    for (int64_t d = 0; d < Dh; d++) mag[((b * a->Sq + i) * H + h) * Dh + d] = units * vm;
            } else { /* lse = m + log(l): the score error, the sum's, and one rounding of |lse| */
                for (int64_t i = 0; i < a->Sq; i++) mag[(b * H + h) * a->Sq + i] = units + smax + log((double)a->Skv + 1);
            }
        }
}

/* GPU lse in its layout, the CPU's in [B,H,S]: compare after putting the GPU's into [B,H,S] on
 * the host (explicit indices, the layout given, never inferred). */
static void t_attn(fs_dtype dt, int64_t B, int64_t Sq, int64_t Skv, int64_t H, int64_t Dh, fs_lse_layout layout, int nan_row)
{
    attn_arg a = {B, Sq, Skv, H, Dh, 1.0 / sqrt((double)Dh), layout, 1};
    const fs_dtype ldt = dt == FS_F64 ? FS_F64 : FS_F32;
    int64_t sq[4] = {B, Sq, H, Dh}, sk[4] = {B, Skv, H, Dh}, sl[3] = {B, H, Sq};
    tcase c = {0};
    add_t(&c, dt, 4, sq, NULL, 1);
    add_t(&c, ldt, 3, sl, NULL, 1);
    double *q = vec(B * Sq * H * Dh, 1.5, dt);
    if (nan_row) q[Dh * (H > 1 ? 1 : 0) + 1] = NAN; /* one (b, i, h) row: its output and LSE must be NaN */
    add_t(&c, dt, 4, sq, q, 0);
    add_t(&c, dt, 4, sk, vec(B * Skv * H * Dh, 1.5, dt), 0);
    add_t(&c, dt, 4, sk, vec(B * Skv * H * Dh, 1, dt), 0);
    char w[256];
    snprintf(w, sizeof w, "attention %s B=%lld Sq=%lld Skv=%lld H=%lld Dh=%lld lse %s%s", dtn(dt), (long long)B,
             (long long)Sq, (long long)Skv, (long long)H, (long long)Dh, fs_lse_layout_name(layout),
             nan_row ? " (NaN in one q row)" : "");

    /* run both sides by hand: the GPU's lse comes back in `layout` */
    double *g[MAXT], *r[MAXT];
    fs_err e = {0}, er = {0};
    if (run_case(G, &c, 0, inv_attn, &a, g, &e)) {
        if (!under_test_may_skip(&e)) fail_line("%s: %s", w, e.msg);
        free_case(&c);
        return;
    }
    double b = BF_ULP;
    const char *ref = "cpu";
    int rc = run_case(R, &c, 0, inv_attn, &a, r, &er);
    if (rc && dt == FS_BF16 && not_supported(&er)) {
        cpu_bf16 = 0;
        n_skip++;
        b = BF_HALF;
        ref = "cpu f32";
        rc = run_case(R, &c, 1, inv_attn, &a, r, &er);
    }
    if (rc) {
        fail_line("%s: the reference failed: %s", w, er.msg);
    } else {
        /* the GPU's LSE into [B,H,S] */
        const int64_t nl = B * H * Sq;
        double *gl = malloc(sizeof(double) * (size_t)nl);
        for (int64_t bb = 0; bb < B; bb++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t s = 0; s < Sq; s++)
                    gl[(bb * H + h) * Sq + s] = g[1][layout == FS_LSE_BHS ? (bb * H + h) * Sq + s : (bb * Sq + s) * H + h];
        const int64_t no = B * Sq * H * Dh;
        double *mo = malloc(sizeof(double) * (size_t)no), *ml = malloc(sizeof(double) * (size_t)nl);
        mag_attn(&c, 0, mo, &a);
        mag_attn(&c, 1, ml, &a);
        const double u = dt == FS_F64 ? U64 : U32;
        const bound bo = {1, 0, 0}, bl = {1, 0, 0}; /* the magnitudes are in units of u already */
        /* bfloat16 out: its one rounding, relative to |out|, in units of u */
        if (dt == FS_BF16)
            for (int64_t i = 0; i < no; i++) mo[i] += fabs(r[0][i]) * (b / u);
        char w2[300];
        snprintf(w2, sizeof w2, "%s [out]", w);
        verdict(w2, ref, g[0], r[0], mo, no, u, bo, b);
        snprintf(w2, sizeof w2, "%s [lse]", w);
        verdict(w2, ref, gl, r[1], ml, nl, u, bl, b);
        if (nan_row) {
            int ok = isnan(g[0][Dh * (H > 1 ? 1 : 0)]) && isnan(gl[(H > 1 ? 1 : 0) * Sq]);
            if (ok) { n_pass++; printf("ok   %s: the NaN row stays NaN (out and lse)\n", w); }
            else fail_line("%s: the NaN in q did not reach out/lse", w);
        }
        free(gl);
        free(mo);
        free(ml);
        free(r[0]);
        free(r[1]);
    }
    free(g[0]);
    free(g[1]);
    free_case(&c);
}

/* Attention without an lse tensor (lse = NULL) must give the same out. */
static void t_attn_nolse(fs_dtype dt)
{
    attn_arg a = {1, 37, 29, 3, 32, 1.0 / sqrt(32.0), G->lse_layout, 1};
    int64_t sq[4] = {1, 37, 3, 32}, sk[4] = {1, 29, 3, 32}, sl[3] = {1, 3, 37};
    tcase c = {0};
    add_t(&c, dt, 4, sq, NULL, 1);
    add_t(&c, dt == FS_F64 ? FS_F64 : FS_F32, 3, sl, NULL, 0);
    add_t(&c, dt, 4, sq, vec(37 * 3 * 32, 1, dt), 0);
    add_t(&c, dt, 4, sk, vec(29 * 3 * 32, 1, dt), 0);
    add_t(&c, dt, 4, sk, vec(29 * 3 * 32, 1, dt), 0);
    double *g1[MAXT], *g2[MAXT];
    fs_err e = {0};
    int rc = run_case(G, &c, 0, inv_attn, &a, g1, &e);
    a.with_lse = 0;
    if (!rc) rc = run_case(G, &c, 0, inv_attn, &a, g2, &e);
    if (rc) {
        if (!under_test_may_skip(&e)) fail_line("attention %s without lse: %s", dtn(dt), e.msg);
    }
    else {
        int same = memcmp(g1[0], g2[0], sizeof(double) * 37 * 3 * 32) == 0;
        if (same) { n_pass++; printf("ok   attention %s with lse = NULL: the same out, bit for bit\n", dtn(dt)); }
        else fail_line("attention %s with lse = NULL differs from the run with lse", dtn(dt));
        free(g2[0]);
    }
    free(g1[0]);
    free_case(&c);
}

/* ------------------------------------------------------------------ lse_convert, ring_merge */

static void t_lse_convert(fs_dtype dt, int64_t B, int64_t H, int64_t S)
{
    const int64_t n = B * H * S;
    double *v = vec(n, 10, dt);
    int64_t sh[1] = {n};
    for (int dir = 0; dir < 2; dir++) {
        fs_lse_layout sl = dir ? FS_LSE_BSH : FS_LSE_BHS, dl = dir ? FS_LSE_BHS : FS_LSE_BSH;
        fs_tensor src = mk(G, dt, 1, sh, v), dst = mk(G, dt, 1, sh, NULL);
        fs_err e = {0};
        char w[160];
        snprintf(w, sizeof w, "lse_convert %s %s -> %s B=%lld H=%lld S=%lld", dtn(dt), fs_lse_layout_name(sl),
                 fs_lse_layout_name(dl), (long long)B, (long long)H, (long long)S);
        if (G->lse_convert(G, &dst, dl, &src, sl, B, H, S, &e)) fail_line("%s: %s", w, e.msg);
        else {
            double *g = rd(&dst);
            int64_t bad = 0;
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t s = 0; s < S; s++) {
                        const int64_t bhs = (b * H + h) * S + s, bsh = (b * S + s) * H + h;
                        if (g[dl == FS_LSE_BHS ? bhs : bsh] != v[sl == FS_LSE_BHS ? bhs : bsh]) bad++;
                    }
            if (bad) fail_line("%s: %lld elements misplaced", w, (long long)bad);
            else { n_pass++; printf("ok   %s: every element where it belongs\n", w); }
            free(g);
        }
        rm(&src);
        rm(&dst);
    }
    free(v);
}

/* tensors: 0 out (in/out), 1 lse (in/out), 2 out_i, 3 lse_i */
static int inv_ring(fs_backend *be, fs_tensor *t, void *arg, fs_err *e)
{
    (void)arg;
    return be->ring_merge(be, &t[0], &t[1], &t[2], &t[3], e);
}
static void mag_ring(const tcase *c, int k, double *mag, void *arg)
{
    (void)arg;
    int64_t n = 1;
    for (int i = 0; i < c->nd[k]; i++) n *= c->sh[k][i];
    const double *a = c->val[k], *b = c->val[k + 2];
    for (int64_t i = 0; i < n; i++) mag[i] = fabs(a[i]) + fabs(b[i]) + (k == 1 ? 1 : 0);
}
static void t_ring(fs_dtype dt, fs_dtype dti, int64_t B, int64_t S, int64_t H, int64_t Dh)
{
    tcase c = {0};
    int64_t so[4] = {B, S, H, Dh}, sl[3] = {B, H, S};
    add_t(&c, dt, 4, so, vec(B * S * H * Dh, 1, dt), 1);
    add_t(&c, dt, 3, sl, vec(B * H * S, 3, dt), 1);
    add_t(&c, dti, 4, so, vec(B * S * H * Dh, 1, dti), 0);
    add_t(&c, dt, 3, sl, vec(B * H * S, 3, dt), 0);
    char w[200];
    snprintf(w, sizeof w, "ring_merge %s (out_i %s) [%lld, %lld, %lld, %lld]", dtn(dt), dtn(dti), (long long)B,
             (long long)S, (long long)H, (long long)Dh);
    /* sigmoid and log1p(exp) on both sides (libm vs the GPU's): a few ulp */
    bound bd = {16, 0, 0};
    /* the CPU merges an out_i of out's dtype: give it the bf16 values as float32 (exact) */
    check_case(w, dt, &c, inv_ring, NULL, mag_ring, bd, dti == FS_BF16);
    free_case(&c);
}

/* ------------------------------------------------------------------ convert, memory */

static void t_convert(void)
{
    /* float32 bit patterns: ties to even both ways, overflow to inf, NaNs, denormals, zeros */
    static const uint32_t special[] = {0x3F808000u, 0x3F818000u, 0x3F80C000u, 0xBF808000u, 0x7F7FFFFFu, 0x7F7F8000u,
                                       0x7F800000u, 0xFF800000u, 0x7FC00001u, 0x7F800001u, 0xFFC12345u, 0x00000001u,
                                       0x00008000u, 0x00018000u, 0x80000000u, 0x00000000u, 0x3F7FFFFFu, 0x477FE000u};
    const int64_t nsp = (int64_t)(sizeof special / sizeof *special), n = nsp + 10007;
    float *f = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        if (i < nsp) memcpy(&f[i], &special[i], 4);
        else f[i] = (float)(urand() * pow(2.0, 40.0 * urand()));
    }
    int64_t sh[1] = {n};
    fs_err e = {0};
    /* f32 -> bf16 against fs_bf16_from_float, bit for bit */
    {
        fs_tensor x = {0}, y = {0};
        x.dtype = FS_F32; x.ndim = 1; x.shape[0] = n; x.be = G;
        y = x; y.dtype = FS_BF16;
        G->alloc(G, (size_t)n * 4, &x.data, &e);
        G->alloc(G, (size_t)n * 2, &y.data, &e);
        G->upload2d(G, x.data, (size_t)n * 4, f, (size_t)n * 4, (size_t)n * 4, 1, &e);
        uint16_t *out = malloc(sizeof(uint16_t) * (size_t)n);
        if (G->convert(G, &y, &x, &e) || G->download2d(G, out, (size_t)n * 2, y.data, (size_t)n * 2, (size_t)n * 2, 1, &e))
            fail_line("convert f32 -> bf16: %s", e.msg);
        else {
            int64_t bad = 0, first = -1;
            for (int64_t i = 0; i < n; i++)
                if (out[i] != fs_bf16_from_float(f[i]) && bad++ == 0) first = i;
            if (bad) fail_line("convert f32 -> bf16: %lld of %lld differ from fs_bf16_from_float (first: element %lld, 0x%04x vs 0x%04x)",
                               (long long)bad, (long long)n, (long long)first, out[first], fs_bf16_from_float(f[first]));
            else { n_pass++; printf("ok   convert f32 -> bf16: %lld values (ties, NaN, inf, denormals) bit-identical to fs_bf16_from_float\n", (long long)n); }
            /* and back: bf16 -> f32 is exact */
            fs_tensor z = x;
            G->alloc(G, (size_t)n * 4, &z.data, &e);
            float *back = malloc(sizeof(float) * (size_t)n);
            if (G->convert(G, &z, &y, &e) || G->download2d(G, back, (size_t)n * 4, z.data, (size_t)n * 4, (size_t)n * 4, 1, &e))
                fail_line("convert bf16 -> f32: %s", e.msg);
            else {
                int64_t bad2 = 0;
                for (int64_t i = 0; i < n; i++) {
                    float want = fs_bf16_to_float(out[i]);
                    if (memcmp(&back[i], &want, 4)) bad2++;
                }
                if (bad2) fail_line("convert bf16 -> f32: %lld values not exact", (long long)bad2);
                else { n_pass++; printf("ok   convert bf16 -> f32: exact\n"); }
            }
            free(back);
            G->free(G, z.data);
        }
        free(out);
        G->free(G, x.data);
        G->free(G, y.data);
    }
    /* f64 -> bf16 goes through float32 (c10's BFloat16(float) from a double): 1 + 2^-8 + 2^-30
     * rounds to 1 + 2^-8 in float32, a tie, to even: 1.0 (a direct rounding would give 1 + 2^-7) */
    {
        double d[4] = {1.0 + 1.0 / 256 + 1.0 / 1073741824.0, -3.14159265358979, 1e300, 65504.123};
        fs_tensor x = {0}, y = {0};
        int64_t s4[1] = {4};
        x = mk(G, FS_F64, 1, s4, d);
        y = mk(G, FS_BF16, 1, s4, NULL);
        if (G->convert(G, &y, &x, &e)) fail_line("convert f64 -> bf16: %s", e.msg);
        else {
            double *g = rd(&y);
            int bad = 0;
            for (int i = 0; i < 4; i++)
                if (g[i] != fs_bf16_to_float(fs_bf16_from_float((float)d[i]))) bad++;
            if (bad) fail_line("convert f64 -> bf16: %d of 4 differ from bf16(float(x)) (first value: %.10g)", bad, g[0]);
            else { n_pass++; printf("ok   convert f64 -> bf16 through float32 (the double-rounding case gives 1.0)\n"); }
            free(g);
        }
        rm(&x);
        rm(&y);
    }
    /* f32 <-> f64 */
    {
        double *v = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) v[i] = urand() * 1e3;
        fs_tensor x = mk(G, FS_F64, 1, sh, v), y = mk(G, FS_F32, 1, sh, NULL), z = mk(G, FS_F64, 1, sh, NULL);
        if (G->convert(G, &y, &x, &e) || G->convert(G, &z, &y, &e)) fail_line("convert f64 <-> f32: %s", e.msg);
        else {
            double *g = rd(&z);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++)
                if (g[i] != (double)(float)v[i]) bad++;
            if (bad) fail_line("convert f64 -> f32 -> f64: %lld values differ from (double)(float)x", (long long)bad);
            else { n_pass++; printf("ok   convert f64 -> f32 -> f64: round to nearest, exact back\n"); }
            free(g);
        }
        rm(&x); rm(&y); rm(&z);
        free(v);
    }
    free(f);
}

static void t_memory(void)
{
    fs_err e = {0};
    /* 2-D blocks: upload a 13 x 37-byte block from a 50-byte-pitch host buffer into a 64-byte
     * pitch, copy it to a 41-byte pitch on the device, download it into a 45-byte pitch */
    const size_t rows = 13, w = 37, hp = 50, dp = 64, dp2 = 41, hp2 = 45;
    unsigned char *h = malloc(rows * hp), *o = malloc(rows * hp2);
    for (size_t i = 0; i < rows * hp; i++) h[i] = (unsigned char)(i * 7 + 3);
    memset(o, 0xEE, rows * hp2);
    void *d1 = NULL, *d2 = NULL, *pin = NULL;
    int rc = G->alloc(G, rows * dp, &d1, &e);
    if (!rc) rc = G->alloc(G, rows * dp2, &d2, &e);
    if (!rc) rc = G->memset(G, d1, 0x5A, rows * dp, &e);
    if (!rc) rc = G->upload2d(G, d1, dp, h, hp, w, rows, &e);
    if (!rc) rc = G->copy2d(G, d2, dp2, d1, dp, w, rows, &e);
    if (!rc) rc = G->download2d(G, o, hp2, d2, dp2, w, rows, &e);
    if (rc) fail_line("memory ops: %s", e.msg);
    else {
        int bad = 0;
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < hp2; c++)
                if (o[r * hp2 + c] != (c < w ? h[r * hp + c] : 0xEE)) bad++;
        /* the padding of the first device block keeps the memset byte */
        unsigned char *o1 = malloc(rows * dp);
        if (G->download2d(G, o1, dp, d1, dp, dp, rows, &e)) bad++;
        else
            for (size_t r = 0; r < rows; r++)
                for (size_t c = w; c < dp; c++)
                    if (o1[r * dp + c] != 0x5A) bad++;
        free(o1);
        /* a pitched block into a dense one (dpitch == width < spitch): still row by row */
        unsigned char *od = malloc(rows * w);
        if (G->download2d(G, od, w, d1, dp, w, rows, &e)) bad++;
        else
            for (size_t r = 0; r < rows; r++)
                for (size_t c = 0; c < w; c++)
                    if (od[r * w + c] != h[r * hp + c]) bad++;
        free(od);
        if (bad) fail_line("memory ops: %d bytes wrong after upload2d/copy2d/download2d/memset with pitches", bad);
        else { n_pass++; printf("ok   memory: alloc, memset, upload2d, copy2d, download2d with 5 different pitches (one dense side), byte for byte\n"); }
    }
    /* pinned host memory round trip, and a copy whose rows are contiguous (one 1-D copy) */
    const size_t big = (size_t)3 << 20;
    rc = G->host_alloc(G, big, &pin, &e);
    if (rc) fail_line("host_alloc: %s", e.msg);
    else {
        void *d3 = NULL;
        for (size_t i = 0; i < big; i++) ((unsigned char *)pin)[i] = (unsigned char)(i * 13);
        rc = G->alloc(G, big, &d3, &e);
        if (!rc) rc = G->upload2d(G, d3, big / 3, pin, big / 3, big / 3, 3, &e);
        if (!rc) memset(pin, 0, big); /* upload2d returned: the host buffer may be reused at once */
        if (!rc) rc = G->download2d(G, pin, big, d3, big, big, 1, &e);
        if (rc) fail_line("pinned round trip: %s", e.msg);
        else {
            size_t bad = 0;
            for (size_t i = 0; i < big; i++)
                if (((unsigned char *)pin)[i] != (unsigned char)(i * 13)) bad++;
            if (bad) fail_line("pinned round trip: %zu bytes wrong", bad);
            else { n_pass++; printf("ok   host_alloc (pinned) 3 MiB round trip; upload2d's source reusable on return\n"); }
        }
        G->free(G, d3);
        G->host_free(G, pin);
    }
    G->free(G, d1);
    G->free(G, d2);
    G->free(G, NULL);
    if (G->sync(G, &e)) fail_line("sync: %s", e.msg);
    free(h);
    free(o);
}

static void t_table(void)
{
    const void *m[] = {(void *)G->alloc, (void *)G->free, (void *)G->memset, (void *)G->upload2d, (void *)G->download2d,
                       (void *)G->copy2d, (void *)G->sync, (void *)G->host_alloc, (void *)G->host_free, (void *)G->gemm,
                       (void *)G->convert, (void *)G->add, (void *)G->add_bias, (void *)G->axpby, (void *)G->silu,
                       (void *)G->gelu_tanh, (void *)G->layernorm, (void *)G->rmsnorm, (void *)G->modulate,
                       (void *)G->gated_add, (void *)G->rope, (void *)G->attention, (void *)G->lse_convert,
                       (void *)G->ring_merge};
    int missing = 0;
    for (size_t i = 0; i < sizeof m / sizeof *m; i++) missing += !m[i];
    if (missing) fail_line("backend table: %d members are NULL", missing);
    else { n_pass++; printf("ok   backend '%s': all %zu members set, host_addressable %d, native lse layout %s\n", G->name,
                            sizeof m / sizeof *m, G->host_addressable, fs_lse_layout_name(G->lse_layout)); }
}

/* ------------------------------------------------------------------ the suite */

static void gemm_suite(void)
{
    const fs_dtype dts[3] = {FS_F64, FS_F32, FS_BF16};
    for (int d = 0; d < 3; d++) {
        const fs_dtype dt = dts[d];
        t_gemm(dt, 1, 7, 5, 0, 0, 1);
        t_gemm(dt, 33, 65, 17, 3, 0, 1);   /* K not a multiple of 8 or of the tile; lda > K */
        t_gemm(dt, 64, 64, 64, 0, 5, 0);   /* exact tiles; ldc > N: columns past N untouched */
        t_gemm(dt, 130, 96, 200, 0, 0, 1);
        t_gemm(dt, 257, 129, 31, 7, 2, 1);
        t_gemm(dt, 2, 3, 0, 0, 0, 1);      /* K = 0: C = bias */
        if (!quick) t_gemm(dt, 48, 3072, 3072 + 13, 0, 0, 1);
        if (!quick && dt != FS_F64) t_gemm(dt, 4099, 4097, 24, 0, 0, 1); /* more rows than the bf16 scratch holds */
    }
}

int main(int argc, char **argv)
{
#ifdef FS_WITH_GPU
    const char *name = FS_GPU_BACKEND_NAMES;
#else
    const char *name = "cpu-strict";
#endif
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) name = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) rng_state = strtoull(argv[++i], NULL, 0);
        else {
            fprintf(stderr, "usage: gpu_check [--backend NAME] [--quick] [--seed N]\n");
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    fs_err e = {0};
    if (fs_backend_open(name, &G, &e)) {
        if (e.code == FS_E_INPUT) {
            printf("*** SKIPPED: no GPU (%s) — the GPU conformance checks did NOT run ***\n", e.msg);
            return 0;
        }
        printf("FAIL opening backend %s: %s\n", name, e.msg);
        return 1;
    }
    R = fs_backend_cpu();
    fs_backend_cpu_set_threads(0);
    char desc[512] = "";
#ifdef FS_WITH_GPU
    fs_backend_gpu_describe(G, desc, sizeof desc);
#endif
    printf("gpu_check: backend %s %s against cpu; seed 0x%llx%s\n", name, desc, (unsigned long long)rng_state,
           quick ? ", quick" : "");
    time_t t0 = time(NULL);

    t_table();
    t_memory();
    t_convert();

    gemm_path = "";
    gemm_suite();
#if defined(FS_WITH_GPU) && !defined(FS_GPU_HIP)
    /* the same GEMMs through the tiled kernel */
    {
        fs_backend *G0 = G, *Gt = NULL;
        setenv("FLUX_SIM_GPU_GEMM", "tiled", 1);
        if (fs_backend_open(name, &Gt, &e)) fail_line("opening a second backend with FLUX_SIM_GPU_GEMM=tiled: %s", e.msg);
        else {
            G = Gt;
            gemm_path = " (tiled)";
            gemm_suite();
            G = G0;
            fs_backend_close(Gt);
        }
        unsetenv("FLUX_SIM_GPU_GEMM");
        gemm_path = "";
    }
#endif

    const fs_dtype dts[3] = {FS_F64, FS_F32, FS_BF16};
    for (int d = 0; d < 3; d++) {
        const fs_dtype dt = dts[d];
        for (int op = 0; op < 8; op++) {
            t_ew(dt, op, 2, 35, 96);
            t_ew(dt, op, 1, 1, 1);
            if (!quick) t_ew(dt, op, 1, 333, 3072 + 5);
        }
        const int64_t ln1[2] = {1, 1}, ln2[3] = {2, 35, 96}, ln3[3] = {1, 130, 3072}, ln4[2] = {7, 1000};
        t_norm(dt, 0, 2, ln1);
        t_norm(dt, 0, 3, ln2);
        t_norm(dt, 0, 2, ln4);
        if (!quick) t_norm(dt, 0, 3, ln3);
        const int64_t rm1[4] = {2, 35, 6, 16}, rm2[4] = {1, 80, 4, 32}, rm3[4] = {1, 33, 3, 128};
        t_norm(dt, 1, 4, rm1);
        t_norm(dt, 1, 4, rm2);
        t_norm(dt, 1, 4, rm3);
        t_rope(dt, 2, 35, 6, 16);
        t_rope(dt, 1, 80, 4, 32);
        t_rope(dt, 1, 17, 2, 128);
        for (int l = 0; l < 2; l++) {
            const fs_lse_layout L = l ? FS_LSE_BSH : FS_LSE_BHS;
            t_attn(dt, 1, 64, 64, 4, 32, L, 0);
            t_attn(dt, 2, 35, 35, 6, 16, L, 0);     /* odd: S not a multiple of the key tile, B = 2 */
            t_attn(dt, 2, 35, 13, 6, 16, L, 0);     /* ring-like: fewer keys than queries */
            t_attn(dt, 1, 100, 77, 2, 128, L, 0);   /* FLUX.1-dev head dim */
            t_attn(dt, 1, 5, 5, 5, 1 * 16, L, 0);   /* S == H: a guessed transpose would pass unnoticed */
            t_attn(dt, 1, 1, 1, 1, 16, L, 0);
            if (!quick) t_attn(dt, 1, 50, 70, 1, 200, L, 0); /* Dh up to 256 */
            if (!quick) t_attn(dt, 1, 300, 300, 2, 128, L, 0);
        }
        t_attn(dt, 1, 9, 40, 3, 32, G->lse_layout, 1);
        t_attn_nolse(dt);
        if (dt != FS_BF16) {
            t_lse_convert(dt, 2, 6, 35);
            t_lse_convert(dt, 1, 5, 5);
            t_ring(dt, dt, 2, 35, 6, 16);
            t_ring(dt, dt, 1, 80, 4, 32);
        }
    }
    t_ring(FS_F32, FS_BF16, 2, 35, 6, 16); /* convert_to_fp32: a bf16 out_i into the float32 running out */

    fs_backend_close(G);
    if (n_skip_self) printf("%d cases SKIPPED in the self-test: the backend under test refused them as not supported\n", n_skip_self);
    printf("gpu_check: %d passed, %d failed, %d SKIPPED bf16 vs cpu bf16 (CPU backend %s bfloat16 kernels) in %lld s\n",
           n_pass, n_fail, n_skip, cpu_bf16 == 0 ? "without" : cpu_bf16 == 1 ? "with" : "not asked for",
           (long long)(time(NULL) - t0));
    return n_fail ? 1 : 0;
}
