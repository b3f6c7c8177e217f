#include "fs_ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "fs_pipeline.h"
#include "fs_weights.h"

uint16_t fs_f16_from_float(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00); /* NaN (quiet), inf */
    if (a >= 0x477ff000u) return sign | 0x7c00; /* >= 65520 rounds to inf (65520 ties to the even 2^16) */
    if (a <= 0x33000000u) return sign;          /* <= 2^-25 rounds to 0 (2^-25 ties to the even 0) */
    /* a float >= 2^-25 is normal: 24-bit significand m, exponent e */
    const int e = (int)(a >> 23) - 127;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    /* half keeps 11 significant bits when normal (e >= -14), fewer when subnormal (quantum 2^-24) */
    const int shift = e >= -14 ? 13 : 13 + (-14 - e); /* 13 .. 24 */
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    if (e < -14) return sign | (uint16_t)q; /* q == 0x400 is the smallest normal: also right */
    /* q in [0x400, 0x800]: 0x800 carries into the exponent (and at e = 15 into inf, excluded above) */
    return sign | (uint16_t)(((uint32_t)(e + 15) << 10) + (q - 0x400));
}

/* ---- layouts ---- */

int64_t fs_ckpt_numel(const fs_ckpt_tensor *t) { return t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1); }

void fs_ckpt_layout_free(fs_ckpt_layout *l)
{
    if (!l) return;
    free(l->params);
    free(l->t);
    memset(l, 0, sizeof *l);
}

static int cmp_piece(const void *a, const void *b)
{
    const fs_ckpt_piece *x = a, *y = b;
    return (x->dst_r0 > y->dst_r0) - (x->dst_r0 < y->dst_r0);
}

int fs_ckpt_layout_init(fs_ckpt_layout *l, const fs_config *c, int bfl, const char *prefix, fs_err *e)
{
    memset(l, 0, sizeof *l);
    l->cfg = *c;
    if (!(l->params = fs_config_params(c, &l->nparams)) || !(l->t = calloc((size_t)l->nparams, sizeof *l->t))) {
        fs_ckpt_layout_free(l);
        return fs_errf(e, FS_E_NOMEM, "out of memory building the parameter list");
    }
    for (int i = 0; i < l->nparams; i++) {
        const fs_param_desc *d = &l->params[i];
        fs_ckpt_tensor *t = NULL;
        fs_bfl_piece bp[2] = {{0, d->shape[0], 0}};
        int nb = 1;
        int64_t rows = d->shape[0];
        char name[192];
        snprintf(name, sizeof name, "%s", d->name);
        if (bfl) {
            char bname[160];
            if (fs_weights_bfl_source(d, c, bname, sizeof bname, &rows, bp, &nb)) {
                fs_ckpt_layout_free(l);
                return fs_errf(e, FS_E_INTERNAL, "no BFL name for parameter '%s'", d->name);
            }
            snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", bname);
            for (int k = 0; k < l->n && !t; k++)
                if (!strcmp(l->t[k].name, name)) t = &l->t[k]; /* a fused tensor seen before */
        }
        if (!t) {
            t = &l->t[l->n++];
            snprintf(t->name, sizeof t->name, "%s", name);
            t->ndim = d->ndim;
            t->shape[0] = rows;
            t->shape[1] = d->ndim == 2 ? d->shape[1] : 0;
        }
        for (int k = 0; k < nb; k++) {
            if (t->np == (int)FS_ARRAY_LEN(t->p) || t->shape[1] != (d->ndim == 2 ? d->shape[1] : 0)) {
                fs_ckpt_layout_free(l);
                return fs_errf(e, FS_E_INTERNAL, "BFL tensor '%s': parameter '%s' does not fit it", name, d->name);
            }
            /* the loader's piece reads BFL rows src_r0.. into the parameter's rows dst_r0.. */
            t->p[t->np++] = (fs_ckpt_piece){.param = i, .param_r0 = bp[k].dst_r0, .nrows = bp[k].nrows,
                                            .dst_r0 = bp[k].src_r0};
        }
    }
    /* every row of every tensor written exactly once */
    for (int k = 0; k < l->n; k++) {
        fs_ckpt_tensor *t = &l->t[k];
        qsort(t->p, (size_t)t->np, sizeof *t->p, cmp_piece);
        int64_t next = 0;
        for (int j = 0; j < t->np; j++) {
            if (t->p[j].dst_r0 != next) break;
            next += t->p[j].nrows;
        }
        if (next != t->shape[0]) {
            int64_t rows = t->shape[0];
            fs_ckpt_layout_free(l);
            return fs_errf(e, FS_E_INTERNAL, "tensor '%s': its parameters cover rows [0, %lld) of %lld", t->name,
                           (long long)next, (long long)rows);
        }
    }
    return FS_OK;
}

