#include "fs_seqpar.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Every buffer here is in the backend's memory; packing, padding and rotation are backend 2-D
 * copies, exchanges go through fs_comm's tensor collectives (which stage through host memory
 * when the backend's is not host-addressable). */

/* Tokens held by SP rank q (its text chunk + its image chunk). */
static int64_t tokens_of(const fs_par *p, int q) { return fs_par_txt_n(p, q) + fs_par_img_n(p, q); }

int64_t fs_seqpar_uly_block(const fs_par *p, int q)
{
    int64_t n = tokens_of(p, q);
    if (p->ulysses > 1 && fs_injected(p->inject, FS_INJ_ULYSSES_UNEVEN_CHUNK)) /* torch.chunk's equal blocks */
        for (int w = 0, g = q / p->ulysses * p->ulysses; w < p->ulysses; w++)
            if (tokens_of(p, g + w) > n) n = tokens_of(p, g + w);
    return n;
}

int64_t fs_seqpar_ring_chunk(const fs_par *p, int j)
{
    int64_t n = 0;
    for (int w = 0; w < p->ulysses; w++) n += fs_seqpar_uly_block(p, j * p->ulysses + w);
    return n;
}

static int alloc4(fs_backend *be, fs_tensor *t, fs_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d, fs_err *e)
{
    int64_t s[4] = {a, b, c, d};
    return fs_tensor_alloc_on(t, be, dt, 4, s, e);
}

/* rows × width bytes between pitched blocks of backend memory */
static int copy2d(fs_backend *be, void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t rows, fs_err *e)
{
    return be->copy2d(be, dst, dp, src, sp, w, rows, e);
}

/* ---------------------------------------------------------------- ring */

/* --inject seq-uneven-chunk (seed 002): every ring chunk treated as if it had the largest
 * chunk's length — this rank's K/V zero-padded to it, and the padding attended like real tokens
 * (K/V gathered "as if equal" with unmasked zero padding). *k, *v are replaced by the padded
 * copies when they are shorter. */
static int inject_pad_chunk(fs_backend *be, const fs_tensor **k, const fs_tensor **v, int64_t maxn, fs_tensor *kpad,
                            fs_tensor *vpad, fs_err *e)
{
    const fs_tensor *K = *k, *V = *v;
    if (K->shape[1] >= maxn) return FS_OK;
    const int64_t B = K->shape[0], h = K->shape[2], Dh = K->shape[3];
    const size_t es = fs_dtype_size(K->dtype), own = (size_t)(K->shape[1] * h * Dh) * es, pad = (size_t)(maxn * h * Dh) * es;
    int rc;
    if ((rc = alloc4(be, kpad, K->dtype, B, maxn, h, Dh, e)) || (rc = alloc4(be, vpad, K->dtype, B, maxn, h, Dh, e)) ||
        (rc = copy2d(be, kpad->data, pad, K->data, own, own, (size_t)B, e)) ||
        (rc = copy2d(be, vpad->data, pad, V->data, own, own, (size_t)B, e))) {
        fs_tensor_free(kpad);
        fs_tensor_free(vpad);
        return rc;
    }
    *k = kpad;
    *v = vpad;
    return FS_OK;
}

/* --inject ring-no-lse: the k-th partial averaged into the running output, out ← out + (out_i −
 * out)/(k+1), the LSEs ignored (a common first attempt). tmp: out_i upcast first when out is a
 * float32 accumulator of bf16 partials. */
static int ring_average(fs_backend *be, fs_tensor *acc, const fs_tensor *oi, fs_tensor *tmp, int k, fs_err *e)
{
    int rc = tmp ? be->convert(be, tmp, oi, e) : FS_OK;
    fs_inject_fire(FS_INJ_RING_NO_LSE);
    return rc ? rc : be->axpby(be, acc, (double)k / (k + 1), tmp ? tmp : oi, 1.0 / (k + 1), e);
}

/* Attention of q against the K/V chunks of the ring group, merged with the LSE rule.
 * q [B, Sq, h, Dh]; k, v [B, Skv_own, h, Dh]; o [B, Sq, h, Dh]. */
