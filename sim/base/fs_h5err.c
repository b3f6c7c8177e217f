/* fs_h5err.c — one clean line from HDF5's error stack (see fs_h5err.h). */
#include "fs_h5err.h"

#include <hdf5.h>
#include <stdio.h>
#include <string.h>

typedef struct walk_buf {
    char text[1024];
} walk_buf;

/* n == 0 is the innermost error: the most specific description ("Is a directory" rather than
 * "unable to open file"). */
static herr_t err_walk_cb(unsigned n, const H5E_error2_t *err, void *data)
{
    walk_buf *w = data;
    if (n == 0 && err->desc) snprintf(w->text, sizeof w->text, "%s", err->desc);
    return 0;
}

const char *fs_h5_clean(const char *in, char *buf, size_t n)
{
    if (!buf || n == 0) return buf;
    buf[0] = 0;
    if (!in) in = "";
    /* 1. control characters -> space, runs of spaces collapsed, ends trimmed */
    char tmp[1024];
    size_t o = 0;
    for (const char *p = in; *p && o + 1 < sizeof tmp; p++) {
        /* HDF5's texts are ASCII; anything else (a damaged file's bytes echoed back) is shown as
         * '?' so the line stays printable */
        char c = (unsigned char)*p < 0x20 || *p == 0x7f ? ' ' : (unsigned char)*p >= 0x80 ? '?' : *p;
        if (c == ' ' && (o == 0 || tmp[o - 1] == ' ')) continue;
        tmp[o++] = c;
    }
    while (o && tmp[o - 1] == ' ') o--;
    tmp[o] = 0;
    /* 2. "what: k = v, k = v, error message = 'why', ..." (H5FD's read/write failures) ->
     *    "what: why". Those fields are a dump of the call's arguments, useless to a user. */
    char out[1024];
    const char *em = strstr(tmp, "error message = '");
    const char *colon = strchr(tmp, ':');
    if (em && colon && colon < em) {
        const char *why = em + strlen("error message = '");
        const char *end = strchr(why, '\'');
        size_t wl = end ? (size_t)(end - why) : strlen(why);
        snprintf(out, sizeof out, "%.*s: %.*s", (int)(colon - tmp), tmp, (int)wl, why);
    } else {
        snprintf(out, sizeof out, "%s", tmp);
    }
    /* 3. drop every "key = 0x<hex>" field, key included: heap pointers ("buf = 0x7ffd...")
     * mean nothing to a user and make every message unique */
    for (char *q; (q = strstr(out, "= 0x")) != NULL;) {
        char *kend = q;
        while (kend > out && kend[-1] == ' ') kend--;
        char *kstart = kend;
        while (kstart > out && kstart[-1] != ' ' && kstart[-1] != ',') kstart--;
        char *vend = q + 4;
        while (*vend && strchr("0123456789abcdefABCDEF", *vend)) vend++;
        while (*vend == ',' || *vend == ' ') vend++;
        while (kstart > out && (kstart[-1] == ' ' || kstart[-1] == ',') && !*vend) kstart--;
        memmove(kstart, vend, strlen(vend) + 1);
    }
    /* 4. fit n at a word boundary */
    size_t len = strlen(out);
    if (len < n) {
        memcpy(buf, out, len + 1);
        return buf;
    }
    const char *more = "...";
    size_t room = n > 4 ? n - 4 : 0; /* chars of text that fit with "..." and the NUL */
    size_t cut = room;
    while (cut > 0 && out[cut] != ' ') cut--;
    if (cut == 0) cut = room; /* one long word: cut it, there is no boundary */
    while (cut > 0 && (out[cut - 1] == ' ' || out[cut - 1] == ',')) cut--;
    if (n > 4) snprintf(buf, n, "%.*s%s", (int)cut, out, more);
    else buf[0] = 0;
    return buf;
}

const char *fs_h5_cause(char *buf, size_t n)
{
    walk_buf w;
    w.text[0] = 0;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, err_walk_cb, &w);
    if (!w.text[0]) snprintf(w.text, sizeof w.text, "HDF5 error");
    return fs_h5_clean(w.text, buf, n);
}