uint64_t fs_ckpt_total_bytes(const fs_ckpt_layout *l, fs_st_dtype dt)
{
    uint64_t n = 0;
    for (int k = 0; k < l->n; k++) n += (uint64_t)fs_ckpt_numel(&l->t[k]) * fs_st_dtype_size(dt);
    return n;
}

void fs_ckpt_shards(const fs_ckpt_layout *l, fs_st_dtype dt, uint64_t max_bytes, int *shard_of, int *nshards)
{
    int cur = -1;
    uint64_t size = 0;
    for (int k = 0; k < l->n; k++) {
        const uint64_t b = (uint64_t)fs_ckpt_numel(&l->t[k]) * fs_st_dtype_size(dt);
        if (b > max_bytes) { /* alone, and the next tensor starts a fresh shard */
            shard_of[k] = ++cur;
            size = max_bytes + 1;
            continue;
        }
        if (cur < 0 || size + b > max_bytes) {
            cur++;
            size = 0;
        }
        shard_of[k] = cur;
        size += b;
    }
    *nshards = cur + 1;
}

/* ---- writing ---- */

typedef struct wctx {
    const fs_ckpt_spec *s;
    const fs_ckpt_layout *l;
    uint64_t done, total;
    float *f;     /* a row block of values */
    void *o;      /* the same block in the file dtype */
    int64_t cap;  /* elements in f / o */
} wctx;

/* Elements [first, first + m) of parameter d as the file stores them (m <= w->cap): the fp32
 * synthetic values, then rounded to the file dtype. Returns the bytes (w->f or w->o). */
static const void *encode(wctx *w, const fs_param_desc *d, int64_t first, int64_t m)
{
    fs_weights_synthetic_fill(d, w->s->seed, first, m, FS_F32, w->f);
    uint16_t *o = w->o;
    if (w->s->dtype == FS_ST_BF16) {
#pragma omp parallel for schedule(static) if (m > 65536)
        for (int64_t i = 0; i < m; i++) o[i] = fs_bf16_from_float(w->f[i]);
        return o;
    }
    if (w->s->dtype == FS_ST_F16) {
#pragma omp parallel for schedule(static) if (m > 65536)
        for (int64_t i = 0; i < m; i++) o[i] = fs_f16_from_float(w->f[i]);
        return o;
    }
    return w->f;
}

static int write_all(int fd, const void *p, size_t n, const char *path, fs_err *e)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return fs_errf(e, FS_E_IO, "%s: write failed: %s", path, w < 0 ? strerror(errno) : "no progress");
        c += w;
        n -= (size_t)w;
    }
    return FS_OK;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const fs_ckpt_tensor *const *)a)->name, (*(const fs_ckpt_tensor *const *)b)->name);
}

/* Writes the tensors of shard `shard` (all when shard < 0) as one safetensors file: header
 * {"__metadata__":{"format":"pt"}, name: {dtype, shape, data_offsets}, ...} with the tensors in
 * name order (the order the safetensors library writes one dtype in), padded with spaces to a
 * multiple of 8; then each tensor's bytes, generated in row blocks. */
