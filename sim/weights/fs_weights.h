/* fs_weights.h — the model's parameters, by diffusers state_dict name.
 *
 * One fs_weights holds every tensor of fs_config_params(cfg) in the run's dtype, either
 * generated (deterministic synthetic weights) or loaded from safetensors (a file, a directory
 * holding one, or a Hugging Face sharded layout with *.safetensors.index.json; diffusers names
 * or BFL single-file names). Loaded F32 tensors in an F32 run are views into the mmap'd file
 * (no copy); anything that needs conversion (BF16, F16, F64 runs) is decoded into owned memory. */
#ifndef FS_WEIGHTS_H
#define FS_WEIGHTS_H

#include "fs_config.h"
#include "fs_plan.h"
#include "fs_tensor.h"
#include "fs_weights_load.h"
#include "fs_weights_synth.h"


typedef struct fs_weights {
    fs_config cfg;
    fs_dtype dtype;
    int n;                /* == length of fs_config_params(&cfg) */
    fs_param_desc *desc;  /* [n], from fs_config_params */
    fs_tensor *t;         /* [n], t[i] is desc[i]; views or owned; ndim 0 while not made (streaming) */
    char source[512];     /* "synthetic seed 0" or the path loaded */
    int tp, tp_rank;      /* tp == 1: full tensors; tp > 1: t[i] is rank tp_rank's shard of every
                             Linear the TP plan splits (fs_weights_shard_of), the rest in full */
    /* where parameters are made from, so they can be made again: a checkpoint kept open (mmap'd),
     * or the synthetic generator; the split and the dtype they are made in */
    fs_wload *load;       /* NULL: synthetic */
    uint64_t seed;
    const struct fs_plan *plan;
    const fs_inject *inj;
    fs_dtype make_dtype;  /* made in this dtype, then converted to dtype (--match bf16: bf16) */
    int streaming;        /* block parameters are made by fs_weights_acquire and freed by
                             fs_weights_release; the rest (embedders, norm_out) stay made */
    int64_t peak_bytes;   /* the most fs_weights_resident_bytes has been (after each make) */
} fs_weights;

/* ---- Opening, streaming ----
 * A rank holds either every parameter of its TP shard (the default for small models), or —
 * streaming — only the small top-level ones (embedders, norm_out, proj_out) plus the block it is
 * computing: fs_model_forward acquires "transformer_blocks.<i>." / "single_transformer_blocks.<i>."
 * before a block and releases it after. Each parameter is made for this rank's shard only: a view
 * into the mapped checkpoint when the bytes already are what the run computes with, else those
 * rows and columns decoded (never the whole tensor), or generated. */
typedef struct fs_weights_opts {
    const char *path;          /* a checkpoint (fs_weights_load), or NULL: synthetic */
    uint64_t seed;             /* synthetic */
    fs_dtype dtype;            /* the run's */
    fs_dtype make_dtype;       /* made in this first (bf16 for --match bf16), then converted; 0: dtype */
    const struct fs_plan *plan;
    int tp, tp_rank;           /* tp <= 1: full tensors */
    const fs_inject *inj;      /* --inject bugs that change the split */
    int stream;
} fs_weights_opts;
int fs_weights_open(fs_weights *w, const fs_config *c, const fs_weights_opts *o, fs_err *e);
/* Makes every parameter whose name starts with `prefix` (e.g. "transformer_blocks.3."); a no-op
 * for parameters already made. */
int fs_weights_acquire(fs_weights *w, const char *prefix, fs_err *e);
/* Streaming: frees the parameters under `prefix`. Otherwise a no-op. */
void fs_weights_release(fs_weights *w, const char *prefix);
/* Remakes the weights for another TP split (rank 0 after the single-rank --check reference) or
 * another dtype (the matched float64 truth of a bf16 --check): everything made so far is dropped
 * and made again as the new split / dtype says. */
int fs_weights_resplit(fs_weights *w, const struct fs_plan *plan, int T, int t, const fs_inject *inj, fs_err *e);
int fs_weights_set_dtype(fs_weights *w, fs_dtype dt, fs_err *e);
/* Bytes the made parameters hold (views into a mapping count 0: they are the file's pages). */
int64_t fs_weights_resident_bytes(const fs_weights *w);
/* Turns streaming on (block parameters dropped now, made block by block) or off (everything made
 * now and kept). */
