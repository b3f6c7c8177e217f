/* fs_flux1.c — FLUX.1: diffusers' FluxTransformer2DModel, its blocks and forward, built from the
 * shared layer functions (fs_layers.h). FLUX.2 is fs_flux2.c beside it.
 *
 * Read top-down: fs_flux1_forward at the bottom calls the embedders, the double blocks
 * (transformer_blocks.i), the single blocks (single_transformer_blocks.i) and the output head.
 * Every function records what the matching diffusers module's forward hook would see, under the
 * module's path, in hook firing order (children before parents). Gotchas of ../shared/flux-spec.md
 * §9 are marked "gotcha N" where they bite.
 *
 * Memory: every activation lives in the backend's memory (m->be) and is touched only by backend
 * ops, so a GPU backend runs this file unchanged. The only host-side arithmetic is on the step's
 * scalars and ids: the timestep and guidance sinusoids and the RoPE tables are computed on the
 * host (fs_time_proj, fs_pos_embed) and uploaded, as inputs are. */
#include "fs_layers.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define TRY FS_TRY

/* time_text_embed: CombinedTimestep(Guidance)TextProjEmbeddings. temb = (time + guidance) + pooled. */
static int time_text_embed(fs_layer_ctx *c, const double *timestep, const double *guidance, const fs_tensor *pooled,
                           fs_tensor *temb)
{
    fs_tensor te = {0}, pe = {0};
    int rc;
    TRY(fs_time_guidance(c, "time_text_embed", timestep, guidance, &te));
    TRY(fs_mlp_embedder(c, pooled, "time_text_embed.text_embedder", "act_1", &pe));
    TRY(fs_layer_new_like(c, temb, &te));
    TRY(c->be->add(c->be, temb, &te, &pe, c->e));
    TRY(REC(temb, ST_REP, FS_TP_REPL, "time_text_embed"));
out:
    fs_tensor_free(&te);
    fs_tensor_free(&pe);
    return rc;
}

/* transformer_blocks.i — FluxTransformerBlock (double stream). x [B,S_img,D] and ctx_h
 * [B,S_txt,D] are updated in place. */
static int double_block(fs_layer_ctx *c, int i, fs_tensor *x, fs_tensor *cx, const fs_tensor *temb, const fs_tensor *cos_t,
                        const fs_tensor *sin_t)
{
    enum { XM, CM, AX, AC, LN2, M2, FF, LN2C, M2C, FFC, NT };
    fs_tensor t[NT] = {0}, mod[6] = {0}, cmod[6] = {0};
    char p[64], nm[160];
    int rc;
    fs_backend *be = c->be;
    snprintf(p, sizeof p, "transformer_blocks.%d", i);
#define N(suffix) fs_layer_name(nm, sizeof nm, "%s." suffix, p)

    TRY(fs_layer_block_enter(c, N("")));
    TRY(fs_ada_layer_norm_zero(c, N("norm1"), x, ST_IMG, temb, 6, &t[XM], mod));
    TRY(fs_ada_layer_norm_zero(c, N("norm1_context"), cx, ST_TXT, temb, 6, &t[CM], cmod));

    /* attn = FluxAttention with added (text) projections: to_out.0, then to_add_out */
    TRY(fs_joint_attention(c, p, &t[XM], &t[CM], cos_t, sin_t, 0, &t[AX], &t[AC]));

    /* image stream: gated attention residual, then the MLP reads the updated x (gotcha 12) */
    TRY(be->gated_add(be, x, &mod[2], &t[AX], c->e));
    TRY(fs_layernorm(c, x, &t[LN2]));
    TRY(REC(&t[LN2], ST_IMG, FS_TP_REPL, "%s.norm2", p));
    TRY(fs_layer_out_like(c, &t[M2], x));
    TRY(be->modulate(be, &t[M2], &t[LN2], &mod[4], &mod[3], c->e));
    TRY(fs_feed_forward(c, &t[M2], N("ff"), ST_IMG, &t[FF]));
    TRY(be->gated_add(be, x, &mod[5], &t[FF], c->e));

    /* text stream, same with the context weights */
    TRY(be->gated_add(be, cx, &cmod[2], &t[AC], c->e));
    TRY(fs_layernorm(c, cx, &t[LN2C]));
    TRY(REC(&t[LN2C], ST_TXT, FS_TP_REPL, "%s.norm2_context", p));
    TRY(fs_layer_out_like(c, &t[M2C], cx));
    TRY(be->modulate(be, &t[M2C], &t[LN2C], &cmod[4], &cmod[3], c->e));
    TRY(fs_feed_forward(c, &t[M2C], N("ff_context"), ST_TXT, &t[FFC]));
    TRY(be->gated_add(be, cx, &cmod[5], &t[FFC], c->e));

    TRY(REC(cx, ST_TXT, FS_TP_REPL, "%s#0", p)); /* gotcha 5: the block returns (text, image) */
    TRY(REC(x, ST_IMG, FS_TP_REPL, "%s#1", p));
#undef N
out:
    fs_layer_block_leave(c);
    fs_layer_free_all(t, NT);
    fs_layer_free_all(mod, 6);
    fs_layer_free_all(cmod, 6);
    return rc;
}

