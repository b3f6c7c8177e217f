/* test_rng.c — fs_rng v2 (sim/base/fs_rng.h) and the synthetic weights built on it.
 *
 * The definition is element-wise and exact: fs_rng_normal (the scalar reference) and
 * fs_weights_synthetic_value. Checked here:
 *   - the vector path (fs_rng_normal_fill; fs_weights_synthetic_fill: vectorised scaling,
 *     threads) gives the scalar reference's bits for every element, at any offset and length (odd
 *     starts are the sin half of a pair, odd ends the cos half), at 1 and 2 threads;
 *   - pinned values: a silent change of the definition fails here;
 *   - tools/gen/fs_rng_ref.py, an independent numpy implementation of the definition, gives the same
 *     bits;
 *   - the pieces (ln, cos/sin of 2 pi u) are within a few ulp of libm's long double ones;
 *   - the normals look normal: mean, variance, kurtosis, Kolmogorov-Smirnov over 10^6 values.
 * Comparisons are memcmp of the doubles/floats: -0.0 vs +0.0 or one ulp anywhere fails. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <omp.h>

#include "fs_config.h"
#include "fs_rng.h"
#include "fs_weights.h"

static int same_bits(const void *a, const void *b, size_t n) { return !memcmp(a, b, n); }

/* fs_rng_normal_fill against fs_rng_normal element by element, odd offsets and lengths. */
static void test_fill_vs_element(void **state)
{
    (void)state;
    const uint64_t firsts[] = {0, 1, 2, 3, 5, 7, 8, 15, 17, 1000001, (1ULL << 40) + 3, (1ULL << 52) + 1};
    const int64_t lens[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 127, 129, 1000, 4099, 65537};
    double *got = malloc(65537 * sizeof *got), *want = malloc(65537 * sizeof *want);
    assert_non_null(got);
    assert_non_null(want);
    int64_t n = 0;
    for (int s = 0; s < 3; s++) {
        const uint64_t key = fs_rng_key((uint64_t)s * 7919, s == 2 ? "transformer_blocks.0.attn.to_q.weight" : "k");
        for (size_t i = 0; i < FS_ARRAY_LEN(firsts); i++)
            for (size_t j = 0; j < FS_ARRAY_LEN(lens); j++) {
                fs_rng_normal_fill(key, firsts[i], lens[j], got);
                for (int64_t k = 0; k < lens[j]; k++) want[k] = fs_rng_normal(key, firsts[i] + (uint64_t)k);
                if (!same_bits(got, want, (size_t)lens[j] * sizeof *got)) {
                    for (int64_t k = 0; k < lens[j]; k++)
                        if (!same_bits(&got[k], &want[k], sizeof *got))
                            fail_msg("key %d first %llu len %lld: element %lld is %a, fs_rng_normal says %a", s,
                                     (unsigned long long)firsts[i], (long long)lens[j], (long long)k, got[k], want[k]);
                }
                n += lens[j];
            }
    }
    fprintf(stderr, "    %lld elements equal fs_rng_normal (%s clone)\n", (long long)n, fs_rng_isa());
    free(got);
    free(want);
}

/* fs_weights_synthetic_fill against fs_weights_synthetic_value, fp32 (cast) and fp64, for every
 * kind of parameter, at the start, in the middle (odd offset) and at the end of each tensor;
 * and the scalar bulk reference, and 1 vs 2 threads, on a whole tensor. */
