#include "fs_weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_backend.h"
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

/* "transformer_blocks.0.attn.to_q.weight" -> "transformer_blocks.0.attn.to_q" */
static void module_of(const char *param, char *module, size_t n)
{
    snprintf(module, n, "%s", param);
    char *dot = strrchr(module, '.'); /* strip .weight / .bias */
    if (dot) *dot = 0;
}

int fs_weights_shard_of(const fs_param_desc *d, const fs_plan *plan, const fs_config *c, int T, int t,
                        const fs_inject *inj, fs_tp_split *s, fs_err *e)
{
    const int64_t N = d->shape[0], K = d->ndim == 2 ? d->shape[1] : 0;
    char module[128];
    module_of(d->name, module, sizeof module);
    int rc = fs_tp_split_of(plan, c, module, N, K, d->kind == FS_PARAM_RMS_W ? 1 : T, t, inj, s, e);
    if (rc) return rc;
    if (d->kind == FS_PARAM_RMS_W || (d->kind == FS_PARAM_BIAS && !s->bias_sharded)) {
        s->r0 = 0, s->r1 = N; /* the whole tensor */
        s->nr = 1, s->rr[0][0] = 0, s->rr[0][1] = N;
    }
    if (!K) s->nc = 1, s->c[0][0] = 0, s->c[0][1] = 1; /* a vector: one "column" */
    return FS_OK;
}

/* 1 when the split is the whole [N, K] tensor */
static int whole(const fs_param_desc *d, const fs_tp_split *s)
{
    const int64_t K = d->ndim == 2 ? d->shape[1] : 1;
    return s->nr <= 1 && s->r0 == 0 && s->r1 == d->shape[0] && s->nc == 1 && s->c[0][0] == 0 && s->c[0][1] == K;
}

/* Row interval k of a split as a split of its own (packed_colwise holds several: each is made
 * like a colwise piece, then the pieces are stacked in order). */
static fs_tp_split row_piece(const fs_tp_split *s, int k)
{
    fs_tp_split p = *s;
    p.nr = 1;
    p.r0 = p.rr[0][0] = s->nr <= 1 ? s->r0 : s->rr[k][0];
    p.r1 = p.rr[0][1] = s->nr <= 1 ? s->r1 : s->rr[k][1];
    return p;
}

/* The elements a shard holds, generated run by run: a run is a contiguous range of the full
 * tensor's element indices (a whole-width shard, the full tensor included, is one run; a column
 * slice is one run per row and interval), each filled by fs_weights_synthetic_fill (vectorised,
 * threaded over blocks). Values equal fs_weights_synthetic_value's. */
static void fill_synthetic(fs_tensor *t, const fs_param_desc *d, const fs_tp_split *sh, uint64_t seed)
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

/* ---------------------------------------------------------------- the store */

/* Parameters of the blocks are made on demand when streaming; the rest always. */
static int is_block_param(const char *name)
{
    return !strncmp(name, "transformer_blocks.", 19) || !strncmp(name, "single_transformer_blocks.", 26);
}

/* Makes parameter i: this rank's piece, from the checkpoint or the generator, in make_dtype, then
 * converted to the run dtype if they differ. */
/* Frees a made parameter t (w->t[i], or one being converted). A view into the checkpoint also
 * gives back its file pages (fs_wload_drop): mapped, they count in our resident set until the
 * kernel reclaims them, and the next read of that parameter faults them in again, identical. */
static void free_param(const fs_weights *w, int i, fs_tensor *t)
{
    if (w->load && t->data && !t->owns) fs_wload_drop(w->load, i);
    fs_tensor_free(t);
}

/* One contiguous row range `sh` of parameter i, in make_dtype: from the checkpoint (maybe a view)
 * or the generator. */
static int make_rows(fs_weights *w, int i, const fs_tp_split *sh, fs_tensor *made, fs_err *e)
{
    const fs_param_desc *d = &w->desc[i];
    if (w->load) return fs_wload_make(w->load, i, d, sh, w->make_dtype, made, e);
    int64_t shape[2] = {sh->r1 - sh->r0, fs_tp_split_cols(sh)};
    /* uninitialised: fill_synthetic writes every element, and its threads touch the pages first */
    int rc = fs_tensor_alloc_uninit(made, w->make_dtype, d->ndim, shape, e);
    if (!rc) fill_synthetic(made, d, sh, w->seed);
    else fs_err_prefix(e, "synthetic weight %s: ", d->name);
    return rc;
}

