/* test_comm.c — the collectives flux-sim uses, checked element by element (nccl-tests style).
 *
 * Inputs are small integers (rank·1000 + index mod 997): their sums are exact in float32 and
 * float64 in any order, so every wrong element is a real bug, never rounding. Runs at any world
 * size: directly (1 rank) by `make test`, and under mpirun -np 2..4 by tests/mpi_collectives.sh.
 * Prints a compact results table on rank 0. */
#include "test_util.h"

#include "fs_comm.h"
#include "fs_gather.h"
#include "fs_par.h"

static const fs_group *W;

static double val(int rank, int64_t i) { return (double)(rank * 1000 + (i % 997)); }

static int64_t wrong_count(const fs_group *g, int64_t wrong)
{
    double w = (double)wrong;
    fs_allreduce_max_double(g, &w, 1);
    return (int64_t)w;
}

static void report(const char *what, fs_dtype dt, int64_t n, int64_t wrong)
{
    if (W->rank == 0) printf("  %-22s %-8s %10lld elements  %s\n", what, fs_dtype_name(dt), (long long)n, wrong ? "WRONG" : "ok");
}

static void test_allreduce(void **s)
{
    for (int d = 0; d < 2; d++) {
        fs_dtype dt = d ? FS_F64 : FS_F32;
        const int64_t n = 100003; /* not a multiple of anything */
        fs_tensor t;
        fs_tensor_alloc(&t, dt, 1, &n, NULL);
        for (int64_t i = 0; i < n; i++) fs_tensor_set(&t, i, val(W->rank, i));
        fs_allreduce_sum(W, dt, t.data, n);
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; i++) {
            double want = 0;
            for (int r = 0; r < W->size; r++) want += val(r, i);
            wrong += fs_tensor_get(&t, i) != want;
        }
        wrong = wrong_count(W, wrong);
        report("allreduce_sum", dt, n, wrong);
        assert_int_equal(wrong, 0);
        fs_tensor_free(&t);
    }
}

static void test_allgatherv_uneven(void **s)
{
    /* rank r contributes r+1 ... elements: uneven counts like a 35-token sequence over 4 ranks */
    const int P = W->size;
    int64_t *cnt = calloc(2 * (size_t)P, sizeof(int64_t)), *dsp = cnt + P, tot = 0;
    for (int r = 0; r < P; r++) {
        cnt[r] = 7 + 3 * r;
        dsp[r] = tot;
        tot += cnt[r];
    }
    double *mine = calloc((size_t)cnt[W->rank], sizeof(double)), *all = calloc((size_t)tot, sizeof(double));
    for (int64_t i = 0; i < cnt[W->rank]; i++) mine[i] = val(W->rank, i);
    fs_allgatherv(W, FS_F64, mine, cnt[W->rank], all, cnt, dsp);
    int64_t wrong = 0;
    for (int r = 0; r < P; r++)
        for (int64_t i = 0; i < cnt[r]; i++) wrong += all[dsp[r] + i] != val(r, i);
    wrong = wrong_count(W, wrong);
    report("allgatherv (uneven)", FS_F64, tot, wrong);
    assert_int_equal(wrong, 0);
    free(mine);
    free(all);
    free(cnt);
}

static void test_alltoallv(void **s)
{
    /* rank r sends (r + q + 1) elements to rank q, tagged with (r, q) */
    const int P = W->size, me = W->rank;
    int64_t *sc = calloc(4 * (size_t)P, sizeof(int64_t)), *sd = sc + P, *rc = sc + 2 * P, *rd = sc + 3 * P, st = 0, rt = 0;
    for (int q = 0; q < P; q++) {
        sc[q] = me + q + 1;
        sd[q] = st;
        st += sc[q];
        rc[q] = q + me + 1;
        rd[q] = rt;
        rt += rc[q];
    }
    float *snd = calloc((size_t)st, sizeof(float)), *rcv = calloc((size_t)rt, sizeof(float));
    for (int q = 0; q < P; q++)
        for (int64_t i = 0; i < sc[q]; i++) snd[sd[q] + i] = (float)(me * 100 + q * 10 + i);
    fs_alltoallv(W, FS_F32, snd, sc, sd, rcv, rc, rd);
    int64_t wrong = 0;
    for (int q = 0; q < P; q++)
        for (int64_t i = 0; i < rc[q]; i++) wrong += rcv[rd[q] + i] != (float)(q * 100 + me * 10 + i);
    wrong = wrong_count(W, wrong);
    report("alltoallv (uneven)", FS_F32, rt, wrong);
    assert_int_equal(wrong, 0);
    free(snd);
    free(rcv);
    free(sc);
}

