/* fs_flux2.c — FLUX.2: diffusers' Flux2Transformer2DModel (transformer_flux2.py), its blocks and
 * forward, built from the same layer functions as FLUX.1 (fs_layers.h).
 *
 * Read top-down from fs_flux2_forward at the bottom. What differs from FLUX.1 (fs_flux1.c):
 *  - no bias anywhere; no pooled text vector: temb = timestep (+ guidance) embedding only;
 *  - the AdaLN modulation is computed ONCE per forward by three shared Flux2Modulation linears
 *    (double_stream_modulation_img/_txt: 6 chunks, single_stream_modulation: 3) and the same
 *    chunks modulate every block of the stream; the blocks' norms are plain LayerNorms;
 *  - the MLPs are SwiGLU: linear_in D → 2F = [gate | up], act_fn = silu(gate)·up, linear_out;
 *  - the single block fuses q, k, v and the MLP input in one Linear (to_qkv_mlp_proj, output
 *    [q | k | v | gate | up]) and the attention and MLP outputs in another (to_out over
 *    cat[attn, mlp]); the block returns one tensor;
 *  - RoPE has 4 axes (T, H, W, L) with θ = 2000, and the text has real positions (0, 0, 0, l):
 *    pos_embed runs twice, on the image ids (pos_embed) then the text ids (pos_embed@1).
 * Every function records what the matching diffusers module's forward hook would see, under the
 * module's path, in hook firing order (../shared/reference/flux2-tiny/README.md lists them).
 *
 * Tensor parallelism follows diffusers' Flux2 _tp_plan: linear_in is packed column-parallel in
 * two blocks [F, F] and to_qkv_mlp_proj in five [D, D, D, F, F], so every rank's output is
 * [gate_t | up_t] and [q_t | k_t | v_t | gate_t | up_t]; the single block's to_out is packed
 * row-parallel over [D, F] (its input is this rank's cat[attn_t, mlp_t]). */
#include "fs_layers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY FS_TRY

/* The piece of a global feature axis of width W that TP rank t of T holds when a packed
 * column-parallel Linear splits each of its blocks evenly (q, k, v, gate or up of width W): the
 * contiguous features [t·W/T, (t+1)·W/T). For records, as a colwise split of that width. */
static fs_tp_split part_split(const fs_layer_ctx *c, int64_t W)
{
    fs_tp_split s = {.style = FS_TP_COLWISE, .N = W, .K = 0, .r0 = 0, .r1 = W, .nc = 1};
    if (c->tp > 1) {
        s.r0 = c->tp_rank * (W / c->tp);
        s.r1 = (c->tp_rank + 1) * (W / c->tp);
    }
    return s;
}

/* time_guidance_embed: Flux2TimestepGuidanceEmbeddings. temb = timestep_embedder(sinusoid(t))
 * (+ guidance_embedder(sinusoid(g))): the shared part of FLUX.1's, recorded as the module. */
static int time_guidance_embed(fs_layer_ctx *c, const double *timestep, const double *guidance, fs_tensor *temb)
{
    int rc = fs_time_guidance(c, "time_guidance_embed", timestep, guidance, temb);
    if (!rc && (rc = REC(temb, ST_REP, FS_TP_REPL, "time_guidance_embed"))) fs_tensor_free(temb);
    return rc;
}

/* Flux2Modulation `name`: linear(SiLU(temb)) [B, 3·sets·D], chunked into 3·sets vectors
 * (shift, scale, gate per set) in mod[]. Replicated on every rank (diffusers' plan leaves it
 * out: each block indexes the whole hidden dim). */
