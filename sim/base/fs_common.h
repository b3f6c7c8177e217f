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

/* Storage dtypes. FS_BF16 is bfloat16 storage (the top 16 bits of a float32, uint16_t in
 * memory); what is computed in float32 and where results are rounded is each op's contract
 * (fs_backend.h, docs/bf16.md). */
typedef enum fs_dtype { FS_F32 = 0, FS_F64 = 1, FS_BF16 = 2 } fs_dtype;

size_t fs_dtype_size(fs_dtype dt);
const char *fs_dtype_name(fs_dtype dt); /* "float32" / "float64" / "bfloat16", as flux-dump's `dtype` */

/* bfloat16 <-> float32. Rounding is to nearest, ties to even, exactly c10's
 * round_to_nearest_even (what torch's .to(bfloat16) does; __float2bfloat16_rn on GPUs): NaN
 * becomes the canonical 0x7FC0. */
static inline uint16_t fs_bf16_from_float(float f)
{
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return 0x7FC0u;
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}
static inline float fs_bf16_to_float(uint16_t h)
{
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
/* round a float to the nearest bfloat16 value, kept as a float */
static inline float fs_bf16_round(float f) { return fs_bf16_to_float(fs_bf16_from_float(f)); }

/* "[1, 64, 128]" ("[]" for ndim 0) into buf, cut to fit n. The one shape formatter of the
 * project (tensors, dump datasets, messages), so shapes read the same in every message. */
const char *fs_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

#define FS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Reads a small text file whole (a config.json, a TP plan): a regular file of at most `max`
 * bytes, no NUL byte, read completely (a file that grows or shrinks meanwhile is an error, never
 * cut). `what` names it in errors ("config", "plan"), `limit` says where max comes from ("a plan
 * is at most"). *text is NUL-terminated and the caller's to free. O_NONBLOCK: a FIFO named by
 * mistake fails the regular-file check instead of hanging open(). */
int fs_read_text_file(const char *path, const char *what, const char *limit, size_t max, char **text, fs_err *e);

/* Text from a file or the command line, made safe to print in a one-line message: control
 * characters (newline, ESC, ...) and DEL become \n, \t, \xHH; bytes that are not valid UTF-8
 * become \xHH; the result is cut to fit n (at most max_in input bytes are shown, then
 * "...(N bytes)"). A hostile name can neither add a line nor drive the terminal. Returns buf. */
const char *fs_printable(const char *s, char *buf, size_t n, size_t max_in);
/* The same for a byte string of known length (a dataset name need not be NUL-free). */
const char *fs_printable_n(const char *s, size_t len, char *buf, size_t n, size_t max_in);

/* 0 when `path` names a regular file (following symlinks); else an FS_E_INPUT error naming it as
 * `what` and saying what it is instead (missing, a dangling symlink, a directory, a FIFO, a
 * device or socket). Never opens the path: a FIFO cannot block it. For HDF5 files and
 * checkpoints, which libraries open themselves. */
int fs_require_regular_file(const char *path, const char *what, fs_err *e);

#endif