static int make_param(fs_weights *w, int i, fs_err *e)
{
    const fs_param_desc *d = &w->desc[i];
    fs_tp_split sh;
    fs_tensor *t = &w->t[i], made = {0};
    int rc = fs_weights_shard_of(d, w->plan, &w->cfg, w->tp, w->tp_rank, w->inj, &sh, e);
    if (rc) return rc;
    if (sh.nr <= 1) {
        rc = make_rows(w, i, &sh, &made, e);
    } else { /* packed_colwise: the rank's rows of every block, stacked in block order */
        const int64_t cols = fs_tp_split_cols(&sh);
        int64_t shape[2] = {fs_tp_split_rows(&sh), cols}, at = 0;
        rc = fs_tensor_alloc_uninit(&made, w->make_dtype, d->ndim, shape, e);
        for (int k = 0; !rc && k < sh.nr; k++) {
            fs_tp_split p = row_piece(&sh, k);
            fs_tensor piece = {0};
            if ((rc = make_rows(w, i, &p, &piece, e))) break;
            const size_t bytes = (size_t)((p.r1 - p.r0) * (d->ndim == 2 ? cols : 1)) * fs_dtype_size(w->make_dtype);
            memcpy((char *)made.data + (size_t)at * fs_dtype_size(w->make_dtype), piece.data, bytes);
            at += (p.r1 - p.r0) * (d->ndim == 2 ? cols : 1);
            free_param(w, i, &piece);
        }
        if (rc) fs_tensor_free(&made);
    }
    if (rc) return rc;
    if (made.dtype != w->dtype) { /* --match bf16: bf16 values, exactly, in the run dtype */
        rc = fs_tensor_alloc(t, w->dtype, made.ndim, made.shape, e);
        if (!rc) rc = fs_tensor_copy(t, &made, e);
        /* made can be a view into a BF16 checkpoint, not needed once copied (without the drop, a
         * bf16 --check of FLUX.1-dev grew by every block's 0.63 GiB during its float64 truth) */
        free_param(w, i, &made);
        if (rc) fs_tensor_free(t);
        return rc;
    }
    *t = made;
    return FS_OK;
}

/* Makes every parameter that should be resident now (all of them, or the non-block ones when
 * streaming) and is not yet. */
static void note_peak(fs_weights *w);
static int make_resident(fs_weights *w, fs_err *e)
{
    for (int i = 0; i < w->n; i++) {
        if (w->t[i].ndim || (w->streaming && is_block_param(w->desc[i].name))) continue;
        int rc = make_param(w, i, e);
        if (rc) return rc;
    }
    note_peak(w);
    return FS_OK;
}

static void describe(fs_weights *w)
{
    size_t o = w->load ? (size_t)snprintf(w->source, sizeof w->source, "%s", fs_wload_path(w->load))
                       : (size_t)snprintf(w->source, sizeof w->source, "synthetic seed %llu", (unsigned long long)w->seed);
    if (w->tp > 1 && o < sizeof w->source)
        o += (size_t)snprintf(w->source + o, sizeof w->source - o, ", tp shard %d/%d", w->tp_rank, w->tp);
    if (w->streaming && o < sizeof w->source) snprintf(w->source + o, sizeof w->source - o, ", streamed by block");
}

int fs_weights_open(fs_weights *w, const fs_config *c, const fs_weights_opts *o, fs_err *e)
{
    int rc = fs_weights_init_empty(w, c, o->dtype, e);
    if (rc) return rc;
    w->seed = o->seed;
    w->plan = o->plan;
    w->inj = o->inj;
    w->tp = o->tp > 1 ? o->tp : 1;
    w->tp_rank = o->tp > 1 ? o->tp_rank : 0;
    w->make_dtype = o->make_dtype ? o->make_dtype : o->dtype;
    w->streaming = o->stream;
    if (o->path && (rc = fs_wload_open(&w->load, c, w->desc, w->n, o->path, e))) {
        fs_weights_free(w);
        return rc;
    }
    describe(w);
    if ((rc = make_resident(w, e))) fs_weights_free(w);
    return rc;
}

