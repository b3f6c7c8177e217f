/* test_rng.c — the fast synthetic-weight path is bit-identical to the definition.
 *
 * The definition is element-wise: fs_rng_normal (libm log/sqrt/sin/cos per element) and
 * fs_weights_synthetic_value. The fast path (fs_rng_fast.c: AVX2/AVX-512 transcription of
 * glibc's log and sincos; fs_weights_synth.c: vectorised scaling, threads) must give the same
 * bits for every element, at any offset and length (odd starts are the sin half of a pair, odd
 * ends the cos half), whatever the thread count. Comparisons are memcmp of the doubles/floats:
 * -0.0 vs +0.0 or one ulp anywhere fails. */
#include "test_util.h"

#include <math.h>
#include <omp.h>

#include "fs_config.h"
#include "fs_rng.h"
#include "fs_weights.h"

static int same_bits(const void *a, const void *b, size_t n) { return !memcmp(a, b, n); }

/* The kernels against scalar libm: the branch probes (every log interval, the near-1 band,
 * every sincos range, quadrant and table index) plus 2 M random uniform pairs. */
static void test_kernels_vs_libm(void **state)
{
    (void)state;
    uint64_t bad = 0;
    if (fs_rng_fast_check(2000000, 2024, &bad) != 0)
        FS_SKIP_LOUDLY("the vector RNG is not enabled on this machine (no AVX2+FMA, or glibc's sin/cos table not "
                       "found / self-test failed): fs_rng_normal_fill runs the libm path");
    fprintf(stderr, "    fast kernel %s: %llu mismatches in the probes + 2000000 random pairs\n", fs_rng_fast_isa(),
            (unsigned long long)bad);
    assert_int_equal(bad, 0);
}

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
    fprintf(stderr, "    %lld elements equal fs_rng_normal (kernel %s)\n", (long long)n, fs_rng_fast_isa());
    free(got);
    free(want);
}

/* fs_weights_synthetic_fill against fs_weights_synthetic_value, fp32 (cast) and fp64, for every
 * kind of parameter, at the start, in the middle (odd offset) and at the end of each tensor;
 * and the old scalar bulk path, and 1 vs 2 threads, on a whole tensor. */
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
    int64_t checked = 0;
    for (size_t i = 0; i < FS_ARRAY_LEN(names); i++) {
        int k = fs_param_find(p, np, names[i]);
        assert_true(k >= 0);
        const int64_t numel = p[k].shape[0] * (p[k].ndim == 2 ? p[k].shape[1] : 1);
        const int64_t len = numel < W ? numel : W;
        const int64_t starts[] = {0, numel / 2 - len / 2 + 1, numel - len};
        for (size_t s = 0; s < 3; s++) {
            const int64_t a = starts[s] < 0 ? 0 : starts[s], m = numel - a < len ? numel - a : len;
            fs_weights_synthetic_fill(&p[k], 77, a, m, FS_F32, f);
            fs_weights_synthetic_fill(&p[k], 77, a, m, FS_F64, d);
            for (int64_t j = 0; j < m; j++) {
                const double v = fs_weights_synthetic_value(&p[k], 77, a + j);
                const float vf = (float)v;
                if (!same_bits(&d[j], &v, sizeof v) || !same_bits(&f[j], &vf, sizeof vf))
                    fail_msg("%s element %lld: fill gives %a / %a (f32), fs_weights_synthetic_value %a", names[i],
                             (long long)(a + j), d[j], (double)f[j], v);
            }
            checked += m;
        }
    }
    fprintf(stderr, "    %lld elements equal fs_weights_synthetic_value (fp32 and fp64)\n", (long long)checked);

    /* a whole 3072x3072 weight: old scalar bulk path == new at 1 thread == new at 2 threads */
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
    fprintf(stderr, "    %s: old scalar path == new, 1 and 2 threads (%lld elements)\n", p[k].name, (long long)n);
    free(o);
    free(n1);
    free(n2);
    free(f);
    free(d);
    free(p);
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
        cmocka_unit_test(test_kernels_vs_libm),
        cmocka_unit_test(test_fill_vs_element),
        cmocka_unit_test(test_synthetic_fill_vs_value),
        cmocka_unit_test(test_comparison_can_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
