/* fs_sink.h — the recording fan-out of a run: one recorder the forward calls, feeding --check,
 * the global dump (serial, or parallel HDF5 with each rank writing its hyperslabs) and the
 * per-rank dumps (--dump-per-rank), and learning the `sharding` map the dumps' `parallel`
 * attribute carries. A GPU driver needs exactly this too, so it lives in the library.
 *
 * The sink downloads each recorded tensor once (fs_tensor_host_view: no copy when the backend's
 * memory is host-addressable) and hands the host copy to every consumer. Collective: with a
 * parallel layout every rank records every tensor in the same order. */
#ifndef FS_SINK_H
#define FS_SINK_H

#include "fs_check.h"
#include "fs_dump.h"
#include "fs_par.h"
#include "fs_sampler.h"

typedef struct fs_sink fs_sink;

typedef struct fs_sink_opts {
    const fs_par *par; /* NULL: a single-rank run */
    fs_dump *dump;     /* the global dump (parallel HDF5 when par->world > 1), or NULL */
    fs_dump *local;    /* this rank's --dump-per-rank file, or NULL */
    fs_check *check;   /* --check, or NULL */
} fs_sink_opts;

int fs_sink_create(fs_sink **s, const fs_sink_opts *o, fs_err *e);
fs_recorder fs_sink_recorder(fs_sink *s);
fs_step_hooks fs_sink_hooks(fs_sink *s);
/* After a successful run: the `parallel` attributes (with the sharding maps learnt at step 0)
 * and /final/latents (global latents, in backend or host memory), then closes both dumps (they
 * are published by rename only now). The dumps are the sink's from here on: fs_sink_free aborts
 * any still open (a failed run leaves no file). */
int fs_sink_finish(fs_sink *s, const char *plan_source, const fs_tensor *latents, fs_err *e);
void fs_sink_free(fs_sink *s);
/* After a failed record, step hook or finish of a parallel run: did every rank fail together
 * (a dump write that failed on some rank, agreed before the next collective)? Then every rank
 * holds the first failing rank's message, and the run can end normally: no MPI_Abort. */
int fs_sink_agreed_error(const fs_sink *s);

/* The flux-dump `parallel` attribute: world, mesh, rank (-1: a global dump), ring rotation, TP
 * plan source and a sharding map (JSON object, consumed). malloc'd text. */
struct cJSON;
char *fs_parallel_json(const fs_par *par, int rank, const char *plan_source, struct cJSON *sharding);

#endif