/* single_transformer_blocks.i — FluxSingleTransformerBlock on the joint h [B,S,D] (text first),
 * updated in place. */
static int single_block(fs_layer_ctx *c, int i, fs_tensor *h, const fs_tensor *temb, const fs_tensor *cos_t,
                        const fs_tensor *sin_t)
{
    enum { HM, MLP, ACT, Q, K, V, NQ, NK, A, CAT, PO, HT, HX, NT };
    fs_tensor t[NT] = {0}, mod[3] = {0};
    fs_tp_split smlp, sq, sk, sv;
    char p[64], nm[160];
    int rc;
    const int64_t B = h->shape[0], S = h->shape[1];
    snprintf(p, sizeof p, "single_transformer_blocks.%d", i);
#define N(suffix) fs_layer_name(nm, sizeof nm, "%s." suffix, p)

    TRY(fs_layer_block_enter(c, N("")));
    TRY(fs_ada_layer_norm_zero(c, N("norm"), h, ST_JOINT, temb, 3, &t[HM], mod));
    TRY(fs_linear(c, &t[HM], N("proj_mlp"), ST_JOINT, &t[MLP], &smlp));
    TRY(fs_activation(c, c->be->gelu_tanh, &t[MLP], &t[ACT], ST_JOINT, fs_tp_feat(&smlp), "%s.act_mlp", p));
    TRY(fs_linear(c, &t[HM], N("attn.to_q"), ST_JOINT, &t[Q], &sq));
    TRY(fs_linear(c, &t[HM], N("attn.to_k"), ST_JOINT, &t[K], &sk));
    TRY(fs_linear(c, &t[HM], N("attn.to_v"), ST_JOINT, &t[V], &sv));
    TRY(fs_qk_norm(c, &t[Q], &sq, N("attn.norm_q"), ST_JOINT, &t[NQ]));
    TRY(fs_qk_norm(c, &t[K], &sk, N("attn.norm_k"), ST_JOINT, &t[NK]));
    TRY(fs_rope_inplace(c, &t[NQ], cos_t, sin_t));
    TRY(fs_rope_inplace(c, &t[NK], cos_t, sin_t));
    TRY(fs_sdpa(c, &t[NQ], &t[NK], &t[V], &t[A]));
    TRY(REC(&t[A], ST_JOINT, fs_tp_feat(&sv), "%s.attn", p)); /* no output projection in single blocks (gotcha 11) */

    /* proj_out on cat([attn, mlp], dim=2): attention columns first. Under TP this is the rank's
     * [attn_shard | mlp_shard], which is why proj_out is packed_rowwise in the plan. */
    const int64_t Da = t[A].shape[2], Fa = t[ACT].shape[2];
    TRY(fs_layer_new_out(c, &t[CAT], 3, (int64_t[]){B, S, Da + Fa}));
    TRY(fs_layer_copy2d(c, t[CAT].data, Da + Fa, t[A].data, Da, B * S, Da));
    TRY(fs_layer_copy2d(c, (char *)t[CAT].data + (size_t)Da * fs_dtype_size(c->dt), Da + Fa, t[ACT].data, Fa, B * S, Fa));
    TRY(fs_linear(c, &t[CAT], N("proj_out"), ST_JOINT, &t[PO], NULL));
    TRY(c->be->gated_add(c->be, h, &mod[2], &t[PO], c->e));

    if (c->m->rec.fn) { /* the block returns (text, image) slices of h */
        TRY(fs_slice_seq(c, h, 0, c->S_txt, &t[HT]));
        TRY(fs_slice_seq(c, h, c->S_txt, c->S_img, &t[HX]));
        TRY(REC(&t[HT], ST_TXT, FS_TP_REPL, "%s#0", p));
        TRY(REC(&t[HX], ST_IMG, FS_TP_REPL, "%s#1", p));
    }
#undef N
out:
    fs_layer_block_leave(c);
    fs_layer_free_all(t, NT);
    fs_layer_free_all(mod, 3);
    return rc;
}

