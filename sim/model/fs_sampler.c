#include "fs_sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_rng.h"

void fs_inputs_match_bf16(fs_inputs *in)
{
    for (int i = 0; i < in->n_steps; i++) {
        double *t = &((double *)in->timesteps.data)[i];
        *t = fs_bf16_embedded(*t) / 1000.0;
    }
    for (int b = 0; in->has_guidance && b < in->B; b++) {
        double *g = &((double *)in->guidance.data)[b];
        *g = fs_bf16_embedded(*g) / 1000.0;
    }
}

static int fill_normal(fs_tensor *t, uint64_t seed, const char *name)
{
    uint64_t key = fs_rng_key(seed, name);
    int64_t n = fs_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) fs_tensor_set(t, i, fs_rng_normal(key, (uint64_t)i));
    return FS_OK;
}

int64_t fs_gen_ref_tokens(const fs_gen_params *p)
{
    int64_t R = 0;
    for (int i = 0; i < p->n_ref; i++) R += (int64_t)p->ref_h[i] * p->ref_w[i];
    return R;
}

int fs_inputs_generate(fs_inputs *in, const fs_config *c, fs_dtype dt, const fs_gen_params *p, fs_err *e)
{
    memset(in, 0, sizeof *in);
    if (p->batch < 1 || p->grid_h < 1 || p->grid_w < 1 || p->txt_len < 1 || p->steps < 1)
        return fs_errf(e, FS_E_INPUT, "batch, image grid, text length and steps must all be >= 1 (got %d, %dx%d, %d, %d)",
                       p->batch, p->grid_h, p->grid_w, p->txt_len, p->steps);
    int rc = fs_inputs_alloc(in, c, dt, p->batch, p->grid_h * p->grid_w, p->txt_len, p->steps, c->guidance_embeds, e);
    if (rc) return rc;
    fill_normal(&in->hidden_states, p->seed, "inputs.hidden_states");
    fill_normal(&in->encoder_hidden_states, p->seed, "inputs.encoder_hidden_states");
    if (in->pooled_projections.ndim) fill_normal(&in->pooled_projections, p->seed, "inputs.pooled_projections");
    /* FluxPipeline._prepare_latent_image_ids: (0, row, col), row-major over the token grid, not
     * centred; Flux2Pipeline._prepare_latent_ids: (t=0, row, col, l=0). Text: FLUX.1's ids are all
     * zero, Flux2Pipeline._prepare_text_ids gives token l the position (0, 0, 0, l). */
    const int nax = fs_config_axes(c);
    for (int r = 0; r < p->grid_h; r++)
        for (int col = 0; col < p->grid_w; col++) {
            double *id = (double *)in->img_ids.data + (size_t)(r * p->grid_w + col) * nax;
            id[0] = 0;
            id[1] = r;
            id[2] = col;
        }
    if (c->family == FS_FLUX2)
        for (int l = 0; l < p->txt_len; l++) ((double *)in->txt_ids.data)[(size_t)l * nax + nax - 1] = l;
    for (int b = 0; in->has_guidance && b < p->batch; b++) ((double *)in->guidance.data)[b] = p->guidance;
    if (p->true_cfg_scale > 0) { /* the negative prompt: another draw, ids as the prompt's */
        const int Sn = p->neg_txt_len > 0 ? p->neg_txt_len : p->txt_len;
        if ((rc = fs_inputs_alloc_negative(in, c, dt, Sn, p->true_cfg_scale, e))) goto fail;
        fill_normal(&in->negative_encoder_hidden_states, p->seed, "inputs.negative_encoder_hidden_states");
        if (in->negative_pooled_projections.ndim)
            fill_normal(&in->negative_pooled_projections, p->seed, "inputs.negative_pooled_projections");
        if (c->family == FS_FLUX2)
            for (int l = 0; l < Sn; l++) ((double *)in->negative_txt_ids.data)[(size_t)l * nax + nax - 1] = l;
    }
    if (p->n_ref > 0) { /* image i's tokens after image i-1's, at t = scale + scale·i, scale 10 */
        const int64_t R = fs_gen_ref_tokens(p);
        if ((rc = fs_inputs_alloc_ref(in, c, dt, (int)R, e))) goto fail;
        fill_normal(&in->image_latents, p->seed, "inputs.image_latents");
        double *id = (double *)in->image_latent_ids.data;
        for (int i = 0; i < p->n_ref; i++)
            for (int r = 0; r < p->ref_h[i]; r++)
                for (int col = 0; col < p->ref_w[i]; col++, id += nax) id[0] = 10 + 10 * i, id[1] = r, id[2] = col;
    }
    if ((rc = fs_sched_sigmas(&p->sched, p->steps, in->S_img, dt, in->sigmas.data, in->timesteps.data, e))) goto fail;
    return FS_OK;
fail:
    fs_inputs_free(in);
    return rc;
}

/* latents += (σ_next − σ)·v, as scheduler.step does it: dt = float(σ_next) − float(σ) in float32
 * for fp32 (and bf16) runs, float64 for fp64; the update itself is the backend's axpby in the
 * latents' dtype. */
static int euler_update(fs_backend *be, fs_tensor *lat, const fs_tensor *v, double sigma, double sigma_next, fs_err *e)
{
    const double dt = lat->dtype == FS_F64 ? sigma_next - sigma : (double)((float)sigma_next - (float)sigma);
    return be->axpby(be, lat, 1.0, v, dt, e);
}