static int modulation(fs_layer_ctx *c, const char *name, const fs_tensor *temb, int sets, fs_tensor *mod)
{
    fs_tensor s = {0}, lin = {0};
    char nm[160];
    int rc;
    TRY(fs_activation(c, c->be->silu, temb, &s, ST_REP, FS_TP_REPL, "%s.act_fn", name));
    TRY(fs_linear(c, &s, fs_layer_name(nm, sizeof nm, "%s.linear", name), ST_REP, &lin, NULL));
    TRY(REC(&lin, ST_REP, FS_TP_REPL, "%s", name));
    TRY(fs_chunk(c, &lin, 3 * sets, mod));
out:
    fs_tensor_free(&s);
    fs_tensor_free(&lin);
    return rc;
}

/* ---- per-token modulation (the KV cache's reference tokens) ----
 * In kv_cache_mode "extract" diffusers blends the modulation per token (_blend_double_block_mods,
 * _blend_single_block_mods): the reference tokens take the chunks of the reference time
 * embedding, the others the step's. Both ops are element-wise, so running each token range with
 * its own chunks computes the blended tensors' values. A stream is a list of ranges. */
typedef struct seg {
    int64_t n;                            /* tokens */
    const fs_tensor *shift, *scale, *gate; /* [B, D] chunks */
} seg;

/* tokens of src [B, n, W] into dst [B, S, W] from token s0 */
static int put_seq(fs_layer_ctx *c, fs_tensor *dst, int64_t s0, const fs_tensor *src)
{
    const int64_t B = dst->shape[0], S = dst->shape[1], n = src->shape[1], W = fs_tensor_numel(dst) / (B * S);
    return fs_layer_copy2d(c, (char *)dst->data + (size_t)(s0 * W) * fs_dtype_size(c->dt), S * W, src->data, n * W, B,
                           n * W);
}

/* (1 + scale)·ln + shift into xm (shaped like ln), range by range */
static int modulate_seg(fs_layer_ctx *c, fs_tensor *xm, const fs_tensor *ln, const seg *sg, int nseg)
{
    if (nseg == 1) return c->be->modulate(c->be, xm, ln, sg[0].scale, sg[0].shift, c->e);
    int rc = FS_OK;
    for (int64_t k = 0, s0 = 0; k < nseg && !rc; s0 += sg[k].n, k++) {
        fs_tensor a = {0}, b = {0};
        if (sg[k].n && !(rc = fs_slice_seq(c, ln, s0, sg[k].n, &a)) && !(rc = fs_layer_out_like(c, &b, &a)) &&
            !(rc = c->be->modulate(c->be, &b, &a, sg[k].scale, sg[k].shift, c->e)))
            rc = put_seq(c, xm, s0, &b);
        fs_tensor_free(&a);
        fs_tensor_free(&b);
    }
    return rc;
}

/* x += gate·y, range by range */
static int gated_add_seg(fs_layer_ctx *c, fs_tensor *x, const seg *sg, int nseg, const fs_tensor *y)
{
    if (nseg == 1) return c->be->gated_add(c->be, x, sg[0].gate, y, c->e);
    int rc = FS_OK;
    for (int64_t k = 0, s0 = 0; k < nseg && !rc; s0 += sg[k].n, k++) {
        fs_tensor a = {0}, b = {0};
        if (sg[k].n && !(rc = fs_slice_seq(c, x, s0, sg[k].n, &a)) && !(rc = fs_slice_seq(c, y, s0, sg[k].n, &b)) &&
            !(rc = c->be->gated_add(c->be, &a, sg[k].gate, &b, c->e)))
            rc = put_seq(c, x, s0, &a);
        fs_tensor_free(&a);
        fs_tensor_free(&b);
    }
    return rc;
}

/* LayerNorm `name` of x (recorded: the hook sees the plain norm), then (1 + scale)·LN(x) + shift
 * into *xm (not a module), with each token range's chunks. */
static int norm_modulate(fs_layer_ctx *c, const char *name, const fs_tensor *x, int stream, const seg *sg,
                         int nseg, fs_tensor *xm)
{
    fs_tensor ln = {0};
    int rc;
    TRY(fs_layernorm(c, x, &ln));
    TRY(REC(&ln, stream, FS_TP_REPL, "%s", name));
    TRY(fs_layer_out_like(c, xm, x));
    TRY(modulate_seg(c, xm, &ln, sg, nseg));
out:
    fs_tensor_free(&ln);
    return rc;
}

