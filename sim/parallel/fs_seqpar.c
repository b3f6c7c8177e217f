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

/* The K/V chunks of the ring group: member j's token count n[j] and its offset off[j] in the
 * gathered sequence; maxn, the longest. */
typedef struct ring_chunks {
    int64_t *n, *off, total, maxn;
} ring_chunks;

static int ring_chunks_make(const fs_par *p, ring_chunks *ch, fs_err *e)
{
    const int R = p->ring;
    *ch = (ring_chunks){0};
    if (!(ch->n = malloc(sizeof(int64_t) * 2 * (size_t)R)))
        return fs_errf(e, FS_E_NOMEM, "ring attention: out of memory for %d chunk sizes", R);
    ch->off = ch->n + R;
    for (int j = 0; j < R; j++) {
        ch->n[j] = fs_seqpar_ring_chunk(p, j);
        if (ch->n[j] > ch->maxn) ch->maxn = ch->n[j];
    }
    return FS_OK;
}

static void ring_chunks_place(ring_chunks *ch, int R)
{
    ch->total = 0;
    for (int j = 0; j < R; j++) {
        ch->off[j] = ch->total;
        ch->total += ch->n[j];
    }
}

/* --inject seq-uneven-chunk (seed 002): every ring chunk treated as if it had the largest
 * chunk's length — this rank's K/V zero-padded to it, and the padding attended like real tokens
 * (K/V gathered "as if equal" with unmasked zero padding). *k, *v are replaced by the padded
 * copies when they are shorter; every chunk's count becomes the largest. */