static void note_peak(fs_weights *w)
{
    int64_t held = fs_weights_resident_bytes(w);
    if (held > w->peak_bytes) w->peak_bytes = held;
}

int fs_weights_acquire(fs_weights *w, const char *prefix, fs_err *e)
{
    const size_t n = strlen(prefix);
    for (int i = 0; i < w->n; i++) {
        if (w->t[i].ndim || strncmp(w->desc[i].name, prefix, n)) continue;
        int rc = make_param(w, i, e);
        if (rc) return rc;
    }
    note_peak(w);
    return FS_OK;
}

void fs_weights_release(fs_weights *w, const char *prefix)
{
    if (!w->streaming) return;
    const size_t n = strlen(prefix);
    for (int i = 0; i < w->n; i++)
        if (!strncmp(w->desc[i].name, prefix, n)) {
            free_param(w, i, &w->t[i]);
        }
}

static void drop_all(fs_weights *w)
{
    for (int i = 0; i < w->n; i++) free_param(w, i, &w->t[i]);
}

int fs_weights_resplit(fs_weights *w, const fs_plan *plan, int T, int t, const fs_inject *inj, fs_err *e)
{
    drop_all(w);
    w->plan = plan;
    w->inj = inj;
    w->tp = T > 1 ? T : 1;
    w->tp_rank = T > 1 ? t : 0;
    describe(w);
    return make_resident(w, e);
}

int fs_weights_set_dtype(fs_weights *w, fs_dtype dt, fs_err *e)
{
    drop_all(w);
    w->dtype = dt;
    return make_resident(w, e);
}

int fs_weights_set_streaming(fs_weights *w, int on, fs_err *e)
{
    w->streaming = on;
    describe(w);
    if (!on) return make_resident(w, e);
    for (int i = 0; i < w->n; i++)
        if (is_block_param(w->desc[i].name)) free_param(w, i, &w->t[i]);
    return FS_OK;
}

int64_t fs_weights_block_bytes(const fs_weights *w, int T, int t, fs_err *e)
{
    int64_t n = 0;
    for (int i = 0; i < w->n; i++) {
        const fs_param_desc *d = &w->desc[i];
        fs_tp_split sh;
        if (!is_block_param(d->name)) continue;
        if (fs_weights_shard_of(d, w->plan, &w->cfg, T, t, w->inj, &sh, e)) return -1;
        n += fs_tp_split_rows(&sh) * fs_tp_split_cols(&sh) * (int64_t)fs_dtype_size(w->dtype);
    }
    return n;
}

int64_t fs_weights_resident_bytes(const fs_weights *w)
{
    int64_t n = 0;
    for (int i = 0; i < w->n; i++)
        if (w->t[i].owns) n += (int64_t)fs_tensor_nbytes(&w->t[i]);
    return n;
}

int fs_weights_synthetic_shard(fs_weights *w, const fs_config *c, fs_dtype dt, uint64_t seed, const fs_plan *plan, int T,
                               int t, const fs_inject *inj, fs_err *e)
{
    fs_weights_opts o = {.seed = seed, .dtype = dt, .plan = plan, .tp = T, .tp_rank = t, .inj = inj};
    return fs_weights_open(w, c, &o, e);
}

int fs_weights_load(fs_weights *w, const fs_config *c, fs_dtype dt, const char *path, fs_err *e)
{
    fs_weights_opts o = {.path = path, .dtype = dt};
    return fs_weights_open(w, c, &o, e);
}

/* --inject fused-qkv-contiguous (NeMo Automodel#1324): q, k, v seen as one fused [3N, K] weight
 * (BFL's qkv / linear1) cut into T contiguous row blocks; rank t then takes the thirds of ITS
 * block as q, k, v — which straddle the q|k|v boundaries instead of being rows t of each. `full`
 * holds every rank's full q, k, v; out[role] receives the wrong [N/T, K] shards. */
