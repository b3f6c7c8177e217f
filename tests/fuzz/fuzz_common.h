/* fuzz_common.h — helpers shared by the libFuzzer harnesses (tests/fuzz/README.md). */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fs_common.h"

/* A harness-found invariant violation: print and abort, which libFuzzer records as a crash. */
#define FUZZ_ASSERT(cond, ...)                                                          \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "fuzz invariant violated at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
            abort();                                                                    \
        }                                                                               \
    } while (0)

/* The input as a file, without touching the disk: one memfd per process, rewritten for each
 * input, opened by the library under test through /proc/self/fd/N like any path. */
static inline const char *fuzz_as_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz-input", MFD_CLOEXEC);
        if (fd < 0) {
            perror("memfd_create");
            abort();
        }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) {
        perror("memfd write");
        abort();
    }
    return path;
}

/* The input as a NUL-terminated string (malloc'd; the caller frees). */
static inline char *fuzz_as_string(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

/* Every error is one line with a known code: the CLI prints it as is. */
static inline void fuzz_check_error(int rc, const fs_err *e)
{
    FUZZ_ASSERT(rc == FS_E_INPUT || rc == FS_E_IO || rc == FS_E_NOMEM, "rc %d: %s", rc, e->msg);
    FUZZ_ASSERT(e->code == rc, "e.code %d != rc %d", e->code, rc);
    FUZZ_ASSERT(!strchr(e->msg, '\n') && e->msg[0], "message '%s'", e->msg);
}

/* A byte script, read front to back (fuzz_oracle_walk, fuzz_reports): past the end every byte
 * is 0. */
typedef struct fuzz_cursor {
    const uint8_t *p;
    size_t n;
} fuzz_cursor;

static inline int fuzz_byte(fuzz_cursor *c)
{
    if (!c->n) return 0;
    c->n--;
    return *c->p++;
}

/* The text up to the next 0xFF, which is consumed (malloc'd; the caller frees). A NUL byte
 * becomes `nul` (a NUL would end the C string early). A byte 0xFE followed by a count k and a
 * byte b stands for b repeated 1024 * (k % 80 + 1) times: long names without long inputs. */
static inline char *fuzz_text(fuzz_cursor *c, char nul)
{
    size_t cap = 64, o = 0;
    char *s = malloc(cap);
    if (!s) abort();
    while (c->n && *c->p != 0xff) {
        int b = fuzz_byte(c);
        size_t rep = 1;
        if (b == 0xfe && c->n >= 2) rep = 1024 * (size_t)(fuzz_byte(c) % 80 + 1), b = fuzz_byte(c);
        if (b == 0) b = (unsigned char)nul;
        if (o + rep + 1 > cap) {
            while (o + rep + 1 > cap) cap *= 2;
            char *t = realloc(s, cap);
            if (!t) abort();
            s = t;
        }
        memset(s + o, b, rep);
        o += rep;
    }
    if (c->n) c->n--, c->p++; /* the separator */
    s[o] = 0;
    return s;
}

#endif
