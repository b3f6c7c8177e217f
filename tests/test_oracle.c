/* test_oracle.c — the oracle's library pieces: tolerance rules, streaming metrics (equal to the
 * one-shot fo_compare whatever the block size), block-wise dataset reads, sharding maps, the
 * coordinate names, and fo_diff_run / fo_stats_run on the reference dumps (SKIPPED loudly
 * without ../shared/reference). The CLI end to end is tests/oracle_cli.sh. */
#include "test_util.h"

#include <cjson/cJSON.h>
#include <hdf5.h>
#include <math.h>
#include <omp.h>

#include "fo_config.h"
#include "fo_diff.h"
#include "fo_render.h"
#include "fo_walk.h"
#include "fs_h5err.h"

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
    assert_true(fo_tolerance_looser(f32, (fo_tolerance){.rtol = 1e-9}).mtol == 0); /* disabled wins */

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
    assert_false(fo_tolerance_pass(&s, (fo_tolerance){.rtol = 1, .atol = 1, .mtol = 1}));

    /* arbiter: B may be 2x as far from the truth as A, plus tol/10 */
    /* the candidate (cand) may be m times as far from the truth as the baseline (base), + tol/10 */
    fo_stats base = {0}, cand = {0};
    base.rel_l2 = 1e-5, base.max_abs = 1e-4, base.max_abs_b = 1;
    cand.rel_l2 = 2.5e-5, cand.max_abs = 2e-4, cand.max_abs_b = 1;
    f32.m_rel = f32.m_max = 2;
    assert_true(fo_tolerance_arbiter(&cand, &base, f32));  /* 2.5e-5 <= 2e-5 + 2e-5 */
    cand.max_abs = 3e-4;                                    /* 3e-4 > 2e-4 + 5e-5 */
    assert_false(fo_tolerance_arbiter(&cand, &base, f32));
    cand.max_abs = 2e-4, cand.rel_l2 = 5e-5;
    assert_false(fo_tolerance_arbiter(&cand, &base, f32));
    assert_false(fo_tolerance_arbiter(&base, &cand, f32) == 0); /* the roles are not symmetric */
    /* bfloat16: the measured multipliers, 2 on rel L2 and 3 on max rel */
    fo_tolerance bf = fo_tolerance_default("bfloat16");
    assert_true(bf.m_rel == 2 && bf.m_max == 3);
    base.rel_l2 = 8e-3, base.max_abs = 8e-3, base.max_abs_b = 1;
    cand.rel_l2 = 1.6e-2, cand.max_abs = 2.9e-2, cand.max_abs_b = 1; /* 2.9e-2 <= 3 x 8e-3 + 6e-3 */
    assert_true(fo_tolerance_arbiter(&cand, &base, bf));
    cand.max_abs = 3.1e-2;
    assert_false(fo_tolerance_arbiter(&cand, &base, bf));
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

/* fo_acc_add_view on float32/float64 views, any pairing, equals fo_compare on the values widened
 * to double: exactly for counts, maxima and argmax (first index on ties, even when the tie spans
 * sub-blocks and parallel parts), to rounding for the sums; with the AVX2 kernel and without,
 * and bit for bit the same whatever the thread count. fo_summary_add_view likewise equals a
 * two-pass mean/std. */