static int write_safetensors(wctx *w, const int *shard_of, int shard, const char *path, fs_err *e)
{
    const fs_ckpt_layout *l = w->l;
    const fs_st_dtype dt = w->s->dtype;
    const size_t es = fs_st_dtype_size(dt);
    const fs_ckpt_tensor **ts = malloc((size_t)l->n * sizeof *ts);
    char *hdr = NULL;
    int nt = 0, rc = FS_OK, fd = -1;
    if (!ts) return fs_errf(e, FS_E_NOMEM, "out of memory");
    for (int k = 0; k < l->n; k++)
        if (shard < 0 || shard_of[k] == shard) ts[nt++] = &l->t[k];
    qsort(ts, (size_t)nt, sizeof *ts, cmp_tensor_name);

    size_t cap = 4096 + (size_t)nt * 320, len = 0;
    if (!(hdr = malloc(cap))) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (int k = 0; k < nt; k++) {
        const uint64_t nb = (uint64_t)fs_ckpt_numel(ts[k]) * es;
        char shape[64];
        if (ts[k]->ndim == 2) snprintf(shape, sizeof shape, "[%lld,%lld]", (long long)ts[k]->shape[0], (long long)ts[k]->shape[1]);
        else snprintf(shape, sizeof shape, "[%lld]", (long long)ts[k]->shape[0]);
        len += (size_t)snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}",
                                ts[k]->name, fs_st_dtype_name(dt), shape, (unsigned long long)off,
                                (unsigned long long)(off + nb));
        off += nb;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    if (len + 8 > cap) {
        rc = fs_errf(e, FS_E_INTERNAL, "%s: header buffer too small", path);
        goto out;
    }

    if ((fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666)) < 0) {
        rc = fs_errf(e, FS_E_IO, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    const uint64_t hlen = len; /* little-endian u64 (the host is little-endian: fs_safetensors.c) */
    if ((rc = write_all(fd, &hlen, 8, path, e)) || (rc = write_all(fd, hdr, len, path, e))) goto out;

    for (int k = 0; k < nt; k++) {
        const fs_ckpt_tensor *t = ts[k];
        const int64_t cols = t->ndim == 2 ? t->shape[1] : 1;
        const int64_t rows_per_block = w->cap / cols > 0 ? w->cap / cols : 1;
        for (int j = 0; j < t->np; j++) {
            const fs_ckpt_piece *p = &t->p[j];
            for (int64_t r = 0; r < p->nrows; r += rows_per_block) {
                const int64_t nr = p->nrows - r < rows_per_block ? p->nrows - r : rows_per_block;
                const int64_t n = nr * cols; /* <= cap unless one row is wider than cap */
                for (int64_t c0 = 0; c0 < n; c0 += w->cap) {
                    const int64_t m = n - c0 < w->cap ? n - c0 : w->cap;
                    const void *src = encode(w, &l->params[p->param], (p->param_r0 + r) * cols + c0, m);
                    if ((rc = write_all(fd, src, (size_t)m * es, path, e))) goto out;
                    w->done += (uint64_t)m * es;
                    if (w->s->progress && w->s->progress(w->s->progress_ctx, w->done, w->total)) {
                        rc = fs_errf(e, FS_E_INPUT, "%s: interrupted", path);
                        goto out;
                    }
                }
            }
        }
    }
    /* on disk before the checkpoint is published: after a crash or power loss, OUT must not
     * exist with empty or short shards (probe T11) */
    if (fsync(fd) != 0) {
        rc = fs_errf(e, FS_E_IO, "%s: fsync failed: %s", path, strerror(errno));
        goto out;
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = fs_errf(e, FS_E_IO, "%s: close failed: %s", path, strerror(errno));
        goto out;
    }
    fd = -1;
out:
    if (fd >= 0) close(fd);
    if (rc) unlink(path);
    free(hdr);
    free(ts);
    return rc;
}

static int write_text(const char *path, const char *text, fs_err *e)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) return fs_errf(e, FS_E_IO, "%s: cannot create: %s", path, strerror(errno));
    int rc = write_all(fd, text, strlen(text), path, e);
    if (!rc && fsync(fd) != 0) rc = fs_errf(e, FS_E_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (close(fd) != 0 && !rc) rc = fs_errf(e, FS_E_IO, "%s: close failed: %s", path, strerror(errno));
    return rc;
}

static char *pathf(const char *dir, const char *name)
{
    char *p = NULL;
    return asprintf(&p, "%s/%s", dir, name) < 0 ? NULL : p;
}

/* config.json as diffusers writes it (sorted keys, 2-space indent). out_channels null means
 * "= in_channels", as on the Hub. */
