/* fs_layers.c — the layer functions the FLUX families share (fs_layers.h), module by module, as
 * diffusers computes them; the families' blocks and forwards are in fs_flux1.c (and beside it).
 *
 * Every function records what the matching diffusers module's forward hook would see, under the
 * module's path, in hook firing order (children before parents). Gotchas of ../shared/flux-spec.md
 * §9 are marked "gotcha N" where they bite.
 *
 * Memory: every activation lives in the backend's memory (m->be) and is touched only by backend
 * ops — no element loop, copy or pointer dereference here — so a GPU backend runs this file
 * unchanged. The only host-side arithmetic is on the step's scalars and ids: the timestep and
 * guidance sinusoids and the RoPE tables are computed on the host (fs_time_proj, fs_pos_embed)
 * and uploaded, as inputs are. */
#include "fs_layers.h"

#include "fs_debug.h"
#include "fs_seqpar.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every LayerNorm in FLUX has no affine and eps 1e-6, the QK RMSNorm too (FluxAttention's default
 * 1e-5 is never used); FLUX.2 takes both from its config's `eps` (1e-6 in every release). */
#define LN_EPS(c) fs_config_eps(&(c)->m->cfg)
#define RMS_EPS(c) fs_config_eps(&(c)->m->cfg)
#define TRY FS_TRY

/* Parameter `name` as the backend computes with it: the streamed block's, or a resident one. */
const fs_tensor *fs_layer_weight(const fs_layer_ctx *c, const char *name)
{
    if (c->blk.n) {
        int i = fs_param_find(c->blk.desc, c->blk.n, name);
        if (i >= 0 && c->blk.t[i].ndim) return &c->blk.t[i];
    }
    return fs_weights_get(c->m->w, name);
}

/* Streaming (m->stream): make the block's parameters for this rank's shard and place them in
 * the backend's memory; nothing otherwise. block_leave drops them. */
int fs_layer_block_enter(fs_layer_ctx *c, const char *prefix)
{
    if (!c->m->stream) return FS_OK;
    snprintf(c->blk_prefix, sizeof c->blk_prefix, "%s", prefix);
    int rc = fs_weights_acquire(c->m->stream, prefix, c->e);
    if (!rc) rc = fs_weights_on_prefix(c->m->stream, c->be, prefix, &c->blk, c->e);
    if (rc) fs_err_prefix(c->e, "weights of %s: ", prefix);
    return rc;
}

void fs_layer_block_leave(fs_layer_ctx *c)
{
    if (!c->m->stream) return;
    fs_weights_free(&c->blk);
    fs_weights_release(c->m->stream, c->blk_prefix);
}

/* The fs_shard of a local tensor: tokens of `stream` on axis tokdim (sequence parallelism), and
 * the feature axis as the producing Linear's TP split says (fs_tp_split_of, the one owner). */
static void make_shard(const fs_layer_ctx *c, const fs_tensor *t, int stream, int tokdim, fs_tp_axis f, fs_shard *sh)
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
            int64_t off = stream == ST_JOINT ? p->S_txt : 0, lo = p->img_lo[q], hi = p->img_hi[q];
            if (c->kv_out) { /* the KV cache's step 0 after the blocks: the noise tokens of [reference; noise] */
                const int64_t R = c->m->kv->R;
                lo = (lo > R ? lo : R) - R, hi -= R;
            }
            d->iv[d->n][0] = off + lo;
            d->iv[d->n++][1] = off + hi;
        }
    }
    /* replicated text through ring attention: each ring rank merges its text queries' partials in
     * its own order, so its copy of the text is its own computation (fs_shard.copy) */
    if (p->sp > 1 && (stream == ST_TXT || stream == ST_JOINT) && p->ring > 1 && p->text == FS_TEXT_REPLICATED)
        sh->copy = p->r_rank;
    if (f.sp && fs_tp_split_rows(f.sp) < f.sp->N) { /* the rows this rank computed = its features */
        fs_shard_dim *d = &sh->d[sh->ndims++];
        d->dim = f.axis < 0 ? t->ndim - 1 : f.axis;
        d->n = f.sp->nr > 1 ? f.sp->nr : 1; /* packed_colwise: one interval per block, in order */
        for (int k = 0; k < d->n; k++) {
            d->iv[k][0] = (f.sp->nr > 1 ? f.sp->rr[k][0] : f.sp->r0) / f.unit;
            d->iv[k][1] = (f.sp->nr > 1 ? f.sp->rr[k][1] : f.sp->r1) / f.unit;
        }
    }
}

const char *fs_layer_name(char *buf, size_t n, const char *fmt, ...)
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
static int inject_faults(fs_layer_ctx *c, const fs_tensor *t, const char *name)
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
int fs_layer_record(fs_layer_ctx *c, const fs_tensor *t, int stream, int tokdim, fs_tp_axis f, const char *fmt, ...)
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
/* the tp_axis of a Linear's output features */
fs_tp_axis fs_tp_feat(const fs_tp_split *sp) { return (fs_tp_axis){sp, -1, 1}; }

/* A zero-filled activation in the backend's memory. */
int fs_layer_new(fs_layer_ctx *c, fs_tensor *t, int ndim, const int64_t *shape)
{
    return fs_tensor_alloc_on(t, c->be, c->dt, ndim, shape, c->e);
}
int fs_layer_new3(fs_layer_ctx *c, fs_tensor *t, int64_t d0, int64_t d1, int64_t d2)
{
    return fs_layer_new(c, t, 3, (int64_t[]){d0, d1, d2});
}
int fs_layer_new_like(fs_layer_ctx *c, fs_tensor *t, const fs_tensor *x) { return fs_layer_new(c, t, x->ndim, x->shape); }
/* An op's output that the op writes in full (a GEMM with beta = 0, an element-wise op, copies
 * that tile it): not zero-filled first, which at FLUX width was a memset of every activation. */
