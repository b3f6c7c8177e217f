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

/* the length of the valid UTF-8 sequence at s (1-4; 0: not valid UTF-8): well-formed per RFC 3629,
 * so overlong forms, surrogates (U+D800-DFFF) and code points above U+10FFFF are not valid */
static size_t utf8_valid_len(const unsigned char *s, size_t left)
{
    const unsigned char c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80) return 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07;
    else return 0;
    if (len > left) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    if (cp == 0xFFFE || cp == 0xFFFF) return 0; /* not characters: XML refuses them too */
    return len;
}

const char *fs_printable_n(const char *s, size_t len, char *buf, size_t n, size_t max_in)
{
    if (!buf || n == 0) return buf;
    size_t o = 0;
    const unsigned char *u = (const unsigned char *)(s ? s : "");
    const size_t show = len < max_in ? len : max_in;
    char tail[48] = "";
    if (show < len) snprintf(tail, sizeof tail, "...(%zu bytes)", len);
    const size_t room = n - 1 > strlen(tail) ? n - 1 - strlen(tail) : 0;
    for (size_t i = 0; i < show;) {
        char esc[8];
        size_t k = utf8_valid_len(u + i, show - i);
        const char *piece;
        size_t plen;
        if (k == 1 && u[i] >= 0x20 && u[i] != 0x7F) piece = (const char *)u + i, plen = 1;
        else if (k > 1) piece = (const char *)u + i, plen = k;
        else {
            const unsigned char c = u[i];
            if (c == '\n') snprintf(esc, sizeof esc, "\\n");
            else if (c == '\t') snprintf(esc, sizeof esc, "\\t");
            else if (c == '\r') snprintf(esc, sizeof esc, "\\r");
            else snprintf(esc, sizeof esc, "\\x%02X", c);
            piece = esc, plen = strlen(esc), k = 1;
        }
        if (o + plen > room) {
            snprintf(tail, sizeof tail, "...(%zu bytes)", len);
            break;
        }
        memcpy(buf + o, piece, plen);
        o += plen;
        i += k;
    }
    size_t tl = strlen(tail);
    if (o + tl > n - 1) tl = n - 1 - o;
    memcpy(buf + o, tail, tl);
    buf[o + tl] = 0;
    return buf;
}

const char *fs_printable(const char *s, char *buf, size_t n, size_t max_in)
{
    return fs_printable_n(s, s ? strlen(s) : 0, buf, n, max_in);
}

int fs_require_regular_file(const char *path, const char *what, fs_err *e)
{
    struct stat st;
    char p[320];
    fs_printable(path, p, sizeof p, 256);
    if (stat(path, &st) != 0) {
        const int err = errno;
        struct stat lst;
        if (err == ENOENT && lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode))
            return fs_errf(e, FS_E_INPUT, "%s: %s is a dangling symbolic link", p, what);
        return fs_errf(e, FS_E_INPUT, "%s: cannot open %s: %s", p, what, strerror(err));
    }
    if (S_ISREG(st.st_mode)) return FS_OK;
    return fs_errf(e, FS_E_INPUT, "%s: %s is %s, not a regular file", p, what,
                   S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket");
}
