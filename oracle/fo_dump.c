/* fo_dump.c — flux-dump reader (see fo_dump.h).
 *
 * Only HDF5 API calls that mean the same in 1.10 and 1.12+ are used (H5Gget_info +
 * H5Lget_name_by_idx instead of H5Literate, H5Oopen + H5Iget_type instead of H5Oget_info),
 * so the oracle builds against whatever libhdf5 the distribution ships. */
#include "fo_dump.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fo_steps.h"
#include "fs_h5err.h"

struct fo_file {
    char *path;
    hid_t fid;
    int raw_fd; /* plain read-only descriptor for fo_stream's direct reads; -1 until first use */
    int version;
    double file_size; /* bytes, at open: what any stored object must fit in */
    char *dtype, *config, *parallel, *producer;
    int nsteps;
    int *step_no;      /* [nsteps], ascending */
    char (*step_name)[40]; /* [nsteps], "/step_0002" */
};

/* ---------- small HDF5 helpers ---------- */

static herr_t vlen_reclaim(hid_t type, hid_t space, void *buf)
{
#if H5_VERSION_GE(1, 12, 0)
    return H5Treclaim(type, space, H5P_DEFAULT, buf);
#else
    return H5Dvlen_reclaim(type, space, H5P_DEFAULT, buf);
#endif
}

/* HDF5's reason, one clean line (shared with the writer: sim/base/fs_h5err.h). */
static const char *h5_cause(char buf[256]) { return fs_h5_cause(buf, 256); }

/* ---------- crash / hang attribution (fo_set_h5_hook) ---------- */

static fo_h5_hook_fn h5_hook;

void fo_set_h5_hook(fo_h5_hook_fn fn) { h5_hook = fn; }

static void h5_enter(const char *file, const char *object)
{
    if (h5_hook) h5_hook(1, file, object);
}
static void h5_leave(void)
{
    if (h5_hook) h5_hook(0, NULL, NULL);
}

#define MAX_COMPONENTS 32 /* path components obj_kind looks up: /step_N/ and 8 nested groups fit */

/* H5I type of the object at `path`, or -1 when some component is missing. Each prefix is
 * checked with H5Lexists because H5Lexists on "a/b" fails (not 0) when "a" is missing. */
