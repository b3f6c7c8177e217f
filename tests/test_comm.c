/* test_comm.c — the collectives flux-sim uses, checked element by element (nccl-tests style),
 * on tensors in every memory space: the CPU backend (pointers handed to MPI as they are) and
 * cpu-strict (memory the host cannot touch: every collective staged through host buffers).
 *
 * Inputs are small integers (rank·1000 + index mod 997): their sums are exact in float32 and
 * float64 in any order, so every wrong element is a real bug, never rounding. Runs at any world
 * size: directly (1 rank) by `make test`, and under mpirun -np 2..4 by tests/mpi_collectives.sh.
 * Every check is agreed over all ranks BEFORE it is asserted (a failure on one rank alone would
 * leave the others waiting in the next collective until a timeout): each rank counts its wrong
 * elements, one all-reduce gives every rank the same verdict (how many ranks saw a wrong element,
 * and how many in all), and every rank asserts that same verdict. Prints a results table on
 * rank 0, with each line's real verdict ("ok", or "WRONG: n elements on k of P ranks").
 *
 * FLUX_TEST_COMM_BREAK=<test> (tests/mpi_collectives.sh) makes the last rank see one element of
 * that test's result wrong: the line must then say WRONG, every rank must fail that test and
 * only that one, and the job must still end — the proof that this test can fail without
 * hanging. */
#include "test_util.h"

#include "fs_backend.h"
#include "fs_comm.h"
#include "fs_gather.h"
#include "fs_par.h"

static const fs_group *W;
static fs_backend *BACKENDS[2];

static double val(int rank, int64_t i) { return (double)(rank * 1000 + (i % 997)); }

/* Does FLUX_TEST_COMM_BREAK name this test, and is this the rank that is to see it break? */
static int sabotaged(const char *test)
{
    const char *b = getenv("FLUX_TEST_COMM_BREAK");
    return b && !strcmp(b, test) && W->rank == W->size - 1;
}

/* The verdict every rank agrees on: wrong elements over all ranks, and on how many ranks. */
typedef struct verdict {
    int64_t wrong, ranks;
} verdict;

static verdict agreed(int64_t wrong)
{
    /* entry r = rank r's count, max-reduced: a plain host MPI_MAX, independent of the tensor
     * collectives under test */
    double *c = calloc((size_t)W->size, sizeof *c);
    verdict out = {wrong, wrong != 0}; /* if even the agreement cannot run, this rank still fails */
    if (!c) return out;
    c[W->rank] = (double)wrong;
    fs_allreduce_max_double(W, c, W->size);
    out = (verdict){0, 0};
    for (int r = 0; r < W->size; r++) {
        out.wrong += (int64_t)c[r];
        out.ranks += c[r] != 0;
    }
    free(c);
    return out;
}

/* One line of the table (rank 0), then the same assertion on every rank. */
#define REPORT(what, be, dt, n, local_wrong)                                                                         \
    do {                                                                                                             \
        verdict v_ = agreed(local_wrong);                                                                            \
        if (W->rank == 0) {                                                                                          \
            char r_[96] = "ok";                                                                                      \
            if (v_.wrong || v_.ranks)                                                                                \
                snprintf(r_, sizeof r_, "WRONG: %lld elements on %lld of %d ranks", (long long)v_.wrong,             \
                         (long long)v_.ranks, W->size);                                                              \
            printf("  %-24s %-10s %-8s %10lld elements  %s\n", what, (be)->name, fs_dtype_name(dt), (long long)(n),  \
                   r_);                                                                                              \
            fflush(stdout);                                                                                          \
        }                                                                                                            \
        assert_int_equal(v_.wrong + v_.ranks, 0);                                                                    \
    } while (0)

/* A backend tensor filled from host values f(i). */
static fs_tensor make(fs_backend *be, fs_dtype dt, int64_t n, double (*f)(int64_t, void *), void *ctx)
{
    fs_tensor h, t;
    assert_int_equal(fs_tensor_alloc(&h, dt, 1, &n, NULL), 0);
    for (int64_t i = 0; i < n; i++) fs_tensor_set(&h, i, f(i, ctx));
    assert_int_equal(fs_tensor_alloc_on(&t, be, dt, 1, &n, NULL), 0);
    assert_int_equal(fs_tensor_upload(&t, &h, NULL), 0);
    fs_tensor_free(&h);
    return t;
}
/* Its values, downloaded. */
static fs_tensor fetch(const fs_tensor *t)
{
    fs_tensor h;
    assert_int_equal(fs_tensor_alloc(&h, t->dtype, t->ndim, t->shape, NULL), 0);
    assert_int_equal(fs_tensor_download(&h, t, NULL), 0);
    return h;
}

static double mine_val(int64_t i, void *ctx) { return val(W->rank, i); }
static double zero(int64_t i, void *ctx) { return 0; }