static char *config_json(const fs_config *c, uint64_t seed)
{
    char *s = NULL, oc[16];
    if (c->family == FS_FLUX2) { /* Flux2Transformer2DModel's keys, sorted */
        char ax[96] = "";
        for (int i = 0, o = 0; i < fs_config_axes(c); i++)
            o += snprintf(ax + o, sizeof ax - o, "%s\n    %d", i ? "," : "", c->axes_dims_rope[i]);
        if (c->out_channels == c->in_channels) snprintf(oc, sizeof oc, "null");
        else snprintf(oc, sizeof oc, "%d", c->out_channels);
        int n = asprintf(&s,
                         "{\n"
                         "  \"_class_name\": \"Flux2Transformer2DModel\",\n"
                         "  \"_diffusers_version\": \"0.42.1\",\n"
                         "  \"_flux_sim\": \"synthetic weights (fs_weights_synthetic, seed %llu), written by make-checkpoint\",\n"
                         "  \"attention_head_dim\": %d,\n"
                         "  \"axes_dims_rope\": [%s\n  ],\n"
                         "  \"eps\": %.17g,\n"
                         "  \"guidance_embeds\": %s,\n"
                         "  \"in_channels\": %d,\n"
                         "  \"joint_attention_dim\": %d,\n"
                         "  \"mlp_ratio\": %.17g,\n"
                         "  \"num_attention_heads\": %d,\n"
                         "  \"num_layers\": %d,\n"
                         "  \"num_single_layers\": %d,\n"
                         "  \"out_channels\": %s,\n"
                         "  \"patch_size\": %d,\n"
                         "  \"rope_theta\": %d,\n"
                         "  \"timestep_guidance_channels\": %d\n"
                         "}\n",
                         (unsigned long long)seed, c->attention_head_dim, ax, c->eps, c->guidance_embeds ? "true" : "false",
                         c->in_channels, c->joint_attention_dim, c->mlp_ratio, c->num_attention_heads, c->num_layers,
                         c->num_single_layers, oc, c->patch_size, c->rope_theta, c->timestep_guidance_channels);
        return n < 0 ? NULL : s;
    }
    if (c->out_channels == c->in_channels) snprintf(oc, sizeof oc, "null");
    else snprintf(oc, sizeof oc, "%d", c->out_channels);
    int n = asprintf(&s,
                     "{\n"
                     "  \"_class_name\": \"FluxTransformer2DModel\",\n"
                     "  \"_diffusers_version\": \"0.30.0.dev0\",\n"
                     "  \"_flux_sim\": \"synthetic weights (fs_weights_synthetic, seed %llu), written by make-checkpoint\",\n"
                     "  \"attention_head_dim\": %d,\n"
                     "  \"axes_dims_rope\": [\n    %d,\n    %d,\n    %d\n  ],\n"
                     "  \"guidance_embeds\": %s,\n"
                     "  \"in_channels\": %d,\n"
                     "  \"joint_attention_dim\": %d,\n"
                     "  \"num_attention_heads\": %d,\n"
                     "  \"num_layers\": %d,\n"
                     "  \"num_single_layers\": %d,\n"
                     "  \"out_channels\": %s,\n"
                     "  \"patch_size\": %d,\n"
                     "  \"pooled_projection_dim\": %d\n"
                     "}\n",
                     (unsigned long long)seed, c->attention_head_dim, c->axes_dims_rope[0], c->axes_dims_rope[1],
                     c->axes_dims_rope[2], c->guidance_embeds ? "true" : "false", c->in_channels,
                     c->joint_attention_dim, c->num_attention_heads, c->num_layers, c->num_single_layers, oc,
                     c->patch_size, c->pooled_projection_dim);
    return n < 0 ? NULL : s;
}

static int cmp_index(const void *a, const void *b, void *arg)
{
    const fs_ckpt_layout *l = arg;
    return strcmp(l->t[*(const int *)a].name, l->t[*(const int *)b].name);
}