static int obj_kind(hid_t loc, const char *path)
{
    size_t n = strlen(path);
    if (n == 0) return -1;
    /* Each prefix costs HDF5 a parse of it: a name of 80,000 slashes (an `order` entry, found by
     * fuzz_oracle_walk) made this quadratic, minutes for one lookup. No dump nests that deep:
     * more than MAX_COMPONENTS components names nothing here. */
    size_t comps = 0;
    for (size_t i = 1; i <= n; i++) comps += (path[i] == '/' || path[i] == 0) && path[i - 1] != '/';
    if (comps > MAX_COMPONENTS) return -1;
    char *p = malloc(n + 1);
    if (!p) return -1;
    memcpy(p, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        if (p[i - 1] == '/') continue; /* an empty component ("a//b"): nothing to check */
        char save = p[i];
        p[i] = 0;
        int ok = H5Lexists(loc, p, H5P_DEFAULT) > 0;
        p[i] = save;
        if (!ok) {
            free(p);
            return -1;
        }
    }
    free(p);
    /* The object header's type field only: H5Oopen would construct the whole dataset object
     * (layout, property lists), which made this lookup most of a diff's metadata time. */
#if H5_VERSION_GE(1, 12, 0)
    H5O_info2_t oi;
    if (H5Oget_info_by_name3(loc, path, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return -1;
#else
    H5O_info_t oi;
    if (H5Oget_info_by_name2(loc, path, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return -1;
#endif
    return oi.type == H5O_TYPE_DATASET ? (int)H5I_DATASET : oi.type == H5O_TYPE_GROUP ? (int)H5I_GROUP : (int)H5I_BADID;
}

/* obj_kind under the hook: HDF5 walks the file's B-trees and heaps to answer. */
static int guarded_kind(fo_file *f, const char *path)
{
    h5_enter(f->path, path);
    int k = obj_kind(f->fid, path);
    h5_leave();
    return k;
}

int fo_is_group(fo_file *f, const char *path)
{
    if (!strcmp(path, "/")) return 1;
    return guarded_kind(f, path) == (int)H5I_GROUP;
}

int fo_is_dataset(fo_file *f, const char *path) { return guarded_kind(f, path) == (int)H5I_DATASET; }

char *fo_path_join(const char *group, const char *name)
{
    size_t a = strlen(group), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, group, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

void fo_names_free(fo_names *l)
{
    if (!l) return;
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    l->n = 0;
    l->v = NULL;
}

/* Reads every element of a string attribute (vlen or fixed-length, scalar or 1-D) into out.
 * Returns 0, -1 when the attribute is not a string, -2 on an HDF5/memory error. The file's
 * own type is the memory type: HDF5 does not convert between ASCII and UTF-8 character sets,
 * and h5py writes UTF-8 while other producers write ASCII. */
static int read_str_elems(hid_t attr, fo_names *out, double file_size)
{
    int rc = -2;
    hid_t type = H5Aget_type(attr), space = H5Aget_space(attr);
    if (type < 0 || space < 0) goto done;
    if (H5Tget_class(type) != H5T_STRING) {
        rc = -1;
        goto done;
    }
    hssize_t np = H5Sget_simple_extent_npoints(space);
    if (np < 0) goto done;
    /* What can be checked before HDF5 touches the data: a damaged dataspace claims millions of
     * strings (each a heap lookup), a damaged fixed-length type more bytes than the file has.
     * (vlen strings live in the global heap, which no API lets us check before reading it:
     * flux-oracle's crash handler is the last line of defence there.) */
    if (np > (1 << 20) || (H5Tis_variable_str(type) <= 0 && (double)np * (double)H5Tget_size(type) > file_size)) {
        rc = -3;
        goto done;
    }
    out->v = calloc(np ? (size_t)np : 1, sizeof *out->v);
    if (!out->v) goto done;
    if (H5Tis_variable_str(type) > 0) {
        char **buf = calloc(np ? (size_t)np : 1, sizeof *buf);
        if (!buf) goto done;
        if (np && H5Aread(attr, type, buf) < 0) {
            free(buf);
            goto done;
        }
        int ok = 1;
        for (hssize_t i = 0; i < np; i++) {
            out->v[i] = strdup(buf[i] ? buf[i] : "");
            if (!out->v[i]) ok = 0;
            out->n++;
        }
        if (np) vlen_reclaim(type, space, buf);
        free(buf);
        if (!ok) goto done;
    } else {
        size_t sz = H5Tget_size(type);
        H5T_str_t pad = H5Tget_strpad(type);
        char *buf = calloc((size_t)np * sz + 1, 1);
        if (!buf || (np && H5Aread(attr, type, buf) < 0)) {
            free(buf);
            goto done;
        }
        int ok = 1;
        for (hssize_t i = 0; i < np; i++) {
            const char *s = buf + (size_t)i * sz;
            size_t len = strnlen(s, sz);
            if (pad == H5T_STR_SPACEPAD)
                while (len && s[len - 1] == ' ') len--;
            out->v[i] = strndup(s, len);
            if (!out->v[i]) ok = 0;
            out->n++;
        }
        free(buf);
        if (!ok) goto done;
    }
    rc = 0;
done:
    if (rc) fo_names_free(out);
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    return rc;
}

static int attr_string(fo_file *f, const char *obj, const char *name, char **out, fs_err *e)
{
    char cause[256];
    *out = NULL;
    if (!fo_is_group(f, obj) && obj_kind(f->fid, obj) < 0)
        return fs_errf(e, FS_E_INPUT, "%s: %s: no such object", FO_SHOW(f->path), FO_SHOW(obj));
    htri_t ex = H5Aexists_by_name(f->fid, obj, name, H5P_DEFAULT);
    if (ex < 0) return fs_errf(e, FS_E_INPUT, "%s: %s: attribute %s: %s", FO_SHOW(f->path), FO_SHOW(obj), name, h5_cause(cause));
    if (ex == 0) return FS_OK;
    hid_t a = H5Aopen_by_name(f->fid, obj, name, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) return fs_errf(e, FS_E_INPUT, "%s: %s: attribute %s: %s", FO_SHOW(f->path), FO_SHOW(obj), name, h5_cause(cause));
    fo_names l = {0};
    int r = read_str_elems(a, &l, f->file_size);
    H5Aclose(a);
    if (r == -1) return fs_errf(e, FS_E_INPUT, "%s: %s: attribute %s is not a string", FO_SHOW(f->path), FO_SHOW(obj), name);
    if (r == -3) return fs_errf(e, FS_E_INPUT, "%s: %s: attribute %s: implausible size (corrupted?)", FO_SHOW(f->path), FO_SHOW(obj), name);
    if (r) return fs_errf(e, FS_E_INPUT, "%s: %s: attribute %s unreadable: %s", FO_SHOW(f->path), FO_SHOW(obj), name, h5_cause(cause));
    if (l.n != 1) {
        fo_names_free(&l);
        return fs_errf(e, FS_E_INPUT, "%s: %s: attribute %s holds %d strings, expected one", FO_SHOW(f->path), FO_SHOW(obj), name, l.n);
    }
    *out = l.v[0];
    free(l.v);
    return FS_OK;
}

static int attr_double(fo_file *f, const char *obj, const char *name, double *out, int *found, fs_err *e)
{
    char cause[256];
    *found = 0;
    if (!fo_is_group(f, obj) && obj_kind(f->fid, obj) < 0)
        return fs_errf(e, FS_E_INPUT, "%s: %s: no such object", FO_SHOW(f->path), FO_SHOW(obj));
    htri_t ex = H5Aexists_by_name(f->fid, obj, name, H5P_DEFAULT);
    if (ex < 0) return fs_errf(e, FS_E_INPUT, "%s: %s: attribute %s: %s", FO_SHOW(f->path), FO_SHOW(obj), name, h5_cause(cause));
    if (ex == 0) return FS_OK;
    hid_t a = H5Aopen_by_name(f->fid, obj, name, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) return fs_errf(e, FS_E_INPUT, "%s: %s: attribute %s: %s", FO_SHOW(f->path), FO_SHOW(obj), name, h5_cause(cause));
    hid_t t = H5Aget_type(a), s = H5Aget_space(a);
    H5T_class_t cls = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
    hssize_t np = s >= 0 ? H5Sget_simple_extent_npoints(s) : -1;
    int rc = FS_OK;
    if (cls != H5T_INTEGER && cls != H5T_FLOAT)
        rc = fs_errf(e, FS_E_INPUT, "%s: %s: attribute %s is not a number", FO_SHOW(f->path), FO_SHOW(obj), name);
    else if (np != 1)
        rc = fs_errf(e, FS_E_INPUT, "%s: %s: attribute %s holds %lld values, expected one", FO_SHOW(f->path), FO_SHOW(obj), name,
                     (long long)np);
    else if (H5Aread(a, H5T_NATIVE_DOUBLE, out) < 0)
        rc = fs_errf(e, FS_E_INPUT, "%s: %s: attribute %s unreadable: %s", FO_SHOW(f->path), FO_SHOW(obj), name, h5_cause(cause));
    else
        *found = 1;
    if (t >= 0) H5Tclose(t);
    if (s >= 0) H5Sclose(s);
    H5Aclose(a);
    return rc;
}

/* "OBJ attribute NAME" for the crash/hang hook, which only needs a label: cut (visibly, by
 * FO_SHOW) when the object's name is long; the reads themselves use the whole names. */
static void attr_label(char *buf, size_t n, const char *obj, const char *name)
{
    snprintf(buf, n, "%s attribute %s", FO_SHOW(obj), FO_SHOW(name));
}

int fo_attr_string(fo_file *f, const char *obj, const char *name, char **out, fs_err *e)
{
    char what[700];
    attr_label(what, sizeof what, obj, name);
    h5_enter(f->path, what);
    int rc = attr_string(f, obj, name, out, e);
    h5_leave();
    return rc;
}

int fo_attr_double(fo_file *f, const char *obj, const char *name, double *out, int *found, fs_err *e)
{
    char what[700];
    attr_label(what, sizeof what, obj, name);
    h5_enter(f->path, what);
    int rc = attr_double(f, obj, name, out, found, e);
    h5_leave();
    return rc;
}

/* ---------- open / close ---------- */

typedef struct step_ent {
    int no;
    char name[40];
} step_ent;

static int cmp_step(const void *a, const void *b)
{
    int x = ((const step_ent *)a)->no, y = ((const step_ent *)b)->no;
    return (x > y) - (x < y);
}

/* Finds the root's "step_<digits>" groups and sorts them by number: link order is creation
 * order in our dumps but alphabetical in untracked ones, and step_10000 sorts before step_2000
 * alphabetically. */
static int list_steps(fo_file *f, fs_err *e)
{
    char cause[256];
    H5G_info_t gi;
    if (H5Gget_info(f->fid, &gi) < 0)
        return fs_errf(e, FS_E_INPUT, "%s: cannot list the root group: %s", FO_SHOW(f->path), h5_cause(cause));
    step_ent *st = malloc((gi.nlinks ? gi.nlinks : 1) * sizeof *st);
    if (!st) return fs_errf(e, FS_E_NOMEM, "%s: out of memory listing steps", FO_SHOW(f->path));
    int n = 0;
    for (hsize_t i = 0; i < gi.nlinks; i++) {
        char name[64];
        ssize_t len = H5Lget_name_by_idx(f->fid, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT);
        if (len < 0) {
            free(st);
            return fs_errf(e, FS_E_INPUT, "%s: cannot list the root group: %s", FO_SHOW(f->path), h5_cause(cause));
        }
        /* At most 9 digits, so the number fits an int. */
        if ((size_t)len >= sizeof name || strncmp(name, "step_", 5) || !name[5] || len > 5 + 9) continue;
        if (strspn(name + 5, "0123456789") != strlen(name + 5)) continue;
        snprintf(st[n].name, sizeof st[n].name, "/%.30s", name); /* name is at most 14 chars */
        if (obj_kind(f->fid, st[n].name) != (int)H5I_GROUP) continue;
        st[n].no = atoi(name + 5);
        n++;
    }
    qsort(st, (size_t)n, sizeof *st, cmp_step);
    f->step_no = malloc((n ? (size_t)n : 1) * sizeof *f->step_no);
    f->step_name = malloc((n ? (size_t)n : 1) * sizeof *f->step_name);
    if (!f->step_no || !f->step_name) {
        free(st);
        return fs_errf(e, FS_E_NOMEM, "%s: out of memory listing steps", FO_SHOW(f->path));
    }
    for (int i = 0; i < n; i++) {
        f->step_no[i] = st[i].no;
        memcpy(f->step_name[i], st[i].name, sizeof f->step_name[i]);
    }
    f->nsteps = n;
    free(st);
    return FS_OK;
}

static int file_open(fo_file **fp, const char *path, fs_err *e)
{
    char cause[256];
    *fp = NULL;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* our errors are one line; HDF5 must not print */

    /* open(2) first: HDF5 would report a missing file as "unable to open file", without errno,
     * and a directory as a failed read with a dump of the read's arguments. */
    /* A FIFO (or a device) would block open(2) and H5Fopen for ever: refuse anything but a
     * regular file first, without opening it (a directory keeps its own message below). */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        return fs_require_regular_file(path, "dump", e);
    /* O_NONBLOCK: should a FIFO appear at the path after that check, open() still returns. */
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return fs_errf(e, FS_E_INPUT, "%s: cannot open: %s", FO_SHOW(path), strerror(errno));
    if (fstat(fd, &st) != 0) st.st_mode = 0;
    int is_dir = S_ISDIR(st.st_mode);
    if (!is_dir && !S_ISREG(st.st_mode)) {
        close(fd);
        return fs_errf(e, FS_E_INPUT, "%s: dump is not a regular file", FO_SHOW(path));
    }
    double size = (double)st.st_size;
    close(fd);
    if (is_dir) return fs_errf(e, FS_E_INPUT, "%s: is a directory, not a dump file", FO_SHOW(path));
    htri_t is = H5Fis_hdf5(path);
    if (is == 0) return fs_errf(e, FS_E_INPUT, "%s: not an HDF5 file", FO_SHOW(path));
    if (is < 0) return fs_errf(e, FS_E_INPUT, "%s: cannot read: %s", FO_SHOW(path), h5_cause(cause));

    fo_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return fs_errf(e, FS_E_NOMEM, "%s: out of memory", FO_SHOW(path));
    }
    f->raw_fd = -1;
    f->file_size = size;
    f->fid = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f->fid < 0) {
        int rc = fs_errf(e, FS_E_INPUT, "%s: cannot open as HDF5: %s", FO_SHOW(path), h5_cause(cause));
        fo_file_close(f);
        return rc;
    }
    int rc;
    char *fmt = NULL;
    if ((rc = fo_attr_string(f, "/", "format", &fmt, e))) goto fail;
    if (!fmt) {
        rc = fs_errf(e, FS_E_INPUT, "%s: not a flux-dump file (no 'format' attribute)", FO_SHOW(path));
        goto fail;
    }
    if (strcmp(fmt, "flux-dump")) {
        char shown[72];
        size_t k = 0;
        for (const char *p = fmt; *p && k + 1 < sizeof shown && k < 64; p++)
            shown[k++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
        shown[k] = 0;
        rc = fs_errf(e, FS_E_INPUT, "%s: not a flux-dump file (format is '%s')", FO_SHOW(path), shown);
        free(fmt);
        goto fail;
    }
    free(fmt);
    double v;
    int found;
    if ((rc = fo_attr_double(f, "/", "version", &v, &found, e))) goto fail;
    /* Range first: converting a double outside long long's range (1e300, NaN) is undefined. */
    if (!found || !(v >= -1e9 && v <= 1e9) || v != floor(v)) {
        rc = fs_errf(e, FS_E_INPUT, "%s: flux-dump without an integer 'version' attribute", FO_SHOW(path));
        goto fail;
    }
    if (v > FO_FORMAT_VERSION) {
        rc = fs_errf(e, FS_E_INPUT, "%s: flux-dump version %lld is newer than this flux-sim supports (%d)", FO_SHOW(path),
                     (long long)v, FO_FORMAT_VERSION);
        goto fail;
    }
    if (v < 1) {
        rc = fs_errf(e, FS_E_INPUT, "%s: flux-dump version %lld is not valid (versions start at 1)", FO_SHOW(path),
                     (long long)v);
        goto fail;
    }
    f->version = (int)v;
    if ((rc = fo_attr_string(f, "/", "dtype", &f->dtype, e))) goto fail;
    if ((rc = fo_attr_string(f, "/", "config", &f->config, e))) goto fail;
    if (!f->dtype || !f->config) {
        rc = fs_errf(e, FS_E_INPUT, "%s: flux-dump without the required '%s' root attribute", FO_SHOW(path),
                     f->dtype ? "config" : "dtype");
        goto fail;
    }
    if ((rc = fo_attr_string(f, "/", "parallel", &f->parallel, e))) goto fail;
    if ((rc = fo_attr_string(f, "/", "producer", &f->producer, e))) goto fail;
    if ((rc = list_steps(f, e))) goto fail;
    *fp = f;
    return FS_OK;
fail:
    fo_file_close(f);
    return rc;
}

int fo_file_open(fo_file **fp, const char *path, fs_err *e)
{
    h5_enter(path, "the superblock and root group");
    int rc = file_open(fp, path, e);
    h5_leave();
    return rc;
}

void fo_file_close(fo_file *f)
{
    if (!f) return;
    if (f->fid > 0) {
        h5_enter(f->path, "the file (closing)");
        H5Fclose(f->fid);
        h5_leave();
    }
    if (f->raw_fd >= 0) close(f->raw_fd);
    free(f->path);
    free(f->dtype);
    free(f->config);
    free(f->parallel);
    free(f->producer);
    free(f->step_no);
    free(f->step_name);
    free(f);
}

const char *fo_file_path(const fo_file *f) { return f->path; }
const char *fo_file_dtype(const fo_file *f) { return f->dtype; }
const char *fo_file_config(const fo_file *f) { return f->config; }
const char *fo_file_parallel(const fo_file *f) { return f->parallel; }
const char *fo_file_producer(const fo_file *f) { return f->producer; }
int fo_file_version(const fo_file *f) { return f->version; }
int fo_file_nsteps(const fo_file *f) { return f->nsteps; }
int fo_file_step_number(const fo_file *f, int i) { return f->step_no[i]; }
const char *fo_file_step_group(const fo_file *f, int i) { return f->step_name[i]; }

/* ---------- group order ---------- */

#define MAX_NEST 8           /* groups inside a step group, nested (h5py makes one per '/' in a name) */
#define MAX_LISTED (1 << 20) /* datasets listed under one group: as read_str_elems' limit for `order` */

static int push_name(fo_names *out, size_t *cap, char *name)
{
    if ((size_t)out->n == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        char **p = realloc(out->v, nc * sizeof *p);
        if (!p) return -1;
        out->v = p, *cap = nc;
    }
    out->v[out->n++] = name;
    return 0;
}

/* Appends the datasets of group g (opened at `gpath`), by creation order when the producer
 * tracked it, else by name, as `prefix` + name; with `nested`, also those of its subgroups, as
 * "sub/name" (a name holding '/', written by h5py as nested groups), MAX_NEST deep at most: a
 * hard link to a parent group would otherwise make the walk endless. *idx_used gets the index
 * used for g. */
static int list_links(fo_file *f, hid_t g, const char *gpath, const char *prefix, int depth, int nested, fo_names *out,
                      size_t *cap, H5_index_t *idx_used, fs_err *e)
{
    char cause[256];
    H5G_info_t gi;
    if (H5Gget_info(g, &gi) < 0)
        return fs_errf(e, FS_E_INPUT, "%s: %s: cannot list: %s", FO_SHOW(f->path), FO_SHOW(gpath), h5_cause(cause));
    unsigned flags = 0;
    hid_t gcpl = H5Gget_create_plist(g);
    if (gcpl >= 0) {
        H5Pget_link_creation_order(gcpl, &flags);
        H5Pclose(gcpl);
    }
    H5_index_t idx = (flags & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
    const size_t plen = strlen(prefix);
    for (hsize_t i = 0; i < gi.nlinks; i++) {
        ssize_t len = H5Lget_name_by_idx(g, ".", idx, H5_ITER_INC, i, NULL, 0, H5P_DEFAULT);
        if (len < 0 && idx == H5_INDEX_CRT_ORDER && i == 0) {
            /* Tracked but not indexed in a dense group: HDF5 cannot iterate in that order. */
            idx = H5_INDEX_NAME;
            len = H5Lget_name_by_idx(g, ".", idx, H5_ITER_INC, i, NULL, 0, H5P_DEFAULT);
        }
        char *name = len >= 0 ? malloc(plen + (size_t)len + 1) : NULL;
        if (name) memcpy(name, prefix, plen);
        if (!name || H5Lget_name_by_idx(g, ".", idx, H5_ITER_INC, i, name + plen, (size_t)len + 1, H5P_DEFAULT) < 0) {
            free(name);
            return fs_errf(e, FS_E_INPUT, "%s: %s: cannot list: %s", FO_SHOW(f->path), FO_SHOW(gpath), h5_cause(cause));
        }
        int kind = obj_kind(g, name + plen);
        if (kind == (int)H5I_DATASET) {
            if (out->n >= MAX_LISTED) {
                free(name);
                return fs_errf(e, FS_E_INPUT, "%s: %s: more than %d datasets: corrupted?", FO_SHOW(f->path),
                               FO_SHOW(gpath), MAX_LISTED);
            }
            if (push_name(out, cap, name)) {
                free(name);
                return fs_errf(e, FS_E_NOMEM, "%s: %s: out of memory", FO_SHOW(f->path), FO_SHOW(gpath));
            }
            continue;
        }
        if (kind == (int)H5I_GROUP && nested) {
            int rc;
            if (depth >= MAX_NEST)
                rc = fs_errf(e, FS_E_INPUT, "%s: %s: groups nested more than %d deep (%s): not a flux-dump step",
                             FO_SHOW(f->path), FO_SHOW(gpath), MAX_NEST, FO_SHOW(name));
            else {
                size_t nl = strlen(name);
                char *sub = realloc(name, nl + 2);
                hid_t sg = sub ? H5Gopen2(g, sub + plen, H5P_DEFAULT) : -1;
                if (sub) name = sub, name[nl] = '/', name[nl + 1] = 0;
                if (sg < 0)
                    rc = fs_errf(e, FS_E_INPUT, "%s: %s: cannot open %s: %s", FO_SHOW(f->path), FO_SHOW(gpath),
                                 FO_SHOW(name), h5_cause(cause));
                else {
                    H5_index_t dummy;
                    rc = list_links(f, sg, gpath, name, depth + 1, nested, out, cap, &dummy, e);
                    H5Gclose(sg);
                }
            }
            free(name);
            if (rc) return rc;
            continue;
        }
        free(name);
    }
    *idx_used = idx;
    return FS_OK;
}

static int links_in_order(fo_file *f, hid_t g, const char *group, fo_names *out, fo_order_source *src, fs_err *e)
{
    size_t cap = 0;
    H5_index_t idx = H5_INDEX_NAME;
    int rc = list_links(f, g, group, "", 0, 1, out, &cap, &idx, e);
    if (rc) {
        fo_names_free(out);
        return rc;
    }
    if (src) *src = idx == H5_INDEX_CRT_ORDER ? FO_ORDER_CREATION : FO_ORDER_NAME;
    return FS_OK;
}

int fo_group_datasets(fo_file *f, const char *group, fo_names *out, fs_err *e)
{
    char cause[256], what[400];
    fo_names_free(out);
    snprintf(what, sizeof what, "%s (listing)", FO_SHOW(group));
    h5_enter(f->path, what);
    int rc;
    hid_t g = fo_is_group(f, group) ? H5Gopen2(f->fid, group, H5P_DEFAULT) : -1;
    if (g < 0)
        rc = fs_errf(e, FS_E_INPUT, "%s: %s: cannot open: %s", FO_SHOW(f->path), FO_SHOW(group), h5_cause(cause));
    else {
        rc = links_in_order(f, g, group, out, NULL, e);
        H5Gclose(g);
    }
    h5_leave();
    return rc;
}

static int group_order(fo_file *f, const char *group, fo_names *out, fo_order_source *src, fs_err *e)
{
    char cause[256];
    fo_names_free(out);
    if (!fo_is_group(f, group)) return fs_errf(e, FS_E_INPUT, "%s: %s: no such group", FO_SHOW(f->path), FO_SHOW(group));
    hid_t g = H5Gopen2(f->fid, group, H5P_DEFAULT);
    if (g < 0) return fs_errf(e, FS_E_INPUT, "%s: %s: cannot open: %s", FO_SHOW(f->path), FO_SHOW(group), h5_cause(cause));
    int rc = FS_OK;
    htri_t ex = H5Aexists(g, "order");
    if (ex > 0) {
        hid_t a = H5Aopen(g, "order", H5P_DEFAULT);
        int r = a >= 0 ? read_str_elems(a, out, f->file_size) : -2;
        int rank = -1;
        if (a >= 0) {
            hid_t sp = H5Aget_space(a);
            if (sp >= 0) rank = H5Sget_simple_extent_ndims(sp), H5Sclose(sp);
            H5Aclose(a);
        }
        /* The list of names: a single string (h5py's `attrs['order'] = "a,b"`) or a 2-D array is
         * not an order, and reading it as one name would drop the whole group from the walk. */
        if (r == 0 && rank != 1) {
            fo_names_free(out);
            rc = fs_errf(e, FS_E_INPUT, "%s: %s: attribute order is %s, not a 1-D list of dataset names",
                         FO_SHOW(f->path), FO_SHOW(group), rank == 0 ? "a single string" : "not 1-D");
        } else if (r == -1)
            rc = fs_errf(e, FS_E_INPUT, "%s: %s: attribute order is not an array of strings", FO_SHOW(f->path), FO_SHOW(group));
        else if (r == -3)
            rc = fs_errf(e, FS_E_INPUT, "%s: %s: attribute order: implausible size (corrupted?)", FO_SHOW(f->path), FO_SHOW(group));
        else if (r)
            rc = fs_errf(e, FS_E_INPUT, "%s: %s: attribute order unreadable: %s", FO_SHOW(f->path), FO_SHOW(group), h5_cause(cause));
        else if (src)
            *src = FO_ORDER_ATTR;
    } else if (ex == 0) {
        rc = links_in_order(f, g, group, out, src, e);
    } else {
        rc = fs_errf(e, FS_E_INPUT, "%s: %s: cannot read attributes: %s", FO_SHOW(f->path), FO_SHOW(group), h5_cause(cause));
    }
    H5Gclose(g);
    return rc;
}

int fo_group_order(fo_file *f, const char *group, fo_names *out, fo_order_source *src, fs_err *e)
{
    char what[400];
    snprintf(what, sizeof what, "%s attribute order", FO_SHOW(group));
    h5_enter(f->path, what);
    int rc = group_order(f, group, out, src, e);
    h5_leave();
    return rc;
}

/* ---------- datasets ---------- */

/* deflate cannot expand data by more than ~1032:1 (RFC 1951: at most 258 bytes from a 2-bit
 * code, in practice 1032:1), and shuffle does not change sizes: a dataset whose values take more
 * than that many times the bytes it has stored is not backed by the file. Such a dataset (a
 * damaged shape, or a chunked one whose chunks were never written) would otherwise be read as
 * fill values for hours. Small ones are let through: h5py writes small unwritten datasets that
 * read as fill values, and they cost nothing. */
#define MAX_INFLATE 1032.0
#define UNBACKED_SLACK (1 << 20)

/* The dataset's values must come from the file: stored in it (contiguous, chunked or compact),
 * not from external raw files or other files (virtual datasets) that a dump has no business
 * pointing at, and in a quantity the stored bytes can hold. */
static int check_backed(fo_file *f, const char *path, hid_t d, const fo_dataset *ds, size_t esz, fs_err *e)
{
    hid_t dcpl = H5Dget_create_plist(d);
    if (dcpl < 0) {
        char cause[256];
        return fs_errf(e, FS_E_INPUT, "%s: %s: unreadable layout: %s", FO_SHOW(f->path), FO_SHOW(path), h5_cause(cause));
    }
    H5D_layout_t lay = H5Pget_layout(dcpl);
    int ext = H5Pget_external_count(dcpl);
    H5Pclose(dcpl);
    if (lay != H5D_CONTIGUOUS && lay != H5D_CHUNKED && lay != H5D_COMPACT)
        return fs_errf(e, FS_E_INPUT, "%s: %s: storage layout %d is not supported (virtual dataset?)", FO_SHOW(f->path), FO_SHOW(path),
                       (int)lay);
    if (ext != 0)
        return fs_errf(e, FS_E_INPUT, "%s: %s: data in external files is not supported", FO_SHOW(f->path), FO_SHOW(path));
    double raw = (double)ds->numel * (double)esz;
    if (raw <= UNBACKED_SLACK) return FS_OK;
    double stored = (double)H5Dget_storage_size(d);
    if (stored > f->file_size)
        return fs_errf(e, FS_E_INPUT, "%s: %s: claims %.0f stored bytes in a file of %.0f bytes: corrupted", FO_SHOW(f->path),
                       path, stored, f->file_size);
    if (raw > MAX_INFLATE * stored)
        return fs_errf(e, FS_E_INPUT,
                       "%s: %s: shape claims %lld values (%.0f bytes) but only %.0f bytes are stored, more than "
                       "compression can expand: corrupted or never written",
                       FO_SHOW(f->path), FO_SHOW(path), (long long)ds->numel, raw, stored);
    return FS_OK;
}

/* Fills shape/numel/dtype from an open dataset. Returns 0, or an error. */
static int describe(fo_file *f, const char *path, hid_t d, fo_dataset *ds, fs_err *e)
{
    char cause[256];
    hid_t t = H5Dget_type(d), s = H5Dget_space(d);
    int rc = FS_OK;
    if (t < 0 || s < 0) {
        rc = fs_errf(e, FS_E_INPUT, "%s: %s: unreadable: %s", FO_SHOW(f->path), FO_SHOW(path), h5_cause(cause));
        goto out;
    }
    H5T_class_t cls = H5Tget_class(t);
    size_t sz = H5Tget_size(t);
    if (cls == H5T_FLOAT) {
        snprintf(ds->dtype, sizeof ds->dtype, "float%zu", 8 * sz);
    } else if (cls == H5T_INTEGER) {
        snprintf(ds->dtype, sizeof ds->dtype, "%sint%zu", H5Tget_sign(t) == H5T_SGN_NONE ? "u" : "", 8 * sz);
    } else {
        static const char *const names[] = {"integer", "float", "time", "string", "bitfield", "opaque",
                                            "compound", "reference", "enum", "vlen", "array"};
        rc = fs_errf(e, FS_E_INPUT, "%s: %s: datatype is %s, not a number", FO_SHOW(f->path), FO_SHOW(path),
                     cls >= 0 && (size_t)cls < FS_ARRAY_LEN(names) ? names[cls] : "unknown");
        goto out;
    }
    int nd = H5Sget_simple_extent_ndims(s);
    if (nd < 0 || nd > FO_MAX_DIMS) {
        rc = fs_errf(e, FS_E_INPUT, "%s: %s: rank %d not supported (at most %d)", FO_SHOW(f->path), FO_SHOW(path), nd, FO_MAX_DIMS);
        goto out;
    }
    hsize_t dims[FO_MAX_DIMS];
    H5Sget_simple_extent_dims(s, dims, NULL);
    ds->ndim = nd;
    ds->numel = H5Sget_simple_extent_type(s) == H5S_NULL ? 0 : 1;
    for (int i = 0; i < nd; i++) {
        ds->shape[i] = (int64_t)dims[i];
        if (dims[i] && (uint64_t)ds->numel > (uint64_t)INT64_MAX / 8 / dims[i]) {
            rc = fs_errf(e, FS_E_INPUT, "%s: %s: implausibly large dataset", FO_SHOW(f->path), FO_SHOW(path));
            goto out;
        }
        ds->numel *= (int64_t)dims[i];
    }
    rc = check_backed(f, path, d, ds, sz, e);
out:
    if (t >= 0) H5Tclose(t);
    if (s >= 0) H5Sclose(s);
    return rc;
}

static int open_dataset(fo_file *f, const char *path, hid_t *d, fs_err *e)
{
    char cause[256];
    int k = obj_kind(f->fid, path);
    if (k < 0) return fs_errf(e, FS_E_INPUT, "%s: %s: no such dataset", FO_SHOW(f->path), FO_SHOW(path));
    if (k != (int)H5I_DATASET) return fs_errf(e, FS_E_INPUT, "%s: %s: is a group, not a dataset", FO_SHOW(f->path), FO_SHOW(path));
    *d = H5Dopen2(f->fid, path, H5P_DEFAULT);
    if (*d < 0) return fs_errf(e, FS_E_INPUT, "%s: %s: cannot open: %s", FO_SHOW(f->path), FO_SHOW(path), h5_cause(cause));
    return FS_OK;
}

static int dataset_info(fo_file *f, const char *path, fo_dataset *ds, fs_err *e)
{
    hid_t d;
    int rc = open_dataset(f, path, &d, e);
    if (rc) return rc;
    rc = describe(f, path, d, ds, e);
    H5Dclose(d);
    return rc;
}

static int dataset_read(fo_file *f, const char *path, fo_dataset *ds, fs_err *e)
{
    char cause[256];
    hid_t d;
    int rc = open_dataset(f, path, &d, e);
    if (rc) return rc;
    if ((rc = describe(f, path, d, ds, e))) goto out;
    if ((size_t)ds->numel > ds->cap) {
        double *p = realloc(ds->data, (size_t)ds->numel * sizeof *p);
        if (!p) {
            rc = fs_errf(e, FS_E_NOMEM, "%s: %s: out of memory for %lld values", FO_SHOW(f->path), FO_SHOW(path), (long long)ds->numel);
            goto out;
        }
        ds->data = p;
        ds->cap = (size_t)ds->numel;
    }
    /* HDF5 converts any integer or float type to double while reading (and undoes shuffle and
     * deflate); hard-linked names are just other paths to the same dataset. */
    if (ds->numel && H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, ds->data) < 0)
        rc = fs_errf(e, FS_E_INPUT, "%s: %s: read failed: %s", FO_SHOW(f->path), FO_SHOW(path), h5_cause(cause));
out:
    H5Dclose(d);
    return rc;
}

int fo_dataset_info(fo_file *f, const char *path, fo_dataset *ds, fs_err *e)
{
    h5_enter(f->path, path);
    int rc = dataset_info(f, path, ds, e);
    h5_leave();
    return rc;
}

int fo_dataset_read(fo_file *f, const char *path, fo_dataset *ds, fs_err *e)
{
    h5_enter(f->path, path);
    int rc = dataset_read(f, path, ds, e);
    h5_leave();
    return rc;
}

void fo_dataset_free(fo_dataset *ds)
{
    if (!ds) return;
    free(ds->data);
    memset(ds, 0, sizeof *ds);
}

/* ---------- block-wise reading ---------- */

struct fo_stream {
    fo_file *f;
    char *path;
    hid_t d, fspace;
    int ndim;
    hsize_t dims[FO_MAX_DIMS];
    int k;            /* the axis blocks advance along: axes > k are read whole */
    hsize_t rows;     /* block length along axis k */
    hsize_t pos[FO_MAX_DIMS]; /* start of the next block (axes <= k) */
    int64_t numel, off;
    double *buf;
    size_t cap;
    /* Direct path: a contiguous, unfiltered little-endian IEEE float dataset (what flux-sim and
     * h5py write by default) is not read through HDF5 at all: each block is one pread at the
     * data's file offset into a buffer of the stored type, handed out as it is, float32 or
     * float64, with no conversion. HDF5's per-read selection and conversion machinery cost more
     * than the comparison itself. (Mapping the file instead was slower: unmapping each window
     * flushes the TLB of every thread, and the page faults cost what the copy saves.) */
    int direct;        /* 0, 4 (float32) or 8 (float64) */
    off_t base;        /* file offset of element 0 */
    void *raw;         /* one block as stored */
    size_t raw_cap;    /* bytes */
};

void fo_stream_close(fo_stream *s)
{
    if (!s) return;
    /* Direct streams hold no HDF5 handle and may be closed on another thread: no hook there
     * (the hook belongs to the HDF5 thread). */
    if (s->fspace >= 0 || s->d >= 0) {
        h5_enter(s->f->path, s->path);
        if (s->fspace >= 0) H5Sclose(s->fspace);
        if (s->d >= 0) H5Dclose(s->d);
        h5_leave();
    }
    free(s->raw);
    free(s->path);
    free(s->buf);
    free(s);
}

static int stream_open(fo_file *f, const char *path, int64_t block_elems, fo_stream **sp, fo_dataset *info, fs_err *e)
{
    char cause[256];
    *sp = NULL;
    fo_stream *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        return fs_errf(e, FS_E_NOMEM, "%s: %s: out of memory", FO_SHOW(f->path), FO_SHOW(path));
    }
    s->f = f;
    s->d = s->fspace = -1;
    if (block_elems < 1) block_elems = 1;
    int rc = FS_OK;
    fo_dataset ds = {0};
    /* Open once without a special access list to learn the layout, then reopen with a chunk
     * cache big enough that no chunk is inflated twice. */
    hid_t d0 = H5Dopen2(f->fid, path, H5P_DEFAULT);
    if (d0 < 0) {
        /* Only now ask why, so the common case costs one lookup. */
        int k0 = obj_kind(f->fid, path);
        if (k0 < 0) rc = fs_errf(e, FS_E_INPUT, "%s: %s: no such dataset", FO_SHOW(f->path), FO_SHOW(path));
        else if (k0 != (int)H5I_DATASET) rc = fs_errf(e, FS_E_INPUT, "%s: %s: is a group, not a dataset", FO_SHOW(f->path), FO_SHOW(path));
        else rc = fs_errf(e, FS_E_INPUT, "%s: %s: cannot open: %s", FO_SHOW(f->path), FO_SHOW(path), h5_cause(cause));
        goto fail;
    }
    if ((rc = describe(f, path, d0, &ds, e))) {
        H5Dclose(d0);
        goto fail;
    }
    s->ndim = ds.ndim;
    s->numel = ds.numel;
    for (int i = 0; i < ds.ndim; i++) s->dims[i] = (hsize_t)ds.shape[i];
    /* k: the outermost axis whose trailing rows (the product of the axes after it) fit a block.
     * An empty dataset (some axis 0) has no blocks at all: the row arithmetic below would divide
     * by its zero-length trailing rows. */
    if (ds.ndim && ds.numel > 0) {
        hsize_t inner = 1;
        s->k = ds.ndim - 1;
        for (int i = ds.ndim - 1; i > 0; i--) {
            hsize_t next = inner * s->dims[i];
            if (next > (hsize_t)block_elems) break;
            inner = next;
            s->k = i - 1;
        }
        s->rows = (hsize_t)block_elems / inner;
        if (s->rows < 1) s->rows = 1;
        if (s->rows > s->dims[s->k]) s->rows = s->dims[s->k];
    }
    hid_t dcpl = H5Dget_create_plist(d0);
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
    if (dcpl >= 0 && dapl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED && ds.ndim && ds.numel > 0) {
        hsize_t cd[FO_MAX_DIMS];
        int nd = H5Pget_chunk(dcpl, FO_MAX_DIMS, cd);
        hid_t t = H5Dget_type(d0);
        size_t esz = t >= 0 ? H5Tget_size(t) : 8;
        if (t >= 0) H5Tclose(t);
        if (nd == ds.ndim) {
            /* Chunks one block touches: all chunks across axes > k, the chunk rows along k that
             * `rows` spans (+1 for a partial one), one chunk along axes < k. */
            double chunk_bytes = (double)esz, nchunks = 1;
            for (int i = 0; i < nd; i++) chunk_bytes *= (double)cd[i];
            for (int i = s->k + 1; i < nd; i++) nchunks *= (double)((s->dims[i] + cd[i] - 1) / cd[i]);
            nchunks *= (double)((s->rows + cd[s->k] - 1) / cd[s->k] + 1);
            double bytes = chunk_bytes * nchunks;
            if (bytes < 1 << 20) bytes = 1 << 20;
            if (bytes > 4.0 * (1 << 30)) bytes = 4.0 * (1 << 30);
            H5Pset_chunk_cache(dapl, 12421, (size_t)bytes, 1.0);
        }
    }
    if (dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl) == 0 &&
        H5Pget_external_count(dcpl) == 0 && ds.numel > 0) {
        haddr_t at = H5Dget_offset(d0);
        hid_t t = H5Dget_type(d0);
        if (at != HADDR_UNDEF && t >= 0) {
            if (H5Tequal(t, H5T_IEEE_F32LE) > 0) s->direct = 4;
            else if (H5Tequal(t, H5T_IEEE_F64LE) > 0) s->direct = 8;
            s->base = (off_t)at;
        }
        if (t >= 0) H5Tclose(t);
        if (s->direct && f->raw_fd < 0 && (f->raw_fd = open(f->path, O_RDONLY | O_CLOEXEC)) < 0) s->direct = 0;
        /* A truncated file: say so now, naming the dataset, not at some block of it. */
        struct stat st;
        if (s->direct && fstat(f->raw_fd, &st) == 0 &&
            (double)s->base + (double)ds.numel * s->direct > (double)st.st_size) {
            rc = fs_errf(e, FS_E_INPUT, "%s: %s: the file ends inside the dataset (%lld bytes at offset %lld, file size %lld): truncated?",
                         FO_SHOW(f->path), FO_SHOW(path), (long long)ds.numel * s->direct, (long long)s->base, (long long)st.st_size);
            H5Pclose(dcpl);
            H5Dclose(d0);
            if (dapl >= 0) H5Pclose(dapl);
            goto fail;
        }
    }
    if (dcpl >= 0) H5Pclose(dcpl);
    H5Dclose(d0);
    /* The direct path reads the file itself: no HDF5 handle to keep. */
    s->d = s->direct ? -1 : H5Dopen2(f->fid, path, dapl >= 0 ? dapl : H5P_DEFAULT);
    if (dapl >= 0) H5Pclose(dapl);
    if (!s->direct && (s->d < 0 || (s->fspace = H5Dget_space(s->d)) < 0)) {
        rc = fs_errf(e, FS_E_INPUT, "%s: %s: cannot open: %s", FO_SHOW(f->path), FO_SHOW(path), h5_cause(cause));
        goto fail;
    }
    if (info) {
        info->ndim = ds.ndim;
        memcpy(info->shape, ds.shape, sizeof ds.shape);
        info->numel = ds.numel;
        memcpy(info->dtype, ds.dtype, sizeof ds.dtype);
    }
    *sp = s;
    return FS_OK;
fail:
    fo_stream_close(s);
    return rc;
}

int fo_stream_open(fo_file *f, const char *path, int64_t block_elems, fo_stream **sp, fo_dataset *info, fs_err *e)
{
    h5_enter(f->path, path);
    int rc = stream_open(f, path, block_elems, sp, info, e);
    h5_leave();
    return rc;
}

int fo_stream_direct(const fo_stream *s) { return s && s->direct; }

/* s->buf holds at least n doubles. */
static int grow_buf(fo_stream *s, int64_t n, fs_err *e)
{
    if ((size_t)n <= s->cap) return FS_OK;
    double *p = realloc(s->buf, (size_t)n * sizeof *p);
    if (!p) return fs_errf(e, FS_E_NOMEM, "%s: %s: out of memory for %lld values", FO_SHOW(s->f->path), FO_SHOW(s->path), (long long)n);
    s->buf = p;
    s->cap = (size_t)n;
    return FS_OK;
}

int fo_stream_view(fo_stream *s, fo_view *v, int64_t *off, int64_t *n, fs_err *e)
{
    char cause[256];
    int rc;
    *v = fo_view_f64(NULL);
    *off = s->off;
    *n = 0;
    if (s->off >= s->numel) return FS_OK;
    hsize_t start[FO_MAX_DIMS], count[FO_MAX_DIMS];
    int64_t cnt = 1;
    if (s->ndim == 0) {
        cnt = 1;
    } else {
        for (int i = 0; i < s->ndim; i++) {
            if (i < s->k) start[i] = s->pos[i], count[i] = 1;
            else if (i == s->k) {
                start[i] = s->pos[i];
                count[i] = s->rows < s->dims[i] - s->pos[i] ? s->rows : s->dims[i] - s->pos[i];
            } else start[i] = 0, count[i] = s->dims[i];
            cnt *= (int64_t)count[i];
        }
    }
    if (s->ndim) {
        /* Advance: along k, carrying into the outer axes like an odometer. */
        s->pos[s->k] += count[s->k];
        for (int i = s->k; i > 0 && s->pos[i] >= s->dims[i]; i--) {
            s->pos[i] = 0;
            s->pos[i - 1]++;
        }
    }
    if (s->direct) {
        /* Blocks are contiguous flat ranges, so a block is one pread, into a buffer of the
         * stored type that is handed out as it is. */
        size_t bytes = (size_t)cnt * (size_t)s->direct;
        if (bytes > s->raw_cap) {
            void *p = realloc(s->raw, bytes);
            if (!p) return fs_errf(e, FS_E_NOMEM, "%s: %s: out of memory for %lld values", FO_SHOW(s->f->path), FO_SHOW(s->path), (long long)cnt);
            s->raw = p;
            s->raw_cap = bytes;
        }
        off_t at = s->base + (off_t)s->off * s->direct;
        for (size_t got = 0; got < bytes;) {
            ssize_t k = pread(s->f->raw_fd, (char *)s->raw + got, bytes - got, at + (off_t)got);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0)
                return fs_errf(e, FS_E_INPUT, "%s: %s: read failed: %s", FO_SHOW(s->f->path), FO_SHOW(s->path),
                               k < 0 ? strerror(errno) : "file ends inside the dataset");
            got += (size_t)k;
        }
        *v = s->direct == 4 ? fo_view_f32(s->raw) : fo_view_f64(s->raw);
        *n = cnt;
        s->off += cnt;
        return FS_OK;
    }
    if ((rc = grow_buf(s, cnt, e))) return rc;
    herr_t r;
    h5_enter(s->f->path, s->path);
    if (s->ndim == 0) {
        r = H5Dread(s->d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, s->buf);
    } else {
        hsize_t m = (hsize_t)cnt;
        hid_t ms = H5Screate_simple(1, &m, NULL);
        r = ms < 0 ? -1 : H5Sselect_hyperslab(s->fspace, H5S_SELECT_SET, start, NULL, count, NULL);
        if (r >= 0) r = H5Dread(s->d, H5T_NATIVE_DOUBLE, ms, s->fspace, H5P_DEFAULT, s->buf);
        if (ms >= 0) H5Sclose(ms);
    }
    if (r < 0) fs_h5_cause(cause, sizeof cause);
    h5_leave();
    if (r < 0) return fs_errf(e, FS_E_INPUT, "%s: %s: read failed: %s", FO_SHOW(s->f->path), FO_SHOW(s->path), cause);
    *v = fo_view_f64(s->buf);
    *n = cnt;
    s->off += cnt;
    return FS_OK;
}

int fo_stream_next(fo_stream *s, const double **data, int64_t *off, int64_t *n, fs_err *e)
{
    fo_view v;
    *data = NULL;
    int rc = fo_stream_view(s, &v, off, n, e);
    if (rc || *n == 0) return rc;
    if (v.type == FO_V_F64) {
        *data = v.p;
        return FS_OK;
    }
    if ((rc = grow_buf(s, *n, e))) return rc;
    const float *x = v.p;
    for (int64_t i = 0; i < *n; i++) s->buf[i] = (double)x[i];
    *data = s->buf;
    return FS_OK;
}

/* ---------- completeness (fo_file_completeness) ---------- */

static int has_step(const fo_file *f, int step)
{
    int lo = 0, hi = f->nsteps - 1; /* step_no is ascending */
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (f->step_no[mid] == step) return 1;
        if (f->step_no[mid] < step) lo = mid + 1;
        else hi = mid - 1;
    }
    return 0;
}