/* Flux2FeedForward `name` (ff, ff_context): linear_in → act_fn (SwiGLU) → linear_out. */
static int feed_forward(fs_layer_ctx *c, const fs_tensor *x, const char *name, int stream, fs_tensor *y)
{
    fs_tensor h[2] = {0};
    fs_tp_split in, gate;
    char nm[160];
    int rc;
    TRY(fs_linear(c, x, fs_layer_name(nm, sizeof nm, "%s.linear_in", name), stream, &h[0], &in));
    gate = part_split(c, fs_config_mlp_hidden(&c->m->cfg));
    TRY(fs_swiglu(c, &h[0], fs_layer_name(nm, sizeof nm, "%s.act_fn", name), stream, fs_tp_feat(&gate), &h[1]));
    TRY(fs_linear(c, &h[1], fs_layer_name(nm, sizeof nm, "%s.linear_out", name), stream, y, NULL));
    TRY(REC(y, stream, FS_TP_REPL, "%s", name));
out:
    fs_layer_free_all(h, 2);
    return rc;
}

/* transformer_blocks.i — Flux2TransformerBlock. x [B,S_img,D] and cx [B,S_txt,D] are updated in
 * place; mi[6], mt[6]: the image and text modulation chunks (shift, scale, gate) × (attn, MLP). */
static int double_block(fs_layer_ctx *c, int i, fs_tensor *x, fs_tensor *cx, const fs_tensor *mi, const fs_tensor *mt,
                        const fs_tensor *mr, const fs_tensor *cos_t, const fs_tensor *sin_t)
{
    /* the image stream's token ranges: [R reference tokens (chunks mr); the image (mi)] */
    const int64_t R = c->R, Si = x->shape[1];
    const seg ia[2] = {{R, R ? &mr[0] : NULL, R ? &mr[1] : NULL, R ? &mr[2] : NULL}, {Si - R, &mi[0], &mi[1], &mi[2]}},
              im[2] = {{R, R ? &mr[3] : NULL, R ? &mr[4] : NULL, R ? &mr[5] : NULL}, {Si - R, &mi[3], &mi[4], &mi[5]}},
              ta[1] = {{cx->shape[1], &mt[0], &mt[1], &mt[2]}}, tm[1] = {{cx->shape[1], &mt[3], &mt[4], &mt[5]}};
    const seg *iap = R ? ia : ia + 1, *imp = R ? im : im + 1;
    const int ni = R ? 2 : 1;
    enum { XM, CM, AX, AC, M2, FF, M2C, FFC, NT };
    fs_tensor t[NT] = {0};
    char p[64], nm[160];
    int rc;
    snprintf(p, sizeof p, "transformer_blocks.%d", i);
#define N(suffix) fs_layer_name(nm, sizeof nm, "%s." suffix, p)

    TRY(fs_layer_block_enter(c, N("")));
    TRY(norm_modulate(c, N("norm1"), x, ST_IMG, iap, ni, &t[XM]));
    TRY(norm_modulate(c, N("norm1_context"), cx, ST_TXT, ta, 1, &t[CM]));

    /* attn = Flux2Attention with added (text) projections; Flux2AttnProcessor applies
     * to_add_out before to_out (unlike FLUX.1's order) */
    TRY(fs_joint_attention(c, p, &t[XM], &t[CM], cos_t, sin_t, 1, &t[AX], &t[AC]));

    /* image stream: gated attention residual, then norm2 → MLP on the updated x */
    TRY(gated_add_seg(c, x, iap, ni, &t[AX]));
    TRY(norm_modulate(c, N("norm2"), x, ST_IMG, imp, ni, &t[M2]));
    TRY(feed_forward(c, &t[M2], N("ff"), ST_IMG, &t[FF]));
    TRY(gated_add_seg(c, x, imp, ni, &t[FF]));

    /* text stream, the same with the text modulation and ff_context */
    TRY(gated_add_seg(c, cx, ta, 1, &t[AC]));
    TRY(norm_modulate(c, N("norm2_context"), cx, ST_TXT, tm, 1, &t[M2C]));
    TRY(feed_forward(c, &t[M2C], N("ff_context"), ST_TXT, &t[FFC]));
    TRY(gated_add_seg(c, cx, tm, 1, &t[FFC]));

    TRY(REC(cx, ST_TXT, FS_TP_REPL, "%s#0", p)); /* the block returns (text, image) */
    TRY(REC(x, ST_IMG, FS_TP_REPL, "%s#1", p));
#undef N
out:
    fs_layer_block_leave(c);
    fs_layer_free_all(t, NT);
    return rc;
}

