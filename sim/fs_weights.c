#include "fs_weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fs_rng.h"

int fs_weights_init_empty(fs_weights *w, const fs_config *c, fs_dtype dt, fs_err *e)
{
    memset(w, 0, sizeof *w);
    w->cfg = *c;
    w->dtype = dt;
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

double fs_weights_synthetic_value(const fs_param_desc *d, uint64_t seed, int64_t index)
{
    /* The key depends on the name only, never on the shape: a shard of rows [a, b) is the
     * same numbers whatever the world size. */
    uint64_t key = fs_rng_key(seed, d->name);
    double z = fs_rng_normal(key, (uint64_t)index);
    switch (d->kind) {
    case FS_PARAM_LINEAR_W: return z / sqrt((double)d->shape[1]);
    case FS_PARAM_BIAS: return 0.05 * z;
    case FS_PARAM_RMS_W: return 1.0 + 0.1 * z;
    }
    return 0;
}

/* Generates in blocks through fs_rng_normal_fill (two normals per Box-Muller pair); the values
 * are exactly fs_weights_synthetic_value's. */
static int fill_synthetic(fs_tensor *t, const fs_param_desc *d, uint64_t seed, fs_err *e)
{
    enum { BLK = 4096 };
    double buf[BLK];
    const uint64_t key = fs_rng_key(seed, d->name);
    const double in = d->kind == FS_PARAM_LINEAR_W ? (double)d->shape[1] : 1.0;
    const int64_t n = fs_tensor_numel(t);
    for (int64_t k0 = 0; k0 < n; k0 += BLK) {
        int64_t m = n - k0 < BLK ? n - k0 : BLK;
        fs_rng_normal_fill(key, (uint64_t)k0, m, buf);
        for (int64_t k = 0; k < m; k++) {
            double z = buf[k], v = d->kind == FS_PARAM_LINEAR_W ? z / sqrt(in) : d->kind == FS_PARAM_BIAS ? 0.05 * z : 1.0 + 0.1 * z;
            if (t->dtype == FS_F64) ((double *)t->data)[k0 + k] = v;
            else ((float *)t->data)[k0 + k] = (float)v;
        }
    }
    (void)e;
    return FS_OK;
}

int fs_weights_synthetic(fs_weights *w, const fs_config *c, fs_dtype dt, uint64_t seed, fs_err *e)
{
    int rc = fs_weights_init_empty(w, c, dt, e);
    if (rc) return rc;
    snprintf(w->source, sizeof w->source, "synthetic seed %llu", (unsigned long long)seed);
    for (int i = 0; i < w->n; i++) {
        const fs_param_desc *d = &w->desc[i];
        if ((rc = fs_tensor_alloc(&w->t[i], dt, d->ndim, d->shape, e))) {
            fs_err_prefix(e, "synthetic weight %s: ", d->name);
            fs_weights_free(w);
            return rc;
        }
        if ((rc = fill_synthetic(&w->t[i], d, seed, e))) {
            fs_weights_free(w);
            return rc;
        }
    }
    return FS_OK;
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
