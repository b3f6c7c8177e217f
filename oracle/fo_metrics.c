#include "fo_metrics.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Sums of squares with a rescue for overflow: activations are O(1), so the plain sum is exact
 * enough and fast; only when a sum overflows (|x| > ~1e154) do we redo it scaled by the
 * largest magnitude, the way BLAS dnrm2 avoids overflow. */
static double scaled_norm(const double *a, const double *b, int64_t n, int which)
{
    double big = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) continue;
        double v = which == 0 ? a[i] : which == 1 ? b[i] : a[i] - b[i];
        if (fabs(v) > big) big = fabs(v);
    }
    if (big == 0 || !isfinite(big)) return big;
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) continue;
        double v = (which == 0 ? a[i] : which == 1 ? b[i] : a[i] - b[i]) / big;
        s += v * v;
    }
    return big * sqrt(s);
}

void fo_compare(const double *a, const double *b, int64_t n, fo_stats *s)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    s->argmax = -1;
    s->first_nonfinite = -1;
    double saa = 0, sbb = 0, sdd = 0, sab = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        int fx = isfinite(x), fy = isfinite(y);
        if (!fx || !fy) {
            if (isnan(x)) s->nan_a++;
            else if (!fx) s->inf_a++;
            if (isnan(y)) s->nan_b++;
            else if (!fy) s->inf_b++;
            int same = (isnan(x) && isnan(y)) || (!fx && !fy && x == y);
            if (!same) s->n_nonfinite_mismatch++;
            if (s->first_nonfinite < 0) s->first_nonfinite = i;
            continue;
        }
        double d = x - y, ad = fabs(d);
        if (fabs(x) > s->max_abs_a) s->max_abs_a = fabs(x);
        if (fabs(y) > s->max_abs_b) s->max_abs_b = fabs(y);
        if (s->argmax < 0 || ad > s->max_abs) {
            s->max_abs = ad;
            s->argmax = i;
        }
        saa += x * x;
        sbb += y * y;
        sdd += d * d;
        sab += x * y;
        s->n_finite++;
    }
    s->norm_a = sqrt(saa);
    s->norm_b = sqrt(sbb);
    s->norm_diff = sqrt(sdd);
    double dot = sab;
    if (!isfinite(saa) || !isfinite(sbb) || !isfinite(sdd) || !isfinite(sab)) {
        s->norm_a = scaled_norm(a, b, n, 0);
        s->norm_b = scaled_norm(a, b, n, 1);
        s->norm_diff = scaled_norm(a, b, n, 2);
        /* a.b scaled by both maxima so it cannot overflow either. */
        double ma = 0, mb = 0;
        for (int64_t i = 0; i < n; i++)
            if (isfinite(a[i]) && isfinite(b[i])) {
                if (fabs(a[i]) > ma) ma = fabs(a[i]);
                if (fabs(b[i]) > mb) mb = fabs(b[i]);
            }
        double t = 0;
        if (ma > 0 && mb > 0)
            for (int64_t i = 0; i < n; i++)
                if (isfinite(a[i]) && isfinite(b[i])) t += (a[i] / ma) * (b[i] / mb);
        s->cosine = (ma > 0 && mb > 0) ? t / ((s->norm_a / ma) * (s->norm_b / mb)) : 0;
        if (ma == 0 && mb == 0) s->cosine = 1;
    } else if (s->norm_a == 0 && s->norm_b == 0) {
        s->cosine = 1; /* two zero vectors are identical */
    } else if (s->norm_a == 0 || s->norm_b == 0) {
        s->cosine = 0;
    } else {
        s->cosine = dot / (s->norm_a * s->norm_b);
    }
    /* Rounding can push |cos| a hair above 1 for near-identical vectors. */
    if (s->cosine > 1) s->cosine = 1;
    if (s->cosine < -1) s->cosine = -1;
    if (s->norm_b == 0) s->rel_l2 = s->norm_diff == 0 ? 0 : INFINITY;
    else s->rel_l2 = s->norm_diff / s->norm_b;
}

void fo_acc_init(fo_acc *acc)
{
    memset(acc, 0, sizeof *acc);
    acc->s.argmax = -1;
    acc->s.first_nonfinite = -1;
}

