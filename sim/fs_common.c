#include "fs_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int fs_errf(fs_err *e, int code, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
        e->code = code;
    }
    return code;
}

int fs_err_prefix(fs_err *e, const char *fmt, ...)
{
    if (!e) return FS_E_INTERNAL;
    char old[sizeof e->msg];
    memcpy(old, e->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof e->msg) {
        size_t room = sizeof e->msg - (size_t)n;
        strncpy(e->msg + n, old, room - 1);
        e->msg[sizeof e->msg - 1] = 0;
    }
    return e->code;
}

size_t fs_dtype_size(fs_dtype dt) { return dt == FS_F64 ? 8 : dt == FS_BF16 ? 2 : 4; }
const char *fs_dtype_name(fs_dtype dt) { return dt == FS_F64 ? "float64" : dt == FS_BF16 ? "bfloat16" : "float32"; }

const char *fs_shape_str(int ndim, const int64_t *shape, char *buf, size_t n)
{
    if (!buf || n == 0) return buf;
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}
