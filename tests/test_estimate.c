/* test_estimate.c — fs_estimate: the dump size is exact (checked against a real dump), the
 * weights are exactly what fs_weights holds per rank, sizes grow as they must and saturate instead
 * of wrapping, and a refusal names the option that drove it (probe #12). */
#include "test_util.h"

#include <inttypes.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "fo_dump.h"
#include "fs_estimate.h"
#include "fs_job.h"
#include "fs_plan.h"
#include "fs_weights.h"

static fs_estimate_req req(const fs_config *c, int es, int B, int64_t si, int64_t st, int steps)
{
    return (fs_estimate_req){.cfg = c, .dtype_size = es, .batch = B, .img_tokens = si, .txt_tokens = st,
                             .steps = steps, .threads = 2, .full_weights = 1};
}

/* The dump estimate equals the bytes of every dataset of step_0000 in golden/default-fp64.h5
 * (default config, grid 2x3, 4 text tokens, fp64): a recording added or dropped in the model
 * without updating fs_estimate fails here. */
static uint64_t dump_step_exact(const char *path, int B, int Si, int St)
{
    fo_file *f;
    fs_err e = {0};
    if (fo_file_open(&f, path, &e)) fail_msg("%s", e.msg);
    fo_names names = {0};
    fo_order_source src;
    if (fo_group_order(f, "/step_0000", &names, &src, &e)) fail_msg("%s", e.msg);
    uint64_t bytes = 0;
    for (int i = 0; i < names.n; i++) {
        char path[300];
        snprintf(path, sizeof path, "/step_0000/%s", names.v[i]);
        fo_dataset ds = {0};
        if (fo_dataset_info(f, path, &ds, &e)) fail_msg("%s", e.msg);
        uint64_t n = 1;
        for (int d = 0; d < ds.ndim; d++) n *= (uint64_t)ds.shape[d];
        bytes += n * 8;
        fo_dataset_free(&ds);
    }
    fo_names_free(&names);
    fs_config c;
    if (fs_config_from_json(&c, fo_file_config(f), "golden", &e)) fail_msg("%s", e.msg);
    fo_file_close(f);
    fs_estimate_req r = req(&c, 8, B, Si, St, 2);
    fs_estimate est;
    assert_int_equal(fs_estimate_compute(&r, &est, &e), 0);
    if (est.dump_step_bytes != bytes)
        fail_msg("estimate %" PRIu64 " bytes, %s step_0000 holds %" PRIu64, est.dump_step_bytes, path, bytes);
    return bytes;
}

static void test_dump_step_exact(void **s)
{
    uint64_t bytes = dump_step_exact("golden/default-fp64.h5", 1, 6, 4);
    assert_true(bytes == 2750464); /* sanity: the file did not change under us */
    /* FLUX.2: diffusers' own dump of Flux2Transformer2DModel (every hooked module) */
    const char *refdir = fs_test_reference_dir();
    if (!refdir) FS_SKIP_LOUDLY("../shared/reference not found: the FLUX.2 dump estimate was not checked");
    char p[512];
    snprintf(p, sizeof p, "%s/flux2-tiny/dump_fp64.h5", refdir);
    dump_step_exact(p, 1, 64, 24);
}

static uint64_t weights_bytes(const fs_weights *w)
{
    uint64_t n = 0;
    for (int i = 0; i < w->n; i++) n += fs_tensor_nbytes(&w->t[i]);
    return n;
}

/* Per-rank weights: exactly what the synthetic (sharded) weights allocate under the built-in plan */
static void test_weights_exact(void **s)
{
    const char *presets[] = {"odd", "tiny", "default", "flux2-tiny", "flux2-default"};
    for (size_t k = 0; k < FS_ARRAY_LEN(presets); k++)
        for (int T = 1; T <= 2; T++) {
            fs_config c;
            fs_config_preset(&c, presets[k], NULL);
            fs_plan plan; /* the family's built-in plan */
            assert_int_equal(fs_plan_parse(&plan, fs_plan_default_text_for(&c), "built-in", NULL), 0);
            fs_weights w;
            fs_err e = {0};
            if (fs_weights_synthetic_shard(&w, &c, FS_F32, 0, &plan, T, T - 1, NULL, &e)) fail_msg("%s", e.msg);
            fs_estimate_req r = req(&c, 4, 1, 16, 8, 1);
            r.tp = T;
            r.full_weights = 0;
            fs_estimate est;
            assert_int_equal(fs_estimate_compute(&r, &est, &e), 0);
            if (est.weight_bytes != weights_bytes(&w))
                fail_msg("%s tp %d: estimate %" PRIu64 ", allocated %" PRIu64, presets[k], T, est.weight_bytes,
                         weights_bytes(&w));
            assert_true(est.params == fs_config_num_params(&c));
            fs_weights_free(&w);
            fs_plan_free(&plan);
        }
}

