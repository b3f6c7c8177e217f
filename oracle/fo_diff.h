/* fo_diff.h — the comparison engine behind `flux-oracle` (diff, stats, consistency), as a library.
 *
 * Walks flux-dumps in execution order: /inputs, then the step groups by number, each in its
 * `order` attribute's order, then /final. Datasets are streamed block by block in lockstep
 * (fo_stream), so memory is a few blocks per open file, not the file. Nothing here prints: the
 * results are fo_report / fo_stat_report values that the CLI renders (table, JSON, HTML).
 *
 * Verdicts use fo_tolerance (docs/tolerances.md); rank attribution uses the `parallel`
 * attribute's `sharding` map (../shared/flux-dump.md). */
#ifndef FO_DIFF_H
#define FO_DIFF_H

#include "fo_dump.h"
#include "fo_metrics.h"
#include "fo_tolerance.h"

#define FO_STEP_INPUTS (-1)    /* fo_entry.step of /inputs datasets */
#define FO_STEP_FINAL (-2)     /* ... of /final */
#define FO_MAX_RANKS 64        /* rank attribution is a 64-bit mask */

typedef enum fo_kind {
    FO_PASS = 0,
    FO_TOL,       /* finite values out of tolerance */
    FO_NONFINITE, /* NaN/Inf where the other side holds something else */
    FO_SHAPE,     /* the shapes differ */
    FO_UNEQUAL,   /* consistency: replicas of a replicated tensor are not bitwise identical */
} fo_kind;
const char *fo_kind_name(fo_kind k); /* "pass", "tolerance", "nonfinite", "shape", "unequal" */

typedef struct fo_entry {
    int step;            /* step number, FO_STEP_INPUTS or FO_STEP_FINAL */
    char group[40];      /* "/step_0000", "/inputs", "/final" */
    char *name;          /* dataset name inside the group */
    fo_kind kind;
    int ndim_a, ndim_b;
    int64_t shape_a[FO_MAX_DIMS], shape_b[FO_MAX_DIMS];
    char dtype_a[16], dtype_b[16];
    fo_stats st;         /* A (candidate) against B (reference); for consistency: the odd rank
                            against the majority */
    int64_t at;          /* flat index the message is about: argmax, or the first non-finite
                            mismatch; -1 for none */
    int64_t coords[FO_MAX_DIMS]; /* `at` unravelled in shape_a */
    double val_a, val_b; /* the two values at `at` */
    char where[192];     /* `at` named: "batch 0, image token 12, head 2, channel 7" ("" if unknown) */
    int has_truth;       /* --truth: the arbiter rule decided */
    fo_stats st_a_truth, st_b_truth;
    uint64_t ranks;      /* ranks owning the divergent elements (bit r = rank r) */
    int ranks_known;     /* 0: no sharding information for this dataset */
    char *ranks_note;    /* "replicated", "per-rank file of rank 1", "sharded on dim 1", ... or NULL */
    char *msg;           /* one line: why it failed; NULL when it passed */
} fo_entry;

typedef enum fo_mode { FO_MODE_DIFF = 0, FO_MODE_CONSISTENCY } fo_mode;

typedef struct fo_report {
    fo_mode mode;
    int n, cap;
    fo_entry *v;         /* in execution order */
    fo_names only_a, only_b; /* "/step_0001/name": datasets (or whole groups' datasets) one side lacks */
    int first;           /* index in v of the first divergence, -1 */
    int nfail;
    fo_tolerance tol;    /* what was applied */
    double multiplier;   /* --truth rule m */
    int with_truth;
    int unchecked;       /* consistency: names the sharding map does not mark replicated */
    int nfiles;          /* consistency: number of rank files */
    int rank_of_file[FO_MAX_RANKS]; /* consistency: file i holds rank rank_of_file[i] */
} fo_report;
void fo_report_free(fo_report *r);

typedef struct fo_diff_opts {
    fo_tolerance tol;    /* used when tol_given; else the looser of both files' dtype defaults */
    int tol_given;
    double multiplier;   /* --truth rule m (PyTorch uses 2); 0 means 2 */
    int64_t block_elems; /* streaming block, values per file; 0 means 256 Ki (2 MB of doubles) */
} fo_diff_opts;

/* Compares every dataset `a` and `b` both hold; `truth` (may be NULL) is the arbiter. Returns
 * FS_OK when the comparison ran (r->nfail says whether it diverged), or an error (unreadable
 * dataset, ...). r is filled in either case and must be freed. */
int fo_diff_run(fo_file *a, fo_file *b, fo_file *truth, const fo_diff_opts *o, fo_report *r, fs_err *e);

/* Per-rank dumps (each with `parallel` holding `rank`): every dataset that the sharding map of
 * the first file marks "replicated" must be bitwise identical on all files. Errors: a file
 * without `parallel`/`rank`, two files of one rank, no sharding map. */
int fo_consistency_run(fo_file **files, int n, const fo_diff_opts *o, fo_report *r, fs_err *e);

/* flux-oracle stats */
typedef struct fo_stat_entry {
    int step;
    char group[40];
    char *name;
    int ndim;
    int64_t shape[FO_MAX_DIMS];
    char dtype[16];
    fo_summary s;
    int64_t coords[FO_MAX_DIMS]; /* of s.first_nonfinite */
    double first_value;          /* the non-finite value there (NaN, +inf, -inf) */
} fo_stat_entry;

typedef struct fo_stat_report {
    int n, cap;
    fo_stat_entry *v;
    int first_nonfinite; /* index in v of the first dataset holding NaN/Inf: where it originates */
} fo_stat_report;
void fo_stat_report_free(fo_stat_report *r);
int fo_stats_run(fo_file *a, int64_t block_elems, fo_stat_report *r, fs_err *e);

/* ---- pieces, exposed for tests and for the simulator's --check ---- */

/* Ownership of one tensor by ranks, from a sharding entry: for each split axis, a per-index rank
 * mask. Elements are owned by the ranks in the AND of their axes' masks. */
typedef struct fo_shard {
    int replicated;
    int naxes;
    int axis[FO_MAX_DIMS];     /* normalised (non-negative) */
    uint64_t *mask[FO_MAX_DIMS]; /* [shape[axis]] each */
} fo_shard;
/* Parses parallel-JSON `parallel`'s sharding entry for `name`, for a tensor of `shape`.
 * *found 0 when there is no entry (unknown distribution). Errors name `origin` and the entry. */
int fo_shard_parse(const char *parallel, const char *name, int ndim, const int64_t *shape, fo_shard *s, int *found,
                   const char *origin, fs_err *e);
void fo_shard_free(fo_shard *s);
uint64_t fo_shard_owner(const fo_shard *s, int ndim, const int64_t *coords);

/* "batch 0, image token 12, head 2, channel 7" for coordinates in a dataset named `name` of
 * `shape`, given the model sizes (any may be 0 = unknown). */
void fo_describe_coords(const char *group, const char *name, int ndim, const int64_t *shape, const int64_t *coords,
                        int batch, int s_txt, int s_img, int heads, int head_dim, char *buf, size_t n);

#endif
