/* fs_weights_load.h — a safetensors checkpoint (diffusers or BFL names; one file, a sharded
 * folder or a pipeline folder) as a source of parameters: opened and validated against the
 * parameter list, then each parameter's TP piece made on demand (a view into the mapping when the
 * bytes are already what the run computes with). Below fs_weights, which calls it to make what a
 * rank holds; it knows parameters and splits, never an fs_weights. */
#ifndef FS_WEIGHTS_LOAD_H
#define FS_WEIGHTS_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "fs_config.h"
#include "fs_plan.h"
#include "fs_tensor.h"

typedef struct fs_wload fs_wload; /* an open checkpoint as a source of parameters */

/* The loader as a source (fs_weights_load.c): opens and validates a checkpoint against the
 * parameter list; fs_wload_make makes parameter i's piece `sh` in dtype dt (a view when it can). */
int fs_wload_open(fs_wload **l, const fs_config *c, const fs_param_desc *desc, int n, const char *path, fs_err *e);
int fs_wload_make(const fs_wload *l, int i, const fs_param_desc *d, const fs_tp_split *sh, fs_dtype dt, fs_tensor *t,
                  fs_err *e);
const char *fs_wload_path(const fs_wload *l);
/* Files of the open checkpoint (shards). */
int fs_wload_nfiles(const fs_wload *l);
/* 1 when bytes [p, p + n) lie in the checkpoint's mappings (a weight used in place). */
int fs_wload_maps(const fs_wload *l, const void *p, size_t n);
/* Drops parameter i's file pages from the resident set (they stay in the page cache). */
void fs_wload_drop(const fs_wload *l, int i);
void fs_wload_free(fs_wload *l);

/* Where a BFL single-file checkpoint keeps diffusers parameter `d` (the mapping fs_weights_load
 * reads with, for writers such as tools/gen/make_checkpoint.c): the BFL tensor `name` (no
 * "model.diffusion_model." prefix), its first dimension `rows` (the fused size for qkv/linear1),
 * and *np pieces: rows [src_r0, src_r0 + nrows) of the BFL tensor are rows [dst_r0, ...) of d
 * (two pieces for norm_out's swapped halves). Returns -1 for a parameter no rule covers. */
typedef struct fs_bfl_piece {
    int64_t src_r0, nrows, dst_r0;
} fs_bfl_piece;
int fs_weights_bfl_source(const fs_param_desc *d, const fs_config *c, char *name, size_t name_len, int64_t *rows,
                          fs_bfl_piece p[2], int *np);

#endif