/* Streaming: the estimate's weights are the most the store ever holds while the model walks its
 * blocks (fs_weights peak_bytes), in fp32 and bf16, tp 1 and 2 */
static void test_weights_streamed_exact(void **s)
{
    const char *presets[] = {"odd", "tiny", "default", "flux2-tiny", "flux2-default"};
    const fs_dtype dts[] = {FS_F32, FS_BF16};
    for (size_t k = 0; k < FS_ARRAY_LEN(presets); k++)
        for (size_t d = 0; d < FS_ARRAY_LEN(dts); d++)
            for (int T = 1; T <= 2; T++) {
                fs_config c;
                fs_config_preset(&c, presets[k], NULL);
                fs_plan plan; /* the family's built-in plan */
                assert_int_equal(fs_plan_parse(&plan, fs_plan_default_text_for(&c), "built-in", NULL), 0);
                fs_weights w;
                fs_err e = {0};
                fs_weights_opts o = {.seed = 0, .dtype = dts[d], .make_dtype = dts[d], .plan = &plan, .tp = T,
                                     .tp_rank = T - 1, .stream = 1};
                if (fs_weights_open(&w, &c, &o, &e)) fail_msg("%s", e.msg);
                char pre[64];
                for (int b = 0; b < c.num_layers + c.num_single_layers; b++) {
                    if (b < c.num_layers) snprintf(pre, sizeof pre, "transformer_blocks.%d.", b);
                    else snprintf(pre, sizeof pre, "single_transformer_blocks.%d.", b - c.num_layers);
                    if (fs_weights_acquire(&w, pre, &e)) fail_msg("%s", e.msg);
                    fs_weights_release(&w, pre);
                }
                fs_estimate_req r = req(&c, (int)fs_dtype_size(dts[d]), 1, 16, 8, 1);
                r.tp = T;
                r.full_weights = 0;
                r.stream = 1;
                fs_estimate est;
                assert_int_equal(fs_estimate_compute(&r, &est, &e), 0);
                if ((int64_t)est.weight_bytes != w.peak_bytes)
                    fail_msg("%s %s tp %d streamed: estimate %" PRIu64 ", store peak %" PRId64, presets[k],
                             fs_dtype_name(dts[d]), T, est.weight_bytes, w.peak_bytes);
                fs_weights_free(&w);
                fs_plan_free(&plan);
            }
}

static void test_monotone_and_layouts(void **s)
{
    fs_config c;
    fs_config_preset(&c, "flux-dev", NULL);
    fs_estimate a, b;
    fs_estimate_req r = req(&c, 4, 1, 4096, 512, 28);
    assert_int_equal(fs_estimate_compute(&r, &a, NULL), 0);
    /* FLUX.1-dev weights in fp32: 44.3 GiB (README) */
    assert_true(a.weight_bytes == (uint64_t)11901408320LL * 4);
    r.img_tokens = 16384;
    assert_int_equal(fs_estimate_compute(&r, &b, NULL), 0);
    assert_true(b.act_peak_bytes > 3 * a.act_peak_bytes && b.dump_bytes > 3 * a.dump_bytes);
    r.batch = 2;
    fs_estimate c2;
    assert_int_equal(fs_estimate_compute(&r, &c2, NULL), 0);
    assert_true(c2.act_peak_bytes > b.act_peak_bytes && c2.dump_step_bytes > b.dump_step_bytes);
    /* sharding: TP halves the split weights, SP the tokens per rank */
    r = req(&c, 4, 1, 4096, 512, 1);
    r.tp = 2;
    r.full_weights = 0;
    fs_estimate t2, u2, r2;
    assert_int_equal(fs_estimate_compute(&r, &t2, NULL), 0);
    assert_true(t2.weight_bytes < a.weight_bytes && t2.weight_bytes > a.weight_bytes / 2);
    r = req(&c, 4, 1, 4096, 512, 1);
    r.ulysses = 2;
    assert_int_equal(fs_estimate_compute(&r, &u2, NULL), 0);
    assert_int_equal(u2.tokens_rank, 2048 + 256);
    r.ulysses = 1;
    r.ring = 2;
    assert_int_equal(fs_estimate_compute(&r, &r2, NULL), 0);
    assert_true(r2.act_peak_bytes < a.act_peak_bytes);
    /* the in-job --check reference is every step's dump */
    r = req(&c, 4, 1, 4096, 512, 3);
    r.check = r.check_in_job = 1;
    assert_int_equal(fs_estimate_compute(&r, &b, NULL), 0);
    assert_true(b.check_ref_bytes == 3 * b.dump_step_bytes);
}