int fs_layer_new_out(fs_layer_ctx *c, fs_tensor *t, int ndim, const int64_t *shape)
{
    return fs_tensor_alloc_on_uninit(t, c->be, c->dt, ndim, shape, c->e);
}
int fs_layer_out_like(fs_layer_ctx *c, fs_tensor *t, const fs_tensor *x) { return fs_layer_new_out(c, t, x->ndim, x->shape); }

/* A host tensor computed here (sinusoids, RoPE tables), placed in backend memory. */
int fs_layer_upload(fs_layer_ctx *c, const fs_tensor *host, fs_tensor *dev)
{
    int rc = fs_tensor_alloc_on(dev, c->be, host->dtype, host->ndim, host->shape, c->e);
    if (!rc) rc = fs_tensor_upload(dev, host, c->e);
    if (rc) fs_tensor_free(dev);
    return rc;
}

void fs_layer_free_all(fs_tensor *t, int n)
{
    for (int i = 0; i < n; i++) fs_tensor_free(&t[i]);
}

/* Byte-addressed 2-D copy inside backend memory: rows × width elements. */
int fs_layer_copy2d(fs_layer_ctx *c, void *dst, int64_t ld_dst, const void *src, int64_t ld_src, int64_t rows, int64_t cols)
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
int fs_linear(fs_layer_ctx *c, const fs_tensor *x, const char *name, int stream, fs_tensor *y, fs_tp_split *used)
{
    char wn[192], bn[192];
    const fs_tensor *W = fs_layer_weight(c, fs_layer_name(wn, sizeof wn, "%s.weight", name));
    const fs_tensor *b = fs_layer_weight(c, fs_layer_name(bn, sizeof bn, "%s.bias", name));
    /* a Linear without bias (all of FLUX.2's) has none in the parameter list: b stays NULL */
    const int has_bias = fs_param_find(c->m->w->desc, c->m->w->n, bn) >= 0;
    if (!W || (has_bias && !b)) return fs_errf(c->e, FS_E_INTERNAL, "weights have no %s", W ? bn : wn);
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
    const int64_t Ny = fs_tp_split_rows(&sp), Kl = fs_tp_split_cols(&sp);
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
    if ((rc = (Kl > 0 ? fs_layer_new_out : fs_layer_new)(c, y, x->ndim, shape))) return rc; /* K = 0: zeros, kept explicit */
    const void *A = wrong.input_whole ? (const char *)x->data + (size_t)sp.c[0][0] * fs_dtype_size(c->dt) : x->data;
    if (!sp.reduce) { /* replicate, colwise: one GEMM with the bias */
        TRY(c->be->gemm(c->be, c->dt, M, Ny, Kl, A, Kx, W->data, Kl, b ? b->data : NULL, y->data, Ny, c->e));
    } else { /* rowwise, packed_rowwise: this rank's partial sum, all-reduced, then the bias once */
        TRY(c->be->gemm(c->be, c->dt, M, Ny, Kl, A, Kx, W->data, Kl, NULL, y->data, Ny, c->e));
        if (b && wrong.bias_before_reduce) TRY(c->be->add_bias(c->be, y, b, c->e)); /* --inject rowwise-bias-every-rank */
        TRY(fs_allreduce_sum_t(&c->par->g_tp, y, c->e));
        if (b && !wrong.bias_before_reduce) TRY(c->be->add_bias(c->be, y, b, c->e));
    }
    if (used) *used = sp;
    TRY(REC(y, stream, fs_tp_feat(&sp), "%s", name));
out:
    if (rc) fs_tensor_free(y);
    return rc;
}

/* Element-wise op into a new tensor, recorded under `name`. */
int fs_activation(fs_layer_ctx *c, fs_unary_op op, const fs_tensor *x, fs_tensor *y, int stream, fs_tp_axis f, const char *fmt, ...)
{
    int rc = fs_layer_out_like(c, y, x);
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
int fs_layernorm(fs_layer_ctx *c, const fs_tensor *x, fs_tensor *y)
{
    int rc = fs_layer_out_like(c, y, x);
    return rc ? rc : c->be->layernorm(c->be, y, x, LN_EPS(c), c->e);
}

/* Concatenate a [B,Sa,W] and b [B,Sb,W] along the sequence (dim 1) into [B,Sa+Sb,W]: two 2-D
 * copies, one row per batch. */
int fs_cat_seq(fs_layer_ctx *c, const fs_tensor *a, const fs_tensor *b, fs_tensor *y)
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
    int rc = fs_layer_new_out(c, y, a->ndim, shape);
    if (rc) return rc;
    const size_t es = fs_dtype_size(c->dt);
    if (!rc) rc = fs_layer_copy2d(c, y->data, (Sa + Sb) * W, a->data, Sa * W, B, Sa * W);
    if (!rc) rc = fs_layer_copy2d(c, (char *)y->data + (size_t)(Sa * W) * es, (Sa + Sb) * W, b->data, Sb * W, B, Sb * W);
    if (rc) fs_tensor_free(y);
    return rc;
}

