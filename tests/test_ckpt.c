/* test_ckpt.c — checkpoints written by fs_ckpt (make-checkpoint) load back as the synthetic
 * weights; the loader reads files larger than 4 GiB at offsets beyond 2^32; fs_pipeline finds
 * configs and scheduler configs.
 *
 * The expected values come from fs_weights_synthetic (fp32) rounded by this file's own BF16/F16
 * encoders' counterparts in fs_safetensors (decode) and fs_ckpt (encode), whose rounding is
 * checked here against exhaustive properties first. Large files are sparse (ftruncate): a 5 GiB
 * file occupies a few KiB of disk, and every file is removed by a passing test. */
#include "test_util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>

#include "fs_ckpt.h"
#include "fs_pipeline.h"
#include "fs_safetensors.h"
#include "fs_weights.h"

#define OK(call)                                                                \
    do {                                                                        \
        fs_err e_ = {0};                                                        \
        fs_err *e = &e_;                                                        \
        (void)e;                                                                \
        int rc_ = (call);                                                       \
        if (rc_) fail_msg("%s returned %d: %s", #call, rc_, e_.msg);            \
    } while (0)

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}
static void rm_rf(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* ---- rounding ---- */

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_bf16_rounding(void **state)
{
    (void)state;
    assert_int_equal(fs_bf16_from_float(1.0f), 0x3F80);
    assert_int_equal(fs_bf16_from_float(f32_of(0x3F808000)), 0x3F80); /* tie -> even */
    assert_int_equal(fs_bf16_from_float(f32_of(0x3F818000)), 0x3F82); /* tie -> even (up) */
    assert_int_equal(fs_bf16_from_float(f32_of(0x3F808001)), 0x3F81);
    assert_int_equal(fs_bf16_from_float(f32_of(0xBF807FFF)), 0xBF80);
    assert_int_equal(fs_bf16_from_float(NAN), 0x7FC0);
    assert_int_equal(fs_bf16_from_float(INFINITY), 0x7F80);
    assert_int_equal(fs_bf16_from_float(f32_of(0x7F7FFFFF)), 0x7F80); /* FLT_MAX rounds up to inf */
    /* every bf16 value round-trips; the value halfway to the next goes to the even one */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7F80) == 0x7F80) continue; /* inf / NaN */
        assert_int_equal(fs_bf16_from_float(fs_bf16_to_f32((uint16_t)h)), h);
        if ((h & 0x7FFF) == 0x7F7F) continue;
        const float mid = f32_of((h << 16) | 0x8000);
        assert_int_equal(fs_bf16_from_float(mid), (h & 1) ? h + 1 : h);
    }
}

static void test_f16_rounding(void **state)
{
    (void)state;
    int checked = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7C00) == 0x7C00) continue; /* inf / NaN */
        const float v = fs_f16_to_f32((uint16_t)h);
        if (fs_f16_from_float(v) != h && !(v == 0 && (h & 0x7FFF) == 0)) fail_msg("f16 %04x does not round-trip", h);
        /* next value up, in the same sign */
        if ((h & 0x7FFF) == 0x7BFF) continue;
        const float w = fs_f16_to_f32((uint16_t)(h + 1));
        const double mid = 0.5 * ((double)v + (double)w); /* exact in float: halves have <= 11 bits */
        const float m = (float)mid;
        assert_true((double)m == mid);
        const uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (fs_f16_from_float(m) != even) fail_msg("f16 midpoint of %04x/%04x -> %04x, want %04x", h, h + 1, fs_f16_from_float(m), even);
        /* one float ulp either side of the midpoint goes to the nearer one */
        uint32_t mu;
        memcpy(&mu, &m, 4);
        /* (sign-magnitude on both sides: a smaller float magnitude is nearer h, either sign) */
        assert_int_equal(fs_f16_from_float(f32_of(mu - 1)), h);
        assert_int_equal(fs_f16_from_float(f32_of(mu + 1)), h + 1);
        checked++;
    }
    assert_int_equal(fs_f16_from_float(65504.0f), 0x7BFF);
    assert_int_equal(fs_f16_from_float(65519.99f), 0x7BFF);
    assert_int_equal(fs_f16_from_float(65520.0f), 0x7C00); /* ties to the even 2^16: inf */
    assert_int_equal(fs_f16_from_float(-1e9f), 0xFC00);
    assert_int_equal(fs_f16_from_float(0x1p-25f), 0x0000); /* tie with 0 -> 0 */
    assert_int_equal(fs_f16_from_float(0x1.000002p-25f), 0x0001);
    assert_int_equal(fs_f16_from_float(NAN) & 0x7E00, 0x7E00);
    fprintf(stderr, "    %d half values, midpoints and neighbours round to nearest even\n", checked);
}

