/* test_parallel.c — the parallel layer's pieces that need no second rank, checked against
 * formulas written here independently of the code under test:
 *   - the backend's ring_merge (fs_backend.h): partial attentions over key blocks, merged with
 *     their LSEs, equal attention over all keys computed directly in float64;
 *   - fs_par_set_seq: every text and image token owned by exactly one sequence-parallel rank,
 *     in balanced contiguous chunks (the first S % P ranks one longer), torch.chunk's ceil
 *     chunks under --inject seq-uneven-chunk, and a layout with an empty rank refused;
 *   - the Ulysses layout transforms (fs_seqpar.h, fs_uly_*): pack matches an index formula, the
 *     all-to-all (simulated here by copying blocks between the ranks' buffers) delivers every
 *     token's head to the right place, and there and back is the identity.
 * Odd sizes everywhere (B, H, S, Dh, block lengths), so a transposed or off-by-one index cannot
 * hide behind a symmetric shape. */
#include "test_util.h"

#include <math.h>

#include "fs_backend.h"
#include "fs_inject.h"
#include "fs_par.h"
#include "fs_seqpar.h"

/* ---------------------------------------------------------------- ring_merge */

/* Deterministic values in [-1, 1) (no RNG dependence: a failure reproduces anywhere). */
static double val(uint64_t i)
{
    i = i * 6364136223846793005ULL + 1442695040888963407ULL;
    i ^= i >> 29;
    return (double)(i >> 11) / (double)(1ULL << 52) - 1.0;
}

/* out[b,s,h,:] = softmax_j(scale·q·k_j)·v_j over keys [j0, j1), lse[b,h,s] its log-sum-exp, in
 * float64: q [B,S,H,Dh], k/v [B,Skv,H,Dh] as plain arrays. The definition, written out. */
static void attention_f64(int64_t B, int64_t S, int64_t H, int64_t Dh, int64_t Skv, const double *q, const double *k,
                          const double *v, double scale, int64_t j0, int64_t j1, double *out, double *lse)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++) {
                const double *qi = q + ((b * S + s) * H + h) * Dh;
                double mx = -INFINITY, sum = 0, *o = out + ((b * S + s) * H + h) * Dh;
                for (int64_t j = j0; j < j1; j++) {
                    double d = 0;
                    for (int64_t c = 0; c < Dh; c++) d += qi[c] * k[((b * Skv + j) * H + h) * Dh + c];
                    mx = fmax(mx, scale * d);
                }
                for (int64_t c = 0; c < Dh; c++) o[c] = 0;
                for (int64_t j = j0; j < j1; j++) {
                    double d = 0;
                    for (int64_t c = 0; c < Dh; c++) d += qi[c] * k[((b * Skv + j) * H + h) * Dh + c];
                    const double p = exp(scale * d - mx);
                    sum += p;
                    for (int64_t c = 0; c < Dh; c++) o[c] += p * v[((b * Skv + j) * H + h) * Dh + c];
                }
                for (int64_t c = 0; c < Dh; c++) o[c] /= sum;
                lse[(b * H + h) * S + s] = mx + log(sum);
            }
}

/* Merges the partials of key blocks `blk` (lengths, nb of them; each computed in float64, then
 * stored in dt) with be->ring_merge in dtype dt, and compares with attention over all keys. */