static int ring_attention(const fs_par *p, fs_backend *be, fs_tensor *o, const fs_tensor *q, const fs_tensor *k,
                          const fs_tensor *v, fs_err *e)
{
    const int R = p->ring, r = p->r_rank;
    const fs_dtype dt = q->dtype;
    const int64_t B = q->shape[0], Sq = q->shape[1], h = q->shape[2], Dh = q->shape[3];
    const double scale = 1.0 / sqrt((double)Dh);
    const size_t es = fs_dtype_size(dt);
    const int64_t row = h * Dh; /* elements per token */
    int64_t *n = malloc(sizeof(int64_t) * 2 * (size_t)R), *off = n + R, total = 0, maxn = 0;
    if (!n) return fs_errf(e, FS_E_NOMEM, "out of memory");
    int rc = FS_OK;
    for (int j = 0; j < R; j++) {
        n[j] = fs_seqpar_ring_chunk(p, j);
        if (n[j] > maxn) maxn = n[j];
    }
    const int as_equal = fs_injected(p->inject, FS_INJ_SEQ_UNEVEN_CHUNK);
    fs_tensor kpad = {0}, vpad = {0};
    if (as_equal && (rc = inject_pad_chunk(be, &k, &v, maxn, &kpad, &vpad, e))) { /* --inject seq-uneven-chunk */
        free(n);
        return rc;
    }
    for (int j = 0; j < R; j++) {
        if (as_equal && n[j] < maxn) fs_inject_fire(FS_INJ_SEQ_UNEVEN_CHUNK);
        if (as_equal) n[j] = maxn;
        off[j] = total;
        total += n[j];
    }
    /* The kernel writes its LSE in the backend's declared layout; the merge reads [B, H, S]: the
     * conversion is explicit and uses the declared layout, never a shape (seed 001). --inject
     * lse-layout assumes the other layout instead, as code that guessed it would. */
    const fs_lse_layout native = be->lse_layout,
                        assumed = (fs_lse_layout)fs_inject_lse_layout_assumed(p->inject, (int)native);
    const fs_dtype ldt = dt == FS_F64 ? FS_F64 : FS_F32; /* LSE: float32 (float64 runs: float64) */
    /* The running output: o itself, or for bfloat16 a float32 accumulator — diffusers'
     * convert_to_fp32=True: each partial (rounded once by the kernel) is upcast and merged in
     * float32, and the result rounded once at the end. */
    fs_tensor oi = {0}, lse = {0}, lsei = {0}, raw = {0}, kb[2] = {{0}}, vb[2] = {{0}}, sk = {0}, sv = {0}, acc32 = {0},
              oi32 = {0};
    fs_tensor *acc = o;
    int64_t sl[3] = {B, h, Sq};
    if ((rc = alloc4(be, &oi, dt, B, Sq, h, Dh, e)) || (rc = fs_tensor_alloc_on(&lse, be, ldt, 3, sl, e)) ||
        (rc = fs_tensor_alloc_on(&lsei, be, ldt, 3, sl, e)) ||
        (assumed != FS_LSE_BHS && (rc = fs_tensor_alloc_on(&raw, be, ldt, 3, sl, e))))
        goto out;
    if (dt != ldt) {
        if ((rc = alloc4(be, &acc32, ldt, B, Sq, h, Dh, e)) || (rc = alloc4(be, &oi32, ldt, B, Sq, h, Dh, e))) goto out;
        acc = &acc32;
    }

    int have = 0; /* chunks merged into (acc, lse) so far */
    const int no_lse = fs_injected(p->inject, FS_INJ_RING_NO_LSE);
#define VISIT(KT, VT)                                                                                             \
    do {                                                                                                          \
        if ((KT)->shape[1] > 0 && Sq > 0) {                                                                       \
            fs_tensor *ot = have || acc != o ? &oi : o, *lt = have ? &lsei : &lse;                                \
            if ((rc = be->attention(be, ot, assumed == FS_LSE_BHS ? lt : &raw, q, (KT), (VT), scale, e))) goto out; \
            if (assumed != FS_LSE_BHS && (rc = be->lse_convert(be, lt, FS_LSE_BHS, &raw, assumed, B, h, Sq, e)))  \
                goto out;                                                                                         \
            if (!have && acc != o)                                                                                \
                rc = be->convert(be, acc, &oi, e);                                                                \
            else if (have && no_lse) /* --inject ring-no-lse: partials averaged, the LSEs ignored */              \
                rc = ring_average(be, acc, &oi, acc != o ? &oi32 : NULL, have, e);                                \
            else if (have)                                                                                        \
                rc = be->ring_merge(be, acc, &lse, &oi, &lsei, e);                                                \
            if (rc) goto out;                                                                                     \
            have++;                                                                                               \
        }                                                                                                         \
    } while (0)

    if (p->rotate == FS_RING_ALLGATHER) {
        /* diffusers: all_gather the K/V buffers, then visit chunk (r + i) mod R. Each chunk is
         * gathered as its own [B, n_j, h, Dh] block. */
        int64_t *cnt = malloc(sizeof(int64_t) * 2 * (size_t)R), *dsp = cnt ? cnt + R : NULL;
        if (!cnt) {
            rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            goto out;
        }
        for (int j = 0; j < R; j++) {
            cnt[j] = B * n[j] * row;
            dsp[j] = B * off[j] * row;
        }
        if ((rc = alloc4(be, &kb[0], dt, 1, B * total, h, Dh, e)) || (rc = alloc4(be, &vb[0], dt, 1, B * total, h, Dh, e)) ||
            (rc = fs_allgatherv_t(&p->g_r, k, &kb[0], cnt, dsp, e)) || (rc = fs_allgatherv_t(&p->g_r, v, &vb[0], cnt, dsp, e))) {
            free(cnt);
            goto out;
        }
        free(cnt);
        for (int i = 0; i < R; i++) {
            int j = (r + i) % R;
            int64_t s4[4] = {B, n[j], h, Dh};
            fs_tensor kj = fs_tensor_reshape(&kb[0], 4, s4), vj = kj;
            kj.data = (char *)kb[0].data + (size_t)(B * off[j] * row) * es;
            vj.data = (char *)vb[0].data + (size_t)(B * off[j] * row) * es;
            VISIT(&kj, &vj);
        }
    } else {
        /* point-to-point: at step i this rank holds chunk (r - i) mod R; it sends it to r+1 and
         * receives chunk (r - i - 1) mod R from r-1 while it computes on the current one. */
        for (int b = 0; b < 2; b++)
            if ((rc = alloc4(be, &kb[b], dt, B, maxn, h, Dh, e)) || (rc = alloc4(be, &vb[b], dt, B, maxn, h, Dh, e))) goto out;
        const size_t kn = fs_tensor_nbytes(k), vn = fs_tensor_nbytes(v);
        if ((rc = copy2d(be, kb[0].data, kn, k->data, kn, kn, 1, e)) || (rc = copy2d(be, vb[0].data, vn, v->data, vn, vn, 1, e)))
            goto out;
        int cur = 0;
        /* --inject overlap-early-read: the chunk is read before its Irecv completed; made
         * deterministic by reading a snapshot of the receive buffer taken when it was posted */
        const int early = fs_injected(p->inject, FS_INJ_OVERLAP_EARLY_READ);
        if (early && ((rc = alloc4(be, &sk, dt, B, maxn, h, Dh, e)) || (rc = alloc4(be, &sv, dt, B, maxn, h, Dh, e)))) goto out;
        for (int i = 0; i < R; i++) {
            int j = ((r - i) % R + R) % R, jn = ((r - i - 1) % R + R) % R;
            fs_ring_req rk = {0}, rv = {0};
            if (i < R - 1) {
                const size_t sn = fs_tensor_nbytes(&sk);
                if (early && ((rc = copy2d(be, sk.data, sn, kb[1 - cur].data, sn, sn, 1, e)) ||
                              (rc = copy2d(be, sv.data, sn, vb[1 - cur].data, sn, sn, 1, e))))
                    goto out;
                if ((rc = fs_ring_start(&p->g_r, &kb[cur], B * n[j] * row, (r + 1) % R, &kb[1 - cur], B * n[jn] * row,
                                        (r - 1 + R) % R, 2 * i, &rk, e)) ||
                    (rc = fs_ring_start(&p->g_r, &vb[cur], B * n[j] * row, (r + 1) % R, &vb[1 - cur], B * n[jn] * row,
                                        (r - 1 + R) % R, 2 * i + 1, &rv, e)))
                    goto out; /* the CLI ends the job: a peer may be inside the exchange */
            }
            int64_t s4[4] = {B, n[j], h, Dh};
            if (i > 0 && early) fs_inject_fire(FS_INJ_OVERLAP_EARLY_READ);
            fs_tensor kj = fs_tensor_reshape(i > 0 && early ? &sk : &kb[cur], 4, s4),
                      vj = fs_tensor_reshape(i > 0 && early ? &sv : &vb[cur], 4, s4);
            VISIT(&kj, &vj);
            int rc1 = fs_ring_wait(&rk, e), rc2 = fs_ring_wait(&rv, e);
            if ((rc = rc1 ? rc1 : rc2)) goto out;
            cur = 1 - cur;
        }
    }
#undef VISIT
    if (!have && Sq > 0) rc = fs_errf(e, FS_E_INTERNAL, "ring attention: no keys at all");
    else if (acc != o && Sq > 0) rc = be->convert(be, o, acc, e); /* out.to(query.dtype): one rounding */
out:
    free(n);
    fs_tensor_free(&kpad);
    fs_tensor_free(&vpad);
    fs_tensor_free(&oi);
    fs_tensor_free(&lse);
    fs_tensor_free(&lsei);
    fs_tensor_free(&raw);
    fs_tensor_free(&sk);
    fs_tensor_free(&sv);
    fs_tensor_free(&acc32);
    fs_tensor_free(&oi32);
    for (int b = 0; b < 2; b++) {
        fs_tensor_free(&kb[b]);
        fs_tensor_free(&vb[b]);
    }
    return rc;
}

