/* fs_dump.c — flux-dump v1 writer and /inputs reader (see fs_dump.h).
 *
 * The files must read exactly like the h5py-written reference dumps: strings are scalar
 * variable-length UTF-8 attributes (h5py gives `str`), `order` is a 1-D vlen UTF-8 array
 * (h5py gives an array of `str`), `version` is a 64-bit int, groups track link and attribute
 * creation order; datasets are contiguous, or (fs_dump_set_deflate > 0) datasets of >= 256
 * elements are one shuffle+deflate chunk.
 *
 * Reading goes through the oracle's reader (oracle/fo_dump.h) so that every consumer applies the
 * same format/version checks with the same messages. */
#include "fs_dump.h"

#include "fs_backend.h"
#include "fs_cleanup.h"
#include "fs_comm.h"

#include "fo_dump.h"
#include "fs_h5err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <hdf5.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define FS_DUMP_VERSION 1
/* The longest name (without the directory) a dump's temporary gets; see dump_create_fapl. */
#define FS_DUMP_TMP_NAME_MAX 128
/* Below this many elements a chunk index and filter pipeline cost more than they save; the
 * reference dumps use the same threshold. */
#define FS_DUMP_CHUNK_MIN 256
/* HDF5 refuses chunks of 4 GiB or more; stay well below so a huge dataset is split into a
 * few leading-dimension chunks instead of failing. */
#define FS_DUMP_CHUNK_MAX_BYTES ((hsize_t)1 << 30)
/* Activations are noise-like floats that deflate barely shrinks (the reference's level 9 reaches
 * 1.12:1). Measured on 400 MB of float32: uncompressed writes ~300 MB/s, level 1 40 MB/s to 81%
 * of the size, level 4 29 MB/s to 79%, level 9 13 MB/s to 78%. A dump must not cost 9x the
 * forward it records, so the default is no compression; fs_dump_set_deflate (flux-sim
 * --dump-compress) trades speed for ~20% of disk. */
#define FS_DUMP_DEFLATE_LEVEL 0

struct fs_dump {
    char *path, *tmp;
    fs_config cfg;
    fs_dtype dt;
    hid_t file;
    hid_t gcpl;      /* group creation: link + attribute creation order tracked and indexed */
    hid_t step;      /* open step group, or -1 */
    int step_no;
    int failed;      /* sticky: once a write failed, close refuses to publish the file */
    int deflate;     /* 0: no filters, every dataset contiguous; 1-9: shuffle + deflate level */
    int wrote_inputs, wrote_final;
    int registered;  /* tmp is in the cleanup registry (fs_cleanup.h) */
    int sealed;      /* fs_dump_seal succeeded: the file is complete and closed, not yet renamed */
    int have_id;     /* dev/ino of the temporary, taken when it was created (fs_dump_abort) */
    dev_t dev;
    ino_t ino;
    char modules_decl[FS_DUMP_DECL_MAX + 1]; /* each step's recorded_modules ("all" unless fs_dump_set_recorded_modules) */
    char **order;    /* dataset names of the open step, in recording order */
    int n_order, cap_order;
    const fs_group *g; /* parallel HDF5 over g, or NULL */
};

/* In a parallel dump, does this rank write whole datasets (inputs, /final, fs_dump_record)? */
static int writes_whole(const fs_dump *d) { return !d->g || d->g->rank == 0; }

/* ---------- HDF5 helpers ---------- */

/* The innermost HDF5 error description, as one clean line (fs_h5err.h). */
static const char *h5_cause(char buf[256]) { return fs_h5_cause(buf, 256); }

/* A variable-length UTF-8 C string type: what h5py uses for Python str. */
static hid_t vlen_utf8(void)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0) return t;
    if (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0 ||
        H5Tset_strpad(t, H5T_STR_NULLTERM) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

/* Writes (replacing) attribute `name` on `obj`: n strings as a 1-D array, or one string as a
 * scalar when scalar is set. */
static herr_t put_str_attr(hid_t obj, const char *name, const char *const *v, hsize_t n, int scalar)
{
    if (H5Aexists(obj, name) > 0 && H5Adelete(obj, name) < 0) return -1;
    hid_t t = vlen_utf8();
    hid_t s = scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, NULL);
    hid_t a = t >= 0 && s >= 0 ? H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT) : -1;
    herr_t r = a >= 0 ? H5Awrite(a, t, v) : -1;
    if (a >= 0) H5Aclose(a);
    if (s >= 0) H5Sclose(s);
    if (t >= 0) H5Tclose(t);
    return r;
}

static herr_t put_str(hid_t obj, const char *name, const char *value)
{
    return put_str_attr(obj, name, &value, 1, 1);
}

/* A scalar numeric attribute: file type `ftype` (little-endian, as numpy writes), value in
 * memory type `mtype`. */
static herr_t put_num(hid_t obj, const char *name, hid_t ftype, hid_t mtype, const void *v)
{
    if (H5Aexists(obj, name) > 0 && H5Adelete(obj, name) < 0) return -1;
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = s >= 0 ? H5Acreate2(obj, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT) : -1;
    herr_t r = a >= 0 ? H5Awrite(a, mtype, v) : -1;
    if (a >= 0) H5Aclose(a);
    if (s >= 0) H5Sclose(s);
    return r;
}