static void test_allreduce(void **s)
{
    for (int b = 0; b < 2; b++)
        for (int d = 0; d < 2; d++) {
            fs_dtype dt = d ? FS_F64 : FS_F32;
            const int64_t n = 100003; /* not a multiple of anything */
            fs_tensor t = make(BACKENDS[b], dt, n, mine_val, NULL);
            int rc = fs_allreduce_sum_t(W, &t, NULL);
            fs_tensor h = fetch(&t);
            if (sabotaged("allreduce")) fs_tensor_set(&h, n / 2, -1);
            int64_t wrong = rc ? n : 0;
            for (int64_t i = 0; i < n; i++) {
                double want = 0;
                for (int r = 0; r < W->size; r++) want += val(r, i);
                wrong += fs_tensor_get(&h, i) != want;
            }
            REPORT("allreduce_sum", BACKENDS[b], dt, n, wrong);
            fs_tensor_free(&t);
            fs_tensor_free(&h);
        }
}

static void test_allgatherv_uneven(void **s)
{
    /* rank r contributes 7 + 3r elements: uneven counts like a 35-token sequence over 4 ranks */
    const int P = W->size;
    int64_t *cnt = calloc(2 * (size_t)P, sizeof(int64_t)), *dsp = cnt + P, tot = 0;
    for (int r = 0; r < P; r++) {
        cnt[r] = 7 + 3 * r;
        dsp[r] = tot;
        tot += cnt[r];
    }
    for (int b = 0; b < 2; b++) {
        fs_tensor mine = make(BACKENDS[b], FS_F64, cnt[W->rank], mine_val, NULL), all = make(BACKENDS[b], FS_F64, tot, zero, NULL);
        int rc = fs_allgatherv_t(W, &mine, &all, cnt, dsp, NULL);
        fs_tensor h = fetch(&all);
        if (sabotaged("allgatherv")) fs_tensor_set(&h, tot - 1, -1);
        int64_t wrong = rc ? tot : 0;
        for (int r = 0; r < P; r++)
            for (int64_t i = 0; i < cnt[r]; i++) wrong += fs_tensor_get(&h, dsp[r] + i) != val(r, i);
        REPORT("allgatherv (uneven)", BACKENDS[b], FS_F64, tot, wrong);
        fs_tensor_free(&mine);
        fs_tensor_free(&all);
        fs_tensor_free(&h);
    }
    free(cnt);
}

typedef struct a2a {
    const int64_t *sc, *sd;
} a2a;
static double a2a_val(int64_t i, void *ctx)
{
    const a2a *x = ctx;
    for (int q = 0; q < W->size; q++)
        if (i >= x->sd[q] && i < x->sd[q] + x->sc[q]) return W->rank * 100 + q * 10 + (i - x->sd[q]);
    return -1;
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
    a2a x = {sc, sd};
    for (int b = 0; b < 2; b++) {
        fs_tensor snd = make(BACKENDS[b], FS_F32, st, a2a_val, &x), rcv = make(BACKENDS[b], FS_F32, rt, zero, NULL);
        int err = fs_alltoallv_t(W, &snd, sc, sd, &rcv, rc, rd, NULL);
        fs_tensor h = fetch(&rcv);
        if (sabotaged("alltoallv")) fs_tensor_set(&h, 0, -1);
        int64_t wrong = err ? rt : 0;
        for (int q = 0; q < P; q++)
            for (int64_t i = 0; i < rc[q]; i++) wrong += fs_tensor_get(&h, rd[q] + i) != (float)(q * 100 + me * 10 + i);
        REPORT("alltoallv (uneven)", BACKENDS[b], FS_F32, rt, wrong);
        fs_tensor_free(&snd);
        fs_tensor_free(&rcv);
        fs_tensor_free(&h);
    }
    free(sc);
}

static void test_bcast(void **s)
{
    for (int b = 0; b < 2; b++) {
        const int64_t n = 4099;
        fs_tensor t = make(BACKENDS[b], FS_F64, n, mine_val, NULL); /* root's values: val(0, i) */
        const int root = W->size - 1;
        int rc = fs_bcast_t(W, root, &t, NULL);
        fs_tensor h = fetch(&t);
        if (sabotaged("bcast")) fs_tensor_set(&h, 1, -1);
        int64_t wrong = rc ? n : 0;
        for (int64_t i = 0; i < n; i++) wrong += fs_tensor_get(&h, i) != val(root, i);
        REPORT("bcast (root = last)", BACKENDS[b], FS_F64, n, wrong);
        fs_tensor_free(&t);
        fs_tensor_free(&h);
    }
}

