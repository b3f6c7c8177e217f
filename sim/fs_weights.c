#include "fs_weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fs_plan.h"
#include "fs_rng.h"

int fs_weights_init_empty(fs_weights *w, const fs_config *c, fs_dtype dt, fs_err *e)
{
    memset(w, 0, sizeof *w);
    w->cfg = *c;
    w->dtype = dt;
    w->tp = 1;
    w->desc = fs_config_params(c, &w->n);
    if (!w->desc) return fs_errf(e, FS_E_NOMEM, "out of memory building the parameter list");
    w->t = calloc((size_t)w->n, sizeof *w->t);
    if (!w->t) {
        free(w->desc);
        w->desc = NULL;
        return fs_errf(e, FS_E_NOMEM, "out of memory");
    }
    return FS_OK;
}

/* A standard normal z scaled to the magnitudes of ../shared/reference/README.md. */
static double synthetic_scale(const fs_param_desc *d, double z)
{
    switch (d->kind) {
    case FS_PARAM_LINEAR_W: return z / sqrt((double)d->shape[1]);
    case FS_PARAM_BIAS: return 0.05 * z;
    case FS_PARAM_RMS_W: return 1.0 + 0.1 * z;
    }
    return 0;
}

double fs_weights_synthetic_value(const fs_param_desc *d, uint64_t seed, int64_t index)
{
    /* The key depends on the name only, never on the shape: a shard of rows [a, b) is the
     * same numbers whatever the world size. */
    return synthetic_scale(d, fs_rng_normal(fs_rng_key(seed, d->name), (uint64_t)index));
}

int fs_weights_shard_of(const fs_param_desc *d, const fs_plan *plan, const fs_config *c, int T, int t, fs_wshard *s,
                        fs_err *e)
{
    const int64_t N = d->shape[0], K = d->ndim == 2 ? d->shape[1] : 1;
    *s = (fs_wshard){.sharded = 0, .r0 = 0, .r1 = N, .nc = 1, .c = {{0, K}}};
    if (T <= 1 || d->kind == FS_PARAM_RMS_W) return FS_OK;
    char module[128];
    snprintf(module, sizeof module, "%s", d->name);
    char *dot = strrchr(module, '.'); /* strip .weight / .bias */
    if (dot) *dot = 0;
    int64_t widths[2];
    switch (fs_plan_lookup(plan, c, module, widths, NULL)) {
    case FS_TP_REPLICATE: return FS_OK;
    case FS_TP_COLWISE: /* output rows; the bias follows them */
        if (N % T) return fs_errf(e, FS_E_INPUT, "%s: %lld rows not divisible by tp %d", d->name, (long long)N, T);
        s->r0 = t * (N / T);
        s->r1 = (t + 1) * (N / T);
        s->sharded = 1;
        return FS_OK;
    case FS_TP_ROWWISE: /* input columns; the bias is added once, after the all-reduce: whole */
        if (d->kind == FS_PARAM_BIAS) return FS_OK;
        if (K % T) return fs_errf(e, FS_E_INPUT, "%s: %lld columns not divisible by tp %d", d->name, (long long)K, T);
        s->c[0][0] = t * (K / T);
        s->c[0][1] = (t + 1) * (K / T);
        s->sharded = 1;
        return FS_OK;
    case FS_TP_PACKED_ROWWISE:
        if (d->kind == FS_PARAM_BIAS) return FS_OK;
        if (widths[0] + widths[1] != K || widths[0] % T || widths[1] % T)
            return fs_errf(e, FS_E_INPUT, "%s: packed_rowwise widths %lld,%lld do not split %lld columns over tp %d",
                           d->name, (long long)widths[0], (long long)widths[1], (long long)K, T);
        s->nc = 2;
        s->c[0][0] = t * (widths[0] / T);
        s->c[0][1] = (t + 1) * (widths[0] / T);
        s->c[1][0] = widths[0] + t * (widths[1] / T);
        s->c[1][1] = widths[0] + (t + 1) * (widths[1] / T);
        s->sharded = 1;
        return FS_OK;
    }
    return FS_OK;
}

static int64_t shard_cols(const fs_wshard *s)
{
    int64_t n = 0;
    for (int i = 0; i < s->nc; i++) n += s->c[i][1] - s->c[i][0];
    return n;
}


/* The old bulk path (before fs_rng_fast.c / fs_weights_synth.c): libm per pair, the scale per
 * element, one thread. Kept as the reference the fast path is measured and tested against. */
void fs_weights_synthetic_fill_scalar(const fs_param_desc *d, uint64_t seed, int64_t first, int64_t count, fs_dtype dt,
                                      void *out)
{
    enum { BLK = 4096 };
    double buf[BLK];
    const uint64_t key = fs_rng_key(seed, d->name);
    for (int64_t k0 = 0; k0 < count; k0 += BLK) {
        const int64_t m = count - k0 < BLK ? count - k0 : BLK;
        fs_rng_normal_fill_scalar(key, (uint64_t)(first + k0), m, buf);
        if (dt == FS_F64)
            for (int64_t k = 0; k < m; k++) ((double *)out)[k0 + k] = synthetic_scale(d, buf[k]);
        else
            for (int64_t k = 0; k < m; k++) ((float *)out)[k0 + k] = (float)synthetic_scale(d, buf[k]);
    }
}

