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
    FS_INJ_PACKED_COLWISE_CONTIGUOUS,
    FS_INJ_TXT_IDS_LOCAL,
    FS_INJ_LSE_BASE2,
    FS_INJ_LSE_SHARD_OFFSET,
    FS_INJ_LSE_LAYOUT_GUESSED,
    FS_INJ_CFG_UNCOND_SEES_COND,
    FS_INJ_REPLICATED_TEXT_ROTATED,
    FS_INJ_JOINT_KV_WRONG_STEP,
    FS_INJ_REPLICATED_KV_A2A,
    FS_INJ_A2A_WORLD_GROUP,
    FS_INJ_SHARD_FLOOR_DROP,
    FS_INJ_PAD_MASK_IGNORED,
    FS_INJ_COUNT
} fs_inj_id;
/* fs_inject.mask and fs_inject_fired_mask hold a bit per bug: widen them before a 33rd */
_Static_assert(FS_INJ_COUNT <= 32, "fs_inject's masks are 32-bit: widen them for more injections");

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
 * must not look like a clean pass); fs_inject_fired_mask counts it as nan-rank's fired bit. */
extern int fs_inject_nan_fired;

/* Adds one `--inject` spec ("proj-out-contiguous", "nan-rank:1:transformer_blocks.0.attn.to_q:0"). */
int fs_inject_add(fs_inject *in, const char *spec, fs_err *e);
static inline int fs_injected(const fs_inject *in, fs_inj_id id) { return in && (in->mask >> id) & 1u; }
/* The catalogue, one line per bug: name, what it does, where it comes from. */
const char *fs_inject_catalogue(void);

/* ---- THE table: one entry per bug (fs_inject.c) ----
 *
 * What each bug's hook needs to act (TP, Ulysses, ring, p2p rotation, sequence parallelism,
 * 2+ ranks, a guidance model, RANK/STEP inside the run), what it needs to change a result once
 * it acts (uneven shards, more than one head, ids that move, a non-zero value), and where it
 * shows. The validator that reads it against a layout (refusal before the run, "never fired"
 * after it) lives above the model, in sim/run/fs_inject_check.h: it needs the inputs, the
 * partition and the collectives, and this header stays a leaf every layer can include. */