/* Tokens [lo, hi) of a host [B, S, W] input into a new [B, hi-lo, W] tensor in backend memory:
 * one 2-D upload (a row per batch). */
static int upload_tokens(fs_backend *be, fs_dtype dt, const fs_tensor *x, int64_t lo, int64_t hi, fs_tensor *y, fs_err *e)
{
    int64_t shape[FS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[1] = hi - lo;
    int rc = fs_tensor_alloc_on(y, be, dt, x->ndim, shape, e);
    if (rc) return rc;
    const int64_t B = x->shape[0], S = x->shape[1], W = fs_tensor_numel(x) / (B * (S ? S : 1));
    const size_t es = fs_dtype_size(dt), wb = (size_t)((hi - lo) * W) * es;
    if (x->dtype != dt) rc = fs_errf(e, FS_E_INTERNAL, "inputs are %s, the run %s", fs_dtype_name(x->dtype), fs_dtype_name(dt));
    else if (wb) rc = be->upload2d(be, y->data, wb, (const char *)x->data + (size_t)(lo * W) * es, (size_t)(S * W) * es, wb,
                                   (size_t)B, e);
    if (rc) fs_tensor_free(y);
    return rc;
}

/* Rows [lo, hi) of a host [S, A] ids tensor (host: ids feed the RoPE tables computed on the host). */
static int slice_ids(const fs_tensor *ids, int64_t lo, int64_t hi, fs_tensor *y, fs_err *e)
{
    const int64_t A = ids->shape[1];
    int rc = fs_tensor_alloc2(y, FS_F64, hi - lo, A, e);
    if (!rc && hi > lo) memcpy(y->data, (const double *)ids->data + lo * A, (size_t)((hi - lo) * A) * sizeof(double));
    return rc;
}

/* ---- true CFG: the second call's records ----
 * The pipelines' forward hooks see every module of the negative call as that module's next call
 * in the step, and a dump names call k `name@k` (`name#j` tuple elements after it: `pos_embed@3#0`).
 * This recorder passes the first call's names through, counting the calls of each module, and
 * renames the second call's: `name@k#j` → `name@(k + calls in the first)#j`. */
typedef struct cfg_names {
    fs_recorder inner;
    int pass; /* 0: the prompt's call, 1: the negative prompt's */
    int n, cap;
    char (*base)[192];
    int *calls;
} cfg_names;

static void split_name(const char *name, char *base, size_t bn, int *k, const char **tuple)
{
    const char *hash = strchr(name, '#'), *end = hash ? hash : name + strlen(name), *at = NULL;
    for (const char *p = name; p < end; p++)
        if (*p == '@') at = p;
    *k = at ? atoi(at + 1) : 0;
    snprintf(base, bn, "%.*s", (int)((at ? at : end) - name), name);
    *tuple = hash ? hash : "";
}

static int cfg_record(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e)
{
    cfg_names *c = ctx;
    char base[192], renamed[256];
    int k, i;
    const char *tuple;
    split_name(name, base, sizeof base, &k, &tuple);
    for (i = 0; i < c->n && strcmp(c->base[i], base); i++) {}
    if (c->pass == 0) {
        if (i == c->n) {
            if (c->n == c->cap) {
                int cap = c->cap ? 2 * c->cap : 256;
                char(*nb)[192] = realloc(c->base, (size_t)cap * sizeof *nb);
                if (nb) c->base = nb;
                int *nc = realloc(c->calls, (size_t)cap * sizeof *nc);
                if (nc) c->calls = nc;
                if (!nb || !nc) return fs_errf(e, FS_E_NOMEM, "out of memory");
                c->cap = cap;
            }
            snprintf(c->base[c->n], sizeof c->base[0], "%s", base);
            c->calls[c->n++] = 0;
        }
        if (k + 1 > c->calls[i]) c->calls[i] = k + 1;
        return c->inner.fn(c->inner.ctx, name, t, sh, e);
    }
    snprintf(renamed, sizeof renamed, "%s@%d%s", base, k + (i < c->n ? c->calls[i] : 0), tuple);
    return c->inner.fn(c->inner.ctx, renamed, t, sh, e);
}

/* ---- --cfg-parallel: the two calls on two rank groups ----
 * Group 0 runs the prompt's call while group 1 runs the negative prompt's (xDiT's and sglang's
 * CFG parallel). A recorder is collective over the world (every module output is assembled on
 * rank 0, or written to a parallel dump), so each rank keeps its call's records (host copies)
 * and, after the noise predictions are exchanged, the records are replayed in the sequential
 * order: the prompt's call, then the negative prompt's, renamed `name@k` as cfg_record names
 * them. In each replay the group that ran the call holds the pieces; the other group takes part
 * holding empty ones (same shape with the sharded axes of length 0), so the gather, the dump's
 * sharding map and --check's rank attribution name the ranks that computed the tensor. A tensor
 * replicated inside its group is then split along axis 0 across the world: [0, B) on the group
 * that ran it, [0, 0) on the other one. */
typedef struct cfg_entry {
    char name[192];
    fs_tensor t; /* host copy */
    fs_shard sh;
} cfg_entry;

typedef struct cfg_buffer {
    cfg_entry *v;
    int n, cap;
} cfg_buffer;

static void cfg_buffer_clear(cfg_buffer *b)
{
    for (int i = 0; i < b->n; i++) fs_tensor_free(&b->v[i].t);
    b->n = 0;
}

static int cfg_buffer_record(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e)
{
    cfg_buffer *b = ctx;
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 256;
        cfg_entry *nv = realloc(b->v, (size_t)cap * sizeof *nv);
        if (!nv) return fs_errf(e, FS_E_NOMEM, "--cfg-parallel: out of memory keeping %s for the record", name);
        b->v = nv;
        b->cap = cap;
    }
    cfg_entry *c = &b->v[b->n];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    if (sh) c->sh = *sh;
    int rc = fs_tensor_alloc(&c->t, t->dtype, t->ndim, t->shape, e);
    if (!rc) rc = fs_tensor_download(&c->t, t, e);
    if (rc) {
        fs_tensor_free(&c->t);
        return rc;
    }
    b->n++;
    return FS_OK;
}