static herr_t put_f64(hid_t obj, const char *name, double v)
{
    return put_num(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}

/* bfloat16 is stored as float32 (exact; HDF5 has no bfloat16), as flux-dump says */
static hid_t file_type(fs_dtype dt) { return dt == FS_F64 ? H5T_IEEE_F64LE : H5T_IEEE_F32LE; }
static hid_t mem_type(fs_dtype dt) { return dt == FS_F64 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT; }

/* Marks the dump failed and returns an error: used for every failure after the file exists. */
#define DUMP_FAIL(d, ...) ((d)->failed = 1, fs_errf(__VA_ARGS__))

/* In a parallel dump, every rank learns whether any rank's part of a write failed, and all stop
 * at the same dataset with the first failing rank's message (fs_agree_error). HDF5's metadata
 * calls are collective: a rank that went on creating datasets after another rank's write failed
 * would leave each rank a different picture of the file, and the closing flush would then wait
 * forever in mismatched collectives (probe defect #3: a parallel dump to a full disk hung).
 * Serial dumps: rc unchanged. */
static int agree_write(fs_dump *d, int rc, fs_err *e)
{
    if (!d->g || d->g->size < 2) return rc;
    rc = fs_agree_error(d->g, rc, e);
    if (rc) d->failed = 1;
    return rc;
}

/* Why a write failed, as one line. HDF5's own text when it names the OS's reason (sec2: "file
 * write failed: ... No space left on device"). MPI-IO leaves no reason on HDF5's stack ("HDF5
 * error"): then a full file system is told by statvfs, and otherwise by the errno the failing
 * call left (`err`: errno cleared before the call, read right after it; 0 if none). */
static const char *io_cause(const fs_dump *d, int err, char buf[256])
{
    char h5[256];
    snprintf(h5, sizeof h5, "%s", h5_cause(buf));
    if (strstr(h5, "No space left") || strstr(h5, "Read-only") || strstr(h5, "Permission denied") ||
        strstr(h5, "Input/output error") || strstr(h5, "quota"))
        return buf;
    const char *why = NULL;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", d->tmp);
    struct statvfs sv;
    if (statvfs(dirname(dir), &sv) == 0 && sv.f_bavail == 0) why = "No space left on device (the file system is full)";
    else if (err) why = strerror(err);
    if (!why) return buf;
    if (!strcmp(h5, "HDF5 error")) snprintf(buf, 256, "%s", why);
    else snprintf(buf, 256, "%.120s: %s", h5, why);
    return buf;
}

/* One dataset `name` in `loc` (group path `where`, for messages) holding t, stored as `stored`
 * (HDF5 converts when t's dtype differs). */
static int write_dataset_piece(fs_dump *d, hid_t loc, const char *where, const char *name, const fs_tensor *t,
                               fs_dtype stored, const fs_shard *sh, const int64_t *gshape, int write, fs_err *e);
static int write_dataset(fs_dump *d, hid_t loc, const char *where, const char *name, const fs_tensor *t,
                         fs_dtype stored, fs_err *e)
{
    return write_dataset_piece(d, loc, where, name, t, stored, NULL, NULL, writes_whole(d), e);
}

/* File selection of a piece: the product of its intervals on the sharded axes, whole on the
 * others (a union of up to 2x2 blocks). Returns 0 and the number of selected elements. */
static int select_piece(hid_t space, int ndim, const hsize_t *dims, const fs_shard *sh, hsize_t *nsel)
{
    int n0 = 1, n1 = 1, a0 = -1, a1 = -1;
    if (sh && sh->ndims > 0) {
        a0 = sh->d[0].dim;
        n0 = sh->d[0].n;
    }
    if (sh && sh->ndims > 1) {
        a1 = sh->d[1].dim;
        n1 = sh->d[1].n;
    }
    *nsel = 0;
    int first = 1;
    for (int i = 0; i < n0; i++)
        for (int j = 0; j < n1; j++) {
            hsize_t start[FS_MAX_DIMS] = {0}, count[FS_MAX_DIMS];
            for (int k = 0; k < ndim; k++) count[k] = dims[k];
            if (a0 >= 0) {
                start[a0] = (hsize_t)sh->d[0].iv[i][0];
                count[a0] = (hsize_t)(sh->d[0].iv[i][1] - sh->d[0].iv[i][0]);
            }
            if (a1 >= 0) {
                start[a1] = (hsize_t)sh->d[1].iv[j][0];
                count[a1] = (hsize_t)(sh->d[1].iv[j][1] - sh->d[1].iv[j][0]);
            }
            hsize_t n = 1;
            for (int k = 0; k < ndim; k++) n *= count[k];
            if (n == 0) continue;
            if (H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start, NULL, count, NULL) < 0) return -1;
            first = 0;
            *nsel += n;
        }
    if (first) return H5Sselect_none(space) < 0 ? -1 : 0;
    return 0;
}

static int write_dataset_piece(fs_dump *d, hid_t loc, const char *where, const char *name, const fs_tensor *dev,
                               fs_dtype stored, const fs_shard *sh, const int64_t *gshape, int write, fs_err *e)
{
    char cause[256];
    int rc = FS_OK;
    hid_t space = -1, dcpl = -1, ds = -1;
    /* the recorder downloads what it writes (a view, no copy, when the tensor is host-addressable) */
    fs_tensor host = *dev;
    host.owns = 0;
    hsize_t dims[FS_MAX_DIMS] = {0}, chunk[FS_MAX_DIMS] = {0};
    const int64_t numel = fs_tensor_numel(dev);
    /* what can fail before the collective H5Dcreate: agreed first, so that no rank creates a
     * dataset another skipped */
    if (dev->ndim < 1 || dev->ndim > FS_MAX_DIMS) {
        rc = DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: %s/%s: tensor rank %d out of range 1..%d", d->tmp, where, name,
                       dev->ndim, FS_MAX_DIMS);
        goto agree;
    }
    for (int i = 0; i < dev->ndim; i++) chunk[i] = dims[i] = (hsize_t)(gshape ? gshape[i] : dev->shape[i]);
    if (numel > 0 && !dev->data) {
        rc = DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: %s/%s: tensor has no data", d->tmp, where, name);
        goto agree;
    }
    if (write && numel > 0 && fs_tensor_host_view(dev, &host, e)) {
        d->failed = 1;
        rc = fs_err_prefix(e, "%s: %s/%s: ", d->tmp, where, name);
        host = (fs_tensor){0};
        goto agree;
    }
    if (write && numel > 0 && host.dtype == FS_BF16) { /* widened to float32 (exact) for writing */
        fs_tensor wide = {0};
        rc = fs_tensor_alloc(&wide, FS_F32, host.ndim, host.shape, e);
        if (!rc) rc = fs_tensor_copy(&wide, &host, e);
        fs_tensor_free(&host);
        host = wide;
        if (rc) {
            d->failed = 1;
            fs_err_prefix(e, "%s: %s/%s: ", d->tmp, where, name);
        }
    }
agree:
    if ((rc = agree_write(d, rc, e))) goto out;
    const fs_tensor *t = &host;

    errno = 0; /* what the OS says about a failing write below (io_cause) */
    space = H5Screate_simple(t->ndim, dims, NULL);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (space < 0 || dcpl < 0) goto h5fail;
    if (d->deflate > 0 && numel >= FS_DUMP_CHUNK_MIN) {
        /* One chunk = the whole dataset (a reader wants all of it anyway), halved along the
         * leading dimensions only if it would exceed HDF5's chunk size limit. */
        size_t esz = H5Tget_size(file_type(stored));
        for (;;) {
            hsize_t bytes = esz;
            for (int i = 0; i < t->ndim; i++) bytes *= chunk[i];
            if (bytes <= FS_DUMP_CHUNK_MAX_BYTES) break;
            int i = 0;
            while (i < t->ndim - 1 && chunk[i] == 1) i++;
            if (chunk[i] == 1) break;
            chunk[i] = (chunk[i] + 1) / 2;
        }
        if (H5Pset_chunk(dcpl, t->ndim, chunk) < 0 || H5Pset_shuffle(dcpl) < 0 ||
            H5Pset_deflate(dcpl, (unsigned)d->deflate) < 0)
            goto h5fail;
    }
    /* Every element is written right away: filling with zeros first would be wasted work. */
    if (H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0) goto h5fail;
    ds = H5Dcreate2(loc, name, file_type(stored), space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (ds < 0) goto h5fail;
    if (!gshape) {
        if (write && numel > 0 && H5Dwrite(ds, mem_type(t->dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data) < 0) goto h5fail;
    } else if (write && numel > 0) {
        /* the local tensor's elements, in order, are the selection's elements in file order
         * (row-major), because every interval list is ascending */
        hsize_t nsel = 0, mdim;
        if (select_piece(space, t->ndim, dims, sh, &nsel) < 0) goto h5fail;
        if ((int64_t)nsel != numel) {
            rc = DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: %s/%s: piece selects %llu elements, tensor has %lld", d->tmp, where,
                           name, (unsigned long long)nsel, (long long)numel);
            goto out;
        }
        mdim = (hsize_t)numel;
        hid_t mspace = H5Screate_simple(1, &mdim, NULL);
        herr_t w = mspace < 0 ? -1 : H5Dwrite(ds, mem_type(t->dtype), mspace, space, H5P_DEFAULT, t->data);
        if (mspace >= 0) H5Sclose(mspace);
        if (w < 0) goto h5fail;
    }
    goto out;
h5fail:
    rc = DUMP_FAIL(d, e, FS_E_IO, "%s: %s/%s: write failed: %s", d->tmp, where, name, io_cause(d, errno, cause));
out:
    if (ds >= 0) H5Dclose(ds);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (space >= 0) H5Sclose(space);
    fs_tensor_free(&host);
    /* every rank: the write just done, agreed (a no-op for a serial dump) */
    return agree_write(d, rc, e);
}

