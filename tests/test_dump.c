/* test_dump.c — flux-dump writer (fs_dump), reader (fo_dump), replay inputs and fo_metrics.
 *
 * Our files must read like the h5py-written reference dumps, so the sample dump is checked
 * three ways: with our own reader, with h5py (the reader PyTorch-side users have), and with
 * h5dump. The reference dumps in ../shared/reference are read too; without them those tests
 * are SKIPPED, loudly. */
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <hdf5.h>
#include <math.h>

#include "fo_dump.h"
#include "fo_metrics.h"
#include "fs_backend.h"
#include "fs_dump.h"

/* ---------- the sample dump ---------- */

/* Deterministic, full-precision values; an F32 tensor holds their float rounding. */
static double sample_value(int seed, int64_t i) { return sin(seed * 1.7 + (double)i * 0.37) * (1 + seed % 3); }

static double expect(fs_dtype dt, int seed, int64_t i)
{
    double v = sample_value(seed, i);
    return dt == FS_F32 ? (double)(float)v : v;
}

static void make_tensor(fs_tensor *t, fs_dtype dt, int ndim, const int64_t *shape, int seed)
{
    fs_err e = {0};
    assert_int_equal(fs_tensor_alloc(t, dt, ndim, shape, &e), FS_OK);
    for (int64_t i = 0; i < fs_tensor_numel(t); i++) fs_tensor_set(t, i, sample_value(seed, i));
}

typedef struct rec {
    const char *name;
    fs_dtype dt;
    int ndim;
    int64_t shape[4];
} rec;

/* Ranks 1-4, both dtypes, names with '#', '@' and dots, datasets on both sides of the 256-element
 * chunking threshold. */
static const rec step0[] = {
    {"latents_in", FS_F32, 3, {2, 6, 16}}, /* 192 elements: contiguous */
    {"x_embedder", FS_F32, 3, {2, 6, 128}}, /* chunked */
    {"time_text_embed.time_proj@1", FS_F32, 2, {2, 256}},
    {"pos_embed#0", FS_F64, 2, {10, 32}},
    {"transformer_blocks.0.attn.norm_q", FS_F64, 4, {2, 6, 4, 32}},
    {"norm_out.linear", FS_F64, 1, {5}},
    {"latents_out", FS_F32, 3, {2, 6, 16}},
};
static const rec step1[] = {
    {"latents_in", FS_F32, 3, {2, 6, 16}},
    {"proj_out", FS_F64, 3, {2, 6, 16}},
    {"latents_out", FS_F32, 3, {2, 6, 16}},
};
static const rec *const steps[2] = {step0, step1};
static const int step_len[2] = {FS_ARRAY_LEN(step0), FS_ARRAY_LEN(step1)};
static const double sample_sigmas[3] = {1.0, 0.6, 0.0};

#define SB 2
#define SI 6
#define ST 4

/* Inputs for config "tiny" (in 16, joint 64, pooled 32, guidance), B=2, S_img=6, S_txt=4, N=2. */
static void make_inputs(fs_inputs *in, fs_dtype dt)
{
    memset(in, 0, sizeof *in);
    in->B = SB, in->S_img = SI, in->S_txt = ST, in->n_steps = 2, in->has_guidance = 1;
    make_tensor(&in->hidden_states, dt, 3, (int64_t[]){SB, SI, 16}, 1001);
    make_tensor(&in->encoder_hidden_states, dt, 3, (int64_t[]){SB, ST, 64}, 1002);
    make_tensor(&in->pooled_projections, dt, 2, (int64_t[]){SB, 32}, 1003);
    fs_err e = {0};
    assert_int_equal(fs_tensor_alloc2(&in->img_ids, FS_F64, SI, 3, &e), 0);
    for (int s = 0; s < SI; s++) fs_tensor_set(&in->img_ids, s * 3 + 1, s / 3), fs_tensor_set(&in->img_ids, s * 3 + 2, s % 3);
    assert_int_equal(fs_tensor_alloc2(&in->txt_ids, FS_F64, ST, 3, &e), 0);
    assert_int_equal(fs_tensor_alloc(&in->guidance, FS_F64, 1, (int64_t[]){SB}, &e), 0);
    fs_tensor_set(&in->guidance, 0, 3.5);
    fs_tensor_set(&in->guidance, 1, 4.0);
    assert_int_equal(fs_tensor_alloc(&in->sigmas, FS_F64, 1, (int64_t[]){3}, &e), 0);
    assert_int_equal(fs_tensor_alloc(&in->timesteps, FS_F64, 1, (int64_t[]){2}, &e), 0);
    for (int i = 0; i < 3; i++) fs_tensor_set(&in->sigmas, i, sample_sigmas[i]);
    for (int i = 0; i < 2; i++) fs_tensor_set(&in->timesteps, i, sample_sigmas[i]);
}