/* Saturation: the largest request the CLI's limits allow, and one beyond them, never wrap */
static void test_saturates(void **s)
{
    fs_config c = {.patch_size = 1, .in_channels = 1 << 20, .out_channels = 1 << 20, .num_layers = 8,
                   .num_single_layers = 8, .attention_head_dim = 1024, .num_attention_heads = 32,
                   .joint_attention_dim = 1 << 20, .pooled_projection_dim = 1 << 20, .guidance_embeds = 1,
                   .axes_dims_rope = {340, 342, 342}};
    fs_err e = {0};
    if (fs_config_validate(&c, "big", &e)) fail_msg("%s", e.msg);
    fs_estimate_req r = req(&c, 8, 64, INT64_MAX / 2, INT64_MAX / 2, 1000000);
    fs_estimate est;
    assert_int_equal(fs_estimate_compute(&r, &est, NULL), 0);
    assert_true(est.dump_bytes == UINT64_MAX && est.rank_bytes == UINT64_MAX && est.act_peak_bytes == UINT64_MAX);
    r = req(&c, 8, 64, FS_MAX_IMG_TOKENS, FS_MAX_TXT_TOKENS, 1000000);
    assert_int_equal(fs_estimate_compute(&r, &est, NULL), 0);
    assert_true(est.rank_bytes > ((uint64_t)1 << 50)); /* petabytes, not a wrapped small number */
    assert_int_equal(fs_estimate_check(&r, &est, (uint64_t)1 << 40, NULL, UINT64_MAX, &e), FS_E_INPUT);
}

static void test_invalid_request(void **s)
{
    fs_config c;
    fs_config_preset(&c, "tiny", NULL);
    fs_estimate est;
    fs_err e = {0};
    fs_estimate_req r = req(&c, 4, 0, 16, 8, 1);
    assert_int_equal(fs_estimate_compute(&r, &est, &e), FS_E_INPUT);
    r = req(&c, 3, 1, 16, 8, 1);
    assert_int_equal(fs_estimate_compute(&r, &est, &e), FS_E_INPUT);
    r = req(&c, 4, 1, -1, 8, 1);
    assert_int_equal(fs_estimate_compute(&r, &est, &e), FS_E_INPUT);
    c.num_attention_heads = 1 << 30;
    r = req(&c, 4, 1, 16, 8, 1);
    assert_int_equal(fs_estimate_compute(&r, &est, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "num_attention_heads"));
}

static void expect_refusal(fs_estimate_req *r, uint64_t mem, uint64_t disk, const char *w1, const char *w2)
{
    fs_estimate est;
    fs_err e = {0};
    assert_int_equal(fs_estimate_compute(r, &est, &e), 0);
    int rc = fs_estimate_check(r, &est, mem, NULL, disk, &e);
    if (rc != FS_E_INPUT) fail_msg("not refused (rank %" PRIu64 " bytes, mem %" PRIu64 ")", est.rank_bytes, mem);
    if (strchr(e.msg, '\n') || !strstr(e.msg, w1) || (w2 && !strstr(e.msg, w2)))
        fail_msg("message '%s' lacks '%s' / '%s'", e.msg, w1, w2 ? w2 : "");
    print_message("      %s\n", e.msg);
}

