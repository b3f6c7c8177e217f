#include "fs_common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int fs_read_text_file(const char *path, const char *what, const char *limit, size_t max, char **text, fs_err *e)
{
    *text = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fs_errf(e, FS_E_INPUT, "%s: cannot open %s: %s", path, what, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return fs_errf(e, FS_E_IO, "%s: cannot stat %s: %s", path, what, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fs_errf(e, FS_E_INPUT, "%s: %s is %s, not a regular file", path, what,
                       S_ISDIR(st.st_mode) ? "a directory" : "a device, FIFO or socket");
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return fs_errf(e, FS_E_INPUT, "%s: %s file is %lld bytes; %s %zu bytes", path, what, (long long)st.st_size,
                       limit, max);
    }
    char *buf = malloc((size_t)st.st_size + 2);
    if (!buf) {
        close(fd);
        return fs_errf(e, FS_E_NOMEM, "%s: out of memory reading %s", path, what);
    }
    /* one byte more than stat said: a file that grew meanwhile is noticed, not cut */
    size_t got = 0, want = (size_t)st.st_size + 1;
    while (got < want) {
        ssize_t r = read(fd, buf + got, want - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int err = errno;
            close(fd);
            free(buf);
            return fs_errf(e, FS_E_IO, "%s: cannot read %s: %s", path, what, strerror(err));
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    const char *nul = memchr(buf, 0, got);
    int rc = FS_OK;
    if (got != (size_t)st.st_size)
        rc = fs_errf(e, FS_E_IO, "%s: %s changed size while being read (%lld bytes, then %zu)", path, what,
                     (long long)st.st_size, got);
    else if (nul) /* a parser stops at a NUL: what follows would be dropped silently */
        rc = fs_errf(e, FS_E_INPUT, "%s: %s holds a NUL byte at offset %zu: not a text file", path, what,
                     (size_t)(nul - buf));
    if (rc) {
        free(buf);
        return rc;
    }
    buf[got] = 0;
    *text = buf;
    return FS_OK;
}
