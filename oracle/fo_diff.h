/* fo_diff.h — the comparison engine behind `flux-oracle` (diff, stats, consistency), as a library.
 *
 * Walks flux-dumps in execution order (fo_walk.h): /inputs, then the step groups by number,
 * each in its `order` attribute's order, then /final. Datasets are streamed block by block in
 * lockstep (fo_stream), so memory is a few blocks per open file, not the file. Nothing here
 * prints: the results are fo_report / fo_stat_report values (fo_report.h) that the CLI renders.
 *
 * A comparison is only as good as what it covers, so before anything is compared each file must
 * be complete (fo_file_completeness) unless allow_partial, the two dumps must describe the same
 * model (fo_config.h), and afterwards every name one side recorded must be on the other side
 * unless the lacking side declared it unrecorded or the caller narrowed the comparison
 * (fo_report_verdict says ERROR otherwise).
 *
 * Verdicts use fo_tolerance (docs/tolerances.md), except that here a tensor holding NaN/Inf
 * never passes, whatever the other side holds; rank attribution uses the `parallel`
 * attribute's `sharding` map (fo_shard.h). */
#ifndef FO_DIFF_H
#define FO_DIFF_H

#include "fo_coords.h"
#include "fo_dump.h"
#include "fo_metrics.h"
#include "fo_report.h"
#include "fo_shard.h"
#include "fo_steps.h"
#include "fo_tolerance.h"

typedef struct fo_diff_opts {
    fo_tolerance tol;    /* used when tol_given; else the looser of both files' dtype defaults */
    int tol_given;
    double multiplier;   /* --truth rule m (PyTorch uses 2); 0 means 2 */
    int64_t block_elems; /* streaming block, values per file; 0 means 256 Ki (2 MB of doubles) */
    /* Narrowing (--modules, --steps): only step groups in `steps` and, inside step groups, only
     * names matching one of the globs in `modules` are compared, and only those must be on both
     * sides. /inputs and /final are always compared. NULL: everything. */
    const fo_globs *modules;
    const fo_steps *steps;
    int allow_partial;   /* compare partial dumps (what is there) instead of refusing them */
} fo_diff_opts;

/* Compares every dataset `a` and `b` both hold; `truth` (may be NULL) is the arbiter. Errors
 * (FS_E_INPUT, r still filled as far as it got, must be freed): a partial file without
 * allow_partial ("B.h5: partial dump, last step present 2: step_0002 has no `order`: ..."), a
 * malformed `config`, configs of different models, an unreadable dataset. FS_OK otherwise:
 * fo_report_verdict(r, ...) says pass, diverge or error. */
int fo_diff_run(fo_file *a, fo_file *b, fo_file *truth, const fo_diff_opts *o, fo_report *r, fs_err *e);

/* Per-rank dumps (each with `parallel` holding `rank`): every dataset that the sharding map of
 * the first file marks "replicated" must be bitwise identical on all files. Errors: a file
 * without `parallel`/`rank`, two files of one rank, no sharding map, a partial file (unless
 * o->allow_partial), configs that differ. o->modules / o->steps narrow as in diff. */
int fo_consistency_run(fo_file **files, int n, const fo_diff_opts *o, fo_report *r, fs_err *e);
/* The same with a global reference `ref` (may be NULL). Where a replicated tensor's copies split
 * into groups of identical copies, nobody is blamed by majority: without `ref` the entry's ranks
 * are every rank and its message gives the split ("ranks 0 | 1, 2, 3 hold 2 different copies");
 * with `ref` each group's copy is compared with ref's tensor (r->tol, as diff) and the ranks are
 * the groups that fail ("ranks 1, 2, 3 differ from the reference; rank 0 agrees with it"); if no
 * group fails, or every group does, the message says so and the ranks are every rank. */
int fo_consistency_ref_run(fo_file **files, int n, fo_file *ref, const fo_diff_opts *o, fo_report *r, fs_err *e);

/* flux-oracle stats: per dataset min/max/mean/std/NaN/Inf, in execution order. Errors: a partial
 * file (unless o->allow_partial; then r->partial_note says so), a malformed `config`. o may be
 * NULL (defaults); only block_elems, allow_partial, modules and steps are used. */
int fo_stats_run(fo_file *a, const fo_diff_opts *o, fo_stat_report *r, fs_err *e);

/* Per-rank dumps against a global reference (flux-oracle diff DIR REF.h5, fo_rankdiff.c): every
 * rank's datasets compared with the slice of B that the file's own `parallel` sharding map
 * places them at (token shards of one or more intervals, feature shards, split on several axes,
 * replicated, or no entry and B's shape: compared whole). One entry per dataset: its metrics
 * are over every rank's piece together; it fails when they fail or when one rank's piece alone
 * would fail the tolerance measured against the whole reference tensor (max|A_r-B| against
 * max|B|, ||A_r-B|| against ||B||); its ranks are those pieces (else the owner of the largest
 * difference). Names under `partial` (sums before a reduction) are not comparable per rank:
 * FO_EMPTY entries saying so. Same errors as fo_diff_run, plus: a file that is not a per-rank
 * dump, two files of one rank, ranks of different worlds, a rank lacking a name rank 0 holds,
 * a piece its map cannot place in B. No --truth. ranks[i]: the rank files, any order. */
int fo_rank_diff_run(fo_file **ranks, int n, fo_file *b, const fo_diff_opts *o, fo_report *r, fs_err *e);

/* ---- pieces shared by the three runs ---- */

/* r->tol (o's, or the looser of a's and b's dtype defaults), the arbiter's multipliers,
 * with_truth, narrowed: what a diff applies. */
void fo_diff_setup(fo_report *r, const fo_diff_opts *o, fo_file *a, fo_file *b, int with_truth);
/* FS_E_INPUT "A and B are dumps of different models (...)" or a malformed config's error. */
int fo_same_model(fo_file *a, fo_file *b, fs_err *e);
/* The verdict of one entry whose en->st (and, with truth, st_a_truth / st_b_truth) are filled,
 * en->shape_a / ndim_a the shape its flat indices refer to and en->val_a / val_b the values at
 * en->st.argmax: sets kind, at, coords, where and the one-line msg. pass: the tolerance rule's
 * answer; first_mismatch / fm_*: the first NaN/Inf facing another value and the two values;
 * first_nf / fn_*: the first non-finite value (for NaN on both sides). */
void fo_diff_judge(fo_entry *en, const fo_model_dims *md, fo_tolerance tol, int pass, int64_t first_mismatch,
                   double fm_a, double fm_b, int64_t first_nf, double fn_a, double fn_b);

/* FS_OK when f is complete, or partial and allow_partial (then *note, if note is non-NULL, gets
 * a malloc'ed "F is partial (...): compared what is there"); FS_E_INPUT "F: partial dump (last
 * step present: 2): <reason>; --allow-partial compares what is there" otherwise. */
int fo_require_complete(fo_file *f, int allow_partial, char **note, fs_err *e);
/* 1 when o narrows and `name` in step `step` is left out by it. */
int fo_narrowed_out(const fo_diff_opts *o, int step, const char *name);

#endif
