#include "fs_seqpar.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Every buffer here is in the backend's memory; packing, padding and rotation are backend 2-D
 * copies, exchanges go through fs_comm's tensor collectives (which stage through host memory
 * when the backend's is not host-addressable). */

int fs_seqpar_text_joins(const fs_par *p)
{
    if (p->text != FS_TEXT_REPLICATED || p->sp < 2) return 0;
    /* --inject replicated-text-rotated (sglang#33327): the replicated-token dispatch asks the
     * Ulysses degree, so with --ulysses 1 the text takes the plain path and rotates as if sharded */
    if (p->ulysses == 1 && p->ring > 1 && fs_injected(p->inject, FS_INJ_REPLICATED_TEXT_ROTATED)) return 0;
    return 1;
}

/* Tokens SP rank q puts through the sequence exchange: its text chunk (txt) + its image chunk. */
static int64_t tokens_of(const fs_par *p, int q, int txt) { return (txt ? fs_par_txt_n(p, q) : 0) + fs_par_img_n(p, q); }

/* --pad mask: the pad keys are masked out (unless --inject pad-mask-ignored drops the mask) */
static int pad_masked(const fs_par *p)
{
    if (p->pad != FS_PAD_MASK || p->sp < 2) return 0;
    if (!fs_injected(p->inject, FS_INJ_PAD_MASK_IGNORED)) return 1;
    fs_inject_fire(FS_INJ_PAD_MASK_IGNORED); /* the mask handed to a backend that drops it */
    return 0;
}

static int64_t uly_block(const fs_par *p, int q, int txt)
{
    int64_t n = tokens_of(p, q, txt);
    /* torch.chunk's equal blocks (--inject ulysses-uneven-chunk), or the padded layout's (--pad) */
    if (p->ulysses > 1 && (fs_injected(p->inject, FS_INJ_ULYSSES_UNEVEN_CHUNK) || p->pad != FS_PAD_NONE))
        for (int w = 0, r = fs_par_ring_of(p, q); w < p->ulysses; w++)
            if (tokens_of(p, fs_par_sp_of(p, w, r), txt) > n) n = tokens_of(p, fs_par_sp_of(p, w, r), txt);
    return n;
}

/* --inject a2a-world-group (sglang#33353): the Ulysses all-to-all over the whole SP group instead
 * of the Ulysses subgroup, when there is a ring: every rank gathers the whole sequence, with
 * Hl / (ulysses·ring) heads. */
static int a2a_world(const fs_par *p)
{
    return p->ring > 1 && p->ulysses > 1 && p->text != FS_TEXT_REPLICATED && fs_injected(p->inject, FS_INJ_A2A_WORLD_GROUP);
}

static int64_t ring_chunk(const fs_par *p, int j, int txt)
{
    int64_t n = 0;
    if (a2a_world(p)) { /* each ring member holds what the SP-wide all-to-all gathered: everything */
        for (int q = 0; q < p->sp; q++) n += tokens_of(p, q, txt);
        return n;
    }
    for (int w = 0; w < p->ulysses; w++) n += uly_block(p, fs_par_sp_of(p, w, j), txt);
    return n;
}

/* The keys ring member j's chunk holds before the ring pads it: under --pad mask the Ulysses
 * blocks' pad rows are gone already (uly_compact), so its real tokens; else ring_chunk. */
static int64_t ring_keys(const fs_par *p, int j, int txt, int masked)
{
    if (!masked || a2a_world(p)) return ring_chunk(p, j, txt);
    int64_t n = 0;
    for (int w = 0; w < p->ulysses; w++) n += tokens_of(p, fs_par_sp_of(p, w, j), txt);
    return n;
}

int64_t fs_seqpar_uly_block(const fs_par *p, int q) { return uly_block(p, q, !fs_seqpar_text_joins(p)); }
int64_t fs_seqpar_ring_chunk(const fs_par *p, int j) { return ring_chunk(p, j, !fs_seqpar_text_joins(p)); }

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

