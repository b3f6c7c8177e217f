/* test_ops.c — each op of the forward against values computed independently of our kernels:
 * by hand, by a naive loop, or taken from ../shared/flux-spec.md. */
#include "test_util.h"

#include <math.h>
#include <signal.h>
#include <sys/wait.h>

#include "fo_dump.h"
#include "fs_gemm.h"
#include "fs_model.h"
#include "fs_plan.h"
#include "fs_rng.h"
#include "fs_sampler.h"
#include "fs_vmath.h"

static fs_backend *be;

static void close_to(double got, double want, double tol, const char *what)
{
    if (!(fabs(got - want) <= tol)) fail_msg("%s: got %.17g want %.17g (|diff| %.3g > %.3g)", what, got, want, fabs(got - want), tol);
}

static void fill(fs_tensor *t, uint64_t seed)
{
    uint64_t key = fs_rng_key(seed, "test");
    for (int64_t i = 0; i < fs_tensor_numel(t); i++) fs_tensor_set(t, i, fs_rng_normal(key, (uint64_t)i));
}

/* ---- primitives ---- */

static void test_gelu_tanh(void **s)
{
    /* 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) evaluated by Python's math module */
    const double x[] = {1.0, -1.0, 0.5, 3.0, 0.0};
    const double want[] = {0.8411919906082768, -0.15880800939172324, 0.34571400982514394, 2.996362607918227, 0.0};
    for (int d = 0; d < 2; d++) {
        fs_tensor a, y;
        fs_tensor_alloc(&a, d ? FS_F64 : FS_F32, 1, (int64_t[]){5}, NULL);
        fs_tensor_alloc(&y, a.dtype, 1, (int64_t[]){5}, NULL);
        for (int i = 0; i < 5; i++) fs_tensor_set(&a, i, x[i]);
        assert_int_equal(be->gelu_tanh(be, &y, &a, NULL), 0);
        for (int i = 0; i < 5; i++) close_to(fs_tensor_get(&y, i), want[i], d ? 1e-15 : 1e-6, "gelu_tanh");
        fs_tensor_free(&a);
        fs_tensor_free(&y);
    }
}

/* ---- float32 vector exp / tanh (fs_vmath.h) ---- */

/* The widths this machine runs: 4, 8 where it has AVX2, 16 where it has AVX-512F. */
static int vmath_widths(int *w)
{
    int n = 0;
    w[n++] = 4;
    if (fs_vmath_force_width(8) == 0) w[n++] = 8;
    if (fs_vmath_force_width(16) == 0) w[n++] = 16;
    fs_vmath_force_width(0);
    return n;
}

/* exp < 1 ulp over its range, tanh < 1.5 ulp everywhere, on every 251st float (17 M values;
 * tools/bench_vmath_accuracy measures all of them), bit-identical across widths */
static void test_vmath_accuracy(void **s)
{
    enum { CH = 1 << 16 };
    float *x = malloc(sizeof(float) * CH),
          *y[3] = {malloc(sizeof(float) * CH), malloc(sizeof(float) * CH), malloc(sizeof(float) * CH)};
    int w[3], nw = vmath_widths(w);
    double worst[2] = {0, 0};
    for (int fn = 0; fn < 2; fn++) {
        int64_t n = 0;
        for (uint64_t b = 0; b < (1ull << 32); b += 251) {
            uint32_t u = (uint32_t)b;
            float v;
            memcpy(&v, &u, 4);
            if (isnan(v) || (fn == 0 && (v < -87.33654f || v > 88.72283f))) continue;
            x[n++] = v;
            if (n < CH && b + 251 < (1ull << 32)) continue;
            for (int k = 0; k < nw; k++) {
                assert_int_equal(fs_vmath_force_width(w[k]), 0);
                (fn ? fs_vmath_tanh : fs_vmath_exp)(y[k], x, n);
            }
            fs_vmath_force_width(0);
            for (int64_t i = 0; i < n; i++) {
                const double e = fs_vmath_ulp_err(y[0][i], fn ? tanh((double)x[i]) : exp((double)x[i]));
                if (e > worst[fn]) worst[fn] = e;
                for (int k = 1; k < nw; k++)
                    if (memcmp(&y[0][i], &y[k][i], 4))
                        fail_msg("%s(%.9g): width 4 gives %.9g, width %d %.9g", fn ? "tanh" : "exp", x[i], y[0][i], w[k],
                                 y[k][i]);
            }
            n = 0;
        }
    }
    printf("  vmath: exp max %.3f ulp, tanh max %.3f ulp (widths 4%s%s)\n", worst[0], worst[1], nw > 1 ? ", 8" : " only",
           nw > 2 ? ", 16" : "");
    if (!(worst[0] < 1.0)) fail_msg("exp: %.3f ulp", worst[0]);
    if (!(worst[1] < 1.5)) fail_msg("tanh: %.3f ulp", worst[1]);
    /* the edges: NaN, infinities, signed zeros, under- and overflow */
    const float in[10] = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f, -87.4f, -100.0f, 88.8f, 1e-30f, -10.5f};
    float eo[10], to[10];
    fs_vmath_exp(eo, in, 10);
    fs_vmath_tanh(to, in, 10);
    assert_true(isnan(eo[0]) && isnan(to[0]));
    assert_true(eo[1] == INFINITY && eo[2] == 0 && eo[3] == 1 && eo[4] == 1 && eo[5] == 0 && eo[6] == 0 && eo[7] == INFINITY);
    assert_true(to[1] == 1 && to[2] == -1 && to[4] == 0 && !signbit(to[4]) && to[3] == 0 && signbit(to[3]));
    assert_true(to[8] == 1e-30f && to[9] == -1);
    free(x);
    free(y[0]);
    free(y[1]);
    free(y[2]);
}

/* rowmax and expsum at every length 0..40 (the padded last step) and one of 1536, both widths:
 * the same bits, the exps written back in place and nothing past n touched, the sum within
 * float rounding of the double sum; NaN propagates */