static void test_ring_p2p(void **s)
{
    /* P-1 rotations: every rank sees every other rank's chunk exactly once, in ring order; the
     * receive buffer is larger than the message (as the ring's max-length chunk buffers are) */
    const int P = W->size, me = W->rank;
    const int64_t n = 513;
    for (int b = 0; b < 2; b++) {
        fs_tensor cur = make(BACKENDS[b], FS_F64, n + 7, mine_val, NULL), nxt = make(BACKENDS[b], FS_F64, n + 7, zero, NULL);
        int64_t wrong = 0;
        for (int step = 0; step < P - 1; step++) {
            fs_ring_req rq;
            int rc = fs_ring_start(W, &cur, n, (me + 1) % P, &nxt, n, (me - 1 + P) % P, step, &rq, NULL);
            if (!rc) rc = fs_ring_wait(&rq, NULL);
            int from = ((me - step - 1) % P + P) % P;
            fs_tensor h = fetch(&nxt);
            if (sabotaged("ring")) fs_tensor_set(&h, 0, -1);
            wrong += rc ? n : 0;
            for (int64_t i = 0; i < n; i++) wrong += fs_tensor_get(&h, i) != val(from, i);
            fs_tensor_free(&h);
            fs_tensor tmp = cur;
            cur = nxt;
            nxt = tmp;
        }
        REPORT("ring sendrecv", BACKENDS[b], FS_F64, n * (P - 1), wrong);
        fs_tensor_free(&cur);
        fs_tensor_free(&nxt);
    }
}

static void test_gather_tiling(void **s)
{
    /* a [2, S, 6] tensor sharded on dim 1 in uneven chunks; rank 0 reassembles it exactly, and a
     * replicated tensor with one rank's copy changed is reported as disagreeing copies. The
     * recorder's gather takes backend tensors and downloads them itself. */
    const int P = W->size, me = W->rank;
    const int64_t S = 11, C = 6;
    int64_t lo = me * S / P, hi = (me + 1) * S / P;
    for (int b = 0; b < 2; b++) {
        fs_tensor h, t;
        fs_tensor_alloc3(&h, FS_F64, 2, hi - lo, C, NULL);
        for (int64_t bb = 0; bb < 2; bb++)
            for (int64_t i = lo; i < hi; i++)
                for (int64_t c = 0; c < C; c++) fs_tensor_set(&h, (bb * (hi - lo) + i - lo) * C + c, bb * 10000 + i * 100 + c);
        if (sabotaged("gather") && hi > lo) fs_tensor_set(&h, 0, -1); /* a wrong piece: rank 0 must see it */
        assert_int_equal(fs_tensor_alloc_on(&t, BACKENDS[b], FS_F64, 3, h.shape, NULL), 0);
        assert_int_equal(fs_tensor_upload(&t, &h, NULL), 0);
        fs_shard sh = {.ndims = 1, .d = {{.dim = 1, .n = 1, .iv = {{lo, hi}}}}};
        fs_gathered g;
        int64_t wrong = fs_gather_to_root(W, &t, &sh, &g, NULL) != 0;
        if (me == 0) {
            wrong += g.problem != 0 || g.global.shape[1] != S;
            for (int64_t bb = 0; !wrong && bb < 2; bb++)
                for (int64_t i = 0; i < S; i++)
                    for (int64_t c = 0; c < C; c++) wrong += fs_tensor_get(&g.global, (bb * S + i) * C + c) != bb * 10000 + i * 100 + c;
        }
        fs_gathered_free(&g);
        fs_tensor_free(&t);
        fs_tensor_free(&h);
        if (P > 1) { /* a replicated copy that differs on the last rank must be reported */
            fs_tensor r;
            fs_tensor_alloc2(&h, FS_F32, 3, 4, NULL);
            for (int i = 0; i < 12; i++) fs_tensor_set(&h, i, i + (me == P - 1 && i == 5 ? 1 : 0));
            assert_int_equal(fs_tensor_alloc_on(&r, BACKENDS[b], FS_F32, 2, h.shape, NULL), 0);
            assert_int_equal(fs_tensor_upload(&r, &h, NULL), 0);
            wrong += fs_gather_to_root(W, &r, NULL, &g, NULL) != 0;
            if (me == 0) wrong += g.problem != 1 || !strstr(g.detail, "replicated");
            fs_gathered_free(&g);
            fs_tensor_free(&r);
            fs_tensor_free(&h);
        }
        REPORT("gather to root (tiling)", BACKENDS[b], FS_F64, 2 * S * C, wrong);
    }
}

int main(int argc, char **argv)
{
    fs_err e = {0};
    if (fs_comm_init(&argc, &argv, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    W = fs_comm_world();
    BACKENDS[0] = fs_backend_cpu();
    BACKENDS[1] = fs_backend_cpu_strict();
    if (W->rank == 0) printf("collectives on %d rank(s):\n", W->size);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce), cmocka_unit_test(test_allgatherv_uneven), cmocka_unit_test(test_alltoallv),
        cmocka_unit_test(test_bcast),     cmocka_unit_test(test_ring_p2p),          cmocka_unit_test(test_gather_tiling),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rc = fs_allreduce_max_int(W, rc); /* every rank agrees on the exit code */
    fs_comm_finalize();
    return rc;
}