/* dst [B, n, hc, Dh] ← tokens [t0, t0 + n) and heads [h0, h0 + hc) of src [B, S, H, Dh] */
static int take_block(fs_backend *be, fs_tensor *dst, const fs_tensor *src, int64_t t0, int64_t n, int64_t h0,
                      int64_t hc, fs_err *e)
{
    const int64_t B = src->shape[0], S = src->shape[1], H = src->shape[2], Dh = src->shape[3];
    const size_t es = fs_dtype_size(src->dtype), w = (size_t)(hc * Dh) * es;
    int rc = alloc4(be, dst, src->dtype, B, n, hc, Dh, e);
    for (int64_t b = 0; b < B && n && !rc; b++)
        rc = copy2d(be, (char *)dst->data + (size_t)(b * n) * w, w,
                    (const char *)src->data + (size_t)(((b * S + t0) * H + h0) * Dh) * es, (size_t)(H * Dh) * es, w,
                    (size_t)n, e);
    return rc;
}

/* The inverse: src [B, n, hc, Dh] into tokens [t0, t0 + n), heads [h0, h0 + hc) of dst [B, S, H, Dh]. */
static int put_block(fs_backend *be, fs_tensor *dst, const fs_tensor *src, int64_t t0, int64_t h0, fs_err *e)
{
    const int64_t B = dst->shape[0], S = dst->shape[1], H = dst->shape[2], Dh = dst->shape[3];
    const int64_t n = src->shape[1], hc = src->shape[2];
    const size_t es = fs_dtype_size(dst->dtype), w = (size_t)(hc * Dh) * es;
    int rc = FS_OK;
    for (int64_t b = 0; b < B && n && !rc; b++)
        rc = copy2d(be, (char *)dst->data + (size_t)(((b * S + t0) * H + h0) * Dh) * es, (size_t)(H * Dh) * es,
                    (const char *)src->data + (size_t)(b * n) * w, w, w, (size_t)n, e);
    return rc;
}

/* dst [B, na + nb, h, Dh] = [a | b] along the tokens (torch.cat(dim=1)) */
static int cat_tokens(fs_backend *be, fs_tensor *dst, const fs_tensor *a, const fs_tensor *b, fs_err *e)
{
    int rc = alloc4(be, dst, a->dtype, a->shape[0], a->shape[1] + b->shape[1], a->shape[2], a->shape[3], e);
    if (!rc) rc = put_block(be, dst, a, 0, 0, e);
    if (!rc) rc = put_block(be, dst, b, a->shape[1], 0, e);
    return rc;
}

/* ---------------------------------------------------------------- ring */

/* The K/V chunks of the ring group: member j's token count n[j] and its offset off[j] in the
 * gathered sequence; maxn, the longest. */
typedef struct ring_chunks {
    int64_t *n, *off, total, maxn;
} ring_chunks;

