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

static int parse_axis(const cJSON *obj, int ndim, const int64_t *shape, fo_shard *s, const char *origin,
                      const char *name, fs_err *e, int per_rank)
{
    const cJSON *dim = cJSON_GetObjectItemCaseSensitive(obj, "dim");
    const cJSON *ranges = cJSON_GetObjectItemCaseSensitive(obj, "ranges");
    if (!cJSON_IsNumber(dim) || !cJSON_IsArray(ranges))
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
    if (s->naxes >= FO_SHARD_MAX_DIMS)
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: too many split axes", origin, name);
    /* The intervals are in GLOBAL coordinates: in a per-rank file (its `parallel` has `rank`)
     * the dataset holds only the rank's piece, so the axis the map describes can be longer
     * than the local one. In a global dump an interval past the axis is an error. */
    int64_t extent = shape[d];
    const cJSON *rr, *iv;
    int r = 0;
    cJSON_ArrayForEach(rr, ranges)
    {
        if (!cJSON_IsArray(rr))
            return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: ranges[%d] is not a list of [a, b)", origin, name, r);
        cJSON_ArrayForEach(iv, rr)
        {
            int64_t lo, hi;
            if (!cJSON_IsArray(iv) || cJSON_GetArraySize(iv) != 2 || !whole(cJSON_GetArrayItem(iv, 0), &lo) ||
                !whole(cJSON_GetArrayItem(iv, 1), &hi))
                return fs_errf(e, FS_E_INPUT,
                               "%s: sharding entry %s: ranges[%d] holds something other than [a, b] (whole numbers "
                               "from 0)",
                               origin, name, r);
            if (per_rank && hi > extent) {
                /* A rank holds a piece of the global axis; a global axis thousands of times the
                 * local one is not a layout but a damaged map (and would allocate its mask). */
                if ((double)hi > ((double)shape[d] + 1) * 4096)
                    return fs_errf(e, FS_E_INPUT,
                                   "%s: sharding entry %s: ranges[%d] interval end %lld is implausible for a local "
                                   "axis %d of size %lld",
                                   origin, name, r, (long long)hi, d, (long long)shape[d]);
                extent = hi;
            }
        }
        r++;
    }
    uint64_t *m = calloc(extent ? (size_t)extent : 1, sizeof *m);
    if (!m) return fs_errf(e, FS_E_NOMEM, "%s: sharding entry %s: out of memory", origin, name);
    s->axis[s->naxes] = d;
    s->extent[s->naxes] = extent;
    s->mask[s->naxes++] = m;
    r = 0;
    cJSON_ArrayForEach(rr, ranges)
    {
        cJSON_ArrayForEach(iv, rr)
        {
            int64_t lo = 0, hi = 0;
            whole(cJSON_GetArrayItem(iv, 0), &lo);
            whole(cJSON_GetArrayItem(iv, 1), &hi);
            if (hi > extent || lo > hi)
                return fs_errf(e, FS_E_INPUT,
                               "%s: sharding entry %s: ranges[%d] interval [%lld, %lld) outside axis %d of size %lld",
                               origin, name, r, (long long)lo, (long long)hi, d, (long long)shape[d]);
            if (r < 64)
                for (int64_t c = lo; c < hi; c++) m[c] |= (uint64_t)1 << r;
        }
        r++;
    }
    return FS_OK;
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

static int piece_axis(const cJSON *obj, int rank, int ndim, fo_piece *p, const char *origin, const char *name,
                      fs_err *e)
{
    const cJSON *dim = cJSON_GetObjectItemCaseSensitive(obj, "dim");
    const cJSON *ranges = cJSON_GetObjectItemCaseSensitive(obj, "ranges");
    if (!cJSON_IsNumber(dim) || !cJSON_IsArray(ranges))
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: needs \"dim\" (number) and \"ranges\" (array)", origin,
                       name);
    double dd = dim->valuedouble;
    int d = dd == floor(dd) && dd >= -FO_SHARD_MAX_DIMS && dd < FO_SHARD_MAX_DIMS ? (int)dd : FO_SHARD_MAX_DIMS;
    if (d < 0) d += ndim;
    if (d < 0 || d >= ndim)
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: dim %g outside a %d-d tensor", origin, name, dd, ndim);
    for (int i = 0; i < p->naxes; i++)
        if (p->axis[i] == d) return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: axis %d split twice", origin, name, d);
    if (p->naxes >= FO_SHARD_MAX_DIMS)
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: too many split axes", origin, name);
    if (rank < 0 || rank >= cJSON_GetArraySize(ranges))
        return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: no ranges for rank %d (%d listed)", origin, name, rank,
                       cJSON_GetArraySize(ranges));
    int64_t len = 0, gext = 0;
    const cJSON *rr, *iv;
    int r = 0;
    cJSON_ArrayForEach(rr, ranges)
    {
        if (!cJSON_IsArray(rr))
            return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: ranges[%d] is not a list of [a, b)", origin, name, r);
        cJSON_ArrayForEach(iv, rr)
        {
            int64_t lo, hi;
            if (!cJSON_IsArray(iv) || cJSON_GetArraySize(iv) != 2 || !whole(cJSON_GetArrayItem(iv, 0), &lo) ||
                !whole(cJSON_GetArrayItem(iv, 1), &hi) || lo > hi)
                return fs_errf(e, FS_E_INPUT, "%s: sharding entry %s: ranges[%d] holds something other than [a, b] "
                               "(whole numbers from 0, a <= b)", origin, name, r);
            if (hi > gext) gext = hi;
            if (r == rank) len += hi - lo;
        }
        r++;
    }
    const int k = p->naxes;
    int64_t *g = malloc((len ? (size_t)len : 1) * sizeof *g);
    if (!g) return fs_errf(e, FS_E_NOMEM, "%s: sharding entry %s: out of memory", origin, name);
    int64_t o = 0;
    cJSON_ArrayForEach(iv, cJSON_GetArrayItem(ranges, rank))
    {
        int64_t lo = 0, hi = 0;
        whole(cJSON_GetArrayItem(iv, 0), &lo);
        whole(cJSON_GetArrayItem(iv, 1), &hi);
        for (int64_t c = lo; c < hi; c++) g[o++] = c;
    }
    p->axis[k] = d, p->len[k] = len, p->gext[k] = gext, p->g[k] = g;
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