static void ring_merge_case(fs_dtype dt, int64_t B, int64_t S, int64_t H, int64_t Dh, const int64_t *blk, int nb,
                            double tol)
{
    fs_backend *be = fs_backend_cpu();
    int64_t Skv = 0;
    for (int i = 0; i < nb; i++) Skv += blk[i];
    const int64_t no = B * S * H * Dh, nl = B * H * S, nkv = B * Skv * H * Dh;
    const double scale = 1.0 / sqrt((double)Dh);
    double *q = malloc(sizeof(double) * (size_t)no), *k = malloc(sizeof(double) * (size_t)nkv),
           *v = malloc(sizeof(double) * (size_t)nkv), *want = malloc(sizeof(double) * (size_t)no),
           *want_lse = malloc(sizeof(double) * (size_t)nl), *oi = malloc(sizeof(double) * (size_t)no),
           *li = malloc(sizeof(double) * (size_t)nl);
    assert_non_null(q && k && v && want && want_lse && oi && li);
    for (int64_t i = 0; i < no; i++) q[i] = 2 * val((uint64_t)i);
    for (int64_t i = 0; i < nkv; i++) k[i] = 2 * val((uint64_t)(i + 100000)), v[i] = val((uint64_t)(i + 200000));
    attention_f64(B, S, H, Dh, Skv, q, k, v, scale, 0, Skv, want, want_lse);

    fs_tensor acc = {0}, lse = {0}, part = {0}, plse = {0};
    const int64_t s4[4] = {B, S, H, Dh}, s3[3] = {B, H, S};
    assert_int_equal(fs_tensor_alloc_on(&acc, be, dt, 4, s4, NULL), 0);
    assert_int_equal(fs_tensor_alloc_on(&part, be, dt, 4, s4, NULL), 0);
    assert_int_equal(fs_tensor_alloc_on(&lse, be, dt, 3, s3, NULL), 0);
    assert_int_equal(fs_tensor_alloc_on(&plse, be, dt, 3, s3, NULL), 0);
    int64_t j0 = 0;
    for (int i = 0; i < nb; j0 += blk[i], i++) {
        attention_f64(B, S, H, Dh, Skv, q, k, v, scale, j0, j0 + blk[i], oi, li);
        /* the first partial is the running state itself, as the ring code starts it */
        fs_tensor *o = i ? &part : &acc, *l = i ? &plse : &lse;
        for (int64_t x = 0; x < no; x++) fs_tensor_set(o, x, oi[x]);
        for (int64_t x = 0; x < nl; x++) fs_tensor_set(l, x, li[x]);
        if (i) assert_int_equal(be->ring_merge(be, &acc, &lse, &part, &plse, NULL), 0);
    }
    double worst = 0, worst_lse = 0;
    for (int64_t x = 0; x < no; x++) worst = fmax(worst, fabs(fs_tensor_get(&acc, x) - want[x]));
    for (int64_t x = 0; x < nl; x++) worst_lse = fmax(worst_lse, fabs(fs_tensor_get(&lse, x) - want_lse[x]));
    if (!(worst <= tol) || !(worst_lse <= tol))
        fail_msg("ring_merge %s B%lld S%lld H%lld Dh%lld, %d blocks: out off by %.3g, lse by %.3g (tolerance %.3g)",
                 fs_dtype_name(dt), (long long)B, (long long)S, (long long)H, (long long)Dh, nb, worst, worst_lse, tol);
    fs_tensor_free(&acc);
    fs_tensor_free(&lse);
    fs_tensor_free(&part);
    fs_tensor_free(&plse);
    free(q), free(k), free(v), free(want), free(want_lse), free(oi), free(li);
}

static void test_ring_merge_equals_full_attention(void **state)
{
    (void)state;
    const int64_t three[] = {4, 1, 6}, one[] = {7}, five[] = {1, 2, 3, 1, 2};
    /* float64: the merge's rounding only; float32: the partials rounded to float32 first */
    for (int d = 0; d < 2; d++) {
        const fs_dtype dt = d ? FS_F32 : FS_F64;
        const double tol = d ? 2e-6 : 1e-13;
        ring_merge_case(dt, 3, 5, 3, 7, three, 3, tol);
        ring_merge_case(dt, 1, 1, 1, 1, five, 5, tol);
        ring_merge_case(dt, 2, 3, 5, 3, one, 1, tol); /* one block: nothing to merge, the partial itself */
        ring_merge_case(dt, 3, 7, 1, 5, five, 5, tol);
    }
}

/* The LSE rule's edges (fs_backend.h: "logσ, stable both ways"): a partial whose LSE is far
 * below the running one changes nothing, one far above replaces it, with neither a NaN nor an
 * infinity on the way (exp of the difference over- or underflows in a naive form). The
 * contract defines no -inf LSE (the ring code never merges an empty chunk: fs_seqpar.c skips
 * it), so none is tested. */