/* single_transformer_blocks.i — Flux2SingleTransformerBlock on the joint h [B,S,D] (text first),
 * updated in place; ms[3]: the single-stream (shift, scale, gate). */
static int single_block(fs_layer_ctx *c, int i, fs_tensor *h, const fs_tensor *ms, const fs_tensor *msr,
                        const fs_tensor *cos_t, const fs_tensor *sin_t)
{
    /* token ranges: [text (ms); R reference tokens (msr); the image (ms)] */
    const int64_t R = c->R, St = c->S_txt, Sj = h->shape[1];
    const seg sg3[3] = {{St, &ms[0], &ms[1], &ms[2]},
                        {R, R ? &msr[0] : NULL, R ? &msr[1] : NULL, R ? &msr[2] : NULL},
                        {Sj - St - R, &ms[0], &ms[1], &ms[2]}},
              sg1[1] = {{Sj, &ms[0], &ms[1], &ms[2]}};
    const seg *sg = R ? sg3 : sg1;
    const int nsg = R ? 3 : 1;
    enum { HM, QKVM, Q, K, V, MLPIN, NQ, NK, A, ACT, CAT, PO, NT };
    fs_tensor t[NT] = {0};
    char p[64], nm[160];
    int rc;
    const fs_config *cf = &c->m->cfg;
    const int64_t B = h->shape[0], S = h->shape[1];
    snprintf(p, sizeof p, "single_transformer_blocks.%d", i);
#define N(suffix) fs_layer_name(nm, sizeof nm, "%s." suffix, p)

    TRY(fs_layer_block_enter(c, N("")));
    TRY(norm_modulate(c, N("norm"), h, ST_JOINT, sg, nsg, &t[HM]));
    TRY(fs_linear(c, &t[HM], N("attn.to_qkv_mlp_proj"), ST_JOINT, &t[QKVM], NULL));

    /* this rank's [q_t | k_t | v_t | gate_t | up_t]: every block split evenly (packed colwise),
     * so the local pieces sit at multiples of the local widths */
    const fs_tp_split sq = part_split(c, fs_config_hidden(cf)), sm = part_split(c, fs_config_mlp_hidden(cf));
    const int64_t Dl = sq.r1 - sq.r0, Fl = sm.r1 - sm.r0, W = t[QKVM].shape[2];
    if (W != 3 * Dl + 2 * Fl)
        TRY(fs_errf(c->e, FS_E_INPUT, "%s.attn.to_qkv_mlp_proj: %lld local features, expected 3·%lld + 2·%lld", p,
                    (long long)W, (long long)Dl, (long long)Fl));
    const size_t es = fs_dtype_size(c->dt);
    fs_tensor *qkv[3] = {&t[Q], &t[K], &t[V]};
    for (int k = 0; k < 3; k++) {
        TRY(fs_layer_new_out(c, qkv[k], 3, (int64_t[]){B, S, Dl}));
        TRY(fs_layer_copy2d(c, qkv[k]->data, Dl, (const char *)t[QKVM].data + (size_t)(k * Dl) * es, W, B * S, Dl));
    }
    TRY(fs_layer_new_out(c, &t[MLPIN], 3, (int64_t[]){B, S, 2 * Fl}));
    TRY(fs_layer_copy2d(c, t[MLPIN].data, 2 * Fl, (const char *)t[QKVM].data + (size_t)(3 * Dl) * es, W, B * S, 2 * Fl));

    TRY(fs_qk_norm(c, &t[Q], &sq, N("attn.norm_q"), ST_JOINT, &t[NQ]));
    TRY(fs_qk_norm(c, &t[K], &sq, N("attn.norm_k"), ST_JOINT, &t[NK]));
    TRY(fs_rope_inplace(c, &t[NQ], cos_t, sin_t));
    TRY(fs_rope_inplace(c, &t[NK], cos_t, sin_t));
    TRY(fs_sdpa(c, &t[NQ], &t[NK], &t[V], &t[A]));
    TRY(fs_swiglu(c, &t[MLPIN], N("attn.mlp_act_fn"), ST_JOINT, fs_tp_feat(&sm), &t[ACT]));

    /* to_out on cat([attn, mlp], dim=-1): under TP the rank's [attn_t | mlp_t], which is why it
     * is packed row-parallel over [D, F] */
    TRY(fs_layer_new_out(c, &t[CAT], 3, (int64_t[]){B, S, Dl + Fl}));
    TRY(fs_layer_copy2d(c, t[CAT].data, Dl + Fl, t[A].data, Dl, B * S, Dl));
    TRY(fs_layer_copy2d(c, (char *)t[CAT].data + (size_t)Dl * es, Dl + Fl, t[ACT].data, Fl, B * S, Fl));
    TRY(fs_linear(c, &t[CAT], N("attn.to_out"), ST_JOINT, &t[PO], NULL));
    TRY(REC(&t[PO], ST_JOINT, FS_TP_REPL, "%s.attn", p)); /* Flux2ParallelSelfAttention returns to_out's */
    TRY(gated_add_seg(c, h, sg, nsg, &t[PO]));
    TRY(REC(h, ST_JOINT, FS_TP_REPL, "%s", p)); /* one tensor: split_hidden_states is False */
#undef N
out:
    fs_layer_block_leave(c);
    fs_layer_free_all(t, NT);
    return rc;
}