static void test_vmath_softmax_rows(void **s)
{
    int w[3], nw = vmath_widths(w);
    float x[1600], r[3][1600 + 16], sum[3];
    for (int n = 0; n <= 1536; n = n < 40 ? n + 1 : n + 1496) { /* 0..40, then 1536 */
        for (int i = 0; i < n; i++) x[i] = (float)(((i * 37) % 101) - 50) * 0.173f;
        for (int k = 0; k < nw; k++) {
            assert_int_equal(fs_vmath_force_width(w[k]), 0);
            for (int i = 0; i < n + 16; i++) r[k][i] = i < n ? x[i] : 12345.0f;
            const float mx = fs_vmath_rowmax(r[k], n);
            float want = -INFINITY;
            for (int i = 0; i < n; i++) want = x[i] > want ? x[i] : want;
            assert_true(mx == want);
            sum[k] = fs_vmath_expsum(r[k], n, mx);
            double ds = 0;
            for (int i = 0; i < n; i++) { /* x - mx rounds in float first, as in the kernel */
                ds += exp((double)(x[i] - mx));
                if (fs_vmath_ulp_err(r[k][i], exp((double)(x[i] - mx))) >= 1.0) fail_msg("n=%d: exp at %d", n, i);
            }
            for (int i = n; i < n + 16; i++) assert_true(r[k][i] == 12345.0f);
            float d[1536], ed[1536]; /* the softmax's exp (x <= 0 only) is fs_vmath_exp, bit for bit */
            for (int i = 0; i < n; i++) d[i] = x[i] - mx;
            fs_vmath_exp(ed, d, n);
            if (n) assert_memory_equal(ed, r[k], sizeof(float) * (size_t)n);
            close_to(sum[k], ds, 1e-6 * ds, "expsum");
        }
        fs_vmath_force_width(0);
        for (int k = 1; k < nw; k++) {
            assert_memory_equal(r[0], r[k], sizeof(float) * (size_t)n);
            assert_memory_equal(&sum[0], &sum[k], sizeof(float));
        }
    }
    /* every 97th non-positive float down to -104 (through the denormal range, which flushes to 0) */
    enum { CH = 4096 };
    float a[CH], b[CH];
    int m = 0;
    for (uint32_t u = 0x80000000u; u <= 0xC2D00000u; u += 97) {
        memcpy(&a[m], &u, 4);
        if (++m < CH && u + 97 <= 0xC2D00000u) continue;
        fs_vmath_exp(b, a, m);
        float c[CH];
        memcpy(c, a, sizeof(float) * (size_t)m);
        fs_vmath_expsum(c, m, 0.0f);
        assert_memory_equal(b, c, sizeof(float) * (size_t)m);
        m = 0;
    }
    float z[5] = {1, NAN, 2, 3, 4};
    const float mz = fs_vmath_rowmax(z, 5);
    assert_true(mz == 4);
    assert_true(isnan(fs_vmath_expsum(z, 5, mz)) && isnan(z[1]) && z[4] == 1);
}

/* the vector GELU against the formula in double: within a few float ulps of the magnitudes it
 * adds up (tanh's error is < 1.5 ulp; the products round) */
static void test_vmath_gelu(void **s)
{
    enum { N = 20001 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) x[i] = -10.0f + 20.0f * (float)i / (N - 1);
    fs_vmath_gelu_tanh(y, x, N);
    for (int i = 0; i < N; i++) {
        const double v = x[i], inner = 0.7978845608028654 * (v + 0.044715 * v * v * v);
        const double want = 0.5 * v * (1 + tanh(inner));
        close_to(y[i], want, 8 * 0x1p-24 * fabs(v) * (1 + fabs(inner)), "vector gelu_tanh");
    }
    free(x);
    free(y);
}

static void test_silu(void **s)
{
    fs_tensor a, y;
    fs_tensor_alloc(&a, FS_F64, 1, (int64_t[]){3}, NULL);
    fs_tensor_alloc(&y, FS_F64, 1, (int64_t[]){3}, NULL);
    fs_tensor_set(&a, 0, 1.0);
    fs_tensor_set(&a, 1, -2.0);
    fs_tensor_set(&a, 2, 0.0);
    assert_int_equal(be->silu(be, &y, &a, NULL), 0);
    close_to(fs_tensor_get(&y, 0), 1.0 / (1.0 + exp(-1.0)), 1e-15, "silu(1)");
    close_to(fs_tensor_get(&y, 1), -2.0 / (1.0 + exp(2.0)), 1e-15, "silu(-2)");
    close_to(fs_tensor_get(&y, 2), 0.0, 0, "silu(0)");
    fs_tensor_free(&a);
    fs_tensor_free(&y);
}

static void test_layernorm_no_affine(void **s)
{
    /* rows [1,2,3,4] and [2,2,2,2]: mean 2.5, biased var 1.25; a constant row normalises to 0 */
    fs_tensor a, y;
    fs_tensor_alloc2(&a, FS_F64, 2, 4, NULL);
    fs_tensor_alloc2(&y, FS_F64, 2, 4, NULL);
    for (int i = 0; i < 4; i++) {
        fs_tensor_set(&a, i, i + 1);
        fs_tensor_set(&a, 4 + i, 2.0);
    }
    assert_int_equal(be->layernorm(be, &y, &a, 1e-6, NULL), 0);
    for (int i = 0; i < 4; i++) {
        close_to(fs_tensor_get(&y, i), (i + 1 - 2.5) / sqrt(1.25 + 1e-6), 1e-14, "layernorm row 0");
        close_to(fs_tensor_get(&y, 4 + i), 0.0, 0, "layernorm constant row");
    }
    fs_tensor_free(&a);
    fs_tensor_free(&y);
}

static void test_rmsnorm_per_head(void **s)
{
    /* x viewed as [1 token, 2 heads, Dh=4]: each head normalised on its own, times w[Dh] */
    fs_tensor a, y, w;
    fs_tensor_alloc2(&a, FS_F64, 2, 4, NULL);
    fs_tensor_alloc2(&y, FS_F64, 2, 4, NULL);
    fs_tensor_alloc(&w, FS_F64, 1, (int64_t[]){4}, NULL);
    const double h0[4] = {1, 2, 3, 4}, h1[4] = {-1, 0, 0, 1}, wv[4] = {1, 0.5, 2, -1};
    for (int i = 0; i < 4; i++) {
        fs_tensor_set(&a, i, h0[i]);
        fs_tensor_set(&a, 4 + i, h1[i]);
        fs_tensor_set(&w, i, wv[i]);
    }
    assert_int_equal(be->rmsnorm(be, &y, &a, &w, 1e-6, NULL), 0);
    for (int i = 0; i < 4; i++) {
        close_to(fs_tensor_get(&y, i), h0[i] / sqrt(30.0 / 4 + 1e-6) * wv[i], 1e-14, "rmsnorm head 0");
        close_to(fs_tensor_get(&y, 4 + i), h1[i] / sqrt(2.0 / 4 + 1e-6) * wv[i], 1e-14, "rmsnorm head 1");
    }
    fs_tensor_free(&a);
    fs_tensor_free(&y);
    fs_tensor_free(&w);
}

static void test_modulate_and_gate(void **s)
{
    /* [B=2, S=1, D=2]: y = x·(1+scale)+shift per batch row; x += gate·y */
    fs_tensor x, y, sc, sh, g;
    fs_tensor_alloc3(&x, FS_F64, 2, 1, 2, NULL);
    fs_tensor_alloc3(&y, FS_F64, 2, 1, 2, NULL);
    fs_tensor_alloc2(&sc, FS_F64, 2, 2, NULL);
    fs_tensor_alloc2(&sh, FS_F64, 2, 2, NULL);
    fs_tensor_alloc2(&g, FS_F64, 2, 2, NULL);
    const double xv[4] = {1, 2, 3, 4}, scv[4] = {0.5, -1, 0, 2}, shv[4] = {10, 20, 30, 40}, gv[4] = {1, 2, 3, 4};
    for (int i = 0; i < 4; i++) {
        fs_tensor_set(&x, i, xv[i]);
        fs_tensor_set(&sc, i, scv[i]);
        fs_tensor_set(&sh, i, shv[i]);
        fs_tensor_set(&g, i, gv[i]);
    }
    assert_int_equal(be->modulate(be, &y, &x, &sc, &sh, NULL), 0);
    const double want[4] = {1 * 1.5 + 10, 2 * 0 + 20, 3 * 1 + 30, 4 * 3 + 40};
    for (int i = 0; i < 4; i++) close_to(fs_tensor_get(&y, i), want[i], 0, "modulate");
    assert_int_equal(be->gated_add(be, &x, &g, &y, NULL), 0);
    for (int i = 0; i < 4; i++) close_to(fs_tensor_get(&x, i), xv[i] + gv[i] * want[i], 0, "gated_add");
    fs_tensor_free(&x);
    fs_tensor_free(&y);
    fs_tensor_free(&sc);
    fs_tensor_free(&sh);
    fs_tensor_free(&g);
}

