/* fs_dump.h — flux-dump v1 (../shared/flux-dump.md, docs/dump-format.md) writer and input reader.
 *
 * Writing: the file is created as "<path>.tmp.<pid>.<host>" (the writer's pid and short host
 * name; a long file name is cut before ".tmp.") and renamed to <path> only by a successful
 * fs_dump_close, so a crash, a kill or an error never leaves a file that looks complete (no
 * `complete` attribute, and not at <path>); fs_dump_abort removes the temporary. A temporary
 * whose writer died without running any handler (SIGKILL) is removed by the next dump of the
 * same path on the same host (fs_dump_create calls fs_dump_remove_stale), or by `flux-sim
 * --clean PATH`. Datasets are written in the run's dtype, in the order
 * they are recorded, and each step group gets its `order` attribute when it ends. */
#ifndef FS_DUMP_H
#define FS_DUMP_H

#include "fs_config.h"
#include "fs_inputs.h"
#include "fs_record.h"

typedef struct fs_dump fs_dump;

/* Creates the temporary file and writes the root attributes (format, version, producer, dtype,
 * config). Extra root attributes (scheduler_config, num_inference_steps, parallel, ...) go
 * through fs_dump_set_attr_*. A directory that does not exist or cannot be written is an
 * FS_E_IO error naming the path and the OS's reason. producer NULL means "flux-sim". */
int fs_dump_create(fs_dump **d, const char *path, const fs_config *cfg, fs_dtype dt, const char *producer,
                   fs_err *e);
/* Root attributes, written like h5py writes a str / int / float. Setting a name again replaces
 * it; `format` and `version` are the writer's and are refused. */
int fs_dump_set_attr_string(fs_dump *d, const char *name, const char *value, fs_err *e);
int fs_dump_set_attr_int(fs_dump *d, const char *name, int64_t value, fs_err *e);
int fs_dump_set_attr_double(fs_dump *d, const char *name, double value, fs_err *e);
/* Compression of the datasets written from now on: 1-9 = shuffle + deflate at that level for
 * datasets of >= 256 elements (one chunk each, like the reference dumps), 0 = none (the
 * default), every dataset contiguous. Deflate costs ~25 s per GB and saves 10-20%. */
int fs_dump_set_deflate(fs_dump *d, int level, fs_err *e);
/* The `recorded_modules` attribute of every step group begun from now on: "all" (the default)
 * or a selection's declaration ("match:G1,G2", fs_select.h), at most FS_DUMP_DECL_MAX
 * characters (fs_select_parse refuses a longer --dump-modules up front, naming the option). */
#define FS_DUMP_DECL_MAX 511
int fs_dump_set_recorded_modules(fs_dump *d, const char *decl, fs_err *e);
/* "<path>.tmp.<pid>.<host>": where the data goes until fs_dump_close (for messages and tests). */
const char *fs_dump_tmp_path(const fs_dump *d);
int fs_dump_write_inputs(fs_dump *d, const fs_inputs *in, fs_err *e);
/* Opens group /step_%04d with attributes timestep, sigma, sigma_next. */
int fs_dump_begin_step(fs_dump *d, int step, double timestep, double sigma, double sigma_next, fs_err *e);
/* Writes one dataset in the current step group (shape and dtype of t) and appends its name to
 * the step's `order`. A name recorded twice in one step is an error (a bug in the producer). */
int fs_dump_record(fs_dump *d, const char *name, const fs_tensor *t, fs_err *e);
/* Parallel HDF5 (MPI-IO): every rank of g calls every fs_dump_* function of this dump, in the
 * same order with the same names and attributes (metadata is collective). Data: rank 0 alone
 * writes the inputs, /final and anything recorded with fs_dump_record; fs_dump_record_piece
 * writes each rank's piece of a global tensor into its hyperslab(s). No compression (HDF5
 * filters need collective data writes). The temporary name is rank 0's; rank 0 renames. A write
 * that fails on any rank fails on every rank, at the same dataset, with the first failing rank's
 * message (fs_agree_error): the ranks never drift into different collectives. */
struct fs_group;
int fs_dump_create_parallel(fs_dump **d, const char *path, const struct fs_group *g, const fs_config *cfg, fs_dtype dt,
                            const char *producer, fs_err *e);
/* Collective: creates dataset `name` of global shape gshape; this rank writes its local tensor t
 * into the region its shard `sh` describes (NULL/ndims 0: the whole tensor) if `write`, else
 * nothing (a duplicate of a piece another rank writes). Interval lists must be ascending. */
int fs_dump_record_piece(fs_dump *d, const char *name, const fs_tensor *t, const fs_shard *sh, const int64_t *gshape,
                         int write, fs_err *e);

/* Writes the `order` attribute and closes the step group. */
int fs_dump_end_step(fs_dump *d, fs_err *e);
int fs_dump_write_final(fs_dump *d, const fs_tensor *latents, fs_err *e);
/* Writes the root attribute `complete` = 1 (the completeness marker, the last write), flushes,
 * fsyncs, closes and renames into place. Frees d in every case. Refuses (and deletes the
 * temporary) when an earlier call failed, a step was never ended or /final never written, so a
 * dump whose producer ignored an error never appears at <path>. */
int fs_dump_close(fs_dump *d, fs_err *e);
/* fs_dump_close in two halves, for writers that publish several files together (the per-rank
 * dumps of one job: no rank's file appears unless every rank's is complete). fs_dump_seal does
 * all but the rename (the `complete` marker, flush, close, fsync); on failure d stays for
 * fs_dump_abort. fs_dump_publish renames a sealed dump into place and frees d in every case. */
int fs_dump_seal(fs_dump *d, fs_err *e);
int fs_dump_publish(fs_dump *d, fs_err *e);
/* Deletes the temporary and closes it, discarding whatever HDF5 still has to write (the closing
 * flush goes to memory, so a full disk cannot fail or hang it). Frees d. Safe on NULL. A
 * parallel dump: collective, like every fs_dump_* call. */
void fs_dump_abort(fs_dump *d);
/* A recorder whose fn writes into the current step (fs_dump_record). */
fs_recorder fs_dump_recorder(fs_dump *d);

/* Temporaries a killed writer left (SIGKILL runs no handler): `path` a dump's final path (its
 * temporaries only, whatever pid wrote them), or an existing directory (every dump temporary in
 * it: a --dump-per-rank directory). A temporary is removed when it was written on this host
 * (the host in its name), its writer's pid is not running here (a zombie counts as gone), and it
 * is empty or an HDF5 file; fn (may be NULL) hears of every temporary found, removed or kept
 * and why. Returns the number removed, -1 (errno) when the directory cannot be read. */
typedef void (*fs_dump_stale_fn)(void *ctx, const char *tmp, int removed, const char *why);
int fs_dump_remove_stale(const char *path, fs_dump_stale_fn fn, void *ctx);

/* Reads the `config` root attribute and the /inputs group of any flux-dump (ours, or one written
 * by h5py from PyTorch). Inputs are converted to dtype `dt` (ids, guidance, sigmas, timesteps
 * are always float64). Errors name the file and the dataset: not HDF5, not a flux-dump, a
 * newer version, no /inputs, a missing or mis-shaped dataset. */
int fs_dump_read_inputs(const char *path, fs_dtype dt, fs_config *cfg, fs_inputs *in, fs_err *e);

#endif