/* ---------- /inputs shapes, shared by the writer and the reader ---------- */

/* IN_CFG and after: true CFG's negative prompt (optional; all or none) and its scale */
/* IN_RLAT, IN_RIDS: FLUX.2 reference images through the KV cache (optional; both or none) */
enum { IN_HS, IN_EHS, IN_POOLED, IN_IMG, IN_TXT, IN_GUID, IN_SIG, IN_TS, IN_CFG, IN_NEHS, IN_NPOOLED, IN_NTXT,
       IN_RLAT, IN_RIDS, IN_N };
static const char *const in_names[IN_N] = {"hidden_states", "encoder_hidden_states", "pooled_projections",
                                           "img_ids",       "txt_ids",               "guidance",
                                           "sigmas",        "timesteps",             "true_cfg_scale",
                                           "negative_encoder_hidden_states", "negative_pooled_projections",
                                           "negative_txt_ids", "image_latents", "image_latent_ids"};

typedef struct in_shape {
    int present;
    int ndim;
    int64_t shape[FO_MAX_DIMS];
} in_shape;

typedef struct in_sizes {
    int B, S_img, S_txt, n, S_neg, S_ref;
} in_sizes;

/* Checks the /inputs datasets against the config and each other (B from hidden_states, S_txt
 * from encoder_hidden_states, N from timesteps) and returns those sizes. `origin` starts every
 * message (a file name). */
static int check_inputs(const fs_config *c, const in_shape *s, const char *origin, in_sizes *z, fs_err *e)
{
    const int f2 = c->family == FS_FLUX2, nax = fs_config_axes(c);
    for (int k = 0; k < IN_CFG; k++) {
        if (k == IN_GUID || (f2 && k == IN_POOLED)) continue;
        if (!s[k].present)
            return fs_errf(e, FS_E_INPUT, "%s: /inputs/%s missing: this dump cannot be replayed", origin, in_names[k]);
    }
    /* FLUX.2 has no pooled text vector: one in a FLUX.2 dump means the config and the inputs are
     * of different models */
    if (f2 && s[IN_POOLED].present)
        return fs_errf(e, FS_E_INPUT, "%s: /inputs/pooled_projections present, but the config is FLUX.2 (%s), which has "
                                      "none (wrong config?)", origin, fs_config_class_name(c));
    if (c->guidance_embeds && !s[IN_GUID].present)
        return fs_errf(e, FS_E_INPUT, "%s: /inputs/guidance missing, but the config has guidance_embeds = true", origin);
    if (!c->guidance_embeds && s[IN_GUID].present)
        return fs_errf(e, FS_E_INPUT,
                       "%s: /inputs/guidance present, but the config has guidance_embeds = false (wrong config?)",
                       origin);
    /* true CFG: the scale and the negative prompt come together (FLUX.2: no pooled vector) */
    const int cfg = s[IN_CFG].present;
    for (int k = IN_NEHS; k <= IN_NTXT; k++) {
        const int wanted = cfg && !(f2 && k == IN_NPOOLED);
        if (wanted && !s[k].present)
            return fs_errf(e, FS_E_INPUT, "%s: /inputs/true_cfg_scale present but /inputs/%s missing: this dump cannot be "
                                          "replayed", origin, in_names[k]);
        if (!wanted && s[k].present)
            return fs_errf(e, FS_E_INPUT, "%s: /inputs/%s present without %s", origin, in_names[k],
                           cfg ? "a pooled vector in FLUX.2 (wrong config?)" : "/inputs/true_cfg_scale");
    }
    /* reference images: latents and ids together, FLUX.2 only (the KV cache is Flux2's) */
    if (s[IN_RLAT].present != s[IN_RIDS].present)
        return fs_errf(e, FS_E_INPUT, "%s: /inputs/%s present without /inputs/%s", origin,
                       in_names[s[IN_RLAT].present ? IN_RLAT : IN_RIDS], in_names[s[IN_RLAT].present ? IN_RIDS : IN_RLAT]);
    if (s[IN_RLAT].present && !f2)
        return fs_errf(e, FS_E_INPUT, "%s: /inputs/image_latents (reference images, FLUX.2's KV cache) present, but the "
                                      "config is FLUX.1 (%s)", origin, fs_config_class_name(c));
    static const int rank[IN_N] = {3, 3, 2, 2, 2, 1, 1, 1, 1, 3, 2, 2, 3, 2};
    static const char *const sym[IN_N][3] = {
        {"B", "S_img", "in_channels"}, {"B", "S_txt", "joint_attention_dim"}, {"B", "pooled_projection_dim"},
        {"S_img", "axes"}, {"S_txt", "axes"}, {"B"}, {"N+1"}, {"N"}, {"1"},
        {"B", "S_neg", "joint_attention_dim"}, {"B", "pooled_projection_dim"}, {"S_neg", "axes"},
        {"B", "S_ref", "in_channels"}, {"S_ref", "axes"}};
    char symstr[IN_N][96];
    for (int k = 0; k < IN_N; k++) {
        size_t o = 0;
        for (int i = 0; i < rank[k]; i++)
            o += (size_t)snprintf(symstr[k] + o, sizeof symstr[k] - o, "%s%s", i ? ", " : "", sym[k][i]);
    }
    for (int k = 0; k < IN_N; k++)
        if (s[k].present && s[k].ndim != rank[k])
            return fs_errf(e, FS_E_INPUT, "%s: /inputs/%s has rank %d, expected %d ([%s])", origin, in_names[k],
                           s[k].ndim, rank[k], symstr[k]);
    int64_t B = s[IN_HS].shape[0], Si = s[IN_HS].shape[1], St = s[IN_EHS].shape[1], N = s[IN_TS].shape[0];
    if (B < 1 || Si < 1 || St < 1 || N < 1 || B > INT32_MAX || Si > INT32_MAX || St > INT32_MAX || N > INT32_MAX)
        return fs_errf(e, FS_E_INPUT, "%s: /inputs sizes B=%lld S_img=%lld S_txt=%lld N=%lld must all be >= 1", origin,
                       (long long)B, (long long)Si, (long long)St, (long long)N);
    const int64_t Sn = s[IN_NEHS].present && s[IN_NEHS].ndim == 3 ? s[IN_NEHS].shape[1] : 0;
    if (cfg && (Sn < 1 || Sn > INT32_MAX))
        return fs_errf(e, FS_E_INPUT, "%s: /inputs/negative_encoder_hidden_states has %lld tokens, must be >= 1", origin,
                       (long long)Sn);
    const int64_t Sr = s[IN_RLAT].present && s[IN_RLAT].ndim == 3 ? s[IN_RLAT].shape[1] : 0;
    if (s[IN_RLAT].present && (Sr < 1 || Sr > INT32_MAX))
        return fs_errf(e, FS_E_INPUT, "%s: /inputs/image_latents has %lld tokens, must be >= 1", origin, (long long)Sr);
    const int64_t want[IN_N][3] = {
        {B, Si, c->in_channels}, {B, St, c->joint_attention_dim}, {B, c->pooled_projection_dim}, {Si, nax}, {St, nax},
        {B},                     {N + 1},                         {N},
        {1},                     {B, Sn, c->joint_attention_dim}, {B, c->pooled_projection_dim}, {Sn, nax},
        {B, Sr, c->in_channels}, {Sr, nax},
    };
    for (int k = 0; k < IN_N; k++) {
        if (!s[k].present) continue;
        for (int i = 0; i < rank[k]; i++) {
            if (s[k].shape[i] == want[k][i]) continue;
            /* Say where the expected size came from: with several datasets disagreeing, the one
             * named first is not necessarily the wrong one. */
            const char *l = sym[k][i], *from = "the config";
            if (!strcmp(l, "B") || !strcmp(l, "S_img")) from = "/inputs/hidden_states";
            else if (!strcmp(l, "S_txt")) from = "/inputs/encoder_hidden_states";
            else if (!strcmp(l, "S_neg")) from = "/inputs/negative_encoder_hidden_states";
            else if (!strcmp(l, "S_ref")) from = "/inputs/image_latents";
            else if (l[0] == 'N') from = "/inputs/timesteps", l = "N";
            else if (!strcmp(l, "axes")) from = "the config's axes_dims_rope", l = "axes";
            char got[96], exp[96], why[96] = "";
            fo_shape_str(s[k].ndim, s[k].shape, got, sizeof got);
            fo_shape_str(rank[k], want[k], exp, sizeof exp);
            if (from) snprintf(why, sizeof why, " (%s from %s)", l, from);
            return fs_errf(e, FS_E_INPUT, "%s: /inputs/%s has shape %s, expected [%s] = %s%s", origin, in_names[k], got,
                           symstr[k], exp, why);
        }
    }
    *z = (in_sizes){(int)B, (int)Si, (int)St, (int)N, (int)Sn, (int)Sr};
    return FS_OK;
}