static void test_mul(void **s)
{
    /* y = x·z element-wise (FLUX.2's SwiGLU); bf16: the exact product rounded once */
    fs_tensor x, z, y, xb, zb, yb;
    fs_tensor_alloc2(&x, FS_F64, 2, 3, NULL);
    fs_tensor_alloc2(&z, FS_F64, 2, 3, NULL);
    fs_tensor_alloc2(&y, FS_F64, 2, 3, NULL);
    const double xv[6] = {1.5, -2, 3, 0.1, 1.0 / 3, -7}, zv[6] = {2, 0.25, -1, 10, 3, 1.0 + 1.0 / 128};
    for (int i = 0; i < 6; i++) {
        fs_tensor_set(&x, i, xv[i]);
        fs_tensor_set(&z, i, zv[i]);
    }
    assert_int_equal(be->mul(be, &y, &x, &z, NULL), 0);
    for (int i = 0; i < 6; i++) close_to(fs_tensor_get(&y, i), xv[i] * zv[i], 0, "mul f64");
    fs_tensor_alloc2(&xb, FS_BF16, 2, 3, NULL);
    fs_tensor_alloc2(&zb, FS_BF16, 2, 3, NULL);
    fs_tensor_alloc2(&yb, FS_BF16, 2, 3, NULL);
    for (int i = 0; i < 6; i++) {
        fs_tensor_set(&xb, i, xv[i]);
        fs_tensor_set(&zb, i, zv[i]);
    }
    assert_int_equal(be->mul(be, &yb, &xb, &zb, NULL), 0);
    for (int i = 0; i < 6; i++) {
        const double want = fs_bf16_round((float)(fs_tensor_get(&xb, i) * fs_tensor_get(&zb, i)));
        close_to(fs_tensor_get(&yb, i), want, 0, "mul bf16");
    }
    /* -7 · (1 + 1/128) = -7.0546875 needs 10 significant bits: rounded to bf16's 8 */
    assert_true(fs_tensor_get(&yb, 5) != -7.0546875);
    fs_tensor *all[] = {&x, &z, &y, &xb, &zb, &yb};
    for (int i = 0; i < 6; i++) fs_tensor_free(all[i]);
}

/* ---- embeddings ---- */

static void test_sinusoid_layout(void **s)
{
    /* [cos | sin], freq_j = exp(-ln(1e4)·j/128) (divisor 128, not 127) */
    double t[2] = {1000.0, 3500.0};
    fs_tensor out;
    assert_int_equal(fs_time_proj(FS_F64, t, 2, &out, NULL), 0);
    assert_int_equal(out.shape[1], 256);
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 128; j += 31) {
            double a = t[b] * exp(-log(10000.0) * j / 128.0);
            close_to(fs_tensor_get(&out, b * 256 + j), cos(a), 1e-12, "time_proj cos half");
            close_to(fs_tensor_get(&out, b * 256 + 128 + j), sin(a), 1e-12, "time_proj sin half");
        }
    close_to(fs_tensor_get(&out, 0), cos(1000.0), 1e-12, "time_proj[0] = cos(t)");
    close_to(fs_tensor_get(&out, 128), sin(1000.0), 1e-12, "time_proj[128] = sin(t)");
    fs_tensor_free(&out);
    /* fp32 follows diffusers' float32 arithmetic: within ~1e-4 absolute of the exact value at t=3500 */
    fs_tensor o32;
    assert_int_equal(fs_time_proj(FS_F32, t, 2, &o32, NULL), 0);
    for (int j = 0; j < 128; j++) {
        double a = 3500.0 * exp(-log(10000.0) * j / 128.0);
        close_to(fs_tensor_get(&o32, 256 + j), cos(a), 5e-4, "fp32 time_proj");
    }
    fs_tensor_free(&o32);
}

static void test_rope_tables_axes(void **s)
{
    /* axes (8,12,12), Dh 32: dims 0-7 follow ids[:,0], 8-19 ids[:,1] (row), 20-31 ids[:,2] (col),
     * each table repeat_interleave'd: entries 2j and 2j+1 equal */
    fs_config c;
    fs_config_preset(&c, "tiny", NULL);
    fs_tensor ids, cs, sn;
    fs_tensor_alloc2(&ids, FS_F64, 2, 3, NULL);
    const double id[6] = {0, 0, 0, 5, 3, 7};
    for (int i = 0; i < 6; i++) fs_tensor_set(&ids, i, id[i]);
    assert_int_equal(fs_pos_embed(FS_F64, &c, &ids, &cs, &sn, NULL), 0);
    for (int d = 0; d < 32; d++) { /* text-like token: ids 0 → identity rotation */
        close_to(fs_tensor_get(&cs, d), 1.0, 0, "cos at pos 0");
        close_to(fs_tensor_get(&sn, d), 0.0, 0, "sin at pos 0");
    }
    const int width[3] = {8, 12, 12}, start[3] = {0, 8, 20};
    for (int ax = 0; ax < 3; ax++)
        for (int j = 0; j < width[ax] / 2; j++) {
            double ang = id[3 + ax] / pow(10000.0, 2.0 * j / width[ax]);
            for (int r = 0; r < 2; r++) {
                int d = start[ax] + 2 * j + r;
                close_to(fs_tensor_get(&cs, 32 + d), cos(ang), 1e-15, "rope cos table");
                close_to(fs_tensor_get(&sn, 32 + d), sin(ang), 1e-15, "rope sin table");
            }
        }
    fs_tensor_free(&cs);
    fs_tensor_free(&sn);
    fs_tensor_free(&ids);
}

static void test_rope_adjacent_pairs(void **s)
{
    /* x [1, 1, H=1, Dh=4]; rotation of (x0,x1) by θ0 and (x2,x3) by θ1 as complex numbers
     * (real = even, imag = odd): out = (x0 cosθ - x1 sinθ, x1 cosθ + x0 sinθ) */
    fs_tensor x, cs, sn;
    int64_t s4[4] = {1, 1, 1, 4};
    fs_tensor_alloc(&x, FS_F64, 4, s4, NULL);
    fs_tensor_alloc2(&cs, FS_F64, 1, 4, NULL);
    fs_tensor_alloc2(&sn, FS_F64, 1, 4, NULL);
    const double xv[4] = {1, 2, 3, 4}, th[2] = {0.3, -1.1};
    for (int i = 0; i < 4; i++) {
        fs_tensor_set(&x, i, xv[i]);
        fs_tensor_set(&cs, i, cos(th[i / 2]));
        fs_tensor_set(&sn, i, sin(th[i / 2]));
    }
    assert_int_equal(be->rope(be, &x, &cs, &sn, NULL), 0);
    for (int j = 0; j < 2; j++) {
        double re = xv[2 * j], im = xv[2 * j + 1];
        close_to(fs_tensor_get(&x, 2 * j), re * cos(th[j]) - im * sin(th[j]), 1e-15, "rope even");
        close_to(fs_tensor_get(&x, 2 * j + 1), im * cos(th[j]) + re * sin(th[j]), 1e-15, "rope odd");
    }
    fs_tensor_free(&x);
    fs_tensor_free(&cs);
    fs_tensor_free(&sn);
}