/* The refusal names the option behind the largest term */
static void test_refusal_names_the_option(void **s)
{
    const uint64_t GiB = 1ull << 30;
    fs_config dflt, dev;
    fs_config_preset(&dflt, "default", NULL);
    fs_config_preset(&dev, "flux-dev", NULL);
    /* --grid 2000x2000 of flux-dev: ~1.1 TiB of activations */
    fs_estimate_req r = req(&dev, 4, 1, 4000000, 512, 1);
    r.config_src = "flux-dev";
    r.grid_h = r.grid_w = 2000;
    expect_refusal(&r, 24 * GiB, UINT64_MAX, "--grid 2000x2000: 4,000,000 image tokens need ~1.1 TiB per rank",
                   "this machine has 24 GiB");
    /* --txt-len 1000000 of the default model */
    r = req(&dflt, 4, 1, 256, 1000000, 1);
    r.grid_h = r.grid_w = 16;
    expect_refusal(&r, 8 * GiB, UINT64_MAX, "--txt-len 1000000: 1,000,000 text tokens", "this machine has 8 GiB");
    /* batch named when > 1 */
    r = req(&dflt, 4, 64, 65536, 32, 1);
    r.grid_h = r.grid_w = 256;
    expect_refusal(&r, 8 * GiB, UINT64_MAX, "--grid 256x256: 65,536 image tokens at batch 64", NULL);
    /* replayed inputs: the dump is the culprit */
    r = req(&dflt, 4, 1, 1 << 20, 512, 1);
    r.inputs_src = "big.h5";
    expect_refusal(&r, 8 * GiB, UINT64_MAX, "--inputs big.h5: 1,049,088 image + text tokens", NULL);
    /* weights dominate: flux-dev in fp64 on a 64 GiB machine */
    r = req(&dev, 8, 1, 4096, 512, 1);
    r.config_src = "flux-dev";
    expect_refusal(&r, 64 * GiB, UINT64_MAX, "--config flux-dev: 11,901,408,320 parameters need ~88.7 GiB", "fp64");
    /* the in-job --check reference of many steps */
    r = req(&dflt, 4, 1, 4096, 32, 200);
    r.check = r.check_in_job = 1;
    expect_refusal(&r, 8 * GiB, UINT64_MAX, "--check: the single-rank reference of 200 steps", "--check=REF.h5");
    /* ranks sharing the machine */
    r = req(&dflt, 4, 1, 65536, 32, 1);
    r.grid_h = r.grid_w = 256;
    r.ranks_per_machine = 8; /* 1.7 GB each: fits alone, not eight times */
    expect_refusal(&r, 8 * GiB, UINT64_MAX, "per rank (8 ranks on this machine)", NULL);
    /* disk: an uncompressed dump larger than the free space */
    r = req(&dflt, 4, 1, 4096, 32, 4);
    r.dump_path = "/tmp/x.h5";
    expect_refusal(&r, 0, 1 * GiB, "--dump /tmp/x.h5: the dump of 4 steps will be ~", "has 1 GiB free");
    /* ... but not when compressed (size unknown), nor when memory and disk suffice */
    fs_estimate est;
    r.dump_compressed = 1;
    assert_int_equal(fs_estimate_compute(&r, &est, NULL), 0);
    assert_int_equal(fs_estimate_check(&r, &est, 0, NULL, 1 * GiB, NULL), 0);
    r = req(&dflt, 4, 1, 256, 32, 4);
    assert_int_equal(fs_estimate_compute(&r, &est, NULL), 0);
    assert_int_equal(fs_estimate_check(&r, &est, 8 * GiB, NULL, 100 * GiB, NULL), 0);
    /* the demo run fits this machine (the call flux-sim makes) */
    r.dump_path = "/tmp/demo.h5";
    fs_err e = {0};
    if (fs_estimate_refuse(&r, NULL, &e)) fail_msg("demo refused: %s", e.msg);
    assert_true(fs_estimate_phys_mem() > 0);
    char what[64];
    assert_true(fs_estimate_mem_limit(what, sizeof what) <= fs_estimate_phys_mem());
}