/* Flux2PosEmbed of `ids` [S, axes] (host), recorded as `name`#0/#1 (cos, sin [S, Dh]); the host
 * tables are kept for the joint table. */
static int pos_embed(fs_layer_ctx *c, const fs_tensor *ids, int stream, const char *name, fs_tensor *hc, fs_tensor *hs)
{
    fs_tensor dc = {0}, ds = {0};
    int rc;
    TRY(fs_pos_embed(fs_layer_fixed_f32(c->dt), &c->m->cfg, ids, hc, hs, c->e));
    if (c->m->rec.fn || (c->par && c->par->inject)) {
        TRY(fs_layer_upload(c, hc, &dc));
        TRY(fs_layer_upload(c, hs, &ds));
        TRY(fs_layer_record(c, &dc, stream, 0, FS_TP_REPL, "%s#0", name));
        TRY(fs_layer_record(c, &ds, stream, 0, FS_TP_REPL, "%s#1", name));
    }
out:
    fs_tensor_free(&dc);
    fs_tensor_free(&ds);
    return rc;
}

/* cat(text table, image table) along tokens, on the host, uploaded */
static int joint_table(fs_layer_ctx *c, const fs_tensor *txt, const fs_tensor *img, fs_tensor *out)
{
    fs_tensor j = {0};
    const int64_t Dh = c->Dh;
    int rc = fs_tensor_alloc2(&j, txt->dtype, c->S, Dh, c->e);
    if (rc) return rc;
    const size_t es = fs_dtype_size(txt->dtype);
    memcpy(j.data, txt->data, (size_t)c->S_txt * Dh * es);
    memcpy((char *)j.data + (size_t)c->S_txt * Dh * es, img->data, (size_t)c->S_img * Dh * es);
    rc = fs_layer_upload(c, &j, out);
    fs_tensor_free(&j);
    return rc;
}

