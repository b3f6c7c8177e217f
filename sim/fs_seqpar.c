#include "fs_seqpar.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Tokens held by SP rank q (its text chunk + its image chunk). */
static int64_t tokens_of(const fs_par *p, int q) { return fs_par_txt_n(p, q) + fs_par_img_n(p, q); }

/* Tokens a ring member j attends with: the concatenation over its Ulysses group. */
static int64_t ring_chunk_tokens(const fs_par *p, int j)
{
    int64_t n = 0;
    for (int w = 0; w < p->ulysses; w++) n += tokens_of(p, j * p->ulysses + w);
    return n;
}

static int alloc4(fs_tensor *t, fs_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d, fs_err *e)
{
    int64_t s[4] = {a, b, c, d};
    return fs_tensor_alloc(t, dt, 4, s, e);
}

/* ---------------------------------------------------------------- ring */

/* --inject lse-layout: the attention kernel hands back its LSE as [B, S, H] (what ROCm's flash
 * kernel returned, seed 001) while the merge indexes it as [B, H, S]. */
static void lse_to_bsh(fs_tensor *lse)
{
    const int64_t B = lse->shape[0], H = lse->shape[1], S = lse->shape[2];
    fs_tensor tmp;
    if (fs_tensor_alloc(&tmp, lse->dtype, lse->ndim, lse->shape, NULL)) fs_comm_abort(FS_E_NOMEM);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t s = 0; s < S; s++) fs_tensor_set(&tmp, (b * S + s) * H + h, fs_tensor_get(lse, (b * H + h) * S + s));
    fs_tensor_copy(lse, &tmp, NULL);
    fs_tensor_free(&tmp);
}

/* The merge indexes the LSE as [B, H, S]: check the shape it was given, never infer it. */
static int lse_shape_ok(const fs_tensor *l, int64_t B, int64_t H, int64_t S)
{
    return l->ndim == 3 && l->shape[0] == B && l->shape[1] == H && l->shape[2] == S;
}