/* ---- attention: blocked GEMM + softmax vs a naive triple loop ---- */

/* ---- the bf16 gemm (nn.Linear): float64 reference, a bound for any summation order ----
 * The contract (fs_backend.h): exact bf16 products summed in float32 in some order, + bias in
 * float32, one rounding to bf16. With u = 2^-24, the float32 sum of n = K (+1 with the bias)
 * terms is within γ_n·Σ|terms| of the exact sum y (γ_n = n·u/(1 − n·u)), whatever the order, and
 * the rounding to bf16 (RNE, unit 2^-8) adds at most 2^-8·|ŝ| ≤ 2^-8·(|y| + γ_n·Σ|terms|): half a
 * bf16 ulp of the result. Both paths are checked: the backend's op (oneDNN where the CPU has
 * bf16 dot products, else widen + sgemm) and oneDNN directly (its own fallback elsewhere). */
static long mism, total; /* elements where the result and an in-order float32 sum round apart */
static void gemm_bf16_case(int64_t M, int64_t N, int64_t K, int with_bias, int64_t lda, int64_t ldw, int64_t ldc,
                           int direct)
{
    uint16_t *A = malloc(sizeof(uint16_t) * (size_t)(M * lda)), *W = malloc(sizeof(uint16_t) * (size_t)(N * ldw)),
             *b = malloc(sizeof(uint16_t) * (size_t)N), *C = malloc(sizeof(uint16_t) * (size_t)(M * ldc));
    assert_non_null(A); assert_non_null(W); assert_non_null(b); assert_non_null(C);
    const uint64_t key = fs_rng_key((uint64_t)(M * 1000003 + N * 1009 + K), "gemm_bf16");
    for (int64_t i = 0; i < M * lda; i++) A[i] = fs_bf16_from_float((float)fs_rng_normal(key, (uint64_t)i));
    for (int64_t i = 0; i < N * ldw; i++) W[i] = fs_bf16_from_float((float)(0.05 * fs_rng_normal(key, (uint64_t)(1u << 30) + (uint64_t)i)));
    for (int64_t i = 0; i < N; i++) b[i] = fs_bf16_from_float((float)fs_rng_normal(key, (uint64_t)(3u << 29) + (uint64_t)i));
    for (int64_t i = 0; i < M * ldc; i++) C[i] = 0x7FBF; /* a NaN sentinel: padding must stay untouched */
    fs_err e = {0};
    const int rc = direct ? fs_gemm_bf16_onednn(M, N, K, A, lda, W, ldw, with_bias ? b : NULL, C, ldc, &e)
                          : be->gemm(be, FS_BF16, M, N, K, A, lda, W, ldw, with_bias ? b : NULL, C, ldc, &e);
    if (rc) fail_msg("gemm bf16 %lldx%lldx%lld: %s", (long long)M, (long long)N, (long long)K, e.msg);
    const double u = ldexp(1.0, -24), n = (double)(K + (with_bias ? 1 : 0)), gam = n * u / (1 - n * u);
    double worst = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < ldc; j++) {
            if (j >= N) {
                if (C[m * ldc + j] != 0x7FBF) fail_msg("gemm bf16: C[%lld][%lld] beyond N written", (long long)m, (long long)j);
                continue;
            }
            double y = with_bias ? fs_bf16_to_float(b[j]) : 0, sa = with_bias ? fabs(y) : 0;
            float f = 0; /* float32, in order, + bias last: the sgemm path's contract */
            for (int64_t k = 0; k < K; k++) {
                const double t = (double)fs_bf16_to_float(A[m * lda + k]) * fs_bf16_to_float(W[j * ldw + k]);
                y += t;
                sa += fabs(t);
                f += fs_bf16_to_float(A[m * lda + k]) * fs_bf16_to_float(W[j * ldw + k]);
            }
            if (with_bias) f += fs_bf16_to_float(b[j]);
            /* against a float32 sum in another order: equal, or one bf16 ulp apart (adjacent) */
            const int d = abs((int)(int16_t)C[m * ldc + j] - (int)(int16_t)fs_bf16_from_float(f));
            if (d > 1) fail_msg("gemm bf16 %lldx%lldx%lld: C[%lld][%lld] %d bf16 ulps from a float32 sum", (long long)M,
                                (long long)N, (long long)K, (long long)m, (long long)j, d);
            mism += d != 0;
            total++;
            const double got = fs_bf16_to_float(C[m * ldc + j]), g = gam * sa, bound = g + ldexp(fabs(y) + g, -8);
            if (!(fabs(got - y) <= bound))
                fail_msg("gemm bf16 %s %lldx%lldx%lld bias %d: C[%lld][%lld] = %.9g, exact %.17g, |err| %.3g > bound %.3g",
                         direct ? "oneDNN" : "op", (long long)M, (long long)N, (long long)K, with_bias, (long long)m,
                         (long long)j, got, y, fabs(got - y), bound);
            if (bound > 0 && fabs(got - y) / bound > worst) worst = fabs(got - y) / bound;
        }
    assert_true(worst <= 1.0);
    free(A); free(W); free(b); free(C);
}

static void test_gemm_bf16_bound(void **s)
{
    static const int64_t Ks[] = {1, 5, 17, 3085};
    static const int64_t MN[][2] = {{1, 1}, {1, 37}, {3, 7}, {17, 33}, {37, 19}, {70, 130}};
    for (int direct = 0; direct < 2; direct++)
        for (size_t ki = 0; ki < FS_ARRAY_LEN(Ks); ki++)
            for (size_t si = 0; si < FS_ARRAY_LEN(MN); si++)
                for (int bias = 0; bias < 2; bias++) {
                    const int64_t M = MN[si][0], N = MN[si][1], K = Ks[ki];
                    gemm_bf16_case(M, N, K, bias, K, K, N, direct);                 /* dense */
                    gemm_bf16_case(M, N, K, bias, K + 3, K + 8, N + 5, direct);     /* lda, ldw > K; ldc > N */
                }
    print_message("bf16 gemm path: %s; %ld of %ld results one bf16 ulp from an in-order float32 sum\n",
                  fs_gemm_describe(), mism, total);
    assert_true(mism * 20 <= total); /* a summation order, not a different rounding: rare */
}

static void naive_attention(const fs_tensor *q, const fs_tensor *k, const fs_tensor *v, double *out, double *lse)
{
    int64_t B = q->shape[0], Sq = q->shape[1], H = q->shape[2], Dh = q->shape[3], Skv = k->shape[1];
    double *p = malloc(sizeof(double) * (size_t)Skv);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < Skv; j++) {
                    double d = 0;
                    for (int64_t c = 0; c < Dh; c++)
                        d += fs_tensor_get(q, ((b * Sq + i) * H + h) * Dh + c) * fs_tensor_get(k, ((b * Skv + j) * H + h) * Dh + c);
                    p[j] = d / sqrt((double)Dh);
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = 0; j < Skv; j++) sum += (p[j] = exp(p[j] - mx));
                lse[(b * H + h) * Sq + i] = mx + log(sum);
                for (int64_t c = 0; c < Dh; c++) {
                    double o = 0;
                    for (int64_t j = 0; j < Skv; j++) o += p[j] / sum * fs_tensor_get(v, ((b * Skv + j) * H + h) * Dh + c);
                    out[((b * Sq + i) * H + h) * Dh + c] = o;
                }
            }
    free(p);
}