static void test_ring_p2p(void **s)
{
    /* P-1 rotations: every rank sees every other rank's chunk exactly once, in ring order */
    const int P = W->size, me = W->rank;
    const int64_t n = 513;
    double *cur = malloc(sizeof(double) * n), *nxt = malloc(sizeof(double) * n);
    for (int64_t i = 0; i < n; i++) cur[i] = val(me, i);
    int64_t wrong = 0;
    for (int step = 0; step < P - 1; step++) {
        fs_ring_req rq = {{0}};
        fs_ring_start(W, FS_F64, cur, n, (me + 1) % P, nxt, n, (me - 1 + P) % P, step, &rq);
        fs_ring_wait(&rq);
        int from = ((me - step - 1) % P + P) % P;
        for (int64_t i = 0; i < n; i++) wrong += nxt[i] != val(from, i);
        double *t = cur;
        cur = nxt;
        nxt = t;
    }
    wrong = wrong_count(W, wrong);
    report("ring sendrecv", FS_F64, n * (P - 1), wrong);
    assert_int_equal(wrong, 0);
    free(cur);
    free(nxt);
}

static void test_gather_tiling(void **s)
{
    /* a [2, S, 6] tensor sharded on dim 1 in uneven chunks; rank 0 reassembles it exactly, and a
     * replicated tensor with one rank's copy changed is reported as disagreeing copies */
    const int P = W->size, me = W->rank;
    const int64_t S = 11, C = 6;
    int64_t lo = me * S / P, hi = (me + 1) * S / P;
    fs_tensor t;
    fs_tensor_alloc3(&t, FS_F64, 2, hi - lo, C, NULL);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = lo; i < hi; i++)
            for (int64_t c = 0; c < C; c++) fs_tensor_set(&t, (b * (hi - lo) + i - lo) * C + c, b * 10000 + i * 100 + c);
    fs_shard sh = {.ndims = 1, .d = {{.dim = 1, .n = 1, .iv = {{lo, hi}}}}};
    fs_gathered g;
    assert_int_equal(fs_gather_to_root(W, &t, &sh, &g, NULL), 0);
    if (me == 0) {
        assert_int_equal(g.problem, 0);
        assert_int_equal(g.global.shape[1], S);
        for (int64_t b = 0; b < 2; b++)
            for (int64_t i = 0; i < S; i++)
                for (int64_t c = 0; c < C; c++) assert_true(fs_tensor_get(&g.global, (b * S + i) * C + c) == b * 10000 + i * 100 + c);
    }
    fs_gathered_free(&g);
    fs_tensor_free(&t);
    if (P > 1) {
        fs_tensor r;
        fs_tensor_alloc2(&r, FS_F32, 3, 4, NULL);
        for (int i = 0; i < 12; i++) fs_tensor_set(&r, i, i + (me == P - 1 && i == 5 ? 1 : 0));
        assert_int_equal(fs_gather_to_root(W, &r, NULL, &g, NULL), 0);
        if (me == 0) {
            assert_int_equal(g.problem, 1);
            assert_non_null(strstr(g.detail, "replicated"));
        }
        fs_gathered_free(&g);
        fs_tensor_free(&r);
    }
    report("gather to root (tiling)", FS_F64, 2 * S * C, 0);
}

int main(int argc, char **argv)
{
    fs_err e = {0};
    if (fs_comm_init(&argc, &argv, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    W = fs_comm_world();
    if (W->rank == 0) printf("collectives on %d rank(s):\n", W->size);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce),   cmocka_unit_test(test_allgatherv_uneven), cmocka_unit_test(test_alltoallv),
        cmocka_unit_test(test_ring_p2p),    cmocka_unit_test(test_gather_tiling),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rc = fs_allreduce_max_int(W, rc); /* every rank agrees on the exit code */
    fs_comm_finalize();
    return rc;
}