/* ---- layouts and sharding (no data written) ---- */

static void test_flux_dev_layouts(void **state)
{
    (void)state;
    fs_config c;
    OK(fs_config_preset(&c, "flux-dev", e));
    fs_ckpt_layout d, b;
    OK(fs_ckpt_layout_init(&d, &c, 0, "", e));
    OK(fs_ckpt_layout_init(&b, &c, 1, "", e));
    /* spec §6: 11,901,408,320 parameters, 23,802,816,640 bytes in BF16, in either naming */
    assert_int_equal(fs_ckpt_total_bytes(&d, FS_ST_BF16), 23802816640ULL);
    assert_int_equal(fs_ckpt_total_bytes(&b, FS_ST_BF16), 23802816640ULL);
    static const struct { const char *name; int64_t r, c; } want[] = {
        {"double_blocks.0.img_attn.qkv.weight", 9216, 3072}, {"double_blocks.18.txt_attn.qkv.bias", 9216, 0},
        {"single_blocks.37.linear1.weight", 21504, 3072},    {"single_blocks.0.linear2.weight", 3072, 15360},
        {"final_layer.adaLN_modulation.1.weight", 6144, 3072}, {"double_blocks.3.img_attn.norm.query_norm.scale", 128, 0},
        {"guidance_in.out_layer.weight", 3072, 3072},        {"img_in.weight", 3072, 64}};
    for (size_t i = 0; i < FS_ARRAY_LEN(want); i++) {
        int found = 0;
        for (int k = 0; k < b.n; k++)
            if (!strcmp(b.t[k].name, want[i].name)) {
                found = 1;
                assert_int_equal(b.t[k].shape[0], want[i].r);
                assert_int_equal(b.t[k].ndim == 2 ? b.t[k].shape[1] : 0, want[i].c);
            }
        if (!found) fail_msg("BFL layout lacks %s", want[i].name);
    }
    /* the swapped halves: BFL rows [0, D) (shift) are norm_out rows [D, 2D) */
    for (int k = 0; k < b.n; k++)
        if (!strcmp(b.t[k].name, "final_layer.adaLN_modulation.1.bias")) {
            assert_int_equal(b.t[k].np, 2);
            assert_int_equal(b.t[k].p[0].dst_r0, 0);
            assert_int_equal(b.t[k].p[0].param_r0, 3072);
            assert_int_equal(b.t[k].p[1].param_r0, 0);
        }
    /* HF's 10 GB rule cuts FLUX.1-dev in 3 shards, as on the Hub; none above the limit */
    int *so = malloc((size_t)d.n * sizeof *so), ns = 0;
    fs_ckpt_shards(&d, FS_ST_BF16, 10000000000ULL, so, &ns);
    assert_int_equal(ns, 3);
    uint64_t sz[3] = {0};
    for (int k = 0; k < d.n; k++) sz[so[k]] += (uint64_t)fs_ckpt_numel(&d.t[k]) * 2;
    for (int k = 0; k < 3; k++) assert_true(sz[k] <= 10000000000ULL);
    assert_true(sz[0] > 4294967296ULL); /* > 4 GiB files with offsets past 2^32 */
    fprintf(stderr, "    flux-dev: %d diffusers / %d BFL tensors, 10GB shards %.2f + %.2f + %.2f GB\n", d.n, b.n,
            sz[0] / 1e9, sz[1] / 1e9, sz[2] / 1e9);
    free(so);
    fs_ckpt_layout_free(&d);
    fs_ckpt_layout_free(&b);
}

