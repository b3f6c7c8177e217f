/* test_oracle.c — the oracle's library pieces: tolerance rules, streaming metrics (equal to the
 * one-shot fo_compare whatever the block size), block-wise dataset reads, sharding maps, the
 * coordinate names, and fo_diff_run / fo_stats_run on the reference dumps (SKIPPED loudly
 * without ../shared/reference). The CLI end to end is tests/oracle_cli.sh. */
#include "test_util.h"

#include <math.h>

#include "fo_diff.h"

static void test_tolerance_rules(void **state)
{
    (void)state;
    fo_tolerance f32 = fo_tolerance_default("float32"), f64 = fo_tolerance_default("float64");
    assert_true(f64.rtol < f32.rtol && f64.mtol < f32.mtol && f64.atol < f32.atol);
    fo_tolerance unk = fo_tolerance_default("int8"), nul = fo_tolerance_default(NULL);
    assert_true(unk.rtol == f32.rtol && nul.mtol == f32.mtol);
    assert_true(fo_tolerance_default("bfloat16").rtol > fo_tolerance_default("float16").rtol);
    fo_tolerance lo = fo_tolerance_looser(f32, f64);
    assert_true(lo.rtol == f32.rtol && lo.atol == f32.atol && lo.mtol == f32.mtol);
    assert_true(fo_tolerance_looser(f32, (fo_tolerance){1e-9, 0, 0}).mtol == 0); /* disabled wins */

    fo_stats s = {0};
    s.rel_l2 = 1e-5, s.max_abs = 1e-3, s.max_abs_b = 10; /* max rel 1e-4 */
    assert_true(fo_tolerance_pass(&s, f32));
    s.max_abs = 1e-2; /* max rel 1e-3: a single bad element */
    assert_false(fo_tolerance_pass(&s, f32));
    /* {rtol, atol} literals (mtol 0) are exactly "rel_l2 <= rtol OR max_abs <= atol" */
    assert_true(fo_tolerance_pass(&s, (fo_tolerance){.rtol = 2e-4, .atol = 1e-6}));
    s.rel_l2 = 1e-3;
    assert_false(fo_tolerance_pass(&s, (fo_tolerance){.rtol = 2e-4, .atol = 1e-6}));
    assert_true(fo_tolerance_pass(&s, (fo_tolerance){.rtol = 2e-4, .atol = 1e-2}));
    s.rel_l2 = INFINITY; /* ||b|| = 0: only atol can pass it */
    assert_false(fo_tolerance_pass(&s, f32));
    s.rel_l2 = 0, s.max_abs = 0, s.n_nonfinite_mismatch = 1; /* NaN vs finite: always fails */
    assert_false(fo_tolerance_pass(&s, (fo_tolerance){1, 1, 1}));

    /* arbiter: B may be 2x as far from the truth as A, plus tol/10 */
    fo_stats a = {0}, b = {0};
    a.rel_l2 = 1e-5, a.max_abs = 1e-4, a.max_abs_b = 1;
    b.rel_l2 = 2.5e-5, b.max_abs = 2e-4, b.max_abs_b = 1;
    assert_true(fo_tolerance_pass_truth(&a, &b, 2, f32));  /* 2.5e-5 <= 2e-5 + 2e-5 */
    b.max_abs = 3e-4;                                       /* 3e-4 > 2e-4 + 5e-5 */
    assert_false(fo_tolerance_pass_truth(&a, &b, 2, f32));
    b.max_abs = 2e-4, b.rel_l2 = 5e-5;
    assert_false(fo_tolerance_pass_truth(&a, &b, 2, f32));
}

static double rnd(uint64_t *x)
{
    *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*x >> 11) / 9007199254740992.0 * 2 - 1;
}

