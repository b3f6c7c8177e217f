/* fs_config.h — the FLUX transformer configuration, in diffusers' config.json keys.
 *
 * Source of a config: a config.json file, the `config` root attribute of a flux-dump, or a
 * preset name (flux-dev, flux-schnell, flux2-dev, flux2-klein-4b, flux2-klein-9b, and the small
 * built-in `default` the demo runs).
 *
 * Two model families share this struct: FLUX.1 (diffusers FluxTransformer2DModel) and FLUX.2
 * (Flux2Transformer2DModel), told apart by config.json's `_class_name`. FLUX.2 has no pooled
 * vector and no biases, a SwiGLU MLP of width mlp_ratio·D, 4 RoPE axes with θ = 2000 and
 * configurable timestep channels; FLUX.1's values of those fields are fixed (4·D, 3 axes, 10000,
 * 256). */
#ifndef FS_CONFIG_H
#define FS_CONFIG_H

#include "fs_common.h"

#define FS_MAX_AXES 4 /* RoPE axes: FLUX.1 has 3 (T, H, W), FLUX.2 4 (T, H, W, L) */

typedef enum fs_family { FS_FLUX1 = 0, FS_FLUX2 = 1 } fs_family;

typedef struct fs_config {
    int patch_size;
    int in_channels;
    int out_channels;            /* resolved: config's null means in_channels */
    int num_layers;              /* double ("MMDiT") blocks */
    int num_single_layers;
    int attention_head_dim;
    int num_attention_heads;
    int joint_attention_dim;
    int pooled_projection_dim;   /* FLUX.1 only (FLUX.2 has no pooled vector: 0) */
    int guidance_embeds;         /* 0/1 */
    int axes_dims_rope[FS_MAX_AXES];
    fs_family family;            /* FS_FLUX1 unless config.json's _class_name says FLUX.2 */
    int n_axes;                  /* RoPE axes = columns of the ids; 0 means FLUX.1's 3 */
    /* FLUX.2 (fs_config_* accessors give FLUX.1's fixed values for a FLUX.1 config). 18 ints
     * then the doubles: no padding bytes, so configs compare with memcmp (fs_job, fuzz_config) */
    int rope_theta;              /* 2000 (an int in diffusers' signature too) */
    int timestep_guidance_channels; /* 256: the sinusoid's width */
    double mlp_ratio;            /* 3.0: MLP width int(D·mlp_ratio) */
    double eps;                  /* LayerNorm and RMSNorm eps, 1e-6 */
} fs_config;
_Static_assert(sizeof(fs_config) == 18 * sizeof(int) + 2 * sizeof(double), "fs_config has padding: memcmp breaks");

/* Plausibility limits, checked by fs_config_validate (and so for every config.json, every dump's
 * `config` attribute and every preset) before anything is sized from a config.
 *
 * Why these numbers: FLUX.1 has 19 + 38 blocks, 24 heads of 128, widths <= 4096 and 1.19e10
 * parameters. Each limit is far above any FLUX-shaped model and low enough that every size the
 * code derives from a config fits an `int` with room to spare: hidden = heads x head_dim <= 2^20,
 * the MLP width 4·hidden <= 2^22, single-block proj_out's input hidden + MLP <= 5·2^20, AdaLN's
 * 6·hidden < 2^23; a Linear's element count <= 5·2^40 fits int64. The parameter cap (10^12, 4 TB
 * in fp32: 84 times FLUX.1, more than any one machine holds) makes a config that would have
 * flux-sim generate or zero-fill terabytes fail at once, naming the key, instead of after minutes
 * of work or with an out-of-memory message that names nothing. */
#define FS_CONFIG_MAX_LAYERS   1024          /* num_layers, num_single_layers */
#define FS_CONFIG_MAX_HEADS    1024          /* num_attention_heads */
#define FS_CONFIG_MAX_HEAD_DIM 1024          /* attention_head_dim (= sum of axes_dims_rope) */
#define FS_CONFIG_MAX_WIDTH    (1 << 20)     /* in/out_channels, joint/pooled dims, hidden size */
#define FS_CONFIG_MAX_PARAMS   1000000000000LL

