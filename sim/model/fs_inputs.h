/* fs_inputs.h — what FluxPipeline feeds the transformer, for a whole sampling run.
 *
 * Either generated from a seed for a token grid (fs_inputs_generate, fs_sampler.c), or read from
 * the /inputs group of any flux-dump (fs_dump_read_inputs, fs_dump.c) so a GPU run is replayed
 * exactly: same noise, text embeddings, ids, sigmas and timesteps. */
#ifndef FS_INPUTS_H
#define FS_INPUTS_H

#include "fs_config.h"
#include "fs_tensor.h"

typedef struct fs_inputs {
    int B, S_img, S_txt, n_steps;
    fs_tensor hidden_states;          /* [B, S_img, in_channels], run dtype: the initial noise */
    fs_tensor encoder_hidden_states;  /* [B, S_txt, joint_attention_dim], run dtype */
    fs_tensor pooled_projections;     /* [B, pooled_projection_dim], run dtype */
    fs_tensor img_ids;                /* [S_img, 3], float64 (integer positions) */
    fs_tensor txt_ids;                /* [S_txt, 3], float64 */
    int has_guidance;
    fs_tensor guidance;               /* [B], float64: the pipeline's value, e.g. 3.5 */
    fs_tensor sigmas;                 /* [n_steps + 1], float64, final 0 included */
    fs_tensor timesteps;              /* [n_steps], float64: exactly what the transformer gets */
    /* True classifier-free guidance (FluxPipeline's true_cfg_scale, FLUX.2 klein base's
     * guidance_scale): a second transformer call per step on the negative prompt, and
     * v = v_neg + scale·(v − v_neg). true_cfg_scale 0: off, the negatives empty (ndim 0). */
    double true_cfg_scale;
    int S_neg;                        /* negative text tokens */
    fs_tensor negative_encoder_hidden_states; /* [B, S_neg, joint_attention_dim], run dtype */
    fs_tensor negative_pooled_projections;    /* [B, pooled_projection_dim] (FLUX.1; FLUX.2: empty) */
    fs_tensor negative_txt_ids;               /* [S_neg, axes], float64 */
    /* FLUX.2 reference images through the KV cache (Flux2KleinKVPipeline): the packed reference
     * latents and their ids (_prepare_image_ids: (10·(i+1), row, col, 0) for image i). Step 0 runs
     * the transformer on [reference; noise] in kv_cache_mode "extract", the later steps on the
     * noise alone in "cached" mode. S_ref 0: none (both tensors empty). */
    int S_ref;
    fs_tensor image_latents;                  /* [B, S_ref, in_channels], run dtype */
    fs_tensor image_latent_ids;               /* [S_ref, axes], float64 */
} fs_inputs;

/* Allocates every tensor for B, S_img, S_txt, n_steps (zero-filled); frees all on failure. */
int fs_inputs_alloc(fs_inputs *in, const fs_config *c, fs_dtype dt, int B, int S_img, int S_txt, int n_steps,
                    int has_guidance, fs_err *e);
void fs_inputs_free(fs_inputs *in);
/* The activations (noise, text embeddings, pooled vector) converted to dtype dt; ids and the
 * schedule stay float64. --match bf16 makes the inputs in bfloat16 (as a bf16 pipeline would),
 * then converts them exactly to its float64 run. */
int fs_inputs_convert(fs_inputs *in, fs_dtype dt, fs_err *e);
/* Allocates the negative-prompt tensors for true CFG (zero-filled) and sets the scale. */
int fs_inputs_alloc_negative(fs_inputs *in, const fs_config *c, fs_dtype dt, int S_neg, double scale, fs_err *e);
/* Allocates the reference-image tensors for the KV cache (zero-filled). */
int fs_inputs_alloc_ref(fs_inputs *in, const fs_config *c, fs_dtype dt, int S_ref, fs_err *e);
/* A deep copy of src (same dtypes). */
int fs_inputs_copy(fs_inputs *dst, const fs_inputs *src, fs_err *e);

#endif