/* 1 when step group i is whole by structure: an `order` whose names all exist and include
 * latents_out. Else 0 and the reason in why. -1 with e on an HDF5 error that is not about the
 * step's shape (out of memory, ...). */
static int step_whole(fo_file *f, int i, char *why, size_t wn, fs_err *e)
{
    const char *g = f->step_name[i];
    const int no = f->step_no[i];
    int has_order = 0;
    h5_enter(f->path, g);
    htri_t ex = H5Aexists_by_name(f->fid, g, "order", H5P_DEFAULT);
    h5_leave();
    has_order = ex > 0;
    if (!has_order) {
        snprintf(why, wn, "%s has no `order`: the producer stopped inside step %d", g + 1, no);
        return 0;
    }
    fo_names names = {0};
    fo_order_source src;
    int rc = fo_group_order(f, g, &names, &src, e);
    if (rc) return -1;
    int seen_out = 0, whole = 1;
    for (int k = 0; k < names.n && whole; k++) {
        char *p = fo_path_join(g, names.v[k]);
        if (!p) {
            fo_names_free(&names);
            fs_errf(e, FS_E_NOMEM, "%s: %s: out of memory", FO_SHOW(f->path), g);
            return -1;
        }
        if (!fo_is_dataset(f, p)) {
            snprintf(why, wn, "%s's `order` names %s, which the group does not hold: the producer stopped inside step %d",
                     g + 1, FO_SHOW(names.v[k]), no);
            whole = 0;
        }
        free(p);
        if (!strcmp(names.v[k], "latents_out")) seen_out = 1;
    }
    if (whole && !seen_out) {
        snprintf(why, wn, "%s's `order` has no latents_out: the producer stopped inside step %d", g + 1, no);
        whole = 0;
    }
    fo_names_free(&names);
    return whole;
}