/* FluxPosEmbed of ids = cat(txt_ids, img_ids) — text first (gotcha 4) — on the host, uploaded;
 * tables are [S, Dh], no batch. */
static int pos_embed(fs_layer_ctx *c, const fs_tensor *img_ids, const fs_tensor *txt_ids, fs_tensor *cos_t, fs_tensor *sin_t)
{
    fs_tensor ids = {0}, hc = {0}, hs = {0};
    int rc = fs_tensor_alloc2(&ids, FS_F64, c->S, 3, c->e);
    if (rc) return rc;
    memcpy(ids.data, txt_ids->data, (size_t)c->S_txt * 3 * sizeof(double));
    memcpy((double *)ids.data + (size_t)c->S_txt * 3, img_ids->data, (size_t)c->S_img * 3 * sizeof(double));
    if (!(rc = fs_pos_embed(fs_layer_fixed_f32(c->dt), &c->m->cfg, &ids, &hc, &hs, c->e)) && !(rc = fs_layer_upload(c, &hc, cos_t)))
        rc = fs_layer_upload(c, &hs, sin_t);
    fs_tensor_free(&ids);
    fs_tensor_free(&hc);
    fs_tensor_free(&hs);
    return rc;
}

int fs_flux1_forward(const fs_model *m, const fs_tensor *hidden_states, const fs_tensor *encoder_hidden_states,
                     const fs_tensor *pooled, const double *timestep, const double *guidance,
                     const fs_tensor *img_ids, const fs_tensor *txt_ids, fs_tensor *out, fs_err *e)
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

    enum { X, TEMB, CX, COS, SIN, H, Y, NT };
    fs_tensor t[NT] = {0};
    int rc;

    TRY(fs_linear(c, hidden_states, "x_embedder", ST_IMG, &t[X], NULL));
    TRY(time_text_embed(c, timestep, cf->guidance_embeds ? guidance : NULL, pooled, &t[TEMB]));
    TRY(fs_linear(c, encoder_hidden_states, "context_embedder", ST_TXT, &t[CX], NULL));
    TRY(pos_embed(c, img_ids, txt_ids, &t[COS], &t[SIN]));
    TRY(fs_layer_record(c, &t[COS], ST_JOINT, 0, FS_TP_REPL, "pos_embed#0"));
    TRY(fs_layer_record(c, &t[SIN], ST_JOINT, 0, FS_TP_REPL, "pos_embed#1"));

    const int nblk = cf->num_layers + cf->num_single_layers;
#define PROGRESS(done) \
    if (m->on_block) m->on_block(m->on_block_ctx, m->step, (done), nblk)
    for (int i = 0; i < cf->num_layers; i++) {
        TRY(double_block(c, i, &t[X], &t[CX], &t[TEMB], &t[COS], &t[SIN]));
        PROGRESS(i + 1);
    }

    TRY(fs_cat_seq(c, &t[CX], &t[X], &t[H]));
    for (int i = 0; i < cf->num_single_layers; i++) {
        TRY(single_block(c, i, &t[H], &t[TEMB], &t[COS], &t[SIN]));
        PROGRESS(cf->num_layers + i + 1);
    }
#undef PROGRESS
    fs_tensor_free(&t[X]);
    TRY(fs_slice_seq(c, &t[H], c->S_txt, c->S_img, &t[X]));

    TRY(fs_ada_layer_norm_continuous(c, &t[X], &t[TEMB], &t[Y]));
    TRY(fs_linear(c, &t[Y], "proj_out", ST_IMG, out, NULL));
out:
    fs_layer_free_all(t, NT);
    if (rc) fs_tensor_free(out);
    return rc;
}
