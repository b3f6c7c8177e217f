/* fo_diff.c — diff / consistency / stats walks over flux-dumps (see fo_diff.h). */
#include "fo_diff.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_BLOCK (1 << 18) /* 256 Ki values: 2 MB of doubles per file; larger blocks were no faster */

const char *fo_kind_name(fo_kind k)
{
    switch (k) {
    case FO_PASS: return "pass";
    case FO_TOL: return "tolerance";
    case FO_NONFINITE: return "nonfinite";
    case FO_SHAPE: return "shape";
    case FO_UNEQUAL: return "unequal";
    }
    return "?";
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}

static void entry_free(fo_entry *en)
{
    free(en->name);
    free(en->ranks_note);
    free(en->msg);
}

void fo_report_free(fo_report *r)
{
    if (!r) return;
    for (int i = 0; i < r->n; i++) entry_free(&r->v[i]);
    free(r->v);
    fo_names_free(&r->only_a);
    fo_names_free(&r->only_b);
    memset(r, 0, sizeof *r);
    r->first = -1;
}

void fo_stat_report_free(fo_stat_report *r)
{
    if (!r) return;
    for (int i = 0; i < r->n; i++) free(r->v[i].name);
    free(r->v);
    memset(r, 0, sizeof *r);
    r->first_nonfinite = -1;
}

static fo_entry *report_add(fo_report *r, int step, const char *group, const char *name)
{
    if (r->n == r->cap) {
        int nc = r->cap ? 2 * r->cap : 256;
        fo_entry *p = realloc(r->v, (size_t)nc * sizeof *p);
        if (!p) return NULL;
        r->v = p;
        r->cap = nc;
    }
    fo_entry *en = &r->v[r->n];
    memset(en, 0, sizeof *en);
    en->name = strdup(name);
    if (!en->name) return NULL;
    r->n++;
    en->step = step;
    snprintf(en->group, sizeof en->group, "%s", group);
    en->at = -1;
    return en;
}

static int names_push(fo_names *l, const char *group, const char *name)
{
    char **p = realloc(l->v, (size_t)(l->n + 1) * sizeof *p);
    if (!p) return -1;
    l->v = p;
    l->v[l->n] = xasprintf("%s/%s", group, name);
    if (!l->v[l->n]) return -1;
    l->n++;
    return 0;
}

/* ---------- the walk: groups in execution order, names in each ---------- */

typedef struct walk_group {
    int step;
    char group[40];
} walk_group;

/* /inputs, every step number either file has (ascending), /final. */
static int walk_groups(fo_file *a, fo_file *b, walk_group **out, int *n)
{
    int na = fo_file_nsteps(a), nb = b ? fo_file_nsteps(b) : 0;
    walk_group *g = malloc((size_t)(na + nb + 2) * sizeof *g);
    if (!g) return -1;
    int k = 0, i = 0, j = 0;
    g[k].step = FO_STEP_INPUTS;
    snprintf(g[k++].group, sizeof g->group, "/inputs");
    while (i < na || j < nb) {
        int sa = i < na ? fo_file_step_number(a, i) : 0, sb = j < nb ? fo_file_step_number(b, j) : 0;
        if (j >= nb || (i < na && sa <= sb)) {
            g[k].step = sa;
            snprintf(g[k++].group, sizeof g->group, "%s", fo_file_step_group(a, i));
            if (j < nb && sb == sa) j++;
            i++;
        } else {
            g[k].step = sb;
            snprintf(g[k++].group, sizeof g->group, "%s", fo_file_step_group(b, j));
            j++;
        }
    }
    g[k].step = FO_STEP_FINAL;
    snprintf(g[k++].group, sizeof g->group, "/final");
    *out = g;
    *n = k;
    return 0;
}

/* Names of `group` in execution order, or an empty list when the file lacks the group. The
 * step group names of the two files may differ in zero padding (step_0002 vs step_2): both are
 * looked up by number. */
static int group_names(fo_file *f, const walk_group *wg, char *gpath, size_t gn, fo_names *out, fs_err *e)
{
    fo_names_free(out);
    snprintf(gpath, gn, "%s", wg->group);
    if (wg->step >= 0) {
        int found = 0;
        for (int i = 0; i < fo_file_nsteps(f); i++)
            if (fo_file_step_number(f, i) == wg->step) {
                snprintf(gpath, gn, "%s", fo_file_step_group(f, i));
                found = 1;
            }
        if (!found) return FS_OK;
    } else if (!fo_is_group(f, gpath)) {
        return FS_OK;
    }
    int rc = fo_group_order(f, gpath, out, NULL, e);
    if (rc) return rc;
    /* A name the `order` lists but the group does not hold is a dataset this file lacks (it is
     * reported as only on the other side), not a read error. */
    int k = 0;
    for (int i = 0; i < out->n; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", gpath, out->v[i]);
        if (fo_is_dataset(f, p)) out->v[k++] = out->v[i];
        else free(out->v[i]);
    }
    out->n = k;
    return FS_OK;
}

static int cmp_str(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }

/* A sorted copy of the pointers, for membership tests by bsearch. */
static char **sorted_view(const fo_names *l)
{
    char **v = malloc((l->n ? (size_t)l->n : 1) * sizeof *v);
    if (!v) return NULL;
    memcpy(v, l->v, (size_t)l->n * sizeof *v);
    qsort(v, (size_t)l->n, sizeof *v, cmp_str);
    return v;
}

static int has_name(char **sorted, int n, const char *name)
{
    return bsearch(&name, sorted, (size_t)n, sizeof *sorted, cmp_str) != NULL;
}

/* ---------- sharding ---------- */

void fo_shard_free(fo_shard *s)
{
    if (!s) return;
    for (int i = 0; i < s->naxes; i++) free(s->mask[i]);
    memset(s, 0, sizeof *s);
}