static void test_views_equal_widened(void **state)
{
    (void)state;
    enum { NV = 3 * 65536 + 4099 };
    float *af = malloc(NV * sizeof *af), *bf = malloc(NV * sizeof *bf);
    double *ad = malloc(NV * sizeof *ad), *bd = malloc(NV * sizeof *bd);
    assert_true(af && bf && ad && bd);
    uint64_t seed = 7;
    for (int i = 0; i < NV; i++) af[i] = (float)(rnd(&seed) * 3), bf[i] = af[i] + (float)(1e-4 * rnd(&seed));
    /* the largest |a-b|, three times: in two sub-blocks of one part, and in another part */
    af[70000] = af[75000] = af[150000] = 1.5f, bf[70000] = bf[75000] = bf[150000] = 0.25f;
    af[9] = -4.0f, bf[9] = -4.00001f;                               /* the largest |a| */
    for (int round = 0; round < 2; round++) {
        if (round == 1) af[100000] = NAN, bf[33] = -INFINITY; /* the careful path */
        for (int i = 0; i < NV; i++) ad[i] = af[i], bd[i] = bf[i];
        fo_stats ref;
        fo_compare(ad, bd, NV, &ref);
        assert_int_equal(ref.argmax, 70000);
        const int64_t blocks[] = {NV, 65536, 4096, 1000};
        for (int simd = 1; simd >= 0; simd--)
            for (size_t k = 0; k < FS_ARRAY_LEN(blocks); k++)
                for (int combo = 0; combo < 4; combo++) {
                    fo_stats got[2];
                    for (int th = 1; th <= 2; th++) {
                        fo_metrics_set_simd(simd);
                        omp_set_num_threads(th);
                        fo_acc acc;
                        fo_acc_init(&acc);
                        for (int64_t o = 0; o < NV; o += blocks[k]) {
                            int64_t n = o + blocks[k] > NV ? NV - o : blocks[k];
                            fo_view va = combo & 1 ? fo_view_f32(af + o) : fo_view_f64(ad + o);
                            fo_view vb = combo & 2 ? fo_view_f32(bf + o) : fo_view_f64(bd + o);
                            fo_acc_add_view(&acc, va, vb, n);
                        }
                        fo_acc_finish(&acc, &got[th - 1]);
                    }
                    const fo_stats *s = &got[0];
                    assert_memory_equal(&got[0], &got[1], sizeof got[0]);
                    assert_int_equal(s->n, ref.n);
                    assert_int_equal(s->n_finite, ref.n_finite);
                    assert_int_equal(s->argmax, 70000);
                    assert_true(s->max_abs == ref.max_abs && s->max_abs_a == ref.max_abs_a && s->max_abs_b == ref.max_abs_b);
                    assert_true(fabs(s->rel_l2 - ref.rel_l2) <= 1e-12 * ref.rel_l2);
                    assert_true(fabs(s->cosine - ref.cosine) <= 1e-12);
                    assert_true(s->nan_a == ref.nan_a && s->inf_b == ref.inf_b && s->nan_b == 0 && s->inf_a == 0);
                    assert_int_equal(s->first_nonfinite, ref.first_nonfinite);
                    assert_int_equal(s->n_nonfinite_mismatch, round ? 2 : 0);
                }
        /* the summary of `stats`, float32 and float64 views, against a two-pass reference */
        double mean = 0, m2 = 0, lo = INFINITY, hi = -INFINITY;
        int64_t nf = 0;
        for (int i = 0; i < NV; i++)
            if (isfinite(ad[i])) mean += ad[i], nf++, lo = ad[i] < lo ? ad[i] : lo, hi = ad[i] > hi ? ad[i] : hi;
        mean /= (double)nf;
        for (int i = 0; i < NV; i++)
            if (isfinite(ad[i])) m2 += (ad[i] - mean) * (ad[i] - mean);
        for (size_t k = 0; k < FS_ARRAY_LEN(blocks); k++)
            for (int f32 = 0; f32 < 2; f32++) {
                fo_summary sm;
                fo_summary_init(&sm);
                for (int64_t o = 0; o < NV; o += blocks[k])
                    fo_summary_add_view(&sm, f32 ? fo_view_f32(af + o) : fo_view_f64(ad + o),
                                        o + blocks[k] > NV ? NV - o : blocks[k]);
                fo_summary_finish(&sm);
                assert_int_equal(sm.n, NV);
                assert_int_equal(sm.n_finite, nf);
                assert_int_equal(sm.nan, round);
                assert_int_equal(sm.first_nonfinite, round ? 100000 : -1);
                assert_true(sm.min == lo && sm.max == hi);
                assert_true(fabs(sm.mean - mean) <= 1e-12 * fabs(mean) + 1e-15);
                assert_true(fabs(sm.std - sqrt(m2 / (double)nf)) <= 1e-12 * sqrt(m2 / (double)nf));
            }
    }
    fo_metrics_set_simd(1);
    omp_set_num_threads(omp_get_num_procs());
    free(af), free(bf), free(ad), free(bd);
}

/* A flux-dump written the plain way (contiguous, uncompressed, as flux-sim and h5py do by
 * default): `step_0000` holds `n` datasets named names[i] in that execution order, each
 * `shape`d, float32 or float64, values fill(i, flat index). */
static void str_attr(hid_t obj, const char *name, const char *val)
{
    hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
    H5Tset_size(t, strlen(val) + 1);
    hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(a >= 0 && H5Awrite(a, t, val) >= 0);
    H5Aclose(a), H5Sclose(sp), H5Tclose(t);
}

static void write_plain_dump(const char *path, int f64, int n, const char *const *names, int ndim,
                             const hsize_t *shape, double (*fill)(int ds, int64_t i))
{
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(f >= 0);
    str_attr(f, "format", "flux-dump");
    str_attr(f, "dtype", f64 ? "float64" : "float32");
    str_attr(f, "config", "{}");
    int one = 1;
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "version", H5T_NATIVE_INT, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT, &one);
    H5Aclose(a), H5Sclose(sp);
    hid_t g = H5Gcreate2(f, "/step_0000", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= (int64_t)shape[d];
    double *buf = malloc((size_t)numel * sizeof *buf);
    char (*order)[32] = calloc((size_t)n, sizeof *order);
    for (int k = 0; k < n; k++) {
        for (int64_t i = 0; i < numel; i++) buf[i] = fill(k, i);
        hid_t ds_sp = H5Screate_simple(ndim, shape, NULL);
        hid_t d = H5Dcreate2(g, names[k], f64 ? H5T_IEEE_F64LE : H5T_IEEE_F32LE, ds_sp, H5P_DEFAULT, H5P_DEFAULT,
                             H5P_DEFAULT);
        assert_true(d >= 0 && H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0);
        H5Dclose(d), H5Sclose(ds_sp);
        snprintf(order[k], sizeof order[k], "%s", names[k]);
    }
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, sizeof order[0]);
    hsize_t no = (hsize_t)n;
    hid_t osp = H5Screate_simple(1, &no, NULL);
    hid_t oa = H5Acreate2(g, "order", st, osp, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(oa >= 0 && H5Awrite(oa, st, order) >= 0);
    H5Aclose(oa), H5Sclose(osp), H5Tclose(st);
    H5Gclose(g);
    H5Fclose(f);
    free(buf);
    free(order);
}

