/* fs_pipeline.h — finding the model files of a Hugging Face pipeline folder.
 *
 * FLUX.1-dev on the Hub is a diffusers pipeline folder:
 *   ROOT/model_index.json
 *   ROOT/scheduler/scheduler_config.json          FlowMatchEulerDiscreteScheduler
 *   ROOT/transformer/config.json                  FluxTransformer2DModel
 *   ROOT/transformer/diffusion_pytorch_model-0000k-of-0000n.safetensors (+ .index.json)
 * (and text encoders / VAE, which flux-sim does not use). These functions turn what a user
 * passes as --weights / --config (ROOT, ROOT/transformer, a file in it, a preset name) into the
 * files to read, so that `--weights ROOT` alone runs the right config and scheduler. */
#ifndef FS_PIPELINE_H
#define FS_PIPELINE_H

#include "fs_config.h"
#include "fs_schedule.h"

typedef struct fs_pipeline {
    char *weights;   /* what fs_weights_load opens: the transformer folder, or the path as given */
    char *config;    /* the transformer's config.json beside the weights, or NULL if none */
    char *scheduler; /* ROOT/scheduler/scheduler_config.json when the weights are in a pipeline
                        folder and it exists, else NULL */
    char *root;      /* the pipeline folder, or NULL when the weights are not inside one */
} fs_pipeline;

/* Resolves --weights PATH:
 *   - a pipeline folder (a directory with transformer/ and no *.safetensors of its own):
 *     weights = ROOT/transformer, config = ROOT/transformer/config.json;
 *   - a directory holding the weights (*.safetensors, *.safetensors.index.json):
 *     config = DIR/config.json; if DIR/../model_index.json exists, DIR/.. is the pipeline root;
 *   - a file: config = config.json in its directory; the root likewise one level up.
 * scheduler = ROOT/scheduler/scheduler_config.json when ROOT is known and it exists. A
 * model_index.json that names a transformer other than FluxTransformer2DModel is an error. Paths
 * that do not exist are left for the loader to report. model_index.json, config.json and
 * scheduler_config.json are optional, but one that is present and not a regular file (a
 * dangling or looping symlink, a directory, a FIFO) is an error naming it, never "absent" (probe
 * T8). Strings from these files are printed through fs_printable (T12). Owns its strings:
 * fs_pipeline_free. */
int fs_pipeline_resolve(fs_pipeline *p, const char *weights, fs_err *e);
void fs_pipeline_free(fs_pipeline *p);

/* The path fs_weights_load should open for `path`: ROOT/transformer for a pipeline folder, else
 * `path` itself. *out is malloc'd. */
int fs_pipeline_weights_path(const char *path, char **out, fs_err *e);

/* --config ARG: a preset name (fs_config_preset), a config.json, or a directory holding
 * config.json or transformer/config.json (a transformer folder or a pipeline folder). An
 * argument that contains '/' or ".json", or names an existing path and no preset, is a path. */
int fs_pipeline_load_config(fs_config *c, const char *arg, fs_err *e);

/* A diffusers transformer config.json. Checks it is a regular file (not a directory, FIFO ...)
 * of plausible size, then parses it (fs_config_from_json). The FLUX.1 configs on the Hub predate
 * diffusers' `axes_dims_rope` key; when it is absent, diffusers' default (16, 56, 56) is used, as
 * diffusers itself does. */
int fs_pipeline_config_file(fs_config *c, const char *path, fs_err *e);

/* scheduler_config.json of FlowMatchEulerDiscreteScheduler into *s. Keys absent take diffusers'
 * defaults (shift 1.0, use_dynamic_shifting false, base_shift 0.5, max_shift 1.15,
 * base_image_seq_len 256, max_image_seq_len 4096). Options flux-sim does not implement (karras /
 * exponential / beta sigmas, shift_terminal, invert_sigmas, stochastic_sampling, a time_shift_type
 * other than "exponential", num_train_timesteps other than 1000) are errors when set to anything
 * but their default, rather than silently ignored.
 *
 * Ranges (probe T7: shift 1e308 or 1e-320, base/max_shift +-1000 gave NaN sigmas with exit 0).
 * diffusers checks none of these; the bounds are wide around what flow-matching pipelines ship
 * (FLUX.1-schnell shift 1.0, FLUX.1-dev 3.0 static / base 0.5, max 1.15 dynamic; SD3 3.0;
 * other FlowMatchEuler users up to ~17) and tight enough that every sigma is finite in float32,
 * where the schedule is computed (fs_schedule.c):
 *   shift                                  [1e-3, 1e3]   (sigma = shift*s / (1 + (shift-1)*s))
 *   base_shift, max_shift                  [-20, 20]     (mu; exp(20) = 4.9e8 as a shift)
 *   base_image_seq_len, max_image_seq_len  integers in [1, 2^22] (flux-sim's most image tokens)
 *   the dynamic mu, extrapolated linearly to 1 and to 65536 image tokens: |mu| <= 80, so
 *                                          exp(mu) (a float32) cannot overflow; FLUX.1-dev's
 *                                          config reaches 11.6 at 65536 tokens
 * Every value is checked whether or not use_dynamic_shifting uses it. */
#define FS_SCHED_SHIFT_MIN 1e-3
#define FS_SCHED_SHIFT_MAX 1e3
#define FS_SCHED_MU_MAX 20.0
#define FS_SCHED_SEQ_MAX (1 << 22)
#define FS_SCHED_MU_TOKENS 65536
#define FS_SCHED_MU_EXTRAPOLATED 80.0
int fs_pipeline_sched_file(fs_sched_config *s, const char *path, fs_err *e);

#endif