/* Writes the sample float32-run dump to `path`; with_inputs = 0 leaves /inputs out. */
static void write_sample(const char *path, int with_inputs)
{
    fs_err e = {0};
    fs_config cfg;
    assert_int_equal(fs_config_preset(&cfg, "tiny", &e), 0);
    fs_dump *d = NULL;
    if (fs_dump_create(&d, path, &cfg, FS_F32, "test_dump", &e)) fail_msg("%s", e.msg);
    /* the sample is written compressed (not the default) so the reference-like layout is tested */
    assert_int_equal(fs_dump_set_deflate(d, 1, &e), 0);
    assert_int_equal(fs_dump_set_attr_string(d, "parallel", "{\"world\": 1, \"mesh\": {\"tp\": 1}}", &e), 0);
    assert_int_equal(fs_dump_set_attr_int(d, "num_inference_steps", 2, &e), 0);
    assert_int_equal(fs_dump_set_attr_double(d, "mu", 0.4675, &e), 0);
    if (with_inputs) {
        fs_inputs in;
        make_inputs(&in, FS_F32);
        if (fs_dump_write_inputs(d, &in, &e)) fail_msg("%s", e.msg);
        fs_inputs_free(&in);
    }
    fs_recorder r = fs_dump_recorder(d);
    for (int s = 0; s < 2; s++) {
        if (fs_dump_begin_step(d, s, sample_sigmas[s], sample_sigmas[s], sample_sigmas[s + 1], &e)) fail_msg("%s", e.msg);
        for (int k = 0; k < step_len[s]; k++) {
            fs_tensor t;
            make_tensor(&t, steps[s][k].dt, steps[s][k].ndim, steps[s][k].shape, 100 * s + k);
            /* half through the recorder, as the forward does, half directly */
            int rc = k % 2 ? r.fn(r.ctx, steps[s][k].name, &t, NULL, &e) : fs_dump_record(d, steps[s][k].name, &t, &e);
            if (rc) fail_msg("%s", e.msg);
            fs_tensor_free(&t);
        }
        if (fs_dump_end_step(d, &e)) fail_msg("%s", e.msg);
    }
    fs_tensor lat;
    make_tensor(&lat, FS_F32, 3, (int64_t[]){SB, SI, 16}, 999);
    if (fs_dump_write_final(d, &lat, &e)) fail_msg("%s", e.msg);
    fs_tensor_free(&lat);
    /* Not published before close. */
    /* the temporary is "<path>.tmp.<pid>.<host>" (a later run recognises a stale one by it) */
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.", path, (long)getpid());
    assert_int_equal(strncmp(fs_dump_tmp_path(d), tmp, strlen(tmp)), 0);
    assert_true(strlen(fs_dump_tmp_path(d)) > strlen(tmp));
    snprintf(tmp, sizeof tmp, "%s", fs_dump_tmp_path(d));
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(access(tmp, F_OK), 0);
    if (fs_dump_close(d, &e)) fail_msg("%s", e.msg);
    assert_int_equal(access(path, F_OK), 0);
    assert_int_equal(access(tmp, F_OK), -1);
}

static void sample_path(char *buf, size_t n)
{
    char dir[64];
    fs_test_tmpdir(dir, sizeof dir);
    snprintf(buf, n, "%s/sample.h5", dir);
}

/* ---------- the sample read back with fo_dump ---------- */

static void expect_dataset(fo_file *f, fo_dataset *ds, const char *path, const rec *r, int seed)
{
    fs_err e = {0};
    if (fo_dataset_read(f, path, ds, &e)) fail_msg("%s", e.msg);
    assert_int_equal(ds->ndim, r->ndim);
    int64_t numel = 1;
    for (int i = 0; i < r->ndim; i++) {
        assert_int_equal(ds->shape[i], r->shape[i]);
        numel *= r->shape[i];
    }
    assert_int_equal(ds->numel, numel);
    assert_string_equal(ds->dtype, fs_dtype_name(r->dt));
    for (int64_t i = 0; i < numel; i++)
        if (ds->data[i] != expect(r->dt, seed, i))
            fail_msg("%s[%lld] = %.17g, wrote %.17g", path, (long long)i, ds->data[i], expect(r->dt, seed, i));
}

static void test_roundtrip_fo(void **state)
{
    char path[128];
    sample_path(path, sizeof path);
    write_sample(path, 1);

    fs_err e = {0};
    fo_file *f = NULL;
    if (fo_file_open(&f, path, &e)) fail_msg("%s", e.msg);
    assert_string_equal(fo_file_dtype(f), "float32");
    assert_int_equal(fo_file_version(f), 1);
    assert_string_equal(fo_file_producer(f), "test_dump");
    assert_non_null(fo_file_parallel(f));
    assert_non_null(strstr(fo_file_parallel(f), "\"world\": 1"));
    fs_config cfg, tiny;
    fs_config_preset(&tiny, "tiny", &e);
    if (fs_config_from_json(&cfg, fo_file_config(f), path, &e)) fail_msg("%s", e.msg);
    assert_memory_equal(&cfg, &tiny, sizeof cfg);

    assert_int_equal(fo_file_nsteps(f), 2);
    fo_names order = {0};
    fo_dataset ds = {0};
    for (int s = 0; s < 2; s++) {
        assert_int_equal(fo_file_step_number(f, s), s);
        char g[32];
        snprintf(g, sizeof g, "/step_%04d", s);
        assert_string_equal(fo_file_step_group(f, s), g);
        fo_order_source src = FO_ORDER_NAME;
        if (fo_group_order(f, g, &order, &src, &e)) fail_msg("%s", e.msg);
        assert_int_equal(src, FO_ORDER_ATTR);
        assert_int_equal(order.n, step_len[s]);
        for (int k = 0; k < step_len[s]; k++) {
            assert_string_equal(order.v[k], steps[s][k].name);
            char p[128];
            snprintf(p, sizeof p, "%s/%s", g, steps[s][k].name);
            expect_dataset(f, &ds, p, &steps[s][k], 100 * s + k);
        }
        double v;
        int found;
        assert_int_equal(fo_attr_double(f, g, "sigma_next", &v, &found, &e), 0);
        assert_true(found);
        assert_true(v == sample_sigmas[s + 1]);
        assert_int_equal(fo_attr_double(f, g, "timestep", &v, &found, &e), 0);
        assert_true(found && v == sample_sigmas[s]);
        char *rm = NULL;
        assert_int_equal(fo_attr_string(f, g, "recorded_modules", &rm, &e), 0);
        assert_string_equal(rm, "all");
        free(rm);
    }
    /* No `order` on /inputs: creation order, which the writer tracks. */
    fo_order_source src = FO_ORDER_ATTR;
    if (fo_group_order(f, "/inputs", &order, &src, &e)) fail_msg("%s", e.msg);
    assert_int_equal(src, FO_ORDER_CREATION);
    static const char *const in_order[] = {"hidden_states", "encoder_hidden_states", "pooled_projections", "img_ids",
                                           "txt_ids", "guidance", "sigmas", "timesteps"};
    assert_int_equal(order.n, 8);
    for (int i = 0; i < 8; i++) assert_string_equal(order.v[i], in_order[i]);
    /* The schedule is stored in the run dtype, like the reference. */
    if (fo_dataset_read(f, "/inputs/sigmas", &ds, &e)) fail_msg("%s", e.msg);
    assert_string_equal(ds.dtype, "float32");
    assert_true(ds.data[1] == (double)(float)0.6);
    rec fin = {"latents", FS_F32, 3, {SB, SI, 16}};
    expect_dataset(f, &ds, "/final/latents", &fin, 999);
    /* Root attributes we added. */
    double mu;
    int found;
    assert_int_equal(fo_attr_double(f, "/", "mu", &mu, &found, &e), 0);
    assert_true(found && mu == 0.4675);
    assert_int_equal(fo_attr_double(f, "/", "no_such_attr", &mu, &found, &e), 0);
    assert_false(found);

    fo_names_free(&order);
    fo_dataset_free(&ds);
    fo_file_close(f);
}

