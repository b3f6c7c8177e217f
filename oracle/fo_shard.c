/* fo_shard.c — reading `sharding` maps (see fo_shard.h). */
#include "fo_shard.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_EXTENT ((int64_t)1 << 40) /* an interval bound past this is not a tensor axis */

void fo_shard_free(fo_shard *s)
{
    if (!s) return;
    for (int i = 0; i < s->naxes; i++) free(s->mask[i]);
    memset(s, 0, sizeof *s);
}

/* A JSON number that is a whole number in [0, MAX_EXTENT]: *out. Casting an arbitrary double to
 * an integer is undefined behaviour when it is out of range, so the range is checked first. */
static int whole(const cJSON *v, int64_t *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= (double)MAX_EXTENT) || d != floor(d)) return 0;
    *out = (int64_t)d;
    return 1;
}

/* ---- the one reader of a `ranges` list ----
 * `ranges` is [[[a, b], ...] for rank 0, [...] for rank 1, ...]: rank r holds the intervals
 * [a, b) of the axis, in their listed order. ranges_each checks the list as it walks it (each
 * rank's entry a list, each interval two whole numbers from 0 with a <= b) and calls fn for every
 * interval of every rank in order; fn returning non-zero stops the walk with that code. Both the
 * ownership masks (fo_shard) and the pieces (fo_piece) read `ranges` only through it. */
typedef struct ranges_ctx {
    const char *origin, *name;
    fs_err *e;
    int d;            /* the axis, normalised */
    int64_t local;    /* the tensor's extent on it (in a per-rank file: the local piece's) */
    int per_rank;
    int64_t extent;   /* fo_shard: the mask length */
    uint64_t *m;      /* fo_shard: the mask being filled */
    int rank;         /* fo_piece: the rank whose piece is wanted */
    int64_t len, gext; /* fo_piece: its local extent, the largest interval end */
    int64_t *g, o;    /* fo_piece: local -> global, being filled */
} ranges_ctx;

typedef int (*interval_fn)(ranges_ctx *c, int r, int64_t lo, int64_t hi);

static int ranges_each(const cJSON *ranges, interval_fn fn, ranges_ctx *c)
{
    const cJSON *rr, *iv;
    int r = 0;
    cJSON_ArrayForEach(rr, ranges)
    {
        if (!cJSON_IsArray(rr))
            return fs_errf(c->e, FS_E_INPUT, "%s: sharding entry %s: ranges[%d] is not a list of [a, b)", c->origin,
                           c->name, r);
        cJSON_ArrayForEach(iv, rr)
        {
            int64_t lo, hi;
            if (!cJSON_IsArray(iv) || cJSON_GetArraySize(iv) != 2 || !whole(cJSON_GetArrayItem(iv, 0), &lo) ||
                !whole(cJSON_GetArrayItem(iv, 1), &hi) || lo > hi)
                return fs_errf(c->e, FS_E_INPUT,
                               "%s: sharding entry %s: ranges[%d] holds something other than [a, b] (whole numbers "
                               "from 0, a <= b)",
                               c->origin, c->name, r);
            int rc = fn(c, r, lo, hi);
            if (rc) return rc;
        }
        r++;
    }
    return FS_OK;
}

/* The common head of a {"dim", "ranges"} object: the axis, normalised, and the ranges list. */
static int axis_head(const cJSON *obj, int ndim, const cJSON **ranges, int *axis, const char *origin,
                     const char *name, fs_err *e)
{
    const cJSON *dim = cJSON_GetObjectItemCaseSensitive(obj, "dim");
    *ranges = cJSON_GetObjectItemCaseSensitive(obj, "ranges");
    if (!cJSON_IsNumber(dim) || !cJSON_IsArray(*ranges))
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: needs \"dim\" (number) and \"ranges\" (array)", origin,
                       name);
    double dd = dim->valuedouble;
    if (!(dd >= -FO_SHARD_MAX_DIMS && dd < FO_SHARD_MAX_DIMS) || dd != floor(dd))
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: dim %g outside a %d-d tensor", origin, name, dd, ndim);
    int d = (int)dd;
    if (d < 0) d += ndim;
    if (d < 0 || d >= ndim)
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: dim %d outside a %d-d tensor", origin, name, (int)dd,
                       ndim);
    *axis = d;
    return FS_OK;
}

