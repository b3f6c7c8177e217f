/* fs_record.h — the one hook the forward calls for every module output.
 *
 * The forward knows nothing about HDF5 or checking: it calls rec->fn(ctx, name, tensor) with
 * the diffusers module path (flux-dump naming: "#k" tuple elements, "@k" repeated calls) and a
 * tensor in PyTorch's shape. Consumers: the HDF5 dump writer, and later --check. A NULL fn
 * means "record nothing" and costs one branch per module. */
#ifndef FS_RECORD_H
#define FS_RECORD_H

#include "fs_tensor.h"

typedef int (*fs_record_fn)(void *ctx, const char *name, const fs_tensor *t, fs_err *e);

typedef struct fs_recorder {
    fs_record_fn fn;
    void *ctx;
} fs_recorder;

#endif
