/* fo_metrics.h — how far apart two tensors are.
 *
 * One pass over two equal-length double arrays, no allocation. Non-finite values are counted
 * per side, and the finite metrics (max |a-b|, relative L2, cosine) are taken over the positions
 * where BOTH sides are finite: a NaN would otherwise turn every metric into NaN and hide how far
 * the rest is. So a consumer must treat any NaN/Inf count (or n_nonfinite_mismatch) as a failure
 * of its own; first_nonfinite locates it. */
#ifndef FO_METRICS_H
#define FO_METRICS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fo_stats {
    int64_t n;          /* elements compared */
    int64_t n_finite;   /* positions where a and b are both finite: what the metrics cover */
    double max_abs;     /* max |a-b| over finite pairs; 0 when there are none */
    int64_t argmax;     /* flat index of max_abs (first one on ties); -1 when there are no finite pairs */
    double norm_a, norm_b, norm_diff; /* L2 norms over finite pairs */
    double rel_l2;      /* ||a-b|| / ||b||, with 0/0 = 0 and x/0 = +inf */
    double cosine;      /* a.b / (||a|| ||b||); 1 when both norms are 0, 0 when exactly one is */
    int64_t nan_a, inf_a, nan_b, inf_b;
    int64_t n_nonfinite_mismatch; /* positions where a and b are not the same non-finite value
                                     (NaN vs number, +inf vs -inf, inf vs number); NaN == NaN */
    int64_t first_nonfinite;      /* flat index of the first non-finite value on either side, or -1 */
    double max_abs_a, max_abs_b;  /* max |a|, max |b| over finite pairs: the scale that max_abs is
                                     judged against (fo_stats_max_rel) */
} fo_stats;

/* Compare a (the candidate) against b (the reference). n may be 0 (all metrics 0, cosine 1).
 * It is fo_acc over one block (below): one implementation of every metric, whether the data is
 * held whole (flux-sim --check) or streamed (flux-oracle diff). */
void fo_compare(const double *a, const double *b, int64_t n, fo_stats *s);

/* max|a-b| / max|b|: a per-element criterion that, unlike rel_l2, does not dilute a single bad
 * element among many good ones (0/0 = 0, x/0 = +inf). */
static inline double fo_stats_max_rel(const fo_stats *s)
{
    if (s->max_abs_b > 0) return s->max_abs / s->max_abs_b;
    return s->max_abs > 0 ? INFINITY : 0.0;
}

/* Streaming form of fo_compare, for datasets read block by block: fo_acc_add the blocks in flat
 * order, then fo_acc_finish. Sums are kept in long double, whose exponent range holds the square
 * of any finite double, so no overflow rescue pass (which would need the data twice) is needed.
 * fo_compare is this over one block, so the results differ from its only by the order of the
 * sums (the block cuts). Initialise with fo_acc_init. */
typedef struct fo_acc {
    fo_stats s;
    long double saa, sbb, sdd, sab;
} fo_acc;
void fo_acc_init(fo_acc *acc);
void fo_acc_add(fo_acc *acc, const double *a, const double *b, int64_t n);
void fo_acc_finish(fo_acc *acc, fo_stats *out);

/* A block of values as stored: float32 or float64, so a float32 dump is compared without first
 * being widened into a double copy (fo_stream_view hands out such views). Values are widened to
 * double one at a time inside the metric pass. */
typedef enum fo_vtype { FO_V_F64 = 0, FO_V_F32 = 1 } fo_vtype;
typedef struct fo_view {
    const void *p;
    fo_vtype type;
} fo_view;
static inline fo_view fo_view_f64(const double *p) { return (fo_view){p, FO_V_F64}; }
static inline fo_view fo_view_f32(const float *p) { return (fo_view){p, FO_V_F32}; }
static inline double fo_view_at(fo_view v, int64_t i)
{
    return v.type == FO_V_F32 ? (double)((const float *)v.p)[i] : ((const double *)v.p)[i];
}
/* fo_acc_add over views of any type pair; the same results as widening both to double first
 * (each value is converted exactly, then every operation is the double one). */
void fo_acc_add_view(fo_acc *acc, fo_view a, fo_view b, int64_t n);
/* 0 turns the hand-written AVX2 float32 kernel off (the compiler-vectorised loop runs instead), 1
 * back on (the default, where the CPU has AVX2): for tests that check both give the same
 * answers, and for benchmarks. Not thread-safe; call it before comparing. */
void fo_metrics_set_simd(int on);

/* Single-tensor summary for `flux-oracle stats`, also streaming. mean/std over finite values
 * (blocks merged with Chan's formula, so std has no catastrophic cancellation). */
typedef struct fo_summary {
    int64_t n, n_finite, nan, inf;
    double min, max, mean, std;
    int64_t first_nonfinite; /* flat index, or -1 */
    double m2;               /* internal: sum of squared deviations */
} fo_summary;
void fo_summary_init(fo_summary *s);
void fo_summary_add(fo_summary *s, const double *x, int64_t n);
void fo_summary_add_view(fo_summary *s, fo_view x, int64_t n); /* the same, values as stored */
void fo_summary_finish(fo_summary *s);

/* 1 when x and y are not the same non-finite value although one of them is non-finite: NaN vs a
 * number, +Inf vs -Inf, Inf vs a number (NaN == NaN here). What n_nonfinite_mismatch counts. */
static inline int fo_nonfinite_mismatch(double x, double y)
{
    if (isfinite(x) && isfinite(y)) return 0;
    return !((isnan(x) && isnan(y)) || (!isfinite(x) && !isfinite(y) && x == y));
}

/* 1 when nothing on either side is NaN or Inf. */
static inline int fo_stats_all_finite(const fo_stats *s)
{
    return s->nan_a == 0 && s->inf_a == 0 && s->nan_b == 0 && s->inf_b == 0;
}

/* Row-major coordinates of flat index `flat` in `shape` (ndim entries; ndim 0 writes nothing).
 * Returns 0, or -1 when flat is outside the shape. */
int fo_unravel(int64_t flat, int ndim, const int64_t *shape, int64_t *coords);

/* "(0, 12, 7)" into buf, for reports. */
const char *fo_coords_str(int ndim, const int64_t *coords, char *buf, size_t n);

#endif
