/* test_safetensors.c — the safetensors reader (fs_safetensors.c) and fs_weights_load.
 *
 * Synthetic checkpoints are written by a small serialiser below (header JSON via cJSON, raw
 * little-endian data), independent of the reader, so a bug shared by both sides cannot hide.
 * The BFL layout is built here from the diffusers tensors by its own table, written from
 * ../shared/flux-spec.md §7 rather than from fs_weights_load.c's. */
#include "test_util.h"

#include <cjson/cJSON.h>
#include <ftw.h>
#include <math.h>

#include "fs_config.h"
#include "fs_safetensors.h"
#include "fs_weights.h"

/* ---------------------------------------------------------------------------------------------
 * helpers
 * ------------------------------------------------------------------------------------------- */

/* Fails the test unless rc == want and the message holds every (NULL-terminated) substring. */
static void expect_err(int rc, const fs_err *e, int want, ...)
{
    if (getenv("FS_TEST_VERBOSE")) fprintf(stderr, "    error message: %s\n", e->msg);
    if (rc != want) fail_msg("return code %d, expected %d; message: %s", rc, want, e->msg);
    va_list ap;
    va_start(ap, want);
    for (const char *s; (s = va_arg(ap, const char *));)
        if (!strstr(e->msg, s)) fail_msg("error message lacks \"%s\": %s", s, e->msg);
    va_end(ap);
}

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

/* Removes a test's temporary directory; called at the end of a passing test only, so a
 * failing one leaves its files for inspection. */
static void rm_rf(const char *dir) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A raw safetensors file: 8-byte LE length of `header` (as given, unpadded) + header + data. */
static void write_raw(const char *path, const char *header, const void *data, size_t ndata)
{
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + ndata + 1);
    uint64_t len = hl;
    memcpy(buf, &len, 8); /* the host is little-endian, like the format */
    memcpy(buf + 8, header, hl);
    if (ndata) memcpy(buf + 8 + hl, data, ndata);
    write_bytes(path, buf, 8 + hl + ndata);
    free(buf);
}

/* ---- an in-memory list of tensors and its serialiser ---- */
typedef struct st_t {
    char name[192];
    const char *dtype; /* "F32", "F64", "BF16", "F16", or anything for bad-input tests */
    int ndim;
    int64_t shape[4];
    unsigned char *data; /* owned */
    size_t nbytes;
} st_t;

typedef struct st_list {
    st_t *t;
    int n, cap;
} st_list;

static st_t *st_add(st_list *l, const char *name, const char *dtype, int ndim, const int64_t *shape, const void *data,
                    size_t nbytes)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->t = realloc(l->t, (size_t)l->cap * sizeof *l->t);
        assert_non_null(l->t);
    }
    st_t *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = malloc(nbytes ? nbytes : 1);
    assert_non_null(t->data);
    if (nbytes) memcpy(t->data, data, nbytes);
    t->nbytes = nbytes;
    return t;
}

static st_t *st_get(st_list *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->t[i].name, name)) return &l->t[i];
    fail_msg("test bug: no tensor %s in list", name);
    return NULL;
}

static void st_remove(st_list *l, const char *name)
{
    st_t *t = st_get(l, name);
    free(t->data);
    memmove(t, t + 1, (size_t)(l->t + l->n - (t + 1)) * sizeof *t);
    l->n--;
}

static void st_list_free(st_list *l)
{
    for (int i = 0; i < l->n; i++) free(l->t[i].data);
    free(l->t);
    memset(l, 0, sizeof *l);
}

/* Writes the tensors with sel[i] != 0 (all when sel is NULL), data back to back in list order,
 * header padded with spaces to a multiple of 8 like the Python writer. */
static void st_write(const char *path, const st_list *l, const unsigned char *sel)
{
    cJSON *h = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    cJSON_AddStringToObject(meta, "producer", "test_safetensors.c");
    size_t off = 0;
    for (int i = 0; i < l->n; i++) {
        if (sel && !sel[i]) continue;
        const st_t *t = &l->t[i];
        cJSON *o = cJSON_AddObjectToObject(h, t->name);
        cJSON_AddStringToObject(o, "dtype", t->dtype);
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *of = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + t->nbytes)));
        off += t->nbytes;
    }
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t hl = strlen(js), padded = (hl + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t len = padded;
    fwrite(&len, 8, 1, f);
    fwrite(js, 1, hl, f);
    for (size_t i = hl; i < padded; i++) fputc(' ', f);
    for (int i = 0; i < l->n; i++)
        if (!sel || sel[i]) fwrite(l->t[i].data, 1, l->t[i].nbytes, f);
    assert_int_equal(fclose(f), 0);
    free(js);
}

/* ---- float encoders (test side, independent of the decoder under test) ---- */
static uint16_t f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet nan */
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

/* Round-to-nearest-even float → half via exact double arithmetic (finite inputs only). */
static uint16_t f32_to_f16(float xf)
{
    double x = xf;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    x = fabs(x);
    if (x < 0x1p-14) /* subnormal (or rounds up into the smallest normal: same bit pattern) */
        return sign | (uint16_t)nearbyint(x * 0x1p24);
    int ex;
    frexp(x, &ex);
    int E = ex - 1;
    double mant = nearbyint((ldexp(x, -E) - 1.0) * 1024.0);
    if (mant == 1024) mant = 0, E++;
    if (E + 15 >= 31) return sign | 0x7c00;
    return sign | (uint16_t)((E + 15) << 10) | (uint16_t)mant;
}

/* Every tensor of w into l, stored as `dtype` ("F32", "F64", "BF16", "F16"). */
static void st_from_weights(st_list *l, const fs_weights *w, const char *dtype)
{
    for (int i = 0; i < w->n; i++) {
        const fs_tensor *t = &w->t[i];
        int64_t n = fs_tensor_numel(t);
        size_t es = !strcmp(dtype, "F64") ? 8 : !strcmp(dtype, "F32") ? 4 : 2;
        unsigned char *buf = malloc((size_t)n * es);
        for (int64_t k = 0; k < n; k++) {
            double v = fs_tensor_get(t, k);
            if (es == 8) memcpy(buf + k * 8, &v, 8);
            else if (es == 4) {
                float f = (float)v;
                memcpy(buf + k * 4, &f, 4);
            } else {
                uint16_t h = !strcmp(dtype, "BF16") ? f32_to_bf16((float)v) : f32_to_f16((float)v);
                memcpy(buf + k * 2, &h, 2);
            }
        }
        st_add(l, w->desc[i].name, dtype, t->ndim, t->shape, buf, (size_t)n * es);
        free(buf);
    }
}

