/* fs_check.h — `flux-sim --check`: does a parallel layout reproduce the single-rank run?
 *
 * A reference is recorded first — a single-rank run of the same weights and inputs in the same
 * job (rank 0), or a saved single-rank dump (--check=REF.h5). Then the parallel run records
 * through fs_check_recorder: every module output is gathered to its global layout on rank 0
 * (fs_gather.h: replicated copies are compared by hash on the way), compared with the
 * reference in execution order, and the verdict is broadcast, so at the first divergence every
 * rank stops at the same module together (FS_DIVERGED), and none hangs. */
#ifndef FS_CHECK_H
#define FS_CHECK_H

#include "fs_par.h"
#include "fs_record.h"
#include "fs_sampler.h"

typedef struct fs_check fs_check;

#include "fo_tolerance.h"

/* Tolerances are the oracle's (one implementation for --check and flux-oracle):
 * fo_tolerance_layout(dtype) by default — rtol on relative L2, mtol on max|Δ|/max|ref|. */
typedef fo_tolerance fs_check_tol;
static inline fs_check_tol fs_check_default_tol(fs_dtype dt) { return fo_tolerance_layout(fs_dtype_name(dt)); }

/* What the rank where a divergence shows holds when --break-on-divergence stops it (gdb:
 * `frame` up to the layer, or `p *dv` here; tools/debug/flux-sim.gdb prints these). */
typedef struct fs_divergence {
    int step;
    const char *module;         /* diffusers module path */
    const fs_tensor *local;     /* this rank's tensor, as the layer produced it */
    const fs_tensor *reference; /* the single-rank reference, global layout (float64) */
    const fs_tensor *global;    /* the parallel run assembled to the global layout (float64) */
    int64_t coords[FS_MAX_DIMS];/* global coordinates of the worst element */
    int rank;
} fs_divergence;

/* Stops in the debugger (SIGTRAP). Not inlined, so `break fs_check_break` works too. */
void fs_check_break(const fs_divergence *dv);

/* ref_path NULL: the reference is recorded in this job through fs_check_ref_recorder. A saved
 * reference of another dtype widens tol to that dtype's rule unless tol_given (--rtol). */
int fs_check_create(fs_check **ck, const fs_par *par, fs_dtype dt, fs_check_tol tol, int tol_given, const char *ref_path,
                    fs_err *e);
/* --break-on-divergence: the rank where the first divergence shows raises SIGTRAP inside the
 * layer that diverged (in fs_check_break, called from the layer's record). */
void fs_check_set_break(fs_check *ck, int on);
void fs_check_free(fs_check *ck);

/* Rank 0's single-rank reference run records through these. */
fs_recorder fs_check_ref_recorder(fs_check *ck);
fs_step_hooks fs_check_ref_hooks(fs_check *ck);
/* bf16 runs: rank 0 also records the matched float64 truth of the same problem (--match bf16)
 * through these; then every tensor is judged by the arbiter rule (fo_tolerance_arbiter): the
 * parallel run's error against the truth may be at most m times the single-rank bf16 run's
 * plus a floor — the measured bf16 verdict of docs/bf16.md. */
fs_recorder fs_check_truth_recorder(fs_check *ck);
fs_step_hooks fs_check_truth_hooks(fs_check *ck);
/* Every rank's parallel run records through these (collective per recorded tensor). */
fs_recorder fs_check_recorder(fs_check *ck);
fs_step_hooks fs_check_hooks(fs_check *ck);

/* After the run (every rank, collective): an error when nothing at all was compared — a verdict
 * is never "OK" on nothing. */
int fs_check_finish(fs_check *ck, fs_err *e);
/* 1 when the run's error came from a verdict every rank received (the reference lacks a tensor
 * the run recorded, nothing compared): the job ends in agreement, not by abort. */
int fs_check_agreed_error(const fs_check *ck);
/* After the run (every rank): 1 if diverged. Rank 0: the report (divergence or summary). */
int fs_check_diverged(const fs_check *ck);
const char *fs_check_report(const fs_check *ck);

#endif