static int local_or_ring(const fs_par *p, fs_backend *be, fs_tensor *o, const fs_tensor *q, const fs_tensor *k,
                         const fs_tensor *v, fs_err *e)
{
    if (p->ring > 1) return ring_attention(p, be, o, q, k, v, e);
    if (q->shape[1] == 0) return FS_OK;
    return be->attention(be, o, NULL, q, k, v, 1.0 / sqrt((double)q->shape[3]), e);
}

/* ---------------------------------------------------------------- Ulysses */

/* Token counts of the Ulysses group's members, the tokens each exchanges (its own, or padded
 * under --inject ulysses-uneven-chunk) and their offsets in the gathered sequence. */
typedef struct uly_plan {
    int64_t *n, *x, *toff, *sc, *sd, *rc, *rd, S_u;
} uly_plan;

static int uly_plan_make(const fs_par *p, uly_plan *u, fs_err *e)
{
    const int U = p->ulysses;
    u->n = malloc(sizeof(int64_t) * 7 * (size_t)U);
    if (!u->n) return fs_errf(e, FS_E_NOMEM, "out of memory");
    u->x = u->n + U, u->toff = u->n + 2 * U, u->sc = u->n + 3 * U, u->sd = u->n + 4 * U, u->rc = u->n + 5 * U,
    u->rd = u->n + 6 * U;
    u->S_u = 0;
    for (int w = 0; w < U; w++) {
        u->n[w] = tokens_of(p, p->r_rank * U + w);
        u->x[w] = fs_seqpar_uly_block(p, p->r_rank * U + w);
        if (u->x[w] != u->n[w]) fs_inject_fire(FS_INJ_ULYSSES_UNEVEN_CHUNK);
        u->toff[w] = u->S_u;
        u->S_u += u->x[w];
    }
    return FS_OK;
}