static void synthetic(fs_weights *w, fs_config *c, const char *preset, fs_dtype dt)
{
    OK(fs_config_preset(c, preset, e));
    OK(fs_weights_synthetic(w, c, dt, 1234, e));
}

/* Every loaded tensor equals the original bit for bit (same dtype). */
static void assert_weights_equal(const fs_weights *a, const fs_weights *b)
{
    assert_int_equal(a->n, b->n);
    for (int i = 0; i < a->n; i++) {
        assert_int_equal(a->t[i].dtype, b->t[i].dtype);
        assert_int_equal(a->t[i].ndim, b->t[i].ndim);
        for (int d = 0; d < a->t[i].ndim; d++) assert_int_equal(a->t[i].shape[d], b->t[i].shape[d]);
        if (memcmp(a->t[i].data, b->t[i].data, fs_tensor_nbytes(&a->t[i])))
            fail_msg("tensor %s differs", a->desc[i].name);
    }
}

static int is_view_into_maps(const fs_weights *w, const fs_tensor *t)
{
    return !t->owns && fs_wload_maps(w->load, t->data, fs_tensor_nbytes(t));
}

/* ---------------------------------------------------------------------------------------------
 * decoding
 * ------------------------------------------------------------------------------------------- */

static void test_bf16_values(void **state)
{
    (void)state;
    assert_true(fs_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(fs_bf16_to_f32(0xc020) == -2.5f);
    assert_true(fs_bf16_to_f32(0x4049) == 3.140625f); /* 0x40490000: 1.5703125 · 2 */
    assert_true(fs_bf16_to_f32(0x0001) == 0x1p-133f); /* smallest bf16 subnormal */
    assert_true(fs_bf16_to_f32(0x7f7f) == 0x1.fep127f); /* largest finite bf16 */
    assert_true(isinf(fs_bf16_to_f32(0x7f80)) && fs_bf16_to_f32(0x7f80) > 0);
    assert_true(isinf(fs_bf16_to_f32(0xff80)) && fs_bf16_to_f32(0xff80) < 0);
    assert_true(isnan(fs_bf16_to_f32(0x7fc0)));
    float nz = fs_bf16_to_f32(0x8000);
    assert_true(nz == 0.0f && signbit(nz));
    /* and the test's own encoder agrees (it is used for the BF16 round trip below) */
    assert_int_equal(f32_to_bf16(3.140625f), 0x4049);
    assert_int_equal(f32_to_bf16(1.00390625f), 0x3f80); /* tie 1 + 2^-8 rounds to even (down) */
    assert_int_equal(f32_to_bf16(1.01171875f), 0x3f82); /* tie 1 + 3·2^-8 rounds to even (up) */
}

static void test_f16_values(void **state)
{
    (void)state;
    assert_true(fs_f16_to_f32(0x3c00) == 1.0f);
    assert_true(fs_f16_to_f32(0xc100) == -2.5f);
    assert_true(fs_f16_to_f32(0x4248) == 3.140625f);
    assert_true(fs_f16_to_f32(0x3555) == 0.333251953125f);
    assert_true(fs_f16_to_f32(0x0001) == 0x1p-24f);          /* smallest subnormal */
    assert_true(fs_f16_to_f32(0x8001) == -0x1p-24f);
    assert_true(fs_f16_to_f32(0x0200) == 0x1p-15f);          /* a subnormal with a high mantissa bit */
    assert_true(fs_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);   /* largest subnormal */
    assert_true(fs_f16_to_f32(0x0400) == 0x1p-14f);          /* smallest normal */
    assert_true(fs_f16_to_f32(0x7bff) == 65504.0f);          /* max half */
    assert_true(fs_f16_to_f32(0xfbff) == -65504.0f);
    assert_true(isinf(fs_f16_to_f32(0x7c00)) && fs_f16_to_f32(0x7c00) > 0);
    assert_true(isinf(fs_f16_to_f32(0xfc00)) && fs_f16_to_f32(0xfc00) < 0);
    assert_true(isnan(fs_f16_to_f32(0x7e00)));
    assert_true(isnan(fs_f16_to_f32(0x7c01))); /* signalling nan stays a nan, not an inf */
    float nz = fs_f16_to_f32(0x8000);
    assert_true(nz == 0.0f && signbit(nz));
    /* every finite half survives half → float → half (exercises the test encoder too) */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        assert_int_equal(f32_to_f16(fs_f16_to_f32((uint16_t)h)), h);
    }
}

/* fs_st_decode on an in-memory entry: every source dtype into float and double, a sub-range,
 * an unaligned source, and a range outside the tensor. */
static void test_decode_range(void **state)
{
    (void)state;
    const double want[6] = {1.0, -2.5, 3.140625, 0.5, 65504.0, 0x1p-24};
    unsigned char raw[1 + 6 * 8]; /* +1: decode from an odd address */
    fs_st_entry en = {.name = "t", .ndim = 2, .shape = {3, 2}};
    for (int dt = FS_ST_F32; dt <= FS_ST_F16; dt++) {
        en.dtype = (fs_st_dtype)dt;
        en.data = raw + 1;
        for (int i = 0; i < 6; i++) {
            unsigned char *p = raw + 1 + i * fs_st_dtype_size(en.dtype);
            float f = (float)want[i];
            uint16_t h;
            switch (en.dtype) {
            case FS_ST_F32: memcpy(p, &f, 4); break;
            case FS_ST_F64: memcpy(p, &want[i], 8); break;
            case FS_ST_BF16: h = f32_to_bf16(f); memcpy(p, &h, 2); break;
            case FS_ST_F16: h = f32_to_f16(f); memcpy(p, &h, 2); break;
            }
        }
        float fo[4] = {0};
        double dout[4] = {0};
        OK(fs_st_decode(&en, 2, 4, FS_F32, fo, e)); /* rows [1, 3) */
        OK(fs_st_decode(&en, 2, 4, FS_F64, dout, e));
        for (int i = 0; i < 4; i++) {
            double w = want[2 + i];
            if (en.dtype == FS_ST_BF16) w = fs_bf16_to_f32(f32_to_bf16((float)w));
            assert_true(fo[i] == (float)w);
            assert_true(dout[i] == w);
        }
        fs_err e = {0};
        expect_err(fs_st_decode(&en, 4, 3, FS_F32, fo, &e), &e, FS_E_INTERNAL, "'t'", NULL);
    }
    assert_true(fs_f16_to_f32(f32_to_f16(65504.0f)) == 65504.0f);
}

/* ---------------------------------------------------------------------------------------------
 * the reference checkpoints
 * ------------------------------------------------------------------------------------------- */