void fo_acc_add(fo_acc *acc, const double *a, const double *b, int64_t n)
{
    fo_stats *s = &acc->s;
    int64_t base = s->n;
    /* Per-block double partial sums (vectorisable, block sizes keep them exact enough), folded
     * into the long double totals; a block whose partial sums overflow is redone in long double. */
    double saa = 0, sbb = 0, sdd = 0, sab = 0, ma = s->max_abs_a, mb = s->max_abs_b;
    double best = s->max_abs;
    int64_t arg = s->argmax, nf = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        if (!isfinite(x) || !isfinite(y)) {
            if (isnan(x)) s->nan_a++;
            else if (!isfinite(x)) s->inf_a++;
            if (isnan(y)) s->nan_b++;
            else if (!isfinite(y)) s->inf_b++;
            int same = (isnan(x) && isnan(y)) || (!isfinite(x) && !isfinite(y) && x == y);
            if (!same) s->n_nonfinite_mismatch++;
            if (s->first_nonfinite < 0) s->first_nonfinite = base + i;
            continue;
        }
        double d = x - y, ad = fabs(d);
        if (fabs(x) > ma) ma = fabs(x);
        if (fabs(y) > mb) mb = fabs(y);
        if (arg < 0 || ad > best) {
            best = ad;
            arg = base + i;
        }
        saa += x * x;
        sbb += y * y;
        sdd += d * d;
        sab += x * y;
        nf++;
    }
    if (isfinite(saa) && isfinite(sbb) && isfinite(sdd) && isfinite(sab)) {
        acc->saa += saa, acc->sbb += sbb, acc->sdd += sdd, acc->sab += sab;
    } else {
        for (int64_t i = 0; i < n; i++) {
            if (!isfinite(a[i]) || !isfinite(b[i])) continue;
            long double x = a[i], y = b[i];
            acc->saa += x * x, acc->sbb += y * y, acc->sdd += (x - y) * (x - y), acc->sab += x * y;
        }
    }
    s->max_abs = best, s->argmax = arg, s->max_abs_a = ma, s->max_abs_b = mb;
    s->n_finite += nf;
    s->n = base + n;
}

void fo_acc_finish(fo_acc *acc, fo_stats *out)
{
    fo_stats *s = &acc->s;
    s->norm_a = (double)sqrtl(acc->saa);
    s->norm_b = (double)sqrtl(acc->sbb);
    s->norm_diff = (double)sqrtl(acc->sdd);
    if (acc->saa == 0 && acc->sbb == 0) s->cosine = 1;
    else if (acc->saa == 0 || acc->sbb == 0) s->cosine = 0;
    else s->cosine = (double)(acc->sab / (sqrtl(acc->saa) * sqrtl(acc->sbb)));
    if (s->cosine > 1) s->cosine = 1;
    if (s->cosine < -1) s->cosine = -1;
    if (acc->sbb == 0) s->rel_l2 = acc->sdd == 0 ? 0 : INFINITY;
    else s->rel_l2 = (double)(sqrtl(acc->sdd) / sqrtl(acc->sbb));
    *out = *s;
}

void fo_summary_init(fo_summary *s)
{
    memset(s, 0, sizeof *s);
    s->first_nonfinite = -1;
    s->min = INFINITY;
    s->max = -INFINITY;
}

void fo_summary_add(fo_summary *s, const double *x, int64_t n)
{
    /* Block mean and M2 by two passes over the (cache-resident) block, then Chan's merge. */
    double sum = 0, mn = s->min, mx = s->max;
    int64_t nf = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        if (!isfinite(v)) {
            if (isnan(v)) s->nan++;
            else s->inf++;
            if (s->first_nonfinite < 0) s->first_nonfinite = s->n + i;
            continue;
        }
        sum += v;
        if (v < mn) mn = v;
        if (v > mx) mx = v;
        nf++;
    }
    s->min = mn, s->max = mx;
    if (nf) {
        double bmean = sum / (double)nf, bm2 = 0;
        if (!isfinite(bmean)) { /* sum overflowed: mean of scaled values */
            long double ls = 0;
            for (int64_t i = 0; i < n; i++)
                if (isfinite(x[i])) ls += x[i];
            bmean = (double)(ls / nf);
        }
        for (int64_t i = 0; i < n; i++)
            if (isfinite(x[i])) bm2 += (x[i] - bmean) * (x[i] - bmean);
        int64_t tot = s->n_finite + nf;
        double delta = bmean - s->mean;
        s->mean += delta * (double)nf / (double)tot;
        s->m2 += bm2 + delta * delta * (double)s->n_finite * (double)nf / (double)tot;
        s->n_finite = tot;
    }
    s->n += n;
}

void fo_summary_finish(fo_summary *s)
{
    s->std = s->n_finite ? sqrt(s->m2 / (double)s->n_finite) : 0;
    if (!s->n_finite) s->min = s->max = 0;
}

int fo_unravel(int64_t flat, int ndim, const int64_t *shape, int64_t *coords)
{
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    if (flat < 0 || flat >= numel) return -1;
    for (int i = ndim - 1; i >= 0; i--) {
        coords[i] = flat % shape[i];
        flat /= shape[i];
    }
    return 0;
}

const char *fo_coords_str(int ndim, const int64_t *coords, char *buf, size_t n)
{
    size_t o = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)coords[i]);
    if (o < n) snprintf(buf + o, n - o, ")");
    return buf;
}
