/* fs_backend.c — fs_backend.h beyond the table of ops: the LSE layout names, and the tensors that
 * live in a backend's memory (allocation, freeing, upload, download, host views), which go through
 * the backend's memory ops. The backends themselves are fs_backend_cpu.c, fs_backend_strict.c and
 * gpu/; the registry that opens one by name is fs_backends.c. */
#include "fs_backend.h"

#include <stdlib.h>
#include <string.h>

const char *fs_lse_layout_name(fs_lse_layout l) { return l == FS_LSE_BSH ? "bsh" : "bhs"; }

/* ---------------------------------------------------------------- tensors in a backend's memory */

static int alloc_on(fs_tensor *t, fs_backend *be, fs_dtype dt, int ndim, const int64_t *shape, int zero, fs_err *e)
{
    if (!be) return zero ? fs_tensor_alloc(t, dt, ndim, shape, e) : fs_tensor_alloc_uninit(t, dt, ndim, shape, e);
    int rc = fs_tensor_init_shape(t, dt, ndim, shape, e);
    if (rc) return rc;
    size_t n = fs_tensor_nbytes(t);
    if ((rc = be->alloc(be, n ? n : 1, &t->data, e))) return rc;
    t->be = be;
    t->owns = 1;
    if (zero && (rc = be->memset(be, t->data, 0, n, e))) fs_tensor_free(t);
    return rc;
}

int fs_tensor_alloc_on(fs_tensor *t, fs_backend *be, fs_dtype dt, int ndim, const int64_t *shape, fs_err *e)
{
    return alloc_on(t, be, dt, ndim, shape, 1, e);
}

int fs_tensor_alloc_on_uninit(fs_tensor *t, fs_backend *be, fs_dtype dt, int ndim, const int64_t *shape, fs_err *e)
{
    return alloc_on(t, be, dt, ndim, shape, 0, e);
}

void fs_tensor_free(fs_tensor *t)
{
    if (!t) return;
    if (t->owns) {
        if (t->be) t->be->free(t->be, t->data);
        else free(t->data);
    }
    memset(t, 0, sizeof *t);
}

int fs_tensor_is_host(const fs_tensor *t) { return !t->be || t->be->host_addressable; }

static int check_pair(const fs_tensor *a, const fs_tensor *b, const char *what, fs_err *e)
{
    if (a->dtype != b->dtype || fs_tensor_numel(a) != fs_tensor_numel(b))
        return fs_errf(e, FS_E_INTERNAL, "%s: %s x %lld into %s x %lld", what, fs_dtype_name(b->dtype),
                       (long long)fs_tensor_numel(b), fs_dtype_name(a->dtype), (long long)fs_tensor_numel(a));
    return FS_OK;
}

int fs_tensor_upload(fs_tensor *dst, const fs_tensor *src, fs_err *e)
{
    int rc = check_pair(dst, src, "upload", e);
    if (rc) return rc;
    size_t n = fs_tensor_nbytes(src);
    if (n == 0 || dst->data == src->data) return FS_OK;
    if (!dst->be) {
        memcpy(dst->data, src->data, n);
        return FS_OK;
    }
    return dst->be->upload2d(dst->be, dst->data, n, src->data, n, n, 1, e);
}

int fs_tensor_download(fs_tensor *dst, const fs_tensor *src, fs_err *e)
{
    int rc = check_pair(dst, src, "download", e);
    if (rc) return rc;
    size_t n = fs_tensor_nbytes(src);
    if (n == 0 || dst->data == src->data) return FS_OK;
    if (!src->be) {
        memcpy(dst->data, src->data, n);
        return FS_OK;
    }
    return src->be->download2d(src->be, dst->data, n, src->data, n, n, 1, e);
}

int fs_tensor_host_view(const fs_tensor *src, fs_tensor *out, fs_err *e)
{
    if (fs_tensor_is_host(src)) {
        *out = *src;
        out->owns = 0;
        return FS_OK;
    }
    int rc = fs_tensor_alloc(out, src->dtype, src->ndim, src->shape, e);
    if (!rc) rc = fs_tensor_download(out, src, e);
    if (rc) fs_tensor_free(out);
    return rc;
}