/* The elements a shard holds, generated run by run: a run is a contiguous range of the full
 * tensor's element indices (a whole-width shard, the full tensor included, is one run; a column
 * slice is one run per row and interval), each filled by fs_weights_synthetic_fill (vectorised,
 * threaded over blocks). Values equal fs_weights_synthetic_value's. */
static void fill_synthetic(fs_tensor *t, const fs_param_desc *d, const fs_wshard *sh, uint64_t seed)
{
    const int64_t K = d->ndim == 2 ? d->shape[1] : 1;
    const int whole_rows = sh->nc == 1 && sh->c[0][0] == 0 && sh->c[0][1] == K;
    const size_t es = fs_dtype_size(t->dtype);
    if (whole_rows) {
        fs_weights_synthetic_fill(d, seed, sh->r0 * K, (sh->r1 - sh->r0) * K, t->dtype, t->data);
        return;
    }
    int64_t out = 0;
    for (int64_t r = sh->r0; r < sh->r1; r++)
        for (int i = 0; i < sh->nc; i++) {
            const int64_t len = sh->c[i][1] - sh->c[i][0];
            fs_weights_synthetic_fill(d, seed, r * K + sh->c[i][0], len, t->dtype, (char *)t->data + (size_t)out * es);
            out += len;
        }
}

int fs_weights_synthetic_shard(fs_weights *w, const fs_config *c, fs_dtype dt, uint64_t seed, const fs_plan *plan, int T,
                               int t, fs_err *e)
{
    int rc = fs_weights_init_empty(w, c, dt, e);
    if (rc) return rc;
    if (T > 1) {
        w->tp = T;
        w->tp_rank = t;
        snprintf(w->source, sizeof w->source, "synthetic seed %llu, tp shard %d/%d", (unsigned long long)seed, t, T);
    } else {
        snprintf(w->source, sizeof w->source, "synthetic seed %llu", (unsigned long long)seed);
    }
    for (int i = 0; i < w->n; i++) {
        const fs_param_desc *d = &w->desc[i];
        fs_wshard sh;
        int64_t shape[2];
        if ((rc = fs_weights_shard_of(d, plan, c, T, t, &sh, e))) break;
        shape[0] = sh.r1 - sh.r0;
        shape[1] = shard_cols(&sh);
        if ((rc = fs_tensor_alloc(&w->t[i], dt, d->ndim, shape, e))) {
            fs_err_prefix(e, "synthetic weight %s: ", d->name);
            break;
        }
        fill_synthetic(&w->t[i], d, &sh, seed);
    }
    if (rc) fs_weights_free(w);
    return rc;
}

int fs_weights_shard(fs_weights *w, const fs_plan *plan, int T, int t, fs_err *e)
{
    if (T <= 1) return FS_OK;
    if (w->tp != 1) return fs_errf(e, FS_E_INTERNAL, "weights already sharded");
    const size_t es = fs_dtype_size(w->dtype);
    for (int i = 0; i < w->n; i++) {
        const fs_param_desc *d = &w->desc[i];
        fs_wshard sh;
        int rc = fs_weights_shard_of(d, plan, &w->cfg, T, t, &sh, e);
        if (rc) return rc;
        if (!sh.sharded) continue;
        fs_tensor *full = &w->t[i], part;
        const int64_t K = d->ndim == 2 ? d->shape[1] : 1, cols = shard_cols(&sh);
        if (cols == K && !full->owns) { /* a row range of a view: still a view */
            part = fs_tensor_rows(full, sh.r0, sh.r1 - sh.r0);
        } else {
            int64_t shape[2] = {sh.r1 - sh.r0, cols};
            if ((rc = fs_tensor_alloc(&part, w->dtype, d->ndim, shape, e))) return rc;
            for (int64_t r = sh.r0; r < sh.r1; r++) {
                int64_t o = 0;
                for (int k = 0; k < sh.nc; k++) {
                    int64_t len = sh.c[k][1] - sh.c[k][0];
                    memcpy((char *)part.data + (size_t)((r - sh.r0) * cols + o) * es,
                           (const char *)full->data + (size_t)(r * K + sh.c[k][0]) * es, (size_t)len * es);
                    o += len;
                }
            }
        }
        fs_tensor_free(full);
        *full = part;
    }
    w->tp = T;
    w->tp_rank = t;
    size_t n = strlen(w->source);
    snprintf(w->source + n, sizeof w->source - n, ", tp shard %d/%d", t, T);
    return FS_OK;
}

int fs_weights_synthetic(fs_weights *w, const fs_config *c, fs_dtype dt, uint64_t seed, fs_err *e)
{
    return fs_weights_synthetic_shard(w, c, dt, seed, NULL, 1, 0, e); /* the shard that is everything */
}

const fs_tensor *fs_weights_get(const fs_weights *w, const char *name)
{
    int i = fs_param_find(w->desc, w->n, name);
    return i < 0 ? NULL : &w->t[i];
}

void fs_weights_free(fs_weights *w)
{
    if (!w) return;
    for (int i = 0; w->t && i < w->n; i++) fs_tensor_free(&w->t[i]);
    for (int i = 0; i < w->nmaps; i++) munmap(w->maps[i].addr, w->maps[i].len);
    free(w->maps);
    free(w->t);
    free(w->desc);
    memset(w, 0, sizeof *w);
}
