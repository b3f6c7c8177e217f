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

#endif
