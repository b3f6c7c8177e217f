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
    in->B = p->batch;
    in->S_img = p->grid_h * p->grid_w;
    in->S_txt = p->txt_len;
    in->n_steps = p->steps;
    int rc;
    if ((rc = fs_tensor_alloc3(&in->hidden_states, dt, in->B, in->S_img, c->in_channels, e)) ||
        (rc = fs_tensor_alloc3(&in->encoder_hidden_states, dt, in->B, in->S_txt, c->joint_attention_dim, e)) ||
        (rc = fs_tensor_alloc2(&in->pooled_projections, dt, in->B, c->pooled_projection_dim, e)) ||
        (rc = fs_tensor_alloc2(&in->img_ids, FS_F64, in->S_img, 3, e)) ||
        (rc = fs_tensor_alloc2(&in->txt_ids, FS_F64, in->S_txt, 3, e)) ||
        (rc = fs_tensor_alloc(&in->sigmas, FS_F64, 1, (int64_t[]){p->steps + 1}, e)) ||
        (rc = fs_tensor_alloc(&in->timesteps, FS_F64, 1, (int64_t[]){p->steps}, e)))
        goto fail;
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
    if (c->guidance_embeds) {
        in->has_guidance = 1;
        if ((rc = fs_tensor_alloc(&in->guidance, FS_F64, 1, (int64_t[]){p->batch}, e))) goto fail;
        for (int b = 0; b < p->batch; b++) ((double *)in->guidance.data)[b] = p->guidance;
    }
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

int fs_sample(const fs_model *m, const fs_inputs *in, const fs_step_hooks *hooks, fs_tensor *latents, fs_err *e)
{
    static const fs_step_hooks none = {0};
    if (!hooks) hooks = &none;
    const fs_tensor *hs = &in->hidden_states;
    int rc = fs_tensor_alloc(latents, m->dtype, hs->ndim, hs->shape, e);
    if (rc) return rc;
    if ((rc = fs_tensor_copy(latents, hs, e))) goto fail;
    double *ts = malloc(sizeof(double) * (size_t)in->B);
    if (!ts) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < in->n_steps; i++) {
        const double sigma = ((double *)in->sigmas.data)[i], sigma_next = ((double *)in->sigmas.data)[i + 1];
        const double t = ((double *)in->timesteps.data)[i];
        for (int b = 0; b < in->B; b++) ts[b] = t; /* timestep.expand(B) */
        fs_tensor v = {0};
        if (hooks->begin_step && (rc = hooks->begin_step(hooks->ctx, i, t, sigma, sigma_next, e))) break;
        if (m->rec.fn && (rc = m->rec.fn(m->rec.ctx, "latents_in", latents, e))) break;
        rc = fs_model_forward(m, latents, &in->encoder_hidden_states, &in->pooled_projections, ts,
                              in->has_guidance ? in->guidance.data : NULL, &in->img_ids, &in->txt_ids, &v, e);
        if (rc) {
            fs_err_prefix(e, "step %d: ", i);
            break;
        }
        euler_update(latents, &v, sigma, sigma_next);
        fs_tensor_free(&v);
        if (m->rec.fn && (rc = m->rec.fn(m->rec.ctx, "latents_out", latents, e))) break;
        if (hooks->end_step && (rc = hooks->end_step(hooks->ctx, i, e))) break;
    }
    free(ts);
    if (!rc) return FS_OK;
fail:
    fs_tensor_free(latents);
    return rc;
}
