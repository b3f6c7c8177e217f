/* fo_tolerance.h — when two dumps of the same run "agree": the rules `flux-oracle diff` and the
 * simulator's `--check` share. The numbers and the measurements behind them: docs/tolerances.md.
 *
 * A dataset passes iff no NaN/Inf stands where the other side has something else, and
 *     max_abs <= atol                                   (absolute floor, for near-zero tensors)
 *  OR rel_l2 <= rtol  AND  (mtol <= 0 OR max_rel <= mtol)
 * where max_rel = max|a-b| / max|b|. rel_l2 measures the whole tensor and is what fp32 rounding
 * noise is bounded by; max_rel catches the single wrong element that rel_l2 dilutes (one element
 * off by 1e-3 in 8192 moves rel_l2 by ~1e-5, within fp32 noise). A literal {rtol, atol} (mtol 0)
 * is exactly "rel_l2 <= rtol OR max_abs <= atol". */
#ifndef FO_TOLERANCE_H
#define FO_TOLERANCE_H

#include "fo_metrics.h"

typedef struct fo_tolerance {
    double rtol; /* bound on rel_l2 = ||a-b|| / ||b|| */
    double atol; /* max|a-b| at or below this passes whatever the relative errors */
    double mtol; /* bound on max|a-b| / max|b|; <= 0 disables */
    double m_rel, m_max; /* the arbiter's multipliers on rel_l2 and on max_rel (fo_tolerance_arbiter);
                            0 means 2 */
} fo_tolerance;

/* Defaults for a run computed in `dtype` ("float32", "float64", "bfloat16", "float16"); NULL or
 * anything else gets the float32 numbers. */
fo_tolerance fo_tolerance_default(const char *dtype);
/* Two runs of the same implementation that differ only in parallel layout (flux-sim --check):
 * only summation order changes (all-reduces of partials, blocked and ring-merged softmax), so
 * the bounds are much tighter than across implementations. Measured worst over the layout
 * matrix (tests/parallel_check.sh): fp32 rel L2 5.6e-7, max_rel ~1.5e-6; fp64 1.04e-15.
 * float32: rtol 2e-5, mtol 2e-4; float64: rtol 1e-10, mtol 1e-9; no absolute floor. */
fo_tolerance fo_tolerance_layout(const char *dtype);
/* The looser of two (field by field): comparing a float32 run with a float64 one is judged by
 * float32's rules. mtol: a disabled side wins (it is the loosest). */
fo_tolerance fo_tolerance_looser(fo_tolerance a, fo_tolerance b);
/* 1 = within tolerance (the rule above). */
int fo_tolerance_pass(const fo_stats *s, fo_tolerance t);

/* The arbiter rule (PyTorch's torch._dynamo accuracy check with an fp64 reference), used by
 * `flux-oracle diff A B --truth T` and by --check of a bf16 run: the CANDIDATE passes where
 *     err(candidate, truth) <= m_rel · err(baseline, truth) + rtol/10          (rel L2)
 * and (mtol > 0)  max_rel(candidate, truth) <= m_max · max_rel(baseline, truth) + mtol/10
 * with `cand` comparing the candidate with the truth and `base` the baseline with the truth.
 * A bf16 candidate (a GPU run, a parallel layout) is judged against a matched float64 truth with
 * flux-sim's own bf16 emulation as the baseline: the multipliers and floors of
 * fo_tolerance_default("bfloat16") were measured that way (docs/bf16.md). */
int fo_tolerance_arbiter(const fo_stats *cand, const fo_stats *base, fo_tolerance t);
/* The multipliers the arbiter applies: a tolerance's 0 means 2 (PyTorch's). Reports that quote
 * the rule take them from here, so they print what was applied. */
static inline double fo_tolerance_m_rel(fo_tolerance t) { return t.m_rel > 0 ? t.m_rel : 2; }
static inline double fo_tolerance_m_max(fo_tolerance t) { return t.m_max > 0 ? t.m_max : 2; }

#endif