/* Sequence-sharded x [B, s_loc, Hl, Dh] → head-sharded y [B, S_u, Hl/U, Dh]: head block w goes
 * to Ulysses rank w; the received token chunks are laid out in rank order.
 * --inject ulysses-uneven-chunk (seed 002 under Ulysses): the exchange is torch.chunk's equal
 * blocks — every member sends as many tokens as the group's longest shard, a short shard padded
 * with zero tokens — and the receiver takes all U·max tokens as the sequence: the padding is
 * attended like real tokens (unmasked). The inverse exchange sends the padded rows back and
 * the owner keeps its first s_loc.
 * --inject ulysses-early-read (seed 003 under Ulysses; `early`): the receive buffer is read
 * before the exchange completed. Made deterministic: the blocks from the other ranks are taken
 * from a snapshot of the receive buffer taken when the exchange was posted (a fresh buffer:
 * zeros); the rank's own block, copied locally at posting as MPI implementations do, is right. */
static int ulysses_scatter_heads(const fs_par *p, fs_backend *be, const fs_tensor *x, fs_tensor *y, int early, fs_err *e)
{
    const int U = p->ulysses, me = p->u_rank;
    const fs_dtype dt = x->dtype;
    const size_t es = fs_dtype_size(dt);
    const int64_t B = x->shape[0], s = x->shape[1], Hl = x->shape[2], Dh = x->shape[3], hb = Hl / U;
    uly_plan u;
    fs_tensor send = {0}, recv = {0}, stale = {0};
    int rc = uly_plan_make(p, &u, e);
    if (rc) return rc;
    const int64_t xs = u.x[me]; /* tokens per block this rank sends: s, or padded */
    if ((rc = alloc4(be, y, dt, B, u.S_u, hb, Dh, e)) || (rc = alloc4(be, &send, dt, 1, B * xs, Hl, Dh, e)) ||
        (rc = alloc4(be, &recv, dt, 1, B * u.S_u, hb, Dh, e)))
        goto out;
    const size_t blk = (size_t)(hb * Dh) * es, xrow = (size_t)(Hl * Dh) * es; /* one token's head block; a token */
    for (int w = 0; w < U; w++) { /* pack: block w = [B, xs, hb, Dh] of heads [w·hb, (w+1)·hb) (zero rows past s) */
        u.sc[w] = B * xs * hb * Dh;
        u.sd[w] = w * u.sc[w];
        u.rc[w] = B * u.x[w] * hb * Dh;
        u.rd[w] = B * u.toff[w] * hb * Dh;
        for (int64_t b = 0; b < (xs == s ? 1 : B); b++) /* one copy when unpadded: the batches are contiguous */
            if ((rc = copy2d(be, (char *)send.data + (size_t)(u.sd[w] + b * xs * hb * Dh) * es, blk,
                             (const char *)x->data + (size_t)(b * s) * xrow + (size_t)w * blk, xrow, blk,
                             (size_t)(xs == s ? B * s : s), e)))
                goto out;
    }
    if (early) { /* --inject ulysses-early-read: what the receive buffer holds when the exchange is posted */
        const size_t rn = fs_tensor_nbytes(&recv);
        if ((rc = alloc4(be, &stale, dt, 1, B * u.S_u, hb, Dh, e)) ||
            (rc = copy2d(be, stale.data, rn, recv.data, rn, rn, 1, e)))
            goto out;
    }
    if ((rc = fs_alltoallv_t(&p->g_u, &send, u.sc, u.sd, &recv, u.rc, u.rd, e))) goto out;
    for (int w = 0; w < U; w++) { /* unpack: source w's [B, x_w, hb, Dh] into tokens [toff_w, +x_w) */
        const fs_tensor *src = early && w != me ? &stale : &recv;
        if (early && w != me) fs_inject_fire(FS_INJ_ULYSSES_EARLY_READ);
        if ((rc = copy2d(be, (char *)y->data + (size_t)u.toff[w] * blk, (size_t)u.S_u * blk,
                         (const char *)src->data + (size_t)u.rd[w] * es, (size_t)u.x[w] * blk, (size_t)u.x[w] * blk,
                         (size_t)B, e)))
            goto out;
    }
out:
    fs_tensor_free(&send);
    fs_tensor_free(&recv);
    fs_tensor_free(&stale);
    free(u.n);
    return rc;
}