/* A diffusers transformer folder inside the (temporary) directory `dir`. */
static int write_diffusers(wctx *w, const char *dir, fs_err *e)
{
    const fs_ckpt_layout *l = w->l;
    int *shard_of = malloc((size_t)l->n * sizeof *shard_of), *order = malloc((size_t)l->n * sizeof *order), ns = 0;
    char *cfg = config_json(&l->cfg, w->s->seed), *p = NULL, **names = NULL;
    FILE *f = NULL;
    int rc = FS_OK;
    if (!shard_of || !order || !cfg) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    fs_ckpt_shards(l, w->s->dtype, w->s->max_shard_bytes, shard_of, &ns);
    if (!(names = calloc((size_t)ns, sizeof *names))) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    for (int k = 0; k < ns; k++) {
        int r = ns == 1 ? asprintf(&names[k], "diffusion_pytorch_model.safetensors")
                        : asprintf(&names[k], "diffusion_pytorch_model-%05d-of-%05d.safetensors", k + 1, ns);
        if (r < 0) {
            names[k] = NULL;
            rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            goto out;
        }
    }
    if (!(p = pathf(dir, "config.json"))) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = write_text(p, cfg, e))) goto out;
    for (int k = 0; k < ns; k++) {
        free(p);
        if (!(p = pathf(dir, names[k]))) {
            rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            goto out;
        }
        if ((rc = write_safetensors(w, shard_of, k, p, e))) goto out;
    }
    if (ns > 1) { /* the index, keys sorted, as huggingface_hub writes it */
        free(p);
        if (!(p = pathf(dir, "diffusion_pytorch_model.safetensors.index.json"))) {
            rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            goto out;
        }
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 || !(f = fdopen(fd, "w"))) {
            if (fd >= 0) close(fd);
            rc = fs_errf(e, FS_E_IO, "%s: cannot create: %s", p, strerror(errno));
            goto out;
        }
        for (int k = 0; k < l->n; k++) order[k] = k;
        qsort_r(order, (size_t)l->n, sizeof *order, cmp_index, (void *)l);
        fprintf(f, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {\n",
                (unsigned long long)fs_ckpt_total_bytes(l, w->s->dtype));
        for (int k = 0; k < l->n; k++)
            fprintf(f, "    \"%s\": \"%s\"%s\n", l->t[order[k]].name, names[shard_of[order[k]]], k + 1 < l->n ? "," : "");
        fprintf(f, "  }\n}\n");
        int bad = ferror(f);
        if (fclose(f) != 0 || bad) rc = fs_errf(e, FS_E_IO, "%s: write failed: %s", p, strerror(errno));
        f = NULL;
    }
out:
    for (int k = 0; names && k < ns; k++) free(names[k]);
    free(names);
    free(p);
    free(cfg);
    free(order);
    free(shard_of);
    return rc;
}

/* FLUX.1-dev's (guidance) or FLUX.1-schnell's scheduler_config.json, as on the Hub. */
static const char *scheduler_json(const fs_config *c)
{
    return c->guidance_embeds ? "{\n"
                                "  \"_class_name\": \"FlowMatchEulerDiscreteScheduler\",\n"
                                "  \"_diffusers_version\": \"0.30.0.dev0\",\n"
                                "  \"base_image_seq_len\": 256,\n"
                                "  \"base_shift\": 0.5,\n"
                                "  \"max_image_seq_len\": 4096,\n"
                                "  \"max_shift\": 1.15,\n"
                                "  \"num_train_timesteps\": 1000,\n"
                                "  \"shift\": 3.0,\n"
                                "  \"use_dynamic_shifting\": true\n"
                                "}\n"
                              : "{\n"
                                "  \"_class_name\": \"FlowMatchEulerDiscreteScheduler\",\n"
                                "  \"_diffusers_version\": \"0.29.0.dev0\",\n"
                                "  \"base_image_seq_len\": 256,\n"
                                "  \"base_shift\": 0.5,\n"
                                "  \"max_image_seq_len\": 4096,\n"
                                "  \"max_shift\": 1.15,\n"
                                "  \"num_train_timesteps\": 1000,\n"
                                "  \"shift\": 1.0,\n"
                                "  \"use_dynamic_shifting\": false\n"
                                "}\n";
}

/* model_index.json: FluxPipeline with the transformer and scheduler this writes; the text
 * encoders, tokenizers and VAE are not generated and are listed as null (diffusers' marker for
 * a component the caller passes in), so nothing claims files that are not there. */