/* field by field: the struct has padding */
static void assert_sched_equal(const fs_sched_config *a, const fs_sched_config *b)
{
    assert_int_equal(a->use_dynamic_shifting, b->use_dynamic_shifting);
    assert_true(a->shift == b->shift && a->base_shift == b->base_shift && a->max_shift == b->max_shift);
    assert_int_equal(a->base_image_seq_len, b->base_image_seq_len);
    assert_int_equal(a->max_image_seq_len, b->max_image_seq_len);
}

/* ---- round trips through fs_weights_load ---- */

static float rounded(float v, fs_st_dtype dt)
{
    if (dt == FS_ST_BF16) return fs_bf16_to_f32(fs_bf16_from_float(v));
    if (dt == FS_ST_F16) return fs_f16_to_f32(fs_f16_from_float(v));
    return v;
}

/* Loads `path` (fp32 and fp64 runs) and compares every parameter with fs_weights_synthetic
 * rounded to dt, bit for bit. */
static void expect_loads_as_synthetic(const char *path, const fs_config *c, uint64_t seed, fs_st_dtype dt)
{
    fs_weights syn, w32, w64;
    OK(fs_weights_synthetic(&syn, c, FS_F32, seed, e));
    OK(fs_weights_load(&w32, c, FS_F32, path, e));
    OK(fs_weights_load(&w64, c, FS_F64, path, e));
    int64_t n = 0;
    for (int i = 0; i < syn.n; i++) {
        const int64_t m = fs_tensor_numel(&syn.t[i]);
        const float *s = syn.t[i].data, *a = w32.t[i].data;
        const double *b = w64.t[i].data;
        for (int64_t k = 0; k < m; k++) {
            const float want = rounded(s[k], dt);
            if (memcmp(&a[k], &want, 4) || b[k] != (double)want)
                fail_msg("%s: %s element %lld: loaded %a (fp32) / %a (fp64), want %a", path, syn.desc[i].name,
                         (long long)k, (double)a[k], b[k], (double)want);
        }
        n += m;
    }
    fprintf(stderr, "    %s: %lld values equal synthetic seed %llu as %s\n", path, (long long)n, (unsigned long long)seed,
            fs_st_dtype_name(dt));
    fs_weights_free(&syn);
    fs_weights_free(&w32);
    fs_weights_free(&w64);
}

static void write_ckpt(const char *out, const fs_config *c, fs_ckpt_kind kind, fs_st_dtype dt, uint64_t seed,
                       uint64_t shard, const char *prefix)
{
    fs_ckpt_spec s = {.cfg = *c, .kind = kind, .dtype = dt, .seed = seed, .max_shard_bytes = shard, .bfl_prefix = prefix};
    OK(fs_ckpt_write(&s, out, NULL, e));
}

/* The index agrees with the shards: total_size = sum of the tensors' bytes, every tensor of every
 * shard listed under that shard, no shard's tensor data above the limit (unless one tensor is). */
