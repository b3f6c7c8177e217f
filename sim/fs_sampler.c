#include "fs_sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fs_rng.h"

int fs_sched_preset(fs_sched_config *s, const char *name, fs_err *e)
{
    /* Hub scheduler_config.json of FLUX.1-dev / FLUX.1-schnell (spec §8). */
    *s = (fs_sched_config){.use_dynamic_shifting = 1, .shift = 3.0, .base_shift = 0.5, .max_shift = 1.15,
                           .base_image_seq_len = 256, .max_image_seq_len = 4096};
    if (!strcmp(name, "dev")) return FS_OK;
    if (!strcmp(name, "schnell")) {
        s->use_dynamic_shifting = 0;
        s->shift = 1.0;
        return FS_OK;
    }
    return fs_errf(e, FS_E_INPUT, "unknown scheduler '%s' (known: dev, schnell)", name);
}

double fs_sched_mu(const fs_sched_config *s, int image_seq_len)
{
    double m = (s->max_shift - s->base_shift) / (double)(s->max_image_seq_len - s->base_image_seq_len);
    double b = s->base_shift - m * s->base_image_seq_len;
    return image_seq_len * m + b;
}

int fs_sched_sigmas(const fs_sched_config *s, int N, int image_seq_len, fs_dtype dt, double *sigmas,
                    double *timesteps, fs_err *e)
{
    if (N < 1) return fs_errf(e, FS_E_INPUT, "number of steps must be >= 1 (got %d)", N);
    double mu = fs_sched_mu(s, image_seq_len);
    for (int i = 0; i < N; i++) {
        /* pipeline: np.linspace(1.0, 1/N, N) in float64 ... */
        /* np.linspace: arange(N) * step + start, step = (stop - start) / (N - 1), last = stop */
        double lin = N == 1 ? 1.0 : (i == N - 1 ? 1.0 / N : (double)i * ((1.0 / N - 1.0) / (double)(N - 1)) + 1.0);
        /* ... cast to float32 first by set_timesteps, then shifted in float32 (NumPy rounds the
         * Python-float constants to float32 in mixed expressions). */
        float sg = (float)lin, out;
        if (s->use_dynamic_shifting) {
            float em = (float)exp(mu);
            float r = 1.0f / sg - 1.0f;
            out = em / (em + powf(r, 1.0f));
        } else {
            float sh = (float)s->shift;
            out = sh * sg / (1.0f + (sh - 1.0f) * sg);
        }
        sigmas[i] = out;
        float t1000 = out * 1000.0f; /* scheduler.timesteps, float32 */
        timesteps[i] = dt == FS_F32 ? (double)(t1000 / 1000.0f) : (double)t1000 / 1000.0;
    }
    sigmas[N] = 0.0;
    return FS_OK;
}

static int fill_normal(fs_tensor *t, uint64_t seed, const char *name)
{
    uint64_t key = fs_rng_key(seed, name);
    int64_t n = fs_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) fs_tensor_set(t, i, fs_rng_normal(key, (uint64_t)i));
    return FS_OK;
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
    fill_normal(&in->pooled_projections, p->seed, "inputs.pooled_projections");
    /* _prepare_latent_image_ids: (0, row, col), row-major over the token grid, not centred */
    for (int r = 0; r < p->grid_h; r++)
        for (int col = 0; col < p->grid_w; col++) {
            double *id = (double *)in->img_ids.data + (size_t)(r * p->grid_w + col) * 3;
            id[0] = 0;
            id[1] = r;
            id[2] = col;
        }
    for (int b = 0; in->has_guidance && b < p->batch; b++) ((double *)in->guidance.data)[b] = p->guidance;
    if ((rc = fs_sched_sigmas(&p->sched, p->steps, in->S_img, dt, in->sigmas.data, in->timesteps.data, e))) goto fail;
    return FS_OK;
fail:
    fs_inputs_free(in);
    return rc;
}

/* latents += (σ_next − σ)·v in the run dtype: scheduler.step computes dt in float32 for fp32. */
static void euler_update(fs_tensor *lat, const fs_tensor *v, double sigma, double sigma_next)
{
    int64_t n = fs_tensor_numel(lat);
    if (lat->dtype == FS_F32) {
        float dt = (float)sigma_next - (float)sigma;
        float *x = lat->data;
        const float *u = v->data;
        for (int64_t i = 0; i < n; i++) x[i] = x[i] + dt * u[i];
    } else {
        double dt = sigma_next - sigma;
        double *x = lat->data;
        const double *u = v->data;
        for (int64_t i = 0; i < n; i++) x[i] = x[i] + dt * u[i];
    }
}