/* ---------- the sample read with h5py and h5dump ---------- */

static const char h5py_script[] =
    "import sys, json, h5py, math\n"
    "f = h5py.File(sys.argv[1], 'r')\n"
    "a = f.attrs\n"
    "for k in ('format', 'producer', 'dtype', 'config', 'parallel'):\n"
    "    assert type(a[k]) is str, (k, type(a[k]))\n"
    "assert a['format'] == 'flux-dump' and a['dtype'] == 'float32'\n"
    "assert a['version'] == 1 and a['version'].dtype.kind == 'i', repr(a['version'])\n"
    "c = json.loads(a['config'])\n"
    "assert c['in_channels'] == 16 and c['guidance_embeds'] is True and c['axes_dims_rope'] == [8, 12, 12], c\n"
    "assert json.loads(a['parallel'])['world'] == 1\n"
    "assert a['num_inference_steps'] == 2 and a['mu'] == 0.4675\n"
    "want = {'step_0000': ['latents_in', 'x_embedder', 'time_text_embed.time_proj@1', 'pos_embed#0',\n"
    "                      'transformer_blocks.0.attn.norm_q', 'norm_out.linear', 'latents_out'],\n"
    "        'step_0001': ['latents_in', 'proj_out', 'latents_out']}\n"
    "sig = [1.0, 0.6, 0.0]\n"
    "for i, (g, names) in enumerate(sorted(want.items())):\n"
    "    o = list(f[g].attrs['order'])\n"
    "    assert o == names and all(type(x) is str for x in o), o\n"
    "    assert list(f[g].keys()) == names, list(f[g].keys())\n"
    "    assert f[g].attrs['recorded_modules'] == 'all'\n"
    "    assert f[g].attrs['timestep'] == sig[i] and f[g].attrs['sigma'] == sig[i]\n"
    "    assert f[g].attrs['sigma_next'] == sig[i + 1]\n"
    "x = f['step_0000/x_embedder']\n"
    "assert x.shape == (2, 6, 128) and x.dtype == '<f4' and x.chunks == (2, 6, 128), (x.chunks,)\n"
    "assert x.compression == 'gzip' and x.shuffle\n"
    "assert float(x[0, 0, 1]) == float(__import__('numpy').float32(math.sin(1 * 1.7 + 1 * 0.37) * 2))\n"
    "assert f['step_0000/latents_in'].chunks is None and f['step_0000/latents_in'].compression is None\n"
    "q = f['step_0000/transformer_blocks.0.attn.norm_q']\n"
    "assert q.shape == (2, 6, 4, 32) and q.dtype == '<f8'\n"
    "assert float(q[0, 0, 0, 3]) == math.sin(4 * 1.7 + 3 * 0.37) * 2\n"
    "i = f['inputs']\n"
    "assert list(i.keys()) == ['hidden_states', 'encoder_hidden_states', 'pooled_projections', 'img_ids',\n"
    "                          'txt_ids', 'guidance', 'sigmas', 'timesteps'], list(i.keys())\n"
    "assert all(i[k].dtype == '<f4' for k in i)\n"
    "assert i['guidance'][:].tolist() == [3.5, 4.0] and i['img_ids'][4].tolist() == [0, 1, 1]\n"
    "assert f['final/latents'].shape == (2, 6, 16)\n";

static void test_roundtrip_h5py(void **state)
{
    const char *py = test_python("h5py");
    if (!py) FS_SKIP_LOUDLY("no python3 with h5py ($PYTHON, python3, /usr/bin/python3)");
    char path[128], script[160], cmd[700];
    sample_path(path, sizeof path);
    write_sample(path, 1);
    snprintf(script, sizeof script, "%s.check.py", path);
    FILE *fp = fopen(script, "w");
    assert_non_null(fp);
    fputs(h5py_script, fp);
    fclose(fp);
    snprintf(cmd, sizeof cmd, "%s %s %s", py, script, path);
    assert_int_equal(system(cmd), 0);
}

static void test_h5dump(void **state)
{
    if (system("command -v h5dump >/dev/null 2>&1") != 0) FS_SKIP_LOUDLY("h5dump not installed (hdf5-tools)");
    char path[128], cmd[300];
    sample_path(path, sizeof path);
    write_sample(path, 1);
    snprintf(cmd, sizeof cmd, "h5dump -H %s >/dev/null", path);
    assert_int_equal(system(cmd), 0);
}

/* ---------- replay inputs ---------- */

static void test_read_inputs_roundtrip(void **state)
{
    char path[128];
    sample_path(path, sizeof path);
    write_sample(path, 1);
    fs_inputs want;
    make_inputs(&want, FS_F32);
    for (int v = 0; v < 2; v++) {
        fs_dtype dt = v ? FS_F64 : FS_F32;
        fs_err e = {0};
        fs_config cfg, tiny;
        fs_inputs in;
        fs_config_preset(&tiny, "tiny", &e);
        if (fs_dump_read_inputs(path, dt, &cfg, &in, &e)) fail_msg("%s", e.msg);
        assert_memory_equal(&cfg, &tiny, sizeof cfg);
        assert_int_equal(in.B, SB);
        assert_int_equal(in.S_img, SI);
        assert_int_equal(in.S_txt, ST);
        assert_int_equal(in.n_steps, 2);
        assert_true(in.has_guidance);
        assert_int_equal(in.hidden_states.dtype, dt);
        assert_int_equal(in.pooled_projections.dtype, dt);
        assert_int_equal(in.img_ids.dtype, FS_F64);
        assert_int_equal(in.sigmas.dtype, FS_F64);
        const fs_tensor *a[] = {&in.hidden_states, &in.encoder_hidden_states, &in.pooled_projections, &in.img_ids,
                                &in.txt_ids, &in.guidance, &in.sigmas, &in.timesteps};
        const fs_tensor *b[] = {&want.hidden_states, &want.encoder_hidden_states, &want.pooled_projections,
                                &want.img_ids, &want.txt_ids, &want.guidance, &want.sigmas, &want.timesteps};
        for (size_t k = 0; k < FS_ARRAY_LEN(a); k++) {
            assert_int_equal(a[k]->ndim, b[k]->ndim);
            for (int i = 0; i < a[k]->ndim; i++) assert_int_equal(a[k]->shape[i], b[k]->shape[i]);
            /* The file is a float32 run: everything went through float. */
            for (int64_t i = 0; i < fs_tensor_numel(b[k]); i++)
                assert_true(fs_tensor_get(a[k], i) == (double)(float)fs_tensor_get(b[k], i));
        }
        fs_inputs_free(&in);
        assert_null(in.hidden_states.data);
    }
    fs_inputs_free(&want);
}