/* Spot values of ../shared/reference/tiny/weights.safetensors, read independently with
 *   /usr/bin/python3: n = struct.unpack('<Q', f[:8]); h = json.loads(f[8:8+n]);
 *   np.frombuffer(f[8+n+b : 8+n+e], '<f4').reshape(shape)[idx], printed with float.hex()
 * (flat index = row-major index into the tensor). */
static const struct {
    const char *name;
    int64_t flat;
    float value;
} tiny_spots[] = {
    {"x_embedder.weight", 0, 0x1.52c13ep-4f},                       /* [0, 0]   0.08270382 */
    {"x_embedder.weight", 2047, -0x1.3e5448p-3f},                   /* [127, 15] */
    {"x_embedder.bias", 5, 0x1.bb92e6p-5f},
    {"transformer_blocks.1.attn.norm_added_k.weight", 31, 0x1.167fa6p+0f},
    {"single_transformer_blocks.3.proj_out.weight", 64500, 0x1.04f9aep-5f}, /* [100, 500] */
    {"norm_out.linear.bias", 255, -0x1.ef7842p-7f},
    {"proj_out.weight", 2047, 0x1.888cbcp-7f},                      /* [15, 127] */
    {"time_text_embed.guidance_embedder.linear_1.weight", 968, -0x1.06b988p-5f}, /* [3, 200] */
};

static int reference_paths(const char *which, char *st, char *cfg, size_t n)
{
    const char *ref = fs_test_reference_dir();
    if (!ref) return 0;
    snprintf(st, n, "%s/%s/weights.safetensors", ref, which);
    snprintf(cfg, n, "%s/%s/config.json", ref, which);
    return access(st, R_OK) == 0 && access(cfg, R_OK) == 0;
}

static void test_reference_file_index(void **state)
{
    (void)state;
    char st[512], cfgp[512];
    if (!reference_paths("tiny", st, cfgp, sizeof st)) FS_SKIP_LOUDLY("reference tiny/ not found");
    fs_st_file f;
    OK(fs_st_open(&f, st, e));
    assert_int_equal(f.n, 140); /* 141 header members, one of them __metadata__ */
    assert_null(fs_st_find(&f, "__metadata__"));
    for (int i = 1; i < f.n; i++) assert_true(strcmp(f.ent[i - 1].name, f.ent[i].name) < 0);
    const fs_st_entry *x = fs_st_find(&f, "context_embedder.weight");
    assert_non_null(x);
    assert_int_equal(x->dtype, FS_ST_F32);
    assert_int_equal(x->ndim, 2);
    assert_int_equal(x->shape[0], 128);
    assert_int_equal(x->shape[1], 64);
    assert_int_equal(x->begin, 512); /* from the header: data_offsets [512, 33280] */
    assert_int_equal(x->end, 33280);
    assert_int_equal(f.data_start, 8 + 15552);
    fs_st_close(&f);
}

static void check_tiny_spots(const fs_weights *w)
{
    for (size_t s = 0; s < FS_ARRAY_LEN(tiny_spots); s++) {
        const fs_tensor *t = fs_weights_get(w, tiny_spots[s].name);
        assert_non_null(t);
        double got = fs_tensor_get(t, tiny_spots[s].flat);
        if (got != (double)tiny_spots[s].value)
            fail_msg("%s[%lld] = %.9g, python read %.9g", tiny_spots[s].name, (long long)tiny_spots[s].flat, got,
                     (double)tiny_spots[s].value);
    }
}

static void test_reference_tiny_f32(void **state)
{
    (void)state;
    char st[512], cfgp[512];
    if (!reference_paths("tiny", st, cfgp, sizeof st)) FS_SKIP_LOUDLY("reference tiny/ not found");
    fs_config c;
    fs_weights w;
    OK(fs_config_from_file(&c, cfgp, e));
    OK(fs_weights_load(&w, &c, FS_F32, st, e));
    assert_int_equal(w.n, 140);
    assert_int_equal(fs_wload_nfiles(w.load), 1);
    assert_string_equal(w.source, st);
    for (int i = 0; i < w.n; i++) {
        assert_int_equal(w.t[i].dtype, FS_F32);
        if (!is_view_into_maps(&w, &w.t[i])) fail_msg("%s is not a view into the mapping", w.desc[i].name);
    }
    check_tiny_spots(&w);
    fs_weights_free(&w);
}

static void test_reference_tiny_f64(void **state)
{
    (void)state;
    char st[512], cfgp[512];
    if (!reference_paths("tiny", st, cfgp, sizeof st)) FS_SKIP_LOUDLY("reference tiny/ not found");
    fs_config c;
    fs_weights w, w32;
    OK(fs_config_from_file(&c, cfgp, e));
    OK(fs_weights_load(&w, &c, FS_F64, st, e));
    OK(fs_weights_load(&w32, &c, FS_F32, st, e));
    for (int i = 0; i < w.n; i++) {
        assert_int_equal(w.t[i].dtype, FS_F64);
        assert_int_equal(w.t[i].owns, 1);
        for (int64_t k = 0; k < fs_tensor_numel(&w.t[i]); k++)
            if (fs_tensor_get(&w.t[i], k) != fs_tensor_get(&w32.t[i], k))
                fail_msg("%s[%lld] differs between the F64 and the F32 load", w.desc[i].name, (long long)k);
    }
    check_tiny_spots(&w);
    fs_weights_free(&w);
    fs_weights_free(&w32);
}

static void test_reference_odd(void **state)
{
    (void)state;
    char st[512], cfgp[512];
    if (!reference_paths("odd", st, cfgp, sizeof st)) FS_SKIP_LOUDLY("reference odd/ not found");
    fs_config c;
    fs_weights w;
    OK(fs_config_from_file(&c, cfgp, e));
    OK(fs_weights_load(&w, &c, FS_F32, st, e));
    assert_int_equal(w.n, 90); /* no guidance embedder */
    assert_null(fs_weights_get(&w, "time_text_embed.guidance_embedder.linear_1.weight"));
    fs_weights_free(&w);
    /* the tiny checkpoint with the odd config: the first disagreement is reported */
    char tiny[512], tcfg[512];
    if (reference_paths("tiny", tiny, tcfg, sizeof tiny)) {
        fs_err e = {0};
        expect_err(fs_weights_load(&w, &c, FS_F32, tiny, &e), &e, FS_E_INPUT, tiny, "'x_embedder.weight'",
                   "expected [96, 8] from config, file has [128, 16]", NULL);
        assert_null(w.t);
    }
}

