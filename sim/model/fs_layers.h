/* fs_layers.h — the layer functions FLUX's model families share, one per diffusers module.
 *
 * A family (fs_flux1.c: FluxTransformer2DModel; a FLUX.2 family beside it) writes its blocks
 * and forward with these: Linear by the TP plan (fs_linear), attention over the joint sequence
 * with RoPE and the sequence-parallel layouts (fs_sdpa, fs_rope_inplace), the norms and the
 * AdaLN modulations, the embedders, and fs_layer_record, the one path by which a module output
 * reaches the recorders (dumps, --check) with its sharding. Every op runs through the backend
 * (c->be): no element loop or pointer dereference on activations here.
 *
 * Each function records what the matching diffusers module's forward hook would see, under the
 * module's path, in hook firing order. They return an FS_E_* code with the context in c->e. */
#ifndef FS_LAYERS_H
#define FS_LAYERS_H

#include "fs_model.h"

/* TRY(x): run x; on failure jump to the function's `out:` (which frees its tensors). */
#define FS_TRY(x)                 \
    do {                          \
        if ((rc = (x))) goto out; \
    } while (0)

/* One forward's state, shared by every layer call. */
typedef struct fs_layer_ctx {
    const fs_model *m;
    const fs_par *par; /* NULL: one rank holds everything */
    fs_backend *be;
    fs_dtype dt;
    int B, S_img, S_txt, S, D, H, Dh; /* S_* are this rank's LOCAL token counts */
    int tp, tp_rank;
    fs_weights blk; /* streaming: the current block's parameters, in be's memory */
    int kv_layer;   /* m->kv on: the cache slot of the block being computed (fs_sdpa); -1 none */
    int R;          /* reference tokens in this call's image stream (kv extract; this rank's), else 0 */
    int kv_out;     /* kv extract, after the blocks: image records are the noise tokens (make_shard) */
    char blk_prefix[64];
    fs_err *e;
} fs_layer_ctx;

/* Token sharding of a recorded tensor: which stream its token axis belongs to. */
enum { ST_REP = 0, ST_IMG, ST_TXT, ST_JOINT };

/* How a recorded tensor's feature axis is split over the TP group: the split of the Linear that
 * produced it (NULL: every TP rank holds all features). `unit` converts features to the axis'
 * units (head_dim for a [B,S,H,Dh] axis of heads). */
typedef struct fs_tp_axis {
    const fs_tp_split *sp;
    int axis; /* -1: last */
    int64_t unit;
} fs_tp_axis;
static const fs_tp_axis FS_TP_REPL = {NULL, -1, 1};

typedef int (*fs_unary_op)(fs_backend *, fs_tensor *, const fs_tensor *, fs_err *);

/* REC(t, stream, tp_axis of its features, name...): record with the token axis at dim 1 */
#define REC(t, stream, f, ...) fs_layer_record(c, (t), (stream), 1, (f), __VA_ARGS__)

/* Parameter `name` as the backend computes with it: the streamed block's, or a resident one. */
const fs_tensor *fs_layer_weight(const fs_layer_ctx *c, const char *name);

/* Streaming (m->stream): make the block's parameters for this rank's shard and place them in
 * the backend's memory; nothing otherwise. block_leave drops them. */
int fs_layer_block_enter(fs_layer_ctx *c, const char *prefix);

/* drops what fs_layer_block_enter made */
void fs_layer_block_leave(fs_layer_ctx *c);