static const char *model_index_json(const fs_config *c)
{
    if (c->family == FS_FLUX2) /* Flux2Pipeline: one text encoder (Mistral), one tokenizer */
        return "{\n"
               "  \"_class_name\": \"Flux2Pipeline\",\n"
               "  \"_diffusers_version\": \"0.42.1\",\n"
               "  \"scheduler\": [\n    \"diffusers\",\n    \"FlowMatchEulerDiscreteScheduler\"\n  ],\n"
               "  \"text_encoder\": [\n    null,\n    null\n  ],\n"
               "  \"tokenizer\": [\n    null,\n    null\n  ],\n"
               "  \"transformer\": [\n    \"diffusers\",\n    \"Flux2Transformer2DModel\"\n  ],\n"
               "  \"vae\": [\n    null,\n    null\n  ]\n"
               "}\n";
    return "{\n"
           "  \"_class_name\": \"FluxPipeline\",\n"
           "  \"_diffusers_version\": \"0.30.0.dev0\",\n"
           "  \"scheduler\": [\n    \"diffusers\",\n    \"FlowMatchEulerDiscreteScheduler\"\n  ],\n"
           "  \"text_encoder\": [\n    null,\n    null\n  ],\n"
           "  \"text_encoder_2\": [\n    null,\n    null\n  ],\n"
           "  \"tokenizer\": [\n    null,\n    null\n  ],\n"
           "  \"tokenizer_2\": [\n    null,\n    null\n  ],\n"
           "  \"transformer\": [\n    \"diffusers\",\n    \"FluxTransformer2DModel\"\n  ],\n"
           "  \"vae\": [\n    null,\n    null\n  ]\n"
           "}\n";
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* umask without changing it for good (the temporaries get mode 0700/0600 from mkdtemp/mkstemp
 * and are opened up to what a plain mkdir/creat would give). */
static mode_t current_umask(void)
{
    mode_t m = umask(022);
    umask(m);
    return m;
}

/* The directory OUT goes into ("." for a bare name; trailing slashes of OUT ignored), malloc'd. */
static char *parent_dir(const char *out)
{
    char *dir = strdup(out);
    if (!dir) return NULL;
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, strlen(dir) + 1, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    return dir;
}

/* fsync a directory (its entries: the files just created in it, a rename into it) */
static int fsync_dir(const char *dir, fs_err *e)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return fs_errf(e, FS_E_IO, "%s: cannot open directory to fsync: %s", dir, strerror(errno));
    int rc = FS_OK;
    /* EINVAL: a file system without directory fsync (some FUSE / network ones): nothing to do */
    if (fsync(fd) != 0 && errno != EINVAL) rc = fs_errf(e, FS_E_IO, "%s: fsync failed: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

static int fsync_tree_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)ftw;
    if (flag != FTW_D && flag != FTW_DP) return 0;
    fs_err e;
    return fsync_dir(p, &e) ? -1 : 0;
}

/* Moves the complete temporary `tmp` to `out` without ever replacing anything (probe T11: the
 * lstat at the start and a plain rename at the end silently replaced a file, or an empty
 * directory, created at OUT meanwhile). renameat2(RENAME_NOREPLACE) is atomic and fails with
 * EEXIST; where the file system lacks it (EINVAL: some network and FUSE file systems), a file is
 * published with link(2), which never replaces either, and a directory with a rename after a
 * last lstat (the only racy case left, documented). Every file was fsynced when written; the
 * temporary's directories are fsynced before, OUT's parent after the move. */
static int publish(const char *tmp, const char *out, const char *dir, int is_file, fs_err *e)
{
    int rc = FS_OK;
    if (!is_file && nftw(tmp, fsync_tree_one, 16, FTW_PHYS) != 0)
        return fs_errf(e, FS_E_IO, "%s: cannot fsync the temporary's directories: %s", tmp, strerror(errno));
    int r = renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_NOREPLACE);
    if (r != 0 && (errno == EINVAL || errno == ENOSYS)) {
        struct stat st;
        if (is_file) r = link(tmp, out) == 0 ? unlink(tmp), 0 : -1;
        else if (lstat(out, &st) == 0) r = -1, errno = EEXIST;
        else r = rename(tmp, out);
    }
    if (r != 0) {
        const int err = errno;
        if (err == EEXIST || err == ENOTEMPTY)
            return fs_errf(e, FS_E_INPUT,
                           "%s: appeared while make-checkpoint was writing; not replaced (make-checkpoint never "
                           "overwrites)",
                           out);
        return fs_errf(e, FS_E_IO, "%s: cannot rename %s into place: %s", out, tmp, strerror(err));
    }
    if ((rc = fsync_dir(dir, e))) fs_err_prefix(e, "%s: written, but ", out);
    return rc;
}

int fs_ckpt_check_out(const fs_ckpt_spec *s, const char *out, fs_err *e)
{
    if (!*out) return fs_errf(e, FS_E_INPUT, "the output path is empty (see make-checkpoint --help)");
    char po[320];
    fs_printable(out, po, sizeof po, 256);
    if (s->dtype != FS_ST_BF16 && s->dtype != FS_ST_F16 && s->dtype != FS_ST_F32)
        return fs_errf(e, FS_E_INPUT, "%s: checkpoint dtype must be BF16, F16 or F32", po);
    if ((s->kind == FS_CKPT_DIFFUSERS || s->kind == FS_CKPT_PIPELINE) && s->max_shard_bytes < 1)
        return fs_errf(e, FS_E_INPUT, "%s: max shard size must be at least 1 byte", po);
    struct stat st;
    if (lstat(out, &st) == 0)
        return fs_errf(e, FS_E_INPUT, "%s: already exists; remove it or choose another path (make-checkpoint never "
                                      "overwrites)",
                       po);
    int rc = fs_config_validate(&s->cfg, "config", e);
    if (rc) return rc;
    char *dir = parent_dir(out);
    if (!dir) return fs_errf(e, FS_E_NOMEM, "out of memory");
    const int there = stat(dir, &st) == 0, err = errno;
    if (!there || !S_ISDIR(st.st_mode)) {
        char pd[320];
        rc = fs_errf(e, FS_E_INPUT, "%s: cannot use directory %s: %s", po, fs_printable(dir, pd, sizeof pd, 256),
                     there ? "not a directory" : strerror(err));
    }
    free(dir);
    return rc;
}