/* --inject ring-no-lse: partials averaged, out ← out + (out_i − out)/(k+1), ignoring the LSEs. */
static void average_into(fs_tensor *o, const fs_tensor *oi, int k)
{
    for (int64_t i = 0; i < fs_tensor_numel(o); i++) {
        double a = fs_tensor_get(o, i);
        fs_tensor_set(o, i, a + (fs_tensor_get(oi, i) - a) / (k + 1));
    }
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
    int rc;
    for (int j = 0; j < R; j++) {
        n[j] = ring_chunk_tokens(p, j);
        if (n[j] > maxn) maxn = n[j];
    }
    /* --inject seq-uneven-chunk: every chunk treated as if it had the largest chunk's length —
     * this rank's K/V zero-padded to it and the padding attended like real tokens */
    const int as_equal = fs_injected(p->inject, FS_INJ_SEQ_UNEVEN_CHUNK);
    fs_tensor kpad = {0}, vpad = {0};
    if (as_equal && k->shape[1] < maxn) {
        if ((rc = alloc4(&kpad, dt, B, maxn, h, Dh, e)) || (rc = alloc4(&vpad, dt, B, maxn, h, Dh, e))) {
            free(n);
            return rc;
        }
        for (int64_t b = 0; b < B; b++) {
            memcpy((char *)kpad.data + (size_t)(b * maxn * row) * es, (const char *)k->data + (size_t)(b * k->shape[1] * row) * es,
                   (size_t)(k->shape[1] * row) * es);
            memcpy((char *)vpad.data + (size_t)(b * maxn * row) * es, (const char *)v->data + (size_t)(b * v->shape[1] * row) * es,
                   (size_t)(v->shape[1] * row) * es);
        }
        k = &kpad;
        v = &vpad;
    }
    for (int j = 0; j < R; j++) {
        if (as_equal) n[j] = maxn;
        off[j] = total;
        total += n[j];
    }
    fs_tensor oi = {0}, lse = {0}, lsei = {0}, kb[2] = {{0}}, vb[2] = {{0}};
    int64_t sl[3] = {B, h, Sq};
    if ((rc = alloc4(&oi, dt, B, Sq, h, Dh, e)) || (rc = fs_tensor_alloc(&lse, dt, 3, sl, e)) ||
        (rc = fs_tensor_alloc(&lsei, dt, 3, sl, e)))
        goto out;

    int have = 0; /* chunks merged into (o, lse) so far */
    const int bad_lse = fs_injected(p->inject, FS_INJ_LSE_LAYOUT), no_lse = fs_injected(p->inject, FS_INJ_RING_NO_LSE);
#define VISIT(KT, VT)                                                                         \
    do {                                                                                      \
        if ((KT)->shape[1] > 0 && Sq > 0) {                                                   \
            if ((rc = be->attention(have ? &oi : o, have ? &lsei : &lse, FS_LSE_BHS, q, (KT), (VT), scale, e))) \
                goto out;                                                                     \
            if (bad_lse) lse_to_bsh(have ? &lsei : &lse);                                     \
            if (!lse_shape_ok(have ? &lsei : &lse, B, h, Sq)) {                               \
                rc = fs_errf(e, FS_E_INTERNAL, "ring attention: LSE is not [B, H, S] = [%lld, %lld, %lld]", \
                             (long long)B, (long long)h, (long long)Sq);                      \
                goto out;                                                                     \
            }                                                                                 \
            if (have && no_lse) average_into(o, &oi, have);                                   \
            else if (have) be->ring_merge(o, &lse, &oi, &lsei, FS_LSE_BHS);                   \
            have++;                                                                           \
        }                                                                                     \
    } while (0)

    if (p->rotate == FS_RING_ALLGATHER) {
        /* diffusers: all_gather the K/V buffers, then visit chunk (r + i) mod R. Each chunk is
         * gathered as its own [B, n_j, h, Dh] block. */
        int64_t *cnt = malloc(sizeof(int64_t) * 2 * (size_t)R), *dsp = cnt + R;
        for (int j = 0; j < R; j++) {
            cnt[j] = B * n[j] * row;
            dsp[j] = B * off[j] * row;
        }
        if ((rc = alloc4(&kb[0], dt, 1, B * total, h, Dh, e)) || (rc = alloc4(&vb[0], dt, 1, B * total, h, Dh, e))) {
            free(cnt);
            goto out;
        }
        fs_allgatherv(&p->g_r, dt, k->data, fs_tensor_numel(k), kb[0].data, cnt, dsp);
        fs_allgatherv(&p->g_r, dt, v->data, fs_tensor_numel(v), vb[0].data, cnt, dsp);
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
            if ((rc = alloc4(&kb[b], dt, B, maxn, h, Dh, e)) || (rc = alloc4(&vb[b], dt, B, maxn, h, Dh, e))) goto out;
        memcpy(kb[0].data, k->data, fs_tensor_nbytes(k));
        memcpy(vb[0].data, v->data, fs_tensor_nbytes(v));
        int cur = 0;
        /* --inject overlap-early-read: the chunk is read before its Irecv completed; made
         * deterministic by reading a snapshot of the receive buffer taken when it was posted */
        const int early = fs_injected(p->inject, FS_INJ_OVERLAP_EARLY_READ);
        fs_tensor sk = {0}, sv = {0};
        if (early && ((rc = alloc4(&sk, dt, B, maxn, h, Dh, e)) || (rc = alloc4(&sv, dt, B, maxn, h, Dh, e)))) goto out;
        for (int i = 0; i < R; i++) {
            int j = ((r - i) % R + R) % R, jn = ((r - i - 1) % R + R) % R;
            fs_ring_req rk = {{0}}, rv = {{0}};
            if (i < R - 1) {
                if (early) {
                    memcpy(sk.data, kb[1 - cur].data, fs_tensor_nbytes(&sk));
                    memcpy(sv.data, vb[1 - cur].data, fs_tensor_nbytes(&sv));
                }
                fs_ring_start(&p->g_r, dt, kb[cur].data, B * n[j] * row, (r + 1) % R, kb[1 - cur].data, B * n[jn] * row,
                              (r - 1 + R) % R, 2 * i, &rk);
                fs_ring_start(&p->g_r, dt, vb[cur].data, B * n[j] * row, (r + 1) % R, vb[1 - cur].data, B * n[jn] * row,
                              (r - 1 + R) % R, 2 * i + 1, &rv);
            }
            int64_t s4[4] = {B, n[j], h, Dh};
            fs_tensor kj = fs_tensor_reshape(i > 0 && early ? &sk : &kb[cur], 4, s4),
                      vj = fs_tensor_reshape(i > 0 && early ? &sv : &vb[cur], 4, s4);
            VISIT(&kj, &vj);
            fs_ring_wait(&rk);
            fs_ring_wait(&rv);
            cur = 1 - cur;
        }
        fs_tensor_free(&sk);
        fs_tensor_free(&sv);
    }
#undef VISIT
    if (!have && Sq > 0) rc = fs_errf(e, FS_E_INTERNAL, "ring attention: no keys at all");
out:
    free(n);
    fs_tensor_free(&kpad);
    fs_tensor_free(&vpad);
    fs_tensor_free(&oi);
    fs_tensor_free(&lse);
    fs_tensor_free(&lsei);
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
    return be->attention(o, NULL, FS_LSE_BHS, q, k, v, 1.0 / sqrt((double)q->shape[3]), e);
}