static double fill_base(int ds, int64_t i) { return sin(0.001 * (double)i + ds) * (1 + ds); }
static double fill_two_bad(int ds, int64_t i) /* datasets 1 and 3 off by 1e-2 at one element */
{
    return fill_base(ds, i) + ((ds == 1 || ds == 3) && i == 777 ? 1e-2 : 0);
}

/* The direct path (pread, values as stored) hands out exactly what HDF5 reads, in blocks of any
 * size; a truncated file is an error naming the dataset, before any block is read. */
static void test_direct_streams(void **state)
{
    (void)state;
    char dir[64], path[128];
    fs_test_tmpdir(dir, sizeof dir);
    const char *names[] = {"x", "y"};
    const hsize_t shape[3] = {3, 50, 7};
    for (int f64 = 0; f64 < 2; f64++) {
        snprintf(path, sizeof path, "%s/plain%d.h5", dir, f64);
        write_plain_dump(path, f64, 2, names, 3, shape, fill_base);
        fo_file *f;
        fs_err e = {0};
        if (fo_file_open(&f, path, &e)) fail_msg("%s", e.msg);
        fo_dataset whole = {0};
        if (fo_dataset_read(f, "/step_0000/y", &whole, &e)) fail_msg("%s", e.msg);
        const int64_t blocks[] = {1, 5, 7, 100, 1 << 20};
        for (size_t b = 0; b < FS_ARRAY_LEN(blocks); b++) {
            fo_stream *s;
            if (fo_stream_open(f, "/step_0000/y", blocks[b], &s, NULL, &e)) fail_msg("%s", e.msg);
            assert_true(fo_stream_direct(s));
            int64_t seen = 0;
            for (;;) {
                fo_view v;
                int64_t off, n;
                if (fo_stream_view(s, &v, &off, &n, &e)) fail_msg("%s", e.msg);
                if (!n) break;
                assert_int_equal(off, seen);
                assert_int_equal(v.type, f64 ? FO_V_F64 : FO_V_F32);
                for (int64_t i = 0; i < n; i++) assert_true(fo_view_at(v, i) == whole.data[off + i]);
                seen += n;
            }
            assert_int_equal(seen, whole.numel);
            fo_stream_close(s);
        }
        fo_dataset_free(&whole);
        fo_file_close(f);
        /* cut the file inside the last dataset's data: HDF5 refuses it at open (the superblock
         * records the end of file); cut after opening, our own check says which dataset */
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        if (fo_file_open(&f, path, &e)) fail_msg("%s", e.msg);
        assert_int_equal(truncate(path, st.st_size - 100), 0);
        fo_stream *s = NULL;
        int rc = fo_stream_open(f, "/step_0000/y", 64, &s, NULL, &e);
        if (rc == FS_OK) { /* HDF5 may place y before x: then x is the cut one */
            fo_stream_close(s);
            rc = fo_stream_open(f, "/step_0000/x", 64, &s, NULL, &e);
        }
        assert_int_equal(rc, FS_E_INPUT);
        assert_non_null(strstr(e.msg, "the file ends inside the dataset"));
        fo_file_close(f);
        assert_int_equal(fo_file_open(&f, path, &e), FS_E_INPUT);
        assert_non_null(strstr(e.msg, "truncated"));
    }
}

/* Data passes run as tasks on several threads; the report is still in execution order, the first
 * divergence is the first in that order (not the first to finish), and a shape mismatch counts. */
static void test_diff_order_parallel(void **state)
{
    (void)state;
    char dir[64], pa[128], pb[128], pc[128];
    fs_test_tmpdir(dir, sizeof dir);
    const char *names[] = {"z.first", "m.second", "a.third", "q.fourth", "b.fifth"};
    const hsize_t shape[2] = {300, 160}, other[2] = {160, 300};
    snprintf(pa, sizeof pa, "%s/a.h5", dir);
    snprintf(pb, sizeof pb, "%s/b.h5", dir);
    snprintf(pc, sizeof pc, "%s/c.h5", dir);
    write_plain_dump(pa, 0, 5, names, 2, shape, fill_base);
    write_plain_dump(pb, 0, 5, names, 2, shape, fill_two_bad);
    write_plain_dump(pc, 0, 5, names, 2, other, fill_base);
    fo_file *a, *b, *c;
    fs_err e = {0};
    if (fo_file_open(&a, pa, &e) || fo_file_open(&b, pb, &e) || fo_file_open(&c, pc, &e)) fail_msg("%s", e.msg);
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        fo_report r;
        fo_diff_opts o = {.block_elems = 4096, .allow_partial = 1}; /* no /inputs, /final: partial by design */
        if (fo_diff_run(a, b, NULL, &o, &r, &e)) fail_msg("%s", e.msg);
        assert_int_equal(r.n, 5);
        for (int i = 0; i < 5; i++) assert_string_equal(r.v[i].name, names[i]);
        assert_int_equal(r.nfail, 2);
        assert_int_equal(r.first, 1);
        assert_int_equal(r.v[1].kind, FO_TOL);
        assert_int_equal(r.v[3].kind, FO_TOL);
        assert_int_equal(r.v[1].at, 777);
        assert_int_equal(r.v[0].kind, FO_PASS);
        assert_true(r.v[0].st.max_abs == 0);
        fo_report_free(&r);
        if (fo_diff_run(a, c, NULL, &o, &r, &e)) fail_msg("%s", e.msg);
        assert_int_equal(r.nfail, 5);
        assert_int_equal(r.first, 0);
        assert_int_equal(r.v[0].kind, FO_SHAPE);
        fo_report_free(&r);
    }
    omp_set_num_threads(omp_get_num_procs());
    fo_file_close(a), fo_file_close(b), fo_file_close(c);
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