/* fo_shard, first walk: the mask length. The intervals are in GLOBAL coordinates: in a per-rank
 * file (its `parallel` has `rank`) the dataset holds only the rank's piece, so the axis the map
 * describes can be longer than the local one. In a global dump an interval past the axis is an
 * error (second walk). */
static int shard_extent(ranges_ctx *c, int r, int64_t lo, int64_t hi)
{
    (void)lo;
    if (c->per_rank && hi > c->extent) {
        /* A rank holds a piece of the global axis; a global axis thousands of times the local
         * one is not a layout but a damaged map (and would allocate its mask). */
        if ((double)hi > ((double)c->local + 1) * 4096)
            return fs_errf(c->e, FS_E_INPUT,
                           "%s: sharding entry %s: ranges[%d] interval end %lld is implausible for a local axis %d "
                           "of size %lld",
                           c->origin, c->name, r, (long long)hi, c->d, (long long)c->local);
        c->extent = hi;
    }
    return FS_OK;
}

/* fo_shard, second walk: the rank masks. */
static int shard_fill(ranges_ctx *c, int r, int64_t lo, int64_t hi)
{
    if (hi > c->extent)
        return fs_errf(c->e, FS_E_INPUT,
                       "%s: sharding entry %s: ranges[%d] interval [%lld, %lld) outside axis %d of size %lld", c->origin,
                       c->name, r, (long long)lo, (long long)hi, c->d, (long long)c->local);
    if (r < 64)
        for (int64_t x = lo; x < hi; x++) c->m[x] |= (uint64_t)1 << r;
    return FS_OK;
}

static int parse_axis(const cJSON *obj, int ndim, const int64_t *shape, fo_shard *s, const char *origin,
                      const char *name, fs_err *e, int per_rank)
{
    const cJSON *ranges;
    int d, rc;
    if ((rc = axis_head(obj, ndim, &ranges, &d, origin, name, e))) return rc;
    if (s->naxes >= FO_SHARD_MAX_DIMS)
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: too many split axes", origin, name);
    ranges_ctx c = {.origin = origin, .name = name, .e = e, .d = d, .local = shape[d], .per_rank = per_rank,
                    .extent = shape[d]};
    if ((rc = ranges_each(ranges, shard_extent, &c))) return rc;
    c.m = calloc(c.extent ? (size_t)c.extent : 1, sizeof *c.m);
    if (!c.m) return fs_errf(e, FS_E_NOMEM, "%s: sharding entry %s: out of memory", origin, name);
    s->axis[s->naxes] = d;
    s->extent[s->naxes] = c.extent;
    s->mask[s->naxes++] = c.m; /* owned by s from here: freed with it on an error below */
    return ranges_each(ranges, shard_fill, &c);
}

int fo_shard_from_json(const cJSON *root, const char *name, int ndim, const int64_t *shape, fo_shard *s, int *found,
                       const char *origin, fs_err *e)
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
    int rc = fo_shard_from_json(root, name, ndim, shape, s, found, origin, e);
    cJSON_Delete(root);
    return rc;
}

uint64_t fo_shard_owner(const fo_shard *s, int ndim, const int64_t *coords)
{
    if (s->replicated) return ~(uint64_t)0;
    uint64_t m = ~(uint64_t)0;
    for (int i = 0; i < s->naxes; i++)
        if (s->axis[i] < ndim && coords[s->axis[i]] >= 0 && coords[s->axis[i]] < s->extent[i])
            m &= s->mask[i][coords[s->axis[i]]];
    return m;
}