static void test_streaming_equals_oneshot(void **state)
{
    (void)state;
    enum { N = 10007 };
    static double a[N], b[N];
    uint64_t seed = 1;
    for (int i = 0; i < N; i++) a[i] = rnd(&seed) * 3, b[i] = a[i] + 1e-6 * rnd(&seed);
    a[123] = NAN;
    b[4000] = INFINITY;
    a[5000] = a[5000] + 0.5; /* the argmax */
    fo_stats one;
    fo_compare(a, b, N, &one);
    const int64_t blocks[] = {1, 7, 1000, N};
    for (size_t k = 0; k < FS_ARRAY_LEN(blocks); k++) {
        fo_acc acc;
        fo_acc_init(&acc);
        for (int64_t o = 0; o < N; o += blocks[k]) fo_acc_add(&acc, a + o, b + o, o + blocks[k] > N ? N - o : blocks[k]);
        fo_stats s;
        fo_acc_finish(&acc, &s);
        assert_int_equal(s.n, one.n);
        assert_int_equal(s.n_finite, one.n_finite);
        assert_int_equal(s.argmax, 5000);
        assert_int_equal(s.argmax, one.argmax);
        assert_true(s.max_abs == one.max_abs && s.max_abs_a == one.max_abs_a && s.max_abs_b == one.max_abs_b);
        assert_true(fabs(s.rel_l2 - one.rel_l2) <= 1e-12 * one.rel_l2);
        assert_true(fabs(s.cosine - one.cosine) <= 1e-12);
        assert_int_equal(s.nan_a, 1);
        assert_int_equal(s.inf_b, 1);
        assert_int_equal(s.n_nonfinite_mismatch, 2);
        assert_int_equal(s.first_nonfinite, 123);
    }
    /* values whose squares overflow a double: long double sums keep them */
    double big_a[3] = {1e200, -1e200, 3e200}, big_b[3] = {1e200, -1e200, 3.3e200};
    fo_acc acc;
    fo_acc_init(&acc);
    fo_acc_add(&acc, big_a, big_b, 3);
    fo_stats s;
    fo_acc_finish(&acc, &s);
    assert_true(fabs(s.rel_l2 - 0.3 / sqrt(12.89)) < 1e-9);
    assert_true(fabs(fo_stats_max_rel(&s) - 0.3 / 3.3) < 1e-12);

    /* summary: mean/std merged across blocks equal the two-pass result */
    fo_summary sm;
    fo_summary_init(&sm);
    for (int64_t o = 0; o < N; o += 333) fo_summary_add(&sm, b + o, o + 333 > N ? N - o : 333);
    fo_summary_finish(&sm);
    double mean = 0, m2 = 0;
    int nf = 0;
    for (int i = 0; i < N; i++)
        if (isfinite(b[i])) mean += b[i], nf++;
    mean /= nf;
    for (int i = 0; i < N; i++)
        if (isfinite(b[i])) m2 += (b[i] - mean) * (b[i] - mean);
    assert_int_equal(sm.inf, 1);
    assert_int_equal(sm.first_nonfinite, 4000);
    assert_true(fabs(sm.mean - mean) < 1e-12 && fabs(sm.std - sqrt(m2 / nf)) < 1e-12);
}