/* Attention against the naive loop, with its LSE read in the layout the backend declares
 * (both layouts: the kernel indexes (b, h, s) explicitly), and lse_convert back to [B,H,S]. */
static void attention_case(fs_dtype dt, int64_t B, int64_t Sq, int64_t Skv, int64_t H, int64_t Dh, double tol)
{
    int64_t sq[4] = {B, Sq, H, Dh}, skv[4] = {B, Skv, H, Dh}, sl[3] = {B, H, Sq};
    fs_tensor q, k, v, o, lse, bhs;
    fs_tensor_alloc(&q, dt, 4, sq, NULL);
    fs_tensor_alloc(&k, dt, 4, skv, NULL);
    fs_tensor_alloc(&v, dt, 4, skv, NULL);
    fs_tensor_alloc(&o, dt, 4, sq, NULL);
    fs_tensor_alloc(&lse, dt, 3, sl, NULL);
    fs_tensor_alloc(&bhs, dt, 3, sl, NULL);
    fill(&q, 1);
    fill(&k, 2);
    fill(&v, 3);
    double *ro = malloc(sizeof(double) * (size_t)fs_tensor_numel(&o)), *rl = malloc(sizeof(double) * (size_t)(B * H * Sq));
    naive_attention(&q, &k, &v, ro, rl);
    const fs_lse_layout saved = be->lse_layout;
    for (int lay = 0; lay < 2; lay++) {
        be->lse_layout = lay ? FS_LSE_BSH : FS_LSE_BHS;
        assert_int_equal(be->attention(be, &o, &lse, &q, &k, &v, 1.0 / sqrt((double)Dh), NULL), 0);
        for (int64_t i = 0; i < fs_tensor_numel(&o); i++) close_to(fs_tensor_get(&o, i), ro[i], tol, "attention out");
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < Sq; i++)
                    close_to(fs_tensor_get(&lse, lay ? (b * Sq + i) * H + h : (b * H + h) * Sq + i), rl[(b * H + h) * Sq + i],
                             tol, lay ? "attention lse [B,S,H]" : "attention lse [B,H,S]");
        assert_int_equal(be->lse_convert(be, &bhs, FS_LSE_BHS, &lse, be->lse_layout, B, H, Sq, NULL), 0);
        for (int64_t i = 0; i < B * H * Sq; i++) close_to(fs_tensor_get(&bhs, i), rl[i], tol, "lse_convert to [B,H,S]");
    }
    be->lse_layout = saved;
    free(ro);
    free(rl);
    fs_tensor_free(&q);
    fs_tensor_free(&k);
    fs_tensor_free(&v);
    fs_tensor_free(&o);
    fs_tensor_free(&lse);
    fs_tensor_free(&bhs);
}

static void test_attention_vs_naive(void **s)
{
    attention_case(FS_F64, 2, 7, 7, 3, 8, 1e-12);
    attention_case(FS_F64, 1, 300, 170, 2, 16, 1e-12); /* > one 256-row query block, Sq != Skv */
    attention_case(FS_F32, 1, 129, 129, 2, 16, 2e-5);
    attention_case(FS_F32, 2, 300, 13, 3, 8, 2e-5); /* > one query block, keys fewer than 8 + a padded step */
    attention_case(FS_F32, 1, 5, 5, 1, 4, 2e-5);
    /* float32 is fused: keys in tiles of at most FS_ATTN_KB (512), balanced, the running max and
     * sum rescaled where the max moves; 513 keys = 2 tiles of 272 + 241, 1100 = 3 of 368 + the rest */
    attention_case(FS_F32, 1, 40, 513, 2, 16, 2e-5);
    attention_case(FS_F32, 2, 260, 1100, 3, 8, 2e-5);
}

/* ---- AdaLN chunk orders, through the real forward ----
 * Zero every AdaLN weight and set its bias so chunk k holds the constant k+1 (k+1 = 1..6, or
 * 1..2 for norm_out): then the recorded tuple elements must be exactly those constants, in
 * diffusers' order, and norm_out must be LN(x)·(1 + 1) + 2 (scale FIRST, then shift). */
typedef struct grab {
    const char *names[8];
    fs_tensor got[8];
    int n;
} grab;

static int grab_record(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e)
{
    grab *g = ctx;
    for (int i = 0; i < g->n; i++)
        if (!strcmp(name, g->names[i]) && !g->got[i].data) {
            fs_tensor_alloc(&g->got[i], t->dtype, t->ndim, t->shape, NULL);
            if (fs_tensor_download(&g->got[i], t, e)) return e->code;
        }
    return FS_OK;
}

static void set_adaln(fs_weights *w, const char *name, int nchunks, int D)
{
    char wn[160], bn[160];
    snprintf(wn, sizeof wn, "%s.weight", name);
    snprintf(bn, sizeof bn, "%s.bias", name);
    fs_tensor *W = (fs_tensor *)fs_weights_get(w, wn), *b = (fs_tensor *)fs_weights_get(w, bn);
    assert_non_null(W);
    memset(W->data, 0, fs_tensor_nbytes(W));
    for (int k = 0; k < nchunks; k++)
        for (int d = 0; d < D; d++) fs_tensor_set(b, k * D + d, k + 1);
}

static void test_adaln_chunk_orders(void **s)
{
    fs_config c;
    fs_config_preset(&c, "tiny", NULL);
    c.num_layers = 1;
    c.num_single_layers = 1;
    const int D = fs_config_hidden(&c);
    fs_weights w;
    assert_int_equal(fs_weights_synthetic(&w, &c, FS_F64, 7, NULL), 0);
    set_adaln(&w, "transformer_blocks.0.norm1.linear", 6, D);
    set_adaln(&w, "single_transformer_blocks.0.norm.linear", 3, D);
    set_adaln(&w, "norm_out.linear", 2, D);
    fs_gen_params gp = {.seed = 1, .batch = 1, .grid_h = 2, .grid_w = 3, .txt_len = 4, .steps = 1, .guidance = 3.5};
    fs_sched_preset(&gp.sched, "dev", NULL);
    fs_inputs in;
    assert_int_equal(fs_inputs_generate(&in, &c, FS_F64, &gp, NULL), 0);
    grab g = {.names = {"transformer_blocks.0.norm1#1", "transformer_blocks.0.norm1#2", "transformer_blocks.0.norm1#3",
                        "transformer_blocks.0.norm1#4", "single_transformer_blocks.0.norm#1", "norm_out.norm",
                        "norm_out"},
              .n = 7};
    fs_model m = {.cfg = c, .dtype = FS_F64, .w = &w, .be = be, .rec = {grab_record, &g}};
    fs_tensor lat;
    fs_err e = {0};
    assert_int_equal(fs_sample(&m, &in, NULL, &lat, &e), 0);
    /* AdaLayerNormZero returns (x, gate_msa=chunk 2, shift_mlp=3, scale_mlp=4, gate_mlp=5) → constants 3,4,5,6 */
    for (int k = 0; k < 4; k++)
        for (int d = 0; d < D; d++) close_to(fs_tensor_get(&g.got[k], d), k + 3, 0, "norm1 tuple order");
    /* AdaLayerNormZeroSingle returns (x, gate = chunk 2) → 3 */
    for (int d = 0; d < D; d++) close_to(fs_tensor_get(&g.got[4], d), 3, 0, "single norm gate");
    /* norm_out: (scale, shift) = (1, 2) → LN(x)·2 + 2 */
    for (int64_t i = 0; i < fs_tensor_numel(&g.got[6]); i++)
        close_to(fs_tensor_get(&g.got[6], i), fs_tensor_get(&g.got[5], i) * 2 + 2, 1e-14, "norm_out scale-first");
    for (int i = 0; i < g.n; i++) fs_tensor_free(&g.got[i]);
    fs_tensor_free(&lat);
    fs_inputs_free(&in);
    fs_weights_free(&w);
}