static void test_synthetic_fill_vs_value(void **state)
{
    (void)state;
    fs_config c;
    fs_err e = {0};
    assert_int_equal(fs_config_preset(&c, "flux-dev", &e), 0);
    c.num_layers = 1;
    c.num_single_layers = 1;
    int np = 0;
    fs_param_desc *p = fs_config_params(&c, &np);
    assert_non_null(p);
    const char *names[] = {"x_embedder.weight", "context_embedder.bias", "transformer_blocks.0.attn.norm_q.weight",
                           "transformer_blocks.0.ff.net.2.weight", "single_transformer_blocks.0.proj_out.weight",
                           "single_transformer_blocks.0.norm.linear.bias", "proj_out.weight"};
    enum { W = 40001 };
    float *f = malloc(W * sizeof *f);
    double *d = malloc(W * sizeof *d);
    uint16_t *h = malloc(W * sizeof *h);
    assert_non_null(h);
    int64_t checked = 0;
    for (size_t i = 0; i < FS_ARRAY_LEN(names); i++) {
        int k = fs_param_find(p, np, names[i]);
        assert_true(k >= 0);
        const int64_t numel = p[k].shape[0] * (p[k].ndim == 2 ? p[k].shape[1] : 1);
        const int64_t len = numel < W ? numel : W;
        const int64_t starts[] = {0, 1, numel / 2 - len / 2 + 1, numel / 2 - len / 2, numel - len};
        for (size_t s = 0; s < FS_ARRAY_LEN(starts); s++) {
            const int64_t a = starts[s] < 0 ? 0 : starts[s], m = numel - a < len ? numel - a : len;
            fs_weights_synthetic_fill(&p[k], 77, a, m, FS_F32, f);
            fs_weights_synthetic_fill(&p[k], 77, a, m, FS_F64, d);
            fs_weights_synthetic_fill(&p[k], 77, a, m, FS_BF16, h);
            for (int64_t j = 0; j < m; j++) {
                const double v = fs_weights_synthetic_value(&p[k], 77, a + j);
                const float vf = (float)v;
                const uint16_t vh = fs_bf16_from_float(vf);
                if (!same_bits(&d[j], &v, sizeof v) || !same_bits(&f[j], &vf, sizeof vf) || h[j] != vh)
                    fail_msg("%s element %lld: fill gives %a / %a (f32) / 0x%04x (bf16), fs_weights_synthetic_value %a",
                             names[i], (long long)(a + j), d[j], (double)f[j], h[j], v);
            }
            checked += m;
        }
    }
    fprintf(stderr, "    %lld elements equal fs_weights_synthetic_value (fp32, fp64 and bf16)\n", (long long)checked);

    /* a whole 3072x3072 weight: scalar reference == vector path at 1 thread == at 2 threads */
    const int k = fs_param_find(p, np, "single_transformer_blocks.0.attn.to_k.weight");
    const int64_t n = p[k].shape[0] * p[k].shape[1];
    float *o = malloc((size_t)n * sizeof *o), *n1 = malloc((size_t)n * sizeof *n1), *n2 = malloc((size_t)n * sizeof *n2);
    assert_non_null(o);
    assert_non_null(n1);
    assert_non_null(n2);
    fs_weights_synthetic_fill_scalar(&p[k], 5, 0, n, FS_F32, o);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    fs_weights_synthetic_fill(&p[k], 5, 0, n, FS_F32, n1);
    omp_set_num_threads(2);
    fs_weights_synthetic_fill(&p[k], 5, 0, n, FS_F32, n2);
    omp_set_num_threads(saved);
    assert_true(same_bits(o, n1, (size_t)n * sizeof *o));
    assert_true(same_bits(o, n2, (size_t)n * sizeof *o));
    fprintf(stderr, "    %s: scalar reference == vector path, 1 and 2 threads (%lld elements)\n", p[k].name, (long long)n);
    free(o);
    free(n1);
    free(n2);
    free(f);
    free(d);
    free(h);
    free(p);
}

/* Pinned values of the definition (fs_rng v2): any change to the hash, the uniforms, the log, the
 * sin/cos, their constants or operation order changes some of these bits. Computed by this
 * library and, independently, by tools/gen/fs_rng_ref.py (numpy) at the commit that introduced v2. */