static void test_shard_parse(void **state)
{
    (void)state;
    fs_err e = {0};
    fo_shard s;
    int found;
    const int64_t shape[3] = {1, 10, 8};
    const char *par = "{\"world\":2,\"mesh\":{\"tp\":2},\"sharding\":{"
                      "\"r\":\"replicated\","
                      "\"joint\":{\"dim\":-2,\"ranges\":[[[0,2],[5,7]],[[2,5],[7,10]]]},"
                      "\"two\":{\"dims\":[{\"dim\":1,\"ranges\":[[[0,5]],[[5,10]],[[0,5]],[[5,10]]]},"
                      "{\"dim\":2,\"ranges\":[[[0,4]],[[0,4]],[[4,8]],[[4,8]]]}]},"
                      "\"bad\":{\"dim\":1,\"ranges\":[[[0,11]]]}}}";
    assert_int_equal(fo_shard_parse(par, "nope", 3, shape, &s, &found, "x.h5", &e), 0);
    assert_int_equal(found, 0);
    assert_int_equal(fo_shard_parse(par, "r", 3, shape, &s, &found, "x.h5", &e), 0);
    assert_true(found && s.replicated);
    fo_shard_free(&s);
    assert_int_equal(fo_shard_parse(par, "joint", 3, shape, &s, &found, "x.h5", &e), 0);
    assert_true(found && s.naxes == 1 && s.axis[0] == 1);
    assert_true(fo_shard_owner(&s, 3, (int64_t[]){0, 6, 3}) == 1);
    assert_true(fo_shard_owner(&s, 3, (int64_t[]){0, 3, 3}) == 2);
    fo_shard_free(&s);
    assert_int_equal(fo_shard_parse(par, "two", 3, shape, &s, &found, "x.h5", &e), 0);
    assert_true(fo_shard_owner(&s, 3, (int64_t[]){0, 7, 6}) == 8); /* rank 3 */
    fo_shard_free(&s);
    assert_int_equal(fo_shard_parse(par, "bad", 3, shape, &s, &found, "x.h5", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "x.h5: sharding entry bad"));
    assert_int_equal(fo_shard_parse("{", "x", 3, shape, &s, &found, "y.h5", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "y.h5: attribute parallel is not valid JSON"));
}

static void test_describe_coords(void **state)
{
    (void)state;
    char buf[192];
    fo_describe_coords("/step_0000", "transformer_blocks.0.attn.to_q", 3, (int64_t[]){1, 64, 128},
                       (int64_t[]){0, 12, 70}, 1, 16, 64, 4, 32, buf, sizeof buf);
    assert_string_equal(buf, "batch 0, image token 12, channel 70 (head 2, dim 6)");
    fo_describe_coords("/step_0000", "single_transformer_blocks.0.attn.norm_q", 4, (int64_t[]){1, 80, 4, 32},
                       (int64_t[]){0, 20, 1, 3}, 1, 16, 64, 4, 32, buf, sizeof buf);
    assert_string_equal(buf, "batch 0, image token 4, head 1, channel 3");
    fo_describe_coords("/step_0000", "pos_embed#0", 2, (int64_t[]){80, 32}, (int64_t[]){5, 1}, 1, 16, 64, 4, 32, buf,
                       sizeof buf);
    assert_string_equal(buf, "text token 5, channel 1");
    fo_describe_coords("/inputs", "img_ids", 2, (int64_t[]){64, 3}, (int64_t[]){5, 1}, 1, 16, 64, 4, 32, buf, sizeof buf);
    assert_string_equal(buf, "");
}

static int open_ref(fo_file **f, const char *cfg, const char *which)
{
    const char *dir = fs_test_reference_dir();
    if (!dir) return -1;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/%s", dir, cfg, which);
    fs_err e = {0};
    if (fo_file_open(f, p, &e)) fail_msg("%s", e.msg);
    return 0;
}

/* Block-wise reads reassemble the dataset exactly, for any block size, chunked (deflated) or not. */
static void test_stream_blocks(void **state)
{
    (void)state;
    fo_file *f;
    if (open_ref(&f, "tiny", "dump_fp32.h5")) FS_SKIP_LOUDLY("reference dumps not found");
    const char *paths[] = {"/step_0000/transformer_blocks.0.attn.norm_q", "/step_0000/proj_out", "/inputs/guidance",
                           "/step_0000/pos_embed#0"};
    fs_err e = {0};
    for (size_t k = 0; k < FS_ARRAY_LEN(paths); k++) {
        fo_dataset whole = {0};
        if (fo_dataset_read(f, paths[k], &whole, &e)) fail_msg("%s", e.msg);
        const int64_t blocks[] = {1, 5, 32, 100, 4096, 1 << 20};
        for (size_t b = 0; b < FS_ARRAY_LEN(blocks); b++) {
            fo_stream *s;
            fo_dataset info = {0};
            if (fo_stream_open(f, paths[k], blocks[b], &s, &info, &e)) fail_msg("%s", e.msg);
            assert_int_equal(info.numel, whole.numel);
            int64_t seen = 0;
            for (;;) {
                const double *x;
                int64_t off, n;
                if (fo_stream_next(s, &x, &off, &n, &e)) fail_msg("%s", e.msg);
                if (!n) break;
                assert_int_equal(off, seen);
                assert_true(n <= (blocks[b] > info.shape[info.ndim - 1] ? blocks[b] : info.shape[info.ndim - 1]));
                assert_memory_equal(x, whole.data + off, (size_t)n * sizeof *x);
                seen += n;
            }
            assert_int_equal(seen, whole.numel);
            fo_stream_close(s);
        }
        fo_dataset_free(&whole);
    }
    fo_stream *s;
    assert_int_equal(fo_stream_open(f, "/step_0000/nope", 10, &s, NULL, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "/step_0000/nope: no such dataset"));
    fo_file_close(f);
}