/* fo_piece: a rank's local indices placed in the global axis, intervals in their listed order
 * (flux-sim's single blocks: text interval then image interval), several axes, errors. */
static void test_piece_from_json(void **state)
{
    (void)state;
    fs_err e = {0};
    fo_piece p;
    int found;
    cJSON *par = cJSON_Parse("{\"world\":2,\"rank\":1,\"sharding\":{"
                             "\"r\":\"replicated\","
                             "\"joint\":{\"dim\":1,\"ranges\":[[[0,7],[13,31]],[[7,13],[31,48]]]},"
                             "\"rev\":{\"dim\":-1,\"ranges\":[[[4,8]],[[6,8],[0,2]]]},"
                             "\"two\":{\"dims\":[{\"dim\":1,\"ranges\":[[[0,5]],[[5,9]]]},"
                             "{\"dim\":2,\"ranges\":[[[0,4]],[[4,8]]]}]},"
                             "\"twice\":{\"dims\":[{\"dim\":1,\"ranges\":[[[0,5]],[[5,9]]]},"
                             "{\"dim\":1,\"ranges\":[[[0,5]],[[5,9]]]}]},"
                             "\"short\":{\"dim\":1,\"ranges\":[[[0,5]]]},"
                             "\"neg\":{\"dim\":1,\"ranges\":[[[3,1]],[[0,1]]]}},"
                             "\"partial\":{\"p\":\"sum\"}}");
    assert_non_null(par);
    assert_int_equal(fo_piece_from_json(par, "nope", 1, 3, &p, &found, "x.h5", &e), 0);
    assert_int_equal(found, 0);
    assert_int_equal(fo_piece_from_json(par, "r", 1, 3, &p, &found, "x.h5", &e), 0);
    assert_true(found && p.replicated && p.naxes == 0);
    assert_int_equal(fo_piece_from_json(par, "joint", 1, 3, &p, &found, "x.h5", &e), 0);
    assert_true(found && p.naxes == 1 && p.axis[0] == 1 && p.len[0] == 23 && p.gext[0] == 48);
    assert_true(p.g[0][0] == 7 && p.g[0][5] == 12 && p.g[0][6] == 31 && p.g[0][22] == 47);
    fo_piece_free(&p);
    assert_int_equal(fo_piece_from_json(par, "rev", 1, 3, &p, &found, "x.h5", &e), 0); /* listed order kept */
    assert_true(p.axis[0] == 2 && p.len[0] == 4 && p.g[0][0] == 6 && p.g[0][1] == 7 && p.g[0][2] == 0 && p.g[0][3] == 1);
    fo_piece_free(&p);
    assert_int_equal(fo_piece_from_json(par, "two", 0, 3, &p, &found, "x.h5", &e), 0);
    assert_true(p.naxes == 2 && p.len[0] == 5 && p.len[1] == 4 && p.gext[0] == 9 && p.gext[1] == 8 && p.g[1][3] == 3);
    fo_piece_free(&p);
    assert_int_equal(fo_piece_from_json(par, "twice", 0, 3, &p, &found, "x.h5", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "axis 1 split twice"));
    assert_int_equal(fo_piece_from_json(par, "short", 1, 3, &p, &found, "x.h5", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "no ranges for rank 1"));
    assert_int_equal(fo_piece_from_json(par, "neg", 0, 3, &p, &found, "x.h5", &e), FS_E_INPUT);
    assert_int_equal(fo_piece_from_json(par, "joint", 0, 1, &p, &found, "x.h5", &e), FS_E_INPUT); /* dim 1 of a 1-d */
    assert_true(fo_parallel_partial(par, "p") && !fo_parallel_partial(par, "joint") && !fo_parallel_partial(NULL, "p"));
    assert_true(p.naxes == 0 && p.g[0] == NULL); /* errors leave {0} */
    cJSON_Delete(par);
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
    if (fo_stats_run(a, &(fo_diff_opts){.block_elems = 64}, &sr, &e)) fail_msg("%s", e.msg);
    assert_int_equal(sr.first_nonfinite, -1);
    assert_true(sr.n > 100);
    for (int i = 0; i < sr.n; i++) assert_true(sr.v[i].s.min <= sr.v[i].s.mean && sr.v[i].s.mean <= sr.v[i].s.max);
    fo_stat_report_free(&sr);
    fo_file_close(a);
    fo_file_close(b);
}