/* ---------------------------------------------------------------------------------------------
 * round trips through synthetic files
 * ------------------------------------------------------------------------------------------- */

static void test_roundtrip_f32(void **state)
{
    (void)state;
    char dir[64], path[256];
    fs_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fs_config c;
    fs_weights src, w, w64;
    synthetic(&src, &c, "odd", FS_F32);
    st_list l = {0};
    st_from_weights(&l, &src, "F32");
    st_write(path, &l, NULL);
    OK(fs_weights_load(&w, &c, FS_F32, path, e));
    assert_weights_equal(&src, &w);
    for (int i = 0; i < w.n; i++) assert_true(is_view_into_maps(&w, &w.t[i]));
    OK(fs_weights_load(&w64, &c, FS_F64, path, e));
    for (int i = 0; i < w.n; i++) {
        assert_int_equal(w64.t[i].owns, 1);
        for (int64_t k = 0; k < fs_tensor_numel(&w.t[i]); k++)
            assert_true(fs_tensor_get(&w64.t[i], k) == fs_tensor_get(&src.t[i], k));
    }
    /* the directory form finds the single file */
    fs_weights wd;
    OK(fs_weights_load(&wd, &c, FS_F32, dir, e));
    assert_weights_equal(&src, &wd);
    fs_weights_free(&wd);
    fs_weights_free(&w64);
    fs_weights_free(&w);
    fs_weights_free(&src);
    st_list_free(&l);
    rm_rf(dir);
}

static void test_roundtrip_f64(void **state)
{
    (void)state;
    char dir[64], path[256];
    fs_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fs_config c;
    fs_weights src, w, w32;
    synthetic(&src, &c, "odd", FS_F64);
    st_list l = {0};
    st_from_weights(&l, &src, "F64");
    st_write(path, &l, NULL);
    OK(fs_weights_load(&w, &c, FS_F64, path, e));
    assert_weights_equal(&src, &w);
    OK(fs_weights_load(&w32, &c, FS_F32, path, e));
    for (int i = 0; i < w.n; i++) {
        assert_int_equal(w32.t[i].owns, 1); /* F64 → F32 needs a conversion, so a copy */
        for (int64_t k = 0; k < fs_tensor_numel(&w.t[i]); k++)
            assert_true(fs_tensor_get(&w32.t[i], k) == (double)(float)fs_tensor_get(&src.t[i], k));
    }
    fs_weights_free(&w32);
    fs_weights_free(&w);
    fs_weights_free(&src);
    st_list_free(&l);
    rm_rf(dir);
}

/* BF16 / F16 files: each loaded value is exactly the decode of what was written, and within
 * half an ulp of the half-precision format of the original. */
static void roundtrip_half(const char *preset, const char *dtype, double rel)
{
    char dir[64], path[256];
    fs_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fs_config c;
    fs_weights src, w32, w64;
    synthetic(&src, &c, preset, FS_F32);
    st_list l = {0};
    st_from_weights(&l, &src, dtype);
    st_write(path, &l, NULL);
    OK(fs_weights_load(&w32, &c, FS_F32, path, e));
    OK(fs_weights_load(&w64, &c, FS_F64, path, e));
    int bf = !strcmp(dtype, "BF16");
    for (int i = 0; i < src.n; i++) {
        assert_int_equal(w32.t[i].owns, 1);
        assert_int_equal(w64.t[i].owns, 1);
        const uint16_t *raw = (const uint16_t *)l.t[i].data;
        for (int64_t k = 0; k < fs_tensor_numel(&src.t[i]); k++) {
            double o = fs_tensor_get(&src.t[i], k), a = fs_tensor_get(&w32.t[i], k);
            double dec = bf ? fs_bf16_to_f32(raw[k]) : fs_f16_to_f32(raw[k]);
            assert_true(a == dec);
            assert_true(fs_tensor_get(&w64.t[i], k) == dec);
            /* relative bound for normal values; F16 subnormals have an absolute step of 2^-24 */
            if (fabs(a - o) > rel * fabs(o) + (bf ? 0 : 0x1p-25))
                fail_msg("%s[%lld]: %.9g stored as %s reads %.9g", src.desc[i].name, (long long)k, o, dtype, a);
        }
    }
    fs_weights_free(&w64);
    fs_weights_free(&w32);
    fs_weights_free(&src);
    st_list_free(&l);
    rm_rf(dir);
}

static void test_roundtrip_bf16(void **state)
{
    (void)state;
    roundtrip_half("tiny", "BF16", 0x1p-8); /* 8 significant bits: half an ulp is at most 2^-8 relative */
}

static void test_roundtrip_f16(void **state)
{
    (void)state;
    roundtrip_half("odd", "F16", 0x1p-11); /* 11 significant bits */
}

/* Two shards + index.json; loaded through the index path and through the directory. */
static void test_sharded(void **state)
{
    (void)state;
    char dir[64], p[256];
    fs_test_tmpdir(dir, sizeof dir);
    fs_config c;
    fs_weights src, w;
    synthetic(&src, &c, "tiny", FS_F32);
    st_list l = {0};
    st_from_weights(&l, &src, "F32");
    unsigned char *sel = calloc((size_t)l.n, 1);
    const char *shard[2] = {"diffusion_pytorch_model-00001-of-00002.safetensors",
                            "diffusion_pytorch_model-00002-of-00002.safetensors"};
    cJSON *idx = cJSON_CreateObject();
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(idx, "metadata"), "total_size", 1234);
    cJSON *wm = cJSON_AddObjectToObject(idx, "weight_map");
    for (int s = 0; s < 2; s++) {
        /* the first shard gets the first 60 tensors, like a size-based split */
        for (int i = 0; i < l.n; i++) sel[i] = (i < 60) == (s == 0);
        for (int i = 0; i < l.n; i++)
            if (sel[i]) cJSON_AddStringToObject(wm, l.t[i].name, shard[s]);
        snprintf(p, sizeof p, "%s/%s", dir, shard[s]);
        st_write(p, &l, sel);
    }
    char *js = cJSON_Print(idx);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors.index.json", dir);
    write_bytes(p, js, strlen(js));
    OK(fs_weights_load(&w, &c, FS_F32, p, e));
    assert_int_equal(fs_wload_nfiles(w.load), 2);
    assert_weights_equal(&src, &w);
    for (int i = 0; i < w.n; i++) assert_true(is_view_into_maps(&w, &w.t[i]));
    fs_weights_free(&w);
    OK(fs_weights_load(&w, &c, FS_F32, dir, e));
    assert_weights_equal(&src, &w);
    fs_weights_free(&w);

    fs_st_archive a;
    OK(fs_st_archive_open(&a, dir, e));
    assert_int_equal(a.nfiles, 2);
    assert_int_equal(a.n, l.n);
    const fs_st_entry *en = fs_st_archive_find(&a, l.t[l.n - 1].name);
    assert_non_null(en);
    assert_non_null(strstr(fs_st_archive_file_of(&a, en), "00002-of-00002"));
    fs_st_archive_close(&a);

    cJSON_Delete(idx);
    free(js);
    free(sel);
    fs_weights_free(&src);
    st_list_free(&l);
    rm_rf(dir);
}

