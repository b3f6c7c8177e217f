/* fs_sampler.h — FlowMatchEulerDiscreteScheduler + FluxPipeline's denoising loop.
 *
 * The sigmas are computed with diffusers' exact float32 arithmetic (spec §8): a float32 value
 * that differs in the last bit moves every later step, and a GPU run replayed here must see
 * the same numbers it saw there. */
#ifndef FS_SAMPLER_H
#define FS_SAMPLER_H

#include "fs_inputs.h"
#include "fs_comm.h"
#include "fs_inject.h"
#include "fs_model.h"
#include "fs_schedule.h"

/* --ref-grid takes at most this many reference images (a replayed dump may hold any number) */
#define FS_MAX_REF_IMAGES 8

/* Inputs generated from a seed for a token grid (grid_h × grid_w image tokens, i.e. a
 * 16·grid_h × 16·grid_w pixel image). Noise, text embeddings and pooled vector are standard
 * normal from fs_rng keyed "inputs.<name>" — the packed latents are drawn directly in token
 * layout. img_ids (0, row, col), txt_ids 0; guidance (if the config has a guidance embedder). */
typedef struct fs_gen_params {
    uint64_t seed;
    int batch, grid_h, grid_w, txt_len, steps;
    double guidance;
    fs_sched_config sched;
    /* true CFG (> 0): a negative prompt of neg_txt_len tokens (0: txt_len), its embeddings (and
     * FLUX.1's pooled vector) standard normal keyed "inputs.negative_<name>", its ids as the
     * prompt's */
    double true_cfg_scale;
    int neg_txt_len;
    /* FLUX.2 reference images through the KV cache (n_ref > 0), image i of ref_h[i] x ref_w[i]
     * tokens: their packed latents, concatenated in order, standard normal keyed
     * "inputs.image_latents"; their ids Flux2KleinKVPipeline._prepare_image_ids':
     * (10 + 10·i, row, col, 0) */
    int n_ref;
    int ref_h[FS_MAX_REF_IMAGES], ref_w[FS_MAX_REF_IMAGES];
} fs_gen_params;
int fs_inputs_generate(fs_inputs *in, const fs_config *c, fs_dtype dt, const fs_gen_params *p, fs_err *e);
/* the reference tokens of p's images (0: none) */
int64_t fs_gen_ref_tokens(const fs_gen_params *p);

/* --match bf16: the timesteps and guidance become what a bf16 transformer embeds, divided by 1000
 * (fs_bf16_embedded(x)/1000: ×1000 gives it back exactly in float64), as the reference's matched
 * dump records them — so the matched dump is a self-consistent float64 run of the bf16 problem. */
void fs_inputs_match_bf16(fs_inputs *in);

/* Callbacks around each transformer call (the HDF5 dump, later --check). Any may be NULL. */
typedef struct fs_step_hooks {
    int (*begin_step)(void *ctx, int step, double timestep, double sigma, double sigma_next, fs_err *e);
    int (*end_step)(void *ctx, int step, fs_err *e);
    void *ctx;
} fs_step_hooks;

/* The denoising loop: for i in 0..N-1, v = transformer(latents, t_i) (with true CFG, a second call
 * on the negative prompt and v = v_neg + scale·(v − v_neg), as FluxPipeline / Flux2KleinPipeline;
 * that call's module outputs are recorded as the pipeline's hooks see a module's next call in the
 * step: `name@k`, k counting on from the first call's, e.g. `x_embedder@1`,
 * `time_text_embed.time_proj@2`); latents += (σ_{i+1} − σ_i)·v,
 * in the run dtype (the float32 Euler update of scheduler.step for fp32 runs). Records
 * `latents_in` before and `latents_out` after each forward through m->rec. `latents` is
 * allocated here and holds the final latents, global (gathered over the SP group when m->par
 * splits the sequence: each rank denoises only its image tokens). */
int fs_sample(const fs_model *m, const fs_inputs *in, const fs_step_hooks *hooks, fs_tensor *latents, fs_err *e);

/* Setup like the GPU scripts: rank `root` of g holds the inputs (generated or read from a dump),
 * every other rank receives them in place (shapes first, then every tensor, into buffers it
 * allocated itself — never into a temporary). */
int fs_inputs_broadcast(const fs_group *g, int root, fs_inputs *in, const fs_config *c, fs_dtype dt,
                        const fs_inject *inj, fs_err *e);

#endif
