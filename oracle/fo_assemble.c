/* fo_assemble.c — rank folders, rank sets, and `flux-oracle assemble` (see fo_assemble.h).
 * Pieces are placed by fo_piece (fo_shard.c), the one reader of the sharding map. */
#include "fo_assemble.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fo_diff.h"
#include "fo_shard.h"

static int by_num(const void *x, const void *y)
{
    const long a = *(const long *)x, b = *(const long *)y;
    return (a > b) - (a < b);
}

int fo_rank_dir(const char *dir, fo_names *out, fs_err *e)
{
    memset(out, 0, sizeof *out);
    DIR *d = opendir(dir);
    if (!d) return fs_errf(e, FS_E_INPUT, "%s: cannot read the folder: %s", FO_SHOW(dir), strerror(errno));
    long *num = NULL;
    int n = 0, cap = 0, rc = FS_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *s = de->d_name;
        if (strncmp(s, "rank_", 5)) continue;
        char *end;
        long r = strtol(s + 5, &end, 10);
        if (end == s + 5 || strcmp(end, ".h5") || r < 0 || r >= 1 << 20 || (s[5] == '0' && end != s + 6)) continue;
        if (n == cap) {
            long *p = realloc(num, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *p);
            if (!p) {
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                break;
            }
            num = p;
        }
        num[n++] = r;
    }
    closedir(d);
    if (!rc && n == 0) rc = fs_errf(e, FS_E_INPUT, "%s: no rank_<r>.h5 in this folder (flux-sim --dump-per-rank DIR writes them)", FO_SHOW(dir));
    if (!rc) qsort(num, (size_t)n, sizeof *num, by_num);
    for (int i = 0; i < n && !rc; i++)
        if (num[i] != i)
            rc = fs_errf(e, FS_E_INPUT, "%s: rank_%d.h5 is missing (rank files up to rank_%ld.h5 are there)", FO_SHOW(dir),
                         i, num[n - 1]);
    if (!rc && !(out->v = calloc((size_t)n, sizeof *out->v))) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        char *p = fo_strdupf("%s/rank_%d.h5", dir, i);
        if (!p) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        else out->v[out->n++] = p;
    }
    free(num);
    if (rc) fo_names_free(out);
    return rc;
}

static int world_of(fo_file *f, int *world)
{
    cJSON *p = cJSON_Parse(fo_file_parallel(f) ? fo_file_parallel(f) : "");
    const cJSON *w = p ? cJSON_GetObjectItemCaseSensitive(p, "world") : NULL;
    *world = cJSON_IsNumber(w) && w->valuedouble >= 1 && w->valuedouble <= 1 << 20 ? (int)w->valuedouble : -1;
    cJSON_Delete(p);
    return *world;
}

int fo_ranks_complete(fo_file **f, int n, fs_err *e)
{
    int world = -1;
    uint64_t seen = 0;
    for (int i = 0; i < n; i++) {
        int r = fo_parallel_rank(fo_file_parallel(f[i])), w;
        if (r < 0)
            return fs_errf(e, FS_E_INPUT, "%s: attribute parallel has no \"rank\": not a per-rank dump", fo_file_path(f[i]));
        if (world_of(f[i], &w) < 0)
            return fs_errf(e, FS_E_INPUT, "%s: attribute parallel has no \"world\"", fo_file_path(f[i]));
        if (i && w != world)
            return fs_errf(e, FS_E_INPUT, "%s (world %d) and %s (world %d) are not ranks of one run", fo_file_path(f[0]),
                           world, fo_file_path(f[i]), w);
        world = w;
        if (r >= w) return fs_errf(e, FS_E_INPUT, "%s: rank %d of a world of %d", fo_file_path(f[i]), r, w);
        if (r >= 64) return fs_errf(e, FS_E_INPUT, "%s: rank %d: at most 64 ranks are supported", fo_file_path(f[i]), r);
        if (seen >> r & 1) return fs_errf(e, FS_E_INPUT, "two files hold rank %d (%s)", r, fo_file_path(f[i]));
        seen |= (uint64_t)1 << r;
    }
    for (int r = 0; r < world; r++)
        if (!(seen >> r & 1)) return fs_errf(e, FS_E_INPUT, "rank %d of world %d is missing: every rank's dump is needed", r, world);
    return FS_OK;
}