/* This rank's tokens of a [B, S, W] tensor: rows [lo, hi) of every batch. */
static int slice_tokens(const fs_tensor *x, int64_t lo, int64_t hi, fs_tensor *y, fs_err *e)
{
    int64_t shape[FS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    const int tokdim = x->ndim == 2 ? 0 : 1; /* ids are [S, 3], activations [B, S, W] */
    shape[tokdim] = hi - lo;
    int rc = fs_tensor_alloc(y, x->dtype, x->ndim, shape, e);
    if (rc) return rc;
    const int64_t B = tokdim ? x->shape[0] : 1, S = x->shape[tokdim], W = fs_tensor_numel(x) / (B * (S ? S : 1));
    const size_t es = fs_dtype_size(x->dtype);
    for (int64_t b = 0; b < B; b++)
        memcpy((char *)y->data + (size_t)(b * (hi - lo) * W) * es, (const char *)x->data + (size_t)((b * S + lo) * W) * es,
               (size_t)((hi - lo) * W) * es);
    return FS_OK;
}

/* Local [B, n_q, C] image-token blocks of the SP group → global [B, S_img, C] on every rank. */
static int gather_image_tokens(const fs_par *p, const fs_tensor *local, fs_tensor *global, fs_err *e)
{
    const int64_t B = local->shape[0], C = local->shape[2];
    int64_t shape[3] = {B, p->S_img, C};
    int rc = fs_tensor_alloc(global, local->dtype, 3, shape, e);
    if (rc) return rc;
    int64_t *cnt = malloc(sizeof(int64_t) * 2 * (size_t)p->sp), *dsp = cnt + p->sp, off = 0;
    for (int q = 0; q < p->sp; q++) {
        cnt[q] = B * fs_par_img_n(p, q) * C;
        dsp[q] = off;
        off += cnt[q];
    }
    fs_tensor tmp;
    if ((rc = fs_tensor_alloc(&tmp, local->dtype, 3, shape, e))) {
        free(cnt);
        return rc;
    }
    fs_allgatherv(&p->g_sp, local->dtype, local->data, fs_tensor_numel(local), tmp.data, cnt, dsp);
    const size_t es = fs_dtype_size(local->dtype);
    for (int q = 0; q < p->sp; q++) /* block q is [B, n_q, C]: put batch b's rows at img_lo[q] */
        for (int64_t b = 0; b < B; b++)
            memcpy((char *)global->data + (size_t)((b * p->S_img + p->img_lo[q]) * C) * es,
                   (char *)tmp.data + (size_t)(dsp[q] + b * fs_par_img_n(p, q) * C) * es,
                   (size_t)(fs_par_img_n(p, q) * C) * es);
    fs_tensor_free(&tmp);
    free(cnt);
    return FS_OK;
}

int fs_sample(const fs_model *m, const fs_inputs *in, const fs_step_hooks *hooks, fs_tensor *latents, fs_err *e)
{
    static const fs_step_hooks none = {0};
    if (!hooks) hooks = &none;
    const fs_par *p = m->par;
    const int split = p && p->sp > 1;
    fs_tensor lat = {0}, ehs = {0}, iid = {0}, tid = {0};
    double *ts = NULL;
    int rc;
    memset(latents, 0, sizeof *latents);
    fs_shard img_shard = {0};
    if (split) { /* this rank's tokens; ids stay global positions (RoPE needs them) */
        const int q = p->sp_rank;
        /* --inject rope-local-pos: each rank builds the ids of its chunk from 0, as if it held the
         * start of the sequence (local positions instead of global ones) */
        const int local_pos = fs_injected(p->inject, FS_INJ_ROPE_LOCAL_POS);
        const int64_t il = local_pos ? 0 : p->img_lo[q], tl = local_pos ? 0 : p->txt_lo[q];
        if ((rc = slice_tokens(&in->hidden_states, p->img_lo[q], p->img_hi[q], &lat, e)) ||
            (rc = slice_tokens(&in->encoder_hidden_states, p->txt_lo[q], p->txt_hi[q], &ehs, e)) ||
            (rc = slice_tokens(&in->img_ids, il, il + fs_par_img_n(p, q), &iid, e)) ||
            (rc = slice_tokens(&in->txt_ids, tl, tl + fs_par_txt_n(p, q), &tid, e)))
            goto out;
        img_shard = (fs_shard){.ndims = 1, .d = {{.dim = 1, .n = 1, .iv = {{p->img_lo[q], p->img_hi[q]}}}}};
    } else {
        const fs_tensor *hs = &in->hidden_states;
        if ((rc = fs_tensor_alloc(&lat, m->dtype, hs->ndim, hs->shape, e)) || (rc = fs_tensor_copy(&lat, hs, e))) goto out;
    }
    const fs_tensor *E = split ? &ehs : &in->encoder_hidden_states, *I = split ? &iid : &in->img_ids,
                    *Tt = split ? &tid : &in->txt_ids;
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
        rc = fs_model_forward(&ms, &lat, E, &in->pooled_projections, ts, in->has_guidance ? in->guidance.data : NULL, I,
                              Tt, &v, e);
        if (rc) {
            fs_err_prefix(e, "step %d: ", i);
            break;
        }
        euler_update(&lat, &v, sigma, sigma_next);
        fs_tensor_free(&v);
        if (m->rec.fn && (rc = m->rec.fn(m->rec.ctx, "latents_out", &lat, &img_shard, e))) break;
        if (hooks->end_step && (rc = hooks->end_step(hooks->ctx, i, e))) break;
    }
    if (!rc) {
        if (split) rc = gather_image_tokens(p, &lat, latents, e);
        else {
            *latents = lat;
            lat = (fs_tensor){0};
        }
    }
out:
    free(ts);
    fs_tensor_free(&lat);
    fs_tensor_free(&ehs);
    fs_tensor_free(&iid);
    fs_tensor_free(&tid);
    return rc;
}

