/* fo_dump.h — read any flux-dump v1 file (../shared/flux-dump.md): ours, or one written by
 * h5py from a PyTorch run.
 *
 * This is the one reader of the format: the oracle diffs through it, and the simulator's replay
 * (fs_dump_read_inputs) opens dumps through it, so the format and version checks and their
 * messages exist once. It hides HDF5 (no hdf5.h here): hard links, shuffle+deflate chunks, vlen
 * or fixed-length strings and integer or float datasets all read the same way.
 *
 * Errors are fs_err one-liners naming the file, the object and the cause; FS_E_INPUT for
 * anything wrong with the file. */
#ifndef FO_DUMP_H
#define FO_DUMP_H

#include "fo_metrics.h"
#include "fs_common.h"

#define FO_MAX_DIMS 8
#define FO_FORMAT_VERSION 1 /* the newest flux-dump version this reader understands */

/* A name or path that came from a file (or the command line), made safe and short for a one-line
 * message: control characters and invalid UTF-8 escaped (fs_printable), at most 200 bytes shown,
 * then "...(N bytes)". So a hostile 64 KiB dataset name can neither add a line nor push the cause
 * out of fs_err's 1024 bytes. The buffer is a compound literal: it lives until the end of the
 * enclosing block, so use FO_SHOW only in the arguments of the call that prints it. */
#define FO_SHOW(s) fs_printable((s), (char[320]){0}, 320, 200)

typedef struct fo_file fo_file; /* opaque: an open HDF5 file plus its root attributes */

/* Opens `path` read-only and checks it is a flux-dump this reader understands: a regular file
 * (a FIFO, device or socket is refused before anything opens it: HDF5 would block on a FIFO), an HDF5 file,
 * `format` == "flux-dump", integer `version` <= FO_FORMAT_VERSION, string `dtype` and `config`.
 * Lists its step groups. On error *f is NULL. */
int fo_file_open(fo_file **f, const char *path, fs_err *e);
void fo_file_close(fo_file *f); /* safe on NULL */

/* Root attributes, read at open and owned by f. parallel and producer are NULL when absent. */
const char *fo_file_path(const fo_file *f);
const char *fo_file_dtype(const fo_file *f);    /* "float32", "float64", "bfloat16", ... */
const char *fo_file_config(const fo_file *f);   /* JSON text, for fs_config_from_json */
const char *fo_file_parallel(const fo_file *f); /* JSON text or NULL */
const char *fo_file_producer(const fo_file *f); /* free text or NULL */
int fo_file_version(const fo_file *f);

/* Step groups ("/step_<digits>" at the root), in numeric order (step_0002 before step_0010,
 * whatever the link order). i in [0, fo_file_nsteps). */
int fo_file_nsteps(const fo_file *f);
int fo_file_step_number(const fo_file *f, int i);    /* 2 for step_0002 */
const char *fo_file_step_group(const fo_file *f, int i); /* "/step_0002" */

/* 1 if `path` names an existing object of that kind (each component is checked, so a missing
 * parent is just 0, not an error). */
int fo_is_group(fo_file *f, const char *path);
int fo_is_dataset(fo_file *f, const char *path);

/* A list of names owned by the struct. Initialise with {0}; fo_names_free makes it {0} again. */
typedef struct fo_names {
    int n;
    char **v;
} fo_names;
void fo_names_free(fo_names *l);
/* "GROUP/NAME", malloc'ed (NULL when out of memory): names come from files and have no length
 * limit, so no path is ever built in a fixed buffer (a cut path names another object, or none). */
char *fo_path_join(const char *group, const char *name);

typedef enum fo_order_source {
    FO_ORDER_ATTR = 0, /* the group's `order` attribute: execution order, as the format wants */
    FO_ORDER_CREATION, /* no `order`: link creation order (tracked by the producer) */
    FO_ORDER_NAME,     /* no `order`, creation order not tracked: alphabetical, a guess */
} fo_order_source;

/* The dataset names of `group` in execution order: its `order` attribute (a 1-D array of vlen or
 * fixed-length strings) when present, else the group's datasets in creation order (or name
 * order when the producer did not track it). *src (may be NULL) says which. `out` is freed
 * and refilled. */
int fo_group_order(fo_file *f, const char *group, fo_names *out, fo_order_source *src, fs_err *e);

/* Every dataset under `group`, whatever `order` says: its own in link creation order (name order
 * when untracked), and those of nested groups as "sub/name" (h5py turns a '/' in a name into
 * groups), at most 8 deep. The walk (fo_walk_names) adds those `order` does not list, so a
 * dataset the file holds is never left out of a comparison. `out` is freed and refilled. */
int fo_group_datasets(fo_file *f, const char *group, fo_names *out, fs_err *e);

/* The numbers and names of one dataset. Reusable across reads: fo_dataset_read grows `data`
 * only when a bigger dataset comes, so a diff loop allocates a handful of times in total.
 * Initialise with {0}; free with fo_dataset_free. */
typedef struct fo_dataset {
    int ndim; /* 0 for a scalar dataset (numel 1) */
    int64_t shape[FO_MAX_DIMS];
    int64_t numel;
    char dtype[16]; /* as stored: "float32", "float64", "float16", "int64", "uint8", ... */
    double *data;   /* numel values, row-major, converted to double by HDF5 (exact for all
                       stored types up to 32-bit ints and float64) */
    size_t cap;     /* elements allocated in data */
} fo_dataset;

/* Shape and stored dtype of the dataset at `path` (e.g. "/step_0000/proj_out"), no data. */
int fo_dataset_info(fo_file *f, const char *path, fo_dataset *ds, fs_err *e);
/* Shape, dtype and values. Works on hard-linked and compressed datasets; integer and float
 * types. A missing dataset, a group or a non-numeric type is an FS_E_INPUT error. */
