/* fs_schedule.h — FlowMatchEulerDiscreteScheduler as FluxPipeline configures it: the shift (static,
 * or dynamic from the image sequence length: mu) and the sigmas and timesteps of N steps.
 *
 * Plain arithmetic on a scheduler_config.json's numbers, below every model: the sampler
 * (fs_sampler) runs the loop with it, and a pipeline folder's reader (fs_pipeline) fills the
 * config — neither needs the other. The sigmas are computed with diffusers' exact float32
 * arithmetic (spec §8): a float32 value that differs in the last bit moves every later step, and
 * a GPU run replayed here must see the same numbers it saw there. */
#ifndef FS_SCHEDULE_H
#define FS_SCHEDULE_H

#include "fs_common.h"

typedef struct fs_sched_config {
    int use_dynamic_shifting;  /* FLUX.1-dev: 1; schnell: 0 */
    double shift;              /* static shift (schnell 1.0); unused when dynamic */
    double base_shift, max_shift;
    int base_image_seq_len, max_image_seq_len;
    /* the pipeline's mu for dynamic shifting: FluxPipeline's calculate_shift (0, from the four
     * numbers above) or Flux2Pipeline's compute_empirical_mu(S_img, N) (1: FLUX.2's own fit, which
     * ignores them) */
    int empirical_mu;
} fs_sched_config;

/* "dev" (dynamic shift) or "schnell" (static shift 1.0). */
int fs_sched_preset(fs_sched_config *s, const char *name, fs_err *e);
/* calculate_shift(S_img, ...) in float64, as the pipeline does. */
double fs_sched_mu(const fs_sched_config *s, int image_seq_len);
/* Flux2Pipeline's compute_empirical_mu(image_seq_len, num_steps), in float64. */
double fs_sched_empirical_mu(int image_seq_len, int num_steps);
/* sigmas[N+1] (final 0) and timesteps[N] = what the transformer is passed (t/1000) for dtype
 * dt: float32 division for fp32 runs, float64(t_f32)/1000 for fp64 runs (as the reference does),
 * bf16(bf16(t)/1000) for bf16 runs (the pipeline casts t to the latents' dtype first). */
int fs_sched_sigmas(const fs_sched_config *s, int N, int image_seq_len, fs_dtype dt, double *sigmas,
                    double *timesteps, fs_err *e);

#endif