static int fused_qkv_contiguous(const fs_weights *w, const char *module, int T, int t, fs_tensor *out, fs_err *e)
{
    static const char *const roles[3][2] = {{"attn.to_q", "attn.add_q_proj"}, {"attn.to_k", "attn.add_k_proj"},
                                            {"attn.to_v", "attn.add_v_proj"}};
    size_t ml = strlen(module);
    for (int pair = 0; pair < 2; pair++) {
        int role = -1;
        for (int r = 0; r < 3; r++) {
            size_t rl = strlen(roles[r][pair]);
            if (ml >= rl && !strcmp(module + ml - rl, roles[r][pair])) role = r;
        }
        if (role < 0) continue;
        char base[160], sib[200];
        snprintf(base, sizeof base, "%.*s", (int)(ml - strlen(roles[role][pair])), module);
        const fs_tensor *q = NULL;
        snprintf(sib, sizeof sib, "%s%s.weight", base, roles[0][pair]);
        if (!(q = fs_weights_get(w, sib))) return 0;
        const int64_t N = q->shape[0], K = q->shape[1], Ny = N / T;
        const size_t es = fs_dtype_size(w->dtype);
        int rc;
        if ((rc = fs_tensor_alloc2(&out[0], w->dtype, Ny, K, e)) || (rc = fs_tensor_alloc(&out[1], w->dtype, 1, &Ny, e)))
            return -rc;
        for (int64_t i = 0; i < Ny; i++) {
            const int64_t f = 3 * t * Ny + role * Ny + i; /* row of the fused [q; k; v] */
            const int which = (int)(f / N);
            const int64_t row = f % N;
            snprintf(sib, sizeof sib, "%s%s.weight", base, roles[which][pair]);
            const fs_tensor *Ws = fs_weights_get(w, sib);
            snprintf(sib, sizeof sib, "%s%s.bias", base, roles[which][pair]);
            const fs_tensor *bs = fs_weights_get(w, sib);
            if (!Ws || !bs || Ws->shape[0] != N || bs->shape[0] != N)
                return -fs_errf(e, FS_E_INTERNAL, "%s: fused q|k|v sibling %s missing or not full", module, sib);
            memcpy((char *)out[0].data + (size_t)(i * K) * es, (const char *)Ws->data + (size_t)(row * K) * es, (size_t)K * es);
            memcpy((char *)out[1].data + (size_t)i * es, (const char *)bs->data + (size_t)row * es, es);
        }
        return 1;
    }
    return 0;
}

int fs_weights_shard(fs_weights *w, const fs_plan *plan, int T, int t, const fs_inject *inj, fs_err *e)
{
    if (T <= 1) return FS_OK;
    if (w->tp != 1) return fs_errf(e, FS_E_INTERNAL, "weights already sharded");
    const size_t es = fs_dtype_size(w->dtype);
    fs_tensor *cut = calloc((size_t)w->n, sizeof *cut); /* the new shards, swapped in at the end */
    int rc = cut ? FS_OK : fs_errf(e, FS_E_NOMEM, "out of memory");
    for (int i = 0; !rc && i < w->n; i++) {
        const fs_param_desc *d = &w->desc[i];
        fs_tp_split sh;
        if ((rc = fs_weights_shard_of(d, plan, &w->cfg, T, t, inj, &sh, e))) break;
        if (whole(d, &sh)) continue;
        if (fs_injected(inj, FS_INJ_FUSED_QKV_CONTIGUOUS) && d->kind == FS_PARAM_LINEAR_W) {
            char module[128];
            fs_tensor pair[2] = {{0}};
            module_of(d->name, module, sizeof module);
            int hit = fused_qkv_contiguous(w, module, T, t, pair, e); /* the hook */
            if (hit < 0) {
                rc = -hit;
                break;
            }
            if (hit) {
                if (i + 1 >= w->n || w->desc[i + 1].kind != FS_PARAM_BIAS) { /* the bias follows its weight */
                    fs_tensor_free(&pair[0]);
                    fs_tensor_free(&pair[1]);
                    rc = fs_errf(e, FS_E_INTERNAL, "%s: bias does not follow its weight", d->name);
                    break;
                }
                cut[i] = pair[0];
                cut[i + 1] = pair[1];
                i++;
                continue;
            }
        }
        const fs_tensor *full = &w->t[i];
        const int64_t K = d->ndim == 2 ? d->shape[1] : 1, cols = fs_tp_split_cols(&sh);
        if (cols == K && !full->owns && sh.nr <= 1) { /* a row range of a view: still a view */
            cut[i] = fs_tensor_rows(full, sh.r0, sh.r1 - sh.r0);
            continue;
        }
        int64_t shape[2] = {fs_tp_split_rows(&sh), cols}, out_row = 0;
        if ((rc = fs_tensor_alloc(&cut[i], w->dtype, d->ndim, shape, e))) break;
        for (int p = 0; p < (sh.nr > 1 ? sh.nr : 1); p++) { /* packed_colwise: each block's rows in turn */
            const fs_tp_split rp = row_piece(&sh, p);
            for (int64_t r = rp.r0; r < rp.r1; r++, out_row++) {
                int64_t o = 0;
                for (int k = 0; k < sh.nc; k++) {
                    int64_t len = sh.c[k][1] - sh.c[k][0];
                    memcpy((char *)cut[i].data + (size_t)(out_row * cols + o) * es,
                           (const char *)full->data + (size_t)(r * K + sh.c[k][0]) * es, (size_t)len * es);
                    o += len;
                }
            }
        }
    }
    if (rc) {
        for (int i = 0; cut && i < w->n; i++) fs_tensor_free(&cut[i]);
        free(cut);
        return rc;
    }
    for (int i = 0; i < w->n; i++)
        if (cut[i].ndim) {
            fs_tensor_free(&w->t[i]); /* not free_param: cut[i] may be a row range of this view */
            w->t[i] = cut[i];
        }
    free(cut);
    w->plan = plan;
    w->inj = inj;
    w->tp = T;
    w->tp_rank = t;
    size_t n = strlen(w->source);
    snprintf(w->source + n, sizeof w->source - n, ", tp shard %d/%d", t, T);
    return FS_OK;
}