static void test_ring_merge_extreme_lse(void **state)
{
    (void)state;
    fs_backend *be = fs_backend_cpu();
    for (int d = 0; d < 2; d++) {
        const fs_dtype dt = d ? FS_F32 : FS_F64;
        for (int up = 0; up < 2; up++) {
            fs_tensor o = {0}, l = {0}, oi = {0}, li = {0};
            const int64_t s4[4] = {1, 3, 1, 2}, s3[3] = {1, 1, 3};
            assert_int_equal(fs_tensor_alloc_on(&o, be, dt, 4, s4, NULL), 0);
            assert_int_equal(fs_tensor_alloc_on(&oi, be, dt, 4, s4, NULL), 0);
            assert_int_equal(fs_tensor_alloc_on(&l, be, dt, 3, s3, NULL), 0);
            assert_int_equal(fs_tensor_alloc_on(&li, be, dt, 3, s3, NULL), 0);
            for (int x = 0; x < 6; x++) fs_tensor_set(&o, x, 1 + x), fs_tensor_set(&oi, x, -3 - x);
            for (int x = 0; x < 3; x++) fs_tensor_set(&l, x, 5), fs_tensor_set(&li, x, up ? 5 + 1000 : 5 - 1000);
            assert_int_equal(be->ring_merge(be, &o, &l, &oi, &li, NULL), 0);
            for (int x = 0; x < 6; x++) {
                const double got = fs_tensor_get(&o, x);
                assert_true(isfinite(got));
                assert_true(got == (up ? -3.0 - x : 1.0 + x));
            }
            for (int x = 0; x < 3; x++) {
                const double got = fs_tensor_get(&l, x);
                assert_true(isfinite(got));
                assert_true(got == (up ? 1005.0 : 5.0));
            }
            fs_tensor_free(&o);
            fs_tensor_free(&l);
            fs_tensor_free(&oi);
            fs_tensor_free(&li);
        }
    }
}

/* ---------------------------------------------------------------- fs_par_set_seq */

/* A layout of sp sequence-parallel ranks, without groups (set_seq and the Ulysses plan read
 * only the degrees, the coordinates and the partition). */
static fs_par seq_layout(int ulysses, int ring, const fs_inject *inj)
{
    fs_par p;
    memset(&p, 0, sizeof p);
    p.world = p.sp = ulysses * ring;
    p.tp = 1;
    p.ulysses = ulysses;
    p.ring = ring;
    p.inject = inj;
    return p;
}

/* [lo, hi) of P ranks tile [0, S) in rank order: every token owned exactly once. */
static void assert_tiles(const int64_t *lo, const int64_t *hi, int P, int64_t S)
{
    int64_t next = 0;
    for (int q = 0; q < P; q++) {
        assert_int_equal(lo[q], next);
        assert_true(hi[q] >= lo[q]);
        next = hi[q];
    }
    assert_int_equal(next, S);
}

static void test_set_seq_partitions(void **state)
{
    (void)state;
    const int cases[][3] = {{12, 24, 4}, {13, 35, 2}, {7, 11, 3}, {1, 10, 5}, {0, 9, 4}, {5, 5, 5}, {3, 100, 7}, {512, 4096, 6}};
    for (size_t c = 0; c < FS_ARRAY_LEN(cases); c++) {
        const int St = cases[c][0], Si = cases[c][1], P = cases[c][2];
        fs_par p = seq_layout(P, 1, NULL);
        fs_err e = {0};
        assert_int_equal(fs_par_set_seq(&p, St, Si, &e), 0);
        assert_int_equal(p.S_txt, St);
        assert_int_equal(p.S_img, Si);
        assert_tiles(p.txt_lo, p.txt_hi, P, St);
        assert_tiles(p.img_lo, p.img_hi, P, Si);
        /* balanced: rank q holds S/P tokens, and one more when q < S % P */
        for (int q = 0; q < P; q++) {
            assert_int_equal(fs_par_txt_n(&p, q), St / P + (q < St % P));
            assert_int_equal(fs_par_img_n(&p, q), Si / P + (q < Si % P));
        }
        /* a second partition replaces the first */
        assert_int_equal(fs_par_set_seq(&p, Si, St, &e), 0);
        assert_tiles(p.txt_lo, p.txt_hi, P, Si);
        assert_tiles(p.img_lo, p.img_hi, P, St);
        fs_par_free(&p);
    }
}

/* --inject seq-uneven-chunk: torch.chunk's chunks, ceil(S/P) each, the last ones shorter or
 * empty — still every token exactly once. */
static void test_set_seq_torch_chunk(void **state)
{
    (void)state;
    fs_inject inj = {0};
    assert_int_equal(fs_inject_add(&inj, "seq-uneven-chunk", NULL), 0);
    const int cases[][3] = {{13, 35, 2}, {7, 11, 3}, {10, 10, 4}, {3, 17, 4}};
    for (size_t c = 0; c < FS_ARRAY_LEN(cases); c++) {
        const int St = cases[c][0], Si = cases[c][1], P = cases[c][2];
        fs_par p = seq_layout(1, P, &inj);
        assert_int_equal(fs_par_set_seq(&p, St, Si, NULL), 0);
        assert_tiles(p.txt_lo, p.txt_hi, P, St);
        assert_tiles(p.img_lo, p.img_hi, P, Si);
        for (int q = 0; q < P; q++) {
            const int64_t ct = (St + P - 1) / P, ci = (Si + P - 1) / P;
            const int64_t wt = St - q * ct < 0 ? 0 : St - q * ct < ct ? St - q * ct : ct;
            const int64_t wi = Si - q * ci < 0 ? 0 : Si - q * ci < ci ? Si - q * ci : ci;
            assert_int_equal(fs_par_txt_n(&p, q), wt);
            assert_int_equal(fs_par_img_n(&p, q), wi);
        }
        fs_par_free(&p);
    }
}