/* ---------------------------------------------------------------- Ulysses */

/* Sequence-sharded x [B, s_loc, Hl, Dh] → head-sharded y [B, S_u, Hl/U, Dh]: head block w goes
 * to Ulysses rank w; the received token chunks are laid out in rank order. */
static int ulysses_scatter_heads(const fs_par *p, const fs_tensor *x, fs_tensor *y, fs_err *e)
{
    const int U = p->ulysses;
    const fs_dtype dt = x->dtype;
    const size_t es = fs_dtype_size(dt);
    const int64_t B = x->shape[0], s = x->shape[1], Hl = x->shape[2], Dh = x->shape[3], hb = Hl / U;
    int64_t *n = malloc(sizeof(int64_t) * 6 * (size_t)U), *toff = n + U, *sc = n + 2 * U, *sd = n + 3 * U,
            *rcnt = n + 4 * U, *rd = n + 5 * U, S_u = 0;
    for (int w = 0; w < U; w++) {
        n[w] = tokens_of(p, p->r_rank * U + w);
        toff[w] = S_u;
        S_u += n[w];
    }
    int rc = alloc4(y, dt, B, S_u, hb, Dh, e);
    char *send = malloc((size_t)(B * s * Hl * Dh) * es + 1), *recv = malloc((size_t)(B * S_u * hb * Dh) * es + 1);
    if (rc || !send || !recv) {
        rc = rc ? rc : fs_errf(e, FS_E_NOMEM, "Ulysses all-to-all: out of memory");
        goto out;
    }
    for (int w = 0; w < U; w++) { /* pack: block w = [B, s, hb, Dh] of heads [w·hb, (w+1)·hb) */
        sc[w] = B * s * hb * Dh;
        sd[w] = w * sc[w];
        rcnt[w] = B * n[w] * hb * Dh;
        rd[w] = B * toff[w] * hb * Dh;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < s; t++)
                memcpy(send + (size_t)(sd[w] + (b * s + t) * hb * Dh) * es,
                       (const char *)x->data + (size_t)(((b * s + t) * Hl + w * hb) * Dh) * es, (size_t)(hb * Dh) * es);
    }
    fs_alltoallv(&p->g_u, dt, send, sc, sd, recv, rcnt, rd);
    for (int w = 0; w < U; w++) /* unpack: source w's [B, n_w, hb, Dh] into tokens [toff_w, +n_w) */
        for (int64_t b = 0; b < B; b++)
            memcpy((char *)y->data + (size_t)((b * S_u + toff[w]) * hb * Dh) * es,
                   recv + (size_t)(rd[w] + b * n[w] * hb * Dh) * es, (size_t)(n[w] * hb * Dh) * es);