int fo_parallel_rank(const char *parallel)
{
    if (!parallel) return -1;
    cJSON *root = cJSON_Parse(parallel);
    int r = -1;
    const cJSON *it = root ? cJSON_GetObjectItemCaseSensitive(root, "rank") : NULL;
    if (cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble <= INT_MAX && it->valuedouble == floor(it->valuedouble))
        r = (int)it->valuedouble;
    cJSON_Delete(root);
    return r;
}

void fo_piece_free(fo_piece *p)
{
    if (!p) return;
    for (int i = 0; i < p->naxes; i++) free(p->g[i]);
    memset(p, 0, sizeof *p);
}

/* fo_piece, first walk: the rank's local extent and the global one. */
static int piece_extent(ranges_ctx *c, int r, int64_t lo, int64_t hi)
{
    if (hi > c->gext) c->gext = hi;
    if (r == c->rank) c->len += hi - lo;
    return FS_OK;
}

/* fo_piece, second walk: the global index of each of the rank's local indices. */
static int piece_fill(ranges_ctx *c, int r, int64_t lo, int64_t hi)
{
    if (r == c->rank)
        for (int64_t x = lo; x < hi; x++) c->g[c->o++] = x;
    return FS_OK;
}

static int piece_axis(const cJSON *obj, int rank, int ndim, fo_piece *p, const char *origin, const char *name,
                      fs_err *e)
{
    const cJSON *ranges;
    int d, rc;
    if ((rc = axis_head(obj, ndim, &ranges, &d, origin, name, e))) return rc;
    for (int i = 0; i < p->naxes; i++)
        if (p->axis[i] == d) return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: axis %d split twice", origin, name, d);
    if (p->naxes >= FO_SHARD_MAX_DIMS)
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: too many split axes", origin, name);
    if (rank < 0 || rank >= cJSON_GetArraySize(ranges))
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: no ranges for rank %d (%d listed)", origin, name, rank,
                       cJSON_GetArraySize(ranges));
    ranges_ctx c = {.origin = origin, .name = name, .e = e, .d = d, .rank = rank};
    if ((rc = ranges_each(ranges, piece_extent, &c))) return rc;
    c.g = malloc((c.len ? (size_t)c.len : 1) * sizeof *c.g);
    if (!c.g) return fs_errf(e, FS_E_NOMEM, "%s: sharding entry %s: out of memory", origin, name);
    ranges_each(ranges, piece_fill, &c); /* checked by the first walk; fills exactly c.len */
    const int k = p->naxes;
    p->axis[k] = d, p->len[k] = c.len, p->gext[k] = c.gext, p->g[k] = c.g;
    p->naxes++;
    return FS_OK;
}

int fo_piece_from_json(const cJSON *root, const char *name, int rank, int ndim, fo_piece *p, int *found,
                       const char *origin, fs_err *e)
{
    memset(p, 0, sizeof *p);
    *found = 0;
    const cJSON *sh = root ? cJSON_GetObjectItemCaseSensitive(root, "sharding") : NULL;
    const cJSON *ent = cJSON_IsObject(sh) ? cJSON_GetObjectItemCaseSensitive(sh, name) : NULL;
    if (!ent) return FS_OK;
    if (cJSON_IsString(ent) && !strcmp(ent->valuestring, "replicated")) {
        p->replicated = 1;
        *found = 1;
        return FS_OK;
    }
    if (!cJSON_IsObject(ent))
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s is neither \"replicated\" nor an object", origin, name);
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(ent, "dims");
    int rc = FS_OK;
    if (cJSON_IsArray(dims)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, dims)
        {
            if ((rc = piece_axis(it, rank, ndim, p, origin, name, e))) break;
        }
    } else {
        rc = piece_axis(ent, rank, ndim, p, origin, name, e);
    }
    if (rc) fo_piece_free(p);
    else *found = 1;
    return rc;
}

int fo_parallel_partial(const cJSON *root, const char *name)
{
    const cJSON *pm = root ? cJSON_GetObjectItemCaseSensitive(root, "partial") : NULL;
    return cJSON_IsObject(pm) && cJSON_GetObjectItemCaseSensitive(pm, name) != NULL;
}