static int parse_axis(const cJSON *obj, int ndim, const int64_t *shape, fo_shard *s, const char *origin,
                      const char *name, fs_err *e, int per_rank)
{
    const cJSON *dim = cJSON_GetObjectItemCaseSensitive(obj, "dim");
    const cJSON *ranges = cJSON_GetObjectItemCaseSensitive(obj, "ranges");
    if (!cJSON_IsNumber(dim) || !cJSON_IsArray(ranges))
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: needs \"dim\" (number) and \"ranges\" (array)", origin,
                       name);
    int d = dim->valueint;
    if (d < 0) d += ndim;
    if (d < 0 || d >= ndim)
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: dim %d outside a %d-d tensor", origin, name,
                       dim->valueint, ndim);
    if (s->naxes >= FO_MAX_DIMS)
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: too many split axes", origin, name);
    /* The intervals are in GLOBAL coordinates: in a per-rank file (its `parallel` has `rank`)
     * the dataset holds only the rank's piece, so the axis the map describes can be longer
     * than the local one. In a global dump an interval past the axis is an error. */
    int64_t extent = shape[d];
    if (per_rank) {
        const cJSON *r0, *iv0;
        cJSON_ArrayForEach(r0, ranges) if (cJSON_IsArray(r0)) cJSON_ArrayForEach(iv0, r0)
        {
            if (cJSON_IsArray(iv0) && cJSON_GetArraySize(iv0) == 2 && cJSON_IsNumber(cJSON_GetArrayItem(iv0, 1)) &&
                (int64_t)cJSON_GetArrayItem(iv0, 1)->valuedouble > extent)
                extent = (int64_t)cJSON_GetArrayItem(iv0, 1)->valuedouble;
        }
    }
    uint64_t *m = calloc(extent ? (size_t)extent : 1, sizeof *m);
    if (!m) return fs_errf(e, FS_E_NOMEM, "%s: out of memory", origin);
    s->axis[s->naxes] = d;
    s->mask[s->naxes++] = m;
    int r = 0;
    const cJSON *rr;
    cJSON_ArrayForEach(rr, ranges)
    {
        if (!cJSON_IsArray(rr))
            return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: ranges[%d] is not a list of [a, b)", origin, name, r);
        const cJSON *iv;
        cJSON_ArrayForEach(iv, rr)
        {
            if (!cJSON_IsArray(iv) || cJSON_GetArraySize(iv) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(iv, 0)) ||
                !cJSON_IsNumber(cJSON_GetArrayItem(iv, 1)))
                return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: ranges[%d] holds something other than [a, b]",
                               origin, name, r);
            int64_t lo = (int64_t)cJSON_GetArrayItem(iv, 0)->valuedouble;
            int64_t hi = (int64_t)cJSON_GetArrayItem(iv, 1)->valuedouble;
            if (lo < 0 || hi > extent || lo > hi)
                return fs_errf(e, FS_E_INPUT,
                               "%s: sharding entry %s: ranges[%d] interval [%lld, %lld) outside axis %d of size %lld",
                               origin, name, r, (long long)lo, (long long)hi, d, (long long)shape[d]);
            if (r < FO_MAX_RANKS)
                for (int64_t c = lo; c < hi; c++) m[c] |= (uint64_t)1 << r;
        }
        r++;
    }
    return FS_OK;
}

/* fo_shard_parse on an already parsed `parallel` object (parsed once per run, not per dataset). */
static int shard_from_root(const cJSON *root, const char *name, int ndim, const int64_t *shape, fo_shard *s,
                           int *found, const char *origin, fs_err *e)
{
    memset(s, 0, sizeof *s);
    *found = 0;
    int rc = FS_OK;
    const cJSON *sh = root ? cJSON_GetObjectItemCaseSensitive(root, "sharding") : NULL;
    const int per_rank = root && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(root, "rank"));
    const cJSON *ent = cJSON_IsObject(sh) ? cJSON_GetObjectItemCaseSensitive(sh, name) : NULL;
    if (!ent) return FS_OK;
    if (cJSON_IsString(ent) && !strcmp(ent->valuestring, "replicated")) {
        s->replicated = 1;
        *found = 1;
        return FS_OK;
    }
    if (!cJSON_IsObject(ent))
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s is neither \"replicated\" nor an object", origin, name);
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(ent, "dims");
    if (cJSON_IsArray(dims)) { /* split on several axes: a list of {"dim","ranges"} */
        const cJSON *it;
        cJSON_ArrayForEach(it, dims)
        {
            if ((rc = parse_axis(it, ndim, shape, s, origin, name, e, per_rank))) break;
        }
    } else {
        rc = parse_axis(ent, ndim, shape, s, origin, name, e, per_rank);
    }
    if (rc) fo_shard_free(s);
    else *found = 1;
    return rc;
}

int fo_shard_parse(const char *parallel, const char *name, int ndim, const int64_t *shape, fo_shard *s, int *found,
                   const char *origin, fs_err *e)
{
    memset(s, 0, sizeof *s);
    *found = 0;
    if (!parallel) return FS_OK;
    cJSON *root = cJSON_Parse(parallel);
    if (!root) return fs_errf(e, FS_E_INPUT, "%s: attribute parallel is not valid JSON", origin);
    int rc = shard_from_root(root, name, ndim, shape, s, found, origin, e);
    cJSON_Delete(root);
    return rc;
}

uint64_t fo_shard_owner(const fo_shard *s, int ndim, const int64_t *coords)
{
    if (s->replicated) return ~(uint64_t)0;
    uint64_t m = ~(uint64_t)0;
    for (int i = 0; i < s->naxes; i++)
        if (s->axis[i] < ndim) m &= s->mask[i][coords[s->axis[i]]];
    return m;
}

/* `rank` of a per-rank file, or -1 for a global dump / no parallel attribute. */
static int file_rank(fo_file *f)
{
    const char *p = fo_file_parallel(f);
    if (!p) return -1;
    cJSON *root = cJSON_Parse(p);
    int r = -1;
    const cJSON *it = root ? cJSON_GetObjectItemCaseSensitive(root, "rank") : NULL;
    if (cJSON_IsNumber(it)) r = it->valueint;
    cJSON_Delete(root);
    return r;
}