/* Tokens [s0, s0+n) of x [B,S,W...] into a new [B,n,W...] tensor. */
int fs_slice_seq(fs_layer_ctx *c, const fs_tensor *x, int64_t s0, int64_t n, fs_tensor *y)
{
    int64_t B = x->shape[0], S = x->shape[1], W = fs_tensor_numel(x) / (B * S);
    int64_t shape[FS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[1] = n;
    int rc = fs_layer_new_out(c, y, x->ndim, shape);
    if (!rc) rc = fs_layer_copy2d(c, y->data, n * W, (const char *)x->data + (size_t)(s0 * W) * fs_dtype_size(c->dt), S * W, B, n * W);
    if (rc) fs_tensor_free(y);
    return rc;
}

/* torch.chunk(e, n, dim=1) of e [B, n·D] into n contiguous [B, D] tensors. */
int fs_chunk(fs_layer_ctx *c, const fs_tensor *e, int n, fs_tensor *out)
{
    int64_t B = e->shape[0], W = e->shape[1] / n;
    for (int k = 0; k < n; k++) {
        int rc = fs_layer_new_out(c, &out[k], 2, (int64_t[]){B, W});
        if (!rc) rc = fs_layer_copy2d(c, out[k].data, W, (const char *)e->data + (size_t)(k * W) * fs_dtype_size(c->dt), e->shape[1], B, W);
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
    return fs_time_proj_n(dt, t, B, 256, out, e);
}

int fs_time_proj_n(fs_dtype dt, const double *t, int B, int channels, fs_tensor *out, fs_err *e)
{
    const int HALF = channels / 2;
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
    const int nax = fs_config_axes(cf);
    const double theta = fs_config_rope_theta(cf); /* FLUX.1 10000, FLUX.2 2000 */
    if (ids->ndim != 2 || ids->shape[1] != nax)
        return fs_errf(e, FS_E_INPUT, "RoPE ids have %lld columns, the config has %d axes", (long long)(ids->ndim == 2 ? ids->shape[1] : -1), nax);
    int rc = fs_tensor_alloc2(cos_t, dt, S, Dh, e);
    if (!rc) rc = fs_tensor_alloc2(sin_t, dt, S, Dh, e);
    if (rc) {
        fs_tensor_free(cos_t);
        return rc;
    }
    for (int64_t s = 0; s < S; s++) {
        int64_t col = 0;
        for (int ax = 0; ax < nax; ax++) {
            int d = cf->axes_dims_rope[ax];
            /* pos = ids.float(): positions are small integers, exact in float32 */
            double pos = (double)(float)fs_tensor_get(ids, s * nax + ax);
            for (int j = 0; j < d / 2; j++) {
                double omega = 1.0 / pow(theta, (double)(2 * j) / (double)d);
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
int fs_mlp_embedder(fs_layer_ctx *c, const fs_tensor *x, const char *name, const char *act, fs_tensor *y)
{
    fs_tensor h[2] = {0};
    char n[160];
    int rc;
    TRY(fs_linear(c, x, fs_layer_name(n, sizeof n, "%s.linear_1", name), ST_REP, &h[0], NULL));
    TRY(fs_activation(c, c->be->silu, &h[0], &h[1], ST_REP, FS_TP_REPL, "%s.%s", name, act));
    TRY(fs_linear(c, &h[1], fs_layer_name(n, sizeof n, "%s.linear_2", name), ST_REP, y, NULL));
    TRY(REC(y, ST_REP, FS_TP_REPL, "%s", name));
out:
    fs_layer_free_all(h, 2);
    return rc;
}

/* Where diffusers computes in float32 whatever the model dtype (the sinusoids, the RoPE tables):
 * float32 for bf16 runs, the run dtype otherwise (a float64 run promotes them, as the reference). */
fs_dtype fs_layer_fixed_f32(fs_dtype dt) { return dt == FS_BF16 ? FS_F32 : dt; }

/* The sinusoid of B scalars (fs_time_proj, on the host), in backend memory, in fixed_f32. */
int fs_layer_time_proj(fs_layer_ctx *c, const double *t, fs_tensor *out)
{
    fs_tensor host = {0};
    int rc = fs_time_proj_n(fs_layer_fixed_f32(c->dt), t, c->B, fs_config_time_channels(&c->m->cfg), &host, c->e);
    if (!rc) rc = fs_layer_upload(c, &host, out);
    fs_tensor_free(&host);
    return rc;
}

/* timesteps_proj.to(dtype=pooled_projection.dtype): the float32 sinusoid rounded to bf16 before
 * the embedder (a no-op view in float32/float64 runs). *tmp owns the copy when one is made. */
int fs_layer_to_run_dtype(fs_layer_ctx *c, const fs_tensor *x, fs_tensor *tmp, const fs_tensor **out)
{
    *out = x;
    if (x->dtype == c->dt) return FS_OK;
    int rc = fs_layer_new_like(c, tmp, x);
    if (!rc) rc = c->be->convert(c->be, tmp, x, c->e);
    *out = tmp;
    return rc;
}

/* The value the transformer embeds for a timestep or guidance x it is passed: `x.to(dtype)*1000`
 * in the model dtype (gotcha 1); bf16: fs_bf16_embedded. */
double fs_bf16_embedded(double x) { return fs_bf16_round(fs_bf16_round((float)x) * 1000.0f); }

double fs_layer_embedded_scalar(const fs_layer_ctx *c, double x)
{
    if (c->dt == FS_BF16) return fs_bf16_embedded(x);
    /* --match bf16: x = e/1000 for a bf16 value e (fs_inputs_match_bf16); x·1000 is e exactly
     * in float64, and rounding it to bf16 gives e back in a float32 run too */
    if (c->m->match_bf16) return fs_bf16_round((float)(x * 1000.0));
    return c->dt == FS_F32 ? (double)((float)x * 1000.0f) : x * 1000.0;
}

/* ---------------------------------------------------------------- normalisation */

/* AdaLayerNormZero (n=6) / AdaLayerNormZeroSingle (n=3): SiLU(temb) → linear → chunk(n) =
 * (shift, scale, gate[, shift_mlp, scale_mlp, gate_mlp]) (gotcha 8); returns LN(x)·(1+scale)+shift
 * in *xm and the chunks in mod[]. Records .silu, .linear, .norm, then the tuple #0..#(n-2):
 * #0 = modulated x, #k = chunk k+1 (shift and scale of the attention are not returned). */
int fs_ada_layer_norm_zero(fs_layer_ctx *c, const char *name, const fs_tensor *x, int stream, const fs_tensor *temb,
                               int n, fs_tensor *xm, fs_tensor *mod)
{
    fs_tensor s = {0}, lin = {0}, ln = {0};
    char nm[160];
    int rc;
    /* gotcha 10: each AdaLN applies SiLU to temb itself */
    TRY(fs_activation(c, c->be->silu, temb, &s, ST_REP, FS_TP_REPL, "%s.silu", name));
    TRY(fs_linear(c, &s, fs_layer_name(nm, sizeof nm, "%s.linear", name), ST_REP, &lin, NULL));
    TRY(fs_chunk(c, &lin, n, mod));
    TRY(fs_layernorm(c, x, &ln));
    TRY(REC(&ln, stream, FS_TP_REPL, "%s.norm", name));
    TRY(fs_layer_out_like(c, xm, x));
    TRY(c->be->modulate(c->be, xm, &ln, &mod[1], &mod[0], c->e)); /* gotcha 9: LN(x)·(1 + scale) + shift */
    TRY(REC(xm, stream, FS_TP_REPL, "%s#0", name));
    for (int k = 1; k < n - 1; k++) TRY(REC(&mod[k + 1], ST_REP, FS_TP_REPL, "%s#%d", name, k));
out:
    fs_tensor_free(&s);
    fs_tensor_free(&lin);
    fs_tensor_free(&ln);
    return rc;
}

/* RMSNorm over head_dim of a [B,S,D] projection (this rank's heads: the projection's split),
 * recorded as [B,S,H,Dh] (gotcha 7). */
int fs_qk_norm(fs_layer_ctx *c, const fs_tensor *x, const fs_tp_split *proj, const char *name, int stream, fs_tensor *y)
{
    char wn[192];
    const fs_tensor *w = fs_layer_weight(c, fs_layer_name(wn, sizeof wn, "%s.weight", name));
    if (!w) return fs_errf(c->e, FS_E_INTERNAL, "weights have no %s", wn);
    int64_t shape[4] = {x->shape[0], x->shape[1], x->shape[2] / c->Dh, c->Dh};
    int rc = fs_layer_new_out(c, y, 4, shape);
    if (!rc) rc = c->be->rmsnorm(c->be, y, x, w, RMS_EPS(c), c->e);
    if (rc) return rc;
    return fs_layer_record(c, y, stream, 1, (fs_tp_axis){proj, 2, c->Dh}, "%s", name);
}

/* FeedForward(D, D, "gelu-approximate"): net.0 = GELU(proj) (net.0.proj, net.0), net.1 Dropout(0),
 * net.2 Linear. Records all five hooks; *y is net.2's output (= the module's). */
int fs_feed_forward(fs_layer_ctx *c, const fs_tensor *x, const char *name, int stream, fs_tensor *y)
{
    fs_tensor h[2] = {0};
    fs_tp_split up;
    char nm[160];
    int rc;
    TRY(fs_linear(c, x, fs_layer_name(nm, sizeof nm, "%s.net.0.proj", name), stream, &h[0], &up));
    TRY(fs_activation(c, c->be->gelu_tanh, &h[0], &h[1], stream, fs_tp_feat(&up), "%s.net.0", name)); /* gotcha 14 */
    TRY(REC(&h[1], stream, fs_tp_feat(&up), "%s.net.1", name));
    TRY(fs_linear(c, &h[1], fs_layer_name(nm, sizeof nm, "%s.net.2", name), stream, y, NULL));
    TRY(REC(y, stream, FS_TP_REPL, "%s", name));
out:
    fs_layer_free_all(h, 2);
    return rc;
}

int fs_time_guidance(fs_layer_ctx *c, const char *name, const double *timestep, const double *guidance, fs_tensor *temb)
{
    const int B = c->B;
    double t[64], g[64];
    fs_tensor tp = {0}, te = {0}, gp = {0}, ge = {0}, tc = {0}, gc = {0};
    char nm[160];
    int rc = FS_OK;
    if (B > 64) return fs_errf(c->e, FS_E_INPUT, "batch %d > 64 not supported", B);
    /* gotcha 1: the transformer multiplies timestep AND guidance by 1000, in the model dtype */
    for (int b = 0; b < B; b++) {
        t[b] = fs_layer_embedded_scalar(c, timestep[b]);
        if (guidance) g[b] = fs_layer_embedded_scalar(c, guidance[b]);
    }
    const fs_tensor *in;
    TRY(fs_layer_time_proj(c, t, &tp));
    TRY(REC(&tp, ST_REP, FS_TP_REPL, "%s.time_proj", name));
    TRY(fs_layer_to_run_dtype(c, &tp, &tc, &in));
    TRY(fs_mlp_embedder(c, in, fs_layer_name(nm, sizeof nm, "%s.timestep_embedder", name), "act", &te));
    if (guidance) {
        /* gotcha 3: the same time_proj module fires a second time */
        TRY(fs_layer_time_proj(c, g, &gp));
        TRY(REC(&gp, ST_REP, FS_TP_REPL, "%s.time_proj@1", name));
        TRY(fs_layer_to_run_dtype(c, &gp, &gc, &in));
        TRY(fs_mlp_embedder(c, in, fs_layer_name(nm, sizeof nm, "%s.guidance_embedder", name), "act", &ge));
        TRY(fs_layer_new_like(c, temb, &te));
        TRY(c->be->add(c->be, temb, &te, &ge, c->e));
    } else {
        *temb = te;
        te = (fs_tensor){0};
    }
out:
    fs_tensor_free(&tp);
    fs_tensor_free(&te);
    fs_tensor_free(&gp);
    fs_tensor_free(&ge);
    fs_tensor_free(&tc);
    fs_tensor_free(&gc);
    return rc;
}

int fs_joint_attention(fs_layer_ctx *c, const char *p, const fs_tensor *xm, const fs_tensor *cm, const fs_tensor *cos_t,
                       const fs_tensor *sin_t, int add_out_first, fs_tensor *ax, fs_tensor *ac)
{
    enum { Q, K, V, CQ, CK, CV, NQ, NK, NCQ, NCK, JQ, JK, JV, O, OX, OC, NT };
    fs_tensor t[NT] = {0};
    fs_tp_split sq, sk, scq, sck;
    char nm[160];
    int rc;
#define N(suffix) fs_layer_name(nm, sizeof nm, "%s." suffix, p)
    TRY(fs_linear(c, xm, N("attn.to_q"), ST_IMG, &t[Q], &sq));
    TRY(fs_linear(c, xm, N("attn.to_k"), ST_IMG, &t[K], &sk));
    TRY(fs_linear(c, xm, N("attn.to_v"), ST_IMG, &t[V], NULL));
    TRY(fs_linear(c, cm, N("attn.add_q_proj"), ST_TXT, &t[CQ], &scq));
    TRY(fs_linear(c, cm, N("attn.add_k_proj"), ST_TXT, &t[CK], &sck));
    TRY(fs_linear(c, cm, N("attn.add_v_proj"), ST_TXT, &t[CV], NULL));
    TRY(fs_qk_norm(c, &t[Q], &sq, N("attn.norm_q"), ST_IMG, &t[NQ]));
    TRY(fs_qk_norm(c, &t[K], &sk, N("attn.norm_k"), ST_IMG, &t[NK]));
    TRY(fs_qk_norm(c, &t[CQ], &scq, N("attn.norm_added_q"), ST_TXT, &t[NCQ]));
    TRY(fs_qk_norm(c, &t[CK], &sck, N("attn.norm_added_k"), ST_TXT, &t[NCK]));
    /* gotcha 4: joint sequence is text first; RoPE after the QK norm, on q and k only (gotcha 6) */
    TRY(fs_cat_seq(c, &t[NCQ], &t[NQ], &t[JQ]));
    TRY(fs_cat_seq(c, &t[NCK], &t[NK], &t[JK]));
    TRY(fs_cat_seq(c, &t[CV], &t[V], &t[JV]));
    TRY(fs_rope_inplace(c, &t[JQ], cos_t, sin_t));
    TRY(fs_rope_inplace(c, &t[JK], cos_t, sin_t));
    TRY(fs_sdpa(c, &t[JQ], &t[JK], &t[JV], &t[O]));
    TRY(fs_slice_seq(c, &t[O], 0, c->S_txt, &t[OC]));
    TRY(fs_slice_seq(c, &t[O], c->S_txt, c->S_img, &t[OX]));
    if (add_out_first) TRY(fs_linear(c, &t[OC], N("attn.to_add_out"), ST_TXT, ac, NULL));
    TRY(fs_linear(c, &t[OX], N("attn.to_out.0"), ST_IMG, ax, NULL));
    TRY(REC(ax, ST_IMG, FS_TP_REPL, "%s.attn.to_out.1", p)); /* Dropout(p=0): identity */
    if (!add_out_first) TRY(fs_linear(c, &t[OC], N("attn.to_add_out"), ST_TXT, ac, NULL));
    TRY(REC(ax, ST_IMG, FS_TP_REPL, "%s.attn#0", p)); /* gotcha 5: attn returns (image, text) */
    TRY(REC(ac, ST_TXT, FS_TP_REPL, "%s.attn#1", p));
#undef N
out:
    fs_layer_free_all(t, NT);
    if (rc) {
        fs_tensor_free(ax);
        fs_tensor_free(ac);
    }
    return rc;
}

/* Flux2SwiGLU (`name` = its path, e.g. "transformer_blocks.0.ff.act_fn"): x [B,S,2·Fl] is this
 * rank's [gate | up] (linear_in's packed columns keep the halves rank by rank), y = silu(gate)·up
 * [B,S,Fl]. Records gate_fn (the SiLU submodule) and the module. `sp`: the producing Linear's
 * split, whose rows are this rank's gate and up features. */
int fs_swiglu(fs_layer_ctx *c, const fs_tensor *x, const char *name, int stream, fs_tp_axis f, fs_tensor *y)
{
    fs_tensor h[3] = {0};
    int rc;
    const int64_t B = x->shape[0], S = x->shape[1], W = x->shape[2], Fl = W / 2;
    const size_t es = fs_dtype_size(c->dt);
    TRY(fs_layer_new_out(c, &h[0], 3, (int64_t[]){B, S, Fl}));
    TRY(fs_layer_new_out(c, &h[1], 3, (int64_t[]){B, S, Fl}));
    TRY(fs_layer_copy2d(c, h[0].data, Fl, x->data, W, B * S, Fl));                       /* x[..., :half] */
    TRY(fs_layer_copy2d(c, h[1].data, Fl, (const char *)x->data + (size_t)Fl * es, W, B * S, Fl)); /* x[..., half:] */
    TRY(fs_activation(c, c->be->silu, &h[0], &h[2], stream, f, "%s.gate_fn", name));
    TRY(fs_layer_out_like(c, y, &h[1]));
    TRY(c->be->mul(c->be, y, &h[2], &h[1], c->e));
    TRY(REC(y, stream, f, "%s", name));
out:
    fs_layer_free_all(h, 3);
    if (rc) fs_tensor_free(y);
    return rc;
}

/* SDPA over the joint sequence: q, k, v [B,S,D] viewed as [B,S,H,Dh] (head-major columns). */
/* Rows [r0, r0 + n) of a [B, S, W] tensor x copied to/from rows [d0, d0 + n) of y [B, Sy, W]. */
static int copy_rows(fs_layer_ctx *c, fs_tensor *y, int64_t d0, const fs_tensor *x, int64_t r0, int64_t n)
{
    const int64_t B = x->shape[0], S = x->shape[1], Sy = y->shape[1], W = fs_tensor_numel(x) / (B * S);
    const size_t es = fs_dtype_size(c->dt);
    return fs_layer_copy2d(c, (char *)y->data + (size_t)(d0 * W) * es, Sy * W, (const char *)x->data + (size_t)(r0 * W) * es,
                           S * W, B, n * W);
}

/* The KV-cache attention under Ulysses (ring 1): q, k, v to every token of this member's head
 * block (member w's chunk at toff[w]: its text tokens, then its image-stream tokens, the first R
 * of the image stream the reference's). Extract: every query over every key, then the reference
 * queries' rows again over the reference keys alone (the reference tokens' pieces, in token
 * order, are also what the block's cache keeps: R tokens of this head block); cached: the keys
 * and values are the gathered ones followed by the cached reference's. Then back to tokens. The
 * keys are in another order than one rank's, the softmax the same. */
static int kv_attention_ulysses(fs_layer_ctx *c, fs_tensor *o, const fs_tensor *q, const fs_tensor *k, const fs_tensor *v)
{
    fs_kv_cache *kv = c->m->kv;
    const fs_par *p = c->par;
    enum { QU, KU, VU, OU, QR, OR, KA, VA, NT };
    fs_tensor t[NT] = {0};
    fs_uly_plan u = {0};
    const double scale = 1.0 / sqrt((double)c->Dh);
    const int64_t R = kv->R;
    fs_tensor *ck = &kv->k[c->kv_layer], *cv = &kv->v[c->kv_layer];
    int rc = FS_OK;
    if (p->ring > 1) return fs_errf(c->e, FS_E_INPUT, "the FLUX.2 KV cache runs under Ulysses, not ring attention");
    TRY(fs_uly_plan_make(p, &u, c->e));
    TRY(fs_seqpar_uly_to_heads(p, c->be, q, &t[QU], c->e));
    TRY(fs_seqpar_uly_to_heads(p, c->be, k, &t[KU], c->e));
    TRY(fs_seqpar_uly_to_heads(p, c->be, v, &t[VU], c->e));
    const int64_t B = t[QU].shape[0], hb = t[QU].shape[2], Dh = t[QU].shape[3];
    TRY(fs_layer_new_like(c, &t[OU], &t[QU]));
    if (kv->mode == FS_KV_EXTRACT) {
        TRY(c->be->attention(c->be, &t[OU], NULL, &t[QU], &t[KU], &t[VU], scale, c->e));
        fs_tensor_free(ck);
        fs_tensor_free(cv);
        const int64_t s4[4] = {B, R, hb, Dh};
        TRY(fs_layer_new(c, &t[QR], 4, s4));
        TRY(fs_layer_new(c, ck, 4, s4));
        TRY(fs_layer_new(c, cv, 4, s4));
        for (int w = 0; w < u.U; w++) { /* member w's reference tokens: image-stream tokens [lo, hi) ∩ [0, R) */
            const int64_t lo = p->img_lo[w], hi = p->img_hi[w] < R ? p->img_hi[w] : R, at = u.toff[w] + fs_par_txt_n(p, w);
            if (lo >= hi) continue;
            TRY(copy_rows(c, &t[QR], lo, &t[QU], at, hi - lo));
            TRY(copy_rows(c, ck, lo, &t[KU], at, hi - lo)); /* after RoPE: fs_sdpa's callers rotate first */
            TRY(copy_rows(c, cv, lo, &t[VU], at, hi - lo));
        }
        TRY(fs_layer_new_like(c, &t[OR], &t[QR]));
        TRY(c->be->attention(c->be, &t[OR], NULL, &t[QR], ck, cv, scale, c->e));
        for (int w = 0; w < u.U; w++) {
            const int64_t lo = p->img_lo[w], hi = p->img_hi[w] < R ? p->img_hi[w] : R, at = u.toff[w] + fs_par_txt_n(p, w);
            if (lo < hi) TRY(copy_rows(c, &t[OU], at, &t[OR], lo, hi - lo));
        }
    } else {
        if (!ck->data) TRY(fs_errf(c->e, FS_E_INTERNAL, "kv cache: block %d used before it was extracted", c->kv_layer));
        TRY(fs_cat_seq(c, &t[KU], ck, &t[KA]));
        TRY(fs_cat_seq(c, &t[VU], cv, &t[VA]));
        TRY(c->be->attention(c->be, &t[OU], NULL, &t[QU], &t[KA], &t[VA], scale, c->e));
    }
    TRY(fs_seqpar_uly_to_tokens(p, c->be, &t[OU], o, c->e));
out:
    fs_uly_plan_free(&u);
    fs_layer_free_all(t, NT);
    return rc;
}

/* FLUX.2's KV-cache attention (_flux2_kv_causal_attention in transformer_flux2.py), q, k, v
 * [B, S, Hl, Dh] of the joint sequence, text first. Extract: the sequence is [text, R reference,
 * image]; the reference tokens' K, V are stored in the block's cache slot, text and image
 * queries attend to every key, reference queries to the reference keys only, and the outputs
 * go back in sequence order. Cached: the sequence is [text, image] and the keys and values are
 * [text, cached reference, image]. Each query's softmax runs over the same keys in the same
 * order as diffusers' calls: the rows are the ones torch computes. Under Ulysses:
 * kv_attention_ulysses. */
static int kv_attention(fs_layer_ctx *c, fs_tensor *o, const fs_tensor *q, const fs_tensor *k, const fs_tensor *v)
{
    fs_kv_cache *kv = c->m->kv;
    enum { QT, QI, QTI, KA, VA, OTI, QR, KR, VR, OR, OT, OI, NT };
    fs_tensor t[NT] = {0};
    const double scale = 1.0 / sqrt((double)c->Dh);
    const int64_t St = c->S_txt, R = kv->R, S = q->shape[1];
    int rc = FS_OK;
    if (c->kv_layer >= kv->n) return fs_errf(c->e, FS_E_INTERNAL, "kv cache: block %d of %d", c->kv_layer, kv->n);
    if (c->par && c->par->sp > 1) return kv_attention_ulysses(c, o, q, k, v);
    fs_tensor *ck = &kv->k[c->kv_layer], *cv = &kv->v[c->kv_layer];
    if (kv->mode == FS_KV_EXTRACT) {
        fs_tensor_free(ck);
        fs_tensor_free(cv);
        TRY(fs_slice_seq(c, k, St, R, ck)); /* key[:, ref_start:ref_end].clone(), after RoPE */
        TRY(fs_slice_seq(c, v, St, R, cv));
        TRY(fs_slice_seq(c, q, 0, St, &t[QT]));
        TRY(fs_slice_seq(c, q, St + R, S - St - R, &t[QI]));
        TRY(fs_cat_seq(c, &t[QT], &t[QI], &t[QTI]));
        TRY(fs_layer_new_like(c, &t[OTI], &t[QTI]));
        TRY(c->be->attention(c->be, &t[OTI], NULL, &t[QTI], k, v, scale, c->e));
        TRY(fs_slice_seq(c, q, St, R, &t[QR]));
        TRY(fs_layer_new_like(c, &t[OR], &t[QR]));
        TRY(c->be->attention(c->be, &t[OR], NULL, &t[QR], ck, cv, scale, c->e));
        /* torch.cat([attn_txt, attn_ref, attn_img], dim=1) */
        const size_t es = fs_dtype_size(c->dt);
        const int64_t W = fs_tensor_numel(q) / (q->shape[0] * S), B = q->shape[0];
        TRY(fs_layer_copy2d(c, o->data, S * W, t[OTI].data, (S - R) * W, B, St * W));
        TRY(fs_layer_copy2d(c, (char *)o->data + (size_t)(St * W) * es, S * W, t[OR].data, R * W, B, R * W));
        TRY(fs_layer_copy2d(c, (char *)o->data + (size_t)((St + R) * W) * es, S * W,
                            (const char *)t[OTI].data + (size_t)(St * W) * es, (S - R) * W, B, (S - St - R) * W));
    } else {
        if (!ck->data) TRY(fs_errf(c->e, FS_E_INTERNAL, "kv cache: block %d used before it was extracted", c->kv_layer));
        /* torch.cat([key[:, :num_txt], k_ref, key[:, num_txt:]], dim=1), the same for value */
        TRY(fs_slice_seq(c, k, 0, St, &t[QT]));
        TRY(fs_slice_seq(c, k, St, S - St, &t[QI]));
        TRY(fs_cat_seq(c, &t[QT], ck, &t[QTI]));
        TRY(fs_cat_seq(c, &t[QTI], &t[QI], &t[KA]));
        fs_layer_free_all(t, 3);
        TRY(fs_slice_seq(c, v, 0, St, &t[QT]));
        TRY(fs_slice_seq(c, v, St, S - St, &t[QI]));
        TRY(fs_cat_seq(c, &t[QT], cv, &t[QTI]));
        TRY(fs_cat_seq(c, &t[QTI], &t[QI], &t[VA]));
        TRY(c->be->attention(c->be, o, NULL, q, &t[KA], &t[VA], scale, c->e));
    }
out:
    fs_layer_free_all(t, NT);
    return rc;
}

int fs_sdpa(fs_layer_ctx *c, const fs_tensor *q, const fs_tensor *k, const fs_tensor *v, fs_tensor *o)
{
    /* q, k may be [B,S,Hl,Dh] (after the QK norm) and v [B,S,Hl·Dh]: compare features per token */
    const int64_t B = q->shape[0], S = q->shape[1], W = fs_tensor_numel(q) / (B * S), Hl = W / c->Dh;
    const int64_t Wk = fs_tensor_numel(k) / (B * S), Wv = fs_tensor_numel(v) / (B * S);
    if (Wk != W || Wv != W)
        return fs_errf(c->e, FS_E_INPUT, "attention: q, k, v have %lld, %lld, %lld local features per token (a plan "
                                         "that splits them differently?)",
                       (long long)W, (long long)Wk, (long long)Wv);
    int64_t s4[4] = {B, S, Hl, c->Dh};
    int rc = fs_layer_new3(c, o, B, S, W);
    if (rc) return rc;
    fs_tensor q4 = fs_tensor_reshape(q, 4, s4), k4 = fs_tensor_reshape(k, 4, s4), v4 = fs_tensor_reshape(v, 4, s4);
    fs_tensor o4 = fs_tensor_reshape(o, 4, s4);
    if (c->m->kv && c->m->kv->mode != FS_KV_OFF && c->kv_layer >= 0) {
        rc = kv_attention(c, &o4, &q4, &k4, &v4);
        if (rc) fs_tensor_free(o);
        return rc;
    }
    if (c->par && c->par->sp > 1) return fs_seqpar_attention(c->par, c->be, &o4, &q4, &k4, &v4, c->e);
    return c->be->attention(c->be, &o4, NULL, &q4, &k4, &v4, 1.0 / sqrt((double)c->Dh), c->e);
}

int fs_rope_inplace(fs_layer_ctx *c, fs_tensor *x, const fs_tensor *cos_t, const fs_tensor *sin_t)
{
    /* x is [B,S,Hl,Dh] (after the QK norm) or [B,S,Hl·Dh]: heads from the features per token */
    const int64_t B = x->shape[0], S = x->shape[1], W = fs_tensor_numel(x) / (B * S);
    int64_t s4[4] = {B, S, W / c->Dh, c->Dh};
    fs_tensor x4 = fs_tensor_reshape(x, 4, s4);
    return c->be->rope(c->be, &x4, cos_t, sin_t, c->e);
}

/* ---------------------------------------------------------------- blocks */

/* norm_out = AdaLayerNormContinuous: SiLU → linear → chunk(2) = (scale, shift) — scale FIRST
 * (gotcha 8) — then LN(x)·(1 + scale) + shift; x is image tokens only (gotcha 13). */
int fs_ada_layer_norm_continuous(fs_layer_ctx *c, const fs_tensor *x, const fs_tensor *temb, fs_tensor *y)
{
    fs_tensor s = {0}, lin = {0}, ln = {0}, mod[2] = {0};
    int rc;
    TRY(fs_activation(c, c->be->silu, temb, &s, ST_REP, FS_TP_REPL, "norm_out.silu"));
    TRY(fs_linear(c, &s, "norm_out.linear", ST_REP, &lin, NULL));
    TRY(fs_chunk(c, &lin, 2, mod));
    TRY(fs_layernorm(c, x, &ln));
    TRY(REC(&ln, ST_IMG, FS_TP_REPL, "norm_out.norm"));
    TRY(fs_layer_out_like(c, y, x));
    TRY(c->be->modulate(c->be, y, &ln, &mod[0], &mod[1], c->e));
    TRY(REC(y, ST_IMG, FS_TP_REPL, "norm_out"));
out:
    fs_tensor_free(&s);
    fs_tensor_free(&lin);
    fs_tensor_free(&ln);
    fs_layer_free_all(mod, 2);
    return rc;
}

/* ---------------------------------------------------------------- forward */

/* fs_model_forward (fs_model.h): the transformer call of either family. Here, beside the layers
 * both families are built from, so that fs_model.h stays a header the families include (a
 * fs_model.c including fs_layers.h would make a cycle). */
int fs_model_forward(const fs_model *m, const fs_tensor *hidden_states, const fs_tensor *encoder_hidden_states,
                     const fs_tensor *pooled, const double *timestep, const double *guidance,
                     const fs_tensor *img_ids, const fs_tensor *txt_ids, fs_tensor *out, fs_err *e)
{
    const int nax = fs_config_axes(&m->cfg);
    if (img_ids->ndim != 2 || img_ids->shape[1] != nax || txt_ids->ndim != 2 || txt_ids->shape[1] != nax)
        return fs_errf(e, FS_E_INPUT, "position ids must have %d columns (one per RoPE axis of the config)", nax);
    if (m->cfg.family == FS_FLUX2)
        return fs_flux2_forward(m, hidden_states, encoder_hidden_states, timestep, guidance, img_ids, txt_ids, out, e);
    return fs_flux1_forward(m, hidden_states, encoder_hidden_states, pooled, timestep, guidance, img_ids, txt_ids, out, e);
}


/* ---------------------------------------------------------------- FLUX.2 KV cache */

int fs_kv_cache_init(fs_kv_cache *kv, const fs_config *c, int R, fs_err *e)
{
    memset(kv, 0, sizeof *kv);
    kv->R = R;
    kv->n = c->num_layers + c->num_single_layers;
    kv->k = calloc((size_t)(kv->n ? kv->n : 1), sizeof *kv->k);
    kv->v = calloc((size_t)(kv->n ? kv->n : 1), sizeof *kv->v);
    if (!kv->k || !kv->v) {
        fs_kv_cache_free(kv);
        return fs_errf(e, FS_E_NOMEM, "out of memory for the KV cache");
    }
    return FS_OK;
}

void fs_kv_cache_free(fs_kv_cache *kv)
{
    if (!kv) return;
    for (int i = 0; i < kv->n && kv->k; i++) fs_tensor_free(&kv->k[i]);
    for (int i = 0; i < kv->n && kv->v; i++) fs_tensor_free(&kv->v[i]);
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}