static void check_index(const char *dir, uint64_t max_shard, int *nshards)
{
    char p[1400];
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors.index.json", dir);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    char *text = calloc(1, 1 << 20);
    size_t got = fread(text, 1, (1 << 20) - 1, f);
    fclose(f);
    assert_true(got > 0);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    const cJSON *wm = cJSON_GetObjectItem(j, "weight_map"), *ts = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "metadata"), "total_size");
    assert_true(cJSON_IsObject(wm) && cJSON_IsNumber(ts));
    char names[64][128];
    int ns = 0, listed = 0;
    uint64_t total = 0;
    for (const cJSON *it = wm->child; it; it = it->next, listed++) {
        int k = 0;
        while (k < ns && strcmp(names[k], it->valuestring)) k++;
        if (k == ns) {
            assert_true(ns < 64);
            snprintf(names[ns++], sizeof names[0], "%s", it->valuestring);
        }
    }
    int in_files = 0;
    for (int k = 0; k < ns; k++) {
        char want[128];
        snprintf(want, sizeof want, "diffusion_pytorch_model-%05d-of-%05d.safetensors", k + 1, ns);
        int present = 0;
        for (int q = 0; q < ns; q++) present |= !strcmp(names[q], want);
        if (!present) fail_msg("index names no shard %s", want);
        snprintf(p, sizeof p, "%s/%s", dir, want);
        fs_st_file sf;
        OK(fs_st_open(&sf, p, e));
        uint64_t bytes = 0, largest = 0;
        for (int t = 0; t < sf.n; t++) {
            const uint64_t b = sf.ent[t].end - sf.ent[t].begin;
            bytes += b;
            largest = b > largest ? b : largest;
            const cJSON *v = cJSON_GetObjectItem(wm, sf.ent[t].name);
            if (!cJSON_IsString(v) || strcmp(v->valuestring, want)) fail_msg("%s: %s not listed under it", want, sf.ent[t].name);
        }
        assert_true(bytes <= max_shard || sf.n == 1);
        total += bytes;
        in_files += sf.n;
        fs_st_close(&sf);
    }
    assert_int_equal(in_files, listed);
    assert_int_equal((uint64_t)ts->valuedouble, total);
    *nshards = ns;
    cJSON_Delete(j);
    free(text);
}

static void test_roundtrip_diffusers_sharded(void **state)
{
    (void)state;
    char tmp[64], out[128];
    fs_test_tmpdir(tmp, sizeof tmp);
    fs_config c;
    OK(fs_config_preset(&c, "tiny", e));
    snprintf(out, sizeof out, "%s/transformer", tmp);
    write_ckpt(out, &c, FS_CKPT_DIFFUSERS, FS_ST_BF16, 3, 200000, "");
    int ns = 0;
    check_index(out, 200000, &ns);
    assert_true(ns > 5); /* the small limit really split it */
    expect_loads_as_synthetic(out, &c, 3, FS_ST_BF16);
    /* the config.json it wrote is this config */
    fs_config back;
    char p[300];
    snprintf(p, sizeof p, "%s/config.json", out);
    OK(fs_pipeline_config_file(&back, p, e));
    assert_memory_equal(&back, &c, sizeof c);
    rm_rf(tmp);
}

static void test_roundtrip_one_shard(void **state)
{
    (void)state;
    char tmp[64], out[128], p[300];
    fs_test_tmpdir(tmp, sizeof tmp);
    fs_config c;
    OK(fs_config_preset(&c, "odd", e));
    snprintf(out, sizeof out, "%s/t", tmp);
    write_ckpt(out, &c, FS_CKPT_DIFFUSERS, FS_ST_F32, 0, 10000000000ULL, "");
    /* one shard: HF's single-file name and no index */
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", out);
    assert_int_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors.index.json", out);
    assert_int_not_equal(access(p, F_OK), 0);
    expect_loads_as_synthetic(out, &c, 0, FS_ST_F32);
    rm_rf(tmp);
}