static int ring_chunks_make(const fs_par *p, ring_chunks *ch, int txt, int masked, fs_err *e)
{
    const int R = p->ring;
    *ch = (ring_chunks){0};
    if (!(ch->n = malloc(sizeof(int64_t) * 2 * (size_t)R)))
        return fs_errf(e, FS_E_NOMEM, "ring attention: out of memory for %d chunk sizes", R);
    ch->off = ch->n + R;
    for (int j = 0; j < R; j++) {
        ch->n[j] = ring_keys(p, j, txt, masked);
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
                             fs_tensor *kpad, fs_tensor *vpad, int injected, fs_err *e)
{
    const fs_tensor *K = *k, *V = *v;
    const int64_t maxn = ch->maxn;
    for (int j = 0; j < R; j++) {
        if (ch->n[j] < maxn && injected) fs_inject_fire(FS_INJ_SEQ_UNEVEN_CHUNK);
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
    /* --text replicated: the text K/V [B, S_txt, h, Dh] (xDiT's joint_tensor_key/value), joined
     * to the keys of one ring step only — the first, in front (--joint front), or the last, behind
     * (--joint rear) — so every rank's queries see the text once; jk == NULL: no joint. jkc, jvc:
     * that step's joined keys and values. */
    const fs_tensor *jk, *jv;
    int join_step, rear, join_every; /* join_every: --inject joint-kv-wrong-step */
    fs_tensor jkc, jvc;
    /* --pad mask: chunk j's real keys (its first real[j] rows; the rest is the ring's padding,
     * masked out); NULL: every row is a key. tk, tv: a chunk cut to its real rows. */
    const int64_t *real;
    fs_tensor tk, tv;
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
    fs_tensor_free(&st->jkc);
    fs_tensor_free(&st->jvc);
    fs_tensor_free(&st->tk);
    fs_tensor_free(&st->tv);
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

/* Ring step i's chunk, with the replicated text's K/V joined when i is the joint's step (xDiT's
 * xdit_ring_flash_attn_forward: front, torch.cat([joint, k]) at step 0; rear, torch.cat([k,
 * joint]) at the last step). The chunk may be empty (a ring member without image tokens): the
 * joined keys are not. */
static int ring_step_at(ring_state *st, int i, int j, const fs_tensor *kc, const fs_tensor *vc, fs_err *e)
{
    if (st->real && st->real[j] < kc->shape[1]) { /* --pad mask: the pad rows masked out of the softmax */
        fs_tensor_free(&st->tk);
        fs_tensor_free(&st->tv);
        int rc = take_block(st->be, &st->tk, kc, 0, st->real[j], 0, kc->shape[2], e);
        if (!rc) rc = take_block(st->be, &st->tv, vc, 0, st->real[j], 0, vc->shape[2], e);
        if (rc) return rc;
        kc = &st->tk, vc = &st->tv;
    }
    if (!st->jk || (i != st->join_step && !st->join_every)) return ring_step(st, kc, vc, e);
    if (i != st->join_step) fs_inject_fire(FS_INJ_JOINT_KV_WRONG_STEP); /* the step condition dropped */
    fs_tensor_free(&st->jkc);
    fs_tensor_free(&st->jvc);
    int rc = cat_tokens(st->be, &st->jkc, st->rear ? kc : st->jk, st->rear ? st->jk : kc, e);
    if (!rc) rc = cat_tokens(st->be, &st->jvc, st->rear ? vc : st->jv, st->rear ? st->jv : vc, e);
    return rc ? rc : ring_step(st, &st->jkc, &st->jvc, e);
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
        rc = ring_step_at(st, i, j, &kj, &vj, e);
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
        rc = ring_step_at(st, i, j, &kj, &vj, e);
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
 * q [B, Sq, h, Dh]; k, v [B, Skv_own, h, Dh]; o [B, Sq, h, Dh]. jk, jv: the replicated text's
 * K/V [B, S_txt, h, Dh] joined at one step (NULL: none); txt: the chunks carry text tokens. */
static int ring_attention(const fs_par *p, fs_backend *be, fs_tensor *o, const fs_tensor *q, const fs_tensor *k,
                          const fs_tensor *v, const fs_tensor *jk, const fs_tensor *jv, int txt, fs_err *e)
{
    ring_chunks ch;
    ring_state st = {0};
    fs_tensor kpad = {0}, vpad = {0};
    const int masked = pad_masked(p);
    int64_t *real = NULL;
    int rc = ring_chunks_make(p, &ch, txt, masked, e);
    if (rc) return rc;
    /* --pad: every chunk exchanged at the longest's length, zero rows at its end (masked out under
     * --pad mask: ring_step_at cuts each to its real keys); --inject seq-uneven-chunk: the same,
     * attended */
    if (masked && ch.maxn && !(real = malloc(sizeof(int64_t) * (size_t)p->ring)))
        rc = fs_errf(e, FS_E_NOMEM, "ring attention: out of memory");
    for (int j = 0; real && j < p->ring; j++) real[j] = ch.n[j];
    if (!rc && (fs_injected(p->inject, FS_INJ_SEQ_UNEVEN_CHUNK) || p->pad != FS_PAD_NONE))
        rc = inject_pad_chunks(be, &ch, p->ring, &k, &v, &kpad, &vpad, p->pad == FS_PAD_NONE, e);
    ring_chunks_place(&ch, p->ring);
    if (!rc) rc = ring_start(&st, p, be, o, q, e);
    st.real = real;
    if (!rc && jk) {
        st.jk = jk, st.jv = jv, st.rear = p->joint == FS_JOINT_REAR, st.join_step = st.rear ? p->ring - 1 : 0;
        st.join_every = fs_injected(p->inject, FS_INJ_JOINT_KV_WRONG_STEP);
    }
    if (!rc) rc = p->rotate == FS_RING_ALLGATHER ? ring_visit_allgathered(p, &st, &ch, k, v, e)
                                                 : ring_visit_p2p(p, &st, &ch, k, v, e);
    if (!rc) rc = ring_finish(&st, e);
    ring_free(&st);
    free(real);
    free(ch.n);
    fs_tensor_free(&kpad);
    fs_tensor_free(&vpad);
    return rc;
}

static int local_or_ring(const fs_par *p, fs_backend *be, fs_tensor *o, const fs_tensor *q, const fs_tensor *k,
                         const fs_tensor *v, fs_err *e)
{
    if (p->ring > 1) return ring_attention(p, be, o, q, k, v, NULL, NULL, 1, e);
    if (q->shape[1] == 0) return FS_OK;
    return be->attention(be, o, NULL, q, k, v, 1.0 / sqrt((double)q->shape[3]), e);
}

/* ---------------------------------------------------------------- Ulysses */

/* txt: the exchanged shards carry the rank's text tokens (the sharded layout; or the replicated
 * text under --inject replicated-kv-a2a) */
static int uly_plan_make_on(const fs_par *p, fs_uly_plan *u, int txt, int world, fs_err *e)
{
    const int U = world ? p->sp : p->ulysses;
    *u = (fs_uly_plan){.U = U, .me = world ? p->sp_rank : p->u_rank};
    u->n = malloc(sizeof(int64_t) * 7 * (size_t)U);
    if (!u->n) return fs_errf(e, FS_E_NOMEM, "Ulysses: out of memory for the exchange plan of %d ranks", U);
    u->x = u->n + U, u->toff = u->n + 2 * U, u->sc = u->n + 3 * U, u->sd = u->n + 4 * U, u->rc = u->n + 5 * U,
    u->rd = u->n + 6 * U;
    for (int w = 0; w < U; w++) {
        const int q = world ? w : fs_par_sp_of(p, w, p->r_rank); /* member w's SP rank */
        u->n[w] = tokens_of(p, q, txt);
        u->x[w] = world ? u->n[w] : uly_block(p, q, txt);
        if (u->x[w] != u->n[w]) fs_inject_fire(FS_INJ_ULYSSES_UNEVEN_CHUNK);
        u->toff[w] = u->S_u;
        u->S_u += u->x[w];
    }
    return FS_OK;
}

static int uly_plan_make(const fs_par *p, fs_uly_plan *u, int txt, fs_err *e) { return uly_plan_make_on(p, u, txt, 0, e); }
int fs_uly_plan_make(const fs_par *p, fs_uly_plan *u, fs_err *e) { return uly_plan_make(p, u, !fs_seqpar_text_joins(p), e); }

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
static int ulysses_scatter_heads(const fs_par *p, fs_backend *be, const fs_tensor *x, fs_tensor *y, int early, int txt,
                                 fs_err *e)
{
    const fs_dtype dt = x->dtype;
    const int world = a2a_world(p); /* --inject a2a-world-group: the exchange over the SP group */
    const int64_t B = x->shape[0], Hl = x->shape[2], Dh = x->shape[3], hb = Hl / (world ? p->sp : p->ulysses);
    fs_uly_plan u;
    fs_tensor send = {0}, recv = {0}, stale = {0};
    int rc = uly_plan_make_on(p, &u, txt, world, e);
    if (rc) return rc;
    if (world) fs_inject_fire(FS_INJ_A2A_WORLD_GROUP);
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
    if ((rc = fs_alltoallv_t(world ? &p->g_sp : &p->g_u, &send, u.sc, u.sd, &recv, u.rc, u.rd, e))) goto out;
    rc = fs_uly_unpack_token_chunks(be, &u, &recv, early ? &stale : NULL, y, e);
out:
    fs_tensor_free(&send);
    fs_tensor_free(&recv);
    fs_tensor_free(&stale);
    fs_uly_plan_free(&u);
    return rc;
}

/* The inverse: head-sharded y [B, S_u, Hl/U, Dh] → sequence-sharded x [B, s_loc, Hl, Dh]. */
static int ulysses_gather_heads(const fs_par *p, fs_backend *be, const fs_tensor *y, fs_tensor *x, int txt, fs_err *e)
{
    const fs_dtype dt = y->dtype;
    const int world = a2a_world(p);
    const int64_t B = x->shape[0], Hl = x->shape[2], Dh = x->shape[3], hb = Hl / (world ? p->sp : p->ulysses);
    fs_uly_plan u;
    fs_tensor send = {0}, recv = {0};
    int rc = uly_plan_make_on(p, &u, txt, world, e);
    if (rc) return rc;
    const int64_t xs = u.x[u.me];
    fs_uly_counts_to_tokens(&u, B, hb, Dh);
    if ((rc = alloc4(be, &send, dt, 1, B * u.S_u, hb, Dh, e)) || (rc = alloc4(be, &recv, dt, 1, B * xs, Hl, Dh, e)) ||
        (rc = fs_uly_pack_token_chunks(be, &u, y, &send, e)) ||
        (rc = fs_alltoallv_t(world ? &p->g_sp : &p->g_u, &send, u.sc, u.sd, &recv, u.rc, u.rd, e)))
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

/* --pad mask: the gathered K or V [B, S_u, hb, Dh] without the members' pad rows (each member's
 * block is its x_w rows, the first n_w real): the key mask, applied by leaving the masked keys
 * out (exp(−inf) = 0: the same softmax). In place. */
static int uly_compact(const fs_par *p, fs_backend *be, fs_tensor *t, int txt, fs_err *e)
{
    fs_uly_plan u;
    int rc = uly_plan_make(p, &u, txt, e);
    if (rc) return rc;
    int64_t real = 0;
    for (int w = 0; w < u.U; w++) real += u.n[w];
    fs_tensor c = {0}, blk = {0};
    if (real != u.S_u) {
        rc = alloc4(be, &c, t->dtype, t->shape[0], real, t->shape[2], t->shape[3], e);
        for (int w = 0, off = 0; w < u.U && !rc; off += (int)u.n[w], w++) {
            fs_tensor_free(&blk);
            if (!(rc = take_block(be, &blk, t, u.toff[w], u.n[w], 0, t->shape[2], e))) rc = put_block(be, &c, &blk, off, 0, e);
        }
        if (!rc) {
            fs_tensor_free(t);
            *t = c;
            c = (fs_tensor){0};
        }
    }
    fs_tensor_free(&c);
    fs_tensor_free(&blk);
    fs_uly_plan_free(&u);
    return rc;
}

/* ---------------------------------------------------------------- replicated text */

/* Attention with the text replicated on every SP rank: q, k, v, o [B, S_txt + s_img, Hl, Dh],
 * [all text | this rank's image tokens]. The image tokens go through the sequence-parallel
 * exchange as in the sharded layout; the text's heads are sliced locally (this Ulysses rank's
 * Hl/U heads of every text token: nothing to exchange, every rank holds them). The queries are
 * [text | image] (--joint front) or [image | text] (rear), as xDiT concatenates
 * joint_tensor_query; the text K/V join the keys once: at one ring step (ring_step_at), or
 * without ring, in front of or behind the gathered image keys. After attention the image rows go
 * back through the inverse all-to-all and the text rows, head-sharded, are all-gathered over the
 * Ulysses group (vllm-omni's UlyssesParallelAttention.post_attention). */
static int joint_attention(const fs_par *p, fs_backend *be, fs_tensor *o, const fs_tensor *q, const fs_tensor *k,
                           const fs_tensor *v, fs_err *e)
{
    const int64_t B = q->shape[0], S = q->shape[1], Hl = q->shape[2], Dh = q->shape[3], St = p->S_txt, si = S - St;
    const int U = p->ulysses, rear = p->joint == FS_JOINT_REAR;
    if (Hl % U)
        return fs_errf(e, FS_E_INPUT, "Ulysses degree %d does not divide the %lld local heads", U, (long long)Hl);
    if (si < 0) return fs_errf(e, FS_E_INTERNAL, "replicated text: %lld local tokens, fewer than the %lld text tokens",
                               (long long)S, (long long)St);
    const int64_t hb = Hl / U, h0 = (int64_t)p->u_rank * hb;
    /* --inject replicated-kv-a2a (vllm-omni#6930, #1233): K and V exchanged as the rank holds them,
     * text rows included, so every receiver gathers U copies of the text keys */
    const int kv_a2a = U > 1 && fs_injected(p->inject, FS_INJ_REPLICATED_KV_A2A);
    const int early = fs_injected(p->inject, FS_INJ_ULYSSES_EARLY_READ);
    fs_tensor tq = {0}, tk = {0}, tv = {0}, iq = {0}, ik = {0}, iv = {0}, qu = {0}, ku = {0}, vu = {0};
    fs_tensor qa = {0}, ka = {0}, va = {0}, oa = {0}, to = {0}, io = {0}, ix = {0}, tall = {0};
    int64_t *cnt = NULL;
    int rc;
    if ((rc = take_block(be, &tq, q, 0, St, h0, hb, e)) || (rc = take_block(be, &tk, k, 0, St, h0, hb, e)) ||
        (rc = take_block(be, &tv, v, 0, St, h0, hb, e)) || (rc = take_block(be, &iq, q, St, si, 0, Hl, e)))
        goto out;
    if (!kv_a2a && ((rc = take_block(be, &ik, k, St, si, 0, Hl, e)) || (rc = take_block(be, &iv, v, St, si, 0, Hl, e))))
        goto out;
    const fs_tensor *Qi = &iq, *Ki = &ik, *Vi = &iv;
    if (U > 1) {
        if ((rc = ulysses_scatter_heads(p, be, &iq, &qu, 0, 0, e))) goto out;
        if (kv_a2a) fs_inject_fire(FS_INJ_REPLICATED_KV_A2A);
        if ((rc = ulysses_scatter_heads(p, be, kv_a2a ? k : &ik, &ku, early, kv_a2a, e)) ||
            (rc = ulysses_scatter_heads(p, be, kv_a2a ? v : &iv, &vu, early, kv_a2a, e)))
            goto out;
        if (pad_masked(p) && ((rc = uly_compact(p, be, &ku, kv_a2a, e)) || (rc = uly_compact(p, be, &vu, kv_a2a, e))))
            goto out;
        Qi = &qu, Ki = &ku, Vi = &vu;
    }
    const int64_t Su = Qi->shape[1];
    if ((rc = cat_tokens(be, &qa, rear ? Qi : &tq, rear ? &tq : Qi, e)) ||
        (rc = fs_tensor_alloc_on(&oa, be, qa.dtype, 4, qa.shape, e)))
        goto out;
    if (p->ring > 1) /* the text joins at one ring step; under replicated-kv-a2a it rides in the chunks */
        rc = ring_attention(p, be, &oa, &qa, Ki, Vi, kv_a2a ? NULL : &tk, kv_a2a ? NULL : &tv, kv_a2a, e);
    else if (kv_a2a)
        rc = be->attention(be, &oa, NULL, &qa, Ki, Vi, 1.0 / sqrt((double)Dh), e);
    else if (!(rc = cat_tokens(be, &ka, rear ? Ki : &tk, rear ? &tk : Ki, e)) &&
             !(rc = cat_tokens(be, &va, rear ? Vi : &tv, rear ? &tv : Vi, e)))
        rc = be->attention(be, &oa, NULL, &qa, &ka, &va, 1.0 / sqrt((double)Dh), e);
    if (rc) goto out;
    /* the image rows back to this rank's tokens, all heads */
    if ((rc = take_block(be, &io, &oa, rear ? 0 : St, Su, 0, hb, e)) || (rc = take_block(be, &to, &oa, rear ? Su : 0, St, 0, hb, e)))
        goto out;
    if (U > 1) {
        if ((rc = alloc4(be, &ix, io.dtype, B, si, Hl, Dh, e)) || (rc = ulysses_gather_heads(p, be, &io, &ix, 0, e)) ||
            (rc = put_block(be, o, &ix, St, 0, e)))
            goto out;
        /* the text rows: every Ulysses rank computed its heads of all of them; all-gathered */
        if (!(cnt = malloc(sizeof(int64_t) * 2 * (size_t)U))) {
            rc = fs_errf(e, FS_E_NOMEM, "replicated text: out of memory for %d all-gather counts", U);
            goto out;
        }
        for (int w = 0; w < U; w++) cnt[w] = B * St * hb * Dh, cnt[U + w] = w * cnt[w];
        if ((rc = alloc4(be, &tall, to.dtype, 1, U * B * St, hb, Dh, e)) ||
            (rc = fs_allgatherv_t(&p->g_u, &to, &tall, cnt, cnt + U, e)))
            goto out;
        const size_t es = fs_dtype_size(to.dtype);
        for (int w = 0; w < U && !rc; w++) {
            int64_t s4[4] = {B, St, hb, Dh};
            fs_tensor blk = fs_tensor_reshape(&tall, 4, s4);
            blk.data = (char *)tall.data + (size_t)cnt[U + w] * es;
            rc = put_block(be, o, &blk, 0, w * hb, e);
        }
    } else if (!(rc = put_block(be, o, &io, St, 0, e)))
        rc = put_block(be, o, &to, 0, 0, e);
out:
    free(cnt);
    fs_tensor *all[] = {&tq, &tk, &tv, &iq, &ik, &iv, &qu, &ku, &vu, &qa, &ka, &va, &oa, &to, &io, &ix, &tall};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) fs_tensor_free(all[i]);
    return rc;
}

int fs_seqpar_attention(const fs_par *p, fs_backend *be, fs_tensor *o, const fs_tensor *q, const fs_tensor *k,
                        const fs_tensor *v, fs_err *e)
{
    if (fs_seqpar_text_joins(p)) return joint_attention(p, be, o, q, k, v, e);
    /* replicated text on the plain path: only --inject replicated-text-rotated sends it here, where
     * each rank's [text | image] tokens are exchanged and rotated as if the text were a shard */
    if (p->text == FS_TEXT_REPLICATED && p->sp > 1) fs_inject_fire(FS_INJ_REPLICATED_TEXT_ROTATED);
    if (p->ulysses == 1) return local_or_ring(p, be, o, q, k, v, e);
    const int U = a2a_world(p) ? p->sp : p->ulysses; /* --inject a2a-world-group: the SP group's size */
    if (q->shape[2] % U)
        return fs_errf(e, FS_E_INPUT, "Ulysses degree %d does not divide the %lld local heads", U, (long long)q->shape[2]);
    fs_tensor qu = {0}, ku = {0}, vu = {0}, ou = {0};
    int rc;
    /* --inject ulysses-early-read: K and V's exchanges overlapped with Q's, and read before their wait */
    const int early = fs_injected(p->inject, FS_INJ_ULYSSES_EARLY_READ);
    if ((rc = ulysses_scatter_heads(p, be, q, &qu, 0, 1, e)) || (rc = ulysses_scatter_heads(p, be, k, &ku, early, 1, e)) ||
        (rc = ulysses_scatter_heads(p, be, v, &vu, early, 1, e)))
        goto out;
    /* --pad mask: the pad keys out of the softmax (a2a-world-group's exchange pads nothing) */
    if (pad_masked(p) && !a2a_world(p) && ((rc = uly_compact(p, be, &ku, 1, e)) || (rc = uly_compact(p, be, &vu, 1, e))))
        goto out;
    if ((rc = fs_tensor_alloc_on(&ou, be, qu.dtype, 4, qu.shape, e))) goto out;
    if ((rc = local_or_ring(p, be, &ou, &qu, &ku, &vu, e))) goto out;
    rc = ulysses_gather_heads(p, be, &ou, o, 1, e);
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
    return ulysses_scatter_heads(p, be, x, y, 0, 1, e); /* the full local sequence (sharded text: fs_job refuses the rest) */
}

int fs_seqpar_uly_to_tokens(const fs_par *p, fs_backend *be, const fs_tensor *y, fs_tensor *x, fs_err *e)
{
    return ulysses_gather_heads(p, be, y, x, 1, e);
}