/* The inverse: head-sharded y [B, S_u, Hl/U, Dh] → sequence-sharded x [B, s_loc, Hl, Dh]. */
static int ulysses_gather_heads(const fs_par *p, fs_backend *be, const fs_tensor *y, fs_tensor *x, fs_err *e)
{
    const int U = p->ulysses, me = p->u_rank;
    const fs_dtype dt = y->dtype;
    const size_t es = fs_dtype_size(dt);
    const int64_t B = x->shape[0], s = x->shape[1], Hl = x->shape[2], Dh = x->shape[3], hb = Hl / U;
    uly_plan u;
    fs_tensor send = {0}, recv = {0};
    int rc = uly_plan_make(p, &u, e);
    if (rc) return rc;
    const int64_t xs = u.x[me];
    if ((rc = alloc4(be, &send, dt, 1, B * u.S_u, hb, Dh, e)) || (rc = alloc4(be, &recv, dt, 1, B * xs, Hl, Dh, e))) goto out;
    const size_t blk = (size_t)(hb * Dh) * es, xrow = (size_t)(Hl * Dh) * es;
    for (int w = 0; w < U; w++) { /* to rank w: its tokens (padded rows included) of my head block */
        u.sc[w] = B * u.x[w] * hb * Dh;
        u.sd[w] = B * u.toff[w] * hb * Dh;
        u.rc[w] = B * xs * hb * Dh;
        u.rd[w] = w * u.rc[w];
        if ((rc = copy2d(be, (char *)send.data + (size_t)u.sd[w] * es, (size_t)u.x[w] * blk,
                         (const char *)y->data + (size_t)u.toff[w] * blk, (size_t)u.S_u * blk, (size_t)u.x[w] * blk,
                         (size_t)B, e)))
            goto out;
    }
    if ((rc = fs_alltoallv_t(&p->g_u, &send, u.sc, u.sd, &recv, u.rc, u.rd, e))) goto out;
    /* --inject ulysses-head-order: the inverse all-to-all puts head block w back at U-1-w */
    const int flip = fs_injected(p->inject, FS_INJ_ULYSSES_HEAD_ORDER);
    if (flip) fs_inject_fire(FS_INJ_ULYSSES_HEAD_ORDER);
    for (int w = 0; w < U; w++) /* from rank w: my first s tokens of its head block w */
        for (int64_t b = 0; b < (xs == s ? 1 : B); b++)
            if ((rc = copy2d(be, (char *)x->data + (size_t)(b * s) * xrow + (size_t)(flip ? U - 1 - w : w) * blk, xrow,
                             (const char *)recv.data + (size_t)(u.rd[w] + b * xs * hb * Dh) * es, blk, blk,
                             (size_t)(xs == s ? B * s : s), e)))
                goto out;
out:
    fs_tensor_free(&send);
    fs_tensor_free(&recv);
    free(u.n);
    return rc;
}

