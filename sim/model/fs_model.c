/* fs_model.c — FLUX.1 forward, module by module, as diffusers computes it.
 *
 * Read top-down: fs_model_forward at the bottom calls the embedders, the double blocks
 * (transformer_blocks.i), the single blocks (single_transformer_blocks.i) and the output head.
 * Every function records what the matching diffusers module's forward hook would see, under the
 * module's path, in hook firing order (children before parents). Gotchas of ../shared/flux-spec.md
 * §9 are marked "gotcha N" where they bite.
 *
 * Memory: every activation lives in the backend's memory (m->be) and is touched only by backend
 * ops — no element loop, copy or pointer dereference here — so a GPU backend runs this file
 * unchanged. The only host-side arithmetic is on the step's scalars and ids: the timestep and
 * guidance sinusoids and the RoPE tables are computed on the host (fs_time_proj, fs_pos_embed)
 * and uploaded, as inputs are. */
#include "fs_model.h"

#include "fs_debug.h"
#include "fs_seqpar.h"

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
    const fs_par *par; /* NULL: one rank holds everything */
    fs_backend *be;
    fs_dtype dt;
    int B, S_img, S_txt, S, D, H, Dh; /* S_* are this rank's LOCAL token counts */
    int tp, tp_rank;
    fs_weights blk; /* streaming: the current block's parameters, in be's memory */
    char blk_prefix[64];
    fs_err *e;
} ctx;

/* Parameter `name` as the backend computes with it: the streamed block's, or a resident one. */
static const fs_tensor *weight(const ctx *c, const char *name)
{
    if (c->blk.n) {
        int i = fs_param_find(c->blk.desc, c->blk.n, name);
        if (i >= 0 && c->blk.t[i].ndim) return &c->blk.t[i];
    }
    return fs_weights_get(c->m->w, name);
}

/* Streaming (m->stream): make the block's parameters for this rank's shard and place them in
 * the backend's memory; nothing otherwise. block_leave drops them. */
static int block_enter(ctx *c, const char *prefix)
{
    if (!c->m->stream) return FS_OK;
    snprintf(c->blk_prefix, sizeof c->blk_prefix, "%s", prefix);
    int rc = fs_weights_acquire(c->m->stream, prefix, c->e);
    if (!rc) rc = fs_weights_on_prefix(c->m->stream, c->be, prefix, &c->blk, c->e);
    if (rc) fs_err_prefix(c->e, "weights of %s: ", prefix);
    return rc;
}

static void block_leave(ctx *c)
{
    if (!c->m->stream) return;
    fs_weights_free(&c->blk);
    fs_weights_release(c->m->stream, c->blk_prefix);
}

/* Token sharding of a recorded tensor: which stream its token axis belongs to. */
enum { ST_REP = 0, ST_IMG, ST_TXT, ST_JOINT };

/* How a recorded tensor's feature axis is split over the TP group: the split of the Linear that
 * produced it (NULL: every TP rank holds all features). `unit` converts features to the axis'
 * units (head_dim for a [B,S,H,Dh] axis of heads). */
typedef struct tp_axis {
    const fs_tp_split *sp;
    int axis; /* -1: last */
    int64_t unit;
} tp_axis;
static const tp_axis REPL = {NULL, -1, 1};

/* The fs_shard of a local tensor: tokens of `stream` on axis tokdim (sequence parallelism), and
 * the feature axis as the producing Linear's TP split says (fs_tp_split_of, the one owner). */
static void make_shard(const ctx *c, const fs_tensor *t, int stream, int tokdim, tp_axis f, fs_shard *sh)
{
    memset(sh, 0, sizeof *sh);
    const fs_par *p = c->par;
    if (!p) return;
    if (p->sp > 1 && stream != ST_REP) {
        fs_shard_dim *d = &sh->d[sh->ndims++];
        const int q = p->sp_rank;
        d->dim = tokdim;
        if (stream == ST_TXT || stream == ST_JOINT) {
            d->iv[d->n][0] = p->txt_lo[q];
            d->iv[d->n++][1] = p->txt_hi[q];
        }
        if (stream == ST_IMG || stream == ST_JOINT) {
            int64_t off = stream == ST_JOINT ? p->S_txt : 0;
            d->iv[d->n][0] = off + p->img_lo[q];
            d->iv[d->n++][1] = off + p->img_hi[q];
        }
    }
    if (f.sp && f.sp->r1 - f.sp->r0 < f.sp->N) { /* the rows this rank computed = its features */
        fs_shard_dim *d = &sh->d[sh->ndims++];
        d->dim = f.axis < 0 ? t->ndim - 1 : f.axis;
        d->n = 1;
        d->iv[0][0] = f.sp->r0 / f.unit;
        d->iv[0][1] = f.sp->r1 / f.unit;
    }
}