/* HDF5's descriptions become one clean line (probe defect 14). */
static void test_h5_clean(void **state)
{
    (void)state;
    char buf[256];
    const char *probe = "file read failed: time = Mon Nov 23 20:43:46 2026\n, filename = '/tmp/o/dir', file descriptor "
                        "= 3, errno = 21, error message = 'Is a directory', buf = 0x7fff082fdc40, total read size = 8, "
                        "bytes this sub-read = 8, bytes actually read = 18446744073709551615, offset = 0";
    assert_string_equal(fs_h5_clean(probe, buf, sizeof buf), "file read failed: Is a directory");
    assert_string_equal(fs_h5_clean("unable to read: addr = 0x1234, size = 8", buf, sizeof buf), "unable to read: size = 8");
    assert_string_equal(fs_h5_clean("a time = x buf = 0x7ffd", buf, sizeof buf), "a time = x");
    assert_string_equal(fs_h5_clean("two\nlines\t here  ", buf, sizeof buf), "two lines here");
    /* cut at a word boundary, marked */
    assert_string_equal(fs_h5_clean("alpha beta gamma delta", buf, 15), "alpha beta...");
    assert_true(strlen(fs_h5_clean("abcdefghijklmnopqrstuvwxyz", buf, 10)) < 10);
    assert_string_equal(fs_h5_clean("", buf, sizeof buf), "");
}

static void test_steps_parse(void **state)
{
    (void)state;
    fo_steps s = {0};
    char why[200], txt[64];
    assert_int_equal(fo_steps_parse("all", &s, why, sizeof why), 0);
    assert_true(s.all && fo_steps_has(&s, 12345));
    fo_steps_free(&s);
    assert_int_equal(fo_steps_parse(" 5 , 0-2,2 ", &s, why, sizeof why), 0);
    assert_int_equal(s.n, 4);
    assert_true(fo_steps_has(&s, 0) && fo_steps_has(&s, 2) && fo_steps_has(&s, 5) && !fo_steps_has(&s, 3));
    assert_string_equal(fo_steps_str(&s, txt, sizeof txt), "0-2,5");
    fo_steps_free(&s);
    const char *bad[] = {"", "-1", "3-1", "a", "1,,2", "9999999999", "1-", "0-999999999", "all,1"};
    for (size_t i = 0; i < FS_ARRAY_LEN(bad); i++) {
        assert_int_equal(fo_steps_parse(bad[i], &s, why, sizeof why), -1);
        assert_true(s.n == 0 && why[0]);
    }
}

static void test_config_compare(void **state)
{
    (void)state;
    fs_err e = {0};
    int same = 0;
    char why[300];
    const char *a = "{\"in_channels\": 16, \"out_channels\": null, \"guidance_embeds\": true, \"num_layers\": 2, "
                    "\"axes_dims_rope\": [8, 12, 12], \"_class_name\": \"X\"}";
    const char *b = "{\"in_channels\": 16, \"out_channels\": 16, \"guidance_embeds\": 1, \"num_layers\": 2, "
                    "\"axes_dims_rope\": [8, 12, 12]}";
    assert_int_equal(fo_config_compare(a, "a.h5", b, "b.h5", &same, why, sizeof why, &e), FS_OK);
    assert_true(same); /* out_channels null = in_channels; true = 1; other keys ignored */
    const char *c = "{\"in_channels\": 16, \"guidance_embeds\": true, \"num_layers\": 1, \"axes_dims_rope\": [4, 6, 6]}";
    assert_int_equal(fo_config_compare(a, "a.h5", c, "c.h5", &same, why, sizeof why, &e), FS_OK);
    assert_false(same);
    assert_string_equal(why, "num_layers 2 vs 1, axes_dims_rope [8, 12, 12] vs [4, 6, 6]");
    assert_int_equal(fo_config_compare(a, "a.h5", "{\"num_layers\"", "bad.h5", &same, why, sizeof why, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "bad.h5: attribute config is not valid JSON"));
    assert_int_equal(fo_config_check("[1]", "arr.h5", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "not an object"));
}

static void test_modules_promise(void **state)
{
    (void)state;
    assert_int_equal(fo_modules_promise(NULL, "a.b.c"), 1);
    assert_int_equal(fo_modules_promise("all", "a.b.c"), 1);
    assert_int_equal(fo_modules_promise("depth<=2", "transformer_blocks.0#1"), 1);
    assert_int_equal(fo_modules_promise("depth<=2", "time_text_embed.time_proj@1"), 1);
    assert_int_equal(fo_modules_promise("depth<=2", "latents_out"), 1);
    assert_int_equal(fo_modules_promise("depth<=2", "time_text_embed.timestep_embedder.linear_1"), 0);
    assert_int_equal(fo_modules_promise("depth<=2", "transformer_blocks.0.attn.to_q"), 0);
    assert_int_equal(fo_modules_promise("blocks only", "x"), -1);
    assert_int_equal(fo_modules_promise("depth<=2x", "x"), -1);
}