int fs_ckpt_write(const fs_ckpt_spec *s, const char *out, uint64_t *bytes_written, fs_err *e)
{
    if (bytes_written) *bytes_written = 0;
    int rc = fs_ckpt_check_out(s, out, e);
    if (rc) return rc;

    fs_ckpt_layout l;
    if ((rc = fs_ckpt_layout_init(&l, &s->cfg, s->kind == FS_CKPT_BFL, s->bfl_prefix, e))) return rc;
    wctx w = {.s = s, .l = &l, .total = fs_ckpt_total_bytes(&l, s->dtype), .cap = 1 << 22};
    char *dir = NULL, *tmp = NULL, *sub = NULL, *p = NULL;
    w.f = malloc((size_t)w.cap * sizeof *w.f);
    w.o = malloc((size_t)w.cap * 2);
    if (!w.f || !w.o || !(dir = parent_dir(out))) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) {
        rc = fs_errf(e, FS_E_INPUT, "%s: cannot use directory %s: %s", out, dir, strerror(errno));
        goto out;
    }
    const uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize, need = w.total + (1u << 20);
    if (avail < need) {
        rc = fs_errf(e, FS_E_IO, "%s: needs %.2f GB of disk, %s has %.2f GB free", out, need / 1e9, dir, avail / 1e9);
        goto out;
    }
    if (asprintf(&tmp, "%s.tmp-XXXXXX", out) < 0) {
        tmp = NULL;
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    const mode_t um = current_umask();
    if (s->kind == FS_CKPT_BFL) {
        int fd = mkstemp(tmp);
        if (fd < 0) {
            rc = fs_errf(e, FS_E_IO, "%s: cannot create a temporary file: %s", tmp, strerror(errno));
            free(tmp);
            tmp = NULL;
            goto out;
        }
        close(fd);
        unlink(tmp); /* write_safetensors creates it O_EXCL */
        if (!(rc = write_safetensors(&w, NULL, -1, tmp, e))) chmod(tmp, 0666 & ~um);
    } else {
        if (!mkdtemp(tmp)) {
            rc = fs_errf(e, FS_E_IO, "%s: cannot create a temporary directory: %s", tmp, strerror(errno));
            free(tmp);
            tmp = NULL;
            goto out;
        }
        chmod(tmp, 0777 & ~um);
        if (s->kind == FS_CKPT_DIFFUSERS) {
            rc = write_diffusers(&w, tmp, e);
        } else {
            char *sch = NULL;
            if (!(sub = pathf(tmp, "transformer")) || !(sch = pathf(tmp, "scheduler")) || !(p = pathf(tmp, "model_index.json")))
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            else if (mkdir(sub, 0777) || mkdir(sch, 0777))
                rc = fs_errf(e, FS_E_IO, "%s: cannot create a directory: %s", tmp, strerror(errno));
            else if (!(rc = write_text(p, model_index_json(&s->cfg), e))) {
                free(p);
                if (!(p = pathf(sch, "scheduler_config.json"))) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                else if (!(rc = write_text(p, scheduler_json(&s->cfg), e))) rc = write_diffusers(&w, sub, e);
            }
            free(sch);
        }
    }
    if (!rc) rc = publish(tmp, out, dir, s->kind == FS_CKPT_BFL, e);
    if (!rc && bytes_written) *bytes_written = w.done;
out:
    if (rc && tmp) {
        if (s->kind == FS_CKPT_BFL) unlink(tmp);
        else nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS); /* an interrupted or failed run leaves nothing */
    }
    free(tmp);
    free(sub);
    free(p);
    free(dir);
    free(w.f);
    free(w.o);
    fs_ckpt_layout_free(&l);
    return rc;
}