/* Under `ulimit -v` the refusal compares with the limit and says so (a child process, so the
 * limit does not stay on the test runner; skipped under ASan, which needs terabytes of address
 * space) */
static void test_mem_limit_rlimit(void **s)
{
    if (getenv("FLUX_SANITIZE")) FS_SKIP_LOUDLY("ASan reserves terabytes of address space; ulimit -v cannot apply");
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {.rlim_cur = 6ull << 30, .rlim_max = RLIM_INFINITY};
        setrlimit(RLIMIT_AS, &rl);
        char what[64], msg[1100];
        uint64_t m = fs_estimate_mem_limit(what, sizeof what);
        fs_config c;
        fs_config_preset(&c, "default", NULL);
        fs_estimate_req r = req(&c, 4, 1, 256, 1000000, 1);
        fs_err e = {0};
        int rc = fs_estimate_refuse(&r, NULL, &e);
        snprintf(msg, sizeof msg, "%llu|%s|%d|%s", (unsigned long long)m, what, rc, e.msg);
        ssize_t w = write(fd[1], msg, strlen(msg) + 1);
        _exit(w > 0 ? 0 : 1);
    }
    close(fd[1]);
    char buf[1200] = "";
    ssize_t n = read(fd[0], buf, sizeof buf - 1);
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    assert_true(n > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    print_message("      %s\n", buf);
    unsigned long long m = strtoull(buf, NULL, 10);
    if (!strstr(buf, "|2|--txt-len 1000000: 1,000,000 text tokens")) fail_msg("not refused: '%s'", buf);
    /* a smaller cgroup limit or physical memory would rightly win over the 6 GiB ulimit */
    if (m == (6ull << 30) && !strstr(buf, "ulimit -v allows|") && !strstr(buf, "; ulimit -v allows 6 GiB"))
        fail_msg("the message does not name ulimit -v: '%s'", buf);
    assert_true(m <= (6ull << 30));
}

static void test_bytes_str(void **s)
{
    char b[32];
    assert_string_equal(fs_estimate_bytes_str(512, b, sizeof b), "512 B");
    assert_string_equal(fs_estimate_bytes_str(1536, b, sizeof b), "1.5 KiB");
    assert_string_equal(fs_estimate_bytes_str(24ull << 30, b, sizeof b), "24 GiB");
    assert_string_equal(fs_estimate_bytes_str(UINT64_MAX - 1, b, sizeof b), "16 EiB");
    /* a saturated sum or product (probe T14: a dump of ~10^20 bytes printed "16 EiB") */
    assert_string_equal(fs_estimate_bytes_str(UINT64_MAX, b, sizeof b), "more than 16 EiB");
}

/* Probe T14: --estimate's "fits here" total (rank 0 + every other rank) saturates instead of
 * wrapping ("need 6.6 EiB" for ~215 EiB), and --estimate refuses a layout the run refuses
 * (fs_par_set_seq: no sequence-parallel rank without a token). */
static void test_job_estimate(void **s)
{
    fs_err e = {0};
    if (!fs_comm_initialized()) assert_int_equal(fs_comm_init(NULL, NULL, &e), 0);
    fs_job_opts o;
    memset(&o, 0, sizeof o);
    o.precision = "fp64";
    o.stream = "auto";
    o.config = "flux-dev";
    o.gen = (fs_gen_params){.seed = 0, .batch = 64, .grid_h = 2048, .grid_w = 2048, .txt_len = 4194304, .steps = 4,
                            .guidance = 3.5};
    o.tp = 24;
    o.ring = 1000000;
    fs_job_estimate est;
    assert_int_equal(fs_job_estimate_compute(&o, &est, &e), 0);
    assert_int_equal(est.ranks, 24000000);
    assert_true(est.e1.rank_bytes > 0);
    assert_true(est.here_bytes == UINT64_MAX); /* 24e6 ranks x ~9 TiB: saturated, not wrapped */
    char b[32];
    print_message("      24,000,000 ranks need %s\n", fs_estimate_bytes_str(est.here_bytes, b, sizeof b));

    /* 288 tokens over a million ring ranks: the run says no rank may be empty, and so does --estimate */
    o.config = NULL;
    o.precision = "fp32";
    o.gen = (fs_gen_params){.seed = 0, .batch = 1, .grid_h = 16, .grid_w = 16, .txt_len = 32, .steps = 4, .guidance = 3.5};
    o.tp = 0;
    o.ring = 1000000;
    assert_int_equal(fs_job_estimate_compute(&o, &est, &e), FS_E_INPUT);
    print_message("      %s\n", e.msg);
    assert_non_null(strstr(e.msg, "would hold no token"));
    o.ring = 256; /* every rank holds an image token (the text goes to the first 32): runs */
    assert_int_equal(fs_job_estimate_compute(&o, &est, &e), 0);
    fs_comm_finalize();
}

