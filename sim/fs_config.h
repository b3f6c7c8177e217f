/* fs_config.h — the FLUX transformer configuration, in diffusers' config.json keys.
 *
 * Source of a config: a config.json file, the `config` root attribute of a flux-dump, or a
 * preset name (flux-dev, flux-schnell, and the small built-in `default` the demo runs). */
#ifndef FS_CONFIG_H
#define FS_CONFIG_H

#include "fs_common.h"

#define FS_MAX_AXES 3

typedef struct fs_config {
    int patch_size;
    int in_channels;
    int out_channels;            /* resolved: config's null means in_channels */
    int num_layers;              /* double ("MMDiT") blocks */
    int num_single_layers;
    int attention_head_dim;
    int num_attention_heads;
    int joint_attention_dim;
    int pooled_projection_dim;
    int guidance_embeds;         /* 0/1 */
    int axes_dims_rope[FS_MAX_AXES];
} fs_config;

/* Derived sizes. */
static inline int fs_config_hidden(const fs_config *c) { return c->num_attention_heads * c->attention_head_dim; }
static inline int fs_config_mlp_hidden(const fs_config *c) { return 4 * fs_config_hidden(c); }
/* proj_out width: patch_size² · out_channels */
static inline int fs_config_out_width(const fs_config *c) { return c->patch_size * c->patch_size * c->out_channels; }

/* Parse JSON text. `origin` names the source in error messages (a path, "dump X.h5 attribute config"). */
int fs_config_from_json(fs_config *c, const char *json, const char *origin, fs_err *e);
int fs_config_from_file(fs_config *c, const char *path, fs_err *e);
/* Preset names: "default", "flux-dev", "flux-schnell", plus the reference shapes "tiny" and "odd". */
int fs_config_preset(fs_config *c, const char *name, fs_err *e);
const char *const *fs_config_preset_names(void); /* NULL-terminated */
/* Checks the invariants the model relies on (axes sum to head dim, even axes, positive sizes). */
int fs_config_validate(const fs_config *c, const char *origin, fs_err *e);
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