static const char *fmt_name(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static const char *fmt_name(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return buf;
}

/* The faults --inject plants at a module's output, on one rank and step:
 *  fail-rank: this rank runs out of memory here, mid-run, while the others go on into the next
 *             collective (the job must end naming it, not hang);
 *  nan-rank:  one NaN in the module's output (the model's own buffer, written through the
 *             backend, so it travels on). */
static int inject_faults(ctx *c, const fs_tensor *t, const char *name)
{
    const fs_inject *inj = c->par ? c->par->inject : NULL;
    const int rank = c->par ? c->par->rank : 0;
    if (fs_injected(inj, FS_INJ_FAIL_RANK) && fs_inject_strikes(&inj->fail, rank, name, c->m->step))
        return fs_errf(c->e, FS_E_NOMEM, "%s: out of memory (injected: --inject fail-rank:%d:%s:%d)", name, rank, name,
                       c->m->step);
    if (fs_injected(inj, FS_INJ_NAN_RANK) && fs_inject_strikes(&inj->nan, rank, name, c->m->step) &&
        fs_tensor_numel(t) > 0) {
        fs_tensor one = {0};
        int rc = fs_tensor_alloc(&one, t->dtype, 1, (int64_t[]){1}, c->e);
        if (rc) return rc;
        fs_tensor_set(&one, 0, NAN);
        fs_tensor dst = fs_tensor_reshape(t, 1, (int64_t[]){1});
        rc = fs_tensor_upload(&dst, &one, c->e);
        fs_tensor_free(&one);
        if (rc) return rc;
        fs_inject_nan_fired = 1;
    }
    return FS_OK;
}

/* Record `t` as module `name` (printf-style), with its sharding (see make_shard). */
static int rec_sharded(ctx *c, const fs_tensor *t, int stream, int tokdim, tp_axis f, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int rec_sharded(ctx *c, const fs_tensor *t, int stream, int tokdim, tp_axis f, const char *fmt, ...)
{
    const fs_inject *inj = c->par ? c->par->inject : NULL;
    if (!c->m->rec.fn && !inj) return FS_OK; /* one branch per module when nothing listens */
    char name[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    snprintf(fs_debug_module, sizeof fs_debug_module, "%s", name); /* for gdb: fs-where */
    fs_debug_step = c->m->step;
    int rc = inject_faults(c, t, name); /* --inject fail-rank / nan-rank */
    if (rc) return rc;
    if (!c->m->rec.fn) return FS_OK;
    fs_shard sh;
    make_shard(c, t, stream, tokdim, f, &sh);
    rc = c->m->rec.fn(c->m->rec.ctx, name, t, &sh, c->e);
    if (rc) fs_err_prefix(c->e, "recording %s: ", name);
    return rc;
}
/* REC(t, stream, tp_axis of its features, name...) */
#define REC(t, stream, f, ...) rec_sharded(c, (t), (stream), 1, (f), __VA_ARGS__)
/* the tp_axis of a Linear's output features */
static tp_axis feat(const fs_tp_split *sp) { return (tp_axis){sp, -1, 1}; }

/* A zero-filled activation in the backend's memory. */
static int new_tensor(ctx *c, fs_tensor *t, int ndim, const int64_t *shape)
{
    return fs_tensor_alloc_on(t, c->be, c->dt, ndim, shape, c->e);
}
static int new3(ctx *c, fs_tensor *t, int64_t d0, int64_t d1, int64_t d2)
{
    return new_tensor(c, t, 3, (int64_t[]){d0, d1, d2});
}
static int new_like(ctx *c, fs_tensor *t, const fs_tensor *x) { return new_tensor(c, t, x->ndim, x->shape); }
/* An op's output that the op writes in full (a GEMM with beta = 0, an element-wise op, copies
 * that tile it): not zero-filled first, which at FLUX width was a memset of every activation. */
static int new_out(ctx *c, fs_tensor *t, int ndim, const int64_t *shape)
{
    return fs_tensor_alloc_on_uninit(t, c->be, c->dt, ndim, shape, c->e);
}
static int out_like(ctx *c, fs_tensor *t, const fs_tensor *x) { return new_out(c, t, x->ndim, x->shape); }

/* A host tensor computed here (sinusoids, RoPE tables), placed in backend memory. */
static int upload_new(ctx *c, const fs_tensor *host, fs_tensor *dev)
{
    int rc = fs_tensor_alloc_on(dev, c->be, host->dtype, host->ndim, host->shape, c->e);
    if (!rc) rc = fs_tensor_upload(dev, host, c->e);
    if (rc) fs_tensor_free(dev);
    return rc;
}

static void free_all(fs_tensor *t, int n)
{
    for (int i = 0; i < n; i++) fs_tensor_free(&t[i]);
}

/* Byte-addressed 2-D copy inside backend memory: rows × width elements. */
static int copy2d(ctx *c, void *dst, int64_t ld_dst, const void *src, int64_t ld_src, int64_t rows, int64_t cols)
{
    const size_t es = fs_dtype_size(c->dt);
    return c->be->copy2d(c->be, dst, (size_t)ld_dst * es, src, (size_t)ld_src * es, (size_t)cols * es, (size_t)rows, c->e);
}

/* ---------------------------------------------------------------- Linear */

/* nn.Linear: y = x·Wᵀ + b over the last dim of x; y is allocated with x's leading dims and the
 * output width this rank computes, then recorded under `name` (tokens of `stream`). Under tensor
 * parallelism fs_tp_split_of says what this rank holds (the weights are already that shard,
 * fs_weights_shard): its output rows (colwise, the bias follows them), or its input columns
 * (rowwise, packed_rowwise: a partial sum, all-reduced over the TP group, then the whole bias
 * once). *used (may be NULL) receives the split, for the records downstream. */
static int linear(ctx *c, const fs_tensor *x, const char *name, int stream, fs_tensor *y, fs_tp_split *used)
{
    char wn[192], bn[192];
    const fs_tensor *W = weight(c, fmt_name(wn, sizeof wn, "%s.weight", name));
    const fs_tensor *b = weight(c, fmt_name(bn, sizeof bn, "%s.bias", name));
    if (!W || !b) return fs_errf(c->e, FS_E_INTERNAL, "weights have no %s", W ? bn : wn);
    const fs_plan *plan = c->par ? c->par->plan : NULL;
    const fs_inject *inj = c->par ? c->par->inject : NULL;
    const int64_t Kx = x->shape[x->ndim - 1], M = fs_tensor_numel(x) / (Kx ? Kx : 1);
    if (c->m->w->tp != c->tp || (c->tp > 1 && c->m->w->tp_rank != c->tp_rank))
        return fs_errf(c->e, FS_E_INTERNAL, "%s: weights are shard %d/%d but this rank is %d/%d", name,
                       c->m->w->tp_rank, c->m->w->tp, c->tp_rank, c->tp);
    /* the global [N, K] from the parameter list; W holds this rank's piece of it */
    const fs_param_desc *pd = &c->m->w->desc[fs_param_find(c->m->w->desc, c->m->w->n, wn)];
    fs_tp_split sp;
    fs_inject_linear wrong; /* what --inject changes beyond the split (all zero without it) */
    int rc = fs_tp_split_of_injected(plan, &c->m->cfg, name, pd->shape[0], pd->shape[1], c->tp, c->tp_rank, inj, &sp,
                                     &wrong, c->e);
    if (rc) return rc;
    const int64_t Ny = sp.r1 - sp.r0, Kl = fs_tp_split_cols(&sp);
    /* the input is this rank's Kl features — or, for an input that arrives whole (--inject
     * adaln-sharded), all K of them, of which the rank reads its columns */
    const int64_t kexp = wrong.input_whole ? sp.K : Kl;
    char s1[64], s2[64];
    if (Kx != kexp || W->shape[0] != Ny || W->shape[1] != Kl)
        return fs_errf(c->e, FS_E_INPUT, "%s (%s over %d ranks): input %s does not match weight %s (expects %lld local inputs)",
                       name, fs_tp_style_name(sp.style), c->tp, fs_tensor_shape_str(x, s1, sizeof s1),
                       fs_tensor_shape_str(W, s2, sizeof s2), (long long)kexp);
    int64_t shape[FS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = Ny;
    if ((rc = (Kl > 0 ? new_out : new_tensor)(c, y, x->ndim, shape))) return rc; /* K = 0: zeros, kept explicit */
    const void *A = wrong.input_whole ? (const char *)x->data + (size_t)sp.c[0][0] * fs_dtype_size(c->dt) : x->data;
    if (!sp.reduce) { /* replicate, colwise: one GEMM with the bias */
        TRY(c->be->gemm(c->be, c->dt, M, Ny, Kl, A, Kx, W->data, Kl, b->data, y->data, Ny, c->e));
    } else { /* rowwise, packed_rowwise: this rank's partial sum, all-reduced, then the bias once */
        TRY(c->be->gemm(c->be, c->dt, M, Ny, Kl, A, Kx, W->data, Kl, NULL, y->data, Ny, c->e));
        if (wrong.bias_before_reduce) TRY(c->be->add_bias(c->be, y, b, c->e)); /* --inject rowwise-bias-every-rank */
        TRY(fs_allreduce_sum_t(&c->par->g_tp, y, c->e));
        if (!wrong.bias_before_reduce) TRY(c->be->add_bias(c->be, y, b, c->e));
    }
    if (used) *used = sp;
    TRY(REC(y, stream, feat(&sp), "%s", name));
out:
    if (rc) fs_tensor_free(y);
    return rc;
}

/* Element-wise op into a new tensor, recorded under `name`. */
typedef int (*unary_op)(fs_backend *, fs_tensor *, const fs_tensor *, fs_err *);
static int activation(ctx *c, unary_op op, const fs_tensor *x, fs_tensor *y, int stream, tp_axis f, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static int activation(ctx *c, unary_op op, const fs_tensor *x, fs_tensor *y, int stream, tp_axis f, const char *fmt, ...)
{
    int rc = out_like(c, y, x);
    if (!rc) rc = op(c->be, y, x, c->e);
    if (rc) return rc;
    char name[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return REC(y, stream, f, "%s", name);
}

/* Plain LayerNorm (no affine, eps 1e-6) into a new tensor. */
static int layernorm(ctx *c, const fs_tensor *x, fs_tensor *y)
{
    int rc = out_like(c, y, x);
    return rc ? rc : c->be->layernorm(c->be, y, x, LN_EPS, c->e);
}

/* Concatenate a [B,Sa,W] and b [B,Sb,W] along the sequence (dim 1) into [B,Sa+Sb,W]: two 2-D
 * copies, one row per batch. */
static int cat_seq(ctx *c, const fs_tensor *a, const fs_tensor *b, fs_tensor *y)
{
    int64_t B = a->shape[0], Sa = a->shape[1], Sb = b->shape[1];
    int64_t Wa = Sa ? fs_tensor_numel(a) / (B * Sa) : -1, Wb = Sb ? fs_tensor_numel(b) / (B * Sb) : -1;
    int64_t W = Wa >= 0 ? Wa : Wb;
    /* text and image streams must agree on the features per token: a plan that splits one
     * stream's projection and not the other's would otherwise be read with the wrong stride */
    if (Wa >= 0 && Wb >= 0 && Wa != Wb)
        return fs_errf(c->e, FS_E_INPUT, "joint sequence: text has %lld features per token, image %lld (a TP plan that "
                                         "splits the text and image projections differently?)",
                       (long long)Wa, (long long)Wb);
    int64_t shape[FS_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    shape[1] = Sa + Sb;
    int rc = new_out(c, y, a->ndim, shape);
    if (rc) return rc;
    const size_t es = fs_dtype_size(c->dt);
    if (!rc) rc = copy2d(c, y->data, (Sa + Sb) * W, a->data, Sa * W, B, Sa * W);
    if (!rc) rc = copy2d(c, (char *)y->data + (size_t)(Sa * W) * es, (Sa + Sb) * W, b->data, Sb * W, B, Sb * W);
    if (rc) fs_tensor_free(y);
    return rc;
}

/* Tokens [s0, s0+n) of x [B,S,W...] into a new [B,n,W...] tensor. */
static int slice_seq(ctx *c, const fs_tensor *x, int64_t s0, int64_t n, fs_tensor *y)
{
    int64_t B = x->shape[0], S = x->shape[1], W = fs_tensor_numel(x) / (B * S);
    int64_t shape[FS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[1] = n;
    int rc = new_out(c, y, x->ndim, shape);
    if (!rc) rc = copy2d(c, y->data, n * W, (const char *)x->data + (size_t)(s0 * W) * fs_dtype_size(c->dt), S * W, B, n * W);
    if (rc) fs_tensor_free(y);
    return rc;
}

/* torch.chunk(e, n, dim=1) of e [B, n·D] into n contiguous [B, D] tensors. */
static int chunk(ctx *c, const fs_tensor *e, int n, fs_tensor *out)
{
    int64_t B = e->shape[0], W = e->shape[1] / n;
    for (int k = 0; k < n; k++) {
        int rc = new_out(c, &out[k], 2, (int64_t[]){B, W});
        if (!rc) rc = copy2d(c, out[k].data, W, (const char *)e->data + (size_t)(k * W) * fs_dtype_size(c->dt), e->shape[1], B, W);
        if (rc) return rc;
    }
    return FS_OK;
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
    TRY(linear(c, x, fmt_name(n, sizeof n, "%s.linear_1", name), ST_REP, &h[0], NULL));
    TRY(activation(c, c->be->silu, &h[0], &h[1], ST_REP, REPL, "%s.%s", name, act));
    TRY(linear(c, &h[1], fmt_name(n, sizeof n, "%s.linear_2", name), ST_REP, y, NULL));
    TRY(REC(y, ST_REP, REPL, "%s", name));
out:
    free_all(h, 2);
    return rc;
}

/* Where diffusers computes in float32 whatever the model dtype (the sinusoids, the RoPE tables):
 * float32 for bf16 runs, the run dtype otherwise (a float64 run promotes them, as the reference). */
static fs_dtype fixed_f32(fs_dtype dt) { return dt == FS_BF16 ? FS_F32 : dt; }

/* The sinusoid of B scalars (fs_time_proj, on the host), in backend memory, in fixed_f32. */
static int time_proj(ctx *c, const double *t, fs_tensor *out)
{
    fs_tensor host = {0};
    int rc = fs_time_proj(fixed_f32(c->dt), t, c->B, &host, c->e);
    if (!rc) rc = upload_new(c, &host, out);
    fs_tensor_free(&host);
    return rc;
}

/* timesteps_proj.to(dtype=pooled_projection.dtype): the float32 sinusoid rounded to bf16 before
 * the embedder (a no-op view in float32/float64 runs). *tmp owns the copy when one is made. */
static int to_run_dtype(ctx *c, const fs_tensor *x, fs_tensor *tmp, const fs_tensor **out)
{
    *out = x;
    if (x->dtype == c->dt) return FS_OK;
    int rc = new_like(c, tmp, x);
    if (!rc) rc = c->be->convert(c->be, tmp, x, c->e);
    *out = tmp;
    return rc;
}

/* The value the transformer embeds for a timestep or guidance x it is passed: `x.to(dtype)*1000`
 * in the model dtype (gotcha 1); bf16: fs_bf16_embedded. */
double fs_bf16_embedded(double x) { return fs_bf16_round(fs_bf16_round((float)x) * 1000.0f); }

static double embedded_scalar(const ctx *c, double x)
{
    if (c->dt == FS_BF16) return fs_bf16_embedded(x);
    /* --match bf16: x = e/1000 for a bf16 value e (fs_inputs_match_bf16); x·1000 is e exactly
     * in float64, and rounding it to bf16 gives e back in a float32 run too */
    if (c->m->match_bf16) return fs_bf16_round((float)(x * 1000.0));
    return c->dt == FS_F32 ? (double)((float)x * 1000.0f) : x * 1000.0;
}

/* time_text_embed: CombinedTimestep(Guidance)TextProjEmbeddings. temb = (time + guidance) + pooled. */
static int time_text_embed(ctx *c, const double *timestep, const double *guidance, const fs_tensor *pooled,
                           fs_tensor *temb)
{
    const int B = c->B;
    double t[64], g[64];
    fs_tensor tp = {0}, te = {0}, gp = {0}, ge = {0}, pe = {0}, sum = {0}, tc = {0}, gc = {0};
    int rc = FS_OK;
    if (B > 64) return fs_errf(c->e, FS_E_INPUT, "batch %d > 64 not supported", B);
    /* gotcha 1: the transformer multiplies timestep AND guidance by 1000, in the model dtype */
    for (int b = 0; b < B; b++) {
        t[b] = embedded_scalar(c, timestep[b]);
        if (guidance) g[b] = embedded_scalar(c, guidance[b]);
    }
    const fs_tensor *in;
    TRY(time_proj(c, t, &tp));
    TRY(REC(&tp, ST_REP, REPL, "time_text_embed.time_proj"));
    TRY(to_run_dtype(c, &tp, &tc, &in));
    TRY(mlp_embedder(c, in, "time_text_embed.timestep_embedder", "act", &te));
    if (guidance) {
        /* gotcha 3: the same time_proj module fires a second time */
        TRY(time_proj(c, g, &gp));
        TRY(REC(&gp, ST_REP, REPL, "time_text_embed.time_proj@1"));
        TRY(to_run_dtype(c, &gp, &gc, &in));
        TRY(mlp_embedder(c, in, "time_text_embed.guidance_embedder", "act", &ge));
        TRY(new_like(c, &sum, &te));
        TRY(c->be->add(c->be, &sum, &te, &ge, c->e));
        fs_tensor_free(&te);
        te = sum;
        sum = (fs_tensor){0};
    }
    TRY(mlp_embedder(c, pooled, "time_text_embed.text_embedder", "act_1", &pe));
    TRY(new_like(c, temb, &te));
    TRY(c->be->add(c->be, temb, &te, &pe, c->e));
    TRY(REC(temb, ST_REP, REPL, "time_text_embed"));
out:
    fs_tensor_free(&tp);
    fs_tensor_free(&te);
    fs_tensor_free(&gp);
    fs_tensor_free(&ge);
    fs_tensor_free(&pe);
    fs_tensor_free(&sum);
    fs_tensor_free(&tc);
    fs_tensor_free(&gc);
    return rc;
}

/* ---------------------------------------------------------------- normalisation */

/* AdaLayerNormZero (n=6) / AdaLayerNormZeroSingle (n=3): SiLU(temb) → linear → chunk(n) =
 * (shift, scale, gate[, shift_mlp, scale_mlp, gate_mlp]) (gotcha 8); returns LN(x)·(1+scale)+shift
 * in *xm and the chunks in mod[]. Records .silu, .linear, .norm, then the tuple #0..#(n-2):
 * #0 = modulated x, #k = chunk k+1 (shift and scale of the attention are not returned). */
static int ada_layer_norm_zero(ctx *c, const char *name, const fs_tensor *x, int stream, const fs_tensor *temb,
                               int n, fs_tensor *xm, fs_tensor *mod)
{
    fs_tensor s = {0}, lin = {0}, ln = {0};
    char nm[160];
    int rc;
    /* gotcha 10: each AdaLN applies SiLU to temb itself */
    TRY(activation(c, c->be->silu, temb, &s, ST_REP, REPL, "%s.silu", name));
    TRY(linear(c, &s, fmt_name(nm, sizeof nm, "%s.linear", name), ST_REP, &lin, NULL));
    TRY(chunk(c, &lin, n, mod));
    TRY(layernorm(c, x, &ln));
    TRY(REC(&ln, stream, REPL, "%s.norm", name));
    TRY(out_like(c, xm, x));
    TRY(c->be->modulate(c->be, xm, &ln, &mod[1], &mod[0], c->e)); /* gotcha 9: LN(x)·(1 + scale) + shift */
    TRY(REC(xm, stream, REPL, "%s#0", name));
    for (int k = 1; k < n - 1; k++) TRY(REC(&mod[k + 1], ST_REP, REPL, "%s#%d", name, k));
out:
    fs_tensor_free(&s);
    fs_tensor_free(&lin);
    fs_tensor_free(&ln);
    return rc;
}

/* RMSNorm over head_dim of a [B,S,D] projection (this rank's heads: the projection's split),
 * recorded as [B,S,H,Dh] (gotcha 7). */
static int qk_norm(ctx *c, const fs_tensor *x, const fs_tp_split *proj, const char *name, int stream, fs_tensor *y)
{
    char wn[192];
    const fs_tensor *w = weight(c, fmt_name(wn, sizeof wn, "%s.weight", name));
    if (!w) return fs_errf(c->e, FS_E_INTERNAL, "weights have no %s", wn);
    int64_t shape[4] = {x->shape[0], x->shape[1], x->shape[2] / c->Dh, c->Dh};
    int rc = new_out(c, y, 4, shape);
    if (!rc) rc = c->be->rmsnorm(c->be, y, x, w, RMS_EPS, c->e);
    if (rc) return rc;
    return rec_sharded(c, y, stream, 1, (tp_axis){proj, 2, c->Dh}, "%s", name);
}

/* FeedForward(D, D, "gelu-approximate"): net.0 = GELU(proj) (net.0.proj, net.0), net.1 Dropout(0),
 * net.2 Linear. Records all five hooks; *y is net.2's output (= the module's). */
static int feed_forward(ctx *c, const fs_tensor *x, const char *name, int stream, fs_tensor *y)
{
    fs_tensor h[2] = {0};
    fs_tp_split up;
    char nm[160];
    int rc;
    TRY(linear(c, x, fmt_name(nm, sizeof nm, "%s.net.0.proj", name), stream, &h[0], &up));
    TRY(activation(c, c->be->gelu_tanh, &h[0], &h[1], stream, feat(&up), "%s.net.0", name)); /* gotcha 14 */
    TRY(REC(&h[1], stream, feat(&up), "%s.net.1", name));
    TRY(linear(c, &h[1], fmt_name(nm, sizeof nm, "%s.net.2", name), stream, y, NULL));
    TRY(REC(y, stream, REPL, "%s", name));
out:
    free_all(h, 2);
    return rc;
}

/* SDPA over the joint sequence: q, k, v [B,S,D] viewed as [B,S,H,Dh] (head-major columns). */
static int sdpa(ctx *c, const fs_tensor *q, const fs_tensor *k, const fs_tensor *v, fs_tensor *o)
{
    /* q, k may be [B,S,Hl,Dh] (after the QK norm) and v [B,S,Hl·Dh]: compare features per token */
    const int64_t B = q->shape[0], S = q->shape[1], W = fs_tensor_numel(q) / (B * S), Hl = W / c->Dh;
    const int64_t Wk = fs_tensor_numel(k) / (B * S), Wv = fs_tensor_numel(v) / (B * S);
    if (Wk != W || Wv != W)
        return fs_errf(c->e, FS_E_INPUT, "attention: q, k, v have %lld, %lld, %lld local features per token (a plan "
                                         "that splits them differently?)",
                       (long long)W, (long long)Wk, (long long)Wv);
    int64_t s4[4] = {B, S, Hl, c->Dh};
    int rc = new3(c, o, B, S, W);
    if (rc) return rc;
    fs_tensor q4 = fs_tensor_reshape(q, 4, s4), k4 = fs_tensor_reshape(k, 4, s4), v4 = fs_tensor_reshape(v, 4, s4);
    fs_tensor o4 = fs_tensor_reshape(o, 4, s4);
    if (c->par && c->par->sp > 1) return fs_seqpar_attention(c->par, c->be, &o4, &q4, &k4, &v4, c->e);
    return c->be->attention(c->be, &o4, NULL, &q4, &k4, &v4, 1.0 / sqrt((double)c->Dh), c->e);
}

static int rope_inplace(ctx *c, fs_tensor *x, const fs_tensor *cos_t, const fs_tensor *sin_t)
{
    /* x is [B,S,Hl,Dh] (after the QK norm) or [B,S,Hl·Dh]: heads from the features per token */
    const int64_t B = x->shape[0], S = x->shape[1], W = fs_tensor_numel(x) / (B * S);
    int64_t s4[4] = {B, S, W / c->Dh, c->Dh};
    fs_tensor x4 = fs_tensor_reshape(x, 4, s4);
    return c->be->rope(c->be, &x4, cos_t, sin_t, c->e);
}

/* ---------------------------------------------------------------- blocks */

/* transformer_blocks.i — FluxTransformerBlock (double stream). x [B,S_img,D] and ctx_h
 * [B,S_txt,D] are updated in place. */
static int double_block(ctx *c, int i, fs_tensor *x, fs_tensor *cx, const fs_tensor *temb, const fs_tensor *cos_t,
                        const fs_tensor *sin_t)
{
    enum { XM, CM, Q, K, V, CQ, CK, CV, NQ, NK, NCQ, NCK, JQ, JK, JV, O, OX, OC, AX, AC, LN2, M2, FF, LN2C, M2C, FFC, NT };
    fs_tensor t[NT] = {0}, mod[6] = {0}, cmod[6] = {0};
    fs_tp_split sq, sk, scq, sck;
    char p[64], nm[160];
    int rc;
    fs_backend *be = c->be;
    snprintf(p, sizeof p, "transformer_blocks.%d", i);
#define N(suffix) fmt_name(nm, sizeof nm, "%s." suffix, p)

    TRY(block_enter(c, N("")));
    TRY(ada_layer_norm_zero(c, N("norm1"), x, ST_IMG, temb, 6, &t[XM], mod));
    TRY(ada_layer_norm_zero(c, N("norm1_context"), cx, ST_TXT, temb, 6, &t[CM], cmod));

    /* attn = FluxAttention with added (text) projections */
    TRY(linear(c, &t[XM], N("attn.to_q"), ST_IMG, &t[Q], &sq));
    TRY(linear(c, &t[XM], N("attn.to_k"), ST_IMG, &t[K], &sk));
    TRY(linear(c, &t[XM], N("attn.to_v"), ST_IMG, &t[V], NULL));
    TRY(linear(c, &t[CM], N("attn.add_q_proj"), ST_TXT, &t[CQ], &scq));
    TRY(linear(c, &t[CM], N("attn.add_k_proj"), ST_TXT, &t[CK], &sck));
    TRY(linear(c, &t[CM], N("attn.add_v_proj"), ST_TXT, &t[CV], NULL));
    TRY(qk_norm(c, &t[Q], &sq, N("attn.norm_q"), ST_IMG, &t[NQ]));
    TRY(qk_norm(c, &t[K], &sk, N("attn.norm_k"), ST_IMG, &t[NK]));
    TRY(qk_norm(c, &t[CQ], &scq, N("attn.norm_added_q"), ST_TXT, &t[NCQ]));
    TRY(qk_norm(c, &t[CK], &sck, N("attn.norm_added_k"), ST_TXT, &t[NCK]));
    /* gotcha 4: joint sequence is text first; RoPE after the QK norm, on q and k only (gotcha 6) */
    TRY(cat_seq(c, &t[NCQ], &t[NQ], &t[JQ]));
    TRY(cat_seq(c, &t[NCK], &t[NK], &t[JK]));
    TRY(cat_seq(c, &t[CV], &t[V], &t[JV]));
    TRY(rope_inplace(c, &t[JQ], cos_t, sin_t));
    TRY(rope_inplace(c, &t[JK], cos_t, sin_t));
    TRY(sdpa(c, &t[JQ], &t[JK], &t[JV], &t[O]));
    TRY(slice_seq(c, &t[O], 0, c->S_txt, &t[OC]));
    TRY(slice_seq(c, &t[O], c->S_txt, c->S_img, &t[OX]));
    TRY(linear(c, &t[OX], N("attn.to_out.0"), ST_IMG, &t[AX], NULL));
    TRY(REC(&t[AX], ST_IMG, REPL, "%s.attn.to_out.1", p)); /* Dropout(p=0): identity */
    TRY(linear(c, &t[OC], N("attn.to_add_out"), ST_TXT, &t[AC], NULL));
    TRY(REC(&t[AX], ST_IMG, REPL, "%s.attn#0", p)); /* gotcha 5: attn returns (image, text) */
    TRY(REC(&t[AC], ST_TXT, REPL, "%s.attn#1", p));

    /* image stream: gated attention residual, then the MLP reads the updated x (gotcha 12) */
    TRY(be->gated_add(be, x, &mod[2], &t[AX], c->e));
    TRY(layernorm(c, x, &t[LN2]));
    TRY(REC(&t[LN2], ST_IMG, REPL, "%s.norm2", p));
    TRY(out_like(c, &t[M2], x));
    TRY(be->modulate(be, &t[M2], &t[LN2], &mod[4], &mod[3], c->e));
    TRY(feed_forward(c, &t[M2], N("ff"), ST_IMG, &t[FF]));
    TRY(be->gated_add(be, x, &mod[5], &t[FF], c->e));

    /* text stream, same with the context weights */
    TRY(be->gated_add(be, cx, &cmod[2], &t[AC], c->e));
    TRY(layernorm(c, cx, &t[LN2C]));
    TRY(REC(&t[LN2C], ST_TXT, REPL, "%s.norm2_context", p));
    TRY(out_like(c, &t[M2C], cx));
    TRY(be->modulate(be, &t[M2C], &t[LN2C], &cmod[4], &cmod[3], c->e));
    TRY(feed_forward(c, &t[M2C], N("ff_context"), ST_TXT, &t[FFC]));
    TRY(be->gated_add(be, cx, &cmod[5], &t[FFC], c->e));

    TRY(REC(cx, ST_TXT, REPL, "%s#0", p)); /* gotcha 5: the block returns (text, image) */
    TRY(REC(x, ST_IMG, REPL, "%s#1", p));
#undef N
out:
    block_leave(c);
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
    fs_tp_split smlp, sq, sk, sv;
    char p[64], nm[160];
    int rc;
    const int64_t B = h->shape[0], S = h->shape[1];
    snprintf(p, sizeof p, "single_transformer_blocks.%d", i);
#define N(suffix) fmt_name(nm, sizeof nm, "%s." suffix, p)

    TRY(block_enter(c, N("")));
    TRY(ada_layer_norm_zero(c, N("norm"), h, ST_JOINT, temb, 3, &t[HM], mod));
    TRY(linear(c, &t[HM], N("proj_mlp"), ST_JOINT, &t[MLP], &smlp));
    TRY(activation(c, c->be->gelu_tanh, &t[MLP], &t[ACT], ST_JOINT, feat(&smlp), "%s.act_mlp", p));
    TRY(linear(c, &t[HM], N("attn.to_q"), ST_JOINT, &t[Q], &sq));
    TRY(linear(c, &t[HM], N("attn.to_k"), ST_JOINT, &t[K], &sk));
    TRY(linear(c, &t[HM], N("attn.to_v"), ST_JOINT, &t[V], &sv));
    TRY(qk_norm(c, &t[Q], &sq, N("attn.norm_q"), ST_JOINT, &t[NQ]));
    TRY(qk_norm(c, &t[K], &sk, N("attn.norm_k"), ST_JOINT, &t[NK]));
    TRY(rope_inplace(c, &t[NQ], cos_t, sin_t));
    TRY(rope_inplace(c, &t[NK], cos_t, sin_t));
    TRY(sdpa(c, &t[NQ], &t[NK], &t[V], &t[A]));
    TRY(REC(&t[A], ST_JOINT, feat(&sv), "%s.attn", p)); /* no output projection in single blocks (gotcha 11) */

    /* proj_out on cat([attn, mlp], dim=2): attention columns first. Under TP this is the rank's
     * [attn_shard | mlp_shard], which is why proj_out is packed_rowwise in the plan. */
    const int64_t Da = t[A].shape[2], Fa = t[ACT].shape[2];
    TRY(new_out(c, &t[CAT], 3, (int64_t[]){B, S, Da + Fa}));
    TRY(copy2d(c, t[CAT].data, Da + Fa, t[A].data, Da, B * S, Da));
    TRY(copy2d(c, (char *)t[CAT].data + (size_t)Da * fs_dtype_size(c->dt), Da + Fa, t[ACT].data, Fa, B * S, Fa));
    TRY(linear(c, &t[CAT], N("proj_out"), ST_JOINT, &t[PO], NULL));
    TRY(c->be->gated_add(c->be, h, &mod[2], &t[PO], c->e));

    if (c->m->rec.fn) { /* the block returns (text, image) slices of h */
        TRY(slice_seq(c, h, 0, c->S_txt, &t[HT]));
        TRY(slice_seq(c, h, c->S_txt, c->S_img, &t[HX]));
        TRY(REC(&t[HT], ST_TXT, REPL, "%s#0", p));
        TRY(REC(&t[HX], ST_IMG, REPL, "%s#1", p));
    }
#undef N
out:
    block_leave(c);
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
    TRY(activation(c, c->be->silu, temb, &s, ST_REP, REPL, "norm_out.silu"));
    TRY(linear(c, &s, "norm_out.linear", ST_REP, &lin, NULL));
    TRY(chunk(c, &lin, 2, mod));
    TRY(layernorm(c, x, &ln));
    TRY(REC(&ln, ST_IMG, REPL, "norm_out.norm"));
    TRY(out_like(c, y, x));
    TRY(c->be->modulate(c->be, y, &ln, &mod[0], &mod[1], c->e));
    TRY(REC(y, ST_IMG, REPL, "norm_out"));
out:
    fs_tensor_free(&s);
    fs_tensor_free(&lin);
    fs_tensor_free(&ln);
    free_all(mod, 2);
    return rc;
}

/* ---------------------------------------------------------------- forward */

/* FluxPosEmbed of ids = cat(txt_ids, img_ids) — text first (gotcha 4) — on the host, uploaded;
 * tables are [S, Dh], no batch. */
static int pos_embed(ctx *c, const fs_tensor *img_ids, const fs_tensor *txt_ids, fs_tensor *cos_t, fs_tensor *sin_t)
{
    fs_tensor ids = {0}, hc = {0}, hs = {0};
    int rc = fs_tensor_alloc2(&ids, FS_F64, c->S, 3, c->e);
    if (rc) return rc;
    memcpy(ids.data, txt_ids->data, (size_t)c->S_txt * 3 * sizeof(double));
    memcpy((double *)ids.data + (size_t)c->S_txt * 3, img_ids->data, (size_t)c->S_img * 3 * sizeof(double));
    if (!(rc = fs_pos_embed(fixed_f32(c->dt), &c->m->cfg, &ids, &hc, &hs, c->e)) && !(rc = upload_new(c, &hc, cos_t)))
        rc = upload_new(c, &hs, sin_t);
    fs_tensor_free(&ids);
    fs_tensor_free(&hc);
    fs_tensor_free(&hs);
    return rc;
}

int fs_model_forward(const fs_model *m, const fs_tensor *hidden_states, const fs_tensor *encoder_hidden_states,
                     const fs_tensor *pooled, const double *timestep, const double *guidance,
                     const fs_tensor *img_ids, const fs_tensor *txt_ids, fs_tensor *out, fs_err *e)
{
    const fs_config *cf = &m->cfg;
    ctx cc = {.m = m, .par = m->par, .be = m->be, .dt = m->dtype, .tp = m->par ? m->par->tp : 1,
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

    TRY(linear(c, hidden_states, "x_embedder", ST_IMG, &t[X], NULL));
    TRY(time_text_embed(c, timestep, cf->guidance_embeds ? guidance : NULL, pooled, &t[TEMB]));
    TRY(linear(c, encoder_hidden_states, "context_embedder", ST_TXT, &t[CX], NULL));
    TRY(pos_embed(c, img_ids, txt_ids, &t[COS], &t[SIN]));
    TRY(rec_sharded(c, &t[COS], ST_JOINT, 0, REPL, "pos_embed#0"));
    TRY(rec_sharded(c, &t[SIN], ST_JOINT, 0, REPL, "pos_embed#1"));

    const int nblk = cf->num_layers + cf->num_single_layers;
#define PROGRESS(done) \
    if (m->on_block) m->on_block(m->on_block_ctx, m->step, (done), nblk)
    for (int i = 0; i < cf->num_layers; i++) {
        TRY(double_block(c, i, &t[X], &t[CX], &t[TEMB], &t[COS], &t[SIN]));
        PROGRESS(i + 1);
    }

    TRY(cat_seq(c, &t[CX], &t[X], &t[H]));
    for (int i = 0; i < cf->num_single_layers; i++) {
        TRY(single_block(c, i, &t[H], &t[TEMB], &t[COS], &t[SIN]));
        PROGRESS(cf->num_layers + i + 1);
    }
#undef PROGRESS
    fs_tensor_free(&t[X]);
    TRY(slice_seq(c, &t[H], c->S_txt, c->S_img, &t[X]));

    TRY(norm_out(c, &t[X], &t[TEMB], &t[Y]));
    TRY(linear(c, &t[Y], "proj_out", ST_IMG, out, NULL));
out:
    free_all(t, NT);
    if (rc) fs_tensor_free(out);
    return rc;
}