out:
    free(send);
    free(recv);
    free(n);
    return rc;
}

/* The inverse: head-sharded y [B, S_u, Hl/U, Dh] → sequence-sharded x [B, s_loc, Hl, Dh]. */
static int ulysses_gather_heads(const fs_par *p, const fs_tensor *y, fs_tensor *x, fs_err *e)
{
    const int U = p->ulysses;
    const fs_dtype dt = y->dtype;
    const size_t es = fs_dtype_size(dt);
    const int64_t B = x->shape[0], s = x->shape[1], Hl = x->shape[2], Dh = x->shape[3], hb = Hl / U;
    const int64_t S_u = y->shape[1];
    int64_t *n = malloc(sizeof(int64_t) * 6 * (size_t)U), *toff = n + U, *sc = n + 2 * U, *sd = n + 3 * U,
            *rcnt = n + 4 * U, *rd = n + 5 * U, o = 0;
    for (int w = 0; w < U; w++) {
        n[w] = tokens_of(p, p->r_rank * U + w);
        toff[w] = o;
        o += n[w];
    }
    int rc = FS_OK;
    char *send = malloc((size_t)(B * S_u * hb * Dh) * es + 1), *recv = malloc((size_t)(B * s * Hl * Dh) * es + 1);
    if (!send || !recv) {
        rc = fs_errf(e, FS_E_NOMEM, "Ulysses all-to-all: out of memory");
        goto out;
    }
    for (int w = 0; w < U; w++) { /* to rank w: its tokens of my head block */
        sc[w] = B * n[w] * hb * Dh;
        sd[w] = B * toff[w] * hb * Dh;
        rcnt[w] = B * s * hb * Dh;
        rd[w] = w * rcnt[w];
        for (int64_t b = 0; b < B; b++)
            memcpy(send + (size_t)(sd[w] + b * n[w] * hb * Dh) * es,
                   (const char *)y->data + (size_t)((b * S_u + toff[w]) * hb * Dh) * es, (size_t)(n[w] * hb * Dh) * es);
    }
    fs_alltoallv(&p->g_u, dt, send, sc, sd, recv, rcnt, rd);
    /* --inject ulysses-head-order: the inverse all-to-all puts head block w back at U-1-w */
    const int flip = fs_injected(p->inject, FS_INJ_ULYSSES_HEAD_ORDER);
    for (int w = 0; w < U; w++) /* from rank w: my tokens of its head block w */
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < s; t++)
                memcpy((char *)x->data + (size_t)(((b * s + t) * Hl + (flip ? U - 1 - w : w) * hb) * Dh) * es,
                       recv + (size_t)(rd[w] + (b * s + t) * hb * Dh) * es, (size_t)(hb * Dh) * es);
out:
    free(send);
    free(recv);
    free(n);
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
    if ((rc = ulysses_scatter_heads(p, q, &qu, e)) || (rc = ulysses_scatter_heads(p, k, &ku, e)) ||
        (rc = ulysses_scatter_heads(p, v, &vu, e)))
        goto out;
    if ((rc = fs_tensor_alloc(&ou, qu.dtype, 4, qu.shape, e))) goto out;
    if ((rc = local_or_ring(p, be, &ou, &qu, &ku, &vu, e))) goto out;
    rc = ulysses_gather_heads(p, &ou, o, e);
out:
    fs_tensor_free(&qu);
    fs_tensor_free(&ku);
    fs_tensor_free(&vu);
    fs_tensor_free(&ou);
    return rc;
}
