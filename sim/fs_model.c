/* fs_model.c — FLUX.1 forward, module by module, as diffusers computes it.
 *
 * Read top-down: fs_model_forward at the bottom calls the embedders, the double blocks
 * (transformer_blocks.i), the single blocks (single_transformer_blocks.i) and the output head.
 * Every function records what the matching diffusers module's forward hook would see, under the
 * module's path, in hook firing order (children before parents). Gotchas of ../shared/flux-spec.md
 * §9 are marked "gotcha N" where they bite. */
#include "fs_model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define LN_EPS 1e-6  /* every LayerNorm in FLUX: no affine, eps 1e-6 */
#define RMS_EPS 1e-6 /* QK RMSNorm eps (the FluxAttention default 1e-5 is never used) */

#define TRY(x)                    \
    do {                          \
        if ((rc = (x))) goto out; \
    } while (0)

/* ---------------------------------------------------------------- small helpers */

typedef struct ctx {
    const fs_model *m;
    fs_backend *be;
    fs_dtype dt;
    int B, S_img, S_txt, S, D, H, Dh;
    fs_err *e;
} ctx;

static const char *fmt_name(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static const char *fmt_name(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return buf;
}

/* Record `t` as module `name` (printf-style), viewed with the given PyTorch shape when ndim > 0. */
static int rec_shaped(ctx *c, const fs_tensor *t, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int rec_shaped(ctx *c, const fs_tensor *t, int ndim, const int64_t *shape, const char *fmt, ...)
{
    if (!c->m->rec.fn) return FS_OK;
    char name[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    fs_tensor v = ndim > 0 ? fs_tensor_reshape(t, ndim, shape) : *t;
    int rc = c->m->rec.fn(c->m->rec.ctx, name, &v, c->e);
    if (rc) fs_err_prefix(c->e, "recording %s: ", name);
    return rc;
}
#define REC(t, ...) rec_shaped(c, (t), 0, NULL, __VA_ARGS__)

static int alloc3(ctx *c, fs_tensor *t, int64_t d0, int64_t d1, int64_t d2)
{
    return fs_tensor_alloc3(t, c->dt, d0, d1, d2, c->e);
}

/* nn.Linear: y = x·Wᵀ + b over the last dim of x; y is allocated with x's leading dims and the
 * weight's out width, then recorded under `name`. */
static int linear(ctx *c, const fs_tensor *x, const char *name, fs_tensor *y)
{
    char wn[192], bn[192];
    const fs_tensor *W = fs_weights_get(c->m->w, fmt_name(wn, sizeof wn, "%s.weight", name));
    const fs_tensor *b = fs_weights_get(c->m->w, fmt_name(bn, sizeof bn, "%s.bias", name));
    if (!W || !b) return fs_errf(c->e, FS_E_INTERNAL, "weights have no %s", W ? bn : wn);
    int64_t K = W->shape[1], N = W->shape[0];
    if (x->shape[x->ndim - 1] != K) {
        char s1[64], s2[64];
        return fs_errf(c->e, FS_E_INTERNAL, "%s: input %s does not match weight %s", name,
                       fs_tensor_shape_str(x, s1, sizeof s1), fs_tensor_shape_str(W, s2, sizeof s2));
    }
    int64_t shape[FS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = N;
    int rc = fs_tensor_alloc(y, c->dt, x->ndim, shape, c->e);
    if (rc) return rc;
    int64_t M = fs_tensor_numel(x) / K;
    c->be->gemm(c->dt, 1, M, N, K, 1.0, x->data, K, W->data, K, 0.0, y->data, N);
    c->be->add_bias(y, b->data, N);
    return REC(y, "%s", name);
}

/* Element-wise activation into a new tensor, recorded under `name`. */
static int activation(ctx *c, void (*op)(fs_tensor *, const fs_tensor *), const fs_tensor *x, fs_tensor *y,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int activation(ctx *c, void (*op)(fs_tensor *, const fs_tensor *), const fs_tensor *x, fs_tensor *y,
                      const char *fmt, ...)
{
    int rc = fs_tensor_alloc(y, c->dt, x->ndim, x->shape, c->e);
    if (rc) return rc;
    op(y, x);
    char name[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return REC(y, "%s", name);
}

/* Plain LayerNorm (no affine, eps 1e-6) into a new tensor. */
static int layernorm(ctx *c, const fs_tensor *x, fs_tensor *y)
{
    int rc = fs_tensor_alloc(y, c->dt, x->ndim, x->shape, c->e);
    if (!rc) c->be->layernorm(y, x, x->shape[x->ndim - 1], LN_EPS);
    return rc;
}

/* Concatenate a [B,Sa,W] and b [B,Sb,W] along the sequence (dim 1) into [B,Sa+Sb,W]. */
static int cat_seq(ctx *c, const fs_tensor *a, const fs_tensor *b, fs_tensor *y)
{
    int64_t B = a->shape[0], Sa = a->shape[1], Sb = b->shape[1], W = fs_tensor_numel(a) / (B * (Sa ? Sa : 1));
    if (Sa == 0) W = fs_tensor_numel(b) / (B * Sb);
    int64_t shape[FS_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    shape[1] = Sa + Sb;
    int rc = fs_tensor_alloc(y, c->dt, a->ndim, shape, c->e);
    if (rc) return rc;
    size_t es = fs_dtype_size(c->dt);
    for (int64_t i = 0; i < B; i++) {
        char *dst = (char *)y->data + (size_t)(i * (Sa + Sb) * W) * es;
        c->be->copy2d(c->dt, dst, W, (const char *)a->data + (size_t)(i * Sa * W) * es, W, Sa, W);
        c->be->copy2d(c->dt, dst + (size_t)(Sa * W) * es, W, (const char *)b->data + (size_t)(i * Sb * W) * es, W, Sb, W);
    }
    return FS_OK;
}

/* Tokens [s0, s0+n) of x [B,S,W...] into a new [B,n,W...] tensor. */
static int slice_seq(ctx *c, const fs_tensor *x, int64_t s0, int64_t n, fs_tensor *y)
{
    int64_t B = x->shape[0], S = x->shape[1], W = fs_tensor_numel(x) / (B * S);
    int64_t shape[FS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[1] = n;
    int rc = fs_tensor_alloc(y, c->dt, x->ndim, shape, c->e);
    if (rc) return rc;
    size_t es = fs_dtype_size(c->dt);
    for (int64_t i = 0; i < B; i++)
        c->be->copy2d(c->dt, (char *)y->data + (size_t)(i * n * W) * es, W,
                      (const char *)x->data + (size_t)((i * S + s0) * W) * es, W, n, W);
    return FS_OK;
}

/* torch.chunk(e, n, dim=1) of e [B, n·D] into n contiguous [B, D] tensors. */
static int chunk(ctx *c, const fs_tensor *e, int n, fs_tensor *out)
{
    int64_t B = e->shape[0], W = e->shape[1] / n;
    size_t es = fs_dtype_size(c->dt);
    for (int k = 0; k < n; k++) {
        int rc = fs_tensor_alloc2(&out[k], c->dt, B, W, c->e);
        if (rc) return rc;
        c->be->copy2d(c->dt, out[k].data, W, (const char *)e->data + (size_t)(k * W) * es, e->shape[1], B, W);
    }
    return FS_OK;
}

static void free_all(fs_tensor *t, int n)
{
    for (int i = 0; i < n; i++) fs_tensor_free(&t[i]);
}

/* ---------------------------------------------------------------- embedders */

/* expf as PyTorch's CPU kernels compute it: SLEEF's Sleef_expf8_u10 (vectorised, ≤ 1 ulp, FMA).
 * Why not libm's correctly rounded expf: the sinusoid's arguments reach t·freq ≈ 3500, where one
 * ulp of freq moves the argument by 2.4e-4, so an exp that differs by an ulp from PyTorch's
 * shows up as ~1e-5 relative error in time_proj and, through temb, in every block. With this
 * algorithm our fp32 time_proj matches diffusers' fp32 reference dump to ~2e-8 instead of 1.6e-5
 * (measured on ../shared/reference/tiny; see docs/conformance.md). Constants from SLEEF's
 * xexpf (sleefsimdsp.c): ln2 split in L2U + L2L, degree-6 polynomial. */
static float expf_sleef_u10(float d)
{
    float q = rintf(d * 1.442695040888963407359924681001892137426645954152985934135449406931f);
    float s = fmaf(q, -0.693145751953125f, d);
    s = fmaf(q, -1.428606765330187045e-06f, s);
    float u = 0.000198527617612853646278381f;
    u = fmaf(u, s, 0.00139304355252534151077271f);
    u = fmaf(u, s, 0.00833336077630519866943359f);
    u = fmaf(u, s, 0.0416664853692054748535156f);
    u = fmaf(u, s, 0.166666671633720397949219f);
    u = fmaf(u, s, 0.5f);
    u = 1.0f + fmaf(s * s, u, s);
    if (d < -104.0f) return 0.0f; /* SLEEF's underflow / overflow clamps */
    if (d > 104.0f) return INFINITY;
    return ldexpf(u, (int)q);
}

int fs_time_proj(fs_dtype dt, const double *t, int B, fs_tensor *out, fs_err *e)
{
    enum { HALF = 128 };
    int rc = fs_tensor_alloc2(out, dt, B, 2 * HALF, e);
    if (rc) return rc;
    for (int b = 0; b < B; b++) {
        for (int j = 0; j < HALF; j++) {
            double cv, sv;
            if (dt == FS_F32) {
                /* diffusers get_timestep_embedding, in float32 step by step:
                 * exponent = -log(10000) * arange(half, f32); exponent / (half - 0); exp(); t * emb */
                float expo = (float)(-log(10000.0)) * (float)j;
                expo = expo / (float)HALF;
                float freq = expf_sleef_u10(expo);
                float arg = (float)t[b] * freq;
                cv = cosf(arg);
                sv = sinf(arg);
            } else {
                double arg = t[b] * exp(-log(10000.0) * j / HALF);
                cv = cos(arg);
                sv = sin(arg);
            }
            /* flip_sin_to_cos: [cos | sin] (gotcha 2) */
            fs_tensor_set(out, (int64_t)b * 2 * HALF + j, cv);
            fs_tensor_set(out, (int64_t)b * 2 * HALF + HALF + j, sv);
        }
    }
    return FS_OK;
}

int fs_pos_embed(fs_dtype dt, const fs_config *cf, const fs_tensor *ids, fs_tensor *cos_t, fs_tensor *sin_t, fs_err *e)
{
    const int64_t S = ids->shape[0], Dh = cf->attention_head_dim;
    int rc = fs_tensor_alloc2(cos_t, dt, S, Dh, e);
    if (!rc) rc = fs_tensor_alloc2(sin_t, dt, S, Dh, e);
    if (rc) {
        fs_tensor_free(cos_t);
        return rc;
    }
    for (int64_t s = 0; s < S; s++) {
        int64_t col = 0;
        for (int ax = 0; ax < FS_MAX_AXES; ax++) {
            int d = cf->axes_dims_rope[ax];
            /* pos = ids.float(): positions are small integers, exact in float32 */
            double pos = (double)(float)fs_tensor_get(ids, s * 3 + ax);
            for (int j = 0; j < d / 2; j++) {
                double omega = 1.0 / pow(10000.0, (double)(2 * j) / (double)d);
                double ang = pos * omega;
                double cv = cos(ang), sv = sin(ang);
                /* repeat_interleave(2): adjacent pairs share an angle (gotcha 6) */
                for (int r = 0; r < 2; r++) {
                    fs_tensor_set(cos_t, s * Dh + col + 2 * j + r, cv);
                    fs_tensor_set(sin_t, s * Dh + col + 2 * j + r, sv);
                }
            }
            col += d;
        }
    }
    return FS_OK;
}

/* TimestepEmbedding / PixArtAlphaTextProjection: linear_1 → SiLU → linear_2. `act` is the
 * activation's module name ("act" in TimestepEmbedding, "act_1" in the text projection). */
static int mlp_embedder(ctx *c, const fs_tensor *x, const char *name, const char *act, fs_tensor *y)
{
    fs_tensor h[2] = {0};
    char n[160];
    int rc;
    TRY(linear(c, x, fmt_name(n, sizeof n, "%s.linear_1", name), &h[0]));
    TRY(activation(c, c->be->silu, &h[0], &h[1], "%s.%s", name, act));
    TRY(linear(c, &h[1], fmt_name(n, sizeof n, "%s.linear_2", name), y));
    TRY(REC(y, "%s", name));
out:
    free_all(h, 2);
    return rc;
}

/* time_text_embed: CombinedTimestep(Guidance)TextProjEmbeddings. temb = (time + guidance) + pooled. */
static int time_text_embed(ctx *c, const double *timestep, const double *guidance, const fs_tensor *pooled,
                           fs_tensor *temb)
{
    const int B = c->B;
    double t[64], g[64];
    fs_tensor tp = {0}, te = {0}, gp = {0}, ge = {0}, pe = {0}, sum = {0};
    int rc = FS_OK;
    if (B > 64) return fs_errf(c->e, FS_E_INPUT, "batch %d > 64 not supported", B);
    /* gotcha 1: the transformer multiplies timestep AND guidance by 1000, in the model dtype */
    for (int b = 0; b < B; b++) {
        t[b] = c->dt == FS_F32 ? (double)((float)timestep[b] * 1000.0f) : timestep[b] * 1000.0;
        if (guidance) g[b] = c->dt == FS_F32 ? (double)((float)guidance[b] * 1000.0f) : guidance[b] * 1000.0;
    }
    TRY(fs_time_proj(c->dt, t, B, &tp, c->e));
    TRY(REC(&tp, "time_text_embed.time_proj"));
    TRY(mlp_embedder(c, &tp, "time_text_embed.timestep_embedder", "act", &te));
    if (guidance) {
        /* gotcha 3: the same time_proj module fires a second time */
        TRY(fs_time_proj(c->dt, g, B, &gp, c->e));
        TRY(REC(&gp, "time_text_embed.time_proj@1"));
        TRY(mlp_embedder(c, &gp, "time_text_embed.guidance_embedder", "act", &ge));
        TRY(fs_tensor_alloc2(&sum, c->dt, B, c->D, c->e));
        c->be->add(&sum, &te, &ge);
        fs_tensor_free(&te);
        te = sum;
        sum = (fs_tensor){0};
    }
    TRY(mlp_embedder(c, pooled, "time_text_embed.text_embedder", "act_1", &pe));
    TRY(fs_tensor_alloc2(temb, c->dt, B, c->D, c->e));
    c->be->add(temb, &te, &pe);
    TRY(REC(temb, "time_text_embed"));
out:
    fs_tensor_free(&tp);
    fs_tensor_free(&te);
    fs_tensor_free(&gp);
    fs_tensor_free(&ge);
    fs_tensor_free(&pe);
    fs_tensor_free(&sum);
    return rc;
}

/* ---------------------------------------------------------------- normalisation */

/* AdaLayerNormZero (n=6) / AdaLayerNormZeroSingle (n=3): SiLU(temb) → linear → chunk(n) =
 * (shift, scale, gate[, shift_mlp, scale_mlp, gate_mlp]) (gotcha 8); returns LN(x)·(1+scale)+shift
 * in *xm and the chunks in mod[]. Records .silu, .linear, .norm, then the tuple #0..#(n-2):
 * #0 = modulated x, #k = chunk k+1 (shift and scale of the attention are not returned). */
static int ada_layer_norm_zero(ctx *c, const char *name, const fs_tensor *x, const fs_tensor *temb, int n,
                               fs_tensor *xm, fs_tensor *mod)
{
    fs_tensor s = {0}, lin = {0}, ln = {0};
    char nm[160];
    int rc;
    /* gotcha 10: each AdaLN applies SiLU to temb itself */
    TRY(activation(c, c->be->silu, temb, &s, "%s.silu", name));
    TRY(linear(c, &s, fmt_name(nm, sizeof nm, "%s.linear", name), &lin));
    TRY(chunk(c, &lin, n, mod));
    TRY(layernorm(c, x, &ln));
    TRY(REC(&ln, "%s.norm", name));
    TRY(fs_tensor_alloc(xm, c->dt, x->ndim, x->shape, c->e));
    c->be->modulate(xm, &ln, &mod[1], &mod[0]); /* gotcha 9: LN(x)·(1 + scale) + shift */
    TRY(REC(xm, "%s#0", name));
    for (int k = 1; k < n - 1; k++) TRY(REC(&mod[k + 1], "%s#%d", name, k));
out:
    fs_tensor_free(&s);
    fs_tensor_free(&lin);
    fs_tensor_free(&ln);
    return rc;
}

/* RMSNorm over head_dim of a [B,S,D] projection, recorded as [B,S,H,Dh] (gotcha 7). */
static int qk_norm(ctx *c, const fs_tensor *x, const char *name, fs_tensor *y)
{
    char wn[192];
    const fs_tensor *w = fs_weights_get(c->m->w, fmt_name(wn, sizeof wn, "%s.weight", name));
    if (!w) return fs_errf(c->e, FS_E_INTERNAL, "weights have no %s", wn);
    int64_t shape[4] = {x->shape[0], x->shape[1], c->H, c->Dh};
    int rc = fs_tensor_alloc(y, c->dt, 4, shape, c->e);
    if (rc) return rc;
    c->be->rmsnorm(y, x, w, RMS_EPS);
    return REC(y, "%s", name);
}

/* FeedForward(D, D, "gelu-approximate"): net.0 = GELU(proj) (net.0.proj, net.0), net.1 Dropout(0),
 * net.2 Linear. Records all five hooks; *y is net.2's output (= the module's). */
static int feed_forward(ctx *c, const fs_tensor *x, const char *name, fs_tensor *y)
{
    fs_tensor h[2] = {0};
    char nm[160];
    int rc;
    TRY(linear(c, x, fmt_name(nm, sizeof nm, "%s.net.0.proj", name), &h[0]));
    TRY(activation(c, c->be->gelu_tanh, &h[0], &h[1], "%s.net.0", name)); /* gotcha 14 */
    TRY(REC(&h[1], "%s.net.1", name));
    TRY(linear(c, &h[1], fmt_name(nm, sizeof nm, "%s.net.2", name), y));
    TRY(REC(y, "%s", name));
out:
    free_all(h, 2);
    return rc;
}

/* SDPA over the joint sequence: q, k, v [B,S,D] viewed as [B,S,H,Dh] (head-major columns). */
static int sdpa(ctx *c, const fs_tensor *q, const fs_tensor *k, const fs_tensor *v, fs_tensor *o)
{
    int64_t B = q->shape[0], S = q->shape[1];
    int64_t s4[4] = {B, S, c->H, c->Dh};
    int rc = alloc3(c, o, B, S, c->D);
    if (rc) return rc;
    fs_tensor q4 = fs_tensor_reshape(q, 4, s4), k4 = fs_tensor_reshape(k, 4, s4), v4 = fs_tensor_reshape(v, 4, s4);
    fs_tensor o4 = fs_tensor_reshape(o, 4, s4);
    return c->be->attention(&o4, NULL, FS_LSE_BHS, &q4, &k4, &v4, 1.0 / sqrt((double)c->Dh), c->e);
}

static void rope_inplace(ctx *c, fs_tensor *x, const fs_tensor *cos_t, const fs_tensor *sin_t)
{
    int64_t s4[4] = {x->shape[0], x->shape[1], c->H, c->Dh};
    fs_tensor x4 = fs_tensor_reshape(x, 4, s4);
    c->be->rope(&x4, cos_t, sin_t);
}

/* ---------------------------------------------------------------- blocks */

/* transformer_blocks.i — FluxTransformerBlock (double stream). x [B,S_img,D] and ctx_h
 * [B,S_txt,D] are updated in place. */
static int double_block(ctx *c, int i, fs_tensor *x, fs_tensor *cx, const fs_tensor *temb, const fs_tensor *cos_t,
                        const fs_tensor *sin_t)
{
    enum { XM, CM, Q, K, V, CQ, CK, CV, NQ, NK, NCQ, NCK, JQ, JK, JV, O, OX, OC, AX, AC, LN2, M2, FF, LN2C, M2C, FFC, NT };
    fs_tensor t[NT] = {0}, mod[6] = {0}, cmod[6] = {0};
    char p[64], nm[160];
    int rc;
    snprintf(p, sizeof p, "transformer_blocks.%d", i);
#define N(suffix) fmt_name(nm, sizeof nm, "%s." suffix, p)

    TRY(ada_layer_norm_zero(c, N("norm1"), x, temb, 6, &t[XM], mod));
    TRY(ada_layer_norm_zero(c, N("norm1_context"), cx, temb, 6, &t[CM], cmod));

    /* attn = FluxAttention with added (text) projections */
    TRY(linear(c, &t[XM], N("attn.to_q"), &t[Q]));
    TRY(linear(c, &t[XM], N("attn.to_k"), &t[K]));
    TRY(linear(c, &t[XM], N("attn.to_v"), &t[V]));
    TRY(linear(c, &t[CM], N("attn.add_q_proj"), &t[CQ]));
    TRY(linear(c, &t[CM], N("attn.add_k_proj"), &t[CK]));
    TRY(linear(c, &t[CM], N("attn.add_v_proj"), &t[CV]));
    TRY(qk_norm(c, &t[Q], N("attn.norm_q"), &t[NQ]));
    TRY(qk_norm(c, &t[K], N("attn.norm_k"), &t[NK]));
    TRY(qk_norm(c, &t[CQ], N("attn.norm_added_q"), &t[NCQ]));
    TRY(qk_norm(c, &t[CK], N("attn.norm_added_k"), &t[NCK]));
    /* gotcha 4: joint sequence is text first; RoPE after the QK norm, on q and k only (gotcha 6) */
    TRY(cat_seq(c, &t[NCQ], &t[NQ], &t[JQ]));
    TRY(cat_seq(c, &t[NCK], &t[NK], &t[JK]));
    TRY(cat_seq(c, &t[CV], &t[V], &t[JV]));
    rope_inplace(c, &t[JQ], cos_t, sin_t);
    rope_inplace(c, &t[JK], cos_t, sin_t);
    TRY(sdpa(c, &t[JQ], &t[JK], &t[JV], &t[O]));
    TRY(slice_seq(c, &t[O], 0, c->S_txt, &t[OC]));
    TRY(slice_seq(c, &t[O], c->S_txt, c->S_img, &t[OX]));
    TRY(linear(c, &t[OX], N("attn.to_out.0"), &t[AX]));
    TRY(REC(&t[AX], "%s.attn.to_out.1", p)); /* Dropout(p=0): identity */
    TRY(linear(c, &t[OC], N("attn.to_add_out"), &t[AC]));
    TRY(REC(&t[AX], "%s.attn#0", p)); /* gotcha 5: attn returns (image, text) */
    TRY(REC(&t[AC], "%s.attn#1", p));

    /* image stream: gated attention residual, then the MLP reads the updated x (gotcha 12) */
    c->be->gated_add(x, &mod[2], &t[AX]);
    TRY(layernorm(c, x, &t[LN2]));
    TRY(REC(&t[LN2], "%s.norm2", p));
    TRY(fs_tensor_alloc(&t[M2], c->dt, x->ndim, x->shape, c->e));
    c->be->modulate(&t[M2], &t[LN2], &mod[4], &mod[3]);
    TRY(feed_forward(c, &t[M2], N("ff"), &t[FF]));
    c->be->gated_add(x, &mod[5], &t[FF]);

    /* text stream, same with the context weights */
    c->be->gated_add(cx, &cmod[2], &t[AC]);
    TRY(layernorm(c, cx, &t[LN2C]));
    TRY(REC(&t[LN2C], "%s.norm2_context", p));
    TRY(fs_tensor_alloc(&t[M2C], c->dt, cx->ndim, cx->shape, c->e));
    c->be->modulate(&t[M2C], &t[LN2C], &cmod[4], &cmod[3]);
    TRY(feed_forward(c, &t[M2C], N("ff_context"), &t[FFC]));
    c->be->gated_add(cx, &cmod[5], &t[FFC]);

    TRY(REC(cx, "%s#0", p)); /* gotcha 5: the block returns (text, image) */
    TRY(REC(x, "%s#1", p));
#undef N
out:
    free_all(t, NT);
    free_all(mod, 6);
    free_all(cmod, 6);
    return rc;
}

/* single_transformer_blocks.i — FluxSingleTransformerBlock on the joint h [B,S,D] (text first),
 * updated in place. */
static int single_block(ctx *c, int i, fs_tensor *h, const fs_tensor *temb, const fs_tensor *cos_t,
                        const fs_tensor *sin_t)
{
    enum { HM, MLP, ACT, Q, K, V, NQ, NK, A, CAT, PO, HT, HX, NT };
    fs_tensor t[NT] = {0}, mod[3] = {0};
    char p[64], nm[160];
    int rc;
    const int64_t B = h->shape[0], S = h->shape[1], D = c->D, F = 4 * (int64_t)c->D;
    snprintf(p, sizeof p, "single_transformer_blocks.%d", i);
#define N(suffix) fmt_name(nm, sizeof nm, "%s." suffix, p)

    TRY(ada_layer_norm_zero(c, N("norm"), h, temb, 3, &t[HM], mod));
    TRY(linear(c, &t[HM], N("proj_mlp"), &t[MLP]));
    TRY(activation(c, c->be->gelu_tanh, &t[MLP], &t[ACT], "%s.act_mlp", p));
    TRY(linear(c, &t[HM], N("attn.to_q"), &t[Q]));
    TRY(linear(c, &t[HM], N("attn.to_k"), &t[K]));
    TRY(linear(c, &t[HM], N("attn.to_v"), &t[V]));
    TRY(qk_norm(c, &t[Q], N("attn.norm_q"), &t[NQ]));
    TRY(qk_norm(c, &t[K], N("attn.norm_k"), &t[NK]));
    rope_inplace(c, &t[NQ], cos_t, sin_t);
    rope_inplace(c, &t[NK], cos_t, sin_t);
    TRY(sdpa(c, &t[NQ], &t[NK], &t[V], &t[A]));
    TRY(REC(&t[A], "%s.attn", p)); /* no output projection in single blocks (gotcha 11) */

    /* proj_out on cat([attn, mlp], dim=2): attention columns first */
    TRY(alloc3(c, &t[CAT], B, S, D + F));
    c->be->copy2d(c->dt, t[CAT].data, D + F, t[A].data, D, B * S, D);
    c->be->copy2d(c->dt, (char *)t[CAT].data + (size_t)D * fs_dtype_size(c->dt), D + F, t[ACT].data, F, B * S, F);
    TRY(linear(c, &t[CAT], N("proj_out"), &t[PO]));
    c->be->gated_add(h, &mod[2], &t[PO]);

    if (c->m->rec.fn) { /* the block returns (text, image) slices of h */
        TRY(slice_seq(c, h, 0, c->S_txt, &t[HT]));
        TRY(slice_seq(c, h, c->S_txt, c->S_img, &t[HX]));
        TRY(REC(&t[HT], "%s#0", p));
        TRY(REC(&t[HX], "%s#1", p));
    }
#undef N
out:
    free_all(t, NT);
    free_all(mod, 3);
    return rc;
}

/* norm_out = AdaLayerNormContinuous: SiLU → linear → chunk(2) = (scale, shift) — scale FIRST
 * (gotcha 8) — then LN(x)·(1 + scale) + shift; x is image tokens only (gotcha 13). */
static int norm_out(ctx *c, const fs_tensor *x, const fs_tensor *temb, fs_tensor *y)
{
    fs_tensor s = {0}, lin = {0}, ln = {0}, mod[2] = {0};
    int rc;
    TRY(activation(c, c->be->silu, temb, &s, "norm_out.silu"));
    TRY(linear(c, &s, "norm_out.linear", &lin));
    TRY(chunk(c, &lin, 2, mod));
    TRY(layernorm(c, x, &ln));
    TRY(REC(&ln, "norm_out.norm"));
    TRY(fs_tensor_alloc(y, c->dt, x->ndim, x->shape, c->e));
    c->be->modulate(y, &ln, &mod[0], &mod[1]);
    TRY(REC(y, "norm_out"));
out:
    fs_tensor_free(&s);
    fs_tensor_free(&lin);
    fs_tensor_free(&ln);
    free_all(mod, 2);
    return rc;
}

/* ---------------------------------------------------------------- forward */

int fs_model_forward(const fs_model *m, const fs_tensor *hidden_states, const fs_tensor *encoder_hidden_states,
                     const fs_tensor *pooled, const double *timestep, const double *guidance,
                     const fs_tensor *img_ids, const fs_tensor *txt_ids, fs_tensor *out, fs_err *e)
{
    const fs_config *cf = &m->cfg;
    ctx cc = {.m = m, .be = m->be, .dt = m->dtype, .e = e}, *c = &cc;
    c->B = (int)hidden_states->shape[0];
    c->S_img = (int)hidden_states->shape[1];
    c->S_txt = (int)encoder_hidden_states->shape[1];
    c->S = c->S_img + c->S_txt;
    c->D = fs_config_hidden(cf);
    c->H = cf->num_attention_heads;
    c->Dh = cf->attention_head_dim;
    if (cf->guidance_embeds && !guidance)
        return fs_errf(e, FS_E_INPUT, "config has guidance_embeds=true but no guidance value was given");

    enum { X, TEMB, CX, IDS, COS, SIN, H, Y, NT };
    fs_tensor t[NT] = {0};
    int rc;
    memset(out, 0, sizeof *out);

    TRY(linear(c, hidden_states, "x_embedder", &t[X]));
    TRY(time_text_embed(c, timestep, cf->guidance_embeds ? guidance : NULL, pooled, &t[TEMB]));
    TRY(linear(c, encoder_hidden_states, "context_embedder", &t[CX]));

    /* ids = cat(txt_ids, img_ids): text first (gotcha 4); tables are [S, Dh], no batch */
    TRY(fs_tensor_alloc2(&t[IDS], FS_F64, c->S, 3, e));
    memcpy(t[IDS].data, txt_ids->data, (size_t)c->S_txt * 3 * sizeof(double));
    memcpy((double *)t[IDS].data + (size_t)c->S_txt * 3, img_ids->data, (size_t)c->S_img * 3 * sizeof(double));
    TRY(fs_pos_embed(c->dt, cf, &t[IDS], &t[COS], &t[SIN], e));
    TRY(REC(&t[COS], "pos_embed#0"));
    TRY(REC(&t[SIN], "pos_embed#1"));

    for (int i = 0; i < cf->num_layers; i++) TRY(double_block(c, i, &t[X], &t[CX], &t[TEMB], &t[COS], &t[SIN]));

    TRY(cat_seq(c, &t[CX], &t[X], &t[H]));
    for (int i = 0; i < cf->num_single_layers; i++) TRY(single_block(c, i, &t[H], &t[TEMB], &t[COS], &t[SIN]));
    fs_tensor_free(&t[X]);
    TRY(slice_seq(c, &t[H], c->S_txt, c->S_img, &t[X]));

    TRY(norm_out(c, &t[X], &t[TEMB], &t[Y]));
    TRY(linear(c, &t[Y], "proj_out", out));
out:
    free_all(t, NT);
    if (rc) fs_tensor_free(out);
    return rc;
}