static void test_read_inputs_reference(void **state)
{
    const char *ref = fs_test_reference_dir();
    if (!ref) FS_SKIP_LOUDLY("no reference dir (set FLUX_REFERENCE_DIR or provide ../shared/reference)");
    char p[512];
    fs_err e = {0};
    fs_config cfg, want;
    fs_inputs in;

    /* Expected values read with h5py, e.g.
     *   f = h5py.File('tiny/dump_fp64.h5'); i = f['inputs']
     *   float(i['hidden_states'][0,0,0]), float(i['encoder_hidden_states'][0,1,2]),
     *   float(i['pooled_projections'][-1,-1]), i['img_ids'][9].tolist(), i['sigmas'][:].tolist() */
    snprintf(p, sizeof p, "%s/tiny/dump_fp64.h5", ref);
    if (fs_dump_read_inputs(p, FS_F64, &cfg, &in, &e)) fail_msg("%s", e.msg);
    fs_config_preset(&want, "tiny", &e);
    assert_memory_equal(&cfg, &want, sizeof cfg);
    assert_int_equal(in.B, 1);
    assert_int_equal(in.S_img, 64);
    assert_int_equal(in.S_txt, 16);
    assert_int_equal(in.n_steps, 4);
    assert_true(in.has_guidance);
    assert_int_equal(in.hidden_states.shape[2], 16);
    assert_int_equal(in.encoder_hidden_states.shape[2], 64);
    assert_int_equal(in.pooled_projections.shape[1], 32);
    assert_true(fs_tensor_get(&in.guidance, 0) == 3.5);
    assert_true(fs_tensor_get(&in.hidden_states, 0) == 1.5709893703460693);
    assert_true(fs_tensor_get(&in.hidden_states, 64 * 16 - 1) == 0.8992393612861633);
    assert_true(fs_tensor_get(&in.encoder_hidden_states, 1 * 64 + 2) == -2.0018391609191895);
    assert_true(fs_tensor_get(&in.pooled_projections, 31) == 0.7168678641319275);
    assert_true(fs_tensor_get(&in.img_ids, 9 * 3 + 0) == 0 && fs_tensor_get(&in.img_ids, 9 * 3 + 1) == 1 &&
                fs_tensor_get(&in.img_ids, 9 * 3 + 2) == 1);
    static const double tiny_sig[] = {1.0, 0.8272286653518677, 0.6147918701171875, 0.34725838899612427, 0.0};
    static const double tiny_ts[] = {1.0, 0.8272286376953125, 0.6147918701171875, 0.34725839233398437};
    for (int i = 0; i < 5; i++) assert_true(fs_tensor_get(&in.sigmas, i) == tiny_sig[i]);
    for (int i = 0; i < 4; i++) assert_true(fs_tensor_get(&in.timesteps, i) == tiny_ts[i]);
    fs_inputs_free(&in);

    /* odd, float32 file read into a float32 run: B = 2, no guidance. Same h5py recipe. */
    snprintf(p, sizeof p, "%s/odd/dump_fp32.h5", ref);
    if (fs_dump_read_inputs(p, FS_F32, &cfg, &in, &e)) fail_msg("%s", e.msg);
    fs_config_preset(&want, "odd", &e);
    assert_memory_equal(&cfg, &want, sizeof cfg);
    assert_int_equal(in.B, 2);
    assert_int_equal(in.S_img, 35);
    assert_int_equal(in.S_txt, 13);
    assert_int_equal(in.n_steps, 3);
    assert_false(in.has_guidance);
    assert_null(in.guidance.data);
    assert_int_equal(in.hidden_states.dtype, FS_F32);
    assert_int_equal(in.hidden_states.shape[0], 2);
    assert_int_equal(in.hidden_states.shape[2], 8);
    assert_int_equal(in.encoder_hidden_states.shape[2], 40);
    assert_int_equal(in.pooled_projections.shape[1], 24);
    assert_true(fs_tensor_get(&in.hidden_states, 0) == -0.8236140012741089);
    assert_true(fs_tensor_get(&in.hidden_states, 2 * 35 * 8 - 1) == -0.8409382104873657);
    assert_true(fs_tensor_get(&in.encoder_hidden_states, 1 * 40 + 2) == -2.243695020675659);
    assert_true(fs_tensor_get(&in.pooled_projections, 2 * 24 - 1) == 1.229957103729248);
    assert_true(fs_tensor_get(&in.img_ids, 9 * 3 + 1) == 1 && fs_tensor_get(&in.img_ids, 9 * 3 + 2) == 2);
    static const double odd_sig[] = {1.0, 0.6666666865348816, 0.3333333432674408, 0.0};
    for (int i = 0; i < 4; i++) assert_true(fs_tensor_get(&in.sigmas, i) == odd_sig[i]);
    for (int i = 0; i < 3; i++) assert_true(fs_tensor_get(&in.timesteps, i) == odd_sig[i]);
    fs_inputs_free(&in);
}

/* ---------- error messages ---------- */

/* Edits a finished dump with the HDF5 C API to make a broken one. */
static void h5_edit(const char *path, void (*edit)(hid_t f))
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    assert_true(f >= 0);
    edit(f);
    assert_true(H5Fclose(f) >= 0);
}