/* ---------- coordinates in words ---------- */

static size_t token_desc(char *buf, size_t n, int64_t s, int64_t S, int s_txt, int s_img)
{
    if (s_txt > 0 && s_img > 0 && S == s_txt + s_img)
        return s < s_txt ? (size_t)snprintf(buf, n, "text token %lld", (long long)s)
                         : (size_t)snprintf(buf, n, "image token %lld", (long long)(s - s_txt));
    if (s_img > 0 && S == s_img && S != s_txt) return (size_t)snprintf(buf, n, "image token %lld", (long long)s);
    if (s_txt > 0 && S == s_txt && S != s_img) return (size_t)snprintf(buf, n, "text token %lld", (long long)s);
    return (size_t)snprintf(buf, n, "token %lld", (long long)s);
}

void fo_describe_coords(const char *group, const char *name, int ndim, const int64_t *shape, const int64_t *coords,
                        int batch, int s_txt, int s_img, int heads, int head_dim, char *buf, size_t n)
{
    buf[0] = 0;
    if (n == 0 || (group && !strcmp(group, "/inputs"))) return;
    size_t o = 0;
#define ADD(...) (o += o < n ? (size_t)snprintf(buf + o, n - o, __VA_ARGS__) : 0)
    int attn = strstr(name, "attn") != NULL;
    if (ndim == 4) { /* q/k norms: [B, S, H, Dh] */
        ADD("batch %lld, ", (long long)coords[0]);
        if (o < n) o += token_desc(buf + o, n - o, coords[1], shape[1], s_txt, s_img);
        ADD(", head %lld, channel %lld", (long long)coords[2], (long long)coords[3]);
    } else if (ndim == 3) { /* [B, S, C] */
        ADD("batch %lld, ", (long long)coords[0]);
        if (o < n) o += token_desc(buf + o, n - o, coords[1], shape[1], s_txt, s_img);
        ADD(", channel %lld", (long long)coords[2]);
        if (attn && heads > 0 && head_dim > 0 && shape[2] == (int64_t)heads * head_dim)
            ADD(" (head %lld, dim %lld)", (long long)(coords[2] / head_dim), (long long)(coords[2] % head_dim));
    } else if (ndim == 2 && !strncmp(name, "pos_embed", 9)) { /* [S, Dh], no batch */
        if (o < n) o += token_desc(buf + o, n - o, coords[0], shape[0], s_txt, s_img);
        ADD(", channel %lld", (long long)coords[1]);
    } else if (ndim == 2 && (batch <= 0 || shape[0] == batch)) { /* [B, C]: embeddings, modulation */
        ADD("batch %lld, channel %lld", (long long)coords[0], (long long)coords[1]);
    }
#undef ADD
    if (o >= n) buf[n - 1] = 0;
}

/* Model sizes for fo_describe_coords: batch and sequence lengths from /inputs, heads from config. */
typedef struct model_dims {
    int batch, s_txt, s_img, heads, head_dim;
} model_dims;

static model_dims read_model_dims(fo_file *f)
{
    model_dims m = {0};
    fo_dataset ds = {0};
    fs_err e;
    if (fo_is_dataset(f, "/inputs/hidden_states") && !fo_dataset_info(f, "/inputs/hidden_states", &ds, &e) &&
        ds.ndim == 3)
        m.batch = (int)ds.shape[0], m.s_img = (int)ds.shape[1];
    if (fo_is_dataset(f, "/inputs/encoder_hidden_states") &&
        !fo_dataset_info(f, "/inputs/encoder_hidden_states", &ds, &e) && ds.ndim == 3)
        m.s_txt = (int)ds.shape[1];
    cJSON *c = cJSON_Parse(fo_file_config(f));
    if (c) {
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(c, "num_attention_heads");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c, "attention_head_dim");
        if (cJSON_IsNumber(h)) m.heads = h->valueint;
        if (cJSON_IsNumber(d)) m.head_dim = d->valueint;
        cJSON_Delete(c);
    }
    return m;
}

/* ---------- diff ---------- */

typedef struct diff_ctx {
    fo_file *a, *b, *t;
    const fo_diff_opts *o;
    fo_report *r;
    model_dims md;
    int rank_a, rank_b;
    int64_t block;
    cJSON *par_a, *par_b; /* parsed `parallel` attributes, NULL when absent */
} diff_ctx;

static void set_at(fo_entry *en, const model_dims *md, int64_t at)
{
    en->at = at;
    if (at < 0) return;
    fo_unravel(at, en->ndim_a, en->shape_a, en->coords);
    fo_describe_coords(en->group, en->name, en->ndim_a, en->shape_a, en->coords, md->batch, md->s_txt, md->s_img,
                       md->heads, md->head_dim, en->where, sizeof en->where);
}