/* ---- BFL layout, built from spec §7 ---- */
typedef struct part {
    const char *diff; /* diffusers tensor */
    int64_t r0, n;    /* rows; n = -1: all */
} part;

static void bfl_add(st_list *out, st_list *dif, const char *prefix, const char *bfl, const part *parts, int np)
{
    size_t nb = 0;
    int64_t rows = 0;
    st_t *first = st_get(dif, parts[0].diff);
    for (int k = 0; k < np; k++) {
        st_t *t = st_get(dif, parts[k].diff);
        int64_t n = parts[k].n < 0 ? t->shape[0] : parts[k].n;
        nb += t->nbytes / (size_t)t->shape[0] * (size_t)n;
        rows += n;
    }
    unsigned char *buf = malloc(nb), *p = buf;
    for (int k = 0; k < np; k++) {
        st_t *t = st_get(dif, parts[k].diff);
        size_t rb = t->nbytes / (size_t)t->shape[0];
        int64_t n = parts[k].n < 0 ? t->shape[0] : parts[k].n;
        memcpy(p, t->data + (size_t)parts[k].r0 * rb, (size_t)n * rb);
        p += (size_t)n * rb;
    }
    int64_t shape[4] = {rows, first->shape[1]};
    char name[192];
    snprintf(name, sizeof name, "%s%s", prefix, bfl);
    st_add(out, name, first->dtype, first->ndim, shape, buf, nb);
    free(buf);
}

