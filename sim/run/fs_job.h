/* fs_job.h — the run engine: one flux-sim job (configure, run, verdict) as a library call.
 *
 * The CLI (sim/main_flux_sim.c) parses options into fs_job_opts and prints; the tests, a GPU
 * driver and a second model family call the same three steps. Every step is collective over
 * MPI_COMM_WORLD: every rank calls it with the same options, and every rank gets the same
 * return code (the worst wins; rank 0's fs_err holds the message, or "another rank failed").
 *
 *   fs_job *job;
 *   rc = fs_job_configure(&job, &opts, &e);      backend, config + inputs (rank 0, broadcast),
 *                                                layout + plan, weights, dumps, --check
 *   rc = fs_job_run(job, &e);                    --check's single-rank reference (rank 0), the
 *                                                run in the layout, finishing the dumps
 *   fs_job_check_report(job)                     --check's verdict text (rank 0), or NULL
 *   fs_job_free(job);                            deletes every dump the job did not finish
 *
 * fs_job_run returns FS_OK, FS_DIVERGED (--check found a divergence; every rank knows it), or an
 * error. When a rank failed alone in the middle of the sampling loop the others may be inside a
 * collective: fs_job_must_abort() is then 1 on that rank, and its caller must end the job
 * (MPI_Abort) instead of agreeing — the library never exits itself. */
#ifndef FS_JOB_H
#define FS_JOB_H

#include <stdint.h>
#include <stdio.h>

#include "fs_comm.h"
#include "fs_config.h"
#include "fs_estimate.h"
#include "fs_inject.h"
#include "fs_sampler.h"

/* What a job is: the CLI's options as values (README's CLI reference says what each means). */
typedef struct fs_job_opts {
    const char *config, *weights, *inputs, *dump, *dump_per_rank, *precision, *scheduler, *plan, *check_ref, *rotate,
        *backend, *lse_layout, *match, *ar_order, *stream, *dump_modules, *dump_steps;
    const char *text, *joint; /* --text sharded|replicated, --joint front|rear (NULL: sharded, front) */
    const char *mesh_order;   /* --mesh-order ulysses-inner|ring-inner (NULL: ulysses-inner) */
    const char *pad;          /* --pad mask|nomask (NULL: none, the exact uneven split) */
    int precision_given;
    int tp, ulysses, ring, check, comm_stats, brk, wait_rank;
    fs_inject inject;
    double rtol, rtol_max;
    uint64_t weights_seed;
    fs_gen_params gen;
    int threads, quiet, compress;
    int gen_opt_given;
    int estimate;        /* --estimate: print what the run needs, compute nothing */
    uint64_t device_mem; /* --device-mem: a GPU's memory, for --estimate's verdict (0: none given) */
    int cfg_parallel;    /* --cfg-parallel: true CFG's two calls on two rank groups (fs_par.h) */
    int cfg_batched;     /* --cfg-batched: true CFG's two calls as one forward of batch 2B (one rank) */
} fs_job_opts;

/* The dtype of --precision (fp32, fp64, bf16). */
fs_dtype fs_job_dtype(const fs_job_opts *o);

typedef struct fs_job fs_job;

/* What the job is and did, for the CLI to print (rank 0's values unless said otherwise). */
typedef struct fs_job_summary {
    fs_config cfg;
    fs_dtype dtype;
    const char *backend;     /* the backend's name */
    const char *weights_src; /* where the weights came from */
    const char *inputs;      /* --inputs, or NULL: generated */
    const char *plan_source; /* the TP plan's source (tp > 1) */
    double t_load;           /* seconds to open the weights */
    int batch, s_img, s_txt, n_steps, world_size, tp;
    char layout[128];        /* fs_par_describe */
    double t_reference;      /* the in-job --check reference's seconds; < 0: none ran */
    double t_run;            /* the run in the layout */
    double lat_mean, lat_std;
    int64_t lat_nonfinite;
    char step_summary[160];  /* per-step times (fs_progress) */
    double peak_rss;         /* this rank's peak RSS, bytes */
    double weights_peak;     /* the largest weight footprint of any rank, bytes */
    int streamed;            /* weights were streamed block by block */
    int has_comm_stats;      /* --comm-stats: `comm` holds this rank's counters */
    fs_comm_stats comm;
} fs_job_summary;

int fs_job_configure(fs_job **job, const fs_job_opts *o, fs_err *e);
int fs_job_run(fs_job *job, fs_err *e);
/* --check's report on rank 0 after fs_job_run returned FS_OK or FS_DIVERGED; NULL otherwise. */
const char *fs_job_check_report(const fs_job *job);
int fs_job_must_abort(const fs_job *job);
/* The caller stops a configured job without running it (its report channel failed): rc (an
 * error) becomes the job's outcome, so fs_job_free deletes every dump and directory it made. */
void fs_job_cancel(fs_job *job, int rc);
const fs_job_summary *fs_job_get_summary(const fs_job *job);
/* Safe on NULL and on a job whose configure failed. A job that did not finish deletes its dumps
 * and any --dump-per-rank directory it created. */
void fs_job_free(fs_job *job);

/* --estimate: the run's needs on every rank's terms, computed from the options alone (and a
 * replayed dump's inputs); nothing is allocated beyond the config. r0/e0 are rank 0's (it holds
 * the whole model during an in-job --check reference), r1/e1 any other rank's. */
typedef struct fs_job_estimate {
    fs_config cfg;
    int batch, steps, tp, ulysses, ring, ranks;
    int64_t s_img, s_txt;
    fs_estimate_req r0, r1;
    fs_estimate e0, e1;
    uint64_t here_bytes; /* every rank of the layout on this machine: e0 + (ranks-1) x e1, saturating
                            at UINT64_MAX ("more than 16 EiB") */
} fs_job_estimate;
int fs_job_estimate_compute(const fs_job_opts *o, fs_job_estimate *est, fs_err *e);

/* All ranks agree on an error: the worst code wins; rank 0 reports it (its own message, or a
 * note that another rank failed). Collective. */
int fs_job_agree(const fs_group *w, int rc, fs_err *e);

#endif