static const char *nonfinite_word(double v) { return isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"; }

/* One dataset both files hold. diff_open (HDF5, so the thread that walks the files) opens the
 * streams and settles shapes and rank attribution; diff_pass streams A, B (and the truth) in
 * lockstep and judges. A job whose streams all read without HDF5 (fo_stream_direct) may pass on
 * another thread while the next job opens: see fo_diff_run. */
typedef struct diff_job {  /* jobs[k] fills the report's entry k */
    char ga[64], gb[64], gt[64]; /* gt "" when the truth lacks the group */
    fo_stream *sa, *sb, *st; /* st NULL: no truth for this dataset */
    fo_dataset ia;           /* A's shape (B's too, unless the entry is FO_SHAPE) */
    fo_shard shard;
    int use_shard;
    double *rank_max;        /* [FO_MAX_RANKS] when use_shard */
    int rc;                  /* FS_OK, or the error in err */
    fs_err err;
} diff_job;

static void job_release(diff_job *j)
{
    fo_stream_close(j->sa), fo_stream_close(j->sb), fo_stream_close(j->st);
    j->sa = j->sb = j->st = NULL;
    fo_shard_free(&j->shard);
    free(j->rank_max);
    j->rank_max = NULL;
}

static int diff_open(diff_ctx *c, diff_job *j, fo_entry *en, fs_err *e)
{
    char pa[1024], pb[1024], pt[1024], sa_[160], sb_[160];
    const char *ga = j->ga, *gb = j->gb, *gt = j->gt[0] ? j->gt : NULL;
    snprintf(pa, sizeof pa, "%s/%s", ga, en->name);
    snprintf(pb, sizeof pb, "%s/%s", gb, en->name);
    fo_dataset ia = {0}, ib = {0}, it = {0};
    fo_shard shard = {0};
    int rc;
    if ((rc = fo_stream_open(c->a, pa, c->block, &j->sa, &ia, e))) goto out;
    if ((rc = fo_stream_open(c->b, pb, c->block, &j->sb, &ib, e))) goto out;
    en->ndim_a = ia.ndim, en->ndim_b = ib.ndim;
    memcpy(en->shape_a, ia.shape, sizeof ia.shape);
    memcpy(en->shape_b, ib.shape, sizeof ib.shape);
    memcpy(en->dtype_a, ia.dtype, sizeof ia.dtype);
    memcpy(en->dtype_b, ib.dtype, sizeof ib.dtype);
    int same_shape = ia.ndim == ib.ndim && !memcmp(ia.shape, ib.shape, (size_t)ia.ndim * sizeof *ia.shape);
    if (!same_shape) {
        en->kind = FO_SHAPE;
        en->msg = xasprintf("shape mismatch: A %s vs B %s", fo_shape_str(ia.ndim, ia.shape, sa_, sizeof sa_),
                            fo_shape_str(ib.ndim, ib.shape, sb_, sizeof sb_));
        goto out;
    }
    if (c->t && gt) {
        snprintf(pt, sizeof pt, "%s/%s", gt, en->name);
        if (fo_is_dataset(c->t, pt)) {
            if ((rc = fo_stream_open(c->t, pt, c->block, &j->st, &it, e))) goto out;
            if (it.ndim != ia.ndim || memcmp(it.shape, ia.shape, (size_t)ia.ndim * sizeof *ia.shape)) {
                fo_stream_close(j->st); /* the truth has another shape: judge without it */
                j->st = NULL;
            }
        }
    }
    /* Rank attribution: a per-rank file is its rank; a global dump maps elements through its
     * sharding map (B's first: B is the reference, usually the single-device or parallel run
     * whose layout we want to blame). */
    if (c->rank_a >= 0 || c->rank_b >= 0) {
        en->ranks_known = 1;
        if (c->rank_a >= 0) en->ranks |= (uint64_t)1 << (c->rank_a % FO_MAX_RANKS);
        if (c->rank_b >= 0) en->ranks |= (uint64_t)1 << (c->rank_b % FO_MAX_RANKS);
        en->ranks_note = strdup("per-rank file");
    } else {
        int found = 0;
        for (int k = 0; k < 2 && !found; k++) {
            fo_file *f = k == 0 ? c->b : c->a;
            cJSON *root = k == 0 ? c->par_b : c->par_a;
            if (!root) continue;
            if ((rc = shard_from_root(root, en->name, ia.ndim, ia.shape, &shard, &found, fo_file_path(f), e)))
                goto out;
        }
        if (found && shard.replicated) {
            en->ranks_note = strdup("replicated");
        } else if (found) {
            j->use_shard = 1;
            en->ranks_known = 1;
            j->rank_max = calloc(FO_MAX_RANKS, sizeof *j->rank_max);
            if (!j->rank_max) {
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                goto out;
            }
            char note[64];
            size_t o = (size_t)snprintf(note, sizeof note, "sharded on dim");
            for (int i = 0; i < shard.naxes && o < sizeof note; i++)
                o += (size_t)snprintf(note + o, sizeof note - o, "%s %d", i ? "," : "", shard.axis[i]);
            en->ranks_note = strdup(note);
        }
    }
out:
    j->ia = ia;
    j->shard = shard;
    return rc;
}

static int diff_pass(diff_ctx *c, diff_job *j, fo_entry *en, fs_err *e)
{
    fo_stream *sa = j->sa, *sb = j->sb, *st = j->st;
    const fo_dataset ia = j->ia;
    const fo_shard shard = j->shard;
    const int use_shard = j->use_shard;
    double *rank_max = j->rank_max;
    int rc = FS_OK;
    fo_acc ab, at, bt;
    fo_acc_init(&ab), fo_acc_init(&at), fo_acc_init(&bt);
    uint64_t nf_ranks = 0;
    int64_t first_mismatch = -1;
    double fm_a = 0, fm_b = 0;
    for (;;) {
        fo_view xa, xb, xt = {NULL, FO_V_F64};
        int64_t off, na, nb, offt, nt;
        if ((rc = fo_stream_view(sa, &xa, &off, &na, e))) goto out;
        if ((rc = fo_stream_view(sb, &xb, &off, &nb, e))) goto out;
        if (st && (rc = fo_stream_view(st, &xt, &offt, &nt, e))) goto out;
        if (na == 0) break;
        int64_t prev_arg = ab.s.argmax, prev_mm = ab.s.n_nonfinite_mismatch;
        fo_acc_add_view(&ab, xa, xb, na);
        if (ab.s.argmax != prev_arg && ab.s.argmax >= off)
            en->val_a = fo_view_at(xa, ab.s.argmax - off), en->val_b = fo_view_at(xb, ab.s.argmax - off);
        if (ab.s.n_nonfinite_mismatch != prev_mm && first_mismatch < 0) {
            for (int64_t i = 0; i < na; i++) {
                double x = fo_view_at(xa, i), y = fo_view_at(xb, i);
                if (!fo_nonfinite_mismatch(x, y)) continue;
                first_mismatch = off + i, fm_a = x, fm_b = y;
                break;
            }
        }
        if (xt.p) {
            fo_acc_add_view(&at, xa, xt, na);
            fo_acc_add_view(&bt, xb, xt, na);
        }
        if (use_shard) {
            int64_t co[FO_MAX_DIMS];
            for (int64_t i = 0; i < na; i++) {
                double x = fo_view_at(xa, i), y = fo_view_at(xb, i), d = x - y;
                int bad_nf = !isfinite(d) && !(isnan(x) && isnan(y)) && !(x == y);
                if (!bad_nf && !(fabs(d) > 0)) continue;
                fo_unravel(off + i, ia.ndim, ia.shape, co);
                uint64_t m = fo_shard_owner(&shard, ia.ndim, co);
                if (bad_nf) nf_ranks |= m;
                else
                    for (int r = 0; r < FO_MAX_RANKS; r++)
                        if ((m >> r & 1) && fabs(d) > rank_max[r]) rank_max[r] = fabs(d);
            }
        }
    }
    fo_acc_finish(&ab, &en->st);
    const fo_tolerance tol = c->r->tol;
    int pass = fo_tolerance_pass(&en->st, tol);
    if (st) {
        en->has_truth = 1;
        fo_acc_finish(&at, &en->st_a_truth);
        fo_acc_finish(&bt, &en->st_b_truth);
        pass = en->st.n_nonfinite_mismatch == 0 &&
               fo_tolerance_pass_truth(&en->st_a_truth, &en->st_b_truth, c->r->multiplier, tol);
    }
    if (en->st.n_nonfinite_mismatch) {
        en->kind = FO_NONFINITE;
        set_at(en, &c->md, first_mismatch);
        en->val_a = fm_a, en->val_b = fm_b;
        int a_bad = !isfinite(fm_a);
        double bad = a_bad ? fm_a : fm_b, other = a_bad ? fm_b : fm_a;
        char ob[48], co[96];
        if (isfinite(other)) snprintf(ob, sizeof ob, "is finite (%.6g)", other);
        else snprintf(ob, sizeof ob, "holds %s", nonfinite_word(other));
        fo_coords_str(en->ndim_a, en->coords, co, sizeof co);
        en->msg = xasprintf("%s in %s where %s %s at %s%s%s%s: %lld such element%s (NaN A/B %lld/%lld, Inf A/B %lld/%lld)",
                            nonfinite_word(bad), a_bad ? "A" : "B", a_bad ? "B" : "A", ob, co, en->where[0] ? " (" : "",
                            en->where, en->where[0] ? ")" : "", (long long)en->st.n_nonfinite_mismatch,
                            en->st.n_nonfinite_mismatch == 1 ? "" : "s", (long long)en->st.nan_a,
                            (long long)en->st.nan_b, (long long)en->st.inf_a, (long long)en->st.inf_b);
        if (use_shard) en->ranks = nf_ranks;
    } else {
        set_at(en, &c->md, en->st.argmax);
        if (!pass) {
            en->kind = FO_TOL;
            char co[96], why[256];
            fo_coords_str(en->ndim_a, en->coords, co, sizeof co);
            double mr = fo_stats_max_rel(&en->st);
            if (en->has_truth) {
                double ma = fo_stats_max_rel(&en->st_a_truth), mb = fo_stats_max_rel(&en->st_b_truth);
                if (!(en->st_b_truth.rel_l2 <= c->r->multiplier * en->st_a_truth.rel_l2 + tol.rtol / 10))
                    snprintf(why, sizeof why, "rel L2 vs truth: B %.3g > %g x A %.3g + %.3g", en->st_b_truth.rel_l2,
                             c->r->multiplier, en->st_a_truth.rel_l2, tol.rtol / 10);
                else
                    snprintf(why, sizeof why, "max rel vs truth: B %.3g > %g x A %.3g + %.3g", mb, c->r->multiplier, ma,
                             tol.mtol / 10);
            } else if (!(en->st.rel_l2 <= tol.rtol)) {
                snprintf(why, sizeof why, "rel L2 %.3g > rtol %.3g (max rel %.3g)", en->st.rel_l2, tol.rtol, mr);
            } else {
                snprintf(why, sizeof why, "max rel %.3g > mtol %.3g (rel L2 %.3g within rtol %.3g)", mr, tol.mtol,
                         en->st.rel_l2, tol.rtol);
            }
            en->msg = xasprintf("out of tolerance: %s; max|A-B| %.3g at %s%s%s%s, A %.9g vs B %.9g; cosine %.9f", why,
                                en->st.max_abs, co, en->where[0] ? " (" : "", en->where, en->where[0] ? ")" : "",
                                en->val_a, en->val_b, en->st.cosine);
            if (use_shard) {
                /* Ranks whose own elements would fail the max-abs criterion; if none alone
                 * does (a diffuse rel-L2 failure), the owner of the largest difference. */
                double thr = tol.mtol > 0 ? tol.mtol * en->st.max_abs_b : 0.1 * en->st.max_abs;
                if (thr < tol.atol) thr = tol.atol;
                for (int r = 0; r < FO_MAX_RANKS; r++)
                    if (rank_max[r] > thr) en->ranks |= (uint64_t)1 << r;
                if (!en->ranks && en->at >= 0) en->ranks = fo_shard_owner(&shard, ia.ndim, en->coords);
            }
        }
    }
    if (pass && en->kind == FO_PASS && use_shard) en->ranks = 0;
out:
    return rc;
}

static void report_init(fo_report *r, fo_mode mode)
{
    memset(r, 0, sizeof *r);
    r->mode = mode;
    r->first = -1;
}

int fo_diff_run(fo_file *a, fo_file *b, fo_file *truth, const fo_diff_opts *o, fo_report *r, fs_err *e)
{
    report_init(r, FO_MODE_DIFF);
    r->tol = o->tol_given ? o->tol
                          : fo_tolerance_looser(fo_tolerance_default(fo_file_dtype(a)),
                                                fo_tolerance_default(fo_file_dtype(b)));
    r->multiplier = o->multiplier > 0 ? o->multiplier : 2.0;
    r->with_truth = truth != NULL;
    diff_ctx c = {.a = a, .b = b, .t = truth, .o = o, .r = r, .md = read_model_dims(a),
                  .rank_a = file_rank(a), .rank_b = file_rank(b),
                  .block = o->block_elems > 0 ? o->block_elems : DEFAULT_BLOCK};
    for (int k = 0; k < 2; k++) {
        fo_file *f = k ? b : a;
        if (!fo_file_parallel(f)) continue;
        cJSON *root = cJSON_Parse(fo_file_parallel(f));
        if (!root) {
            cJSON_Delete(c.par_a);
            return fs_errf(e, FS_E_INPUT, "%s: attribute parallel is not valid JSON", fo_file_path(f));
        }
        *(k ? &c.par_b : &c.par_a) = root;
    }
    walk_group *groups = NULL;
    int ng = 0, rc = FS_OK;
    if (walk_groups(a, b, &groups, &ng)) {
        cJSON_Delete(c.par_a), cJSON_Delete(c.par_b);
        return fs_errf(e, FS_E_NOMEM, "out of memory");
    }
    fo_names na = {0}, nb = {0}, nt = {0};
    char **sa = NULL, **sb = NULL;
    diff_job *jobs = NULL;
    int nj = 0, jcap = 0;
    /* First the plan: every dataset both files hold, in execution order, as an entry and a job
     * (the report's entries do not move after this, so jobs may fill them in any order). */
    for (int g = 0; g < ng && !rc; g++) {
        char ga[64], gb[64], gt[64];
        if ((rc = group_names(a, &groups[g], ga, sizeof ga, &na, e))) break;
        if ((rc = group_names(b, &groups[g], gb, sizeof gb, &nb, e))) break;
        int have_t = 0;
        if (truth) {
            if ((rc = group_names(truth, &groups[g], gt, sizeof gt, &nt, e))) break;
            have_t = nt.n > 0;
        }
        free(sa), free(sb);
        sa = sorted_view(&na), sb = sorted_view(&nb);
        if (!sa || !sb) {
            rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            break;
        }
        for (int i = 0; i < na.n && !rc; i++) {
            if (!has_name(sb, nb.n, na.v[i])) {
                if (names_push(&r->only_a, groups[g].group, na.v[i])) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                continue;
            }
            if (nj == jcap) {
                int nc = jcap ? 2 * jcap : 256;
                diff_job *p = realloc(jobs, (size_t)nc * sizeof *p);
                if (!p) {
                    rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                    break;
                }
                jobs = p, jcap = nc;
            }
            if (!report_add(r, groups[g].step, groups[g].group, na.v[i])) {
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                break;
            }
            diff_job *j = &jobs[nj++];
            memset(j, 0, sizeof *j);
            snprintf(j->ga, sizeof j->ga, "%s", ga);
            snprintf(j->gb, sizeof j->gb, "%s", gb);
            snprintf(j->gt, sizeof j->gt, "%s", have_t ? gt : "");
        }
        for (int i = 0; i < nb.n && !rc; i++)
            if (!has_name(sa, na.n, nb.v[i]) && names_push(&r->only_b, groups[g].group, nb.v[i]))
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
    }
    free(sa), free(sb);
    fo_names_free(&na), fo_names_free(&nb), fo_names_free(&nt);
    free(groups);
    /* Then the work, pipelined over two threads or more: this thread opens each dataset (HDF5,
     * which must stay on one thread at a time) and hands the data pass of every dataset whose
     * streams read straight from the file (no HDF5) to a task, so the metadata walk of the next
     * datasets overlaps the data passes of the previous ones. Each dataset is still computed
     * whole by one thread, so the results do not depend on the thread count. Datasets HDF5 must
     * read (compressed, big-endian, ...) pass right here. */
    if (!rc) {
#pragma omp parallel if (nj > 1)
#pragma omp single
        for (int k = 0; k < nj; k++) {
            diff_job *j = &jobs[k];
            fo_entry *en = &r->v[k];
            j->rc = diff_open(&c, j, en, &j->err);
            if (j->rc || en->kind == FO_SHAPE) {
                job_release(j);
                continue;
            }
            int direct = fo_stream_direct(j->sa) && fo_stream_direct(j->sb) && (!j->st || fo_stream_direct(j->st));
            if (direct) {
#pragma omp task firstprivate(j, en)
                {
                    j->rc = diff_pass(&c, j, en, &j->err);
                    job_release(j);
                }
            } else {
                j->rc = diff_pass(&c, j, en, &j->err);
                job_release(j);
            }
        }
        /* The first error in execution order is the one reported, as when walking serially. */
        for (int k = 0; k < nj && !rc; k++)
            if (jobs[k].rc) {
                rc = jobs[k].rc;
                if (e) *e = jobs[k].err;
            }
        for (int k = 0; k < r->n && !rc; k++)
            if (r->v[k].kind != FO_PASS) {
                r->nfail++;
                if (r->first < 0) r->first = k;
            }
    }
    for (int k = 0; k < nj; k++) job_release(&jobs[k]);
    free(jobs);
    cJSON_Delete(c.par_a), cJSON_Delete(c.par_b);
    return rc;
}

/* ---------- consistency ---------- */

int fo_consistency_run(fo_file **files, int n, const fo_diff_opts *o, fo_report *r, fs_err *e)
{
    report_init(r, FO_MODE_CONSISTENCY);
    r->tol = (fo_tolerance){0, 0, 0}; /* bitwise */
    r->nfiles = n;
    if (n < 2) return fs_errf(e, FS_E_INPUT, "consistency needs at least two per-rank dumps");
    if (n > FO_MAX_RANKS) return fs_errf(e, FS_E_INPUT, "consistency handles at most %d files", FO_MAX_RANKS);
    for (int i = 0; i < n; i++) {
        if (!fo_file_parallel(files[i]))
            return fs_errf(e, FS_E_INPUT, "%s: no 'parallel' attribute: not a per-rank dump", fo_file_path(files[i]));
        r->rank_of_file[i] = file_rank(files[i]);
        if (r->rank_of_file[i] < 0)
            return fs_errf(e, FS_E_INPUT, "%s: attribute parallel has no \"rank\": not a per-rank dump",
                           fo_file_path(files[i]));
        if (r->rank_of_file[i] >= FO_MAX_RANKS)
            return fs_errf(e, FS_E_INPUT, "%s: rank %d: at most %d ranks are supported", fo_file_path(files[i]),
                           r->rank_of_file[i], FO_MAX_RANKS);
        for (int j = 0; j < i; j++)
            if (r->rank_of_file[j] == r->rank_of_file[i])
                return fs_errf(e, FS_E_INPUT, "%s and %s both hold rank %d", fo_file_path(files[j]),
                               fo_file_path(files[i]), r->rank_of_file[i]);
    }
    cJSON *par = cJSON_Parse(fo_file_parallel(files[0]));
    if (!par || !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(par, "sharding"))) {
        cJSON_Delete(par);
        return fs_errf(e, FS_E_INPUT,
                       "%s: attribute parallel has no \"sharding\" map: which tensors must agree is unknown",
                       fo_file_path(files[0]));
    }
    int64_t block = o->block_elems > 0 ? o->block_elems : DEFAULT_BLOCK;
    model_dims md = read_model_dims(files[0]);
    walk_group *groups = NULL;
    int ng = 0, rc = FS_OK;
    if (walk_groups(files[0], NULL, &groups, &ng)) {
        cJSON_Delete(par);
        return fs_errf(e, FS_E_NOMEM, "out of memory");
    }
    fo_names names = {0};
    fo_stream **st = calloc((size_t)n, sizeof *st);
    fo_acc *acc = calloc((size_t)n, sizeof *acc);
    char (*gp)[64] = calloc((size_t)n, sizeof *gp);
    if (!st || !acc || !gp) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
    for (int g = 0; g < ng && !rc; g++) {
        if ((rc = group_names(files[0], &groups[g], gp[0], sizeof gp[0], &names, e))) break;
        fo_names tmp = {0};
        for (int i = 1; i < n && !rc; i++) rc = group_names(files[i], &groups[g], gp[i], sizeof gp[i], &tmp, e);
        fo_names_free(&tmp);
        for (int k = 0; k < names.n && !rc; k++) {
            const char *name = names.v[k];
            char p[1024];
            fo_dataset info = {0};
            fo_shard sh;
            int found;
            snprintf(p, sizeof p, "%s/%s", gp[0], name);
            if ((rc = fo_dataset_info(files[0], p, &info, e))) break;
            if ((rc = shard_from_root(par, name, info.ndim, info.shape, &sh, &found, fo_file_path(files[0]), e)))
                break;
            int repl = found && sh.replicated;
            fo_shard_free(&sh);
            if (!repl) {
                r->unchecked++;
                continue;
            }
            /* Every rank must hold it. */
            int missing = 0;
            for (int i = 1; i < n; i++) {
                snprintf(p, sizeof p, "%s/%s", gp[i], name);
                if (!fo_is_dataset(files[i], p)) {
                    char q[1100];
                    snprintf(q, sizeof q, "%s (rank %d)", name, r->rank_of_file[i]);
                    if (names_push(&r->only_a, groups[g].group, q)) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                    missing = 1;
                }
            }
            if (missing || rc) continue;
            fo_entry *en = report_add(r, groups[g].step, groups[g].group, name);
            if (!en) {
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                break;
            }
            en->ranks_known = 1;
            en->ranks_note = strdup("replicated");
            fo_dataset di[FO_MAX_RANKS];
            for (int i = 0; i < n && !rc; i++) {
                snprintf(p, sizeof p, "%s/%s", gp[i], name);
                memset(&di[i], 0, sizeof di[i]);
                rc = fo_stream_open(files[i], p, block, &st[i], &di[i], e);
                fo_acc_init(&acc[i]);
            }
            if (rc) goto close;
            en->ndim_a = en->ndim_b = di[0].ndim;
            memcpy(en->shape_a, di[0].shape, sizeof di[0].shape);
            memcpy(en->shape_b, di[0].shape, sizeof di[0].shape);
            memcpy(en->dtype_a, di[0].dtype, sizeof di[0].dtype);
            memcpy(en->dtype_b, di[0].dtype, sizeof di[0].dtype);
            int bad_shape = -1;
            for (int i = 1; i < n; i++)
                if (di[i].ndim != di[0].ndim || memcmp(di[i].shape, di[0].shape, sizeof di[0].shape)) bad_shape = i;
            if (bad_shape >= 0) {
                char s0[160], s1[160];
                en->kind = FO_SHAPE;
                en->ndim_b = di[bad_shape].ndim;
                memcpy(en->shape_b, di[bad_shape].shape, sizeof en->shape_b);
                en->ranks = (uint64_t)1 << r->rank_of_file[bad_shape];
                en->msg = xasprintf("replicated tensor has shape %s on rank %d but %s on rank %d",
                                    fo_shape_str(di[0].ndim, di[0].shape, s0, sizeof s0), r->rank_of_file[0],
                                    fo_shape_str(di[bad_shape].ndim, di[bad_shape].shape, s1, sizeof s1),
                                    r->rank_of_file[bad_shape]);
                goto close;
            }
            {
                /* eq[i*n+j]: files i and j identical so far (bitwise, as doubles: exact for every
                 * stored float type). */
                unsigned char eq[FO_MAX_RANKS * FO_MAX_RANKS];
                memset(eq, 1, (size_t)n * (size_t)n);
                const double *x[FO_MAX_RANKS];
                for (;;) {
                    int64_t off, cnt = 0, c2;
                    for (int i = 0; i < n && !rc; i++) rc = fo_stream_next(st[i], &x[i], &off, i ? &c2 : &cnt, e);
                    if (rc || cnt == 0) break;
                    for (int i = 0; i < n; i++)
                        for (int j = i + 1; j < n; j++)
                            if (eq[i * n + j] && memcmp(x[i], x[j], (size_t)cnt * sizeof(double)))
                                eq[i * n + j] = eq[j * n + i] = 0;
                    for (int i = 1; i < n; i++) fo_acc_add(&acc[i], x[i], x[0], cnt);
                }
                if (rc) goto close;
                /* The largest class of identical files is the consensus (ties: the one holding
                 * the first file); the others disagree. */
                int best = 0, best_sz = 0;
                for (int i = 0; i < n; i++) {
                    int sz = 0;
                    for (int j = 0; j < n; j++) sz += i == j || eq[i * n + j];
                    if (sz > best_sz) best = i, best_sz = sz;
                }
                if (best_sz == n) {
                    fo_acc_finish(&acc[1], &en->st); /* all zero: shows identical in tables */
                    goto close;
                }
                en->kind = FO_UNEQUAL;
                int odd = -1;
                char cl[256];
                size_t co_ = 0;
                cl[0] = 0;
                for (int j = 0; j < n; j++) {
                    if (j != best && !eq[best * n + j]) {
                        en->ranks |= (uint64_t)1 << r->rank_of_file[j];
                        if (odd < 0) odd = j;
                    } else if (co_ < sizeof cl) {
                        co_ += (size_t)snprintf(cl + co_, sizeof cl - co_, "%s%d", co_ ? ", " : "", r->rank_of_file[j]);
                    }
                }
                fo_acc_finish(&acc[odd == 0 ? best : odd], &en->st);
                set_at(en, &md, en->st.n_nonfinite_mismatch ? en->st.first_nonfinite : en->st.argmax);
                char rl[256];
                size_t ro = 0;
                rl[0] = 0;
                for (int j = 0; j < n && ro < sizeof rl; j++)
                    if (en->ranks >> r->rank_of_file[j] & 1)
                        ro += (size_t)snprintf(rl + ro, sizeof rl - ro, "%s%d", ro ? ", " : "", r->rank_of_file[j]);
                char co[96];
                fo_coords_str(en->ndim_a, en->coords, co, sizeof co);
                en->msg = xasprintf("replicated tensor differs across ranks: rank%s %s disagree%s with rank%s %s; "
                                    "max|diff| %.3g at %s%s%s%s, rel L2 %.3g, NaN %lld/%lld",
                                    strchr(rl, ',') ? "s" : "", rl, strchr(rl, ',') ? "" : "s",
                                    strchr(cl, ',') ? "s" : "", cl, en->st.max_abs, co, en->where[0] ? " (" : "",
                                    en->where, en->where[0] ? ")" : "", en->st.rel_l2, (long long)en->st.nan_a,
                                    (long long)en->st.nan_b);
            }
        close:
            for (int i = 0; i < n; i++) {
                fo_stream_close(st[i]);
                st[i] = NULL;
            }
            if (!rc && en->kind != FO_PASS) {
                r->nfail++;
                if (r->first < 0) r->first = r->n - 1;
            }
        }
    }
    fo_names_free(&names);
    free(st);
    free(acc);
    free(gp);
    free(groups);
    cJSON_Delete(par);
    return rc;
}

