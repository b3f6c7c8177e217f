/* fs_tensor.h — a dense, contiguous, row-major tensor of float or double.
 *
 * A tensor either owns its buffer (owns=1, freed by fs_tensor_free) or is a view into memory
 * owned elsewhere (an mmap'd checkpoint, a slice of a bigger tensor). Views never outlive their
 * owner; fs_tensor_free on a view only clears it. No strides on purpose: every kernel can
 * assume contiguous rows, and the few places that need a strided slice copy it. */
#ifndef FS_TENSOR_H
#define FS_TENSOR_H

#include "fs_common.h"

#define FS_MAX_DIMS 4

typedef struct fs_tensor {
    fs_dtype dtype;
    int ndim;
    int64_t shape[FS_MAX_DIMS];
    void *data;
    int owns;
} fs_tensor;

int fs_tensor_alloc(fs_tensor *t, fs_dtype dt, int ndim, const int64_t *shape, fs_err *e);
/* Zero-filled 1-4 D convenience allocators. */
int fs_tensor_alloc2(fs_tensor *t, fs_dtype dt, int64_t d0, int64_t d1, fs_err *e);
int fs_tensor_alloc3(fs_tensor *t, fs_dtype dt, int64_t d0, int64_t d1, int64_t d2, fs_err *e);
void fs_tensor_free(fs_tensor *t);

int64_t fs_tensor_numel(const fs_tensor *t);
size_t fs_tensor_nbytes(const fs_tensor *t);

/* A view of the same memory with another shape (numel must match). */
fs_tensor fs_tensor_reshape(const fs_tensor *t, int ndim, const int64_t *shape);
/* A view of rows [r0, r0+n) along the first dimension. */
fs_tensor fs_tensor_rows(const fs_tensor *t, int64_t r0, int64_t n);
/* Shape as "[1, 64, 128]" into buf. */
const char *fs_tensor_shape_str(const fs_tensor *t, char *buf, size_t n);

/* Element i (flat index) as double, whatever the dtype. For tests and reports, not kernels. */
double fs_tensor_get(const fs_tensor *t, int64_t i);
void fs_tensor_set(fs_tensor *t, int64_t i, double v);
/* Copy with dtype conversion; shapes must have equal numel. */
int fs_tensor_copy(fs_tensor *dst, const fs_tensor *src, fs_err *e);

#endif