/* The verdict rule, in its order. */
static void test_verdict_rule(void **state)
{
    (void)state;
    fo_report r;
    fo_report_init(&r, FO_MODE_DIFF);
    char why[512];
    assert_int_equal(fo_report_verdict(&r, 0, "a.h5", "b.h5", why, sizeof why), FO_VERDICT_ERROR); /* nothing compared */
    assert_non_null(strstr(why, "nothing compared"));
    fo_entry *en = fo_report_add(&r, 0, "/step_0000", "x");
    en->kind = FO_EMPTY;
    fo_report_tally(&r);
    assert_int_equal(r.n_compared, 0);
    assert_int_equal(fo_report_verdict(&r, 0, "a.h5", "b.h5", why, sizeof why), FO_VERDICT_ERROR); /* empty only */
    en = fo_report_add(&r, 0, "/step_0000", "y");
    fo_report_tally(&r);
    assert_int_equal(fo_report_verdict(&r, 0, "a.h5", "b.h5", why, sizeof why), FO_VERDICT_PASS);
    assert_int_equal(fo_names_push(&r.only_a, "/step_0001", "z"), 0);
    assert_int_equal(fo_report_verdict(&r, 0, "a.h5", "b.h5", why, sizeof why), FO_VERDICT_PASS);  /* declared */
    assert_int_equal(fo_report_verdict(&r, 1, "a.h5", "b.h5", why, sizeof why), FO_VERDICT_DIVERGE); /* --strict */
    r.v[1].kind = FO_TOL;
    fo_report_tally(&r);
    assert_int_equal(r.first, 1);
    assert_int_equal(fo_report_verdict(&r, 0, "a.h5", "b.h5", why, sizeof why), FO_VERDICT_DIVERGE);
    assert_int_equal(fo_names_push(&r.undeclared_a, "/step_0001", "z"), 0);
    assert_int_equal(fo_report_verdict(&r, 0, "a.h5", "b.h5", why, sizeof why), FO_VERDICT_ERROR); /* beats DIVERGE */
    assert_non_null(strstr(why, "b.h5 lacks /step_0001/z that a.h5 holds"));
    fo_report_free(&r);
}

/* A small flux-dump for the completeness contract: steps 0..nsteps-1 promised by sigmas
 * (N+1 values), each with datasets latents_in, latents_out and an `order`; knobs break it. */
typedef struct dump_spec {
    int nsteps;           /* promised by /inputs/sigmas */
    int written;          /* step groups written (0..written-1) */
    int no_order_at;      /* this step's group has no `order` (-1: none) */
    int no_final;
    int marker;           /* -1: no `complete` attribute, else its value */
    const char *recorded; /* recorded_steps, or NULL */
    int skip_step;        /* a step not written (-1: none) */
} dump_spec;