/* Derived sizes (int is safe for every config fs_config_validate accepts: see the limits above). */
static inline int fs_config_hidden(const fs_config *c) { return c->num_attention_heads * c->attention_head_dim; }
/* FLUX.1: 4·D (GELU MLP, proj_mlp). FLUX.2: int(D·mlp_ratio), as diffusers' Flux2FeedForward and
 * Flux2ParallelSelfAttention compute it; linear_in and the single block's MLP part are twice that
 * (SwiGLU's gate | up). */
static inline int fs_config_mlp_hidden(const fs_config *c)
{
    return c->family == FS_FLUX2 ? (int)(fs_config_hidden(c) * c->mlp_ratio) : 4 * fs_config_hidden(c);
}
static inline int fs_config_axes(const fs_config *c) { return c->n_axes ? c->n_axes : 3; }
static inline double fs_config_rope_theta(const fs_config *c) { return c->family == FS_FLUX2 ? c->rope_theta : 10000.0; }
static inline int fs_config_time_channels(const fs_config *c)
{
    return c->family == FS_FLUX2 ? c->timestep_guidance_channels : 256;
}
static inline double fs_config_eps(const fs_config *c) { return c->family == FS_FLUX2 ? c->eps : 1e-6; }
/* diffusers' class name of the family, as config.json's _class_name */
static inline const char *fs_config_class_name(const fs_config *c)
{
    return c->family == FS_FLUX2 ? "Flux2Transformer2DModel" : "FluxTransformer2DModel";
}
/* proj_out width: patch_size² · out_channels */
static inline int fs_config_out_width(const fs_config *c) { return c->patch_size * c->patch_size * c->out_channels; }

/* Parse JSON text. `origin` names the source in error messages (a path, "dump X.h5 attribute config"). */
int fs_config_from_json(fs_config *c, const char *json, const char *origin, fs_err *e);
int fs_config_from_file(fs_config *c, const char *path, fs_err *e);
/* Preset names: "default", "flux-dev", "flux-schnell", "flux2-dev", "flux2-klein-4b",
 * "flux2-klein-9b", "flux2-default" (FLUX.2's structure at demo width), plus the reference shapes
 * "tiny", "odd" and "flux2-tiny". */
int fs_config_preset(fs_config *c, const char *name, fs_err *e);
const char *const *fs_config_preset_names(void); /* NULL-terminated */
/* Checks the invariants the model relies on (axes sum to head dim, even axes, positive sizes)
 * and the plausibility limits above. Never computes a derived size before its factors are known
 * to be in range, so it is safe on any struct, however filled. */
int fs_config_validate(const fs_config *c, const char *origin, fs_err *e);
/* Number of parameters (elements of every tensor of fs_config_params), in closed form; exact for
 * a config fs_config_validate accepts. */
int64_t fs_config_num_params(const fs_config *c);
/* JSON in diffusers' keys (caller frees with free()). */
char *fs_config_to_json(const fs_config *c);

/* ---- The parameter list (diffusers state_dict names and shapes) ----
 * One enumeration that synthetic weights, the safetensors validator and the weight sharding
 * (fs_weights_shard_of) all walk, so a name can never be known to one and missing from another. */
typedef enum fs_param_kind {
    FS_PARAM_LINEAR_W, /* [out, in], synthetic ~ N(0, 1/in) */
    FS_PARAM_BIAS,     /* [out],     synthetic ~ N(0, 0.05^2) */
    FS_PARAM_RMS_W,    /* [Dh],      synthetic ~ 1 + N(0, 0.1^2) */
} fs_param_kind;

typedef struct fs_param_desc {
    char name[128];
    fs_param_kind kind;
    int ndim;
    int64_t shape[2];
} fs_param_desc;

/* Every parameter in a fixed order (top level, double blocks, single blocks, output head).
 * Returns a malloc'd array (free() it) and its length in *n; NULL when out of memory. */
fs_param_desc *fs_config_params(const fs_config *c, int *n);
/* Index of `name` in an fs_config_params array, or -1. */
int fs_param_find(const fs_param_desc *p, int n, const char *name);

#endif