static void test_roundtrip_bfl(void **state)
{
    (void)state;
    char tmp[64], out[256];
    fs_test_tmpdir(tmp, sizeof tmp);
    fs_config c;
    OK(fs_config_preset(&c, "tiny", e));
    snprintf(out, sizeof out, "%s/flux1-tiny.safetensors", tmp);
    write_ckpt(out, &c, FS_CKPT_BFL, FS_ST_BF16, 11, 0, "");
    fs_st_file f;
    OK(fs_st_open(&f, out, e));
    assert_non_null(fs_st_find(&f, "double_blocks.1.img_attn.qkv.weight"));
    assert_non_null(fs_st_find(&f, "single_blocks.3.linear1.bias"));
    assert_null(fs_st_find(&f, "transformer_blocks.0.attn.to_q.weight"));
    fs_st_close(&f);
    expect_loads_as_synthetic(out, &c, 11, FS_ST_BF16);
    snprintf(out, sizeof out, "%s/prefixed-f16.safetensors", tmp);
    OK(fs_config_preset(&c, "odd", e)); /* no guidance embedder */
    write_ckpt(out, &c, FS_CKPT_BFL, FS_ST_F16, 0, 0, "model.diffusion_model.");
    expect_loads_as_synthetic(out, &c, 0, FS_ST_F16);
    rm_rf(tmp);
}

static void test_pipeline_folder(void **state)
{
    (void)state;
    char tmp[64], root[256], p[400];
    fs_test_tmpdir(tmp, sizeof tmp);
    fs_config c, back;
    OK(fs_config_preset(&c, "tiny", e));
    snprintf(root, sizeof root, "%s/FLUX.1-tiny", tmp);
    write_ckpt(root, &c, FS_CKPT_PIPELINE, FS_ST_BF16, 0, 1000000, "");
    expect_loads_as_synthetic(root, &c, 0, FS_ST_BF16); /* the root: its transformer/ */

    fs_pipeline pl;
    OK(fs_pipeline_resolve(&pl, root, e));
    assert_non_null(pl.config);
    assert_non_null(pl.scheduler);
    assert_non_null(pl.root);
    assert_non_null(strstr(pl.weights, "/transformer"));
    fs_sched_config s, dev;
    OK(fs_pipeline_sched_file(&s, pl.scheduler, e));
    OK(fs_sched_preset(&dev, "dev", e));
    assert_sched_equal(&s, &dev); /* FLUX.1-dev's scheduler_config.json = the dev preset */
    fs_pipeline_free(&pl);
    /* from the transformer folder: config beside, scheduler one level up */
    snprintf(p, sizeof p, "%s/transformer", root);
    OK(fs_pipeline_resolve(&pl, p, e));
    assert_non_null(pl.config);
    assert_non_null(pl.scheduler);
    fs_pipeline_free(&pl);
    /* --config DIR: the root and the transformer folder */
    OK(fs_pipeline_load_config(&back, root, e));
    assert_memory_equal(&back, &c, sizeof c);
    OK(fs_pipeline_load_config(&back, p, e));
    assert_memory_equal(&back, &c, sizeof c);
    rm_rf(tmp);
}

/* ---- writer safety ---- */

static int cancel_after_first(void *ctx, uint64_t done, uint64_t total)
{
    (void)total;
    int *calls = ctx;
    return ++*calls > 1 && done > 0;
}

static void test_writer_refuses_and_cleans_up(void **state)
{
    (void)state;
    char tmp[64], out[256];
    fs_test_tmpdir(tmp, sizeof tmp);
    fs_config c;
    OK(fs_config_preset(&c, "tiny", e));
    fs_ckpt_spec s = {.cfg = c, .kind = FS_CKPT_PIPELINE, .dtype = FS_ST_BF16, .max_shard_bytes = 100000};
    fs_err e = {0};
    /* existing output: refused, untouched */
    snprintf(out, sizeof out, "%s/exists", tmp);
    write_text(out, "keep me");
    assert_int_equal(fs_ckpt_write(&s, out, NULL, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "already exists"));
    /* interrupted half way: neither the output nor a temporary is left */
    int calls = 0;
    s.progress = cancel_after_first;
    s.progress_ctx = &calls;
    snprintf(out, sizeof out, "%s/cut", tmp);
    assert_int_equal(fs_ckpt_write(&s, out, NULL, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "interrupted"));
    s.kind = FS_CKPT_BFL;
    calls = 0;
    snprintf(out, sizeof out, "%s/cut.safetensors", tmp);
    assert_int_equal(fs_ckpt_write(&s, out, NULL, &e), FS_E_INPUT);
    /* only the file we made remains */
    int n = 0;
    DIR *d = opendir(tmp);
    for (struct dirent *de; (de = readdir(d));)
        if (de->d_name[0] != '.') {
            n++;
            if (strcmp(de->d_name, "exists")) fail_msg("left behind: %s", de->d_name);
        }
    closedir(d);
    assert_int_equal(n, 1);
    rm_rf(tmp);
}

