/* fs_model.h — the FLUX transformer forward, one rank: FLUX.1 (diffusers FluxTransformer2DModel,
 * fs_flux1.c) or FLUX.2 (Flux2Transformer2DModel, fs_flux2.c), as the config's family says.
 *
 * fs_model_forward is the model's forward(): it takes one step's inputs and returns the
 * velocity prediction `proj_out`, calling the recorder with every module output that diffusers'
 * forward hooks would see (../shared/flux-spec.md §5), in hook firing order. One function per
 * diffusers module (fs_layers.c, fs_flux1.c), named after the module it implements. */
#ifndef FS_MODEL_H
#define FS_MODEL_H

#include "fs_backend.h"
#include "fs_par.h"
#include "fs_record.h"
#include "fs_weights.h"

/* FLUX.2's KV cache for reference images (diffusers Flux2KVCache, kv_cache_mode of
 * Flux2Transformer2DModel.forward, Flux2KleinKVPipeline). In "extract" mode (step 0) the image
 * tokens given to the forward are [R reference tokens; the noise]: the reference tokens are
 * modulated with a second time embedding at ref_fixed_timestep = 0 (time_guidance_embed@1,
 * double_stream_modulation_img@1, single_stream_modulation@1), attend only to themselves while
 * text and image tokens attend to all, and each block stores their K and V after RoPE; the output
 * leaves them out. In "cached" mode (later steps) the forward gets the noise alone and every
 * block's attention takes its stored K, V between the text's and the image's. */
enum { FS_KV_OFF = 0, FS_KV_EXTRACT, FS_KV_CACHED };
typedef struct fs_kv_cache {
    int mode;         /* FS_KV_* */
    int R;            /* reference tokens */
    int n;            /* blocks: the double ones, then the single ones */
    fs_tensor *k, *v; /* [n]: [B, R, H_local, Dh] each, in the backend's memory (this rank's heads) */
} fs_kv_cache;
int fs_kv_cache_init(fs_kv_cache *kv, const fs_config *c, int R, fs_err *e);
void fs_kv_cache_free(fs_kv_cache *kv);

typedef struct fs_model {
    fs_config cfg;
    fs_dtype dtype;
    const fs_weights *w; /* in be's memory: fs_weights_on (TP runs: this rank's shard); when
                            streaming, only the top-level parameters */
    fs_weights *stream;  /* non-NULL: the host weights, streamed — fs_model_forward makes each
                            block's parameters before the block (fs_weights_acquire), places them in
                            be's memory, and drops them after it (fs_weights_release) */
    fs_backend *be;      /* where every activation lives and every op runs */
    fs_recorder rec;  /* fn == NULL: record nothing */
    int step;          /* denoising step of this call (set by fs_sample; for --inject nan-rank) */
    int match_bf16;    /* --match bf16: the inputs' timesteps and guidance are what a bf16 transformer
                          embeds, /1000 (fs_inputs_match_bf16); embed x·1000 rounded to bf16 exactly
                          (docs/bf16.md) */
    int cfg_batched;   /* true CFG on one rank: both calls in one forward of batch 2B (prompt rows
                          first), as diffusers' classic CFG batches them (fs_sample; --cfg-batched) */
    const fs_par *par; /* NULL: single rank. Else the inputs given to fs_model_forward are this
                          rank's tokens (see fs_par.h) and TP follows par->plan. */
    /* called after each block with the blocks done of this forward and their total (double +
     * single), for progress reports (fs_progress.h); NULL: none */
    void (*on_block)(void *ctx, int step, int done, int total);
    void *on_block_ctx;
    fs_kv_cache *kv;   /* FLUX.2 reference images (NULL or mode FS_KV_OFF: none); set by fs_sample */
} fs_model;

/* One transformer call. hidden_states [B,S_img,in_ch], encoder_hidden_states [B,S_txt,joint],
 * pooled [B,pooled] in the run dtype (FLUX.2: ignored, may be NULL), in m->be's memory (fs_sample uploads them); timestep[B] exactly as FluxPipeline passes it (σ-like,
 * already divided by 1000); guidance[B] (e.g. 3.5) or NULL when the config has no guidance
 * embedder; img_ids [S_img,A], txt_ids [S_txt,A] float64 host tensors (A = RoPE axes: 3, FLUX.2 4). `out` is allocated here,
 * in m->be's memory: [B, S_img, out_width]. With m->par, S_img and S_txt are this rank's local token counts and the
 * ids its tokens' global ids. */
int fs_model_forward(const fs_model *m, const fs_tensor *hidden_states, const fs_tensor *encoder_hidden_states,
                     const fs_tensor *pooled, const double *timestep, const double *guidance,
                     const fs_tensor *img_ids, const fs_tensor *txt_ids, fs_tensor *out, fs_err *e);

/* What a bf16 transformer embeds for a timestep or guidance x it is passed:
 * `x.to(bfloat16) * 1000` in bfloat16, i.e. bf16(bf16(x)·1000) — guidance 3.5 → 3504, a timestep
 * 0.828125 → 828. The one place this rule is written (the bf16 forward, --match bf16). */
double fs_bf16_embedded(double x);

/* Building blocks exposed for unit tests (all follow diffusers' arithmetic order). */

/* Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0): [cos | sin] of t·freq_j (host
 * tensors; the forward uploads them),
 * freq_j = exp(-ln(10000)·j/128). In an fp32 run evaluated in float32 exactly as diffusers
 * does (this dominates diffusers' own fp32 error); in fp64 in double. t [B] → out [B, 256]. */
int fs_time_proj(fs_dtype dt, const double *t, int B, fs_tensor *out, fs_err *e);
/* The same with `channels` (FLUX.2's timestep_guidance_channels): [cos | sin] of channels/2
 * frequencies exp(-ln(10000)·j/(channels/2)). */
int fs_time_proj_n(fs_dtype dt, const double *t, int B, int channels, fs_tensor *out, fs_err *e);
/* FluxPosEmbed: ids [S,3] float64 → cos, sin [S, Dh] in `dt` (angles in float64, as diffusers
 * on CPU/CUDA), each axis' table repeat_interleave'd ([c0,c0,c1,c1,…]) and axes concatenated. */
int fs_pos_embed(fs_dtype dt, const fs_config *c, const fs_tensor *ids, fs_tensor *cos, fs_tensor *sin, fs_err *e);

#endif