static const fs_tensor *input_tensor(const fs_inputs *in, int k)
{
    static const fs_tensor none = {0}; /* IN_CFG: a scalar of fs_inputs, written and read apart */
    switch (k) {
    case IN_CFG: return &none;
    case IN_NEHS: return &in->negative_encoder_hidden_states;
    case IN_NPOOLED: return &in->negative_pooled_projections;
    case IN_NTXT: return &in->negative_txt_ids;
    case IN_RLAT: return &in->image_latents;
    case IN_RIDS: return &in->image_latent_ids;
    case IN_HS: return &in->hidden_states;
    case IN_EHS: return &in->encoder_hidden_states;
    case IN_POOLED: return &in->pooled_projections;
    case IN_IMG: return &in->img_ids;
    case IN_TXT: return &in->txt_ids;
    case IN_GUID: return &in->guidance;
    case IN_SIG: return &in->sigmas;
    default: return &in->timesteps;
    }
}

/* ---------- writer ---------- */

/* The one place a dump file is created. `fapl` decides the driver: default (sec2) for a serial
 * run; an MPI-IO fapl for the parallel writer to come. */
/* This host's name as temporaries carry it: the first label of gethostname(), characters other
 * than letters, digits, '-' and '_' as '_', at most FS_DUMP_HOST_MAX characters. A temporary
 * names its writer (pid and host), so a later run or `flux-sim --clean` can tell a temporary
 * whose writer was killed with SIGKILL (no handler ran) from one being written right now. */
#define FS_DUMP_HOST_MAX 32
static const char *host_token(char *buf, size_t n)
{
    char h[256] = "";
    if (gethostname(h, sizeof h - 1) != 0 || !h[0]) snprintf(h, sizeof h, "localhost");
    size_t o = 0;
    for (size_t i = 0; h[i] && h[i] != '.' && o + 1 < n && o < FS_DUMP_HOST_MAX; i++) {
        const char c = h[i];
        buf[o++] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ? c : '_';
    }
    buf[o] = 0;
    if (!o) snprintf(buf, n, "localhost");
    return buf;
}

/* The temporary of `path` written by process `pid` on `host`: "<name>.tmp.<pid>.<host>" beside
 * it. A long name is cut so that the temporary's name stays at most FS_DUMP_TMP_NAME_MAX
 * characters: pid and host keep it unique, and the final name is the user's. A 250-character
 * name failed with "File name too long" (probe #18: the suffix passed NAME_MAX), and Open MPI
 * 4.1's MPI-IO aborts (a buffer overflow in its shared-file-pointer components, which build
 * "<session dir>/<name>_cid-..." in a fixed buffer) on a parallel dump whose temporary's name is
 * over ~210 characters. */
static void tmp_name(const char *path, long pid, const char *host, char *out, size_t n)
{
    char suffix[64];
    snprintf(suffix, sizeof suffix, ".tmp.%ld.%s", pid, host);
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t keep = strlen(base);
    if (keep + strlen(suffix) > FS_DUMP_TMP_NAME_MAX) keep = FS_DUMP_TMP_NAME_MAX - strlen(suffix);
    snprintf(out, n, "%.*s%.*s%s", (int)(base - path), path, (int)keep, base, suffix);
}

/* Is process `pid` of this host still running? A zombie (killed, not yet reaped: PID 1 of a
 * container often never reaps) is not. */
static int pid_running(long pid)
{
    if (pid <= 0 || pid > 0x7fffffffL) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno != EPERM) return 0;
    char p[64], buf[512];
    snprintf(p, sizeof p, "/proc/%ld/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f) return 1; /* no /proc: trust kill(2) */
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[k] = 0;
    const char *rp = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces and parens */
    return !(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
}

/* "<anything>.tmp.<digits>.<host token>": *pid and host (a pointer into name) when it is. */
static int parse_tmp(const char *name, long *pid, const char **host)
{
    const char *t = NULL;
    for (const char *q = strstr(name, ".tmp."); q; q = strstr(q + 1, ".tmp.")) t = q;
    if (!t || t == name) return 0;
    const char *d = t + 5, *p = d;
    while (*p >= '0' && *p <= '9') p++;
    if (p == d || p - d > 10 || *p != '.' || !p[1]) return 0;
    for (const char *h = p + 1; *h; h++)
        if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') || (*h >= '0' && *h <= '9') || *h == '-' || *h == '_'))
            return 0;
    *pid = strtol(d, NULL, 10);
    *host = p + 1;
    return 1;
}

/* A file a dump writer leaves: empty (created by open(2), killed before HDF5 wrote) or an HDF5
 * file (its signature at offset 0). Anything else is not ours to delete. */
static int looks_like_dump_tmp(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    if (st.st_size == 0) return 1;
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char b[8];
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW), ok = 0;
    if (fd >= 0) {
        ok = read(fd, b, sizeof b) == (ssize_t)sizeof b && !memcmp(b, sig, sizeof sig);
        close(fd);
    }
    return ok;
}

