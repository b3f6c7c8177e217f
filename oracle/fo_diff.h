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
     * names matching one of the fnmatch(3) globs in `modules` are compared, and only those must
     * be on both sides. /inputs and /final are always compared. NULL / 0: everything. */
    const char *const *modules;
    int n_modules;
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

/* flux-oracle stats: per dataset min/max/mean/std/NaN/Inf, in execution order. Errors: a partial
 * file (unless o->allow_partial; then r->partial_note says so), a malformed `config`. o may be
 * NULL (defaults); only block_elems, allow_partial, modules and steps are used. */
int fo_stats_run(fo_file *a, const fo_diff_opts *o, fo_stat_report *r, fs_err *e);

/* ---- pieces shared by the three runs ---- */

/* FS_OK when f is complete, or partial and allow_partial (then *note, if note is non-NULL, gets
 * a malloc'ed "F is partial (...): compared what is there"); FS_E_INPUT "F: partial dump (last
 * step present: 2): <reason>; --allow-partial compares what is there" otherwise. */
int fo_require_complete(fo_file *f, int allow_partial, char **note, fs_err *e);
/* 1 when o narrows and `name` in step `step` is left out by it. */
int fo_narrowed_out(const fo_diff_opts *o, int step, const char *name);

#endif