int fo_dataset_read(fo_file *f, const char *path, fo_dataset *ds, fs_err *e);
void fo_dataset_free(fo_dataset *ds);
/* "[1, 64, 128]": the project's one shape formatter (fs_shape_str), under the reader's name. */
static inline const char *fo_shape_str(int ndim, const int64_t *shape, char *buf, size_t n)
{
    return fs_shape_str(ndim, shape, buf, n);
}

/* Block-wise reading, so a diff holds a block of each dataset, not the dataset.
 *
 * Blocks are runs of whole trailing-axis rows in row-major order of about `block_elems` values
 * (at least one row of the last axis), so two datasets of the same shape opened with the same
 * block_elems yield blocks of identical offsets and lengths and can be compared in lockstep.
 * Contiguous little-endian float32/float64 datasets (flux-sim's, h5py's default) are read
 * without HDF5, one pread per block, and handed out as stored (fo_stream_view); other contiguous
 * datasets a hyperslab at a time through HDF5 (memory: one block). For chunked
 * (compressed) datasets HDF5 must inflate whole chunks; the stream sizes the chunk cache so each
 * chunk is inflated once, so memory is one block plus the chunks a block row spans (for the
 * reference dumps, stored as one chunk per dataset, that is the dataset in its stored dtype). */
typedef struct fo_stream fo_stream;
/* Opens `path`; `info` (may be NULL) receives shape and dtype (data untouched). */
int fo_stream_open(fo_file *f, const char *path, int64_t block_elems, fo_stream **s, fo_dataset *info, fs_err *e);
/* The next block: *n values starting at flat index *off; *n == 0 after the last block. *data is
 * owned by the stream and valid until the next call. */
int fo_stream_next(fo_stream *s, const double **data, int64_t *off, int64_t *n, fs_err *e);
/* The same block as stored (float32 or float64) instead of widened to double: for direct streams
 * (below) the block as read from the file, else HDF5's double conversion. Valid until the next
 * call or close. */
int fo_stream_view(fo_stream *s, fo_view *v, int64_t *off, int64_t *n, fs_err *e);
/* 1 when the stream's blocks are read straight from the file, without HDF5: such a stream may be
 * read (fo_stream_view, fo_stream_next) and closed on another thread than the one that opened
 * it, while that thread goes on with HDF5 (which is not thread-safe). */
int fo_stream_direct(const fo_stream *s);
void fo_stream_close(fo_stream *s); /* safe on NULL */

/* Any attribute of any object as text or number. Absent: FS_OK and *out NULL / *found 0.
 * A string attribute read as a number (or the reverse) is an FS_E_INPUT error. */
int fo_attr_string(fo_file *f, const char *obj, const char *name, char **out, fs_err *e); /* free() *out */
int fo_attr_double(fo_file *f, const char *obj, const char *name, double *out, int *found, fs_err *e);

/* ---- Completeness: did the producer finish? ----
 *
 * The contract (docs/dump-format.md, "Completeness"), for producers:
 *   - root attribute `complete` = integer 1, written as the producer's LAST action, only after
 *     every step group (with its `order`) and /final/latents are written;
 *   - optional root attribute `recorded_steps`, a string: "all" or a comma list of step numbers
 *     ("0,3"; ranges "0-3" are read too), when a producer deliberately recorded only some steps.
 *     Absent means "all".
 * and for readers (this function):
 *   - with `complete` = 1, the dump is complete iff it holds every step group recorded_steps
 *     promises (for "all": steps 0..N-1, N = len(/inputs/sigmas) - 1);
 *   - without the marker (older producers; the reference dumps), it is complete iff every
 *     promised step group exists with an `order` attribute whose names all exist and include
 *     latents_out, and /final/latents exists (without /inputs/sigmas, N is taken as the last step
 *     present + 1, so only gaps and an unfinished last step show);
 *   - `complete` present with another value means the producer said it is not complete.
 * Otherwise the dump is partial; `reason` says why, naming the first step that falls short:
 * "step_0002 has no `order`: the producer stopped inside step 2". */
typedef struct fo_completeness {
    int complete;       /* 1: everything promised is there */
    int partial;        /* !complete */
    int has_marker;     /* the root attribute `complete` exists (whatever its value) */
    int last_step;      /* highest step group number present, -1 for none */
    int steps_expected; /* number of steps promised */
    int steps_present;  /* promised steps that are there (whole, for files without the marker) */
    char recorded_steps[64]; /* the attribute as read, or "all" when absent */
    char reason[480];   /* why partial ("" when complete); no file name */
} fo_completeness;
/* Judges `f` by the contract above. Errors (FS_E_INPUT): `complete` not a number,
 * `recorded_steps` not a string or not a step list, unreadable metadata. */
int fo_file_completeness(fo_file *f, fo_completeness *c, fs_err *e);

/* ---- Crash and hang attribution ----
 *
 * libhdf5 (1.10) can crash (SIGSEGV in its global heap, reading a damaged vlen attribute) or loop
 * forever on a damaged file; no check before the read can rule that out. The reader therefore
 * calls `fn(1, file, object)` before it hands `object` of `file` to HDF5 and `fn(0, NULL, NULL)`
 * when HDF5 has returned, in nested pairs, always on the thread that uses HDF5 (never from the
 * data-pass threads, which do not touch HDF5). A program installs a hook that remembers the
 * innermost object and arms a watchdog, plus a fatal-signal handler that names it and exits with
 * its error status (flux-oracle does; see main_flux_oracle.c). NULL (the default) = no hook. */
typedef void (*fo_h5_hook_fn)(int entering, const char *file, const char *object);
void fo_set_h5_hook(fo_h5_hook_fn fn);

#endif