/* The reference time embedding's records (kv_cache_mode "extract"): the forward calls
 * time_guidance_embed, double_stream_modulation_img and single_stream_modulation a second time,
 * which the hooks name as each module's next call: `name@1`, and for time_proj (fired once per
 * sinusoid: once, or twice with guidance, in the first call) `time_proj@(k + calls)`. */
typedef struct ref_names {
    fs_recorder inner;
    int time_proj_calls;
} ref_names;

static int ref_record(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e)
{
    const ref_names *r = ctx;
    const char *hash = strchr(name, '#'), *end = hash ? hash : name + strlen(name), *at = NULL;
    for (const char *q = name; q < end; q++)
        if (*q == '@') at = q;
    const int blen = (int)((at ? at : end) - name), k = at ? atoi(at + 1) : 0;
    const int tp = blen >= 10 && !strncmp(name + blen - 10, ".time_proj", 10);
    char nm[256];
    snprintf(nm, sizeof nm, "%.*s@%d%s", blen, name, k + (tp ? r->time_proj_calls : 1), hash ? hash : "");
    return r->inner.fn(r->inner.ctx, nm, t, sh, e);
}

int fs_flux2_forward(const fs_model *m, const fs_tensor *hidden_states, const fs_tensor *encoder_hidden_states,
                     const double *timestep, const double *guidance, const fs_tensor *img_ids,
                     const fs_tensor *txt_ids, fs_tensor *out, fs_err *e)
{
    const fs_config *cf = &m->cfg;
    fs_layer_ctx cc = {.m = m, .par = m->par, .be = m->be, .dt = m->dtype, .tp = m->par ? m->par->tp : 1,
                       .tp_rank = m->par ? m->par->tp_rank : 0, .e = e},
                 *c = &cc;
    c->B = (int)hidden_states->shape[0];
    c->S_img = (int)hidden_states->shape[1];
    c->S_txt = (int)encoder_hidden_states->shape[1];
    c->S = c->S_img + c->S_txt;
    c->D = fs_config_hidden(cf);
    c->H = cf->num_attention_heads;
    c->Dh = cf->attention_head_dim;
    memset(out, 0, sizeof *out);
    if (cf->guidance_embeds && !guidance)
        return fs_errf(e, FS_E_INPUT, "config has guidance_embeds=true but no guidance value was given");

    /* the KV cache: extract (step 0: the first R image tokens are the reference's) or cached */
    fs_kv_cache *kv = m->kv && m->kv->mode != FS_KV_OFF ? m->kv : NULL;
    const int extract = kv && kv->mode == FS_KV_EXTRACT;
    c->R = extract ? kv->R : 0;
    if (extract && m->par && m->par->sp > 1) { /* this rank's reference tokens: the first of its image stream */
        const int64_t lo = m->par->img_lo[m->par->sp_rank], r = kv->R - lo;
        c->R = r < 0 ? 0 : (int)r;
    }
    c->kv_layer = -1;
    if (c->R >= c->S_img)
        return fs_errf(e, FS_E_INTERNAL, "kv extract: %d image tokens, %d of them reference", c->S_img, c->R);

    enum { X, TEMB, CX, COS, SIN, H, Y, RTEMB, NT };
    fs_tensor t[NT] = {0}, mi[6] = {0}, mt[6] = {0}, ms[3] = {0}, mr[6] = {0}, msr[3] = {0};
    fs_tensor ic = {0}, is = {0}, tc = {0}, ts = {0};
    int rc;

    /* 1. timestep (+ guidance) embedding, then the three shared modulations */
    TRY(time_guidance_embed(c, timestep, cf->guidance_embeds ? guidance : NULL, &t[TEMB]));
    TRY(modulation(c, "double_stream_modulation_img", &t[TEMB], 2, mi));
    TRY(modulation(c, "double_stream_modulation_txt", &t[TEMB], 2, mt));
    TRY(modulation(c, "single_stream_modulation", &t[TEMB], 1, ms));
    if (extract) { /* on every rank, whether or not it holds reference tokens (the records are collective) */
        /* the reference tokens' modulation: time_guidance_embed(full_like(timestep, 0), guidance)
         * (ref_fixed_timestep 0, as Flux2KleinKVPipeline calls it), its image and single-stream
         * modulations; recorded as those modules' second calls */
        fs_model mref = *m;
        ref_names rn = {.inner = m->rec, .time_proj_calls = cf->guidance_embeds ? 2 : 1};
        if (m->rec.fn) mref.rec = (fs_recorder){.fn = ref_record, .ctx = &rn};
        fs_layer_ctx rctx = *c;
        rctx.m = &mref;
        const double zero[64] = {0}; /* B <= 64 (fs_time_guidance) */
        TRY(time_guidance_embed(&rctx, zero, cf->guidance_embeds ? guidance : NULL, &t[RTEMB]));
        TRY(modulation(&rctx, "double_stream_modulation_img", &t[RTEMB], 2, mr));
        TRY(modulation(&rctx, "single_stream_modulation", &t[RTEMB], 1, msr));
    }
    /* 2. input projections */
    TRY(fs_linear(c, hidden_states, "x_embedder", ST_IMG, &t[X], NULL));
    TRY(fs_linear(c, encoder_hidden_states, "context_embedder", ST_TXT, &t[CX], NULL));
    /* 3. RoPE: image ids first (pos_embed), then text ids (pos_embed@1); joint = cat(text, image) */
    TRY(pos_embed(c, img_ids, ST_IMG, "pos_embed", &ic, &is));
    TRY(pos_embed(c, txt_ids, ST_TXT, "pos_embed@1", &tc, &ts));
    TRY(joint_table(c, &tc, &ic, &t[COS]));
    TRY(joint_table(c, &ts, &is, &t[SIN]));

    const int nblk = cf->num_layers + cf->num_single_layers;
#define PROGRESS(done) \
    if (m->on_block) m->on_block(m->on_block_ctx, m->step, (done), nblk)
    for (int i = 0; i < cf->num_layers; i++) {
        c->kv_layer = kv ? i : -1;
        TRY(double_block(c, i, &t[X], &t[CX], mi, mt, mr, &t[COS], &t[SIN]));
        PROGRESS(i + 1);
    }
    TRY(fs_cat_seq(c, &t[CX], &t[X], &t[H]));
    for (int i = 0; i < cf->num_single_layers; i++) {
        c->kv_layer = kv ? cf->num_layers + i : -1;
        TRY(single_block(c, i, &t[H], ms, msr, &t[COS], &t[SIN]));
        PROGRESS(cf->num_layers + i + 1);
    }
    c->kv_layer = -1;
#undef PROGRESS
    fs_tensor_free(&t[X]);
    /* the text tokens and (extract) the reference tokens removed */
    TRY(fs_slice_seq(c, &t[H], c->S_txt + c->R, c->S_img - c->R, &t[X]));
    c->kv_out = extract;

    /* 7. output layers: AdaLayerNormContinuous (no bias) and proj_out, as FLUX.1's */
    TRY(fs_ada_layer_norm_continuous(c, &t[X], &t[TEMB], &t[Y]));
    TRY(fs_linear(c, &t[Y], "proj_out", ST_IMG, out, NULL));
out:
    fs_layer_free_all(t, NT);
    fs_layer_free_all(mi, 6);
    fs_layer_free_all(mt, 6);
    fs_layer_free_all(ms, 3);
    fs_layer_free_all(mr, 6);
    fs_layer_free_all(msr, 3);
    fs_tensor_free(&ic);
    fs_tensor_free(&is);
    fs_tensor_free(&tc);
    fs_tensor_free(&ts);
    if (rc) fs_tensor_free(out);
    return rc;
}