static void test_pinned_values(void **state)
{
    (void)state;
    static const struct {
        uint64_t seed;
        const char *name;
        uint64_t index;
        uint64_t bits;
    } pin[] = {
        {0, "x", 0, 0x3ff2a563c9bf241fULL},
        {0, "x", 1, 0x3fcf0e524d21c1f4ULL},
        {0, "x", 2, 0x3fb7ca2aa01ece06ULL},
        {0, "x", 3, 0x3ff124c384f3f8acULL},
        {0, "x_embedder.weight", 1000001, 0xbff05b74e48d6784ULL},
        {1234, "transformer_blocks.7.attn.to_q.weight", (1ULL << 40) + 1, 0x3fd44dadbdaff659ULL},
        {18446744073709551615ULL, "w", 4503599627370497ULL, 0xbfc0a759adef0524ULL},
        {0, "inputs.hidden_states", 0, 0xbff8b0e504f557c9ULL},
        {0, "inputs.hidden_states", 1, 0x3fd36c0ba01e351aULL},
    };
    for (size_t i = 0; i < FS_ARRAY_LEN(pin); i++) {
        const double v = fs_rng_normal(fs_rng_key(pin[i].seed, pin[i].name), pin[i].index);
        double f;
        fs_rng_normal_fill(fs_rng_key(pin[i].seed, pin[i].name), pin[i].index, 1, &f);
        uint64_t b, bf;
        memcpy(&b, &v, 8);
        memcpy(&bf, &f, 8);
        fprintf(stderr, "    seed %llu %s [%llu] = %a (0x%016llx)\n", (unsigned long long)pin[i].seed, pin[i].name,
                (unsigned long long)pin[i].index, v, (unsigned long long)b);
        if (b != pin[i].bits || bf != pin[i].bits)
            fail_msg("seed %llu %s element %llu: 0x%016llx (fill 0x%016llx), pinned 0x%016llx — the definition of "
                     "fs_rng changed",
                     (unsigned long long)pin[i].seed, pin[i].name, (unsigned long long)pin[i].index,
                     (unsigned long long)b, (unsigned long long)bf, (unsigned long long)pin[i].bits);
    }
    /* one synthetic weight of each kind, fp64 */
    fs_config c;
    fs_err e = {0};
    assert_int_equal(fs_config_preset(&c, "flux-dev", &e), 0);
    int np = 0;
    fs_param_desc *p = fs_config_params(&c, &np);
    assert_non_null(p);
    static const struct {
        const char *name;
        int64_t index;
        uint64_t bits;
    } wpin[] = {
        {"proj_out.weight", 0, 0x3f8029989717154aULL},
        {"proj_out.bias", 3, 0x3fb75666155fe038ULL},
        {"single_transformer_blocks.37.attn.norm_k.weight", 127, 0x3fef52331fdf0f94ULL},
    };
    for (size_t i = 0; i < FS_ARRAY_LEN(wpin); i++) {
        const int k = fs_param_find(p, np, wpin[i].name);
        assert_true(k >= 0);
        const double v = fs_weights_synthetic_value(&p[k], 0, wpin[i].index);
        uint64_t b;
        memcpy(&b, &v, 8);
        fprintf(stderr, "    weight seed 0 %s [%lld] = %a (0x%016llx)\n", wpin[i].name, (long long)wpin[i].index, v,
                (unsigned long long)b);
        if (b != wpin[i].bits)
            fail_msg("%s element %lld: 0x%016llx, pinned 0x%016llx", wpin[i].name, (long long)wpin[i].index,
                     (unsigned long long)b, (unsigned long long)wpin[i].bits);
    }
    free(p);
}

/* tools/gen/fs_rng_ref.py (numpy, written from the definition in fs_rng.h) against this library, bit
 * for bit: normals at even and odd starts, large indices, extreme seeds; synthetic weights of the
 * three kinds. */
static const char *numpy_python(void) { return test_python("numpy"); }

static int64_t run_ref(const char *args, uint64_t *bits, int64_t max)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s tools/gen/fs_rng_ref.py %s", numpy_python(), args);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    int64_t n = 0;
    unsigned long long v;
    while (n < max && fscanf(f, "%llx", &v) == 1) bits[n++] = v;
    return pclose(f) == 0 ? n : -1;
}