static void bfl_from_diffusers(st_list *out, st_list *dif, const fs_config *c, const char *prefix)
{
    const int64_t D = fs_config_hidden(c);
    char b[160], d[8][192];
    static const char *const wb[] = {"weight", "bias"};
    /* one-to-one renames of Linear layers: {bfl stem, diffusers stem} */
    static const char *const top[][2] = {
        {"img_in", "x_embedder"},
        {"txt_in", "context_embedder"},
        {"time_in.in_layer", "time_text_embed.timestep_embedder.linear_1"},
        {"time_in.out_layer", "time_text_embed.timestep_embedder.linear_2"},
        {"guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1"},
        {"guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2"},
        {"vector_in.in_layer", "time_text_embed.text_embedder.linear_1"},
        {"vector_in.out_layer", "time_text_embed.text_embedder.linear_2"},
        {"final_layer.linear", "proj_out"},
    };
    for (size_t i = 0; i < FS_ARRAY_LEN(top); i++) {
        if (!c->guidance_embeds && !strncmp(top[i][0], "guidance", 8)) continue;
        for (int k = 0; k < 2; k++) {
            snprintf(b, sizeof b, "%s.%s", top[i][0], wb[k]);
            snprintf(d[0], sizeof d[0], "%s.%s", top[i][1], wb[k]);
            bfl_add(out, dif, prefix, b, (part[]){{d[0], 0, -1}}, 1);
        }
    }
    for (int k = 0; k < 2; k++) { /* final_layer.adaLN_modulation.1 = shift ‖ scale */
        snprintf(b, sizeof b, "final_layer.adaLN_modulation.1.%s", wb[k]);
        snprintf(d[0], sizeof d[0], "norm_out.linear.%s", wb[k]);
        bfl_add(out, dif, prefix, b, (part[]){{d[0], D, D}, {d[0], 0, D}}, 2);
    }
    for (int i = 0; i < c->num_layers; i++) {
        static const char *const ren[][2] = {
            {"img_mod.lin", "norm1.linear"},    {"txt_mod.lin", "norm1_context.linear"},
            {"img_attn.proj", "attn.to_out.0"}, {"txt_attn.proj", "attn.to_add_out"},
            {"img_mlp.0", "ff.net.0.proj"},     {"img_mlp.2", "ff.net.2"},
            {"txt_mlp.0", "ff_context.net.0.proj"}, {"txt_mlp.2", "ff_context.net.2"},
        };
        for (size_t r = 0; r < FS_ARRAY_LEN(ren); r++)
            for (int k = 0; k < 2; k++) {
                snprintf(b, sizeof b, "double_blocks.%d.%s.%s", i, ren[r][0], wb[k]);
                snprintf(d[0], sizeof d[0], "transformer_blocks.%d.%s.%s", i, ren[r][1], wb[k]);
                bfl_add(out, dif, prefix, b, (part[]){{d[0], 0, -1}}, 1);
            }
        static const char *const qkv[2][4] = {{"img_attn", "to_q", "to_k", "to_v"},
                                              {"txt_attn", "add_q_proj", "add_k_proj", "add_v_proj"}};
        for (int s = 0; s < 2; s++)
            for (int k = 0; k < 2; k++) {
                snprintf(b, sizeof b, "double_blocks.%d.%s.qkv.%s", i, qkv[s][0], wb[k]);
                for (int j = 0; j < 3; j++)
                    snprintf(d[j], sizeof d[j], "transformer_blocks.%d.attn.%s.%s", i, qkv[s][j + 1], wb[k]);
                bfl_add(out, dif, prefix, b, (part[]){{d[0], 0, -1}, {d[1], 0, -1}, {d[2], 0, -1}}, 3);
            }
        static const char *const nrm[][2] = {{"img_attn.norm.query_norm", "norm_q"},
                                             {"img_attn.norm.key_norm", "norm_k"},
                                             {"txt_attn.norm.query_norm", "norm_added_q"},
                                             {"txt_attn.norm.key_norm", "norm_added_k"}};
        for (size_t r = 0; r < FS_ARRAY_LEN(nrm); r++) {
            snprintf(b, sizeof b, "double_blocks.%d.%s.scale", i, nrm[r][0]);
            snprintf(d[0], sizeof d[0], "transformer_blocks.%d.attn.%s.weight", i, nrm[r][1]);
            bfl_add(out, dif, prefix, b, (part[]){{d[0], 0, -1}}, 1);
        }
    }
    for (int i = 0; i < c->num_single_layers; i++) {
        for (int k = 0; k < 2; k++) {
            snprintf(b, sizeof b, "single_blocks.%d.modulation.lin.%s", i, wb[k]);
            snprintf(d[0], sizeof d[0], "single_transformer_blocks.%d.norm.linear.%s", i, wb[k]);
            bfl_add(out, dif, prefix, b, (part[]){{d[0], 0, -1}}, 1);
            snprintf(b, sizeof b, "single_blocks.%d.linear2.%s", i, wb[k]);
            snprintf(d[0], sizeof d[0], "single_transformer_blocks.%d.proj_out.%s", i, wb[k]);
            bfl_add(out, dif, prefix, b, (part[]){{d[0], 0, -1}}, 1);
            snprintf(b, sizeof b, "single_blocks.%d.linear1.%s", i, wb[k]);
            static const char *const l1[] = {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"};
            for (int j = 0; j < 4; j++)
                snprintf(d[j], sizeof d[j], "single_transformer_blocks.%d.%s.%s", i, l1[j], wb[k]);
            bfl_add(out, dif, prefix, b, (part[]){{d[0], 0, -1}, {d[1], 0, -1}, {d[2], 0, -1}, {d[3], 0, -1}}, 4);
        }
        snprintf(b, sizeof b, "single_blocks.%d.norm.query_norm.scale", i);
        snprintf(d[0], sizeof d[0], "single_transformer_blocks.%d.attn.norm_q.weight", i);
        bfl_add(out, dif, prefix, b, (part[]){{d[0], 0, -1}}, 1);
        snprintf(b, sizeof b, "single_blocks.%d.norm.key_norm.scale", i);
        snprintf(d[0], sizeof d[0], "single_transformer_blocks.%d.attn.norm_k.weight", i);
        bfl_add(out, dif, prefix, b, (part[]){{d[0], 0, -1}}, 1);
    }
}

static void bfl_case(const char *preset, const char *prefix)
{
    char dir[64], path[256];
    fs_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/flux1-test.safetensors", dir);
    fs_config c;
    fs_weights src, w, w64;
    synthetic(&src, &c, preset, FS_F32);
    st_list dif = {0}, bfl = {0};
    st_from_weights(&dif, &src, "F32");
    bfl_from_diffusers(&bfl, &dif, &c, prefix);
    /* diffusers has more tensors than BFL: 3 (qkv) x 2 double streams + 4 (linear1) per
     * single block become one each, per weight and bias. */
    assert_int_equal(bfl.n, dif.n - 2 * (4 * c.num_layers + 3 * c.num_single_layers));
    st_write(path, &bfl, NULL);
    OK(fs_weights_load(&w, &c, FS_F32, path, e));
    assert_weights_equal(&src, &w); /* exact: F32 in, F32 out, only rows moved */
    /* row slices of fused tensors are still views; the swapped halves had to be copied */
    assert_true(is_view_into_maps(&w, fs_weights_get(&w, "transformer_blocks.0.attn.to_k.weight")));
    assert_true(is_view_into_maps(&w, fs_weights_get(&w, "transformer_blocks.0.attn.add_v_proj.bias")));
    assert_true(is_view_into_maps(&w, fs_weights_get(&w, "single_transformer_blocks.0.proj_mlp.weight")));
    assert_int_equal(fs_weights_get(&w, "norm_out.linear.weight")->owns, 1);
    assert_int_equal(fs_weights_get(&w, "norm_out.linear.bias")->owns, 1);
    OK(fs_weights_load(&w64, &c, FS_F64, path, e));
    for (int i = 0; i < src.n; i++)
        for (int64_t k = 0; k < fs_tensor_numel(&src.t[i]); k++)
            assert_true(fs_tensor_get(&w64.t[i], k) == fs_tensor_get(&src.t[i], k));
    fs_weights_free(&w64);
    fs_weights_free(&w);

    /* a BFL checkpoint missing one fused tensor: both names in the message */
    char name[192];
    snprintf(name, sizeof name, "%ssingle_blocks.0.linear1.bias", prefix);
    st_remove(&bfl, name);
    st_write(path, &bfl, NULL);
    fs_err e = {0};
    expect_err(fs_weights_load(&w, &c, FS_F32, path, &e), &e, FS_E_INPUT, path, "missing tensor", name,
               "single_transformer_blocks.0.attn.to_q.bias", NULL);
    assert_null(w.t);

    fs_weights_free(&src);
    st_list_free(&dif);
    st_list_free(&bfl);
    rm_rf(dir);
}

static void test_bfl_naming(void **state)
{
    (void)state;
    bfl_case("odd", "");
}

static void test_bfl_naming_prefixed(void **state)
{
    (void)state;
    bfl_case("tiny", "model.diffusion_model."); /* tiny: with guidance_in */
}

static void test_bfl_mixed_naming(void **state)
{
    (void)state;
    char dir[64], path[256];
    fs_test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/mixed.safetensors", dir);
    fs_config c;
    fs_weights src, w;
    synthetic(&src, &c, "odd", FS_F32);
    st_list dif = {0}, bfl = {0};
    st_from_weights(&dif, &src, "F32");
    bfl_from_diffusers(&bfl, &dif, &c, "");
    st_t *x = st_get(&dif, "x_embedder.weight");
    st_add(&bfl, x->name, x->dtype, x->ndim, x->shape, x->data, x->nbytes);
    st_write(path, &bfl, NULL);
    fs_err e = {0};
    expect_err(fs_weights_load(&w, &c, FS_F32, path, &e), &e, FS_E_INPUT, path, "mixes", "'x_embedder.weight'",
               NULL);
    fs_weights_free(&src);
    st_list_free(&dif);
    st_list_free(&bfl);
    rm_rf(dir);
}

/* ---------------------------------------------------------------------------------------------
 * bad inputs: each one FS_E_INPUT, naming the file, the tensor where there is one, and the cause
 * ------------------------------------------------------------------------------------------- */

/* Opens `path` both as a lone file and through fs_weights_load, expecting the same error. */
static void expect_bad_file(const char *path, const char *tensor, const char *cause)
{
    fs_err e = {0};
    fs_st_file f;
    expect_err(fs_st_open(&f, path, &e), &e, FS_E_INPUT, path, cause, tensor, NULL);
    assert_null(f.map);
    assert_null(f.ent);
    fs_config c;
    fs_weights w;
    OK(fs_config_preset(&c, "odd", e));
    memset(&e, 0, sizeof e);
    expect_err(fs_weights_load(&w, &c, FS_F32, path, &e), &e, FS_E_INPUT, path, cause, tensor, NULL);
    assert_null(w.t);
    assert_null(w.load);
}

static void with_tmp(char *dir, size_t ndir, char *path, size_t np, const char *file)
{
    fs_test_tmpdir(dir, ndir);
    snprintf(path, np, "%s/%s", dir, file);
}

static void test_bad_short_file(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "short.safetensors");
    write_bytes(p, "\x10\0\0\0\0", 5);
    expect_bad_file(p, "", "shorter than the 8-byte header length");
    write_bytes(p, "", 0);
    expect_bad_file(p, "", "file is 0 bytes");
    rm_rf(dir);
}

