/* fs_schedule.c — FlowMatchEulerDiscreteScheduler's sigmas and timesteps (fs_schedule.h). */
#include "fs_schedule.h"

#include <math.h>
#include <string.h>

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

double fs_sched_empirical_mu(int image_seq_len, int num_steps)
{
    const double a1 = 8.73809524e-05, b1 = 1.89833333, a2 = 0.00016927, b2 = 0.45666666;
    if (image_seq_len > 4300) return a2 * image_seq_len + b2;
    const double m_200 = a2 * image_seq_len + b2, m_10 = a1 * image_seq_len + b1;
    const double a = (m_200 - m_10) / 190.0, b = m_200 - 200.0 * a;
    return a * num_steps + b;
}

int fs_sched_sigmas(const fs_sched_config *s, int N, int image_seq_len, fs_dtype dt, double *sigmas,
                    double *timesteps, fs_err *e)
{
    if (N < 1) return fs_errf(e, FS_E_INPUT, "number of steps must be >= 1 (got %d)", N);
    double mu = s->empirical_mu ? fs_sched_empirical_mu(image_seq_len, N) : fs_sched_mu(s, image_seq_len);
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
        /* exp(mu) overflows float32 past mu ~ 88 (FLUX.1-dev's shift reaches that near 2^22
         * image tokens): every sigma would be NaN, a complete-looking run of NaN latents */
        if (!isfinite(out))
            return fs_errf(e, FS_E_INPUT,
                           "scheduler: sigma %d is %g (mu %.4g for %d image tokens: exp(mu) overflows float32); "
                           "the shift is out of range for this image size",
                           i, (double)out, mu, image_seq_len);
        sigmas[i] = out;
        float t1000 = out * 1000.0f; /* scheduler.timesteps, float32 */
        /* what the pipeline passes, `t.expand(B).to(latents.dtype) / 1000`: a float32 division,
         * the reference's float64 one, or for bf16 latents a bf16 cast and a bf16 division */
        timesteps[i] = dt == FS_F32    ? (double)(t1000 / 1000.0f)
                       : dt == FS_BF16 ? (double)fs_bf16_round(fs_bf16_round(t1000) / 1000.0f)
                                       : (double)t1000 / 1000.0;
    }
    sigmas[N] = 0.0;
    return FS_OK;
}