/* ---- files > 4 GiB, offsets > 2^32 (sparse) ---- */

#define GAP (5ULL << 30) /* 5 GiB of hole before the tensors */

/* A safetensors file whose data region starts with a GAP-byte hole; the tensors of `l` follow it
 * (offsets >= 5 GiB), written for real. Sparse: the hole costs no disk. */
static void write_sparse(const char *path, const fs_ckpt_layout *l, const fs_weights *w, fs_st_dtype dt, int pad_tensor)
{
    const size_t es = fs_st_dtype_size(dt);
    size_t cap = 4096 + (size_t)l->n * 256, len = 0;
    char *h = malloc(cap);
    len += (size_t)snprintf(h, cap, "{");
    uint64_t off = GAP;
    if (pad_tensor) /* a tensor covering the hole (numeric, all zero when read) */
        len += (size_t)snprintf(h + len, cap - len, "\"pad\":{\"dtype\":\"F32\",\"shape\":[%llu],\"data_offsets\":[0,%llu]},",
                                (unsigned long long)(GAP / 4), (unsigned long long)GAP);
    for (int k = 0; k < l->n; k++) {
        const uint64_t nb = (uint64_t)fs_ckpt_numel(&l->t[k]) * es;
        char shape[64];
        if (l->t[k].ndim == 2) snprintf(shape, sizeof shape, "[%lld,%lld]", (long long)l->t[k].shape[0], (long long)l->t[k].shape[1]);
        else snprintf(shape, sizeof shape, "[%lld]", (long long)l->t[k].shape[0]);
        len += (size_t)snprintf(h + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}",
                                k ? "," : "", l->t[k].name, fs_st_dtype_name(dt), shape, (unsigned long long)off,
                                (unsigned long long)(off + nb));
        off += nb;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' ';
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    const uint64_t hl = len;
    assert_int_equal(write(fd, &hl, 8), 8);
    assert_int_equal(write(fd, h, len), (ssize_t)len);
    const uint64_t data0 = 8 + len;
    assert_int_equal(ftruncate(fd, (off_t)(data0 + off)), 0); /* the hole */
    uint64_t o = data0 + GAP;
    for (int k = 0; k < l->n; k++) { /* diffusers layout: tensor k is parameter k */
        const int64_t m = fs_ckpt_numel(&l->t[k]);
        const float *v = w->t[l->t[k].p[0].param].data;
        void *buf = malloc((size_t)m * es);
        for (int64_t i = 0; i < m; i++) {
            if (dt == FS_ST_BF16) ((uint16_t *)buf)[i] = fs_bf16_from_float(v[i]);
            else ((float *)buf)[i] = v[i];
        }
        assert_int_equal(pwrite(fd, buf, (size_t)m * es, (off_t)o), (ssize_t)(m * (int64_t)es));
        o += (uint64_t)m * es;
        free(buf);
    }
    assert_int_equal(close(fd), 0);
    free(h);
}