typedef struct cfg_header {
    char name[192];
    int32_t dtype, ndim;
    int64_t shape[FS_MAX_DIMS];
    fs_shard sh;
} cfg_header;

/* Replays call `pass`'s records (held by CFG rank `pass`) into `out`, collectively over the
 * world: every rank calls `out` with the same names in the same order. */
static int cfg_replay(const fs_par *p, cfg_buffer *b, int pass, fs_recorder out, fs_err *e)
{
    const int holder = p->cfg_rank == pass;
    int n = holder ? b->n : 0, rc = FS_OK;
    fs_bcast(&p->g_cfg, pass, &n, sizeof n);
    for (int i = 0; i < n && !rc; i++) {
        cfg_header h;
        memset(&h, 0, sizeof h);
        if (holder) {
            const cfg_entry *c = &b->v[i];
            snprintf(h.name, sizeof h.name, "%s", c->name);
            h.dtype = (int32_t)c->t.dtype;
            h.ndim = c->t.ndim;
            memcpy(h.shape, c->t.shape, sizeof h.shape);
            h.sh = c->sh;
            if (h.sh.ndims == 0) /* replicated in the group: axis 0 whole here, empty on the other group */
                h.sh = (fs_shard){.ndims = 1, .d = {{.dim = 0, .n = 1, .iv = {{0, h.shape[0]}}}}};
        }
        fs_bcast(&p->g_cfg, pass, &h, sizeof h);
        fs_tensor empty = {0};
        const fs_tensor *t = holder ? &b->v[i].t : &empty;
        if (!holder) { /* the partner's piece, every sharded axis of length 0 */
            for (int k = 0; k < h.sh.ndims; k++) {
                h.shape[h.sh.d[k].dim] = 0;
                h.sh.d[k].n = 1;
                h.sh.d[k].iv[0][0] = h.sh.d[k].iv[0][1] = 0;
            }
            rc = fs_tensor_alloc(&empty, (fs_dtype)h.dtype, h.ndim, h.shape, e);
        }
        /* a failed allocation of an empty tensor: the others are already in the collective record */
        if (!rc) rc = out.fn(out.ctx, h.name, t, &h.sh, e);
        fs_tensor_free(&empty);
    }
    return rc;
}

/* The noise predictions of both calls on every rank of the CFG group: an all-gather over g_cfg
 * (this rank's [B, n_q, C] piece from each group) into [2B, n_q, C], rows [0, B) the prompt's. */
static int cfg_exchange(const fs_par *p, fs_backend *be, const fs_tensor *mine, fs_tensor *both, fs_err *e)
{
    int64_t shape[FS_MAX_DIMS], cnt[2], dsp[2];
    memcpy(shape, mine->shape, sizeof shape);
    shape[0] *= 2;
    cnt[0] = cnt[1] = fs_tensor_numel(mine);
    dsp[0] = 0;
    dsp[1] = cnt[0];
    int rc = fs_tensor_alloc_on(both, be, mine->dtype, mine->ndim, shape, e);
    if (!rc) rc = fs_allgatherv_t(&p->g_cfg, mine, both, cnt, dsp, e);
    if (rc) fs_tensor_free(both);
    return rc;
}

/* Local [B, hi_q - lo_q, C] token blocks of the SP group → global [B, S, C] on every rank (block q
 * at tokens [lo_q, hi_q)). */
static int gather_tokens(const fs_par *p, fs_backend *be, const fs_tensor *local, const int64_t *lo, const int64_t *hi,
                         int64_t S, fs_tensor *global, fs_err *e)
{
    const int64_t B = local->shape[0], C = local->shape[2];
    const size_t es = fs_dtype_size(local->dtype);
    int64_t shape[3] = {B, S, C};
    fs_tensor tmp = {0};
    int64_t *cnt = malloc(sizeof(int64_t) * 2 * (size_t)p->sp), *dsp = cnt ? cnt + p->sp : NULL, off = 0;
    if (!cnt) return fs_errf(e, FS_E_NOMEM, "out of memory");
    for (int q = 0; q < p->sp; q++) {
        cnt[q] = B * (hi[q] - lo[q]) * C;
        dsp[q] = off;
        off += cnt[q];
    }
    int rc;
    if ((rc = fs_tensor_alloc_on(global, be, local->dtype, 3, shape, e)) ||
        (rc = fs_tensor_alloc_on(&tmp, be, local->dtype, 3, shape, e)) ||
        (rc = fs_allgatherv_t(&p->g_sp, local, &tmp, cnt, dsp, e)))
        goto out;
    for (int q = 0; q < p->sp; q++) { /* block q is [B, n_q, C]: batch b's rows go to lo[q] */
        const size_t w = (size_t)((hi[q] - lo[q]) * C) * es;
        if ((rc = be->copy2d(be, (char *)global->data + (size_t)(lo[q] * C) * es, (size_t)(S * C) * es,
                             (const char *)tmp.data + (size_t)dsp[q] * es, w, w, (size_t)B, e)))
            goto out;
    }
out:
    fs_tensor_free(&tmp);
    free(cnt);
    if (rc) fs_tensor_free(global);
    return rc;
}

