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
 * that do not exist are left for the loader to report. Owns its strings: fs_pipeline_free. */
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
 * but their default, rather than silently ignored. */
int fs_pipeline_sched_file(fs_sched_config *s, const char *path, fs_err *e);

#endif