/* ---------- writing ---------- */

typedef struct asm_ctx {
    int n;
    hid_t src[64];  /* rank r's file, by rank */
    cJSON *par[64]; /* rank r's parsed `parallel` */
    const char *path[64];
    hid_t dst, gcpl;
    fs_err *e;
} asm_ctx;

typedef struct attr_copy {
    hid_t dst;
    const char *skip1, *skip2;
    int failed;
} attr_copy;

static herr_t copy_attr(hid_t loc, const char *name, const H5A_info_t *ai, void *op)
{
    (void)ai;
    attr_copy *ac = op;
    if ((ac->skip1 && !strcmp(name, ac->skip1)) || (ac->skip2 && !strcmp(name, ac->skip2))) return 0;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT), t = a >= 0 ? H5Aget_type(a) : -1, s = a >= 0 ? H5Aget_space(a) : -1, b = -1;
    hssize_t np = s >= 0 ? H5Sget_simple_extent_npoints(s) : -1;
    size_t sz = t >= 0 ? H5Tget_size(t) : 0;
    void *buf = np >= 0 && sz ? calloc(np ? (size_t)np : 1, sz) : NULL;
    int ok = buf && H5Aread(a, t, buf) >= 0;
    int vlen = t >= 0 && (H5Tdetect_class(t, H5T_VLEN) > 0 || (H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) > 0));
    if (ok) ok = (b = H5Acreate2(ac->dst, name, t, s, H5P_DEFAULT, H5P_DEFAULT)) >= 0 && H5Awrite(b, t, buf) >= 0;
    if (buf && vlen && np >= 0) H5Dvlen_reclaim(t, s, H5P_DEFAULT, buf);
    free(buf);
    if (b >= 0) H5Aclose(b);
    if (s >= 0) H5Sclose(s);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    if (!ok) ac->failed = 1;
    return ok ? 0 : -1;
}

static int copy_attrs(hid_t from, hid_t to, const char *skip1, const char *skip2)
{
    attr_copy ac = {to, skip1, skip2, 0};
    hsize_t idx = 0;
    return H5Aiterate2(from, H5_INDEX_NAME, H5_ITER_INC, &idx, copy_attr, &ac) < 0 || ac.failed ? -1 : 0;
}

static int write_string_attr(hid_t obj, const char *name, const char *v)
{
    hid_t t = H5Tcopy(H5T_C_S1), s = H5Screate(H5S_SCALAR), a = -1;
    int ok = t >= 0 && s >= 0 && H5Tset_size(t, H5T_VARIABLE) >= 0 && H5Tset_cset(t, H5T_CSET_UTF8) >= 0 &&
             (a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT)) >= 0 && H5Awrite(a, t, &v) >= 0;
    if (a >= 0) H5Aclose(a);
    if (s >= 0) H5Sclose(s);
    if (t >= 0) H5Tclose(t);
    return ok ? 0 : -1;
}

typedef struct link_list {
    int n, cap;
    char **v;
} link_list;

static herr_t list_link(hid_t g, const char *name, const H5L_info_t *info, void *op)
{
    (void)g, (void)info;
    link_list *l = op;
    if (l->n == l->cap) {
        char **p = realloc(l->v, (size_t)(l->cap = l->cap ? 2 * l->cap : 64) * sizeof *p);
        if (!p) return -1;
        l->v = p;
    }
    return (l->v[l->n++] = strdup(name)) ? 0 : -1;
}

/* The links of a group, in creation order when tracked, else by name. */
static int list_links(hid_t g, link_list *l)
{
    memset(l, 0, sizeof *l);
    hsize_t idx = 0;
    if (H5Literate(g, H5_INDEX_CRT_ORDER, H5_ITER_INC, &idx, list_link, l) >= 0) return 0;
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    l->n = 0;
    idx = 0;
    return H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, list_link, l) >= 0 ? 0 : -1;
}

