/* fs_common.h — error reporting and dtypes shared by every flux-sim module.
 *
 * Library code never prints and never exits: it fills an fs_err with one line that names the
 * file, tensor and cause, and returns its code. Only the CLI decides the exit status. */
#ifndef FS_COMMON_H
#define FS_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "fs_version.h" /* FS_VERSION: one version for flux-sim and flux-oracle */

/* Error codes double as process exit codes where that makes sense (2 = usage/input error,
 * the h5diff convention that flux-oracle and --check follow). */
enum {
    FS_OK = 0,
    FS_DIVERGED = 1,   /* --check found a divergence (not an error: the exit code of a finding) */
    FS_E_INPUT = 2,    /* bad file, bad argument, malformed data: the user can fix it */
    FS_E_IO = 3,       /* the OS refused (open/write/mmap/rename) */
    FS_E_NOMEM = 4,
    FS_E_INTERNAL = 5, /* a bug in flux-sim */
};

typedef struct fs_err {
    int code;
    char msg[1024];
} fs_err;

/* Set *e (if non-NULL) and return code. printf-style message, no trailing newline. */
int fs_errf(fs_err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prefix an existing message with more context ("loading X: " + old message). */
int fs_err_prefix(fs_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef enum fs_dtype { FS_F32 = 0, FS_F64 = 1 } fs_dtype;

size_t fs_dtype_size(fs_dtype dt);
const char *fs_dtype_name(fs_dtype dt); /* "float32" / "float64", as flux-dump's `dtype` */

/* "[1, 64, 128]" ("[]" for ndim 0) into buf, cut to fit n. The one shape formatter of the
 * project (tensors, dump datasets, messages), so shapes read the same in every message. */
const char *fs_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

#define FS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