int fs_dump_remove_stale(const char *path, fs_dump_stale_fn fn, void *ctx)
{
    char host[64], dir[4096], full[8192], want[4096];
    host_token(host, sizeof host);
    struct stat st;
    const int whole_dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    int here = 0; /* a bare file name: the temporaries are named bare too */
    if (whole_dir) snprintf(dir, sizeof dir, "%s", path);
    else {
        const char *slash = strrchr(path, '/');
        if (!slash) here = 1, snprintf(dir, sizeof dir, ".");
        else if (slash == path) snprintf(dir, sizeof dir, "/");
        else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    }
    DIR *dp = opendir(dir);
    if (!dp) return -1;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        long pid;
        const char *h;
        if (!parse_tmp(de->d_name, &pid, &h)) continue;
        if (here) snprintf(full, sizeof full, "%s", de->d_name);
        else snprintf(full, sizeof full, "%s/%s", dir, de->d_name);
        if (!whole_dir) { /* exactly the temporary this path gets from that writer */
            tmp_name(path, pid, h, want, sizeof want);
            const char *wb = strrchr(want, '/');
            if (strcmp(wb ? wb + 1 : want, de->d_name)) continue;
        }
        char why[160];
        if (strcmp(h, host)) {
            snprintf(why, sizeof why, "written on host %s: only a run there can tell whether its writer is alive", h);
            if (fn) fn(ctx, full, 0, why);
            continue;
        }
        if (pid == (long)getpid() || pid_running(pid)) {
            snprintf(why, sizeof why, "its writer, process %ld, is running", pid);
            if (fn) fn(ctx, full, 0, why);
            continue;
        }
        if (!looks_like_dump_tmp(full)) {
            if (fn) fn(ctx, full, 0, "not an HDF5 file: left alone");
            continue;
        }
        if (unlink(full) == 0) {
            removed++;
            snprintf(why, sizeof why, "its writer, process %ld, is gone", pid);
            if (fn) fn(ctx, full, 1, why);
        } else if (errno != ENOENT) {
            snprintf(why, sizeof why, "cannot remove it: %s", strerror(errno));
            if (fn) fn(ctx, full, 0, why);
        }
    }
    closedir(dp);
    return removed;
}

static int dump_create_fapl(fs_dump **dp, const char *path, const fs_config *cfg, fs_dtype dt, const char *producer,
                            hid_t fapl, const fs_group *g, long pid, const char *host, fs_err *e)
{
    char cause[256];
    *dp = NULL;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* our errors are one line; HDF5 must not print */
    int rc = fs_config_validate(cfg, path, e);
    if (rc) return rc;

    fs_dump *d = calloc(1, sizeof *d);
    if (!d) return fs_errf(e, FS_E_NOMEM, "%s: out of memory", path);
    d->file = d->gcpl = d->step = -1;
    d->cfg = *cfg;
    d->dt = dt;
    d->deflate = FS_DUMP_DEFLATE_LEVEL;
    size_t n = strlen(path) + 96;
    d->path = strdup(path);
    d->tmp = malloc(n);
    if (!d->path || !d->tmp) {
        free(d->path);
        free(d->tmp);
        free(d);
        return fs_errf(e, FS_E_NOMEM, "%s: out of memory", path);
    }
    tmp_name(path, pid, host, d->tmp, n);
    d->g = g;

    /* A directory at the final path would only fail at the rename, after the whole run. */
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        rc = fs_errf(e, FS_E_INPUT, "%s: cannot create dump: is a directory", path);
        free(d->path);
        free(d->tmp);
        free(d);
        return rc;
    }

    /* Create the file with open(2) first: HDF5 reports a missing directory or a read-only one
     * only as "unable to open file", and the user needs the OS's reason. In a parallel dump rank
     * 0 does it and every rank learns the outcome (H5Fcreate is collective). */
    int ok = 1, fd = -1;
    char why[256] = "";
    if (!g || g->rank == 0) {
        /* temporaries of this path whose writer was killed with SIGKILL (no handler ran) and is
         * gone from this host: removed by the next run that writes the path */
        fs_dump_remove_stale(path, NULL, NULL);
        fd = open(d->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666);
        if (fd < 0) {
            ok = 0;
            snprintf(why, sizeof why, "%s", strerror(errno));
        } else close(fd);
    }
    if (g) {
        fs_bcast(g, 0, &ok, sizeof ok);
        fs_bcast(g, 0, why, sizeof why);
    }
    if (!ok) {
        rc = fs_errf(e, FS_E_IO, "%s: cannot create dump (temporary %s): %s", path, d->tmp, why);
        free(d->path);
        free(d->tmp);
        free(d);
        return rc;
    }
    /* from here until the rename, a process that dies deletes it (every rank of a parallel dump
     * knows the name, so any of them can) */
    if (fs_cleanup_add(d->tmp) == 0) d->registered = 1;

    char *json = NULL;
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    d->gcpl = H5Pcreate(H5P_GROUP_CREATE);
    const unsigned crt = H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED;
    /* Creation order tracked like h5py's track_order=True: a reader without `order` (h5dump,
     * h5py iteration) still sees datasets in execution order. */
    if (fcpl < 0 || d->gcpl < 0 || H5Pset_link_creation_order(fcpl, crt) < 0 ||
        H5Pset_attr_creation_order(fcpl, crt) < 0 || H5Pset_link_creation_order(d->gcpl, crt) < 0 ||
        H5Pset_attr_creation_order(d->gcpl, crt) < 0)
        goto h5fail;
    d->file = H5Fcreate(d->tmp, H5F_ACC_TRUNC, fcpl, fapl);
    if (d->file < 0) goto h5fail;
    struct stat fst; /* which file this is, for fs_dump_abort (every rank: each has it open) */
    if (stat(d->tmp, &fst) == 0) {
        d->dev = fst.st_dev;
        d->ino = fst.st_ino;
        d->have_id = 1;
    }
    int64_t version = FS_DUMP_VERSION;
    json = fs_config_to_json(cfg);
    if (!json) {
        rc = fs_errf(e, FS_E_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    if (put_str(d->file, "format", "flux-dump") < 0 ||
        put_num(d->file, "version", H5T_STD_I64LE, H5T_NATIVE_INT64, &version) < 0 ||
        put_str(d->file, "producer", producer ? producer : "flux-sim") < 0 ||
        put_str(d->file, "dtype", fs_dtype_name(dt)) < 0 || put_str(d->file, "config", json) < 0)
        goto h5fail;
    free(json);
    H5Pclose(fcpl);
    *dp = d;
    return FS_OK;
h5fail:
    rc = fs_errf(e, FS_E_IO, "%s: cannot create dump (temporary %s): %s", path, d->tmp, h5_cause(cause));
fail:
    free(json);
    if (fcpl >= 0) H5Pclose(fcpl);
    fs_dump_abort(d);
    return rc;
}

int fs_dump_create(fs_dump **d, const char *path, const fs_config *cfg, fs_dtype dt, const char *producer, fs_err *e)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    /* STRONG: closing the file closes whatever is still open in it, so an abort after an error
     * in the middle of a write cannot leak handles or keep the file open. */
    if (fapl < 0 || H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0) {
        char cause[256];
        if (fapl >= 0) H5Pclose(fapl);
        *d = NULL;
        return fs_errf(e, FS_E_INTERNAL, "%s: cannot set up HDF5: %s", path, h5_cause(cause));
    }
    char host[64];
    int rc = dump_create_fapl(d, path, cfg, dt, producer, fapl, NULL, (long)getpid(), host_token(host, sizeof host), e);
    H5Pclose(fapl);
    return rc;
}

int fs_dump_create_parallel(fs_dump **d, const char *path, const fs_group *g, const fs_config *cfg, fs_dtype dt,
                            const char *producer, fs_err *e)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    long pid = (long)getpid(); /* the temporary name is rank 0's: its pid and host */
    char host[64];
    host_token(host, sizeof host);
    fs_bcast(g, 0, &pid, sizeof pid);
    fs_bcast(g, 0, host, sizeof host);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || fs_comm_set_fapl_mpio(g, fapl) < 0) {
        char cause[256];
        if (fapl >= 0) H5Pclose(fapl);
        *d = NULL;
        return fs_errf(e, FS_E_INTERNAL, "%s: cannot set up parallel HDF5 (MPI-IO): %s", path, h5_cause(cause));
    }
    int rc = dump_create_fapl(d, path, cfg, dt, producer, fapl, g, pid, host, e);
    H5Pclose(fapl);
    return rc;
}