static void free_links(link_list *l)
{
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static const char *coords_of(int64_t flat, int nd, const hsize_t *dims, char *buf, size_t n)
{
    int64_t c[FO_MAX_DIMS], shape[FO_MAX_DIMS];
    for (int d = 0; d < nd; d++) shape[d] = (int64_t)dims[d];
    fo_unravel(flat, nd, shape, c);
    return fo_coords_str(nd, c, buf, n);
}

/* One step dataset of every rank, placed into the global tensor and written. */
static int assemble_dataset(asm_ctx *c, const char *gname, hid_t gsrc[], hid_t gdst, const char *name)
{
    fs_err *e = c->e;
    const int n = c->n;
    hid_t ds[64], sp[64], ty[64];
    int nd[64];
    hsize_t dims[64][FO_MAX_DIMS];
    fo_piece pc[64];
    memset(pc, 0, sizeof pc);
    int rc = FS_OK, opened = 0;
    unsigned char *g = NULL, *loc = NULL;
    int8_t *own = NULL;
    for (int r = 0; r < n && !rc; r++) {
        ds[r] = H5Dopen2(gsrc[r], name, H5P_DEFAULT);
        if (ds[r] < 0) {
            rc = fs_errf(e, FS_E_INPUT, "%s: %s/%s is missing or not a dataset (rank 0 holds it)", c->path[r], gname,
                         FO_SHOW(name));
            break;
        }
        opened++;
        sp[r] = H5Dget_space(ds[r]);
        ty[r] = H5Dget_type(ds[r]);
        nd[r] = H5Sget_simple_extent_ndims(sp[r]);
        if (nd[r] < 0 || nd[r] > FO_MAX_DIMS) rc = fs_errf(e, FS_E_INPUT, "%s: %s/%s: unsupported rank", c->path[r], gname, FO_SHOW(name));
        else H5Sget_simple_extent_dims(sp[r], dims[r], NULL);
        if (!rc && r && H5Tequal(ty[r], ty[0]) <= 0)
            rc = fs_errf(e, FS_E_INPUT, "%s/%s: rank %d stores another dtype than rank 0", gname, FO_SHOW(name), r);
        if (!rc && r && nd[r] != nd[0])
            rc = fs_errf(e, FS_E_INPUT, "%s/%s: rank %d holds a %d-d tensor, rank 0 a %d-d one", gname, FO_SHOW(name), r,
                         nd[r], nd[0]);
        int found = 0;
        if (!rc && fo_parallel_partial(c->par[r], name))
            rc = fs_errf(e, FS_E_INPUT, "%s/%s is a partial sum before a reduction (parallel \"partial\"): it has no "
                         "global value to assemble", gname, FO_SHOW(name));
        if (!rc) rc = fo_piece_from_json(c->par[r], name, r, nd[r], &pc[r], &found, c->path[r], e);
        if (!rc && !found) pc[r].replicated = 1; /* unmapped: whole on every rank, must agree */
    }
    const int ndim = rc ? 0 : nd[0];
    const size_t esz = rc ? 0 : H5Tget_size(ty[0]);
    hsize_t gd[FO_MAX_DIMS];
    int64_t gstride[FO_MAX_DIMS];
    char sh[160], co[160];
    if (!rc) {
        for (int d = 0; d < ndim; d++) gd[d] = dims[0][d];
        for (int i = 0; i < pc[0].naxes; i++) gd[pc[0].axis[i]] = (hsize_t)pc[0].gext[i];
        for (int r = 0; r < n && !rc; r++) {
            if (pc[r].replicated != pc[0].replicated || pc[r].naxes != pc[0].naxes)
                rc = fs_errf(e, FS_E_INPUT, "%s/%s: ranks 0 and %d describe its distribution differently", gname,
                             FO_SHOW(name), r);
            int split[FO_MAX_DIMS];
            for (int d = 0; d < ndim; d++) split[d] = -1;
            for (int i = 0; i < pc[r].naxes && !rc; i++) {
                split[pc[r].axis[i]] = i;
                if ((hsize_t)pc[r].gext[i] != gd[pc[r].axis[i]])
                    rc = fs_errf(e, FS_E_INPUT, "%s/%s: ranks 0 and %d disagree on the global extent of dim %d", gname,
                                 FO_SHOW(name), r, pc[r].axis[i]);
            }
            for (int d = 0; d < ndim && !rc; d++) {
                hsize_t want = split[d] < 0 ? gd[d] : (hsize_t)pc[r].len[split[d]];
                if (dims[r][d] != want)
                    rc = fs_errf(e, FS_E_INPUT, "%s: %s/%s has %llu elements on dim %d, its sharding entry says %llu",
                                 c->path[r], gname, FO_SHOW(name), (unsigned long long)dims[r][d], d,
                                 (unsigned long long)want);
            }
        }
    }
    hsize_t gnum = 1;
    for (int d = 0; d < ndim; d++) gnum *= gd[d];
    if (!rc) {
        for (int d = ndim - 1, m = 1; d >= 0; d--) gstride[d] = m, m *= (int64_t)gd[d];
        g = malloc(gnum ? gnum * esz : 1);
        own = calloc(gnum ? gnum : 1, 1);
        if (!g || !own) rc = fs_errf(e, FS_E_NOMEM, "%s/%s: out of memory for %llu values", gname, FO_SHOW(name),
                                     (unsigned long long)gnum);
    }
    for (int r = 0; r < n && !rc; r++) {
        hsize_t ln = 1;
        for (int d = 0; d < ndim; d++) ln *= dims[r][d];
        free(loc);
        if (!(loc = malloc(ln ? ln * esz : 1))) {
            rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            break;
        }
        if (ln && H5Dread(ds[r], ty[r], H5S_ALL, H5S_ALL, H5P_DEFAULT, loc) < 0) {
            rc = fs_errf(e, FS_E_INPUT, "%s: cannot read %s/%s", c->path[r], gname, FO_SHOW(name));
            break;
        }
        int split[FO_MAX_DIMS];
        int64_t lc[FO_MAX_DIMS] = {0};
        for (int d = 0; d < ndim; d++) split[d] = -1;
        for (int i = 0; i < pc[r].naxes; i++) split[pc[r].axis[i]] = i;
        for (hsize_t j = 0; j < ln; j++) {
            int64_t gi = 0;
            for (int d = 0; d < ndim; d++) gi += (split[d] < 0 ? lc[d] : pc[r].g[split[d]][lc[d]]) * gstride[d];
            const unsigned char *v = loc + j * esz;
            if (own[gi]) {
                if (memcmp(g + (size_t)gi * esz, v, esz)) {
                    rc = fs_errf(e, FS_E_INPUT, "%s/%s: ranks %d and %d hold different values at %s (%s): overlapping "
                                 "pieces disagree",
                                 gname, FO_SHOW(name), own[gi] - 1, r, coords_of(gi, ndim, gd, co, sizeof co),
                                 pc[r].replicated ? "a replicated tensor's copies must be bit-identical"
                                                  : "a global element two ranks hold");
                    break;
                }
            } else {
                memcpy(g + (size_t)gi * esz, v, esz);
                own[gi] = (int8_t)(r + 1);
            }
            for (int d = ndim - 1; d >= 0; d--) {
                if (++lc[d] < (int64_t)dims[r][d]) break;
                lc[d] = 0;
            }
        }
    }
    for (hsize_t j = 0; j < gnum && !rc; j++)
        if (!own[j]) {
            int64_t s64[FO_MAX_DIMS];
            for (int d = 0; d < ndim; d++) s64[d] = (int64_t)gd[d];
            rc = fs_errf(e, FS_E_INPUT, "%s/%s: no rank holds element %s of the global shape %s: a gap", gname,
                         FO_SHOW(name), coords_of((int64_t)j, ndim, gd, co, sizeof co), fo_shape_str(ndim, s64, sh, sizeof sh));
        }
    if (!rc) {
        hid_t gs = H5Screate_simple(ndim, gd, NULL);
        hid_t out = gs >= 0 ? H5Dcreate2(gdst, name, ty[0], gs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : -1;
        if (out < 0 || (gnum && H5Dwrite(out, ty[0], H5S_ALL, H5S_ALL, H5P_DEFAULT, g) < 0) || copy_attrs(ds[0], out, NULL, NULL))
            rc = fs_errf(e, FS_E_IO, "cannot write %s/%s", gname, FO_SHOW(name));
        if (out >= 0) H5Dclose(out);
        if (gs >= 0) H5Sclose(gs);
    }
    for (int r = 0; r < opened; r++) H5Tclose(ty[r]), H5Sclose(sp[r]), H5Dclose(ds[r]);
    for (int r = 0; r < n; r++) fo_piece_free(&pc[r]);
    free(g), free(own), free(loc);
    return rc;
}

static int assemble_step(asm_ctx *c, const char *gname)
{
    fs_err *e = c->e;
    hid_t gs[64];
    int opened = 0, rc = FS_OK;
    for (int r = 0; r < c->n && !rc; r++) {
        if ((gs[r] = H5Gopen2(c->src[r], gname, H5P_DEFAULT)) < 0)
            rc = fs_errf(e, FS_E_INPUT, "%s: no group %s (rank 0 has it)", c->path[r], gname);
        else opened++;
    }
    hid_t gd = rc ? -1 : H5Gcreate2(c->dst, gname, H5P_DEFAULT, c->gcpl, H5P_DEFAULT);
    if (!rc && (gd < 0 || copy_attrs(gs[0], gd, NULL, NULL))) rc = fs_errf(e, FS_E_IO, "cannot write group %s", gname);
    link_list l = {0};
    if (!rc && list_links(gs[0], &l)) rc = fs_errf(e, FS_E_INPUT, "%s: cannot list %s", c->path[0], gname);
    for (int i = 0; i < l.n && !rc; i++) {
        H5O_info_t oi;
        if (H5Oget_info_by_name(gs[0], l.v[i], &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_DATASET) continue;
        rc = assemble_dataset(c, gname, gs, gd, l.v[i]);
    }
    free_links(&l);
    if (gd >= 0) H5Gclose(gd);
    for (int r = 0; r < opened; r++) H5Gclose(gs[r]);
    return rc;
}

int fo_assemble(fo_file **files, int n, const char *out, fs_err *e)
{
    int rc = fo_ranks_complete(files, n, e);
    for (int i = 0; i < n && !rc; i++) {
        if (!rc && i) rc = fo_same_model(files[0], files[i], e);
        if (!rc) rc = fo_require_complete(files[i], 0, NULL, e);
    }
    if (rc) return rc;
    asm_ctx c = {.n = n, .e = e, .dst = -1, .gcpl = -1};
    for (int i = 0; i < n; i++) {
        int r = fo_parallel_rank(fo_file_parallel(files[i]));
        c.path[r] = fo_file_path(files[i]);
        c.par[r] = cJSON_Parse(fo_file_parallel(files[i]));
        c.src[r] = -1;
    }
    for (int r = 0; r < n && !rc; r++) {
        if (!c.par[r]) rc = fs_errf(e, FS_E_INPUT, "%s: attribute parallel is not valid JSON", c.path[r]);
        else if ((c.src[r] = H5Fopen(c.path[r], H5F_ACC_RDONLY, H5P_DEFAULT)) < 0)
            rc = fs_errf(e, FS_E_INPUT, "%s: cannot open as HDF5", c.path[r]);
    }
    char *tmp = fo_strdupf("%s.tmp.%ld", out, (long)getpid());
    if (!tmp) rc = rc ? rc : fs_errf(e, FS_E_NOMEM, "out of memory");
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    c.gcpl = H5Pcreate(H5P_GROUP_CREATE);
    const unsigned crt = H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED;
    if (!rc && (fcpl < 0 || c.gcpl < 0 || H5Pset_link_creation_order(fcpl, crt) < 0 ||
                H5Pset_attr_creation_order(fcpl, crt) < 0 || H5Pset_link_creation_order(c.gcpl, crt) < 0 ||
                H5Pset_attr_creation_order(c.gcpl, crt) < 0))
        rc = fs_errf(e, FS_E_INTERNAL, "cannot set up HDF5 property lists");
    if (!rc && (c.dst = H5Fcreate(tmp, H5F_ACC_EXCL, fcpl, H5P_DEFAULT)) < 0)
        rc = fs_errf(e, FS_E_IO, "%s: cannot create %s: %s", FO_SHOW(out), FO_SHOW(tmp), strerror(errno ? errno : EIO));
    int created = !rc;
    /* root attributes: rank 0's, `parallel` without "rank" (a global dump's), `complete` last */
    if (!rc) {
        hid_t r0 = H5Gopen2(c.src[0], "/", H5P_DEFAULT), d0 = H5Gopen2(c.dst, "/", H5P_DEFAULT);
        cJSON_DeleteItemFromObjectCaseSensitive(c.par[0], "rank");
        char *pj = cJSON_PrintUnformatted(c.par[0]);
        /* flux-sim's per-rank notes become the global run's: `weights` loses ", tp shard r/T",
         * `producer` says the file was assembled (instead of ", rank r local view") */
        char *w = NULL, *pr = NULL, *pr2 = NULL;
        fs_err ig = {0};
        if (fo_attr_string(files[0], "/", "weights", &w, &ig)) w = NULL;
        if (fo_attr_string(files[0], "/", "producer", &pr, &ig)) pr = NULL;
        char *cut;
        int t1, t2, used = 0;
        if (w && (cut = strstr(w, ", tp shard ")) && sscanf(cut, ", tp shard %d/%d%n", &t1, &t2, &used) == 2 && !cut[used])
            *cut = 0;
        if (pr && (cut = strstr(pr, ", rank ")) && strstr(cut, " local view")) *cut = 0;
        if (pr) pr2 = fo_strdupf("%s, assembled by flux-oracle from %d per-rank dumps", pr, n);
        if (r0 < 0 || d0 < 0 || !pj || copy_attrs(r0, d0, "parallel", "complete") || write_string_attr(d0, "parallel", pj) ||
            (w && (H5Adelete(d0, "weights") < 0 || write_string_attr(d0, "weights", w))) ||
            (pr2 && (H5Adelete(d0, "producer") < 0 || write_string_attr(d0, "producer", pr2))))
            rc = fs_errf(e, FS_E_IO, "%s: cannot write the root attributes", FO_SHOW(tmp));
        free(pj), free(w), free(pr), free(pr2);
        if (r0 >= 0) H5Gclose(r0);
        if (d0 >= 0) H5Gclose(d0);
    }
    /* /inputs from rank 0, the step groups in order, /final from rank 0 (gathered on every rank) */
    hid_t ocp = H5Pcreate(H5P_OBJECT_COPY);
    if (!rc && H5Ocopy(c.src[0], "inputs", c.dst, "inputs", ocp, H5P_DEFAULT) < 0)
        rc = fs_errf(e, FS_E_IO, "cannot copy /inputs from %s", c.path[0]);
    for (int i = 0; i < fo_file_nsteps(files[0]) && !rc; i++) {
        /* fo_file steps come from files[0], which may be any rank: the names are the same */
        const char *gname = fo_file_step_group(files[0], i);
        rc = assemble_step(&c, gname + (gname[0] == '/'));
    }
    if (!rc && H5Lexists(c.src[0], "final", H5P_DEFAULT) > 0 && H5Ocopy(c.src[0], "final", c.dst, "final", ocp, H5P_DEFAULT) < 0)
        rc = fs_errf(e, FS_E_IO, "cannot copy /final from %s", c.path[0]);
    if (ocp >= 0) H5Pclose(ocp);
    if (!rc) {
        hid_t s = H5Screate(H5S_SCALAR), a = -1;
        long long one = 1;
        if (s < 0 || (a = H5Acreate2(c.dst, "complete", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
            H5Awrite(a, H5T_NATIVE_LLONG, &one) < 0)
            rc = fs_errf(e, FS_E_IO, "%s: cannot write the complete marker", FO_SHOW(tmp));
        if (a >= 0) H5Aclose(a);
        if (s >= 0) H5Sclose(s);
    }
    if (c.dst >= 0 && H5Fclose(c.dst) < 0 && !rc) rc = fs_errf(e, FS_E_IO, "%s: cannot close (disk full?)", FO_SHOW(tmp));
    if (!rc && rename(tmp, out)) rc = fs_errf(e, FS_E_IO, "%s: cannot rename %s into place: %s", FO_SHOW(out), FO_SHOW(tmp), strerror(errno));
    if (rc && created) unlink(tmp);
    if (fcpl >= 0) H5Pclose(fcpl);
    if (c.gcpl >= 0) H5Pclose(c.gcpl);
    for (int r = 0; r < n; r++) {
        if (c.src[r] >= 0) H5Fclose(c.src[r]);
        cJSON_Delete(c.par[r]);
    }
    free(tmp);
    return rc;
}