/* Bytes of every dataset of one group of a float64 dump */
static uint64_t group_bytes(const char *path, const char *group)
{
    fo_file *f;
    fs_err e = {0};
    if (fo_file_open(&f, path, &e)) fail_msg("%s", e.msg);
    fo_names names = {0};
    fo_order_source src;
    if (fo_group_order(f, group, &names, &src, &e)) fail_msg("%s: %s", group, e.msg);
    uint64_t bytes = 0;
    for (int i = 0; i < names.n; i++) {
        char ds_path[400];
        snprintf(ds_path, sizeof ds_path, "%s/%s", group, names.v[i]);
        fo_dataset ds = {0};
        if (fo_dataset_info(f, ds_path, &ds, &e)) fail_msg("%s", e.msg);
        uint64_t n = 1;
        for (int d = 0; d < ds.ndim; d++) n *= (uint64_t)ds.shape[d];
        bytes += n * 8;
        fo_dataset_free(&ds);
    }
    fo_names_free(&names);
    fo_file_close(f);
    return bytes;
}

/* A real float64 dump of flux-sim with `args` (one rank) */
static void make_dump(const char *dir, const char *name, const char *args, char *path, size_t n)
{
    snprintf(path, n, "%s/%s.h5", dir, name);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "build/flux-sim -q --precision fp64 --steps 2 %s --dump %s >%s/%s.log 2>&1 </dev/null", args,
             path, dir, name);
    if (system(cmd) != 0) fail_msg("%s failed (see %s/%s.log)", cmd, dir, name);
}

/* True CFG and the KV cache change what a step records: the estimate is exact against real dumps.
 * True CFG: the second call's modules (name@k) on the negative prompt's own length, both steps;
 * --cfg-batched records the same (the dump is the sequential run's). The KV cache: step 0 over
 * [reference; noise] with the reference's embedding; step 1 a plain step. */
static void test_option_dumps_exact(void **s)
{
    char dir[64], p[300];
    fs_test_tmpdir(dir, sizeof dir);
    const struct { const char *preset, *args; int cfg, neg, bat, ref; } cases[] = {
        {"odd", "--config odd --grid 4x6 --txt-len 8 --true-cfg-scale 4 --neg-txt-len 5", 1, 5, 0, 0},
        {"flux2-tiny", "--config flux2-tiny --grid 4x6 --txt-len 8 --true-cfg-scale 4 --neg-txt-len 5", 1, 5, 0, 0},
        {"odd", "--config odd --grid 4x6 --txt-len 8 --true-cfg-scale 4 --cfg-batched", 1, 8, 1, 0},
        {"flux2-tiny", "--config flux2-tiny --grid 4x6 --txt-len 8 --ref-grid 2x3", 0, 0, 0, 6},
    };
    for (size_t k = 0; k < FS_ARRAY_LEN(cases); k++) {
        char name[16];
        snprintf(name, sizeof name, "case%zu", k);
        make_dump(dir, name, cases[k].args, p, sizeof p);
        fs_config c;
        fs_config_preset(&c, cases[k].preset, NULL);
        fs_estimate_req r = req(&c, 8, 1, 24, 8, 2);
        r.true_cfg = cases[k].cfg;
        r.neg_txt_tokens = cases[k].neg;
        r.cfg_batched = cases[k].bat;
        r.records = 1;
        r.ref_tokens = cases[k].ref;
        fs_estimate est, plain;
        fs_err e = {0};
        assert_int_equal(fs_estimate_compute(&r, &est, &e), 0);
        const uint64_t s0 = group_bytes(p, "/step_0000"), s1 = group_bytes(p, "/step_0001");
        print_message("      %s: steps %" PRIu64 " + %" PRIu64 " bytes, estimate %" PRIu64 " per step\n", cases[k].args, s0,
                      s1, est.dump_step_bytes);
        if (est.dump_step_bytes != s0) fail_msg("%s: estimate %" PRIu64 ", step_0000 holds %" PRIu64, cases[k].args,
                                                est.dump_step_bytes, s0);
        if (cases[k].ref) { /* step 1: a plain step, and the whole run's steps as estimated */
            fs_estimate_req q = req(&c, 8, 1, 24, 8, 2);
            assert_int_equal(fs_estimate_compute(&q, &plain, &e), 0);
            assert_true(plain.dump_step_bytes == s1 && s0 > s1);
            assert_true(est.dump_bytes - plain.dump_bytes == s0 - s1 + 6 * 16 * 8 + 6 * 4 * 8); /* + image_latents, ids */
        } else assert_true(s1 == s0);
    }
}