static void set_version_2(hid_t f)
{
    int64_t v = 2;
    hid_t a = H5Aopen(f, "version", H5P_DEFAULT);
    assert_true(a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0);
    H5Aclose(a);
}

static void drop_pooled(hid_t f) { assert_true(H5Ldelete(f, "/inputs/pooled_projections", H5P_DEFAULT) >= 0); }

/* timesteps of length 5 while sigmas has 3 */
static void bad_timesteps(hid_t f)
{
    assert_true(H5Ldelete(f, "/inputs/timesteps", H5P_DEFAULT) >= 0);
    hsize_t n = 5;
    double v[5] = {1, 0.8, 0.6, 0.4, 0.2};
    hid_t s = H5Screate_simple(1, &n, NULL);
    hid_t d = H5Dcreate2(f, "/inputs/timesteps", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(d >= 0 && H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    H5Dclose(d);
    H5Sclose(s);
}

/* The config says in_channels 8 while /inputs/hidden_states has 16. */
static void config_in8(hid_t f)
{
    fs_err e = {0};
    fs_config c;
    fs_config_preset(&c, "tiny", &e);
    c.in_channels = c.out_channels = 8;
    char *json = fs_config_to_json(&c);
    assert_true(H5Adelete(f, "config") >= 0);
    hid_t t = H5Tcopy(H5T_C_S1), s = H5Screate(H5S_SCALAR);
    H5Tset_size(t, H5T_VARIABLE);
    hid_t a = H5Acreate2(f, "config", t, s, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(a >= 0 && H5Awrite(a, t, &json) >= 0);
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
    free(json);
}

/* An int32 and a string dataset, for the generic reader. */
static void add_odd_datasets(hid_t f)
{
    hsize_t n = 3;
    int32_t v[3] = {1, -2, 3};
    hid_t s = H5Screate_simple(1, &n, NULL);
    hid_t d = H5Dcreate2(f, "/ints", H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(d >= 0 && H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    H5Dclose(d);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 4);
    char str[12] = "abcdefghijk";
    d = H5Dcreate2(f, "/text", t, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(d >= 0 && H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, str) >= 0);
    H5Dclose(d);
    H5Tclose(t);
    H5Sclose(s);
}

/* fs_dump_read_inputs fails with FS_E_INPUT and a message holding the path and every `causes`. */
static void expect_input_error(const char *path, const char *cause1, const char *cause2)
{
    fs_err e = {0};
    fs_config cfg;
    fs_inputs in;
    int rc = fs_dump_read_inputs(path, FS_F32, &cfg, &in, &e);
    if (rc != FS_E_INPUT || !strstr(e.msg, path) || !strstr(e.msg, cause1) || (cause2 && !strstr(e.msg, cause2)))
        fail_msg("rc %d, message '%s' (wanted the path, '%s'%s%s)", rc, e.msg, cause1, cause2 ? " and " : "",
                 cause2 ? cause2 : "");
    assert_null(strchr(e.msg, '\n'));
    assert_null(in.hidden_states.data);
    /* the oracle's reader says the same for file-level problems */
    fo_file *f = (fo_file *)1;
    fs_err e2 = {0};
    if (fo_file_open(&f, path, &e2) == FS_OK) {
        fo_file_close(f);
    } else {
        assert_null(f);
        assert_int_equal(e2.code, FS_E_INPUT);
        assert_string_equal(e2.msg, e.msg);
    }
}

static void test_read_errors(void **state)
{
    char dir[64], p[160];
    fs_test_tmpdir(dir, sizeof dir);

    snprintf(p, sizeof p, "%s/nonexistent.h5", dir);
    expect_input_error(p, "No such file or directory", NULL);

    snprintf(p, sizeof p, "%s/text.h5", dir);
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    fputs("this is not HDF5\n", fp);
    fclose(fp);
    expect_input_error(p, "not an HDF5 file", NULL);

    snprintf(p, sizeof p, "%s/plain.h5", dir); /* HDF5, but no format attribute */
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(f >= 0);
    H5Fclose(f);
    expect_input_error(p, "not a flux-dump file", NULL);

    snprintf(p, sizeof p, "%s/v2.h5", dir);
    write_sample(p, 1);
    h5_edit(p, set_version_2);
    expect_input_error(p, "flux-dump version 2 is newer than this flux-sim supports (1)", NULL);

    snprintf(p, sizeof p, "%s/noinputs.h5", dir);
    write_sample(p, 0);
    expect_input_error(p, "no /inputs group: this dump cannot be replayed", NULL);

    snprintf(p, sizeof p, "%s/nopooled.h5", dir);
    write_sample(p, 1);
    h5_edit(p, drop_pooled);
    expect_input_error(p, "/inputs/pooled_projections", "missing");

    snprintf(p, sizeof p, "%s/badts.h5", dir);
    write_sample(p, 1);
    h5_edit(p, bad_timesteps);
    expect_input_error(p, "/inputs/sigmas has shape [3], expected [N+1] = [6] (N from /inputs/timesteps)", NULL);

    snprintf(p, sizeof p, "%s/in8.h5", dir); /* also: an ASCII (not UTF-8) config string reads fine */
    write_sample(p, 1);
    h5_edit(p, config_in8);
    expect_input_error(p,
                       "/inputs/hidden_states has shape [2, 6, 16], expected [B, S_img, in_channels] = [2, 6, 8] "
                       "(in_channels from the config)",
                       NULL);

    /* The generic dataset reader: ints convert, strings and groups are refused by name. */
    snprintf(p, sizeof p, "%s/extra.h5", dir);
    write_sample(p, 1);
    h5_edit(p, add_odd_datasets);
    fs_err e = {0};
    fo_file *ff = NULL;
    fo_dataset ds = {0};
    if (fo_file_open(&ff, p, &e)) fail_msg("%s", e.msg);
    assert_int_equal(fo_dataset_read(ff, "/ints", &ds, &e), 0);
    assert_string_equal(ds.dtype, "int32");
    assert_true(ds.numel == 3 && ds.data[0] == 1 && ds.data[1] == -2 && ds.data[2] == 3);
    assert_int_equal(fo_dataset_read(ff, "/text", &ds, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "/text: datatype is string, not a number"));
    assert_int_equal(fo_dataset_read(ff, "/step_0000", &ds, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "/step_0000: is a group"));
    assert_int_equal(fo_dataset_read(ff, "/step_0000/nope", &ds, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "/step_0000/nope: no such dataset"));
    assert_int_equal(fo_dataset_read(ff, "/nogroup/nope", &ds, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, p));
    fo_names names = {0};
    assert_int_equal(fo_group_order(ff, "/nogroup", &names, NULL, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "/nogroup: no such group"));
    fo_dataset_free(&ds);
    fo_file_close(ff);
}

/* ---------- crash safety and writer misuse ---------- */

static int dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
    closedir(d);
    return n;
}

static fs_dump *start(const char *path)
{
    fs_err e = {0};
    fs_config cfg;
    fs_config_preset(&cfg, "tiny", &e);
    fs_dump *d = NULL;
    if (fs_dump_create(&d, path, &cfg, FS_F64, NULL, &e)) fail_msg("%s", e.msg);
    return d;
}

static void test_crash_safety(void **state)
{
    char dir[64], p[160], tmp[200];
    fs_test_tmpdir(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/run.h5", dir);
    fs_err e = {0};
    fs_tensor t;
    make_tensor(&t, FS_F64, 2, (int64_t[]){4, 100}, 7);

    /* abort after some writes: nothing left */
    fs_dump *d = start(p);
    snprintf(tmp, sizeof tmp, "%s", fs_dump_tmp_path(d));
    assert_int_equal(fs_dump_begin_step(d, 0, 1, 1, 0.5, &e), 0);
    assert_int_equal(fs_dump_record(d, "a", &t, &e), 0);
    assert_int_equal(fs_dump_record(d, "b", &t, &e), 0);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(access(tmp, F_OK), 0);
    fs_dump_abort(d);
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(dir_entries(dir), 0);
    fs_dump_abort(NULL);

    /* a duplicate name is a producer bug: error, and the dump is never published */
    d = start(p);
    assert_int_equal(fs_dump_begin_step(d, 0, 1, 1, 0.5, &e), 0);
    assert_int_equal(fs_dump_record(d, "a", &t, &e), 0);
    assert_int_equal(fs_dump_record(d, "a", &t, &e), FS_E_INTERNAL);
    assert_non_null(strstr(e.msg, "/step_0000/a recorded twice"));
    assert_int_equal(fs_dump_end_step(d, &e), FS_E_IO); /* sticky */
    assert_int_equal(fs_dump_close(d, &e), FS_E_IO);
    assert_non_null(strstr(e.msg, p));
    assert_int_equal(dir_entries(dir), 0);

    /* record outside a step; a step begun twice */
    d = start(p);
    assert_int_equal(fs_dump_record(d, "a", &t, &e), FS_E_INTERNAL);
    assert_non_null(strstr(e.msg, "outside a step"));
    fs_dump_abort(d);
    d = start(p);
    assert_int_equal(fs_dump_begin_step(d, 0, 1, 1, 0.5, &e), 0);
    assert_int_equal(fs_dump_record(d, "x/y", &t, &e), FS_E_INTERNAL);
    fs_dump_abort(d);
    d = start(p);
    assert_int_equal(fs_dump_begin_step(d, 3, 1, 1, 0.5, &e), 0);
    assert_int_equal(fs_dump_begin_step(d, 4, 1, 1, 0.5, &e), FS_E_INTERNAL);
    fs_dump_abort(d);

    /* close with a step still open: refused, nothing left */
    d = start(p);
    assert_int_equal(fs_dump_begin_step(d, 0, 1, 1, 0.5, &e), 0);
    assert_int_equal(fs_dump_record(d, "a", &t, &e), 0);
    assert_int_equal(fs_dump_close(d, &e), FS_E_INTERNAL);
    assert_non_null(strstr(e.msg, "step_0000 was never ended"));
    assert_int_equal(dir_entries(dir), 0);

    /* reserved root attributes */
    d = start(p);
    assert_int_equal(fs_dump_set_attr_int(d, "version", 7, &e), FS_E_INTERNAL);
    fs_dump_abort(d);
    assert_int_equal(dir_entries(dir), 0);

    /* a directory that does not exist: the path and the OS's reason, one line */
    char bad[200];
    snprintf(bad, sizeof bad, "%s/no/such/dir/run.h5", dir);
    fs_config cfg;
    fs_config_preset(&cfg, "tiny", &e);
    d = (fs_dump *)1;
    assert_int_equal(fs_dump_create(&d, bad, &cfg, FS_F32, NULL, &e), FS_E_IO);
    assert_null(d);
    assert_non_null(strstr(e.msg, bad));
    assert_non_null(strstr(e.msg, "No such file or directory"));
    assert_null(strchr(e.msg, '\n'));
    /* a path whose "directory" is a regular file */
    snprintf(bad, sizeof bad, "%s/file", dir);
    FILE *fp = fopen(bad, "w");
    fclose(fp);
    snprintf(bad + strlen(bad), sizeof bad - strlen(bad), "/run.h5");
    assert_int_equal(fs_dump_create(&d, bad, &cfg, FS_F32, NULL, &e), FS_E_IO);
    assert_non_null(strstr(e.msg, "Not a directory"));

    fs_tensor_free(&t);
}

/* ---------- storage layout ---------- */

/* Layout and number of filters of dataset `name` in the finished file `path`. */
static void layout_of(const char *path, const char *name, H5D_layout_t *layout, int *nfilters)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(f >= 0);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    assert_true(d >= 0);
    hid_t p = H5Dget_create_plist(d);
    *layout = H5Pget_layout(p);
    *nfilters = H5Pget_nfilters(p);
    H5Pclose(p);
    H5Dclose(d);
    H5Fclose(f);
}

static void test_layout(void **state)
{
    char path[128];
    sample_path(path, sizeof path);
    write_sample(path, 1);
    H5D_layout_t l;
    int nf;
    layout_of(path, "/step_0000/x_embedder", &l, &nf); /* 1536 elements: one shuffle+deflate chunk */
    assert_int_equal(l, H5D_CHUNKED);
    assert_int_equal(nf, 2);
    layout_of(path, "/step_0000/latents_in", &l, &nf); /* 192 elements: contiguous */
    assert_int_equal(l, H5D_CONTIGUOUS);
    assert_int_equal(nf, 0);

    /* deflate 0 (the default): everything contiguous, values unchanged */
    fs_err e = {0};
    fs_dump *d = start(path);
    assert_int_equal(fs_dump_set_deflate(d, 10, &e), FS_E_INPUT);
    assert_int_equal(fs_dump_set_deflate(d, 0, &e), 0);
    fs_tensor t;
    make_tensor(&t, FS_F64, 2, (int64_t[]){4, 100}, 7);
    assert_int_equal(fs_dump_begin_step(d, 0, 1, 1, 0.5, &e), 0);
    assert_int_equal(fs_dump_record(d, "a", &t, &e), 0);
    assert_int_equal(fs_dump_end_step(d, &e), 0);
    assert_int_equal(fs_dump_write_final(d, &t, &e), 0);
    if (fs_dump_close(d, &e)) fail_msg("%s", e.msg);
    layout_of(path, "/step_0000/a", &l, &nf);
    assert_int_equal(l, H5D_CONTIGUOUS);
    assert_int_equal(nf, 0);
    fo_file *f = NULL;
    fo_dataset ds = {0};
    if (fo_file_open(&f, path, &e)) fail_msg("%s", e.msg);
    assert_string_equal(fo_file_dtype(f), "float64");
    assert_int_equal(fo_file_nsteps(f), 1);
    rec r = {"a", FS_F64, 2, {4, 100}};
    expect_dataset(f, &ds, "/step_0000/a", &r, 7);
    assert_false(fo_is_group(f, "/inputs")); /* written without inputs */
    fo_dataset_free(&ds);
    fo_file_close(f);

    /* the completeness marker is written last, and only by a close that publishes: a dump
     * without /final is refused and leaves nothing; a finished one reads complete */
    d = start(path);
    assert_int_equal(fs_dump_set_attr_int(d, "complete", 1, &e), FS_E_INTERNAL); /* the writer's own */
    assert_int_equal(fs_dump_begin_step(d, 0, 1, 1, 0.5, &e), 0);
    assert_int_equal(fs_dump_record(d, "a", &t, &e), 0);
    assert_int_equal(fs_dump_end_step(d, &e), 0);
    unlink(path);
    assert_int_equal(fs_dump_close(d, &e), FS_E_INTERNAL);
    assert_non_null(strstr(e.msg, "/final was never written"));
    assert_int_equal(access(path, F_OK), -1);
    write_sample(path, 0);
    if (fo_file_open(&f, path, &e)) fail_msg("%s", e.msg);
    fo_completeness c;
    if (fo_file_completeness(f, &c, &e)) fail_msg("%s", e.msg);
    assert_true(c.complete && c.has_marker);
    fo_file_close(f);
    fs_tensor_free(&t);
}

/* ---------- metrics ---------- */

static void test_metrics(void **state)
{
    fo_stats s;
    const double a[] = {1, 2, 3, 4}, b[] = {1, 2, 3, 5};
    fo_compare(a, b, 4, &s);
    assert_int_equal(s.n, 4);
    assert_int_equal(s.n_finite, 4);
    assert_true(s.max_abs == 1);
    assert_int_equal(s.argmax, 3);
    assert_true(fabs(s.rel_l2 - 1 / sqrt(39)) < 1e-15);
    assert_true(fabs(s.cosine - 34 / sqrt(30.0 * 39.0)) < 1e-15);
    assert_true(fo_stats_all_finite(&s));
    assert_int_equal(s.first_nonfinite, -1);

    /* opposite vectors; the first of equal maxima wins */
    const double c[] = {-1, -2, -3, -4};
    fo_compare(a, c, 4, &s);
    assert_true(fabs(s.cosine + 1) < 1e-15);
    assert_true(s.max_abs == 8 && s.argmax == 3);
    const double u[] = {1, -1}, v[] = {-1, 1};
    fo_compare(u, v, 2, &s);
    assert_int_equal(s.argmax, 0);

    /* NaN and Inf: counted per side, finite metrics over the finite pairs only */
    const double an[] = {1, NAN, 3, INFINITY, NAN, 5}, bn[] = {1.5, 2, NAN, INFINITY, NAN, 5};
    fo_compare(an, bn, 6, &s);
    assert_int_equal(s.nan_a, 2);
    assert_int_equal(s.inf_a, 1);
    assert_int_equal(s.nan_b, 2);
    assert_int_equal(s.inf_b, 1);
    assert_int_equal(s.n_nonfinite_mismatch, 2); /* NaN vs 2 and 3 vs NaN; inf == inf, NaN == NaN */
    assert_int_equal(s.first_nonfinite, 1);
    assert_int_equal(s.n_finite, 2);
    assert_true(s.max_abs == 0.5 && s.argmax == 0);
    assert_true(fabs(s.rel_l2 - 0.5 / sqrt(1.5 * 1.5 + 25)) < 1e-15);
    assert_false(fo_stats_all_finite(&s));
    const double ai[] = {INFINITY}, bi[] = {-INFINITY};
    fo_compare(ai, bi, 1, &s);
    assert_int_equal(s.n_nonfinite_mismatch, 1);
    assert_int_equal(s.argmax, -1);

    /* zero norms: 0/0 = 0, x/0 = inf; cosine 1 for two zero vectors, 0 when one is zero */
    const double z[] = {0, 0}, o[] = {3, 4};
    fo_compare(z, z, 2, &s);
    assert_true(s.rel_l2 == 0 && s.cosine == 1 && s.max_abs == 0);
    fo_compare(o, z, 2, &s);
    assert_true(isinf(s.rel_l2) && s.rel_l2 > 0 && s.cosine == 0 && s.max_abs == 4 && s.argmax == 1);
    fo_compare(z, o, 2, &s);
    assert_true(s.rel_l2 == 1 && s.cosine == 0 && s.norm_b == 5);
    fo_compare(NULL, NULL, 0, &s);
    assert_true(s.n == 0 && s.rel_l2 == 0 && s.cosine == 1 && s.argmax == -1);

    /* sums of squares that overflow double are rescued by scaling */
    const double big_a[] = {1e200, 1e200}, big_b[] = {1e200, 0};
    fo_compare(big_a, big_b, 2, &s);
    assert_true(fabs(s.rel_l2 - 1) < 1e-15);
    assert_true(fabs(s.cosine - 1 / sqrt(2)) < 1e-15);
    assert_true(fabs(s.norm_a / 1e200 - sqrt(2)) < 1e-15);

    /* coordinates */
    int64_t shape[3] = {2, 3, 4}, co[3];
    assert_int_equal(fo_unravel(23, 3, shape, co), 0);
    assert_true(co[0] == 1 && co[1] == 2 && co[2] == 3);
    assert_int_equal(fo_unravel(5, 3, shape, co), 0);
    assert_true(co[0] == 0 && co[1] == 1 && co[2] == 1);
    assert_int_equal(fo_unravel(24, 3, shape, co), -1);
    assert_int_equal(fo_unravel(-1, 3, shape, co), -1);
    char buf[64];
    assert_string_equal(fo_coords_str(3, co, buf, sizeof buf), "(0, 1, 1)");
    assert_int_equal(fo_unravel(0, 0, NULL, co), 0); /* a scalar has one element */
}

/* ---------- the reference dump through fo_dump ---------- */

static void test_reference_oracle(void **state)
{
    const char *ref = fs_test_reference_dir();
    if (!ref) FS_SKIP_LOUDLY("no reference dir (set FLUX_REFERENCE_DIR or provide ../shared/reference)");
    char p64[512], p32[512];
    snprintf(p64, sizeof p64, "%s/tiny/dump_fp64.h5", ref);
    snprintf(p32, sizeof p32, "%s/tiny/dump_fp32.h5", ref);
    fs_err e = {0};
    fo_file *f = NULL, *g = NULL;
    if (fo_file_open(&f, p64, &e)) fail_msg("%s", e.msg);
    if (fo_file_open(&g, p32, &e)) fail_msg("%s", e.msg);
    assert_string_equal(fo_file_dtype(f), "float64");
    assert_string_equal(fo_file_dtype(g), "float32");
    assert_null(fo_file_parallel(f));
    assert_non_null(strstr(fo_file_producer(f), "diffusers"));
    assert_int_equal(fo_file_nsteps(f), 4);
    for (int i = 0; i < 4; i++) assert_int_equal(fo_file_step_number(f, i), i);
    fs_config cfg, tiny;
    fs_config_preset(&tiny, "tiny", &e);
    if (fs_config_from_json(&cfg, fo_file_config(f), p64, &e)) fail_msg("%s", e.msg);
    assert_memory_equal(&cfg, &tiny, sizeof cfg);

    fo_names order = {0};
    fo_order_source src = FO_ORDER_NAME;
    if (fo_group_order(f, "/step_0000", &order, &src, &e)) fail_msg("%s", e.msg);
    assert_int_equal(src, FO_ORDER_ATTR);
    assert_int_equal(order.n, 180);
    assert_string_equal(order.v[0], "latents_in");
    assert_string_equal(order.v[179], "latents_out");
    assert_string_equal(order.v[47], "transformer_blocks.0.attn.to_out.1");
    if (fo_group_order(f, "/step_0001", &order, &src, &e)) fail_msg("%s", e.msg);
    assert_int_equal(order.n, 29); /* later steps hold depth <= 2 only */

    /* A hard link (to_out.1 = to_out.0 = attn#0) in a compressed chunk. Values from h5py:
     *   d = f['step_0000/transformer_blocks.0.attn.to_out.1']; d[0,0,0], d[0,63,127] */
    fo_dataset ds = {0}, ds2 = {0};
    if (fo_dataset_read(f, "/step_0000/transformer_blocks.0.attn.to_out.1", &ds, &e)) fail_msg("%s", e.msg);
    assert_int_equal(ds.ndim, 3);
    assert_true(ds.shape[0] == 1 && ds.shape[1] == 64 && ds.shape[2] == 128);
    assert_string_equal(ds.dtype, "float64");
    assert_true(ds.data[0] == 0.6477771928736445);
    assert_true(ds.data[63 * 128 + 127] == -0.29523140317384644);
    if (fo_dataset_read(f, "/step_0000/transformer_blocks.0.attn#0", &ds2, &e)) fail_msg("%s", e.msg);
    fo_stats s;
    fo_compare(ds.data, ds2.data, ds.numel, &s);
    assert_true(s.max_abs == 0 && s.rel_l2 == 0);

    /* float32 vs float64 run: README says proj_out agrees to ~3e-5 relative */
    if (fo_dataset_read(g, "/step_0000/proj_out", &ds2, &e)) fail_msg("%s", e.msg);
    assert_string_equal(ds2.dtype, "float32");
    size_t cap = ds2.cap;
    if (fo_dataset_read(f, "/step_0000/proj_out", &ds, &e)) fail_msg("%s", e.msg);
    fo_compare(ds2.data, ds.data, ds.numel, &s);
    assert_true(s.rel_l2 > 0 && s.rel_l2 < 1e-4);
    assert_true(s.cosine > 0.9999999);
    assert_true(fo_stats_all_finite(&s));
    /* a smaller read reuses the buffer */
    double *keep = ds2.data;
    if (fo_dataset_read(g, "/step_0000/time_text_embed", &ds2, &e)) fail_msg("%s", e.msg);
    assert_true(ds2.data == keep && ds2.cap == cap && ds2.numel == 128);

    fo_dataset_free(&ds);
    fo_dataset_free(&ds2);
    fo_names_free(&order);
    fo_file_close(f);
    fo_file_close(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_fo),
        cmocka_unit_test(test_roundtrip_h5py),
        cmocka_unit_test(test_h5dump),
        cmocka_unit_test(test_read_inputs_roundtrip),
        cmocka_unit_test(test_read_inputs_reference),
        cmocka_unit_test(test_read_errors),
        cmocka_unit_test(test_crash_safety),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_reference_oracle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