const char *fs_dump_tmp_path(const fs_dump *d) { return d ? d->tmp : NULL; }

int fs_dump_set_deflate(fs_dump *d, int level, fs_err *e)
{
    if (!d) return fs_errf(e, FS_E_INTERNAL, "set deflate on a NULL dump");
    if (level < 0 || level > 9)
        return fs_errf(e, FS_E_INPUT, "%s: deflate level %d out of range 0..9", d->path, level);
    if (level > 0 && d->g && d->g->size > 1)
        return fs_errf(e, FS_E_INPUT, "%s: --dump-compress is not available for a parallel dump (HDF5 filters need "
                                      "collective writes); compress afterwards with h5repack", d->path);
    d->deflate = level;
    return FS_OK;
}

static int check_usable(fs_dump *d, const char *what, fs_err *e)
{
    if (!d) return fs_errf(e, FS_E_INTERNAL, "%s on a NULL dump", what);
    if (d->failed)
        return fs_errf(e, FS_E_IO, "%s: %s after an earlier write failed; the dump will not be published", d->tmp,
                       what);
    return FS_OK;
}

static int check_root_attr_name(fs_dump *d, const char *name, fs_err *e)
{
    if (!name || !*name || !strcmp(name, "format") || !strcmp(name, "version") || !strcmp(name, "complete"))
        return fs_errf(e, FS_E_INTERNAL, "%s: root attribute '%s' is reserved or empty", d->tmp, name ? name : "");
    return FS_OK;
}

int fs_dump_set_recorded_modules(fs_dump *d, const char *decl, fs_err *e)
{
    int rc = check_usable(d, "set recorded_modules", e);
    if (rc) return rc;
    if (strlen(decl) >= sizeof d->modules_decl)
        return DUMP_FAIL(d, e, FS_E_INPUT, "%s: module selection longer than %zu characters", d->tmp,
                         sizeof d->modules_decl - 1);
    snprintf(d->modules_decl, sizeof d->modules_decl, "%s", decl);
    return FS_OK;
}

int fs_dump_set_attr_string(fs_dump *d, const char *name, const char *value, fs_err *e)
{
    char cause[256];
    int rc = check_usable(d, "set attribute", e);
    if (rc || (rc = check_root_attr_name(d, name, e))) return rc;
    if (put_str(d->file, name, value ? value : "") < 0)
        return DUMP_FAIL(d, e, FS_E_IO, "%s: attribute %s: write failed: %s", d->tmp, name, h5_cause(cause));
    return FS_OK;
}

int fs_dump_set_attr_int(fs_dump *d, const char *name, int64_t value, fs_err *e)
{
    char cause[256];
    int rc = check_usable(d, "set attribute", e);
    if (rc || (rc = check_root_attr_name(d, name, e))) return rc;
    if (put_num(d->file, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value) < 0)
        return DUMP_FAIL(d, e, FS_E_IO, "%s: attribute %s: write failed: %s", d->tmp, name, h5_cause(cause));
    return FS_OK;
}

int fs_dump_set_attr_double(fs_dump *d, const char *name, double value, fs_err *e)
{
    char cause[256];
    int rc = check_usable(d, "set attribute", e);
    if (rc || (rc = check_root_attr_name(d, name, e))) return rc;
    if (put_f64(d->file, name, value) < 0)
        return DUMP_FAIL(d, e, FS_E_IO, "%s: attribute %s: write failed: %s", d->tmp, name, h5_cause(cause));
    return FS_OK;
}

int fs_dump_write_inputs(fs_dump *d, const fs_inputs *in, fs_err *e)
{
    char cause[256];
    int rc = check_usable(d, "write inputs", e);
    if (rc) return rc;
    if (d->wrote_inputs) return DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: /inputs written twice", d->tmp);
    /* The same checks a replay will apply, so we never write inputs we could not read back. */
    in_shape s[IN_N] = {{0}};
    for (int k = 0; k < IN_N; k++) {
        const fs_tensor *t = input_tensor(in, k);
        s[k].present = k == IN_GUID ? in->has_guidance : t->data != NULL;
        s[k].ndim = t->ndim;
        for (int i = 0; i < t->ndim && i < FS_MAX_DIMS; i++) s[k].shape[i] = t->shape[i];
        if (k == IN_CFG && in->true_cfg_scale > 0) s[k] = (in_shape){.present = 1, .ndim = 1, .shape = {1}};
    }
    in_sizes z;
    if ((rc = check_inputs(&d->cfg, s, d->tmp, &z, e))) {
        d->failed = 1;
        if (e) e->code = FS_E_INTERNAL; /* our own inputs disagree with our config: a bug */
        return FS_E_INTERNAL;
    }
    if (z.B != in->B || z.S_img != in->S_img || z.S_txt != in->S_txt || z.n != in->n_steps)
        return DUMP_FAIL(d, e, FS_E_INTERNAL,
                         "%s: fs_inputs says B=%d S_img=%d S_txt=%d n_steps=%d but its tensors say %d/%d/%d/%d", d->tmp,
                         in->B, in->S_img, in->S_txt, in->n_steps, z.B, z.S_img, z.S_txt, z.n);
    hid_t g = H5Gcreate2(d->file, "inputs", H5P_DEFAULT, d->gcpl, H5P_DEFAULT);
    if (g < 0) return DUMP_FAIL(d, e, FS_E_IO, "%s: /inputs: cannot create: %s", d->tmp, h5_cause(cause));
    /* Everything in the run dtype, ids and schedule included, as the reference does. */
    for (int k = 0; k < IN_N && !rc; k++) {
        if (!s[k].present) continue;
        if (k == IN_CFG) { /* the scale, a [1] dataset like guidance */
            fs_tensor sc = {0};
            if (!(rc = fs_tensor_alloc(&sc, FS_F64, 1, (int64_t[]){1}, e))) {
                fs_tensor_set(&sc, 0, in->true_cfg_scale);
                rc = write_dataset(d, g, "/inputs", in_names[k], &sc, d->dt, e);
            }
            fs_tensor_free(&sc);
            continue;
        }
        rc = write_dataset(d, g, "/inputs", in_names[k], input_tensor(in, k), d->dt, e);
    }
    H5Gclose(g);
    if (!rc) d->wrote_inputs = 1;
    return rc;
}

int fs_dump_begin_step(fs_dump *d, int step, double timestep, double sigma, double sigma_next, fs_err *e)
{
    char cause[256], name[32];
    int rc = check_usable(d, "begin step", e);
    if (rc) return rc;
    if (d->step >= 0)
        return DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: step_%04d begun while step_%04d is still open", d->tmp, step,
                         d->step_no);
    if (step < 0) return DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: negative step number %d", d->tmp, step);
    snprintf(name, sizeof name, "step_%04d", step);
    if (H5Lexists(d->file, name, H5P_DEFAULT) > 0)
        return DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: /%s written twice", d->tmp, name);
    d->step = H5Gcreate2(d->file, name, H5P_DEFAULT, d->gcpl, H5P_DEFAULT);
    if (d->step < 0) return DUMP_FAIL(d, e, FS_E_IO, "%s: /%s: cannot create: %s", d->tmp, name, h5_cause(cause));
    d->step_no = step;
    if (put_f64(d->step, "timestep", timestep) < 0 || put_f64(d->step, "sigma", sigma) < 0 ||
        put_f64(d->step, "sigma_next", sigma_next) < 0 || put_str(d->step, "recorded_modules", d->modules_decl[0] ? d->modules_decl : "all") < 0)
        return DUMP_FAIL(d, e, FS_E_IO, "%s: /%s: attributes: write failed: %s", d->tmp, name, h5_cause(cause));
    return FS_OK;
}

