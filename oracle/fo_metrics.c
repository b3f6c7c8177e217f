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
