/* fo_shard.h — the `sharding` map of a dump's `parallel` attribute (../shared/flux-dump.md):
 * which rank holds which elements of a tensor.
 *
 * The map is JSON, dataset name -> "replicated" | {"dim": d, "ranges": [[[a, b], ...], ...]} |
 * {"dims": [{"dim": .., "ranges": ..}, ...]} (split on several axes). This module reads it; a
 * writer of the same JSON is meant to live beside it, so the two stay one definition. */
#ifndef FO_SHARD_H
#define FO_SHARD_H

#include <stdint.h>

#include "fs_common.h"

#define FO_SHARD_MAX_DIMS 8 /* = FO_MAX_DIMS */

struct cJSON;

/* Ownership of one tensor by ranks, from a sharding entry: for each split axis, a per-index rank
 * mask (bit r = rank r, ranks >= 64 are not tracked). Elements are owned by the ranks in the AND
 * of their axes' masks. Owns its masks: free with fo_shard_free. */
typedef struct fo_shard {
    int replicated;
    int naxes;
    int axis[FO_SHARD_MAX_DIMS];     /* normalised (non-negative) */
    uint64_t *mask[FO_SHARD_MAX_DIMS]; /* [extent of axis] each */
    int64_t extent[FO_SHARD_MAX_DIMS]; /* length of each mask */
} fo_shard;

/* Parses the JSON text `parallel`'s sharding entry for `name`, for a tensor of `shape`.
 * *found 0 when there is no entry (unknown distribution). Errors name `origin` and the entry.
 * Intervals must be whole numbers inside the axis (global coordinates: in a per-rank file, whose
 * `parallel` has "rank", the axis may be longer than the local tensor's). */
int fo_shard_parse(const char *parallel, const char *name, int ndim, const int64_t *shape, fo_shard *s, int *found,
                   const char *origin, fs_err *e);
/* The same on an already parsed `parallel` object (parsed once per run, not per dataset). */
int fo_shard_from_json(const struct cJSON *parallel, const char *name, int ndim, const int64_t *shape, fo_shard *s,
                       int *found, const char *origin, fs_err *e);
void fo_shard_free(fo_shard *s); /* leaves {0}; safe on a {0} shard */
/* Ranks owning the element at `coords` (all ranks for "replicated"). */
uint64_t fo_shard_owner(const fo_shard *s, int ndim, const int64_t *coords);

/* One rank's piece of a tensor, for placing a per-rank dataset in the global tensor (flux-oracle
 * diff of per-rank dumps, assemble). For each split axis: the global index of every local index,
 * i.e. ranges[rank]'s intervals concatenated in their listed order (the order flux-sim's writer,
 * sim/run/fs_sink.c sharding_json, and the flux_dump Python package list them: local order).
 * Axes not split are whole. Owns its index arrays: free with fo_piece_free. */
typedef struct fo_piece {
    int replicated;                    /* "replicated": every rank holds the whole tensor */
    int naxes;
    int axis[FO_SHARD_MAX_DIMS];       /* normalised (non-negative) */
    int64_t len[FO_SHARD_MAX_DIMS];    /* the rank's local extent on that axis */
    int64_t gext[FO_SHARD_MAX_DIMS];   /* the largest interval end of any rank: the global extent */
    int64_t *g[FO_SHARD_MAX_DIMS];     /* [len]: local index -> global index */
} fo_piece;
/* The sharding entry of `name` in a parsed `parallel` object, for rank `rank` of a tensor of
 * `ndim` dimensions. *found 0: no entry (unknown distribution). Errors (FS_E_INPUT, naming
 * `origin`): a malformed entry, no ranges for `rank`, an axis split twice. */
int fo_piece_from_json(const struct cJSON *parallel, const char *name, int rank, int ndim, fo_piece *p, int *found,
                       const char *origin, fs_err *e);
void fo_piece_free(fo_piece *p); /* leaves {0} */
/* 1 when `name` is declared a partial sum before a reduction (the `partial` key beside
 * `sharding`, {name: "sum"}, as the flux_dump Python package writes it). */
int fo_parallel_partial(const struct cJSON *parallel, const char *name);

/* `rank` of a per-rank file's `parallel` JSON, or -1 (global dump, no such key, not JSON, or
 * not a whole number in 0..2^31-1). */
int fo_parallel_rank(const char *parallel);

#endif