/* ---------- stats ---------- */

int fo_stats_run(fo_file *a, int64_t block_elems, fo_stat_report *r, fs_err *e)
{
    memset(r, 0, sizeof *r);
    r->first_nonfinite = -1;
    int64_t block = block_elems > 0 ? block_elems : DEFAULT_BLOCK;
    walk_group *groups = NULL;
    int ng = 0, rc = FS_OK;
    if (walk_groups(a, NULL, &groups, &ng)) return fs_errf(e, FS_E_NOMEM, "out of memory");
    fo_names names = {0};
    for (int g = 0; g < ng && !rc; g++) {
        char gp[64];
        if ((rc = group_names(a, &groups[g], gp, sizeof gp, &names, e))) break;
        for (int k = 0; k < names.n && !rc; k++) {
            if (r->n == r->cap) {
                int nc = r->cap ? 2 * r->cap : 256;
                fo_stat_entry *p = realloc(r->v, (size_t)nc * sizeof *p);
                if (!p) {
                    rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                    break;
                }
                r->v = p, r->cap = nc;
            }
            fo_stat_entry *en = &r->v[r->n];
            memset(en, 0, sizeof *en);
            if (!(en->name = strdup(names.v[k]))) {
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                break;
            }
            r->n++;
            en->step = groups[g].step;
            snprintf(en->group, sizeof en->group, "%s", groups[g].group);
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", gp, names.v[k]);
            fo_stream *s = NULL;
            fo_dataset info = {0};
            if ((rc = fo_stream_open(a, p, block, &s, &info, e))) break;
            en->ndim = info.ndim;
            memcpy(en->shape, info.shape, sizeof info.shape);
            memcpy(en->dtype, info.dtype, sizeof info.dtype);
            fo_summary_init(&en->s);
            for (;;) {
                fo_view x;
                int64_t off, cnt;
                if ((rc = fo_stream_view(s, &x, &off, &cnt, e)) || cnt == 0) break;
                int64_t before = en->s.first_nonfinite;
                fo_summary_add_view(&en->s, x, cnt);
                if (before < 0 && en->s.first_nonfinite >= 0) en->first_value = fo_view_at(x, en->s.first_nonfinite - off);
            }
            fo_stream_close(s);
            fo_summary_finish(&en->s);
            if (en->s.first_nonfinite >= 0) {
                fo_unravel(en->s.first_nonfinite, en->ndim, en->shape, en->coords);
                if (r->first_nonfinite < 0) r->first_nonfinite = r->n - 1;
            }
        }
    }
    fo_names_free(&names);
    free(groups);
    return rc;
}