static void write_spec_dump(const char *path, const dump_spec *d)
{
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(f >= 0);
    str_attr(f, "format", "flux-dump");
    str_attr(f, "dtype", "float32");
    str_attr(f, "config", "{}");
    hid_t sp = H5Screate(H5S_SCALAR);
    int one = 1;
    hid_t a = H5Acreate2(f, "version", H5T_NATIVE_INT, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT, &one), H5Aclose(a);
    if (d->recorded) str_attr(f, "recorded_steps", d->recorded);
    double v[4] = {1, 2, 3, 4};
    hsize_t n = (hsize_t)d->nsteps + 1, four = 4;
    hid_t g = H5Gcreate2(f, "/inputs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    double *sig = calloc(n, sizeof *sig);
    hid_t ssp = H5Screate_simple(1, &n, NULL);
    hid_t ds = H5Dcreate2(g, "sigmas", H5T_IEEE_F32LE, ssp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, sig);
    H5Dclose(ds), H5Sclose(ssp), H5Gclose(g), free(sig);
    hid_t vsp = H5Screate_simple(1, &four, NULL);
    for (int s = 0; s < d->written; s++) {
        if (s == d->skip_step) continue;
        char name[32];
        snprintf(name, sizeof name, "/step_%04d", s);
        g = H5Gcreate2(f, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        const char *dsn[2] = {"latents_in", "latents_out"};
        for (int k = 0; k < 2; k++) {
            ds = H5Dcreate2(g, dsn[k], H5T_IEEE_F32LE, vsp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
            H5Dclose(ds);
        }
        if (s != d->no_order_at) {
            char order[2][16] = {"latents_in", "latents_out"};
            hid_t st = H5Tcopy(H5T_C_S1);
            H5Tset_size(st, 16);
            hsize_t two = 2;
            hid_t osp = H5Screate_simple(1, &two, NULL);
            hid_t oa = H5Acreate2(g, "order", st, osp, H5P_DEFAULT, H5P_DEFAULT);
            H5Awrite(oa, st, order), H5Aclose(oa), H5Sclose(osp), H5Tclose(st);
        }
        H5Gclose(g);
    }
    if (!d->no_final) {
        g = H5Gcreate2(f, "/final", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        ds = H5Dcreate2(g, "latents", H5T_IEEE_F32LE, vsp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
        H5Dclose(ds), H5Gclose(g);
    }
    H5Sclose(vsp);
    if (d->marker >= 0) { /* the producer's last action */
        a = H5Acreate2(f, "complete", H5T_NATIVE_INT, sp, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, H5T_NATIVE_INT, &d->marker), H5Aclose(a);
    }
    H5Sclose(sp);
    H5Fclose(f);
}

static void check_completeness(const char *dir, const dump_spec *d, int want_complete, const char *want_reason)
{
    char path[160];
    snprintf(path, sizeof path, "%s/c.h5", dir);
    write_spec_dump(path, d);
    fo_file *f;
    fs_err e = {0};
    if (fo_file_open(&f, path, &e)) fail_msg("%s", e.msg);
    fo_completeness c;
    if (fo_file_completeness(f, &c, &e)) fail_msg("%s", e.msg);
    if (c.complete != want_complete || c.partial == c.complete || (want_reason && !strstr(c.reason, want_reason)))
        fail_msg("complete %d (want %d), reason '%s' (want '%s')", c.complete, want_complete, c.reason,
                 want_reason ? want_reason : "");
    fo_file_close(f);
}

static void test_completeness(void **state)
{
    (void)state;
    char dir[64];
    fs_test_tmpdir(dir, sizeof dir);
    const dump_spec whole = {.nsteps = 3, .written = 3, .no_order_at = -1, .marker = -1, .skip_step = -1};
    dump_spec d = whole;
    check_completeness(dir, &d, 1, NULL); /* by structure */
    d.marker = 1;
    check_completeness(dir, &d, 1, NULL); /* by the marker */
    d = whole, d.no_order_at = 2, d.no_final = 1;
    check_completeness(dir, &d, 0, "step_0002 has no `order`: the producer stopped inside step 2");
    d = whole, d.written = 2, d.no_final = 1;
    check_completeness(dir, &d, 0, "step_0002 missing: /inputs/sigmas promises 3 steps: the producer stopped after step 1");
    d = whole, d.no_final = 1;
    check_completeness(dir, &d, 0, "no /final/latents");
    d = whole, d.skip_step = 1;
    check_completeness(dir, &d, 0, "step_0001 missing: /inputs/sigmas promises 3 steps, and later steps are present");
    d = whole, d.marker = 0;
    check_completeness(dir, &d, 0, "marked it incomplete");
    d = whole, d.marker = 1, d.written = 2;
    check_completeness(dir, &d, 0, "step_0002 missing although the file is marked complete");
    d = whole, d.marker = 1, d.skip_step = 1, d.recorded = "0,2"; /* a deliberate subset */
    check_completeness(dir, &d, 1, NULL);
    d = whole, d.skip_step = 1, d.recorded = "0,2"; /* the same without the marker, by structure */
    check_completeness(dir, &d, 1, NULL);
    d = whole, d.marker = 1, d.recorded = "0,5";
    check_completeness(dir, &d, 0, "step_0005 missing");
    /* a malformed recorded_steps is an error, not a guess */
    char path[160];
    snprintf(path, sizeof path, "%s/c.h5", dir);
    d = whole, d.recorded = "0,x";
    write_spec_dump(path, &d);
    fo_file *f;
    fs_err e = {0};
    if (fo_file_open(&f, path, &e)) fail_msg("%s", e.msg);
    fo_completeness c;
    assert_int_equal(fo_file_completeness(f, &c, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "attribute recorded_steps: 'x' is not a step number"));
    fo_file_close(f);
}

static double fill_nan(int ds, int64_t i) { return ds == 2 && i % 7 == 3 ? NAN : fill_base(ds, i); }

/* A NaN facing a NaN at the same place is not a pass; an empty dataset is not compared. */
static void test_diff_nonfinite_empty(void **state)
{
    (void)state;
    char dir[64], pa[128], pe[128];
    fs_test_tmpdir(dir, sizeof dir);
    const char *names[] = {"first", "second", "third"};
    const hsize_t shape[2] = {4, 8}, zero[2] = {4, 0};
    snprintf(pa, sizeof pa, "%s/nan.h5", dir);
    snprintf(pe, sizeof pe, "%s/empty.h5", dir);
    write_plain_dump(pa, 0, 3, names, 2, shape, fill_nan);
    write_plain_dump(pe, 0, 3, names, 2, zero, fill_base);
    fo_file *a, *z;
    fs_err e = {0};
    if (fo_file_open(&a, pa, &e) || fo_file_open(&z, pe, &e)) fail_msg("%s", e.msg);
    fo_diff_opts o = {.allow_partial = 1};
    fo_report r;
    if (fo_diff_run(a, a, NULL, &o, &r, &e)) fail_msg("%s", e.msg);
    assert_int_equal(r.nfail, 1);
    assert_int_equal(r.v[2].kind, FO_NONFINITE);
    assert_int_equal(r.v[2].at, 3);
    assert_non_null(strstr(r.v[2].msg, "non-finite on both sides"));
    assert_int_equal(fo_report_verdict(&r, 0, pa, pa, NULL, 0), FO_VERDICT_DIVERGE);
    fo_report_free(&r);
    if (fo_diff_run(z, z, NULL, &o, &r, &e)) fail_msg("%s", e.msg);
    assert_int_equal(r.n, 3);
    assert_int_equal(r.n_empty, 3);
    assert_int_equal(r.n_compared, 0);
    assert_int_equal(r.v[0].kind, FO_EMPTY);
    assert_non_null(strstr(r.v[0].msg, "empty on both sides"));
    assert_int_equal(fo_report_verdict(&r, 0, pe, pe, NULL, 0), FO_VERDICT_ERROR);
    fo_report_free(&r);
    fo_stat_report sr;
    assert_int_equal(fo_stats_run(z, &o, &sr, &e), FS_E_INPUT); /* nothing to check */
    fo_stat_report_free(&sr);
    /* without --allow-partial these dumps (no /final) are refused */
    o.allow_partial = 0;
    assert_int_equal(fo_diff_run(a, a, NULL, &o, &r, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "partial dump"));
    fo_report_free(&r);
    fo_file_close(a), fo_file_close(z);
}

/* Reliability probe 3, T9: what the JUnit/HTML writers pass on must be XML 1.0 characters. */
static char *xml_of(const char *in)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    fo_xml_esc(f, in);
    fclose(f);
    return buf;
}

static void test_xml_escape(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"a<b>&\"'", "a&lt;b&gt;&amp;&quot;&apos;"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"}, /* valid: kept */
        {"x\xed\xa0\x80y", "x\\xED\\xA0\\x80y"},                   /* a surrogate */
        {"x\xef\xbf\xbey", "x\\xEF\\xBF\\xBEy"},                   /* U+FFFE */
        {"x\xef\xbf\xbfy", "x\\xEF\\xBF\\xBFy"},                   /* U+FFFF */
        {"x\xe0\x80\xbcy", "x\\xE0\\x80\\xBCy"},                   /* overlong '<' */
        {"x\xc0\xbcy", "x\\xC0\\xBCy"},                            /* overlong, 2 bytes */
        {"x\xf4\x90\x80\x80y", "x\\xF4\\x90\\x80\\x80y"},           /* above U+10FFFF */
        {"x\xf4\x8f\xbf\xbdy", "x\xf4\x8f\xbf\xbdy"},               /* U+10FFFD: valid */
        {"a\x01" "b\x1b[31m\x7f", "a\\x01b\\x1B[31m\\x7F"},          /* controls, DEL */
        {"x\xe2\x82", "x\\xE2\\x82"},                               /* cut at the end */
        {"tab\tnl\n", "tab\tnl\n"},
    };
    for (size_t i = 0; i < FS_ARRAY_LEN(cases); i++) {
        char *got = xml_of(cases[i].in);
        if (strcmp(got, cases[i].out)) fail_msg("case %zu: '%s' -> '%s', want '%s'", i, cases[i].in, got, cases[i].out);
        free(got);
    }
    uint32_t cp = 0;
    assert_int_equal(fo_utf8_char((const unsigned char *)"\xed\x9f\xbf", 3, &cp), 3); /* U+D7FF */
    assert_int_equal(cp, 0xd7ff);
    assert_int_equal(fo_utf8_char((const unsigned char *)"\xee\x80\x80", 3, &cp), 3); /* U+E000 */
    assert_int_equal(fo_utf8_char((const unsigned char *)"\xf0\x8f\xbf\xbf", 4, &cp), 0); /* overlong 4-byte */
    assert_int_equal(fo_utf8_char((const unsigned char *)"\xf5\x80\x80\x80", 4, &cp), 0);
    assert_int_equal(fo_utf8_char((const unsigned char *)"\x80", 1, &cp), 0);
}

/* T2: names have no length limit anywhere: paths are built whole, and a message shows a long
 * name shortened visibly, so the cause after it survives fs_err's 1024 bytes. */
static void test_long_names(void **state)
{
    (void)state;
    size_t n = 65536;
    char *name = malloc(n + 1);
    assert_non_null(name);
    memset(name, 'L', n);
    name[n] = 0;
    char *p = fo_path_join("/step_0000", name);
    assert_non_null(p);
    assert_int_equal(strlen(p), n + 11);
    assert_memory_equal(p, "/step_0000/LLL", 14);
    fs_err e;
    fs_errf(&e, FS_E_INPUT, "f.h5: %s: the cause", FO_SHOW(p));
    assert_non_null(strstr(e.msg, "...(65547 bytes): the cause"));
    char lb[400];
    fo_entry_label(0, "/step_0000", "a\x1b[31m\nb", lb, sizeof lb);
    assert_string_equal(lb, "step 0 a\\x1B[31m\\nb");
    free(p);
    free(name);
}

/* fuzz_oracle_walk's finding: recorded_steps (or --steps / --modules) text echoed raw, so an
 * attribute holding a newline or ESC made a two-line error that drives the terminal. */
static void test_step_list_messages(void **state)
{
    (void)state;
    fo_steps st = {0};
    fo_globs g = {0};
    char why[200];
    assert_int_equal(fo_steps_parse("zza\x1b[31m\nb", &st, why, sizeof why), -1);
    assert_null(strchr(why, '\n'));
    assert_null(strchr(why, '\x1b'));
    assert_non_null(strstr(why, "'zza\\x1B[31m\\nb' is not a step number"));
    char longglob[300];
    memset(longglob, 'a', sizeof longglob - 1);
    longglob[0] = '\n', longglob[1] = '\x1b', longglob[sizeof longglob - 1] = 0;
    assert_int_equal(fo_globs_parse(longglob, &g, why, sizeof why), -1);
    assert_null(strchr(why, '\n'));
    assert_null(strchr(why, '\x1b'));
    fo_steps_free(&st), fo_globs_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tolerance_rules),   cmocka_unit_test(test_streaming_equals_oneshot),
        cmocka_unit_test(test_shard_parse),       cmocka_unit_test(test_piece_from_json),
        cmocka_unit_test(test_describe_coords),
        cmocka_unit_test(test_stream_blocks),     cmocka_unit_test(test_diff_reference),
        cmocka_unit_test(test_views_equal_widened), cmocka_unit_test(test_direct_streams),
        cmocka_unit_test(test_diff_order_parallel),
        cmocka_unit_test(test_h5_clean),          cmocka_unit_test(test_steps_parse),
        cmocka_unit_test(test_config_compare),    cmocka_unit_test(test_modules_promise),
        cmocka_unit_test(test_verdict_rule),      cmocka_unit_test(test_completeness),
        cmocka_unit_test(test_diff_nonfinite_empty), cmocka_unit_test(test_xml_escape),
        cmocka_unit_test(test_long_names),        cmocka_unit_test(test_step_list_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