/* ---- scheduler (spec §8) ---- */

static void sigmas_case(const char *sched, int N, int S_img, const double *want_t, const double *want_sigma)
{
    fs_sched_config sc;
    assert_int_equal(fs_sched_preset(&sc, sched, NULL), 0);
    double sig[64], ts[64];
    assert_int_equal(fs_sched_sigmas(&sc, N, S_img, FS_F32, sig, ts, NULL), 0);
    for (int i = 0; i < N; i++) {
        /* the spec prints 8 significant digits of float32 values: half an ulp of the print */
        close_to(ts[i], want_t[i], 6e-9, "timestep");
        close_to(sig[i], want_sigma ? want_sigma[i] : want_t[i], 6e-9, "sigma");
    }
    assert_true(sig[N] == 0.0);
}

static void test_sched_dev_28_1024(void **s)
{
    const double t[28] = {1.0,        0.98840863, 0.97622246, 0.96339440, 0.94987255, 0.93559891, 0.92050898,
                          0.90453076, 0.88758343, 0.86957592, 0.85040569, 0.82995641, 0.80809551, 0.78467160,
                          0.75951093, 0.73241282, 0.70314473, 0.67143482, 0.63696450, 0.59935671, 0.55816287,
                          0.51284415, 0.46274841, 0.40707844, 0.34484893, 0.27482799, 0.19545458, 0.10472090};
    double sg[28];
    memcpy(sg, t, sizeof sg);
    sg[23] = 0.40707842; /* spec: sigmas equal the timesteps except these two */
    sg[26] = 0.19545460;
    sigmas_case("dev", 28, 4096, t, sg);
}

static void test_sched_dev_4_256(void **s)
{
    const double t[4] = {1.0, 0.83182430, 0.62245935, 0.35466123};
    sigmas_case("dev", 4, 256, t, NULL);
}

static void test_sched_schnell_4(void **s)
{
    const double t[4] = {1.0, 0.75, 0.5, 0.25};
    sigmas_case("schnell", 4, 4096, t, NULL);
}

static void test_sched_reference_exact(void **s)
{
    /* Bit-exact against the float32 sigmas/timesteps diffusers stored in the reference dumps:
     * tiny (8x8 tokens, dev, mu 0.4675) and odd (3 steps, schnell). */
    fs_sched_config sc;
    fs_sched_preset(&sc, "dev", NULL);
    close_to(fs_sched_mu(&sc, 64), 0.4675, 1e-15, "mu at 64 tokens");
    const char *ref = fs_test_reference_dir();
    if (!ref) FS_SKIP_LOUDLY("../shared/reference not found (set FLUX_REFERENCE_DIR)");
    const struct { const char *cfg, *sched; int N, S_img; } cases[] = {{"tiny", "dev", 4, 64}, {"odd", "schnell", 3, 35}};
    for (int c = 0; c < 2; c++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s/dump_fp32.h5", ref, cases[c].cfg);
        fo_file *f;
        fs_err e = {0};
        if (fo_file_open(&f, path, &e)) fail_msg("%s", e.msg);
        fo_dataset sg = {0}, ts = {0};
        assert_int_equal(fo_dataset_read(f, "/inputs/sigmas", &sg, &e), 0);
        assert_int_equal(fo_dataset_read(f, "/inputs/timesteps", &ts, &e), 0);
        fs_sched_preset(&sc, cases[c].sched, NULL);
        double mysg[8], myts[8];
        assert_int_equal(fs_sched_sigmas(&sc, cases[c].N, cases[c].S_img, FS_F32, mysg, myts, NULL), 0);
        assert_int_equal(sg.numel, cases[c].N + 1);
        for (int i = 0; i <= cases[c].N; i++) close_to(mysg[i], sg.data[i], 0, "sigma == diffusers float32 sigma");
        for (int i = 0; i < cases[c].N; i++) close_to(myts[i], ts.data[i], 0, "timestep == diffusers float32 timestep");
        fo_dataset_free(&sg);
        fo_dataset_free(&ts);
        fo_file_close(f);
    }
}

/* ---- synthetic weights: counter-based, shard-addressable ---- */

static void test_synthetic_weights_addressable(void **s)
{
    fs_config c;
    fs_config_preset(&c, "tiny", NULL);
    fs_weights w;
    assert_int_equal(fs_weights_synthetic(&w, &c, FS_F64, 42, NULL), 0);
    int n;
    fs_param_desc *pd = fs_config_params(&c, &n);
    int i = fs_param_find(pd, n, "transformer_blocks.1.attn.to_q.weight");
    assert_true(i >= 0);
    const fs_tensor *t = fs_weights_get(&w, "transformer_blocks.1.attn.to_q.weight");
    /* any element can be generated alone, equal to the full tensor's */
    for (int64_t k = 0; k < fs_tensor_numel(t); k += 97)
        assert_true(fs_weights_synthetic_value(&pd[i], 42, k) == fs_tensor_get(t, k));
    /* magnitudes: Linear weight std ≈ 1/sqrt(in) */
    double s2 = 0;
    for (int64_t k = 0; k < fs_tensor_numel(t); k++) s2 += fs_tensor_get(t, k) * fs_tensor_get(t, k);
    close_to(sqrt(s2 / fs_tensor_numel(t)) * sqrt(128.0), 1.0, 0.05, "weight std * sqrt(in)");
    /* another seed gives other numbers */
    assert_true(fs_weights_synthetic_value(&pd[i], 43, 0) != fs_tensor_get(t, 0));
    free(pd);
    fs_weights_free(&w);
}

/* Rank t's synthetic shard of every plan-split Linear equals the same elements of the full
 * tensors cut by fs_weights_shard (colwise rows, rowwise columns, packed_rowwise column pairs). */