static void bcast_tensor(const fs_group *g, int root, fs_tensor *t) { fs_bcast(g, root, t->data, fs_tensor_nbytes(t)); }

/* --inject *-temp-bcast: `dist.broadcast(t.cuda(), src=0)` — the broadcast lands in a temporary
 * copy that is thrown away, and the rank keeps the zeros it allocated. */
static void bcast_into_temporary(const fs_group *g, int root, fs_tensor *t)
{
    fs_tensor tmp;
    if (fs_tensor_alloc(&tmp, t->dtype, t->ndim, t->shape, NULL)) fs_comm_abort(FS_E_NOMEM);
    if (g->rank == root) fs_tensor_copy(&tmp, t, NULL);
    fs_bcast(g, root, tmp.data, fs_tensor_nbytes(&tmp));
    fs_tensor_free(&tmp); /* ...and the real buffer never saw the values */
}

int fs_inputs_broadcast(const fs_group *g, int root, fs_inputs *in, const fs_config *c, fs_dtype dt,
                        const fs_inject *inj, fs_err *e)
{
    if (g->size == 1) return FS_OK;
    int hdr[5] = {in->B, in->S_img, in->S_txt, in->n_steps, in->has_guidance};
    fs_bcast(g, root, hdr, sizeof hdr);
    if (g->rank != root && fs_inputs_alloc(in, c, dt, hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], e))
        fs_comm_abort(FS_E_NOMEM); /* the root is already inside the broadcasts */
    bcast_tensor(g, root, &in->hidden_states);
    bcast_tensor(g, root, &in->encoder_hidden_states);
    bcast_tensor(g, root, &in->pooled_projections);
    bcast_tensor(g, root, &in->img_ids);
    bcast_tensor(g, root, &in->txt_ids);
    bcast_tensor(g, root, &in->sigmas);
    if (fs_injected(inj, FS_INJ_TIMESTEP_TEMP_BCAST)) bcast_into_temporary(g, root, &in->timesteps);
    else bcast_tensor(g, root, &in->timesteps);
    if (in->has_guidance) {
        if (fs_injected(inj, FS_INJ_GUIDANCE_TEMP_BCAST)) bcast_into_temporary(g, root, &in->guidance);
        else bcast_tensor(g, root, &in->guidance);
    }
    return FS_OK;
}