/* snprintf into buf, returning buf: module names built from a block's prefix ("%s.attn.to_q"). */
const char *fs_layer_name(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Record `t` as module `name` (printf-style) through m->rec, with its sharding: the tokens of
 * `stream` on axis tokdim (sequence parallelism) and the features as `f` says (tensor
 * parallelism). The one recording path of every family; --inject fail-rank/nan-rank act here. */
int fs_layer_record(fs_layer_ctx *c, const fs_tensor *t, int stream, int tokdim, fs_tp_axis f, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* the tp_axis of a Linear's output features */
fs_tp_axis fs_tp_feat(const fs_tp_split *sp);

/* A zero-filled activation in the backend's memory. */
int fs_layer_new(fs_layer_ctx *c, fs_tensor *t, int ndim, const int64_t *shape);

/* the same, 3-D; and shaped like x */
int fs_layer_new3(fs_layer_ctx *c, fs_tensor *t, int64_t d0, int64_t d1, int64_t d2);

int fs_layer_new_like(fs_layer_ctx *c, fs_tensor *t, const fs_tensor *x);

/* An op's output that the op writes in full (a GEMM with beta = 0, an element-wise op, copies
 * that tile it): not zero-filled first, which at FLUX width was a memset of every activation. */
int fs_layer_new_out(fs_layer_ctx *c, fs_tensor *t, int ndim, const int64_t *shape);

int fs_layer_out_like(fs_layer_ctx *c, fs_tensor *t, const fs_tensor *x);

/* A host tensor computed here (sinusoids, RoPE tables), placed in backend memory. */
int fs_layer_upload(fs_layer_ctx *c, const fs_tensor *host, fs_tensor *dev);

/* fs_tensor_free of n tensors */
void fs_layer_free_all(fs_tensor *t, int n);

/* Byte-addressed 2-D copy inside backend memory: rows × width elements. */
int fs_layer_copy2d(fs_layer_ctx *c, void *dst, int64_t ld_dst, const void *src, int64_t ld_src, int64_t rows, int64_t cols);

/* nn.Linear: y = x·Wᵀ + b over the last dim of x; y is allocated with x's leading dims and the
 * output width this rank computes, then recorded under `name` (tokens of `stream`). Under tensor
 * parallelism fs_tp_split_of says what this rank holds (the weights are already that shard,
 * fs_weights_shard): its output rows (colwise, the bias follows them), or its input columns
 * (rowwise, packed_rowwise: a partial sum, all-reduced over the TP group, then the whole bias
 * once). *used (may be NULL) receives the split, for the records downstream. */
int fs_linear(fs_layer_ctx *c, const fs_tensor *x, const char *name, int stream, fs_tensor *y, fs_tp_split *used);

/* An element-wise activation module (SiLU, GELU(tanh)): y = op(x), recorded under the name. */
int fs_activation(fs_layer_ctx *c, fs_unary_op op, const fs_tensor *x, fs_tensor *y, int stream, fs_tp_axis f,
                  const char *fmt, ...) __attribute__((format(printf, 7, 8)));

/* Plain LayerNorm (no affine, eps 1e-6) into a new tensor. */
int fs_layernorm(fs_layer_ctx *c, const fs_tensor *x, fs_tensor *y);

/* Concatenate a [B,Sa,W] and b [B,Sb,W] along the sequence (dim 1) into [B,Sa+Sb,W]: two 2-D
 * copies, one row per batch. */
int fs_cat_seq(fs_layer_ctx *c, const fs_tensor *a, const fs_tensor *b, fs_tensor *y);

/* Tokens [s0, s0+n) of x [B,S,W...] into a new [B,n,W...] tensor. */
int fs_slice_seq(fs_layer_ctx *c, const fs_tensor *x, int64_t s0, int64_t n, fs_tensor *y);

/* torch.chunk(e, n, dim=1) of e [B, n·D] into n contiguous [B, D] tensors. */
int fs_chunk(fs_layer_ctx *c, const fs_tensor *e, int n, fs_tensor *out);

/* TimestepEmbedding / PixArtAlphaTextProjection: linear_1 → SiLU → linear_2. `act` is the
 * activation's module name ("act" in TimestepEmbedding, "act_1" in the text projection). */
int fs_mlp_embedder(fs_layer_ctx *c, const fs_tensor *x, const char *name, const char *act, fs_tensor *y);

/* Where diffusers computes in float32 whatever the model dtype (the sinusoids, the RoPE tables):
 * float32 for bf16 runs, the run dtype otherwise (a float64 run promotes them, as the reference). */
fs_dtype fs_layer_fixed_f32(fs_dtype dt);

/* The sinusoid of B scalars (fs_time_proj, on the host), in backend memory, in fixed_f32. */
int fs_layer_time_proj(fs_layer_ctx *c, const double *t, fs_tensor *out);

/* timesteps_proj.to(dtype=pooled_projection.dtype): the float32 sinusoid rounded to bf16 before
 * the embedder (a no-op view in float32/float64 runs). *tmp owns the copy when one is made. */
int fs_layer_to_run_dtype(fs_layer_ctx *c, const fs_tensor *x, fs_tensor *tmp, const fs_tensor **out);

/* The timestep or guidance x (as passed, /1000) as the transformer embeds it: x·1000 in the run's
 * arithmetic, or rounded as a bf16 transformer embeds it under --match bf16 (docs/bf16.md). */
double fs_layer_embedded_scalar(const fs_layer_ctx *c, double x);

/* AdaLayerNormZero (n=6) / AdaLayerNormZeroSingle (n=3): SiLU(temb) → linear → chunk(n) =
 * (shift, scale, gate[, shift_mlp, scale_mlp, gate_mlp]) (gotcha 8); returns LN(x)·(1+scale)+shift
 * in *xm and the chunks in mod[]. Records .silu, .linear, .norm, then the tuple #0..#(n-2):
 * #0 = modulated x, #k = chunk k+1 (shift and scale of the attention are not returned). */
int fs_ada_layer_norm_zero(fs_layer_ctx *c, const char *name, const fs_tensor *x, int stream, const fs_tensor *temb,
                               int n, fs_tensor *xm, fs_tensor *mod);

/* RMSNorm over head_dim of a [B,S,D] projection (this rank's heads: the projection's split),
 * recorded as [B,S,H,Dh] (gotcha 7). */
int fs_qk_norm(fs_layer_ctx *c, const fs_tensor *x, const fs_tp_split *proj, const char *name, int stream, fs_tensor *y);

/* FeedForward(D, D, "gelu-approximate"): net.0 = GELU(proj) (net.0.proj, net.0), net.1 Dropout(0),
 * net.2 Linear. Records all five hooks; *y is net.2's output (= the module's). */
int fs_feed_forward(fs_layer_ctx *c, const fs_tensor *x, const char *name, int stream, fs_tensor *y);

/* The timestep (+ guidance) part of both families' time embedding, under `name`
 * (time_text_embed, time_guidance_embed): timestep and guidance ×1000 as the transformer embeds
 * them, time_proj → timestep_embedder, then (guidance != NULL) time_proj@1 → guidance_embedder,
 * and *temb = their sum (not recorded: FLUX.1 adds its pooled-text embedding first). */
int fs_time_guidance(fs_layer_ctx *c, const char *name, const double *timestep, const double *guidance, fs_tensor *temb);

/* The joint attention of a double block, FluxAttention / Flux2Attention with added (text)
 * projections (`p` = the block's path): q, k, v of the modulated image xm and text cm (their
 * QK norms), the joint sequence text first with RoPE on q and k, SDPA, split, and the output
 * projections: *ax = attn.to_out.0 (image), *ac = attn.to_add_out (text). Records to_q ..
 * norm_added_k, the two projections in firing order (FLUX.2's processor runs to_add_out first:
 * add_out_first), to_out.1, attn#0 (image), attn#1 (text). */
int fs_joint_attention(fs_layer_ctx *c, const char *p, const fs_tensor *xm, const fs_tensor *cm, const fs_tensor *cos_t,
                       const fs_tensor *sin_t, int add_out_first, fs_tensor *ax, fs_tensor *ac);

/* Flux2SwiGLU on x [B,S,2·Fl] = [gate | up] (this rank's features): silu(gate)·up, recording
 * "<name>.gate_fn" and "<name>"; `f` is the sharding of the Fl output features. */
int fs_swiglu(fs_layer_ctx *c, const fs_tensor *x, const char *name, int stream, fs_tp_axis f, fs_tensor *y);

/* SDPA over the joint sequence: q, k, v [B,S,D] viewed as [B,S,H,Dh] (head-major columns). */
int fs_sdpa(fs_layer_ctx *c, const fs_tensor *q, const fs_tensor *k, const fs_tensor *v, fs_tensor *o);

/* apply_rotary_emb on x [B,S,H,Dh] (this rank's heads) with the [S,Dh] cos/sin tables. */
int fs_rope_inplace(fs_layer_ctx *c, fs_tensor *x, const fs_tensor *cos_t, const fs_tensor *sin_t);

/* norm_out = AdaLayerNormContinuous: SiLU → linear → chunk(2) = (scale, shift) — scale FIRST
 * (gotcha 8) — then LN(x)·(1 + scale) + shift; x is image tokens only (gotcha 13). */
int fs_ada_layer_norm_continuous(fs_layer_ctx *c, const fs_tensor *x, const fs_tensor *temb, fs_tensor *y);

/* ---- The families' forwards (fs_model_forward picks one by cfg.family) ---- */

/* FLUX.1, FluxTransformer2DModel (fs_flux1.c) */
int fs_flux1_forward(const fs_model *m, const fs_tensor *hidden_states, const fs_tensor *encoder_hidden_states,
                     const fs_tensor *pooled, const double *timestep, const double *guidance,
                     const fs_tensor *img_ids, const fs_tensor *txt_ids, fs_tensor *out, fs_err *e);
/* FLUX.2, Flux2Transformer2DModel (fs_flux2.c): no pooled vector; ids have 4 columns */
int fs_flux2_forward(const fs_model *m, const fs_tensor *hidden_states, const fs_tensor *encoder_hidden_states,
                     const double *timestep, const double *guidance, const fs_tensor *img_ids,
                     const fs_tensor *txt_ids, fs_tensor *out, fs_err *e);

#endif