static void test_synthetic_shards_equal_slices(void **s)
{
    fs_config c;
    fs_config_preset(&c, "odd", NULL);
    fs_plan plan;
    assert_int_equal(fs_plan_parse(&plan, fs_plan_default_text(), "built-in", NULL), 0);
    for (int T = 2; T <= 3; T++)
        for (int t = 0; t < T; t++) {
            fs_weights a, b;
            fs_err e = {0};
            assert_int_equal(fs_weights_synthetic_shard(&a, &c, FS_F64, 5, &plan, T, t, NULL, &e), 0);
            assert_int_equal(fs_weights_synthetic(&b, &c, FS_F64, 5, &e), 0);
            assert_int_equal(fs_weights_shard(&b, &plan, T, t, NULL, &e), 0);
            int nsharded = 0;
            for (int i = 0; i < a.n; i++) {
                assert_int_equal(a.t[i].ndim, b.t[i].ndim);
                for (int d = 0; d < a.t[i].ndim; d++) assert_int_equal(a.t[i].shape[d], b.t[i].shape[d]);
                assert_memory_equal(a.t[i].data, b.t[i].data, fs_tensor_nbytes(&a.t[i]));
                nsharded += fs_tensor_numel(&a.t[i]) < a.desc[i].shape[0] * (a.desc[i].ndim == 2 ? a.desc[i].shape[1] : 1);
            }
            /* the plan really split something: q/k/v, MLPs, out projections */
            assert_true(nsharded > 20);
            const fs_tensor *po = fs_weights_get(&a, "single_transformer_blocks.0.proj_out.weight");
            assert_int_equal(po->shape[1], (96 + 384) / T); /* [attn cols | mlp cols] of rank t */
            fs_weights_free(&a);
            fs_weights_free(&b);
        }
    fs_plan_free(&plan);
}

static void test_config_errors(void **s)
{
    fs_config c;
    fs_err e = {0};
    assert_int_equal(fs_config_from_json(&c, "{not json", "x.json", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "x.json"));
    const char *bad_axes = "{\"in_channels\":16,\"num_layers\":1,\"num_single_layers\":1,\"attention_head_dim\":32,"
                           "\"num_attention_heads\":4,\"joint_attention_dim\":64,\"pooled_projection_dim\":32,"
                           "\"guidance_embeds\":true,\"axes_dims_rope\":[8,12,10]}";
    assert_int_equal(fs_config_from_json(&c, bad_axes, "y.json", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "axes_dims_rope"));
    assert_int_equal(fs_config_preset(&c, "flux-pro", &e), FS_E_INPUT);
    assert_int_equal(fs_config_preset(&c, "flux-dev", &e), 0);
    assert_int_equal(fs_config_hidden(&c), 3072);
    /* parameter count of FLUX.1-dev (spec §6: 11,901,408,320) */
    int n;
    fs_param_desc *pd = fs_config_params(&c, &n);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += pd[i].shape[0] * (pd[i].ndim == 2 ? pd[i].shape[1] : 1);
    assert_true(total == 11901408320LL);
    free(pd);
    fs_config_preset(&c, "flux-schnell", &e);
    pd = fs_config_params(&c, &n);
    total = 0;
    for (int i = 0; i < n; i++) total += pd[i].shape[0] * (pd[i].ndim == 2 ? pd[i].shape[1] : 1);
    assert_true(total == 11891178560LL);
    free(pd);
}

/* ---- the TP split owner (fs_tp_split_of): ranges tile each weight exactly once ---- */

static void tiling_case(const fs_plan *plan, const fs_config *c, const char *module, int64_t N, int64_t K, int T)
{
    unsigned char *cov = calloc((size_t)(N * K), 1);
    for (int t = 0; t < T; t++) {
        fs_tp_split sp;
        fs_err e = {0};
        assert_int_equal(fs_tp_split_of(plan, c, module, N, K, T, t, NULL, &sp, &e), 0);
        assert_true(sp.r0 >= 0 && sp.r1 <= N && sp.r0 <= sp.r1);
        for (int64_t r = sp.r0; r < sp.r1; r++)
            for (int i = 0; i < sp.nc; i++) {
                assert_true(sp.c[i][0] >= 0 && sp.c[i][1] <= K && sp.c[i][0] <= sp.c[i][1]);
                for (int64_t k = sp.c[i][0]; k < sp.c[i][1]; k++) cov[r * K + k]++;
            }
        /* what linear() needs: colwise shards the bias and never reduces, row-parallel reduces */
        assert_int_equal(sp.bias_sharded, sp.style == FS_TP_COLWISE && T > 1);
        assert_int_equal(sp.reduce, (sp.style == FS_TP_ROWWISE || sp.style == FS_TP_PACKED_ROWWISE) && T > 1);
    }
    /* split styles tile the weight exactly once; a replicated Linear is whole on every rank */
    fs_tp_split sp;
    fs_tp_split_of(plan, c, module, N, K, T, 0, NULL, &sp, NULL);
    const int want = sp.style == FS_TP_REPLICATE || T == 1 ? T : 1;
    for (int64_t i = 0; i < N * K; i++)
        if (cov[i] != want) fail_msg("%s over %d ranks: element (%lld, %lld) held %d times, want %d", module, T,
                                     (long long)(i / K), (long long)(i % K), cov[i], want);
    free(cov);
}

static void test_tp_split_tiles(void **s)
{
    fs_config c;
    fs_config_preset(&c, "flux-dev", NULL);
    fs_plan plan;
    assert_int_equal(fs_plan_parse(&plan, "m.col colwise\nm.row rowwise\nm.pack packed_rowwise 12,36\nm.rep replicate\n",
                                   "test plan", NULL), 0);
    for (int T = 1; T <= 4; T++) {
        tiling_case(&plan, &c, "m.col", 24, 10, T);
        tiling_case(&plan, &c, "m.row", 10, 24, T);
        tiling_case(&plan, &c, "m.pack", 5, 48, T);
        tiling_case(&plan, &c, "m.rep", 6, 7, T);
        tiling_case(&plan, &c, "not.in.plan", 6, 7, T);
    }
    /* uneven widths are refused, naming the module */
    fs_tp_split sp;
    fs_err e = {0};
    assert_int_equal(fs_tp_split_of(&plan, &c, "m.col", 10, 4, 3, 0, NULL, &sp, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "m.col"));
    assert_int_equal(fs_tp_split_of(&plan, &c, "m.row", 4, 10, 4, 1, NULL, &sp, &e), FS_E_INPUT);
    assert_int_equal(fs_tp_split_of(&plan, &c, "m.pack", 4, 48, 5, 0, NULL, &sp, &e), FS_E_INPUT); /* 12 % 5 */
    assert_int_equal(fs_tp_split_of(&plan, &c, "m.pack", 4, 50, 2, 0, NULL, &sp, &e), FS_E_INPUT); /* 12 + 36 != 50 */
    fs_plan_free(&plan);
    /* the built-in plan on FLUX.1-dev, TP 4, rank 2: the seed's proj_out columns */
    assert_int_equal(fs_plan_parse(&plan, fs_plan_default_text(), "built-in", NULL), 0);
    assert_int_equal(fs_tp_split_of(&plan, &c, "single_transformer_blocks.7.proj_out", 3072, 15360, 4, 2, NULL, &sp, &e), 0);
    assert_int_equal(sp.style, FS_TP_PACKED_ROWWISE);
    assert_int_equal(sp.nc, 2);
    assert_true(sp.c[0][0] == 1536 && sp.c[0][1] == 2304 && sp.c[1][0] == 3072 + 6144 && sp.c[1][1] == 3072 + 9216);
    assert_int_equal(fs_tp_split_of(&plan, &c, "transformer_blocks.0.attn.to_q", 3072, 3072, 4, 3, NULL, &sp, &e), 0);
    assert_true(sp.style == FS_TP_COLWISE && sp.r0 == 2304 && sp.r1 == 3072); /* heads 18..23 */
    assert_int_equal(fs_tp_split_of(&plan, &c, "transformer_blocks.0.norm1.linear", 18432, 3072, 4, 3, NULL, &sp, &e), 0);
    assert_true(sp.style == FS_TP_REPLICATE && sp.r1 == 18432 && sp.c[0][1] == 3072);
    /* --inject proj-out-contiguous re-creates the seed's slice: columns [3840t, 3840(t+1)) */
    fs_inject inj = {0};
    assert_int_equal(fs_inject_add(&inj, "proj-out-contiguous", NULL), 0);
    assert_int_equal(fs_tp_split_of(&plan, &c, "single_transformer_blocks.7.proj_out", 3072, 15360, 4, 2, &inj, &sp, &e), 0);
    assert_true(sp.nc == 1 && sp.c[0][0] == 7680 && sp.c[0][1] == 11520);
    fs_plan_free(&plan);
}