static void test_python_reference(void **state)
{
    (void)state;
    if (!numpy_python()) FS_SKIP_LOUDLY("no python3 with numpy (tools/install-deps.sh installs it)");
    static const struct {
        uint64_t seed;
        const char *name;
        uint64_t first;
        int64_t count;
    } cases[] = {
        {0, "x", 0, 4096},
        {42, "transformer_blocks.3.ff.net.0.proj.weight", (1ULL << 33) + 1, 3001},
        {18446744073709551615ULL, "w", 4503599627370497ULL, 1000},
        {7, "inputs.latents", 12345, 999},
    };
    enum { MAXN = 4096 };
    uint64_t *py = malloc(MAXN * sizeof *py);
    double *c = malloc(MAXN * sizeof *c);
    assert_non_null(py);
    assert_non_null(c);
    int64_t total = 0;
    for (size_t i = 0; i < FS_ARRAY_LEN(cases); i++) {
        char args[256];
        snprintf(args, sizeof args, "--seed %llu --name %s --first %llu --count %lld", (unsigned long long)cases[i].seed,
                 cases[i].name, (unsigned long long)cases[i].first, (long long)cases[i].count);
        const int64_t n = run_ref(args, py, MAXN);
        if (n != cases[i].count) fail_msg("tools/gen/fs_rng_ref.py %s: got %lld values", args, (long long)n);
        fs_rng_normal_fill(fs_rng_key(cases[i].seed, cases[i].name), cases[i].first, n, c);
        for (int64_t j = 0; j < n; j++) {
            uint64_t b;
            memcpy(&b, &c[j], 8);
            if (b != py[j])
                fail_msg("%s: element %llu: C 0x%016llx, Python 0x%016llx", args,
                         (unsigned long long)(cases[i].first + (uint64_t)j), (unsigned long long)b,
                         (unsigned long long)py[j]);
        }
        total += n;
    }
    /* synthetic weights: fs_weights_synthetic_value against the script's --scale */
    fs_config cfg;
    fs_err e = {0};
    assert_int_equal(fs_config_preset(&cfg, "flux-dev", &e), 0);
    int np = 0;
    fs_param_desc *p = fs_config_params(&cfg, &np);
    assert_non_null(p);
    static const struct {
        const char *name, *scale;
    } w[] = {{"single_transformer_blocks.0.attn.to_k.weight", "linear:3072"},
             {"context_embedder.bias", "bias"},
             {"transformer_blocks.0.attn.norm_q.weight", "rms"}};
    for (size_t i = 0; i < FS_ARRAY_LEN(w); i++) {
        const int k = fs_param_find(p, np, w[i].name);
        assert_true(k >= 0);
        char args[256];
        snprintf(args, sizeof args, "--seed 5 --name %s --first 77 --count 100 --scale %s", w[i].name, w[i].scale);
        const int64_t n = run_ref(args, py, MAXN);
        assert_int_equal(n, 100);
        for (int64_t j = 0; j < n; j++) {
            const double v = fs_weights_synthetic_value(&p[k], 5, 77 + j);
            uint64_t b;
            memcpy(&b, &v, 8);
            if (b != py[j])
                fail_msg("%s element %lld: C 0x%016llx, Python 0x%016llx", w[i].name, (long long)(77 + j),
                         (unsigned long long)b, (unsigned long long)py[j]);
        }
        total += n;
    }
    fprintf(stderr, "    tools/gen/fs_rng_ref.py == C bit for bit: %lld values (normals and weights)\n", (long long)total);
    free(p);
    free(py);
    free(c);
}

/* |x - ref| in ulps of the double nearest ref */
static double ulps(double x, long double ref)
{
    int ex;
    const double r = (double)ref;
    if (r == 0) return (double)(fabsl((long double)x - ref) / 0x1p-1074L);
    frexp(r, &ex);
    return (double)(fabsl((long double)x - ref) / ldexpl(1.0L, ex - 53));
}

/* cos(2 pi u), sin(2 pi u) in long double to about 2^-63 relative, even near their zeros: u is
 * reduced exactly (r = u - q/4, |r| <= 1/8, exact in long double), then the quadrant rotation. */
static void ref_sincos2pi(double u, long double *c, long double *s)
{
    const long double two_pi = 6.283185307179586476925286766559005768L;
    const long double q = nearbyintl(4.0L * u), r = (long double)u - q / 4.0L;
    const long double ca = cosl(two_pi * r), sa = sinl(two_pi * r);
    switch ((int)q & 3) {
    case 0: *c = ca, *s = sa; break;
    case 1: *c = -sa, *s = ca; break;
    case 2: *c = -ca, *s = -sa; break;
    default: *c = sa, *s = -ca; break;
    }
}

/* The pieces against the x87 long double libm (64-bit significands, so the reference is the true
 * value to about 2^-10 ulp; sin/cos reduced exactly first, ref_sincos2pi), on the generator's own uniforms and on the edges: ln near 1 and at
 * 2^-54, sin/cos at and around the octant boundaries. Bound: 4 ulp (tools/bench_rng_accuracy
 * measures the maxima over 10^8 pairs; docs/scale.md quotes them). */
