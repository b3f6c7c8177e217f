/* fs_tensor.h — a dense, contiguous, row-major tensor, in host memory or in a backend's memory.
 *
 * `be` says where the bytes live: NULL is plain host memory (inputs, weights as loaded, what
 * recorders download); otherwise the memory of that backend (fs_backend.h), which may not be
 * addressable from the host at all (a GPU, or the strict test backend). Only the backend's own
 * ops may touch such memory; pointer arithmetic on `data` to address a sub-block is fine (as
 * with device pointers), dereferencing it is not. fs_tensor_is_host() (fs_backend.h) tells which case holds.
 *
 * This module knows shapes, host memory and views only. What goes through a backend's memory
 * ops (fs_tensor_alloc_on, fs_tensor_free, fs_tensor_is_host, upload, download, host views) is
 * declared in fs_backend.h, the layer above, which builds on this one.
 *
 * A tensor either owns its buffer (owns=1, freed by fs_tensor_free through its backend) or is a
 * view into memory owned elsewhere (an mmap'd checkpoint, a slice of a bigger tensor). Views
 * never outlive their owner; fs_tensor_free on a view only clears it. No strides on purpose:
 * every kernel can assume contiguous rows, and the few places that need a strided slice copy it
 * with a 2-D copy. */
#ifndef FS_TENSOR_H
#define FS_TENSOR_H

#include "fs_common.h"

#define FS_MAX_DIMS 4

struct fs_backend;

typedef struct fs_tensor {
    fs_dtype dtype;
    int ndim;
    int64_t shape[FS_MAX_DIMS];
    void *data;            /* host memory (be == NULL) or memory of `be` */
    struct fs_backend *be; /* memory space: NULL = host */
    int owns;
} fs_tensor;

/* Host tensors, zero-filled, 64-byte aligned; fs_tensor_free (fs_backend.h) frees them. */
int fs_tensor_alloc(fs_tensor *t, fs_dtype dt, int ndim, const int64_t *shape, fs_err *e);
/* The same without the zero fill: the contents are undefined until written. For callers that write
 * every element themselves (fs_weights_synthetic_shard), so that the pages are first touched by
 * the threads that fill them rather than by one memset. */
int fs_tensor_alloc_uninit(fs_tensor *t, fs_dtype dt, int ndim, const int64_t *shape, fs_err *e);
int fs_tensor_alloc2(fs_tensor *t, fs_dtype dt, int64_t d0, int64_t d1, fs_err *e);
int fs_tensor_alloc3(fs_tensor *t, fs_dtype dt, int64_t d0, int64_t d1, int64_t d2, fs_err *e);
/* Sets t's dtype and shape, no data (t->data NULL, owns 0), after checking the rank (1..4) and
 * the size (numel · 8 bytes fits in int64): what every allocator does first, here and in
 * fs_backend.c's fs_tensor_alloc_on. */
int fs_tensor_init_shape(fs_tensor *t, fs_dtype dt, int ndim, const int64_t *shape, fs_err *e);

int64_t fs_tensor_numel(const fs_tensor *t);
size_t fs_tensor_nbytes(const fs_tensor *t);

/* A view of the same memory with another shape (numel must match). */
fs_tensor fs_tensor_reshape(const fs_tensor *t, int ndim, const int64_t *shape);
/* A view of rows [r0, r0+n) along the first dimension. */
fs_tensor fs_tensor_rows(const fs_tensor *t, int64_t r0, int64_t n);
/* Shape as "[1, 64, 128]" into buf. */
const char *fs_tensor_shape_str(const fs_tensor *t, char *buf, size_t n);

/* Element i (flat index) as double, whatever the dtype. Host-addressable tensors only (see
 * fs_tensor_is_host): for tests and reports, never kernels. */
double fs_tensor_get(const fs_tensor *t, int64_t i);
void fs_tensor_set(fs_tensor *t, int64_t i, double v);
/* Host copy with dtype conversion (bf16 rounds to nearest even); numel must match. */
int fs_tensor_copy(fs_tensor *dst, const fs_tensor *src, fs_err *e);

#endif