int fo_file_completeness(fo_file *f, fo_completeness *c, fs_err *e)
{
    memset(c, 0, sizeof *c);
    c->last_step = f->nsteps ? f->step_no[f->nsteps - 1] : -1;
    c->steps_expected = -1;
    double mark = 0;
    int found = 0, rc;
    if ((rc = fo_attr_double(f, "/", "complete", &mark, &found, e))) return rc;
    c->has_marker = found;
    const int marked = found && mark == 1;
    char *rs = NULL;
    if ((rc = fo_attr_string(f, "/", "recorded_steps", &rs, e))) return rc;
    fo_steps promised = {0};
    char why[200];
    if (rs) {
        if (fo_steps_parse(rs, &promised, why, sizeof why)) {
            rc = fs_errf(e, FS_E_INPUT, "%s: attribute recorded_steps: %s", FO_SHOW(f->path), why);
            free(rs);
            return rc;
        }
        snprintf(c->recorded_steps, sizeof c->recorded_steps, "%.60s", rs);
        free(rs);
    } else {
        promised.all = 1;
        snprintf(c->recorded_steps, sizeof c->recorded_steps, "all");
    }
    /* The steps promised: recorded_steps' list, or 0..N-1 with N from /inputs/sigmas. Without
     * sigmas N is unknown: then 0..(the last step present), so a gap still shows. */
    int n_sig = -1;
    const char *basis = "recorded_steps";
    if (promised.all) {
        fo_dataset ds = {0};
        fs_err e2;
        if (fo_is_dataset(f, "/inputs/sigmas") && !fo_dataset_info(f, "/inputs/sigmas", &ds, &e2) && ds.ndim == 1 &&
            ds.shape[0] >= 1 && ds.shape[0] <= FO_STEPS_MAX)
            n_sig = (int)ds.shape[0] - 1;
        basis = n_sig >= 0 ? "/inputs/sigmas" : "the steps present";
    }
    int n_exp = promised.all ? (n_sig >= 0 ? n_sig : c->last_step + 1) : promised.n;
    c->steps_expected = n_exp;
    /* The first promised step the file lacks (-1: none). Found without looping over all promised
     * numbers: a damaged sigmas can promise a billion steps. */
    int missing = -1;
    if (promised.all) {
        int next = 0;
        for (int i = 0; i < f->nsteps && f->step_no[i] <= next; i++)
            if (f->step_no[i] == next) next++;
        if (next < n_exp) missing = next;
    } else {
        for (int k = 0; k < promised.n && missing < 0; k++)
            if (!has_step(f, promised.v[k])) missing = promised.v[k];
    }
    /* The first promised step present but not whole (files without the marker). */
    int broken = -1;
    for (int i = 0; i < f->nsteps; i++) {
        int step = f->step_no[i];
        if (i && step == f->step_no[i - 1]) continue; /* step_2 and step_0002: one number */
        if (promised.all ? step >= n_exp : !fo_steps_has(&promised, step)) continue;
        if (marked) { /* the marker vouches for the groups it promises */
            c->steps_present++;
            continue;
        }
        char w_why[480];
        int w = broken >= 0 ? 1 : step_whole(f, i, w_why, sizeof w_why, e);
        if (w < 0) {
            fo_steps_free(&promised);
            return e ? e->code : FS_E_INPUT;
        }
        if (w) c->steps_present++;
        else {
            broken = step;
            if (missing < 0 || step < missing) snprintf(c->reason, sizeof c->reason, "%s", w_why);
        }
    }
    c->complete = missing < 0 && broken < 0;
    if (missing >= 0 && (broken < 0 || missing < broken)) {
        if (marked)
            snprintf(c->reason, sizeof c->reason,
                     "step_%04d missing although the file is marked complete (%s promises %d steps)", missing, basis,
                     n_exp);
        else if (c->last_step < 0)
            snprintf(c->reason, sizeof c->reason,
                     "step_%04d missing: %s promises %d steps and the file holds none: the producer stopped before "
                     "step 0",
                     missing, basis, n_exp);
        else if (missing < c->last_step)
            snprintf(c->reason, sizeof c->reason, "step_%04d missing: %s promises %d steps, and later steps are present",
                     missing, basis, n_exp);
        else
            snprintf(c->reason, sizeof c->reason, "step_%04d missing: %s promises %d steps: the producer stopped after step %d",
                     missing, basis, n_exp, c->last_step);
    }
    fo_steps_free(&promised);
    if (found && !marked && c->complete) {
        c->complete = 0;
        snprintf(c->reason, sizeof c->reason, "the producer marked it incomplete (attribute complete = %g, not 1)",
                 mark);
    }
    if (!marked && c->complete && !fo_is_dataset(f, "/final/latents")) {
        c->complete = 0;
        snprintf(c->reason, sizeof c->reason, "no /final/latents: the producer stopped after step %d", c->last_step);
    }
    c->partial = !c->complete;
    return FS_OK;
}
