/* fs_tensor.c — fs_tensor.h: shapes, host allocation, views, host copies. Nothing here touches a
 * backend: what does (fs_tensor_alloc_on, fs_tensor_free, upload, download, host views) is in
 * fs_backend.c. */
#include "fs_tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fs_tensor_init_shape(fs_tensor *t, fs_dtype dt, int ndim, const int64_t *shape, fs_err *e)
{
    memset(t, 0, sizeof *t);
    if (ndim < 1 || ndim > FS_MAX_DIMS)
        return fs_errf(e, FS_E_INTERNAL, "tensor rank %d out of range 1..%d", ndim, FS_MAX_DIMS);
    t->dtype = dt;
    t->ndim = ndim;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return fs_errf(e, FS_E_INTERNAL, "negative tensor dimension");
        /* numel · 8 bytes must fit in int64: sizes come from configs and files */
        if (shape[i] > 0 && n > (INT64_C(1) << 59) / shape[i])
            return fs_errf(e, FS_E_INPUT, "tensor of more than 2^59 elements requested");
        n *= shape[i];
        t->shape[i] = shape[i];
    }
    return FS_OK;
}

static int alloc_impl(fs_tensor *t, fs_dtype dt, int ndim, const int64_t *shape, int zero, fs_err *e)
{
    int rc = fs_tensor_init_shape(t, dt, ndim, shape, e);
    if (rc) return rc;
    size_t n = fs_tensor_nbytes(t);
    /* 64-byte alignment: what OpenBLAS and AVX-512 loads like best. */
    size_t alloc = (n + 63) / 64 * 64;
    if (alloc == 0) alloc = 64;
    t->data = aligned_alloc(64, alloc);
    if (!t->data) return fs_errf(e, FS_E_NOMEM, "out of memory allocating %zu bytes", n);
    if (zero) memset(t->data, 0, alloc);
    t->owns = 1;
    return FS_OK;
}

int fs_tensor_alloc(fs_tensor *t, fs_dtype dt, int ndim, const int64_t *shape, fs_err *e)
{
    return alloc_impl(t, dt, ndim, shape, 1, e);
}

int fs_tensor_alloc_uninit(fs_tensor *t, fs_dtype dt, int ndim, const int64_t *shape, fs_err *e)
{
    return alloc_impl(t, dt, ndim, shape, 0, e);
}

int fs_tensor_alloc2(fs_tensor *t, fs_dtype dt, int64_t d0, int64_t d1, fs_err *e)
{
    int64_t s[2] = {d0, d1};
    return fs_tensor_alloc(t, dt, 2, s, e);
}

int fs_tensor_alloc3(fs_tensor *t, fs_dtype dt, int64_t d0, int64_t d1, int64_t d2, fs_err *e)
{
    int64_t s[3] = {d0, d1, d2};
    return fs_tensor_alloc(t, dt, 3, s, e);
}

int64_t fs_tensor_numel(const fs_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return t->ndim ? n : 0;
}

size_t fs_tensor_nbytes(const fs_tensor *t)
{
    return (size_t)fs_tensor_numel(t) * fs_dtype_size(t->dtype);
}

fs_tensor fs_tensor_reshape(const fs_tensor *t, int ndim, const int64_t *shape)
{
    fs_tensor v = *t;
    v.owns = 0;
    v.ndim = ndim;
    for (int i = 0; i < ndim; i++) v.shape[i] = shape[i];
    return v;
}

fs_tensor fs_tensor_rows(const fs_tensor *t, int64_t r0, int64_t n)
{
    fs_tensor v = *t;
    v.owns = 0;
    int64_t row = fs_tensor_numel(t) / (t->shape[0] ? t->shape[0] : 1);
    v.shape[0] = n;
    v.data = (char *)t->data + (size_t)(r0 * row) * fs_dtype_size(t->dtype);
    return v;
}

const char *fs_tensor_shape_str(const fs_tensor *t, char *buf, size_t n) { return fs_shape_str(t->ndim, t->shape, buf, n); }

double fs_tensor_get(const fs_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case FS_F64: return ((const double *)t->data)[i];
    case FS_BF16: return fs_bf16_to_float(((const uint16_t *)t->data)[i]);
    default: return ((const float *)t->data)[i];
    }
}

void fs_tensor_set(fs_tensor *t, int64_t i, double v)
{
    switch (t->dtype) {
    case FS_F64: ((double *)t->data)[i] = v; break;
    case FS_BF16: ((uint16_t *)t->data)[i] = fs_bf16_from_float((float)v); break;
    default: ((float *)t->data)[i] = (float)v;
    }
}

int fs_tensor_copy(fs_tensor *dst, const fs_tensor *src, fs_err *e)
{
    int64_t n = fs_tensor_numel(src);
    if (n != fs_tensor_numel(dst))
        return fs_errf(e, FS_E_INTERNAL, "copy of %lld elements into %lld", (long long)n,
                       (long long)fs_tensor_numel(dst));
    if (dst->dtype == src->dtype) {
        memmove(dst->data, src->data, fs_tensor_nbytes(src));
    } else if (dst->dtype == FS_F64 && src->dtype == FS_F32) {
        const float *s = src->data;
        double *d = dst->data;
        for (int64_t i = 0; i < n; i++) d[i] = s[i];
    } else if (dst->dtype == FS_F32 && src->dtype == FS_F64) {
        const double *s = src->data;
        float *d = dst->data;
        for (int64_t i = 0; i < n; i++) d[i] = (float)s[i];
    } else {
        for (int64_t i = 0; i < n; i++) fs_tensor_set(dst, i, fs_tensor_get(src, i));
    }
    return FS_OK;
}