/* The layouts of issue 20 and the KV cache, each against what it allocates (fs_estimate.c) */
static void test_layout_options(void **s)
{
    fs_config c, f2;
    fs_config_preset(&c, "default", NULL);
    fs_config_preset(&f2, "flux2-default", NULL);
    const uint64_t D = 256, L = 2 + 4; /* default and flux2-default: 8 heads x 32; 2 + 4 blocks */
    fs_estimate base, x, y;
    fs_err e = {0};
    /* --text replicated under Ulysses 2: every text token on the rank, the joint path's buffers;
     * the image tokens alone exchanged, the text's output heads all-gathered once per attention;
     * the dump (global tensors, one copy of the text) unchanged */
    fs_estimate_req r = req(&c, 4, 4, 1024, 512, 1);
    r.ulysses = 2;
    assert_int_equal(fs_estimate_compute(&r, &base, &e), 0);
    r.text_replicated = 1;
    assert_int_equal(fs_estimate_compute(&r, &x, &e), 0);
    assert_int_equal(x.tokens_rank, 512 + 512);
    assert_true(x.act_peak_bytes > base.act_peak_bytes && x.dump_step_bytes == base.dump_step_bytes);
    assert_true(x.text_gather.calls == L && x.text_gather.bytes == L * 4 * 512 * (D / 2) * 4);
    assert_true(x.alltoall.calls == base.alltoall.calls && x.alltoall.bytes < base.alltoall.bytes);
    /* one rank: replicated text is the plain layout */
    r.ulysses = 1;
    r.text_replicated = 0;
    assert_int_equal(fs_estimate_compute(&r, &base, &e), 0);
    r.text_replicated = 1;
    assert_int_equal(fs_estimate_compute(&r, &x, &e), 0);
    assert_true(x.rank_bytes == base.rank_bytes);
    /* --pad: Ulysses holds what it held (the padded blocks are within the counted exchange), even
     * on uneven tokens; ring pads its chunks and, uneven, copies them: more; even tokens: nothing */
    const int layouts[2][2] = {{2, 1}, {1, 2}};
    for (int l = 0; l < 2; l++)
        for (int pad = 1; pad <= 2; pad++) {
            for (int64_t img = 1023; img <= 1024; img++) {
                r = req(&c, 4, 4, img, 509 + (1024 - img), 1);
                r.ulysses = layouts[l][0];
                r.ring = layouts[l][1];
                assert_int_equal(fs_estimate_compute(&r, &base, &e), 0);
                r.pad = pad;
                assert_int_equal(fs_estimate_compute(&r, &x, &e), 0);
                const int even = img == 1024 && (509 + 1024 - img) % 2 == 0;
                if (l == 0 || even) assert_true(x.act_peak_bytes == base.act_peak_bytes);
                else assert_true(x.act_peak_bytes > base.act_peak_bytes);
                assert_true(x.dump_step_bytes == base.dump_step_bytes);
            }
        }
    /* true CFG in sequence: the same activations, the negative prompt's inputs and the first
     * call's velocity more, two calls' collectives (TP 2) */
    r = req(&c, 4, 4, 1024, 512, 1);
    r.tp = 2;
    r.full_weights = 0;
    assert_int_equal(fs_estimate_compute(&r, &base, &e), 0);
    r.true_cfg = 1;
    r.neg_txt_tokens = 512;
    assert_int_equal(fs_estimate_compute(&r, &x, &e), 0);
    assert_true(x.act_peak_bytes == base.act_peak_bytes);
    assert_true(x.input_bytes - base.input_bytes ==
                (4 * 512 * (uint64_t)c.joint_attention_dim + 4 * (uint64_t)c.pooled_projection_dim + 4 * 1024 * 64) * 4 +
                    512 * 3 * 8 + 8);
    assert_true(x.allreduce.calls == 2 * base.allreduce.calls && x.allreduce.bytes == 2 * base.allreduce.bytes);
    /* --cfg-parallel: one call per rank (the activations of a run without CFG), the velocities
     * exchanged once a step; the dump is the sequential run's; its records kept only when recording */
    r.cfg_parallel = 1;
    assert_int_equal(fs_estimate_compute(&r, &y, &e), 0);
    assert_true(y.act_peak_bytes == base.act_peak_bytes && y.allreduce.calls == base.allreduce.calls);
    assert_true(y.cfg_gather.calls == 1 && y.cfg_gather.bytes == 4 * 1024 * 64 * 4);
    assert_true(y.dump_step_bytes == x.dump_step_bytes && y.cfg_kept_bytes == 0);
    r.records = 1;
    assert_int_equal(fs_estimate_compute(&r, &y, &e), 0);
    assert_true(y.cfg_kept_bytes > 0 && y.rank_bytes > x.rank_bytes);
    /* --cfg-batched: the activations of one forward of batch 2B */
    r = req(&c, 4, 4, 1024, 512, 1);
    r.batch = 8;
    assert_int_equal(fs_estimate_compute(&r, &base, &e), 0);
    r.batch = 4;
    r.true_cfg = r.cfg_batched = 1;
    r.neg_txt_tokens = 512;
    assert_int_equal(fs_estimate_compute(&r, &x, &e), 0);
    assert_true(x.act_peak_bytes == base.act_peak_bytes && x.dump_step_bytes < base.dump_step_bytes + 1);
    /* the KV cache: every block's K and V of the reference, this rank's heads (TP 2: half) */
    for (int T = 1; T <= 2; T++) {
        r = req(&f2, 4, 2, 1024, 256, 2);
        r.tp = T;
        r.full_weights = T == 1;
        assert_int_equal(fs_estimate_compute(&r, &base, &e), 0);
        r.ref_tokens = 512;
        assert_int_equal(fs_estimate_compute(&r, &x, &e), 0);
        assert_true(x.kv_cache_bytes == 2 * L * 2 * 512 * (D / (uint64_t)T) * 4);
        assert_true(x.act_persistent_bytes > base.act_persistent_bytes + x.kv_cache_bytes);
        assert_true(x.act_peak_bytes > base.act_peak_bytes + x.kv_cache_bytes);
    }
    /* an in-job --check's reference is one rank's run: the layout options do not reach it */
    r = req(&c, 4, 1, 1024, 512, 1);
    r.ulysses = 2;
    r.check = r.check_in_job = 1;
    assert_int_equal(fs_estimate_compute(&r, &base, &e), 0);
    r.text_replicated = 1;
    r.pad = 1;
    assert_int_equal(fs_estimate_compute(&r, &x, &e), 0);
    assert_true(x.check_run_bytes == base.check_run_bytes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dump_step_exact),     cmocka_unit_test(test_weights_exact), cmocka_unit_test(test_weights_streamed_exact),
        cmocka_unit_test(test_monotone_and_layouts), cmocka_unit_test(test_saturates),
        cmocka_unit_test(test_invalid_request),     cmocka_unit_test(test_refusal_names_the_option),
        cmocka_unit_test(test_bytes_str),           cmocka_unit_test(test_mem_limit_rlimit),
        cmocka_unit_test(test_option_dumps_exact), cmocka_unit_test(test_layout_options),
        cmocka_unit_test(test_job_estimate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