/* ---- reading back ---- */

int fs_ckpt_verify(const fs_ckpt_spec *s, const char *path, int *differing, fs_err *e)
{
    *differing = 0;
    char *open_path = NULL;
    fs_st_archive a;
    int rc = fs_pipeline_weights_path(path, &open_path, e);
    if (!rc) rc = fs_st_archive_open(&a, open_path, e);
    free(open_path);
    if (rc) return rc;
    /* the naming: diffusers, BFL, or BFL with the ComfyUI prefix */
    int bfl = 0;
    const char *prefix = "";
    if (!fs_st_archive_find(&a, "x_embedder.weight")) {
        bfl = 1;
        if (fs_st_archive_find(&a, "model.diffusion_model.img_in.weight")) prefix = "model.diffusion_model.";
    }
    fs_ckpt_layout l;
    if ((rc = fs_ckpt_layout_init(&l, &s->cfg, bfl, prefix, e))) {
        fs_st_archive_close(&a);
        return rc;
    }
    wctx w = {.s = s, .l = &l, .total = fs_ckpt_total_bytes(&l, s->dtype), .cap = 1 << 22};
    w.f = malloc((size_t)w.cap * sizeof *w.f);
    w.o = malloc((size_t)w.cap * 2);
    const size_t es = fs_st_dtype_size(s->dtype);
    char first_bad[256] = "";
    if (!w.f || !w.o) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    if (a.n != l.n) {
        rc = fs_errf(e, FS_E_INPUT, "%s: %d tensors, the config has %d (%s naming)", path, a.n, l.n, bfl ? "BFL" : "diffusers");
        goto out;
    }
    for (int k = 0; k < l.n; k++) {
        const fs_ckpt_tensor *t = &l.t[k];
        const fs_st_entry *en = fs_st_archive_find(&a, t->name);
        if (!en) {
            rc = fs_errf(e, FS_E_INPUT, "%s: missing tensor '%s'", path, t->name);
            goto out;
        }
        const int64_t cols = t->ndim == 2 ? t->shape[1] : 1;
        if (en->dtype != s->dtype || en->ndim != t->ndim || en->shape[0] != t->shape[0] || (t->ndim == 2 && en->shape[1] != cols)) {
            rc = fs_errf(e, FS_E_INPUT, "%s: tensor '%s' is %s with %d dims, expected %s [%lld%s]", fs_st_archive_file_of(&a, en),
                         t->name, fs_st_dtype_name(en->dtype), en->ndim, fs_st_dtype_name(s->dtype), (long long)t->shape[0],
                         t->ndim == 2 ? ", ..." : "");
            goto out;
        }
        int same = 1;
        for (int j = 0; j < t->np && same; j++) {
            const fs_ckpt_piece *p = &t->p[j];
            const int64_t n = p->nrows * cols;
            for (int64_t c0 = 0; c0 < n && same; c0 += w.cap) {
                const int64_t m = n - c0 < w.cap ? n - c0 : w.cap;
                const void *want = encode(&w, &l.params[p->param], p->param_r0 * cols + c0, m);
                same = !memcmp((const char *)en->data + (size_t)(p->dst_r0 * cols + c0) * es, want, (size_t)m * es);
                w.done += (uint64_t)m * es;
                if (s->progress && s->progress(s->progress_ctx, w.done, w.total)) {
                    rc = fs_errf(e, FS_E_INPUT, "%s: interrupted", path);
                    goto out;
                }
            }
        }
        if (!same && (*differing)++ == 0)
            snprintf(first_bad, sizeof first_bad, "%s", t->name);
        /* done with this tensor's pages: drop them from our resident set (they stay in the page
         * cache, reclaimable) so checking 24 GB does not look like 24 GB of memory use */
        const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a0 = (uintptr_t)en->data / pg * pg;
        madvise((void *)a0, (uintptr_t)en->data + (en->end - en->begin) - a0, MADV_DONTNEED);
    }
    if (*differing)
        fs_errf(e, FS_E_INPUT, "%s: %d tensor%s from synthetic seed %llu as %s, first '%s'", path, *differing,
                *differing == 1 ? " differs" : "s differ", (unsigned long long)s->seed, fs_st_dtype_name(s->dtype), first_bad);
out:
    free(w.f);
    free(w.o);
    fs_ckpt_layout_free(&l);
    fs_st_archive_close(&a);
    return rc;
}