/* One step's two calls under --cfg-parallel: this rank's call (group 0 the prompt's, group 1 the
 * negative prompt's), the noise predictions all-gathered over the CFG group, the records replayed
 * in the sequential order, and v = v_neg + scale·(v − v_neg) computed on every rank by the same
 * ops as the sequential run, so every rank holds the same bits. */
static int cfg_parallel_step(const fs_model *ms, const fs_par *p, const fs_inputs *in, const fs_tensor *lat,
                             const fs_tensor *ehs, const fs_tensor *pooled, const fs_tensor *tid, const fs_tensor *nehs,
                             const fs_tensor *npooled, const fs_tensor *ntid, const double *ts, const double *g,
                             const fs_tensor *iid, cfg_names *names, cfg_buffer *kept, fs_tensor *v, fs_err *e)
{
    fs_model mm = *ms;
    const int uncond = p->cfg_rank == 1;
    /* --inject cfg-uncond-sees-cond (vllm-omni#3646): the uncond group reuses the condition's
     * cached text states (its K/V source) instead of the negative prompt's */
    const int leak = uncond && fs_injected(p->inject, FS_INJ_CFG_UNCOND_SEES_COND);
    if (leak) fs_inject_fire(FS_INJ_CFG_UNCOND_SEES_COND);
    const fs_recorder world = ms->rec; /* cfg_record over the sink, or nothing */
    if (world.fn) mm.rec = (fs_recorder){.fn = cfg_buffer_record, .ctx = kept};
    fs_tensor mine = {0}, both = {0};
    int rc = fs_model_forward(&mm, lat, uncond && !leak ? nehs : ehs, uncond ? npooled : pooled, ts, g, iid,
                              uncond && !leak ? ntid : tid, &mine, e);
    /* a rank whose call failed leaves now: its group may be inside one of the call's collectives,
     * so agreeing here could hang; the job ends it (fs_job_must_abort), as a failure mid-loop does
     * without CFG parallel */
    if (!rc) rc = cfg_exchange(p, ms->be, &mine, &both, e);
    fs_tensor_free(&mine);
    if (!rc && world.fn) {
        names->pass = 0;
        if (!(rc = cfg_replay(p, kept, 0, world, e))) {
            names->pass = 1;
            rc = cfg_replay(p, kept, 1, world, e);
        }
    }
    cfg_buffer_clear(kept);
    if (rc) {
        fs_tensor_free(&both);
        return rc;
    }
    const int64_t B = both.shape[0] / 2;
    fs_tensor vc = fs_tensor_rows(&both, 0, B), vn = fs_tensor_rows(&both, B, B);
    if (!(rc = fs_tensor_alloc_on(v, ms->be, vc.dtype, vc.ndim, vc.shape, e)) &&
        !(rc = ms->be->copy2d(ms->be, v->data, fs_tensor_nbytes(&vc), vc.data, fs_tensor_nbytes(&vc),
                              fs_tensor_nbytes(&vc), 1, e)) &&
        !(rc = ms->be->axpby(ms->be, v, 1.0, &vn, -1.0, e)))
        rc = ms->be->axpby(ms->be, v, in->true_cfg_scale, &vn, 1.0, e);
    fs_tensor_free(&both);
    if (rc) fs_tensor_free(v);
    return rc;
}

/* --cfg-batched: the two calls of true CFG as one forward of batch 2B — rows [0, B) the prompt's,
 * [B, 2B) the negative prompt's — as diffusers' classic CFG and xDiT's batched CFG run them, so
 * every GEMM has twice the rows (B16, xDiT#510: the GEMM may pick another kernel for another M).
 * The records are split back into the two calls' names in the sequential order (the prompt's
 * halves as they come, the negative prompt's kept and renamed after the forward), so the run
 * compares tensor by tensor with the sequential and the CFG-parallel runs. */
typedef struct cfg_split {
    fs_recorder first; /* cfg_record, pass 0 */
    cfg_buffer *kept;  /* the negative prompt's halves */
    int64_t B;
} cfg_split;

static int cfg_split_record(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e)
{
    cfg_split *c = ctx;
    if (!strncmp(name, "pos_embed", 9)) { /* RoPE tables [S, Dh]: no batch axis, the same ids for both */
        int rc = c->first.fn(c->first.ctx, name, t, sh, e);
        return rc ? rc : cfg_buffer_record(c->kept, name, t, sh, e);
    }
    if (t->ndim < 1 || t->shape[0] != 2 * c->B)
        return fs_errf(e, FS_E_INTERNAL, "--cfg-batched: %s has %lld rows on its first axis, not the batch 2 x %lld", name,
                       (long long)(t->ndim ? t->shape[0] : 0), (long long)c->B);
    fs_tensor a = fs_tensor_rows(t, 0, c->B), b = fs_tensor_rows(t, c->B, c->B);
    int rc = c->first.fn(c->first.ctx, name, &a, sh, e);
    return rc ? rc : cfg_buffer_record(c->kept, name, &b, sh, e);
}

