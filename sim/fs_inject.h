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
    FS_INJ_COUNT
} fs_inj_id;

typedef struct fs_inject {
    unsigned mask;        /* bit per fs_inj_id */
    int nan_rank, nan_step;
    char nan_module[192]; /* nan-rank:RANK:MODULE:STEP */
} fs_inject;

/* Set when nan-rank actually planted its NaN (a spec naming no module, step or rank of the run
 * must not look like a clean pass). */
extern int fs_inject_nan_fired;

/* Adds one `--inject` spec ("proj-out-contiguous", "nan-rank:1:transformer_blocks.0.attn.to_q:0"). */
int fs_inject_add(fs_inject *in, const char *spec, fs_err *e);
static inline int fs_injected(const fs_inject *in, fs_inj_id id) { return in && (in->mask >> id) & 1u; }
/* The catalogue, one line per bug: name, what it does, where it comes from. */
const char *fs_inject_catalogue(void);

#endif