/* More ranks than both the text and the image tokens: some rank would hold nothing. */
static void test_set_seq_refuses_empty_rank(void **state)
{
    (void)state;
    fs_par p = seq_layout(2, 3, NULL);
    fs_err e = {0};
    assert_int_equal(fs_par_set_seq(&p, 4, 5, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "would hold no token"));
    /* enough of one kind is enough: a rank may lack text or image tokens, not both */
    assert_int_equal(fs_par_set_seq(&p, 2, 6, &e), 0);
    assert_int_equal(fs_par_txt_n(&p, 5), 0);
    assert_int_equal(fs_par_img_n(&p, 5), 1);
    fs_par_free(&p);
}

/* ---------------------------------------------------------------- Ulysses layout */

enum { UMAX = 4 };

/* The all-to-all, by hand: rank w receives from every rank q the block q sends to w. */
static void simulate_alltoall(int U, fs_uly_plan *u, fs_tensor *send, fs_tensor *recv)
{
    for (int q = 0; q < U; q++)
        for (int w = 0; w < U; w++) {
            assert_int_equal(u[q].sc[w], u[w].rc[q]); /* what q sends to w is what w expects from q */
            memcpy((double *)recv[w].data + u[w].rd[q], (const double *)send[q].data + u[q].sd[w],
                   sizeof(double) * (size_t)u[q].sc[w]);
        }
}

/* x value of rank q's token t (local), head hd, batch b, feature d: unique per element */
static double xval(int q, int64_t b, int64_t t, int64_t hd, int64_t d) { return q * 1e6 + b * 1e5 + t * 1e3 + hd * 10 + d; }