/* dst rows [0, B) = x, [B, 2B) = y: the batch of both calls, in backend memory. */
static int cat_batch(fs_backend *be, const fs_tensor *x, const fs_tensor *y, fs_tensor *dst, fs_err *e)
{
    int64_t shape[FS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[0] *= 2;
    const size_t n = fs_tensor_nbytes(x);
    int rc = fs_tensor_nbytes(y) == n ? FS_OK
                                      : fs_errf(e, FS_E_INPUT, "--cfg-batched needs a negative prompt shaped like the prompt");
    if (!rc) rc = fs_tensor_alloc_on(dst, be, x->dtype, x->ndim, shape, e);
    if (!rc && n && !(rc = be->copy2d(be, dst->data, n, x->data, n, n, 1, e)))
        rc = be->copy2d(be, (char *)dst->data + n, n, y->data, n, n, 1, e);
    return rc;
}

static int cfg_batched_step(const fs_model *ms, const fs_inputs *in, const fs_tensor *lat, const fs_tensor *ehs,
                            const fs_tensor *pooled, const fs_tensor *tid, const fs_tensor *nehs, const fs_tensor *npooled,
                            const fs_tensor *ntid, const double *ts, const double *g, const fs_tensor *iid,
                            cfg_names *names, cfg_buffer *kept, fs_tensor *v, fs_err *e)
{
    fs_backend *be = ms->be;
    const int64_t B = lat->shape[0];
    fs_tensor lat2 = {0}, ehs2 = {0}, pooled2 = {0}, v2 = {0};
    double *ts2 = malloc(sizeof(double) * 4 * (size_t)B), *g2 = ts2 ? ts2 + 2 * B : NULL;
    int rc = ts2 ? FS_OK : fs_errf(e, FS_E_NOMEM, "out of memory");
    /* one set of text ids serves both halves: the prompts' ids must be the same */
    if (!rc && (fs_tensor_nbytes(tid) != fs_tensor_nbytes(ntid) || memcmp(tid->data, ntid->data, fs_tensor_nbytes(tid))))
        rc = fs_errf(e, FS_E_INPUT, "--cfg-batched batches the prompt and the negative prompt into one forward: they need "
                                    "the same text length (%lld vs %lld tokens) and ids",
                     (long long)tid->shape[0], (long long)ntid->shape[0]);
    if (!rc && !(rc = cat_batch(be, lat, lat, &lat2, e)) && !(rc = cat_batch(be, ehs, nehs, &ehs2, e)) && pooled->ndim)
        rc = cat_batch(be, pooled, npooled, &pooled2, e);
    if (!rc) {
        for (int64_t b = 0; b < 2 * B; b++) {
            ts2[b] = ts[b % B];
            if (g) g2[b] = g[b % B];
        }
        fs_model mm = *ms;
        cfg_split split = {.first = ms->rec, .kept = kept, .B = B};
        if (ms->rec.fn) mm.rec = (fs_recorder){.fn = cfg_split_record, .ctx = &split};
        rc = fs_model_forward(&mm, &lat2, &ehs2, &pooled2, ts2, g ? g2 : NULL, iid, tid, &v2, e);
    }
    for (int i = 0; !rc && ms->rec.fn && i < kept->n; i++) { /* the negative prompt's records, renamed */
        names->pass = 1;
        rc = ms->rec.fn(ms->rec.ctx, kept->v[i].name, &kept->v[i].t, &kept->v[i].sh, e);
    }
    cfg_buffer_clear(kept);
    if (!rc) {
        fs_tensor vc = fs_tensor_rows(&v2, 0, B), vn = fs_tensor_rows(&v2, B, B);
        const size_t n = fs_tensor_nbytes(&vc);
        if (!(rc = fs_tensor_alloc_on(v, be, vc.dtype, vc.ndim, vc.shape, e)) &&
            !(rc = be->copy2d(be, v->data, n, vc.data, n, n, 1, e)) && !(rc = be->axpby(be, v, 1.0, &vn, -1.0, e)))
            rc = be->axpby(be, v, in->true_cfg_scale, &vn, 1.0, e);
        if (rc) fs_tensor_free(v);
    }
    free(ts2);
    fs_tensor_free(&lat2);
    fs_tensor_free(&ehs2);
    fs_tensor_free(&pooled2);
    fs_tensor_free(&v2);
    return rc;
}

int fs_sample(const fs_model *m, const fs_inputs *in, const fs_step_hooks *hooks, fs_tensor *latents, fs_err *e)
{
    static const fs_step_hooks none = {0};
    if (!hooks) hooks = &none;
    const fs_par *p = m->par;
    const int split = p && p->sp > 1;
    fs_backend *be = m->be;
    fs_tensor lat = {0}, ehs = {0}, pooled = {0}, iid = {0}, tid = {0}, nehs = {0}, npooled = {0}, ntid = {0};
    fs_tensor rlat = {0}, rnoise = {0}, rid = {0}; /* KV cache: step 0's reference and noise rows, their ids */
    fs_kv_cache kv = {0};
    fs_par par0 = {0};
    cfg_names names = {.inner = m->rec};
    cfg_buffer kept = {0};
    const int cfg = in->true_cfg_scale > 0;
    const int cfgpar = cfg && p && p->cfg_par > 1; /* --cfg-parallel: this rank runs one of the two calls */
    const int cfgbat = cfg && !cfgpar && m->cfg_batched; /* --cfg-batched: both calls in one forward */
    double *ts = NULL;
    int rc;
    memset(latents, 0, sizeof *latents);
    fs_shard img_shard = {0};
    /* this rank's tokens, uploaded; ids stay global positions (RoPE needs them) */
    const int q = split ? p->sp_rank : 0;
    const int64_t ilo = split ? p->img_lo[q] : 0, ihi = split ? p->img_hi[q] : in->S_img;
    const int64_t tlo = split ? p->txt_lo[q] : 0, thi = split ? p->txt_hi[q] : in->S_txt;
    /* --inject rope-local-pos: each rank builds the ids of its chunk from 0, as if it held the
     * start of the sequence (local positions instead of global ones) */
    const int local_pos = split && fs_injected(p->inject, FS_INJ_ROPE_LOCAL_POS);
    /* --inject txt-ids-local (diffusers#12737): the text ids are not split with the text; the rank
     * rotates its text tokens with the ids at the start of the text */
    const int txt_local = local_pos || (split && fs_injected(p->inject, FS_INJ_TXT_IDS_LOCAL));
    if ((rc = upload_tokens(be, m->dtype, &in->hidden_states, ilo, ihi, &lat, e)) ||
        (rc = upload_tokens(be, m->dtype, &in->encoder_hidden_states, tlo, thi, &ehs, e)) ||
        (in->pooled_projections.ndim && /* FLUX.2: none */
         ((rc = fs_tensor_alloc_on(&pooled, be, m->dtype, in->pooled_projections.ndim, in->pooled_projections.shape, e)) ||
          (rc = fs_tensor_upload(&pooled, &in->pooled_projections, e)))) ||
        (rc = slice_ids(&in->img_ids, local_pos ? 0 : ilo, (local_pos ? 0 : ilo) + (ihi - ilo), &iid, e)) ||
        (rc = slice_ids(&in->txt_ids, txt_local ? 0 : tlo, (txt_local ? 0 : tlo) + (thi - tlo), &tid, e)))
        goto out;
    /* true CFG: the negative prompt, split like the prompt (the partition knows one text length) */
    if (cfg && split && in->S_neg != in->S_txt) {
        rc = fs_errf(e, FS_E_INPUT, "true CFG under sequence parallelism needs a negative prompt as long as the prompt "
                                    "(%d vs %d text tokens)", in->S_neg, in->S_txt);
        goto out;
    }
    /* one rank: the whole negative prompt, whatever its length; split: the prompt's range */
    const int64_t nlo = split ? tlo : 0, nhi = split ? thi : in->S_neg;
    if (cfg && ((rc = upload_tokens(be, m->dtype, &in->negative_encoder_hidden_states, nlo, nhi, &nehs, e)) ||
                (in->negative_pooled_projections.ndim &&
                 ((rc = fs_tensor_alloc_on(&npooled, be, m->dtype, in->negative_pooled_projections.ndim,
                                           in->negative_pooled_projections.shape, e)) ||
                  (rc = fs_tensor_upload(&npooled, &in->negative_pooled_projections, e)))) ||
                (rc = slice_ids(&in->negative_txt_ids, txt_local ? 0 : nlo, (txt_local ? 0 : nlo) + (nhi - nlo), &ntid, e))))
        goto out;
    /* FLUX.2 reference images (Flux2KleinKVPipeline): step 0 extracts the KV cache from
     * [reference; noise], the later steps use it */
    /* Under Ulysses step 0's image stream, [reference; noise], is partitioned on its own (par0):
     * rank q computes its tokens [lo', hi') of it, and the velocities of its noise tokens are
     * gathered and re-split to the noise's partition after the call. */
    const int64_t R = in->S_ref;
    if (R > 0) {
        if (m->cfg.family != FS_FLUX2 || cfg || (split && p->ring > 1)) {
            rc = fs_errf(e, FS_E_INPUT, "reference images (the KV cache) run on FLUX.2, on one rank, under TP or Ulysses, "
                                        "without true CFG");
            goto out;
        }
        if (split) {
            par0 = *p;
            par0.txt_lo = NULL; /* fs_par_set_seq allocates par0's own partition */
            if ((rc = fs_par_set_seq(&par0, in->S_txt, (int)(R + in->S_img), e))) goto out;
            if (par0.img_hi[0] <= R) {
                rc = fs_errf(e, FS_E_INPUT, "reference images under --ulysses %d: sequence-parallel rank 0 would hold only "
                                            "reference tokens at step 0 (%lld of %lld + %d image tokens); use fewer ranks or "
                                            "a smaller reference",
                             p->ulysses, (long long)par0.img_hi[0], (long long)R, in->S_img);
                goto out;
            }
        }
        const int64_t A = in->img_ids.shape[1], lo0 = split ? par0.img_lo[q] : 0, hi0 = split ? par0.img_hi[q] : R + in->S_img;
        fs_tensor all = {0};
        if ((rc = fs_tensor_alloc2(&all, FS_F64, R + in->S_img, A, e))) goto out;
        memcpy(all.data, in->image_latent_ids.data, (size_t)(R * A) * sizeof(double));
        memcpy((double *)all.data + R * A, in->img_ids.data, (size_t)(in->S_img * A) * sizeof(double));
        rc = slice_ids(&all, lo0, hi0, &rid, e);
        fs_tensor_free(&all);
        /* this rank's step-0 image stream: reference rows [lo0, min(hi0, R)), noise rows after */
        if (rc || (lo0 < R && (rc = upload_tokens(be, m->dtype, &in->image_latents, lo0, hi0 < R ? hi0 : R, &rlat, e))) ||
            (hi0 > R && (rc = upload_tokens(be, m->dtype, &in->hidden_states, lo0 > R ? lo0 - R : 0, hi0 - R, &rnoise, e))) ||
            (rc = fs_kv_cache_init(&kv, &m->cfg, (int)R, e)))
            goto out;
    }
    if (split) img_shard = (fs_shard){.ndims = 1, .d = {{.dim = 1, .n = 1, .iv = {{ilo, ihi}}}}};
    if (!(ts = malloc(sizeof(double) * (size_t)in->B))) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < in->n_steps; i++) {
        const double sigma = ((double *)in->sigmas.data)[i], sigma_next = ((double *)in->sigmas.data)[i + 1];
        const double t = ((double *)in->timesteps.data)[i];
        for (int b = 0; b < in->B; b++) ts[b] = t; /* timestep.expand(B) */
        fs_tensor v = {0};
        if (hooks->begin_step && (rc = hooks->begin_step(hooks->ctx, i, t, sigma, sigma_next, e))) break;
        if (m->rec.fn && (rc = m->rec.fn(m->rec.ctx, "latents_in", &lat, &img_shard, e))) break;
        fs_model ms = *m;
        ms.step = i;
        if (cfg && m->rec.fn) { /* count the first call's module calls, rename the second's */
            names.pass = 0;
            names.n = 0;
            ms.rec = (fs_recorder){.fn = cfg_record, .ctx = &names};
        }
        const double *g = in->has_guidance ? in->guidance.data : NULL;
        if (R > 0) { /* torch.cat([image_latents, latents], dim=1) at step 0 */
            fs_tensor hs = {0};
            kv.mode = i == 0 ? FS_KV_EXTRACT : FS_KV_CACHED;
            ms.kv = &kv;
            if (i == 0) { /* step 0's latents are the inputs' noise: this rank's rows of [reference; noise] */
                const int64_t B = lat.shape[0], C = lat.shape[2], nr = rlat.ndim ? rlat.shape[1] : 0,
                              nn = rnoise.ndim ? rnoise.shape[1] : 0;
                const size_t es = fs_dtype_size(m->dtype), ld = (size_t)((nr + nn) * C) * es;
                if (split) ms.par = &par0;
                if (!(rc = fs_tensor_alloc_on(&hs, be, m->dtype, 3, (int64_t[]){B, nr + nn, C}, e)) &&
                    !(nr && (rc = be->copy2d(be, hs.data, ld, rlat.data, (size_t)(nr * C) * es, (size_t)(nr * C) * es,
                                             (size_t)B, e))) &&
                    !(nn && (rc = be->copy2d(be, (char *)hs.data + (size_t)(nr * C) * es, ld, rnoise.data,
                                             (size_t)(nn * C) * es, (size_t)(nn * C) * es, (size_t)B, e))))
                    rc = fs_model_forward(&ms, &hs, &ehs, &pooled, ts, g, &rid, &tid, &v, e);
                fs_tensor_free(&hs);
                if (!rc && split) { /* v of the noise rows [max(lo', R), hi') - R → the noise's partition */
                    int64_t *lo = malloc(sizeof(int64_t) * 2 * (size_t)p->sp), *hi = lo ? lo + p->sp : NULL;
                    fs_tensor vg = {0};
                    if (!lo) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                    for (int w = 0; !rc && w < p->sp; w++) {
                        lo[w] = (par0.img_lo[w] > R ? par0.img_lo[w] : R) - R;
                        hi[w] = par0.img_hi[w] - R;
                    }
                    if (!rc && !(rc = gather_tokens(p, be, &v, lo, hi, in->S_img, &vg, e))) {
                        fs_tensor_free(&v);
                        if (!(rc = fs_tensor_alloc_on(&v, be, m->dtype, 3, (int64_t[]){B, ihi - ilo, C}, e)))
                            rc = be->copy2d(be, v.data, (size_t)((ihi - ilo) * C) * es,
                                            (const char *)vg.data + (size_t)(ilo * C) * es, (size_t)(in->S_img * C) * es,
                                            (size_t)((ihi - ilo) * C) * es, (size_t)B, e);
                    }
                    fs_tensor_free(&vg);
                    free(lo);
                }
            } else
                rc = fs_model_forward(&ms, &lat, &ehs, &pooled, ts, g, &iid, &tid, &v, e);
        } else if (cfgpar)
            rc = cfg_parallel_step(&ms, p, in, &lat, &ehs, &pooled, &tid, &nehs, &npooled, &ntid, ts, g, &iid, &names,
                                   &kept, &v, e);
        else if (cfgbat)
            rc = cfg_batched_step(&ms, in, &lat, &ehs, &pooled, &tid, &nehs, &npooled, &ntid, ts, g, &iid, &names, &kept,
                                  &v, e);
        else
            rc = fs_model_forward(&ms, &lat, &ehs, &pooled, ts, g, &iid, &tid, &v, e);
        if (!rc && cfg && !cfgpar && !cfgbat) { /* v = v_neg + scale·(v − v_neg): the pipeline's ops, rounded as they are */
            fs_tensor vn = {0};
            names.pass = 1;
            if (!(rc = fs_model_forward(&ms, &lat, &nehs, &npooled, ts, g, &iid, &ntid, &vn, e)) &&
                !(rc = be->axpby(be, &v, 1.0, &vn, -1.0, e)))
                rc = be->axpby(be, &v, in->true_cfg_scale, &vn, 1.0, e);
            fs_tensor_free(&vn);
            if (rc) fs_tensor_free(&v);
        }
        if (rc) {
            fs_err_prefix(e, "step %d: ", i);
            break;
        }
        rc = euler_update(be, &lat, &v, sigma, sigma_next, e);
        fs_tensor_free(&v);
        if (rc) break;
        if (m->rec.fn && (rc = m->rec.fn(m->rec.ctx, "latents_out", &lat, &img_shard, e))) break;
        if (hooks->end_step && (rc = hooks->end_step(hooks->ctx, i, e))) break;
    }
    if (!rc) {
        if (split) rc = gather_tokens(p, be, &lat, p->img_lo, p->img_hi, p->S_img, latents, e);
        else {
            *latents = lat;
            lat = (fs_tensor){0};
        }
    }
out:
    cfg_buffer_clear(&kept);
    free(kept.v);
    fs_kv_cache_free(&kv);
    free(par0.txt_lo); /* par0's partition; its groups are p's */
    fs_tensor_free(&rnoise);
    fs_tensor_free(&rlat);
    fs_tensor_free(&rid);
    free(ts);
    free(names.base);
    free(names.calls);
    fs_tensor_free(&nehs);
    fs_tensor_free(&npooled);
    fs_tensor_free(&ntid);
    fs_tensor_free(&lat);
    fs_tensor_free(&ehs);
    fs_tensor_free(&pooled);
    fs_tensor_free(&iid);
    fs_tensor_free(&tid);
    return rc;
}