static int record_impl(fs_dump *d, const char *name, const fs_tensor *t, const fs_shard *sh, const int64_t *gshape,
                       int write, fs_err *e);
int fs_dump_record(fs_dump *d, const char *name, const fs_tensor *t, fs_err *e)
{
    return record_impl(d, name, t, NULL, NULL, writes_whole(d), e);
}

int fs_dump_record_piece(fs_dump *d, const char *name, const fs_tensor *t, const fs_shard *sh, const int64_t *gshape,
                         int write, fs_err *e)
{
    return record_impl(d, name, t, sh, gshape, write, e);
}

static int record_impl(fs_dump *d, const char *name, const fs_tensor *t, const fs_shard *sh, const int64_t *gshape,
                       int write, fs_err *e)
{
    char where[32];
    int rc = check_usable(d, "record", e);
    if (rc) return rc;
    if (d->step < 0)
        return DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: '%s' recorded outside a step (no fs_dump_begin_step)", d->tmp,
                         name ? name : "(null)");
    snprintf(where, sizeof where, "/step_%04d", d->step_no);
    /* '/' would silently create nested groups and "." is the group itself. */
    if (!name || !*name || strchr(name, '/') || !strcmp(name, "."))
        return DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: %s: invalid dataset name '%s'", d->tmp, where, name ? name : "");
    if (H5Lexists(d->step, name, H5P_DEFAULT) > 0)
        return DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: %s/%s recorded twice in one step", d->tmp, where, name);
    if (d->n_order == d->cap_order) {
        int cap = d->cap_order ? 2 * d->cap_order : 256;
        char **o = realloc(d->order, (size_t)cap * sizeof *o);
        if (!o) return DUMP_FAIL(d, e, FS_E_NOMEM, "%s: out of memory", d->tmp);
        d->order = o;
        d->cap_order = cap;
    }
    char *copy = strdup(name);
    if (!copy) return DUMP_FAIL(d, e, FS_E_NOMEM, "%s: out of memory", d->tmp);
    if ((rc = write_dataset_piece(d, d->step, where, name, t, t->dtype, sh, gshape, write, e))) {
        free(copy);
        return rc;
    }
    d->order[d->n_order++] = copy;
    return FS_OK;
}

static void free_order(fs_dump *d)
{
    for (int i = 0; i < d->n_order; i++) free(d->order[i]);
    d->n_order = 0;
}

int fs_dump_end_step(fs_dump *d, fs_err *e)
{
    char cause[256];
    int rc = check_usable(d, "end step", e);
    if (rc) return rc;
    if (d->step < 0) return DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: end of a step that was not begun", d->tmp);
    herr_t r = put_str_attr(d->step, "order", (const char *const *)d->order, (hsize_t)d->n_order, 0);
    herr_t c = H5Gclose(d->step);
    d->step = -1;
    free_order(d);
    if (r < 0 || c < 0)
        return DUMP_FAIL(d, e, FS_E_IO, "%s: /step_%04d: attribute order: write failed: %s", d->tmp, d->step_no,
                         h5_cause(cause));
    return FS_OK;
}

int fs_dump_write_final(fs_dump *d, const fs_tensor *latents, fs_err *e)
{
    char cause[256];
    int rc = check_usable(d, "write final", e);
    if (rc) return rc;
    if (d->step >= 0)
        return DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: /final written while step_%04d is still open", d->tmp, d->step_no);
    if (d->wrote_final) return DUMP_FAIL(d, e, FS_E_INTERNAL, "%s: /final written twice", d->tmp);
    hid_t g = H5Gcreate2(d->file, "final", H5P_DEFAULT, d->gcpl, H5P_DEFAULT);
    if (g < 0) return DUMP_FAIL(d, e, FS_E_IO, "%s: /final: cannot create: %s", d->tmp, h5_cause(cause));
    rc = write_dataset(d, g, "/final", "latents", latents, d->dt, e);
    H5Gclose(g);
    if (!rc) d->wrote_final = 1;
    return rc;
}

/* Releases everything but the file on disk. */
static void dump_free(fs_dump *d)
{
    if (d->step >= 0) H5Gclose(d->step);
    if (d->gcpl >= 0) H5Pclose(d->gcpl);
    if (d->file >= 0) H5Fclose(d->file);
    if (d->registered) fs_cleanup_remove(d->tmp); /* last: until now a signal still deletes it */
    free_order(d);
    free(d->order);
    free(d->path);
    free(d->tmp);
    free(d);
}

/* A dump being discarded still has to be closed, and HDF5's close flushes what it has cached:
 * on a full disk that flush fails again, and HDF5 1.10 then keeps a half-destroyed file that
 * crashes it at MPI_Finalize (probe defect #4: SIGSEGV, exit 139); in a parallel dump the ranks'
 * failed flushes wait in different collectives (defect #3). Nothing written now is wanted: every
 * descriptor this process holds on the temporary (sec2's, or MPI-IO's, whichever driver) is
 * pointed at an anonymous in-memory file first, so the closing writes succeed and cost nothing.
 * Linux (memfd, /proc/self/fd); elsewhere the close is attempted as it is. */
