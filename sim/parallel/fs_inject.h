/* fs_inject.h — known silent parallel bugs, re-created on purpose (`flux-sim --inject NAME`).
 *
 * Each injection is a faithful re-creation inside the parallel code path — the wrong slice, the
 * lost broadcast, the wrong merge — never a perturbation of outputs after the fact, so --check
 * is tested on the bugs people actually write. docs/bugs.md describes each one, where it comes
 * from, the layouts it can affect and where --check stops. */
#ifndef FS_INJECT_H
#define FS_INJECT_H

#include "fs_common.h"

typedef enum fs_inj_id {
    FS_INJ_PROJ_OUT_CONTIGUOUS = 0,
    FS_INJ_TIMESTEP_TEMP_BCAST,
    FS_INJ_GUIDANCE_TEMP_BCAST,
    FS_INJ_LSE_LAYOUT,
    FS_INJ_RING_NO_LSE,
    FS_INJ_ROPE_LOCAL_POS,
    FS_INJ_ULYSSES_HEAD_ORDER,
    FS_INJ_ROWWISE_BIAS_EVERY_RANK,
    FS_INJ_MISSING_ALLREDUCE,
    FS_INJ_ADALN_SHARDED,
    FS_INJ_OVERLAP_EARLY_READ,
    FS_INJ_NAN_RANK,
    FS_INJ_SEQ_UNEVEN_CHUNK,
    FS_INJ_FUSED_QKV_CONTIGUOUS,
    FS_INJ_ULYSSES_UNEVEN_CHUNK,
    FS_INJ_ULYSSES_EARLY_READ,
    FS_INJ_FAIL_RANK,
    FS_INJ_COUNT
} fs_inj_id;

/* nan-rank:RANK:MODULE:STEP and fail-rank:RANK:MODULE:STEP: where the fault strikes */
typedef struct fs_inject_at {
    int rank, step;
    char module[192];
} fs_inject_at;

typedef struct fs_inject {
    unsigned mask;   /* bit per fs_inj_id */
    fs_inject_at nan, fail;
} fs_inject;

/* Set when nan-rank actually planted its NaN (a spec naming no module, step or rank of the run
 * must not look like a clean pass); fs_inject_after_run counts it as nan-rank's fired bit. */
extern int fs_inject_nan_fired;

/* Adds one `--inject` spec ("proj-out-contiguous", "nan-rank:1:transformer_blocks.0.attn.to_q:0"). */
int fs_inject_add(fs_inject *in, const char *spec, fs_err *e);
static inline int fs_injected(const fs_inject *in, fs_inj_id id) { return in && (in->mask >> id) & 1u; }
/* The catalogue, one line per bug: name, what it does, where it comes from. */
const char *fs_inject_catalogue(void);

/* ---- Honesty: an injection that cannot act is refused, one that never acted is not a pass ----
 *
 * fs_inject.c holds ONE table saying, for every bug, what its hook needs to act (TP, Ulysses,
 * ring, p2p rotation, sequence parallelism, 2+ ranks, a guidance model, RANK/STEP inside the
 * run) and what it needs to change a result once it acts (uneven shards, more than one head,
 * ids that move, a non-zero value), and where it shows. */
struct fs_par;
struct fs_config;
struct fs_inputs;
struct fs_group;
/* Before any compute: FS_E_INPUT (exit 2), one line, when an armed injection "cannot fire under"
 * this layout, or "fires but cannot change anything under" this layout and shape; the line says
 * why and names the layouts where the bug shows. Every rank reaches the same verdict from the
 * same replicated data (layout, partition, config, ids, step count), except the value checks of
 * the *-temp-bcast bugs, made on world rank 0 alone — under those injections only rank 0 holds
 * the broadcast values — which the CLI's agreement on the exit code makes every rank's. */
int fs_inject_refuse(const fs_inject *in, const struct fs_par *p, const struct fs_config *c,
                     const struct fs_inputs *inp, fs_err *e);
/* A hook whose bug acted on this rank says so (idempotent). */
void fs_inject_fire(fs_inj_id id);
/* After a run that did not diverge, on every rank (a collective over `world`): an armed injection
 * that fired on no rank is FS_E_INPUT ("never fired"), never a clean OK. Covers every bug whose
 * hook reports (fs_inject_fire, nan-rank's flag; fail-rank would have ended the job); for
 * timestep-/guidance-temp-bcast and rope-local-pos, whose hooks (fs_sampler.c) act whenever the
 * layout lets them, the table's check before the run is exact. */
int fs_inject_after_run(const fs_inject *in, const struct fs_group *world, fs_err *e);

/* ---- Hooks. Each re-creates its bug inside the real code path it belongs to, and is a no-op
 * without --inject; the call sites read as the correct code plus one visible hook. ---- */
struct fs_tp_split;
/* The TP split of a Linear (fs_tp_split_of), made wrong: proj-out-contiguous (packed_rowwise cut
 * as contiguous columns), adaln-sharded (AdaLN modulation linears split row-parallel on their
 * replicated input, never all-reduced), missing-allreduce (row-parallel partials used as they
 * are), rowwise-bias-every-rank (the bias added on every rank before the all-reduce). */
void fs_inject_tp_split(const fs_inject *in, const char *module, int T, int t, struct fs_tp_split *s);
/* The LSE layout the ring code assumes the attention kernel handed back: the kernel's declared
 * one, or — lse-layout, seed 001 — the other one (a layout guessed instead of read). */
int fs_inject_lse_layout_assumed(const fs_inject *in, int declared);
/* nan-rank / fail-rank: does the fault strike on `rank` at (`module`, `step`)? */
int fs_inject_strikes(const fs_inject_at *at, int rank, const char *module, int step);

#endif