/* --inject *-temp-bcast: `dist.broadcast(t.cuda(), src=0)` — the broadcast lands in a temporary
 * copy that is thrown away, and the rank keeps the zeros it allocated. */
static int bcast_into_temporary(const fs_group *g, int root, fs_tensor *t, fs_err *e)
{
    fs_tensor tmp;
    int rc = fs_tensor_alloc(&tmp, t->dtype, t->ndim, t->shape, e);
    if (rc) return rc; /* the root is inside the broadcast: the CLI ends the job */
    if (g->rank == root) fs_tensor_copy(&tmp, t, NULL);
    rc = fs_bcast_t(g, root, &tmp, e);
    fs_tensor_free(&tmp); /* ...and the real buffer never saw the values */
    return rc;
}

int fs_inputs_broadcast(const fs_group *g, int root, fs_inputs *in, const fs_config *c, fs_dtype dt,
                        const fs_inject *inj, fs_err *e)
{
    if (g->size == 1) return FS_OK;
    int hdr[7] = {in->B, in->S_img, in->S_txt, in->n_steps, in->has_guidance, in->S_neg, in->S_ref};
    double scale = in->true_cfg_scale;
    fs_bcast(g, root, hdr, sizeof hdr);
    fs_bcast(g, root, &scale, sizeof scale);
    int rc = FS_OK;
    if (g->rank != root && ((rc = fs_inputs_alloc(in, c, dt, hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], e)) ||
                            (scale > 0 && (rc = fs_inputs_alloc_negative(in, c, dt, hdr[5], scale, e))) ||
                            (hdr[6] > 0 && (rc = fs_inputs_alloc_ref(in, c, dt, hdr[6], e)))))
        return rc; /* the root is already inside the broadcasts: the CLI ends the job */
    fs_tensor *all[] = {&in->hidden_states, &in->encoder_hidden_states, &in->pooled_projections, &in->img_ids,
                        &in->txt_ids, &in->sigmas, &in->negative_encoder_hidden_states,
                        &in->negative_pooled_projections, &in->negative_txt_ids, &in->image_latents,
                        &in->image_latent_ids};
    for (size_t i = 0; !rc && i < FS_ARRAY_LEN(all); i++)
        if (all[i]->ndim) rc = fs_bcast_t(g, root, all[i], e); /* FLUX.2: no pooled vector */
    if (!rc) rc = fs_injected(inj, FS_INJ_TIMESTEP_TEMP_BCAST) ? bcast_into_temporary(g, root, &in->timesteps, e)
                                                               : fs_bcast_t(g, root, &in->timesteps, e);
    if (!rc && in->has_guidance)
        rc = fs_injected(inj, FS_INJ_GUIDANCE_TEMP_BCAST) ? bcast_into_temporary(g, root, &in->guidance, e)
                                                           : fs_bcast_t(g, root, &in->guidance, e);
    return rc;
}