static void test_pieces_vs_libm(void **state)
{
    (void)state;
    const uint64_t key = fs_rng_key(3, "pieces");
    double wl = 0, wc = 0, ws = 0;
    enum { N = 200000 };
    for (int64_t i = 0; i < N + 64; i++) {
        double u0, u1;
        if (i < N) {
            u0 = fs_rng_uniform(key, (uint64_t)i, 0);
            u1 = fs_rng_uniform(key, (uint64_t)i, 1);
        } else { /* edges, in the uniforms' range [2^-54, 1 - 2^-54] */
            const int j = (int)(i - N);
            u0 = j < 32 ? 1.0 - ldexp(1.0, -54 + j / 2) * (1 + j % 2) : ldexp(1.0, -54 + (j - 32));
            /* k/8 (k = 0..7), and a few multiples of 2^-54 either side of it */
            const double d = ldexp((double)(1 + j / 16), -54) * ((j / 8) % 2 ? 1 : -1);
            u1 = (double)(j % 8) / 8.0 + (j < 8 ? 0.0 : d);
            if (u1 <= 0) u1 = ldexp(1.0, -54) * (1 + j / 8);
        }
        double c, s;
        fs_rng_sincos2pi(u1, &c, &s);
        long double cr, sr;
        ref_sincos2pi(u1, &cr, &sr);
        const double el = ulps(fs_rng_log(u0), logl(u0)), ec = ulps(c, cr), es = ulps(s, sr);
        if (el > wl) wl = el;
        if (ec > wc) wc = ec;
        if (es > ws) ws = es;
        if (el > 4 || ec > 4 || es > 4)
            fail_msg("u0 %a u1 %a: ln %.2f ulp, cos %.2f ulp, sin %.2f ulp (bound 4)", u0, u1, el, ec, es);
    }
    fprintf(stderr, "    worst over %d pairs + edges: ln %.3f ulp, cos(2 pi u) %.3f ulp, sin(2 pi u) %.3f ulp\n", N, wl,
            wc, ws);
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* 10^6 normals look standard normal. Each bound is 5 standard errors of the statistic for a
 * true N(0, 1) sample of n = 10^6 (a correct generator fails one with probability < 1e-6):
 * mean 1/sqrt(n) = 1e-3 -> 5e-3; variance sqrt(2/n) = 1.41e-3 -> 7.1e-3; excess kurtosis
 * sqrt(24/n) = 4.9e-3 -> 0.0245; and the Kolmogorov-Smirnov statistic sqrt(n) D, whose limit
 * law gives P(sqrt(n) D > 2.5) ~ 2 exp(-2 * 2.5^2) = 7.5e-6. The test is deterministic (a fixed
 * key): the bounds catch a broken transform (a wrong octant sign, a lost factor, a skewed log),
 * which moves these by far more. */
static void test_statistics(void **state)
{
    (void)state;
    enum { N = 1000000 };
    double *z = malloc(N * sizeof *z);
    assert_non_null(z);
    fs_rng_normal_fill(fs_rng_key(99, "statistics"), 0, N, z);
    double s1 = 0, s2 = 0, s4 = 0;
    for (int i = 0; i < N; i++) s1 += z[i];
    const double mean = s1 / N;
    for (int i = 0; i < N; i++) {
        const double d = z[i] - mean, d2 = d * d;
        s2 += d2;
        s4 += d2 * d2;
    }
    const double var = s2 / (N - 1), kurt = (s4 / N) / ((s2 / N) * (s2 / N)) - 3.0;
    qsort(z, N, sizeof *z, cmp_double);
    double D = 0;
    for (int i = 0; i < N; i++) {
        const double F = 0.5 * erfc(-z[i] / sqrt(2.0));
        const double a = fabs(F - (double)i / N), b = fabs((double)(i + 1) / N - F);
        if (a > D) D = a;
        if (b > D) D = b;
    }
    const double ks = sqrt((double)N) * D;
    fprintf(stderr, "    n = %d: mean %.2e, variance %.6f, excess kurtosis %.2e, KS sqrt(n) D = %.3f, min %.3f, max %.3f\n",
            N, mean, var, kurt, ks, z[0], z[N - 1]);
    assert_true(fabs(mean) < 5e-3);
    assert_true(fabs(var - 1.0) < 7.1e-3);
    assert_true(fabs(kurt) < 0.0245);
    assert_true(ks < 2.5);
    free(z);
}

/* The comparison above must be able to fail: one flipped mantissa bit is seen. */
static void test_comparison_can_fail(void **state)
{
    (void)state;
    double a[5], b[5];
    fs_rng_normal_fill(fs_rng_key(1, "x"), 3, 5, a);
    memcpy(b, a, sizeof a);
    uint64_t u;
    memcpy(&u, &b[2], 8);
    u ^= 1;
    memcpy(&b[2], &u, 8);
    assert_false(same_bits(a, b, sizeof a));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill_vs_element),
        cmocka_unit_test(test_synthetic_fill_vs_value),
        cmocka_unit_test(test_pinned_values),
        cmocka_unit_test(test_python_reference),
        cmocka_unit_test(test_pieces_vs_libm),
        cmocka_unit_test(test_statistics),
        cmocka_unit_test(test_comparison_can_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