int fs_seqpar_attention(const fs_par *p, fs_backend *be, fs_tensor *o, const fs_tensor *q, const fs_tensor *k,
                        const fs_tensor *v, fs_err *e)
{
    if (p->ulysses == 1) return local_or_ring(p, be, o, q, k, v, e);
    if (q->shape[2] % p->ulysses)
        return fs_errf(e, FS_E_INPUT, "Ulysses degree %d does not divide the %lld local heads", p->ulysses,
                       (long long)q->shape[2]);
    fs_tensor qu = {0}, ku = {0}, vu = {0}, ou = {0};
    int rc;
    /* --inject ulysses-early-read: K and V's exchanges overlapped with Q's, and read before their wait */
    const int early = fs_injected(p->inject, FS_INJ_ULYSSES_EARLY_READ);
    if ((rc = ulysses_scatter_heads(p, be, q, &qu, 0, e)) || (rc = ulysses_scatter_heads(p, be, k, &ku, early, e)) ||
        (rc = ulysses_scatter_heads(p, be, v, &vu, early, e)))
        goto out;
    if ((rc = fs_tensor_alloc_on(&ou, be, qu.dtype, 4, qu.shape, e))) goto out;
    if ((rc = local_or_ring(p, be, &ou, &qu, &ku, &vu, e))) goto out;
    rc = ulysses_gather_heads(p, be, &ou, o, e);
out:
    fs_tensor_free(&qu);
    fs_tensor_free(&ku);
    fs_tensor_free(&vu);
    fs_tensor_free(&ou);
    return rc;
}