int fs_weights_on(const fs_weights *w, fs_backend *be, fs_weights *on, fs_err *e)
{
    return fs_weights_on_prefix(w, be, "", on, e);
}

int fs_weights_on_prefix(const fs_weights *w, fs_backend *be, const char *prefix, fs_weights *on, fs_err *e)
{
    const size_t np = strlen(prefix);
    memset(on, 0, sizeof *on);
    on->cfg = w->cfg;
    on->dtype = w->dtype;
    on->n = w->n;
    on->tp = w->tp;
    on->tp_rank = w->tp_rank;
    snprintf(on->source, sizeof on->source, "%s", w->source);
    on->desc = malloc(sizeof *on->desc * (size_t)(w->n ? w->n : 1));
    on->t = calloc((size_t)(w->n ? w->n : 1), sizeof *on->t);
    if (!on->desc || !on->t) {
        fs_weights_free(on);
        return fs_errf(e, FS_E_NOMEM, "out of memory");
    }
    memcpy(on->desc, w->desc, sizeof *on->desc * (size_t)w->n);
    for (int i = 0; i < w->n; i++) {
        const fs_tensor *src = &w->t[i];
        if (!src->ndim || strncmp(w->desc[i].name, prefix, np)) continue; /* not made, or not asked for */
        if (!be || be->host_addressable) { /* zero copy: the backend computes on these bytes */
            on->t[i] = *src;
            on->t[i].owns = 0;
            continue;
        }
        int rc = fs_tensor_alloc_on(&on->t[i], be, src->dtype, src->ndim, src->shape, e);
        if (!rc) rc = fs_tensor_upload(&on->t[i], src, e);
        if (rc) {
            fs_err_prefix(e, "uploading weight %s to %s: ", w->desc[i].name, be->name);
            fs_weights_free(on);
            return rc;
        }
    }
    return FS_OK;
}

int fs_weights_synthetic(fs_weights *w, const fs_config *c, fs_dtype dt, uint64_t seed, fs_err *e)
{
    return fs_weights_synthetic_shard(w, c, dt, seed, NULL, 1, 0, NULL, e); /* the shard that is everything */
}

const fs_tensor *fs_weights_get(const fs_weights *w, const char *name)
{
    int i = fs_param_find(w->desc, w->n, name);
    return i < 0 ? NULL : &w->t[i];
}

void fs_weights_free(fs_weights *w)
{
    if (!w) return;
    for (int i = 0; w->t && i < w->n; i++) fs_tensor_free(&w->t[i]); /* views first, then their mapping */
    fs_wload_free(w->load);
    free(w->t);
    free(w->desc);
    memset(w, 0, sizeof *w);
}
