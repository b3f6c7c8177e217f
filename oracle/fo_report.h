/* fo_report.h — what a comparison found: the results of fo_diff_run / fo_consistency_run /
 * fo_stats_run (fo_diff.h), and the rule that turns a report into a verdict.
 *
 * Nothing here prints: the CLI renders these structs as a table, one line, JSON, JUnit or HTML.
 * The verdict is decided here, once, so every rendering says the same thing. */
#ifndef FO_REPORT_H
#define FO_REPORT_H

#include "fo_dump.h"
#include "fo_metrics.h"
#include "fo_tolerance.h"

#define FO_STEP_INPUTS (-1) /* fo_entry.step of /inputs datasets */
#define FO_STEP_FINAL (-2)  /* ... of /final */
#define FO_MAX_RANKS 64     /* rank attribution is a 64-bit mask */

typedef enum fo_kind {
    FO_PASS = 0,
    FO_TOL,       /* finite values out of tolerance */
    FO_NONFINITE, /* NaN/Inf on either side: never passes, even NaN facing NaN */
    FO_SHAPE,     /* the shapes differ */
    FO_UNEQUAL,   /* consistency: replicas of a replicated tensor are not bitwise identical */
    FO_EMPTY,     /* 0 elements on both sides: nothing to compare; neither a pass nor a failure,
                     and not counted as compared */
} fo_kind;
const char *fo_kind_name(fo_kind k); /* "pass", "tolerance", "nonfinite", "shape", "unequal", "empty" */

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
                            value; -1 for none */
    int64_t coords[FO_MAX_DIMS]; /* `at` unravelled in shape_a */
    double val_a, val_b; /* the two values at `at` */
    char where[192];     /* `at` named: "batch 0, image token 12, head 2, channel 7" ("" if unknown) */
    int has_truth;       /* --truth: the arbiter rule decided */
    fo_stats st_a_truth, st_b_truth;
    uint64_t ranks;      /* ranks owning the divergent elements (bit r = rank r) */
    int ranks_known;     /* 0: no sharding information for this dataset */
    char *ranks_note;    /* "replicated", "per-rank file of rank 1", "sharded on dim 1", ... or NULL */
    char *msg;           /* one line: why it failed (or why it was not compared); NULL when it passed */
} fo_entry;

typedef enum fo_mode { FO_MODE_DIFF = 0, FO_MODE_CONSISTENCY } fo_mode;

typedef struct fo_report {
    fo_mode mode;
    int n, cap;
    fo_entry *v;         /* in execution order */
    /* Names ("/step_0001/name") one side holds and the other lacks, in execution order. only_a:
     * in A, not in B; only_b: in B, not in A (consistency: only_a lists "name (rank r)" for a
     * replicated name rank r lacks). Every such name is also either "declared" (the lacking
     * side said it did not record it: `recorded_steps`, a step's `recorded_modules`, or it is
     * partial and --allow-partial was given) or listed again in undeclared_a / undeclared_b
     * (same orientation), which makes the comparison an error: something recorded on one side
     * is missing on the other for no stated reason. */
    fo_names only_a, only_b;
    fo_names undeclared_a, undeclared_b;
    int excluded;        /* datasets left out by --modules / --steps */
    int first;           /* index in v of the first divergence, -1 */
    int nfail;           /* entries that fail (not FO_PASS, not FO_EMPTY) */
    int n_compared;      /* entries with something compared (not FO_EMPTY) */
    int n_empty;         /* FO_EMPTY entries */
    fo_tolerance tol;    /* what was applied */
    double multiplier;   /* --truth rule m */
    int with_truth;
    int narrowed;        /* --modules / --steps restricted the comparison */
    int unchecked;       /* consistency: names the sharding map does not mark replicated */
    int nfiles;          /* consistency: number of rank files */
    int rank_of_file[FO_MAX_RANKS]; /* consistency: file i holds rank rank_of_file[i] */
    char *partial_note;  /* --allow-partial and a partial file: "B.h5 is partial (...)"; else NULL */
} fo_report;
void fo_report_free(fo_report *r);

/* The verdict of a report, the h5diff exit codes: */
typedef enum fo_verdict {
    FO_VERDICT_PASS = 0,    /* every compared tensor within tolerance */
    FO_VERDICT_DIVERGE = 1, /* some tensor out of tolerance (or --strict and names on one side) */
    FO_VERDICT_ERROR = 2,   /* the comparison itself is not trustworthy: names missing on one side
                               without a declaration, or nothing compared at all */
} fo_verdict;
/* The rule, in this order: undeclared names on either side -> ERROR; nothing compared (every
 * common dataset empty, or none in common) -> ERROR; a failing entry -> DIVERGE; `strict` and
 * any name on one side only -> DIVERGE; else PASS. For ERROR, `why` (may be NULL) gets one line
 * naming the file and the first missing name ("B.h5 lacks /step_0003/norm_out.linear (and 2
 * more) that A.h5 holds, and declares no reason"). file_a / file_b: the paths to name. */
fo_verdict fo_report_verdict(const fo_report *r, int strict, const char *file_a, const char *file_b, char *why,
                             size_t n);

/* flux-oracle stats */
typedef struct fo_stat_entry {
    int step;
    char group[40];
    char *name;
    int ndim;
    int64_t shape[FO_MAX_DIMS];
    char dtype[16];
    fo_summary s;                /* s.n == 0: an empty dataset (no min/max/mean: say "empty") */
    int64_t coords[FO_MAX_DIMS]; /* of s.first_nonfinite */
    double first_value;          /* the non-finite value there (NaN, +inf, -inf) */
} fo_stat_entry;

typedef struct fo_stat_report {
    int n, cap;
    fo_stat_entry *v;
    int first_nonfinite; /* index in v of the first dataset holding NaN/Inf: where it originates */
    int n_empty;         /* datasets with 0 elements */
    char *partial_note;  /* --allow-partial on a partial file: what is missing; else NULL */
} fo_stat_report;
void fo_stat_report_free(fo_stat_report *r);

/* ---- for the engine's own files (fo_diff.c, fo_consistency.c, fo_stats.c) ---- */

void fo_report_init(fo_report *r, fo_mode mode);
/* Appends an entry (zeroed, at = -1) named group/name; NULL when out of memory. */
fo_entry *fo_report_add(fo_report *r, int step, const char *group, const char *name);
/* Counts failures, compared and empty entries, and finds the first divergence. */
void fo_report_tally(fo_report *r);
/* Appends "group/name" to l; -1 when out of memory. */
int fo_names_push(fo_names *l, const char *group, const char *name);
/* vasprintf into a new string, NULL when out of memory. */
char *fo_strdupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