static void test_sparse_5gib_file(void **state)
{
    (void)state;
    char tmp[64], path[256];
    fs_test_tmpdir(tmp, sizeof tmp);
    fs_config c;
    OK(fs_config_preset(&c, "odd", e));
    fs_ckpt_layout l;
    OK(fs_ckpt_layout_init(&l, &c, 0, "", e));
    fs_weights syn;
    OK(fs_weights_synthetic(&syn, &c, FS_F32, 9, e));

    /* 1. the reader: a 5 GiB "pad" tensor (holes read as zeros) and every tensor past 2^32 */
    snprintf(path, sizeof path, "%s/big-pad.safetensors", tmp);
    write_sparse(path, &l, &syn, FS_ST_BF16, 1);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true((uint64_t)st.st_size > GAP);
    fprintf(stderr, "    %s: %.2f GiB, %lld KiB on disk\n", path, st.st_size / 1073741824.0, (long long)st.st_blocks / 2);
    assert_true((uint64_t)st.st_blocks * 512 < (64u << 20)); /* sparse: the hole costs nothing */
    fs_st_file f;
    OK(fs_st_open(&f, path, e));
    const fs_st_entry *pad = fs_st_find(&f, "pad"), *x = fs_st_find(&f, "proj_out.weight");
    assert_non_null(pad);
    assert_non_null(x);
    assert_true(x->begin >= GAP && x->begin > 0xFFFFFFFFULL);
    float z[4];
    OK(fs_st_decode(pad, (int64_t)(GAP / 4) - 4, 4, FS_F32, z, e));
    for (int i = 0; i < 4; i++) assert_true(z[i] == 0.0f);
    const int k = fs_param_find(syn.desc, syn.n, "proj_out.weight");
    const int64_t m = fs_tensor_numel(&syn.t[k]);
    float *got = malloc((size_t)m * sizeof *got);
    OK(fs_st_decode(x, 0, m, FS_F32, got, e));
    for (int64_t i = 0; i < m; i++)
        assert_true(got[i] == fs_bf16_to_f32(fs_bf16_from_float(((const float *)syn.t[k].data)[i])));
    free(got);
    fs_st_close(&f);
    unlink(path);

    /* 2. fs_weights_load: a checkpoint whose tensors all start past 5 GiB — F32 (mmap views into
     *    the mapping beyond 2^32) and BF16 (decoded) */
    for (int pass = 0; pass < 2; pass++) {
        const fs_st_dtype dt = pass ? FS_ST_BF16 : FS_ST_F32;
        snprintf(path, sizeof path, "%s/gap-%s.safetensors", tmp, fs_st_dtype_name(dt));
        write_sparse(path, &l, &syn, dt, 0);
        fs_weights w;
        OK(fs_weights_load(&w, &c, FS_F32, path, e));
        for (int i = 0; i < syn.n; i++) {
            const float *a = w.t[i].data, *s = syn.t[i].data;
            if (dt == FS_ST_F32) assert_false(w.t[i].owns); /* a view: its address is past map + 5 GiB */
            for (int64_t j = 0; j < fs_tensor_numel(&syn.t[i]); j++) {
                const float want = rounded(s[j], dt);
                if (memcmp(&a[j], &want, 4)) fail_msg("%s %s[%lld]: %a want %a", path, syn.desc[i].name, (long long)j, (double)a[j], (double)want);
            }
        }
        fs_weights_free(&w);
        unlink(path);
    }
    fs_weights_free(&syn);
    fs_ckpt_layout_free(&l);
    rm_rf(tmp);
}

/* ---- fs_pipeline: bad inputs are one-line errors ---- */

static void expect_fail(int rc, const fs_err *e, const char *part)
{
    if (getenv("FS_TEST_VERBOSE")) fprintf(stderr, "    error message: %s\n", e->msg);
    assert_int_equal(rc, FS_E_INPUT);
    if (!strstr(e->msg, part)) fail_msg("message lacks \"%s\": %s", part, e->msg);
    assert_null(strchr(e->msg, '\n'));
}