static void test_bad_header_length(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "hlen.safetensors");
    unsigned char b[8 + 2] = {0xe8, 0x03, 0, 0, 0, 0, 0, 0, '{', '}'}; /* length 1000, 2 bytes follow */
    write_bytes(p, b, sizeof b);
    expect_bad_file(p, "1000", "beyond the file size");
    memset(b, 0xff, 8); /* 2^64 - 1: must not overflow into "fits" */
    write_bytes(p, b, sizeof b);
    expect_bad_file(p, "18446744073709551615", "beyond the file size");
    rm_rf(dir);
}

static void test_bad_truncated_data(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "cut.safetensors");
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    st_list l = {0};
    st_add(&l, "a", "F32", 1, (int64_t[]){4}, v, 16);
    st_add(&l, "b", "F32", 2, (int64_t[]){2, 2}, v + 4, 16);
    st_write(p, &l, NULL);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(truncate(p, st.st_size - 6), 0); /* cut inside b's data */
    expect_bad_file(p, "tensor 'b'", "run past the end of the data region");
    st_list_free(&l);
    rm_rf(dir);
}

static void test_bad_json(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "json.safetensors");
    write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], ", NULL, 0);
    expect_bad_file(p, "", "malformed JSON");
    write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}}", "abcd", 4);
    expect_bad_file(p, "", "trailing bytes after the JSON value");
    write_raw(p, "[1, 2]   ", NULL, 0);
    expect_bad_file(p, "", "header is not a JSON object");
    write_raw(p, "{\"a\": [0, 4]}", "abcd", 4);
    expect_bad_file(p, "tensor 'a'", "header entry is not a JSON object");
    rm_rf(dir);
}

static void test_bad_missing_fields(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "fields.safetensors");
    write_raw(p, "{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", "abcd", 4);
    expect_bad_file(p, "tensor 'w'", "no dtype");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", "abcd", 4);
    expect_bad_file(p, "tensor 'w'", "no shape");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", "abcd", 4);
    expect_bad_file(p, "tensor 'w'", "no data_offsets");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", "abcd", 4);
    expect_bad_file(p, "tensor 'w'", "shape[0] is not a non-negative integer");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1, 1, 1, 1, 1], \"data_offsets\": [0, 4]}}", "abcd", 4);
    expect_bad_file(p, "tensor 'w'", "shape has 5 dimensions");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 4]}}", "abcd", 4);
    expect_bad_file(p, "tensor 'w'", "data_offsets is not [begin, end]");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", "abcd", 4);
    expect_bad_file(p, "tensor 'w'", "end before they begin");
    rm_rf(dir);
}

static void test_bad_dtype(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "dtype.safetensors");
    write_raw(p, "{\"__metadata__\": {\"format\": \"pt\"}, \"q.weight\": {\"dtype\": \"I4\", \"shape\": [2], "
                 "\"data_offsets\": [0, 8]}}",
              "abcdefgh", 8);
    expect_bad_file(p, "tensor 'q.weight'", "unsupported dtype 'I4'");
    write_raw(p, "{\"q.weight\": {\"dtype\": \"Q8\", \"shape\": [8], \"data_offsets\": [0, 8]}}", "abcdefgh", 8);
    expect_bad_file(p, "tensor 'q.weight'", "unsupported dtype 'Q8'");
    rm_rf(dir);
}

static void test_bad_shape_vs_offsets(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "span.safetensors");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 16]}}", "0123456789abcdef", 16);
    expect_bad_file(p, "tensor 'w'", "shape [3] of F32 needs 12 bytes but data_offsets [0, 16] span 16");
    /* a shape whose byte count wraps 2^64 must not be taken for a small one */
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}}", NULL,
              0);
    expect_bad_file(p, "tensor 'w'", "overflows");
    rm_rf(dir);
}

static void test_bad_offsets_past_end(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "past.safetensors");
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}", "0123456789abcdef", 16);
    expect_bad_file(p, "tensor 'w'", "data_offsets [8, 24] run past the end of the data region (16 bytes");
    rm_rf(dir);
}

static void test_bad_overlap(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "overlap.safetensors");
    /* listed out of order on purpose: the check must sort by offset, not trust header order */
    write_raw(p, "{\"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}, "
                 "\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
                 "\"c\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [20, 24]}}",
              "0123456789abcdef01234567", 24);
    expect_bad_file(p, "tensors 'b' [8, 24) and 'c' [20, 24)", "overlap");
    /* and a duplicate name (JSON allows it, a checkpoint must not) */
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
                 "\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
              "01234567", 8);
    expect_bad_file(p, "tensor 'w'", "appears twice");
    rm_rf(dir);
}

static void test_bad_nonexistent(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "nope.safetensors");
    expect_bad_file(p, "", "No such file or directory");
    /* a directory with nothing to load */
    fs_err e = {0};
    fs_config c;
    fs_weights w;
    OK(fs_config_preset(&c, "odd", e));
    expect_err(fs_weights_load(&w, &c, FS_F32, dir, &e), &e, FS_E_INPUT, dir, "no *.safetensors file", NULL);
    rm_rf(dir);
}

/* A valid synthetic diffusers checkpoint of the odd preset, in l, not yet written. */
static void odd_checkpoint(st_list *l, fs_config *c)
{
    fs_weights src;
    synthetic(&src, c, "odd", FS_F32);
    st_from_weights(l, &src, "F32");
    fs_weights_free(&src);
}

static void test_bad_shape_vs_config(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "shape.safetensors");
    fs_config c;
    st_list l = {0};
    odd_checkpoint(&l, &c);
    st_t *t = st_get(&l, "transformer_blocks.0.attn.to_k.weight"); /* [96, 96] */
    t->shape[1] = 48; /* keep the file self-consistent: only the config disagrees */
    t->nbytes /= 2;
    st_write(p, &l, NULL);
    fs_err e = {0};
    fs_weights w;
    expect_err(fs_weights_load(&w, &c, FS_F32, p, &e), &e, FS_E_INPUT, p, "'transformer_blocks.0.attn.to_k.weight'",
               "expected [96, 96] from config, file has [96, 48]", NULL);
    assert_null(w.t);
    st_list_free(&l);
    rm_rf(dir);
}