static void test_diff_reference(void **state)
{
    (void)state;
    fo_file *a, *b;
    if (open_ref(&a, "odd", "dump_fp32.h5")) FS_SKIP_LOUDLY("reference dumps not found");
    open_ref(&b, "odd", "dump_fp64.h5");
    fs_err e = {0};
    fo_report r;
    fo_diff_opts o = {.block_elems = 100}; /* small blocks: the lockstep path, not one read */
    if (fo_diff_run(a, b, NULL, &o, &r, &e)) fail_msg("%s", e.msg);
    assert_int_equal(r.nfail, 0);
    assert_int_equal(r.first, -1);
    assert_int_equal(r.only_a.n, 0);
    assert_int_equal(r.only_b.n, 0);
    assert_true(r.n > 100);
    assert_string_equal(r.v[0].group, "/inputs");
    assert_string_equal(r.v[r.n - 1].group, "/final");
    for (int i = 0; i < r.n; i++) assert_true(r.v[i].st.rel_l2 < 2e-5 && r.v[i].st.cosine > 0.9999999);
    /* execution order: the first step_0000 entry is latents_in */
    for (int i = 0; i < r.n; i++)
        if (r.v[i].step == 0) {
            assert_string_equal(r.v[i].name, "latents_in");
            break;
        }
    fo_report_free(&r);
    /* a file against itself: all zero, including with itself as the truth */
    if (fo_diff_run(a, a, b, &o, &r, &e)) fail_msg("%s", e.msg);
    assert_int_equal(r.nfail, 0);
    for (int i = 0; i < r.n; i++) assert_true(r.v[i].st.max_abs == 0 && r.v[i].has_truth);
    fo_report_free(&r);
    /* a far too tight tolerance: every float32-vs-float64 step dataset fails, the first is the
     * first one computed in float32 (the /inputs are equal or nearly so) */
    o.tol_given = 1;
    o.tol = (fo_tolerance){.rtol = 1e-12, .atol = 0, .mtol = 0};
    if (fo_diff_run(a, b, NULL, &o, &r, &e)) fail_msg("%s", e.msg);
    assert_true(r.first >= 0 && r.nfail > 100);
    assert_non_null(r.v[r.first].msg);
    fo_report_free(&r);

    fo_stat_report sr;
    if (fo_stats_run(a, 64, &sr, &e)) fail_msg("%s", e.msg);
    assert_int_equal(sr.first_nonfinite, -1);
    assert_true(sr.n > 100);
    for (int i = 0; i < sr.n; i++) assert_true(sr.v[i].s.min <= sr.v[i].s.mean && sr.v[i].s.mean <= sr.v[i].s.max);
    fo_stat_report_free(&sr);
    fo_file_close(a);
    fo_file_close(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tolerance_rules),   cmocka_unit_test(test_streaming_equals_oneshot),
        cmocka_unit_test(test_shard_parse),       cmocka_unit_test(test_describe_coords),
        cmocka_unit_test(test_stream_blocks),     cmocka_unit_test(test_diff_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