static void test_pipeline_bad(void **state)
{
    (void)state;
    char tmp[64], p[300];
    fs_test_tmpdir(tmp, sizeof tmp);
    fs_config c;
    fs_sched_config s;
    fs_err e = {0};
    expect_fail(fs_pipeline_load_config(&c, tmp, &e), &e, "neither config.json nor transformer/config.json");
    expect_fail(fs_pipeline_config_file(&c, tmp, &e), &e, "is a directory");
    snprintf(p, sizeof p, "%s/no-such.json", tmp);
    expect_fail(fs_pipeline_load_config(&c, p, &e), &e, "no-such.json");
    snprintf(p, sizeof p, "%s/config.json", tmp);
    write_text(p, "{\"_class_name\": \"UNet2DConditionModel\"}");
    expect_fail(fs_pipeline_config_file(&c, p, &e), &e, "not FluxTransformer2DModel");
    write_text(p, "{\"in_channels\": 64,");
    expect_fail(fs_pipeline_load_config(&c, tmp, &e), &e, "malformed JSON");
    /* the Hub's FLUX.1-dev config.json (no axes_dims_rope, out_channels absent) parses as flux-dev */
    write_text(p, "{\"_class_name\": \"FluxTransformer2DModel\", \"_diffusers_version\": \"0.30.0.dev0\", "
                  "\"attention_head_dim\": 128, \"guidance_embeds\": true, \"in_channels\": 64, \"joint_attention_dim\": "
                  "4096, \"num_attention_heads\": 24, \"num_layers\": 19, \"num_single_layers\": 38, \"patch_size\": 1, "
                  "\"pooled_projection_dim\": 768}");
    fs_config dev;
    OK(fs_config_preset(&dev, "flux-dev", e));
    OK(fs_pipeline_config_file(&c, p, e));
    assert_memory_equal(&c, &dev, sizeof c);

    snprintf(p, sizeof p, "%s/scheduler_config.json", tmp);
    write_text(p, "{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"use_karras_sigmas\": true}");
    expect_fail(fs_pipeline_sched_file(&s, p, &e), &e, "use_karras_sigmas");
    write_text(p, "{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"time_shift_type\": \"linear\"}");
    expect_fail(fs_pipeline_sched_file(&s, p, &e), &e, "time_shift_type");
    write_text(p, "{\"_class_name\": \"EulerDiscreteScheduler\"}");
    expect_fail(fs_pipeline_sched_file(&s, p, &e), &e, "not FlowMatchEulerDiscreteScheduler");
    write_text(p, "{\"shift\": \"3\"}");
    expect_fail(fs_pipeline_sched_file(&s, p, &e), &e, "'shift' is not a number");
    /* schnell's file and the defaults */
    write_text(p, "{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"shift\": 1.0, \"use_dynamic_shifting\": "
                  "false, \"shift_terminal\": null, \"time_shift_type\": \"exponential\", \"invert_sigmas\": false}");
    fs_sched_config want;
    OK(fs_pipeline_sched_file(&s, p, e));
    OK(fs_sched_preset(&want, "schnell", e));
    assert_sched_equal(&s, &want);

    /* a pipeline folder whose model_index names another transformer */
    snprintf(p, sizeof p, "%s/transformer", tmp);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/model_index.json", tmp);
    write_text(p, "{\"_class_name\": \"StableDiffusion3Pipeline\", \"transformer\": [\"diffusers\", \"SD3Transformer2DModel\"]}");
    fs_pipeline pl;
    expect_fail(fs_pipeline_resolve(&pl, tmp, &e), &e, "SD3Transformer2DModel");
    rm_rf(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_f16_rounding),
        cmocka_unit_test(test_flux_dev_layouts),
        cmocka_unit_test(test_roundtrip_diffusers_sharded),
        cmocka_unit_test(test_roundtrip_one_shard),
        cmocka_unit_test(test_roundtrip_bfl),
        cmocka_unit_test(test_pipeline_folder),
        cmocka_unit_test(test_writer_refuses_and_cleans_up),
        cmocka_unit_test(test_sparse_5gib_file),
        cmocka_unit_test(test_pipeline_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