static void discard_writes(const fs_dump *d)
{
#ifdef __linux__
    if (!d->have_id) return;
    int mfd = memfd_create("flux-sim-discarded-dump", MFD_CLOEXEC);
    if (mfd < 0) return;
    DIR *dir = opendir("/proc/self/fd");
    if (dir) {
        struct dirent *de;
        while ((de = readdir(dir)) != NULL) {
            char *end;
            long fd = strtol(de->d_name, &end, 10);
            struct stat st;
            if (*end || end == de->d_name || fd == dirfd(dir) || fd == mfd) continue;
            if (fstat((int)fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == d->dev && st.st_ino == d->ino)
                dup2(mfd, (int)fd); /* keeps the number HDF5/MPI-IO hold; the old description is closed */
        }
        closedir(dir);
    }
    close(mfd);
#else
    (void)d;
#endif
}

/* Completes the file without publishing it: the completeness marker, flush, close, fsync. A
 * parallel dump agrees on the outcome (every rank returns the same). On failure the file is
 * left to fs_dump_abort, which deletes it. */
int fs_dump_seal(fs_dump *d, fs_err *e)
{
    char cause[256];
    if (!d) return fs_errf(e, FS_E_INTERNAL, "seal of a NULL dump");
    if (d->sealed) return FS_OK;
    /* refusals: the same on every rank (a failure of a parallel dump is agreed when it happens) */
    if (d->failed) return fs_errf(e, FS_E_IO, "%s: not written: an earlier write to %s failed", d->path, d->tmp);
    if (d->step >= 0)
        return fs_errf(e, FS_E_INTERNAL, "%s: not written: step_%04d was never ended", d->path, d->step_no);
    if (!d->wrote_final) return fs_errf(e, FS_E_INTERNAL, "%s: not written: /final was never written", d->path);
    /* the completeness marker, the producer's last write (docs/dump-format.md): a file without
     * it was cut short, whatever else it holds */
    int rc = FS_OK;
    int64_t one = 1;
    errno = 0;
    if (put_num(d->file, "complete", H5T_STD_I64LE, H5T_NATIVE_INT64, &one) < 0)
        rc = DUMP_FAIL(d, e, FS_E_IO, "%s: not written: attribute complete: %s", d->path, io_cause(d, errno, cause));
    /* everything cached reaches the file now, while a failure can still be handled: a flush that
     * fails leaves the file open for fs_dump_abort (closing it here would flush and fail again) */
    if (!rc) errno = 0;
    if (!rc && H5Fflush(d->file, H5F_SCOPE_GLOBAL) < 0)
        rc = DUMP_FAIL(d, e, FS_E_IO, "%s: not written: writing %s failed: %s", d->path, d->tmp, io_cause(d, errno, cause));
    if ((rc = agree_write(d, rc, e))) return rc;
    H5Pclose(d->gcpl);
    d->gcpl = -1;
    errno = 0;
    herr_t cl = H5Fclose(d->file);
    d->file = -1; /* after a failed close HDF5 keeps nothing usable either */
    if (cl < 0)
        rc = DUMP_FAIL(d, e, FS_E_IO, "%s: not written: closing %s failed: %s", d->path, d->tmp, io_cause(d, errno, cause));
    /* fsync before rename: otherwise a power loss right after the rename can leave a complete-
     * looking name with incomplete content on some filesystems. */
    if (!rc && (!d->g || d->g->rank == 0)) {
        int fd = open(d->tmp, O_RDONLY);
        if (fd < 0 || fsync(fd) < 0)
            rc = DUMP_FAIL(d, e, FS_E_IO, "%s: not written: syncing %s failed: %s", d->path, d->tmp, strerror(errno));
        if (fd >= 0) close(fd);
    }
    if ((rc = agree_write(d, rc, e))) return rc;
    d->sealed = 1;
    return FS_OK;
}

/* Renames a sealed dump into place. Frees d in every case; on failure the temporary is
 * deleted. A parallel dump: rank 0 renames, every rank returns its outcome. */
int fs_dump_publish(fs_dump *d, fs_err *e)
{
    if (!d) return fs_errf(e, FS_E_INTERNAL, "publish of a NULL dump");
    int rc = FS_OK;
    if (!d->sealed) rc = fs_errf(e, FS_E_INTERNAL, "%s: not written: published before it was sealed", d->path);
    else if ((!d->g || d->g->rank == 0) && rename(d->tmp, d->path) < 0)
        rc = fs_errf(e, FS_E_IO, "%s: cannot move %s into place: %s", d->path, d->tmp, strerror(errno));
    if (d->g) rc = fs_agree_error(d->g, rc, e);
    if (rc) {
        fs_dump_abort(d);
        return rc;
    }
    dump_free(d);
    return FS_OK;
}

int fs_dump_close(fs_dump *d, fs_err *e)
{
    if (!d) return fs_errf(e, FS_E_INTERNAL, "close of a NULL dump");
    int rc = fs_dump_seal(d, e);
    if (rc) {
        fs_dump_abort(d);
        return rc;
    }
    return fs_dump_publish(d, e);
}

void fs_dump_abort(fs_dump *d)
{
    if (!d) return;
    /* the file first: whatever happens to the close below, no temporary is left (unlinking an
     * open file is fine on POSIX: the descriptors keep the inode until they are closed) */
    if (d->file >= 0) {
        discard_writes(d);
        /* A flush that failed (ENOSPC) leaves HDF5 1.10's metadata cache with its skip list still
         * enabled; the close would then fail half-way and HDF5 crash at exit. One more flush,
         * now into memory, empties the cache and resets that state (it reports the stale
         * "slist already enabled" and is ignored); after it the close succeeds. */
        H5Fflush(d->file, H5F_SCOPE_GLOBAL);
    }
    if (!d->g || d->g->rank == 0) unlink(d->tmp);
    dump_free(d);
}

static int record_cb(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e)
{
    return fs_dump_record(ctx, name, t, e);
}

fs_recorder fs_dump_recorder(fs_dump *d) { return (fs_recorder){.fn = record_cb, .ctx = d}; }

/* ---------- reader ---------- */

int fs_dump_read_inputs(const char *path, fs_dtype dt, fs_config *cfg, fs_inputs *in, fs_err *e)
{
    memset(in, 0, sizeof *in);
    fo_file *f = NULL;
    fo_dataset ds = {0};
    int rc = fo_file_open(&f, path, e);
    if (rc) return rc;
    if ((rc = fs_config_from_json(cfg, fo_file_config(f), path, e))) goto out;
    if (!fo_is_group(f, "/inputs")) {
        rc = fs_errf(e, FS_E_INPUT, "%s: no /inputs group: this dump cannot be replayed", path);
        goto out;
    }
    in_shape s[IN_N] = {{0}};
    char p[64];
    for (int k = 0; k < IN_N; k++) {
        snprintf(p, sizeof p, "/inputs/%s", in_names[k]);
        if (!fo_is_dataset(f, p)) continue;
        if ((rc = fo_dataset_info(f, p, &ds, e))) goto out;
        s[k].present = 1;
        s[k].ndim = ds.ndim;
        memcpy(s[k].shape, ds.shape, sizeof s[k].shape);
    }
    in_sizes z;
    if ((rc = check_inputs(cfg, s, path, &z, e))) goto out;
    in->B = z.B;
    in->S_img = z.S_img;
    in->S_txt = z.S_txt;
    in->n_steps = z.n;
    in->has_guidance = s[IN_GUID].present;
    in->S_neg = z.S_neg;
    in->S_ref = z.S_ref;
    for (int k = 0; k < IN_N; k++) {
        if (!s[k].present) continue;
        snprintf(p, sizeof p, "/inputs/%s", in_names[k]);
        if ((rc = fo_dataset_read(f, p, &ds, e))) goto out;
        /* Activations go to the run dtype; positions and the schedule stay float64 so a float32
         * file's values arrive unchanged and a float64 run keeps full precision. */
        if (k == IN_CFG) { /* the true CFG scale, finite and > 0 */
            in->true_cfg_scale = ds.data[0];
            if (!(ds.data[0] > 0 && ds.data[0] < 1e6)) {
                rc = fs_errf(e, FS_E_INPUT, "%s: %s is %g, must be a positive number below 1e6", path, p, ds.data[0]);
                goto out;
            }
            continue;
        }
        fs_tensor *t = (fs_tensor *)input_tensor(in, k);
        fs_dtype tdt = k <= IN_POOLED || k == IN_NEHS || k == IN_NPOOLED || k == IN_RLAT ? dt : FS_F64;
        if ((rc = fs_tensor_alloc(t, tdt, ds.ndim, ds.shape, e))) {
            fs_err_prefix(e, "%s: %s: ", path, p);
            goto out;
        }
        for (int64_t i = 0; i < ds.numel; i++) {
            if (!isfinite(ds.data[i])) {
                rc = fs_errf(e, FS_E_INPUT, "%s: %s: element %lld is %g: inputs must be finite", path, p, (long long)i,
                             ds.data[i]);
                goto out;
            }
            fs_tensor_set(t, i, ds.data[i]);
        }
    }
out:
    if (rc) fs_inputs_free(in);
    fo_dataset_free(&ds);
    fo_file_close(f);
    return rc;
}