static void test_bad_missing_tensor(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "missing.safetensors");
    fs_config c;
    st_list l = {0};
    odd_checkpoint(&l, &c);
    st_remove(&l, "single_transformer_blocks.2.attn.norm_k.weight");
    st_write(p, &l, NULL);
    fs_err e = {0};
    fs_weights w;
    expect_err(fs_weights_load(&w, &c, FS_F32, p, &e), &e, FS_E_INPUT, p,
               "missing tensor 'single_transformer_blocks.2.attn.norm_k.weight'", NULL);
    assert_null(w.t);
    /* the F64 path (owned tensors allocated before the failure) frees them too */
    memset(&e, 0, sizeof e);
    expect_err(fs_weights_load(&w, &c, FS_F64, p, &e), &e, FS_E_INPUT, "missing tensor", NULL);
    assert_null(w.t);
    st_list_free(&l);
    rm_rf(dir);
}

static void test_bad_unexpected_tensor(void **state)
{
    (void)state;
    char dir[64], p[256];
    with_tmp(dir, sizeof dir, p, sizeof p, "extra.safetensors");
    fs_config c;
    st_list l = {0};
    odd_checkpoint(&l, &c);
    float z[2] = {0};
    st_add(&l, "zzz.lora_A.weight", "F32", 1, (int64_t[]){2}, z, 8);
    st_add(&l, "extra.weight", "F32", 1, (int64_t[]){2}, z, 8);
    st_write(p, &l, NULL);
    fs_err e = {0};
    fs_weights w;
    expect_err(fs_weights_load(&w, &c, FS_F64, p, &e), &e, FS_E_INPUT, p, "unexpected tensor 'extra.weight'",
               "2 tensors", NULL);
    assert_null(w.t);
    /* a guidance-distilled checkpoint with a config that has no guidance: one tensor pair too many */
    fs_config tc;
    fs_weights tw;
    synthetic(&tw, &tc, "tiny", FS_F32);
    st_list tl = {0};
    st_from_weights(&tl, &tw, "F32");
    st_write(p, &tl, NULL);
    tc.guidance_embeds = 0;
    memset(&e, 0, sizeof e);
    expect_err(fs_weights_load(&w, &tc, FS_F32, p, &e), &e, FS_E_INPUT,
               "unexpected tensor 'time_text_embed.guidance_embedder.linear_1.bias'", "4 tensors", NULL);
    fs_weights_free(&tw);
    st_list_free(&tl);
    st_list_free(&l);
    rm_rf(dir);
}

static void test_bad_index(void **state)
{
    (void)state;
    char dir[64], p[256], idx[256];
    fs_test_tmpdir(dir, sizeof dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    fs_config c;
    st_list l = {0};
    odd_checkpoint(&l, &c);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    st_write(p, &l, NULL);
    fs_err e = {0};
    fs_weights w;

    /* names a shard that is not there */
    const char *js = "{\"metadata\": {}, \"weight_map\": {\"x_embedder.weight\": \"model-00001-of-00002.safetensors\", "
                     "\"x_embedder.bias\": \"model-00002-of-00002.safetensors\"}}";
    write_bytes(idx, js, strlen(js));
    expect_err(fs_weights_load(&w, &c, FS_F32, idx, &e), &e, FS_E_INPUT, idx, "model-00002-of-00002.safetensors",
               "No such file or directory", NULL);
    assert_null(w.t);

    /* puts a tensor in a shard that lacks it */
    js = "{\"weight_map\": {\"x_embedder.weight\": \"model-00001-of-00002.safetensors\", "
         "\"not_there.weight\": \"model-00001-of-00002.safetensors\"}}";
    write_bytes(idx, js, strlen(js));
    expect_err(fs_weights_load(&w, &c, FS_F32, dir, &e), &e, FS_E_INPUT, idx, "'not_there.weight'",
               "has no such tensor", NULL);

    /* a shard holds tensors weight_map does not list */
    js = "{\"weight_map\": {\"x_embedder.weight\": \"model-00001-of-00002.safetensors\"}}";
    write_bytes(idx, js, strlen(js));
    expect_err(fs_weights_load(&w, &c, FS_F32, idx, &e), &e, FS_E_INPUT, idx, "does not list it", NULL);

    /* not an index at all */
    js = "{\"metadata\": {}}";
    write_bytes(idx, js, strlen(js));
    expect_err(fs_weights_load(&w, &c, FS_F32, idx, &e), &e, FS_E_INPUT, idx, "no \"weight_map\"", NULL);
    js = "{\"weight_map\": {\"a\": ";
    write_bytes(idx, js, strlen(js));
    expect_err(fs_weights_load(&w, &c, FS_F32, idx, &e), &e, FS_E_INPUT, idx, "malformed JSON", NULL);

    /* two .safetensors and no index in a directory: ambiguous */
    remove(idx);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    st_write(p, &l, NULL);
    expect_err(fs_weights_load(&w, &c, FS_F32, dir, &e), &e, FS_E_INPUT, dir, "2 *.safetensors files",
               "no *.safetensors.index.json", NULL);
    st_list_free(&l);
    rm_rf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_values),
        cmocka_unit_test(test_f16_values),
        cmocka_unit_test(test_decode_range),
        cmocka_unit_test(test_reference_file_index),
        cmocka_unit_test(test_reference_tiny_f32),
        cmocka_unit_test(test_reference_tiny_f64),
        cmocka_unit_test(test_reference_odd),
        cmocka_unit_test(test_roundtrip_f32),
        cmocka_unit_test(test_roundtrip_f64),
        cmocka_unit_test(test_roundtrip_bf16),
        cmocka_unit_test(test_roundtrip_f16),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_bfl_naming),
        cmocka_unit_test(test_bfl_naming_prefixed),
        cmocka_unit_test(test_bfl_mixed_naming),
        cmocka_unit_test(test_bad_short_file),
        cmocka_unit_test(test_bad_header_length),
        cmocka_unit_test(test_bad_truncated_data),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_bad_missing_fields),
        cmocka_unit_test(test_bad_dtype),
        cmocka_unit_test(test_bad_shape_vs_offsets),
        cmocka_unit_test(test_bad_offsets_past_end),
        cmocka_unit_test(test_bad_overlap),
        cmocka_unit_test(test_bad_nonexistent),
        cmocka_unit_test(test_bad_shape_vs_config),
        cmocka_unit_test(test_bad_missing_tensor),
        cmocka_unit_test(test_bad_unexpected_tensor),
        cmocka_unit_test(test_bad_index),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
