/* fs_record.h — the one hook the forward calls for every module output.
 *
 * The forward knows nothing about HDF5 or checking: it calls rec->fn(ctx, name, tensor, shard)
 * with the diffusers module path (flux-dump naming: "#k" tuple elements, "@k" repeated calls),
 * a tensor in PyTorch's shape as this rank holds it, and how that local tensor sits in the
 * global one. Consumers: the HDF5 dump writer, --check. A NULL fn records nothing and costs one
 * branch per module. */
#ifndef FS_RECORD_H
#define FS_RECORD_H

#include "fs_tensor.h"

/* Which part of the global tensor a rank holds: along up to two axes, a list of half-open
 * intervals of the global axis, in the order they appear in the local tensor (a joint-sequence
 * shard is [its text tokens | its image tokens], two intervals). ndims == 0: the whole tensor
 * (replicated: every rank must hold identical values). */
#define FS_SHARD_MAX_IV 5 /* FS_TP_MAX_BLOCKS: a packed_colwise output holds 5 blocks */
typedef struct fs_shard_dim {
    int dim;  /* axis of the local/global tensor, 0-based */
    int n;    /* intervals */
    int64_t iv[FS_SHARD_MAX_IV][2];
} fs_shard_dim;

typedef struct fs_shard {
    int ndims;
    fs_shard_dim d[2];
    /* Which independent computation of its elements this piece is: 0 for every layout that
     * computes each element once (and replicated tensors, whose copies must be bit-identical).
     * Under --text replicated with ring > 1 each ring rank computes the whole text itself, its
     * queries merged over the ring in its own order: the text's copies differ in rounding, and
     * each copy is judged on its own (fs_gather.h). */
    int copy;
} fs_shard;

typedef int (*fs_record_fn)(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e);

typedef struct fs_recorder {
    fs_record_fn fn;
    void *ctx;
} fs_recorder;

#endif