int fs_weights_set_streaming(fs_weights *w, int on, fs_err *e);
/* Bytes the block parameters of TP rank t of T take when all are made in the run dtype: what
 * streaming saves, less one block. -1 on error. */
int64_t fs_weights_block_bytes(const fs_weights *w, int T, int t, fs_err *e);
/* --stream auto streams when a rank's block parameters exceed this */
#define FS_STREAM_AUTO_BYTES (2.0 * 1024 * 1024 * 1024)

/* Synthetic weights with the magnitudes of ../shared/reference/README.md: Linear weight
 * ~ N(0, 1/in), bias ~ N(0, 0.05^2), RMSNorm weight ~ 1 + N(0, 0.1^2); element i of tensor
 * `name` is fs_rng_normal(fs_rng_key(seed, name), i) scaled. */
int fs_weights_synthetic(fs_weights *w, const fs_config *c, fs_dtype dt, uint64_t seed, fs_err *e);
/* Load from safetensors (fs_weights_open with a path, full tensors). `path` is a .safetensors
 * file, a *.safetensors.index.json, a directory containing either, or a diffusers pipeline folder
 * (its transformer/ is opened; fs_pipeline.h). Every tensor is validated
 * against the config (dtype, shape, bounds, overlap); missing or unexpected tensors are errors. */
int fs_weights_load(fs_weights *w, const fs_config *c, fs_dtype dt, const char *path, fs_err *e);

/* Which part of parameter `d` TP rank t of T holds under `plan`: the TP split of its Linear
 * (fs_tp_split_of, the one owner of that arithmetic): rows [r0, r1) and the column intervals.
 * RMSNorm weights and parameters of replicated Linears get the whole tensor. */
struct fs_plan;
int fs_weights_shard_of(const fs_param_desc *d, const struct fs_plan *plan, const fs_config *c, int T, int t,
                        const fs_inject *inj, fs_tp_split *s, fs_err *e);
/* Synthetic weights, only rank t's shard of each plan-split Linear (bit-identical to the same
 * elements of the full tensors: the RNG is addressed by element). */
int fs_weights_synthetic_shard(fs_weights *w, const fs_config *c, fs_dtype dt, uint64_t seed,
                               const struct fs_plan *plan, int T, int t, const fs_inject *inj, fs_err *e);
/* Cut full weights down to rank t's shards in place: colwise row slices of an mmap'd tensor stay
 * views (no copy); column slices (rowwise, packed_rowwise) are copied. With --inject
 * fused-qkv-contiguous the q/k/v projections are cut from their fused [q; k; v] instead (the bug
 * needs every rank's full q, k and v, so it only exists here, not in synthetic shards). */
int fs_weights_shard(fs_weights *w, const struct fs_plan *plan, int T, int t, const fs_inject *inj, fs_err *e);

/* The weights as a backend computes with them: `on` gets the same names and shapes, its tensors
 * in the memory of `be` — views of w's tensors when be's memory is host-addressable (the CPU
 * backend: nothing is copied), uploaded copies otherwise (a GPU, cpu-strict). w must outlive on;
 * fs_weights_free(on) frees only what was uploaded. */
int fs_weights_on(const fs_weights *w, struct fs_backend *be, fs_weights *on, fs_err *e);
/* The same for the parameters under `prefix` only (a block being streamed); parameters not made
 * are skipped by both. */
int fs_weights_on_prefix(const fs_weights *w, struct fs_backend *be, const char *prefix, fs_weights *on, fs_err *e);

/* Tensor by diffusers name, NULL if the config has no such parameter. */
const fs_tensor *fs_weights_get(const fs_weights *w, const char *name);
void fs_weights_free(fs_weights *w);

/* Internal helper shared by the loaders: allocate w->desc/w->t for cfg (tensors left empty). */
int fs_weights_init_empty(fs_weights *w, const fs_config *c, fs_dtype dt, fs_err *e);

#endif