static int inject_pad_chunks(fs_backend *be, ring_chunks *ch, int R, const fs_tensor **k, const fs_tensor **v,
                             fs_tensor *kpad, fs_tensor *vpad, fs_err *e)
{
    const fs_tensor *K = *k, *V = *v;
    const int64_t maxn = ch->maxn;
    for (int j = 0; j < R; j++) {
        if (ch->n[j] < maxn) fs_inject_fire(FS_INJ_SEQ_UNEVEN_CHUNK);
        ch->n[j] = maxn;
    }
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

/* One ring attention in progress: this rank's queries against K/V chunks given one at a time
 * (ring_step), each partial (out_i, lse_i) merged into the running (acc, lse) with the LSE rule
 * (ring_merge_partial), the result written to o once at the end (ring_finish). */
typedef struct ring_state {
    fs_backend *be;
    const fs_tensor *q;
    fs_tensor *o;
    int64_t B, Sq, h;
    double scale;
    /* The kernel writes its LSE in the backend's declared convention (fs_backend.h: layout, log
     * base, offset); the merge reads natural-log, uncentred [B, H, S]: the conversion
     * (ring_lse_to_natural) is explicit and uses the declaration, never a shape (seed 001) nor a
     * habit. `assumed`, `base`, `offset` are the declared convention — or, under the LSE
     * injections, a wrong one, as the buggy code assumed it; `raw` receives the kernel's LSE
     * when a layout conversion is needed. */
    fs_lse_layout assumed;
    fs_lse_base base;
    fs_lse_offset offset;
    int no_lse; /* --inject ring-no-lse: partials averaged, the LSEs ignored */
    /* The running output acc: o itself, or for bfloat16 the float32 accumulator acc32 —
     * diffusers' convert_to_fp32=True: each partial (rounded once by the kernel) is upcast and
     * merged in float32, and the result rounded once at the end (oi32: the upcast partial). */
    fs_tensor *acc;
    fs_tensor oi, lse, lsei, raw, acc32, oi32;
    /* the offset correction (offset == FS_LSE_MEAN_K): δ [B, h, Sq]; the zero query [B, 1, h, Dh]
     * and mean(K) [B, 1, h, Dh]; q (and each K chunk) upcast to the LSE's dtype in bf16 runs */
    fs_tensor delta, q0, kmean, q32, k32;
    int have; /* chunks merged into (acc, lse) so far */
} ring_state;

static void ring_free(ring_state *st)
{
    fs_tensor_free(&st->oi);
    fs_tensor_free(&st->lse);
    fs_tensor_free(&st->lsei);
    fs_tensor_free(&st->raw);
    fs_tensor_free(&st->acc32);
    fs_tensor_free(&st->oi32);
    fs_tensor_free(&st->delta);
    fs_tensor_free(&st->q0);
    fs_tensor_free(&st->kmean);
    fs_tensor_free(&st->q32);
    fs_tensor_free(&st->k32);
}

/* q [B, Sq, h, Dh], o [B, Sq, h, Dh]: the buffers of the running merge. */
static int ring_start(ring_state *st, const fs_par *p, fs_backend *be, fs_tensor *o, const fs_tensor *q, fs_err *e)
{
    const fs_dtype dt = q->dtype, ldt = dt == FS_F64 ? FS_F64 : FS_F32; /* LSE: float32 (float64 runs: float64) */
    const int64_t B = q->shape[0], Sq = q->shape[1], h = q->shape[2], Dh = q->shape[3];
    *st = (ring_state){.be = be, .q = q, .o = o, .B = B, .Sq = Sq, .h = h, .scale = 1.0 / sqrt((double)Dh), .acc = o};
    /* the declared convention, read here (--inject lse-layout, lse-layout-guessed, lse-base2 and
     * lse-shard-offset substitute a wrong one) */
    st->assumed = (fs_lse_layout)fs_inject_lse_layout_assumed(p->inject, (int)be->lse_layout, Sq, h);
    st->base = (fs_lse_base)fs_inject_lse_base_assumed(p->inject, (int)be->lse_base);
    st->offset = (fs_lse_offset)fs_inject_lse_offset_assumed(p->inject, (int)be->lse_offset);
    st->no_lse = fs_injected(p->inject, FS_INJ_RING_NO_LSE);
    int64_t sl[3] = {B, h, Sq};
    int rc;
    if ((rc = alloc4(be, &st->oi, dt, B, Sq, h, Dh, e)) || (rc = fs_tensor_alloc_on(&st->lse, be, ldt, 3, sl, e)) ||
        (rc = fs_tensor_alloc_on(&st->lsei, be, ldt, 3, sl, e)) ||
        (st->assumed != FS_LSE_BHS && (rc = fs_tensor_alloc_on(&st->raw, be, ldt, 3, sl, e))))
        return rc;
    if (st->offset == FS_LSE_MEAN_K &&
        ((rc = fs_tensor_alloc_on(&st->delta, be, ldt, 3, sl, e)) || (rc = alloc4(be, &st->q0, ldt, B, 1, h, Dh, e)) ||
         (rc = alloc4(be, &st->kmean, ldt, B, 1, h, Dh, e)) ||
         (dt != ldt && ((rc = alloc4(be, &st->q32, ldt, B, Sq, h, Dh, e)) || (rc = be->convert(be, &st->q32, q, e))))))
        return rc;
    if (dt != ldt) {
        if ((rc = alloc4(be, &st->acc32, ldt, B, Sq, h, Dh, e)) || (rc = alloc4(be, &st->oi32, ldt, B, Sq, h, Dh, e)))
            return rc;
        st->acc = &st->acc32;
    }
    return FS_OK;
}

/* The partial in (oi, lsei) folded into the running (acc, lse); the first partial is the
 * running state itself (already in o, or upcast into the accumulator). */
static int ring_merge_partial(ring_state *st, fs_err *e)
{
    fs_backend *be = st->be;
    const int separate_acc = st->acc != st->o;
    if (!st->have) return separate_acc ? be->convert(be, st->acc, &st->oi, e) : FS_OK;
    if (st->no_lse) /* --inject ring-no-lse */
        return ring_average(be, st->acc, &st->oi, separate_acc ? &st->oi32 : NULL, st->have, e);
    return be->ring_merge(be, st->acc, &st->lse, &st->oi, &st->lsei, e);
}

/* The LSE of one partial, lse [B, h, Sq] (already in the merge's layout), converted from the
 * convention the kernel reported it in to natural log, uncentred — in place.
 *
 * Why here, and only here: the merge rule σ(lse_i − lse) is the softmax weight of chunk i only
 * when every LSE is log_e Σ exp(scores) against the same origin. A base-2 LSE puts a factor
 * 1/ln 2 into the exponent (pytorch#181645's finalizer got this wrong the other way round); an
 * LSE against mean-centred K is short by δ_i = scale·q_i·mean(K_chunk)ᵀ, which differs per chunk,
 * so the chunks' weights are off by exp(δ_j − δ_k) and nothing cancels (ROCm/aiter#3334). The
 * backend declares what it reports (fs_backend.h); this function is the one owner of the
 * arithmetic that undoes it, so no kernel and no merge assumes a convention. Order: the reported
 * value is (lse − δ)·log2(e), so base first, then the offset.
 *
 * δ is computed with the backend's own ops: mean(K) as attention of a zero query (every score 0:
 * uniform weights), then per (b, head) a [Sq, Dh]·[Dh] GEMM of the queries with it — in the LSE's
 * dtype (float32 for bfloat16 runs: q and the chunk upcast). */
static int ring_lse_to_natural(ring_state *st, fs_tensor *lse, const fs_tensor *kc, fs_err *e)
{
    fs_backend *be = st->be;
    int rc = FS_OK;
    if (st->base == FS_LSE_LOG2 && (rc = be->axpby(be, lse, M_LN2, lse, 0.0, e))) return rc; /* log2 → ln */
    if (st->offset != FS_LSE_MEAN_K) return FS_OK;
    const fs_dtype ldt = lse->dtype;
    const int64_t B = st->B, Sq = st->Sq, h = st->h, Dh = st->q->shape[3], n = kc->shape[1];
    const fs_tensor *q = st->q32.data ? &st->q32 : st->q, *k = kc;
    fs_tensor_free(&st->k32);
    if (kc->dtype != ldt) {
        if ((rc = alloc4(be, &st->k32, ldt, B, n, h, Dh, e)) || (rc = be->convert(be, &st->k32, kc, e))) return rc;
        k = &st->k32;
    }
    if ((rc = be->attention(be, &st->kmean, NULL, &st->q0, k, k, 1.0, e))) return rc; /* mean_j k_j per (b, head) */
    const size_t es = fs_dtype_size(ldt);
    for (int64_t b = 0; b < B; b++)
        for (int64_t hh = 0; hh < h; hh++) {
            const char *qa = (const char *)q->data + (size_t)((b * Sq * h + hh) * Dh) * es,
                       *km = (const char *)st->kmean.data + (size_t)((b * h + hh) * Dh) * es;
            char *d = (char *)st->delta.data + (size_t)((b * h + hh) * Sq) * es;
            if ((rc = be->gemm(be, ldt, Sq, 1, Dh, qa, h * Dh, km, Dh, NULL, d, 1, e))) return rc;
        }
    return be->axpby(be, lse, 1.0, &st->delta, st->scale, e); /* lse + δ, δ = scale·q·mean(K)ᵀ */
}

/* Attention of the queries against one K/V chunk [B, n, h, Dh], merged in. An empty chunk, or
 * no queries, contributes nothing. */
static int ring_step(ring_state *st, const fs_tensor *kc, const fs_tensor *vc, fs_err *e)
{
    if (kc->shape[1] == 0 || st->Sq == 0) return FS_OK;
    fs_backend *be = st->be;
    /* the first partial goes straight into o and lse when o is the accumulator */
    fs_tensor *out = st->have || st->acc != st->o ? &st->oi : st->o, *lse = st->have ? &st->lsei : &st->lse;
    int rc = be->attention(be, out, st->assumed == FS_LSE_BHS ? lse : &st->raw, st->q, kc, vc, st->scale, e);
    if (!rc && st->assumed != FS_LSE_BHS)
        rc = be->lse_convert(be, lse, FS_LSE_BHS, &st->raw, st->assumed, st->B, st->h, st->Sq, e);
    if (!rc && (st->base != FS_LSE_LN || st->offset != FS_LSE_ABS)) rc = ring_lse_to_natural(st, lse, kc, e);
    if (!rc) rc = ring_merge_partial(st, e);
    if (!rc) st->have++;
    return rc;
}

/* The merged result into o: out.to(query.dtype), one rounding. */
static int ring_finish(ring_state *st, fs_err *e)
{
    if (st->Sq == 0) return FS_OK;
    if (!st->have) return fs_errf(e, FS_E_INTERNAL, "ring attention: no keys at all");
    return st->acc != st->o ? st->be->convert(st->be, st->o, st->acc, e) : FS_OK;
}

/* Rotation by all-gather, as diffusers does: gather every member's K/V, each as its own
 * [B, n_j, h, Dh] block, then visit chunk (r + i) mod R. */
static int ring_visit_allgathered(const fs_par *p, ring_state *st, const ring_chunks *ch, const fs_tensor *k,
                                  const fs_tensor *v, fs_err *e)
{
    const int R = p->ring, r = p->r_rank;
    fs_backend *be = st->be;
    const fs_dtype dt = k->dtype;
    const int64_t B = k->shape[0], h = k->shape[2], Dh = k->shape[3], row = h * Dh; /* elements per token */
    const size_t es = fs_dtype_size(dt);
    fs_tensor kall = {0}, vall = {0};
    int64_t *cnt = malloc(sizeof(int64_t) * 2 * (size_t)R), *dsp = cnt ? cnt + R : NULL;
    if (!cnt) return fs_errf(e, FS_E_NOMEM, "ring attention: out of memory for %d all-gather counts", R);
    for (int j = 0; j < R; j++) {
        cnt[j] = B * ch->n[j] * row;
        dsp[j] = B * ch->off[j] * row;
    }
    int rc;
    if ((rc = alloc4(be, &kall, dt, 1, B * ch->total, h, Dh, e)) || (rc = alloc4(be, &vall, dt, 1, B * ch->total, h, Dh, e)) ||
        (rc = fs_allgatherv_t(&p->g_r, k, &kall, cnt, dsp, e)) || (rc = fs_allgatherv_t(&p->g_r, v, &vall, cnt, dsp, e)))
        goto out;
    for (int i = 0; i < R && !rc; i++) {
        const int j = (r + i) % R;
        int64_t s4[4] = {B, ch->n[j], h, Dh};
        fs_tensor kj = fs_tensor_reshape(&kall, 4, s4), vj = kj;
        kj.data = (char *)kall.data + (size_t)(dsp[j]) * es;
        vj.data = (char *)vall.data + (size_t)(dsp[j]) * es;
        rc = ring_step(st, &kj, &vj, e);
    }
out:
    free(cnt);
    fs_tensor_free(&kall);
    fs_tensor_free(&vall);
    return rc;
}

/* Rotation point-to-point: at step i this rank holds chunk (r - i) mod R in buffer `cur`; it
 * sends it to r+1 and receives chunk (r - i - 1) mod R from r-1 into the other buffer while it
 * computes on the current one. */
static int ring_visit_p2p(const fs_par *p, ring_state *st, const ring_chunks *ch, const fs_tensor *k,
                          const fs_tensor *v, fs_err *e)
{
    const int R = p->ring, r = p->r_rank;
    fs_backend *be = st->be;
    const fs_dtype dt = k->dtype;
    const int64_t B = k->shape[0], h = k->shape[2], Dh = k->shape[3], row = h * Dh, maxn = ch->maxn;
    fs_tensor kb[2] = {{0}}, vb[2] = {{0}}, stale_k = {0}, stale_v = {0};
    int rc = FS_OK;
    for (int b = 0; b < 2; b++)
        if ((rc = alloc4(be, &kb[b], dt, B, maxn, h, Dh, e)) || (rc = alloc4(be, &vb[b], dt, B, maxn, h, Dh, e))) goto out;
    const size_t kn = fs_tensor_nbytes(k), vn = fs_tensor_nbytes(v);
    if ((rc = copy2d(be, kb[0].data, kn, k->data, kn, kn, 1, e)) || (rc = copy2d(be, vb[0].data, vn, v->data, vn, vn, 1, e)))
        goto out;
    /* --inject overlap-early-read: the chunk is read before its Irecv completed; made
     * deterministic by reading a snapshot of the receive buffer taken when it was posted */
    const int early = fs_injected(p->inject, FS_INJ_OVERLAP_EARLY_READ);
    if (early && ((rc = alloc4(be, &stale_k, dt, B, maxn, h, Dh, e)) || (rc = alloc4(be, &stale_v, dt, B, maxn, h, Dh, e))))
        goto out;
    for (int i = 0, cur = 0; i < R; i++, cur = 1 - cur) {
        const int j = ((r - i) % R + R) % R, jn = ((r - i - 1) % R + R) % R;
        fs_ring_req rk = {0}, rv = {0};
        if (i < R - 1) {
            const size_t sn = fs_tensor_nbytes(&stale_k);
            if (early && ((rc = copy2d(be, stale_k.data, sn, kb[1 - cur].data, sn, sn, 1, e)) ||
                          (rc = copy2d(be, stale_v.data, sn, vb[1 - cur].data, sn, sn, 1, e))))
                goto out;
            if ((rc = fs_ring_start(&p->g_r, &kb[cur], B * ch->n[j] * row, (r + 1) % R, &kb[1 - cur], B * ch->n[jn] * row,
                                    (r - 1 + R) % R, 2 * i, &rk, e)) ||
                (rc = fs_ring_start(&p->g_r, &vb[cur], B * ch->n[j] * row, (r + 1) % R, &vb[1 - cur], B * ch->n[jn] * row,
                                    (r - 1 + R) % R, 2 * i + 1, &rv, e)))
                goto out; /* the CLI ends the job: a peer may be inside the exchange */
        }
        const int read_stale = i > 0 && early; /* --inject overlap-early-read */
        if (read_stale) fs_inject_fire(FS_INJ_OVERLAP_EARLY_READ);
        int64_t s4[4] = {B, ch->n[j], h, Dh};
        fs_tensor kj = fs_tensor_reshape(read_stale ? &stale_k : &kb[cur], 4, s4),
                  vj = fs_tensor_reshape(read_stale ? &stale_v : &vb[cur], 4, s4);
        rc = ring_step(st, &kj, &vj, e);
        /* the exchange is waited for even when the step failed: its buffers are freed below */
        int rc1 = fs_ring_wait(&rk, e), rc2 = fs_ring_wait(&rv, e);
        if ((rc = rc ? rc : rc1 ? rc1 : rc2)) goto out;
    }
out:
    for (int b = 0; b < 2; b++) {
        fs_tensor_free(&kb[b]);
        fs_tensor_free(&vb[b]);
    }
    fs_tensor_free(&stale_k);
    fs_tensor_free(&stale_v);
    return rc;
}

/* Attention of q against the K/V chunks of the ring group, merged with the LSE rule.
 * q [B, Sq, h, Dh]; k, v [B, Skv_own, h, Dh]; o [B, Sq, h, Dh]. */
static int ring_attention(const fs_par *p, fs_backend *be, fs_tensor *o, const fs_tensor *q, const fs_tensor *k,
                          const fs_tensor *v, fs_err *e)
{
    ring_chunks ch;
    ring_state st = {0};
    fs_tensor kpad = {0}, vpad = {0};
    int rc = ring_chunks_make(p, &ch, e);
    if (rc) return rc;
    if (fs_injected(p->inject, FS_INJ_SEQ_UNEVEN_CHUNK)) /* --inject seq-uneven-chunk */
        rc = inject_pad_chunks(be, &ch, p->ring, &k, &v, &kpad, &vpad, e);
    ring_chunks_place(&ch, p->ring);
    if (!rc) rc = ring_start(&st, p, be, o, q, e);
    if (!rc) rc = p->rotate == FS_RING_ALLGATHER ? ring_visit_allgathered(p, &st, &ch, k, v, e)
                                                 : ring_visit_p2p(p, &st, &ch, k, v, e);
    if (!rc) rc = ring_finish(&st, e);
    ring_free(&st);
    free(ch.n);
    fs_tensor_free(&kpad);
    fs_tensor_free(&vpad);
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

int fs_uly_plan_make(const fs_par *p, fs_uly_plan *u, fs_err *e)
{
    const int U = p->ulysses;
    *u = (fs_uly_plan){.U = U, .me = p->u_rank};
    u->n = malloc(sizeof(int64_t) * 7 * (size_t)U);
    if (!u->n) return fs_errf(e, FS_E_NOMEM, "Ulysses: out of memory for the exchange plan of %d ranks", U);
    u->x = u->n + U, u->toff = u->n + 2 * U, u->sc = u->n + 3 * U, u->sd = u->n + 4 * U, u->rc = u->n + 5 * U,
    u->rd = u->n + 6 * U;
    for (int w = 0; w < U; w++) {
        u->n[w] = tokens_of(p, p->r_rank * U + w);
        u->x[w] = fs_seqpar_uly_block(p, p->r_rank * U + w);
        if (u->x[w] != u->n[w]) fs_inject_fire(FS_INJ_ULYSSES_UNEVEN_CHUNK);
        u->toff[w] = u->S_u;
        u->S_u += u->x[w];
    }
    return FS_OK;
}

void fs_uly_plan_free(fs_uly_plan *u)
{
    free(u->n);
    *u = (fs_uly_plan){0};
}

/* ---- Sequence-sharded → head-sharded (before attention) ---- */

void fs_uly_counts_to_heads(fs_uly_plan *u, int64_t B, int64_t hb, int64_t Dh)
{
    const int64_t xs = u->x[u->me];
    for (int w = 0; w < u->U; w++) {
        u->sc[w] = B * xs * hb * Dh;
        u->sd[w] = w * u->sc[w];
        u->rc[w] = B * u->x[w] * hb * Dh;
        u->rd[w] = B * u->toff[w] * hb * Dh;
    }
}

int fs_uly_pack_head_blocks(fs_backend *be, const fs_uly_plan *u, const fs_tensor *x, fs_tensor *send, fs_err *e)
{
    const size_t es = fs_dtype_size(x->dtype);
    const int64_t B = x->shape[0], s = x->shape[1], Hl = x->shape[2], Dh = x->shape[3], hb = Hl / u->U, xs = u->x[u->me];
    const size_t blk = (size_t)(hb * Dh) * es, xrow = (size_t)(Hl * Dh) * es; /* one token's head block; a token */
    for (int w = 0; w < u->U; w++) /* block w = [B, xs, hb, Dh] of heads [w·hb, (w+1)·hb) (zero rows past s) */
        for (int64_t b = 0; b < (xs == s ? 1 : B); b++) { /* one copy when unpadded: the batches are contiguous */
            int rc = copy2d(be, (char *)send->data + (size_t)(u->sd[w] + b * xs * hb * Dh) * es, blk,
                            (const char *)x->data + (size_t)(b * s) * xrow + (size_t)w * blk, xrow, blk,
                            (size_t)(xs == s ? B * s : s), e);
            if (rc) return rc;
        }
    return FS_OK;
}

int fs_uly_unpack_token_chunks(fs_backend *be, const fs_uly_plan *u, const fs_tensor *recv, const fs_tensor *others,
                               fs_tensor *y, fs_err *e)
{
    const size_t es = fs_dtype_size(y->dtype);
    const int64_t B = y->shape[0], hb = y->shape[2], Dh = y->shape[3];
    const size_t blk = (size_t)(hb * Dh) * es;
    for (int w = 0; w < u->U; w++) { /* source w's [B, x_w, hb, Dh] into tokens [toff_w, +x_w) */
        const fs_tensor *src = others && w != u->me ? others : recv;
        int rc = copy2d(be, (char *)y->data + (size_t)u->toff[w] * blk, (size_t)u->S_u * blk,
                        (const char *)src->data + (size_t)u->rd[w] * es, (size_t)u->x[w] * blk, (size_t)u->x[w] * blk,
                        (size_t)B, e);
        if (rc) return rc;
    }
    return FS_OK;
}

/* ---- Head-sharded → sequence-sharded (after attention): the inverse ---- */

void fs_uly_counts_to_tokens(fs_uly_plan *u, int64_t B, int64_t hb, int64_t Dh)
{
    const int64_t xs = u->x[u->me];
    for (int w = 0; w < u->U; w++) {
        u->sc[w] = B * u->x[w] * hb * Dh;
        u->sd[w] = B * u->toff[w] * hb * Dh;
        u->rc[w] = B * xs * hb * Dh;
        u->rd[w] = w * u->rc[w];
    }
}

int fs_uly_pack_token_chunks(fs_backend *be, const fs_uly_plan *u, const fs_tensor *y, fs_tensor *send, fs_err *e)
{
    const size_t es = fs_dtype_size(y->dtype);
    const int64_t B = y->shape[0], hb = y->shape[2], Dh = y->shape[3];
    const size_t blk = (size_t)(hb * Dh) * es;
    for (int w = 0; w < u->U; w++) { /* to rank w: its tokens (padded rows included) of my head block */
        int rc = copy2d(be, (char *)send->data + (size_t)u->sd[w] * es, (size_t)u->x[w] * blk,
                        (const char *)y->data + (size_t)u->toff[w] * blk, (size_t)u->S_u * blk, (size_t)u->x[w] * blk,
                        (size_t)B, e);
        if (rc) return rc;
    }
    return FS_OK;
}

int fs_uly_unpack_head_blocks(fs_backend *be, const fs_uly_plan *u, const fs_tensor *recv, int flip, fs_tensor *x,
                              fs_err *e)
{
    const int U = u->U;
    const size_t es = fs_dtype_size(x->dtype);
    const int64_t B = x->shape[0], s = x->shape[1], Hl = x->shape[2], Dh = x->shape[3], hb = Hl / U, xs = u->x[u->me];
    const size_t blk = (size_t)(hb * Dh) * es, xrow = (size_t)(Hl * Dh) * es;
    for (int w = 0; w < U; w++) /* from rank w: my first s tokens of its head block w */
        for (int64_t b = 0; b < (xs == s ? 1 : B); b++) {
            int rc = copy2d(be, (char *)x->data + (size_t)(b * s) * xrow + (size_t)(flip ? U - 1 - w : w) * blk, xrow,
                            (const char *)recv->data + (size_t)(u->rd[w] + b * xs * hb * Dh) * es, blk, blk,
                            (size_t)(xs == s ? B * s : s), e);
            if (rc) return rc;
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
    const fs_dtype dt = x->dtype;
    const int64_t B = x->shape[0], Hl = x->shape[2], Dh = x->shape[3], hb = Hl / p->ulysses;
    fs_uly_plan u;
    fs_tensor send = {0}, recv = {0}, stale = {0};
    int rc = fs_uly_plan_make(p, &u, e);
    if (rc) return rc;
    const int64_t xs = u.x[u.me]; /* tokens per block this rank sends: s, or padded */
    fs_uly_counts_to_heads(&u, B, hb, Dh);
    if ((rc = alloc4(be, y, dt, B, u.S_u, hb, Dh, e)) || (rc = alloc4(be, &send, dt, 1, B * xs, Hl, Dh, e)) ||
        (rc = alloc4(be, &recv, dt, 1, B * u.S_u, hb, Dh, e)) || (rc = fs_uly_pack_head_blocks(be, &u, x, &send, e)))
        goto out;
    if (early) { /* --inject ulysses-early-read: what the receive buffer holds when the exchange is posted */
        const size_t rn = fs_tensor_nbytes(&recv);
        if ((rc = alloc4(be, &stale, dt, 1, B * u.S_u, hb, Dh, e)) ||
            (rc = copy2d(be, stale.data, rn, recv.data, rn, rn, 1, e)))
            goto out;
        fs_inject_fire(FS_INJ_ULYSSES_EARLY_READ);
    }
    if ((rc = fs_alltoallv_t(&p->g_u, &send, u.sc, u.sd, &recv, u.rc, u.rd, e))) goto out;
    rc = fs_uly_unpack_token_chunks(be, &u, &recv, early ? &stale : NULL, y, e);
out:
    fs_tensor_free(&send);
    fs_tensor_free(&recv);
    fs_tensor_free(&stale);
    fs_uly_plan_free(&u);
    return rc;
}

/* The inverse: head-sharded y [B, S_u, Hl/U, Dh] → sequence-sharded x [B, s_loc, Hl, Dh]. */
static int ulysses_gather_heads(const fs_par *p, fs_backend *be, const fs_tensor *y, fs_tensor *x, fs_err *e)
{
    const fs_dtype dt = y->dtype;
    const int64_t B = x->shape[0], Hl = x->shape[2], Dh = x->shape[3], hb = Hl / p->ulysses;
    fs_uly_plan u;
    fs_tensor send = {0}, recv = {0};
    int rc = fs_uly_plan_make(p, &u, e);
    if (rc) return rc;
    const int64_t xs = u.x[u.me];
    fs_uly_counts_to_tokens(&u, B, hb, Dh);
    if ((rc = alloc4(be, &send, dt, 1, B * u.S_u, hb, Dh, e)) || (rc = alloc4(be, &recv, dt, 1, B * xs, Hl, Dh, e)) ||
        (rc = fs_uly_pack_token_chunks(be, &u, y, &send, e)) ||
        (rc = fs_alltoallv_t(&p->g_u, &send, u.sc, u.sd, &recv, u.rc, u.rd, e)))
        goto out;
    /* --inject ulysses-head-order: the inverse all-to-all puts head block w back at U-1-w */
    const int flip = fs_injected(p->inject, FS_INJ_ULYSSES_HEAD_ORDER);
    if (flip) fs_inject_fire(FS_INJ_ULYSSES_HEAD_ORDER);
    rc = fs_uly_unpack_head_blocks(be, &u, &recv, flip, x, e);
out:
    fs_tensor_free(&send);
    fs_tensor_free(&recv);
    fs_uly_plan_free(&u);
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

/* The two halves of fs_seqpar_attention's Ulysses path, for an attention that is not plain
 * softmax over the gathered keys (FLUX.2's KV cache, fs_layers.c): to heads (every token, this
 * member's head block, token chunks in member order) and back. */
int fs_seqpar_uly_to_heads(const fs_par *p, fs_backend *be, const fs_tensor *x, fs_tensor *y, fs_err *e)
{
    return ulysses_scatter_heads(p, be, x, y, 0, e);
}

int fs_seqpar_uly_to_tokens(const fs_par *p, fs_backend *be, const fs_tensor *y, fs_tensor *x, fs_err *e)
{
    return ulysses_gather_heads(p, be, y, x, e);
}
