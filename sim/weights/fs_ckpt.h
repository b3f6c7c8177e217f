/* fs_ckpt.h — writing synthetic weights as real checkpoints (tools/gen/make_checkpoint.c).
 *
 * The values are fs_weights_synthetic's, generated tensor by tensor in row blocks and written as
 * they come (never the whole model in memory: FLUX.1-dev is 23.8 GB in BF16), in the layouts the
 * real FLUX.1 checkpoints use:
 *   FS_CKPT_DIFFUSERS  a diffusers `transformer/` folder: config.json, the weights split into
 *                      diffusion_pytorch_model-0000k-of-0000n.safetensors shards by Hugging Face's
 *                      max_shard_size rule, and diffusion_pytorch_model.safetensors.index.json
 *                      (one shard: diffusion_pytorch_model.safetensors, no index, as HF does);
 *   FS_CKPT_PIPELINE   a pipeline folder around it: model_index.json,
 *                      scheduler/scheduler_config.json (FLUX.1-dev's or -schnell's values),
 *                      transformer/;
 *   FS_CKPT_BFL        one file with BFL's names (flux1-dev.safetensors): fused qkv and linear1,
 *                      final_layer.adaLN_modulation.1 with its halves swapped — the mapping
 *                      fs_weights_load reads (fs_weights_bfl_source).
 * Stored values: the fp32 synthetic weight (what an fp32 run holds), converted to the file dtype
 * with round-to-nearest-even (BF16: PyTorch's rule; F16: IEEE). So loading a BF16 checkpoint
 * gives exactly bf16(fs_weights_synthetic fp32).
 *
 * Safety: the output is built under a temporary name next to it (OUT.tmp-XXXXXX) and renamed
 * into place only when complete, so an interrupted run never leaves a complete-looking
 * checkpoint; an existing OUT is refused; free disk space is checked before the first byte. */
#ifndef FS_CKPT_H
#define FS_CKPT_H

#include "fs_config.h"
#include "fs_safetensors.h"

/* float -> BF16: fs_bf16_from_float (fs_common.h), c10's round_to_nearest_even. */
/* float -> IEEE binary16, round to nearest even; overflow -> inf; NaN -> quiet NaN (sign kept). */
uint16_t fs_f16_from_float(float f);

/* One tensor of the output: rows [param_r0, param_r0 + nrows) of parameter `param` (index into
 * the layout's params) are rows [dst_r0, ...) of this tensor. Pieces sorted by dst_r0. */
typedef struct fs_ckpt_piece {
    int param;
    int64_t param_r0, nrows, dst_r0;
} fs_ckpt_piece;

typedef struct fs_ckpt_tensor {
    char name[192];
    int ndim;         /* 1 or 2 */
    int64_t shape[2]; /* [rows] or [rows, cols] */
    int np;
    fs_ckpt_piece p[4];
} fs_ckpt_tensor;

typedef enum fs_ckpt_kind { FS_CKPT_DIFFUSERS, FS_CKPT_PIPELINE, FS_CKPT_BFL } fs_ckpt_kind;

typedef struct fs_ckpt_layout {
    fs_config cfg;
    fs_param_desc *params; /* fs_config_params(cfg) */
    int nparams;
    fs_ckpt_tensor *t;     /* in the order the state dict lists them (sharding walks this order) */
    int n;
} fs_ckpt_layout;

/* Diffusers names (one tensor per parameter) or BFL names (bfl != 0; prefix e.g.
 * "model.diffusion_model." or ""). */
int fs_ckpt_layout_init(fs_ckpt_layout *l, const fs_config *c, int bfl, const char *prefix, fs_err *e);
void fs_ckpt_layout_free(fs_ckpt_layout *l);
int64_t fs_ckpt_numel(const fs_ckpt_tensor *t);

/* Hugging Face's split (huggingface_hub split_torch_state_dict_into_shards): walk the tensors in
 * order; a tensor that would push the current shard past max_bytes starts a new shard; a tensor
 * larger than max_bytes gets a shard of its own. shard_of[i] in [0, *nshards). */
void fs_ckpt_shards(const fs_ckpt_layout *l, fs_st_dtype dt, uint64_t max_bytes, int *shard_of, int *nshards);

/* Return non-zero to cancel (the temporaries are removed and FS_E_INPUT "interrupted" returned). */
typedef int (*fs_ckpt_progress_fn)(void *ctx, uint64_t done_bytes, uint64_t total_bytes);

typedef struct fs_ckpt_spec {
    fs_config cfg;
    fs_ckpt_kind kind;
    fs_st_dtype dtype;         /* FS_ST_BF16 (the real checkpoints'), FS_ST_F16 or FS_ST_F32 */
    uint64_t seed;             /* --weights-seed */
    uint64_t max_shard_bytes;  /* diffusers / pipeline: HF max_shard_size (10 GB = 10e9 by default) */
    const char *bfl_prefix;    /* BFL: "" or "model.diffusion_model." */
    fs_ckpt_progress_fn progress;
    void *progress_ctx;
} fs_ckpt_spec;

/* Writes the checkpoint at `out` (a folder for DIFFUSERS/PIPELINE, a file for BFL), which must not
 * exist. On success *bytes_written (if non-NULL) is the tensor data written (the JSON files and
 * safetensors headers not counted). */
int fs_ckpt_write(const fs_ckpt_spec *s, const char *out, uint64_t *bytes_written, fs_err *e);
/* The checks fs_ckpt_write makes before it writes anything (OUT not empty and absent, its
 * directory there, the spec and config valid), for a caller that prints a banner only once they
 * pass. The publication itself never replaces what appeared at OUT meanwhile
 * (renameat2(RENAME_NOREPLACE)), and every file and directory is fsynced before it. */
int fs_ckpt_check_out(const fs_ckpt_spec *s, const char *out, fs_err *e);

/* Reads back a checkpoint at `path` (a file, transformer folder or pipeline folder, in either
 * naming; opened with the loader's reader, so every header and the index are validated) and
 * compares each tensor's bytes with what fs_ckpt_write would write for `s` (config, seed, dtype;
 * kind and shard size do not matter), block by block: a 24 GB checkpoint is checked in constant
 * memory, where loading it in fp32 would need 48 GB. Returns FS_OK with *differing = number of
 * tensors whose bytes differ (the first named in e->msg), or an error for a missing, extra or
 * wrongly shaped/typed tensor. */
int fs_ckpt_verify(const fs_ckpt_spec *s, const char *path, int *differing, fs_err *e);

/* Bytes of tensor data the spec writes (the index's metadata.total_size), for planning. */
uint64_t fs_ckpt_total_bytes(const fs_ckpt_layout *l, fs_st_dtype dt);

#endif