static void ulysses_case(int U, int St, int Si, int64_t B, int64_t hb, int64_t Dh, const fs_inject *inj)
{
    fs_backend *be = fs_backend_cpu();
    const int64_t Hl = U * hb;
    fs_uly_plan u[UMAX];
    fs_par p[UMAX];
    fs_tensor x[UMAX], send[UMAX], recv[UMAX], y[UMAX], back[UMAX];
    for (int q = 0; q < U; q++) {
        p[q] = seq_layout(U, 1, inj);
        p[q].u_rank = p[q].sp_rank = q;
        assert_int_equal(fs_par_set_seq(&p[q], St, Si, NULL), 0);
        assert_int_equal(fs_uly_plan_make(&p[q], &u[q], NULL), 0);
        fs_uly_counts_to_heads(&u[q], B, hb, Dh);
    }
    /* pack to heads: block w = heads [w·hb, (w+1)·hb) of every local token, zero rows past s */
    for (int q = 0; q < U; q++) {
        const int64_t s = u[q].n[q], xs = u[q].x[q];
        assert_int_equal(s, fs_par_txt_n(&p[q], q) + fs_par_img_n(&p[q], q));
        assert_int_equal(fs_tensor_alloc_on(&x[q], be, FS_F64, 4, (int64_t[]){B, s, Hl, Dh}, NULL), 0);
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < s; t++)
                for (int64_t hd = 0; hd < Hl; hd++)
                    for (int64_t d = 0; d < Dh; d++)
                        ((double *)x[q].data)[((b * s + t) * Hl + hd) * Dh + d] = xval(q, b, t, hd, d);
        assert_int_equal(fs_tensor_alloc_on(&send[q], be, FS_F64, 1, (int64_t[]){U * B * xs * hb * Dh}, NULL), 0);
        assert_int_equal(fs_uly_pack_head_blocks(be, &u[q], &x[q], &send[q], NULL), 0);
        const double *sd = send[q].data;
        for (int w = 0; w < U; w++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t t = 0; t < xs; t++)
                    for (int64_t hh = 0; hh < hb; hh++)
                        for (int64_t d = 0; d < Dh; d++) {
                            const double got = sd[(((w * B + b) * xs + t) * hb + hh) * Dh + d];
                            assert_true(got == (t < s ? xval(q, b, t, w * hb + hh, d) : 0.0));
                        }
    }
    /* exchange and unpack: rank w holds heads [w·hb, (w+1)·hb) of the group's tokens, in rank order */
    const int64_t S_u = u[0].S_u;
    for (int w = 0; w < U; w++) {
        assert_int_equal(u[w].S_u, S_u);
        assert_int_equal(fs_tensor_alloc_on(&recv[w], be, FS_F64, 1, (int64_t[]){B * S_u * hb * Dh}, NULL), 0);
        assert_int_equal(fs_tensor_alloc_on(&y[w], be, FS_F64, 4, (int64_t[]){B, S_u, hb, Dh}, NULL), 0);
    }
    simulate_alltoall(U, u, send, recv);
    for (int w = 0; w < U; w++) {
        assert_int_equal(fs_uly_unpack_token_chunks(be, &u[w], &recv[w], NULL, &y[w], NULL), 0);
        for (int q = 0, t0 = 0; q < U; t0 += (int)u[w].x[q], q++) {
            assert_int_equal(u[w].toff[q], t0);
            for (int64_t b = 0; b < B; b++)
                for (int64_t t = 0; t < u[w].x[q]; t++)
                    for (int64_t hh = 0; hh < hb; hh++)
                        for (int64_t d = 0; d < Dh; d++) {
                            const double got = ((double *)y[w].data)[((b * S_u + t0 + t) * hb + hh) * Dh + d];
                            assert_true(got == (t < u[w].n[q] ? xval(q, b, t, w * hb + hh, d) : 0.0));
                        }
        }
        fs_tensor_free(&send[w]);
        fs_tensor_free(&recv[w]);
    }
    /* and back to tokens: the identity */
    for (int q = 0; q < U; q++) {
        fs_uly_counts_to_tokens(&u[q], B, hb, Dh);
        assert_int_equal(fs_tensor_alloc_on(&send[q], be, FS_F64, 1, (int64_t[]){B * S_u * hb * Dh}, NULL), 0);
        assert_int_equal(fs_tensor_alloc_on(&recv[q], be, FS_F64, 1, (int64_t[]){U * B * u[q].x[q] * hb * Dh}, NULL), 0);
        assert_int_equal(fs_uly_pack_token_chunks(be, &u[q], &y[q], &send[q], NULL), 0);
    }
    simulate_alltoall(U, u, send, recv);
    for (int q = 0; q < U; q++) {
        assert_int_equal(fs_tensor_alloc_on(&back[q], be, FS_F64, 4, x[q].shape, NULL), 0);
        assert_int_equal(fs_uly_unpack_head_blocks(be, &u[q], &recv[q], 0, &back[q], NULL), 0);
        assert_memory_equal(back[q].data, x[q].data, fs_tensor_nbytes(&x[q]));
    }
    for (int q = 0; q < U; q++) {
        fs_tensor_free(&x[q]);
        fs_tensor_free(&send[q]);
        fs_tensor_free(&recv[q]);
        fs_tensor_free(&y[q]);
        fs_tensor_free(&back[q]);
        fs_uly_plan_free(&u[q]);
        fs_par_free(&p[q]);
    }
}

static void test_ulysses_layout(void **state)
{
    (void)state;
    ulysses_case(2, 4, 6, 1, 1, 1, NULL);  /* even */
    ulysses_case(3, 5, 8, 2, 2, 3, NULL);  /* uneven: 5, 5, 3 tokens */
    ulysses_case(4, 13, 35, 3, 1, 5, NULL); /* uneven, odd B and Dh */
    ulysses_case(3, 0, 7, 1, 3, 1, NULL);  /* no text tokens */
}

/* --inject ulysses-uneven-chunk: every member exchanges the longest shard, zero-padded; the
 * padding reaches the head-sharded side as zero tokens (checked in ulysses_case), and the way
 * back still returns each rank exactly its tokens. */
static void test_ulysses_layout_padded(void **state)
{
    (void)state;
    fs_inject inj = {0};
    assert_int_equal(fs_inject_add(&inj, "ulysses-uneven-chunk", NULL), 0);
    ulysses_case(3, 5, 8, 2, 2, 3, &inj);
    ulysses_case(4, 13, 35, 3, 1, 5, &inj);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_merge_equals_full_attention),
        cmocka_unit_test(test_ring_merge_extreme_lse),
        cmocka_unit_test(test_set_seq_partitions),
        cmocka_unit_test(test_set_seq_torch_chunk),
        cmocka_unit_test(test_set_seq_refuses_empty_rank),
        cmocka_unit_test(test_ulysses_layout),
        cmocka_unit_test(test_ulysses_layout_padded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