/* ---- cpu-strict: backend memory the host cannot touch ---- */

/* A host dereference of strict memory must fault: run it in a child and look at how it died. */
static void test_strict_host_access_faults(void **s)
{
    fs_backend *sb = fs_backend_cpu_strict();
    fs_tensor t;
    assert_int_equal(fs_tensor_alloc_on(&t, sb, FS_F32, 1, (int64_t[]){16}, NULL), 0);
    assert_true(fs_backend_strict_is_tagged(t.data));
    assert_false(fs_tensor_is_host(&t));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* cmocka catches SIGSEGV to report a failure: die of it instead */
        signal(SIGBUS, SIG_DFL);
        volatile float x = fs_tensor_get(&t, 3); /* a stray read, as a host loop would do */
        (void)x;
        _exit(0); /* not reached if the backend is strict */
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    assert_true(WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS);
    pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        memset(t.data, 0, 4); /* a stray write through libc */
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    /* host memory handed to a strict op (a missing upload) is refused, naming the op */
    fs_tensor h;
    fs_err e = {0};
    fs_tensor_alloc(&h, FS_F32, 1, (int64_t[]){16}, NULL);
    assert_int_equal(sb->silu(sb, &t, &h, &e), FS_E_INTERNAL);
    assert_non_null(strstr(e.msg, "silu"));
    assert_non_null(strstr(e.msg, "host memory"));
    /* through upload/download the values round-trip */
    for (int i = 0; i < 16; i++) fs_tensor_set(&h, i, i * 0.5);
    assert_int_equal(fs_tensor_upload(&t, &h, NULL), 0);
    assert_int_equal(sb->silu(sb, &t, &t, NULL), 0);
    fs_tensor back;
    assert_int_equal(fs_tensor_host_view(&t, &back, NULL), 0);
    assert_true(back.owns); /* a real download, not a view */
    for (int i = 0; i < 16; i++) close_to(fs_tensor_get(&back, i), (i * 0.5f) / (1 + expf(-i * 0.5f)), 1e-6, "strict silu");
    fs_tensor_free(&back);
    fs_tensor_free(&h);
    fs_tensor_free(&t);
}

/* The forward on cpu-strict equals the forward on the CPU backend bit for bit (same kernels;
 * only where memory lives differs), every recorded tensor included. */
typedef struct keep {
    int n;
    fs_tensor t[400];
} keep;
static int keep_record(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e)
{
    keep *k = ctx;
    if (k->n == 400) return fs_errf(e, FS_E_INTERNAL, "too many records");
    fs_tensor *d = &k->t[k->n++];
    if (fs_tensor_alloc(d, t->dtype, t->ndim, t->shape, e)) return e->code;
    return fs_tensor_download(d, t, e);
}

static void test_forward_strict_equals_cpu(void **s)
{
    fs_config c;
    fs_config_preset(&c, "tiny", NULL);
    fs_weights w, wb[2];
    fs_inputs in;
    fs_err e = {0};
    assert_int_equal(fs_weights_synthetic(&w, &c, FS_F32, 3, &e), 0);
    fs_gen_params gp = {.seed = 2, .batch = 2, .grid_h = 3, .grid_w = 5, .txt_len = 7, .steps = 2, .guidance = 3.5};
    fs_sched_preset(&gp.sched, "dev", NULL);
    assert_int_equal(fs_inputs_generate(&in, &c, FS_F32, &gp, &e), 0);
    keep *k = calloc(2, sizeof *k);
    fs_backend *bes[2] = {fs_backend_cpu(), fs_backend_cpu_strict()};
    fs_tensor lat[2];
    for (int b = 0; b < 2; b++) {
        assert_int_equal(fs_weights_on(&w, bes[b], &wb[b], &e), 0);
        fs_model m = {.cfg = c, .dtype = FS_F32, .w = &wb[b], .be = bes[b], .rec = {keep_record, &k[b]}};
        if (fs_sample(&m, &in, NULL, &lat[b], &e)) fail_msg("%s: %s", bes[b]->name, e.msg);
    }
    assert_int_equal(k[0].n, k[1].n);
    assert_true(k[0].n > 200);
    for (int i = 0; i < k[0].n; i++) {
        assert_int_equal(fs_tensor_nbytes(&k[0].t[i]), fs_tensor_nbytes(&k[1].t[i]));
        assert_memory_equal(k[0].t[i].data, k[1].t[i].data, fs_tensor_nbytes(&k[0].t[i]));
    }
    fs_tensor l1;
    assert_int_equal(fs_tensor_host_view(&lat[1], &l1, NULL), 0);
    assert_memory_equal(lat[0].data, l1.data, fs_tensor_nbytes(&l1));
    fs_tensor_free(&l1);
    for (int b = 0; b < 2; b++) {
        for (int i = 0; i < k[b].n; i++) fs_tensor_free(&k[b].t[i]);
        fs_tensor_free(&lat[b]);
        fs_weights_free(&wb[b]);
    }
    free(k);
    fs_inputs_free(&in);
    fs_weights_free(&w);
}

int main(void)
{
    be = fs_backend_cpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gelu_tanh),
        cmocka_unit_test(test_vmath_accuracy),
        cmocka_unit_test(test_vmath_softmax_rows),
        cmocka_unit_test(test_vmath_gelu),
        cmocka_unit_test(test_silu),
        cmocka_unit_test(test_layernorm_no_affine),
        cmocka_unit_test(test_rmsnorm_per_head),
        cmocka_unit_test(test_modulate_and_gate),
        cmocka_unit_test(test_mul),
        cmocka_unit_test(test_sinusoid_layout),
        cmocka_unit_test(test_rope_tables_axes),
        cmocka_unit_test(test_rope_adjacent_pairs),
        cmocka_unit_test(test_attention_vs_naive),
        cmocka_unit_test(test_gemm_bf16_bound),
        cmocka_unit_test(test_adaln_chunk_orders),
        cmocka_unit_test(test_sched_dev_28_1024),
        cmocka_unit_test(test_sched_dev_4_256),
        cmocka_unit_test(test_sched_schnell_4),
        cmocka_unit_test(test_sched_reference_exact),
        cmocka_unit_test(test_synthetic_weights_addressable),
        cmocka_unit_test(test_synthetic_shards_equal_slices),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_tp_split_tiles),
        cmocka_unit_test(test_strict_host_access_faults),
        cmocka_unit_test(test_forward_strict_equals_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