enum fs_inj_need {
    /* what the hook needs to act at all ("cannot fire" without it) ... */
    FS_INJ_NEEDS_RANKS2 = 1u << 0, /* 2+ ranks: the inputs are broadcast (a single rank broadcasts nothing) */
    FS_INJ_NEEDS_TP = 1u << 1,     /* --tp >= 2: the TP plan is consulted */
    FS_INJ_NEEDS_ULY = 1u << 2,    /* --ulysses >= 2: the all-to-alls exist */
    FS_INJ_NEEDS_RING = 1u << 3,   /* --ring >= 2: ring attention and its merge exist */
    FS_INJ_NEEDS_P2P = 1u << 4,    /* --ring-rotate p2p: a receive is outstanding while computing */
    FS_INJ_NEEDS_SP = 1u << 5,     /* --ulysses or --ring >= 2: the sequence is split */
    FS_INJ_NEEDS_GUID = 1u << 6,   /* a model with a guidance embedder: the guidance is broadcast */
    FS_INJ_NEEDS_AT = 1u << 7,     /* RANK < ranks and STEP < --steps (nan-rank, fail-rank) */
    /* ... and what it needs to change a result once it acts ("fires but changes nothing") */
    FS_INJ_MATTERS_RING_UNEVEN = 1u << 8, /* ring chunks of unequal length: something is padded */
    FS_INJ_MATTERS_ULY_UNEVEN = 1u << 9,  /* Ulysses shards of unequal length in some group */
    FS_INJ_MATTERS_MULTIHEAD = 1u << 10,  /* > 1 head and > 1 query token per ring attention: (B,S,H) != (B,H,S) */
    FS_INJ_MATTERS_IDS_MOVE = 1u << 11,   /* some rank's ids differ from the sequence start's */
    FS_INJ_MATTERS_VALUE = 1u << 12,      /* the broadcast value is not all zeros (checked on rank 0) */
    /* the hook reports firing (fs_inject_fire): checked again after the run */
    FS_INJ_REPORTS = 1u << 13,
    FS_INJ_NEEDS_FLUX2 = 1u << 14, /* a FLUX.2 model: its packed column-parallel Linears exist */
    FS_INJ_MATTERS_TXT_IDS_MOVE = 1u << 15, /* some rank's text ids differ from the text start's (FLUX.2) */
    FS_INJ_MATTERS_SQ_EQ_H = 1u << 16, /* some rank's ring attention has as many query tokens as heads (> 1) */
    FS_INJ_NEEDS_CFGPAR = 1u << 23, /* --cfg-parallel with true CFG: the negative prompt's pass runs on its own ranks */
    FS_INJ_NEEDS_TXT_REP = 1u << 17,   /* --text replicated under sequence parallelism: text K/V join locally */
    FS_INJ_NEEDS_ULY1 = 1u << 18,      /* --ulysses 1: a dispatch keyed on the Ulysses degree takes the plain path */
    FS_INJ_NEEDS_TXT_SHARD = 1u << 19, /* --text sharded: the text goes through the exchanges with the image */
    FS_INJ_NEEDS_HEADS_SP = 1u << 20,  /* the local heads divide by ulysses·ring (an SP-wide head split) */
    FS_INJ_NEEDS_PAD_MASK = 1u << 21,  /* --pad mask: a key mask exists to be dropped */
    FS_INJ_MATTERS_SP_UNEVEN = 1u << 22, /* a stream's length does not divide by the SP degree */
    FS_INJ_NEEDS_NO_PAD = 1u << 24,    /* no --pad: the layout does not pad on purpose already */
};
typedef struct fs_inject_info {
    const char *name, *what, *source;
    unsigned needs; /* enum fs_inj_need bits */
    const char *shows;
} fs_inject_info;
const fs_inject_info *fs_inject_info_of(fs_inj_id id);

/* A hook whose bug acted on this rank says so (idempotent). */
void fs_inject_fire(fs_inj_id id);
/* The bugs whose hooks acted on this rank so far (bit per fs_inj_id; nan-rank's flag included). */
unsigned fs_inject_fired_mask(void);

/* ---- Hooks. Each re-creates its bug inside the real code path it belongs to, and is a no-op
 * without --inject; the call sites read as the correct code plus one visible hook. The TP
 * splits' hook is in fs_plan.c, beside the correct split it corrupts (fs_tp_split_of). ---- */

/* What a Linear's forward does differently under the TP injections, beyond the (wrong) split
 * fs_tp_split_of returns: the injection's own state, never part of the production split. */
typedef struct fs_inject_linear {
    int input_whole;        /* adaln-sharded: the input arrives replicated; the rank reads its columns of it */
    int bias_before_reduce; /* rowwise-bias-every-rank: the bias added on every rank before the all-reduce */
} fs_inject_linear;

/* The LSE convention the ring code assumes the attention kernel handed back (fs_backend.h's
 * enums as ints: this header stays a leaf). Without an injection, the kernel's declared one.
 * Layout: lse-layout (seed 001), the other one (a layout assumed instead of read);
 * lse-layout-guessed (B10, vllm-omni#5543), guessed from the LSE's sizes [B, S, H] — right when
 * S != H, and when the sizes cannot tell (S == H) the layout the code was written for, the other
 * vendor's. Base: lse-base2 (B9, pytorch#181645), the other base (a natural-log LSE multiplied by
 * ln 2 again). Offset: lse-shard-offset (B8, ROCm/aiter#3334), the other semantics (a mean-centred
 * LSE merged uncorrected; an uncentred one "corrected"). */
int fs_inject_lse_layout_assumed(const fs_inject *in, int declared, int64_t S, int64_t H);
int fs_inject_lse_base_assumed(const fs_inject *in, int declared);
int fs_inject_lse_offset_assumed(const fs_inject *in, int declared);
/* nan-rank / fail-rank: does the fault strike on `rank` at (`module`, `step`)? */
int fs_inject_strikes(const fs_inject_at *at, int rank, const char *module, int step);

#endif
