/* flux-sim — run the FLUX.1 transformer on the CPU, dump every module's output (flux-dump v1).
 *
 * Exit codes: 0 success, 2 usage or input error (one line on stderr naming file, tensor and
 * cause; no output file left behind). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fs_dump.h"
#include "fs_model.h"
#include "fs_sampler.h"

#define FLUX_SIM_VERSION "0.1.0"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: flux-sim [options]\n"
            "\n"
            "Runs the FLUX.1 transformer (diffusers FluxTransformer2DModel) and its Euler sampling loop on\n"
            "the CPU, and optionally dumps every module's output to a flux-dump v1 HDF5 file.\n"
            "\n"
            "Model:\n"
            "  --config NAME|FILE    preset (default, flux-dev, flux-schnell, tiny, odd) or a diffusers\n"
            "                        config.json [default: default, a small FLUX-shaped model]\n"
            "  --weights PATH        safetensors: a file, a *.safetensors.index.json, or a directory\n"
            "                        (diffusers or BFL names, F32/BF16/F16) [default: synthetic weights]\n"
            "  --weights-seed N      seed of the synthetic weights [0]\n"
            "  --precision P         fp32 or fp64 [fp32]\n"
            "\n"
            "Inputs:\n"
            "  --inputs DUMP.h5      replay the config, inputs, sigmas and timesteps of a flux-dump (e.g. one\n"
            "                        written by PyTorch on a GPU); excludes the generator options below\n"
            "  --seed N              seed of the generated noise / text embeddings [0]\n"
            "  --grid HxW            image token grid (a 16H x 16W pixel image) [16x16]\n"
            "  --txt-len N           text tokens [32]\n"
            "  --batch N             batch size [1]\n"
            "  --steps N             denoising steps [4]\n"
            "  --guidance G          guidance scale, for configs with a guidance embedder [3.5]\n"
            "  --scheduler S         dev (dynamic shift) or schnell (static shift 1) [dev if the config\n"
            "                        has a guidance embedder, else schnell]\n"
            "\n"
            "Output:\n"
            "  --dump OUT.h5         write every module output of every step (flux-dump v1)\n"
            "  --dump-compress L     shuffle+deflate level 0-9 for the dump [0: none; 1 saves ~20%% of disk\n"
            "                        and writes ~7x slower]\n"
            "  --threads N           OpenBLAS threads [OpenBLAS default]\n"
            "  -q, --quiet           print nothing but errors\n"
            "  -h, --help            this help;  -V, --version\n"
            "\n"
            "Exit status: 0 success, 2 usage or input error.\n"
            "Docs: README.md, docs/dump-format.md.\n");
}

typedef struct opts {
    const char *config, *weights, *inputs, *dump, *precision, *scheduler;
    uint64_t weights_seed;
    fs_gen_params gen;
    int threads, quiet, compress;
    int gen_opt_given;
} opts;

static int parse_u64(const char *s, const char *opt, uint64_t *out, fs_err *e)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (!*s || *end || s[0] == '-') return fs_errf(e, FS_E_INPUT, "%s: '%s' is not a non-negative integer", opt, s);
    *out = v;
    return FS_OK;
}

static int parse_int(const char *s, const char *opt, int lo, int *out, fs_err *e)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > 1000000)
        return fs_errf(e, FS_E_INPUT, "%s: '%s' is not an integer >= %d", opt, s, lo);
    *out = (int)v;
    return FS_OK;
}

static int parse_args(int argc, char **argv, opts *o, fs_err *e)
{
    enum { O_CONFIG = 256, O_WEIGHTS, O_WSEED, O_PREC, O_INPUTS, O_SEED, O_GRID, O_TXT, O_BATCH, O_STEPS, O_GUID,
           O_SCHED, O_DUMP, O_THREADS, O_COMPRESS };
    static const struct option lo[] = {
        {"config", required_argument, 0, O_CONFIG},   {"weights", required_argument, 0, O_WEIGHTS},
        {"weights-seed", required_argument, 0, O_WSEED}, {"precision", required_argument, 0, O_PREC},
        {"inputs", required_argument, 0, O_INPUTS},   {"seed", required_argument, 0, O_SEED},
        {"grid", required_argument, 0, O_GRID},       {"txt-len", required_argument, 0, O_TXT},
        {"batch", required_argument, 0, O_BATCH},     {"steps", required_argument, 0, O_STEPS},
        {"guidance", required_argument, 0, O_GUID},   {"scheduler", required_argument, 0, O_SCHED},
        {"dump", required_argument, 0, O_DUMP},       {"threads", required_argument, 0, O_THREADS},
        {"dump-compress", required_argument, 0, O_COMPRESS},
        {"quiet", no_argument, 0, 'q'},               {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},             {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->config = NULL;
    o->precision = "fp32";
    o->gen = (fs_gen_params){.seed = 0, .batch = 1, .grid_h = 16, .grid_w = 16, .txt_len = 32, .steps = 4,
                             .guidance = 3.5};
    opterr = 0;
    int ch, rc = FS_OK;
    while ((ch = getopt_long(argc, argv, "qhV", lo, NULL)) != -1 && !rc) {
        switch (ch) {
        case O_CONFIG: o->config = optarg; break;
        case O_WEIGHTS: o->weights = optarg; break;
        case O_WSEED: rc = parse_u64(optarg, "--weights-seed", &o->weights_seed, e); break;
        case O_PREC: o->precision = optarg; break;
        case O_INPUTS: o->inputs = optarg; break;
        case O_SEED: rc = parse_u64(optarg, "--seed", &o->gen.seed, e); o->gen_opt_given = 1; break;
        case O_GRID:
            if (sscanf(optarg, "%dx%d", &o->gen.grid_h, &o->gen.grid_w) != 2 || o->gen.grid_h < 1 || o->gen.grid_w < 1)
                rc = fs_errf(e, FS_E_INPUT, "--grid: '%s' is not HxW with H, W >= 1 (e.g. 16x16)", optarg);
            o->gen_opt_given = 1;
            break;
        case O_TXT: rc = parse_int(optarg, "--txt-len", 1, &o->gen.txt_len, e); o->gen_opt_given = 1; break;
        case O_BATCH: rc = parse_int(optarg, "--batch", 1, &o->gen.batch, e); o->gen_opt_given = 1; break;
        case O_STEPS: rc = parse_int(optarg, "--steps", 1, &o->gen.steps, e); o->gen_opt_given = 1; break;
        case O_GUID: {
            char *end;
            o->gen.guidance = strtod(optarg, &end);
            if (!*optarg || *end || !isfinite(o->gen.guidance))
                rc = fs_errf(e, FS_E_INPUT, "--guidance: '%s' is not a number", optarg);
            o->gen_opt_given = 1;
            break;
        }
        case O_SCHED: o->scheduler = optarg; o->gen_opt_given = 1; break;
        case O_DUMP: o->dump = optarg; break;
        case O_THREADS: rc = parse_int(optarg, "--threads", 1, &o->threads, e); break;
        case O_COMPRESS:
            rc = parse_int(optarg, "--dump-compress", 0, &o->compress, e);
            if (!rc && o->compress > 9) rc = fs_errf(e, FS_E_INPUT, "--dump-compress: %d is not a level 0-9", o->compress);
            break;
        case 'q': o->quiet = 1; break;
        case 'h': usage(stdout); return -1;
        case 'V': printf("flux-sim %s\n", FLUX_SIM_VERSION); return -1;
        default:
            return fs_errf(e, FS_E_INPUT, "unknown or incomplete option '%s' (see flux-sim --help)", argv[optind - 1]);
        }
    }
    if (rc) return rc;
    if (optind < argc) return fs_errf(e, FS_E_INPUT, "unexpected argument '%s' (see flux-sim --help)", argv[optind]);
    if (strcmp(o->precision, "fp32") && strcmp(o->precision, "fp64"))
        return fs_errf(e, FS_E_INPUT, "--precision: '%s' is not fp32 or fp64", o->precision);
    if (o->inputs && o->gen_opt_given)
        return fs_errf(e, FS_E_INPUT, "--inputs replays a dump's inputs, sigmas and timesteps; it cannot be combined "
                                      "with --seed/--grid/--txt-len/--batch/--steps/--guidance/--scheduler");
    return FS_OK;
}

/* Glue between the sampler's step hooks and the dump writer. */
static int dump_begin(void *ctx, int step, double t, double s, double sn, fs_err *e)
{
    return fs_dump_begin_step(ctx, step, t, s, sn, e);
}
static int dump_end(void *ctx, int step, fs_err *e) { return fs_dump_end_step(ctx, e); }

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int run(const opts *o, fs_err *e)
{
    fs_dtype dt = strcmp(o->precision, "fp64") ? FS_F32 : FS_F64;
    fs_config cfg;
    fs_inputs in = {0};
    fs_weights w = {0};
    fs_dump *dump = NULL;
    fs_tensor lat = {0};
    int rc;

    /* 1. config and inputs */
    if (o->inputs) {
        if ((rc = fs_dump_read_inputs(o->inputs, dt, &cfg, &in, e))) goto out;
        if (o->config) {
            fs_config want;
            if ((rc = (strchr(o->config, '/') || strstr(o->config, ".json")) ? fs_config_from_file(&want, o->config, e)
                                                                               : fs_config_preset(&want, o->config, e)))
                goto out;
            if (memcmp(&want, &cfg, sizeof cfg)) {
                rc = fs_errf(e, FS_E_INPUT, "--config %s differs from the config stored in %s", o->config, o->inputs);
                goto out;
            }
        }
    } else {
        const char *cn = o->config ? o->config : "default";
        if ((rc = (strchr(cn, '/') || strstr(cn, ".json")) ? fs_config_from_file(&cfg, cn, e)
                                                          : fs_config_preset(&cfg, cn, e)))
            goto out;
        fs_gen_params g = o->gen;
        if ((rc = fs_sched_preset(&g.sched, o->scheduler ? o->scheduler : (cfg.guidance_embeds ? "dev" : "schnell"),
                                  e)))
            goto out;
        if ((rc = fs_inputs_generate(&in, &cfg, dt, &g, e))) goto out;
    }

    /* 2. the dump is created before any compute, so a bad path fails in milliseconds */
    if (o->dump) {
        char producer[256];
        snprintf(producer, sizeof producer, "flux-sim %s (cpu-openblas, %s)", FLUX_SIM_VERSION, fs_dtype_name(dt));
        if ((rc = fs_dump_create(&dump, o->dump, &cfg, dt, producer, e))) goto out;
        if ((rc = fs_dump_set_deflate(dump, o->compress, e))) goto out;
        if ((rc = fs_dump_write_inputs(dump, &in, e))) goto out;
    }

    /* 3. weights */
    double t0 = now();
    rc = o->weights ? fs_weights_load(&w, &cfg, dt, o->weights, e) : fs_weights_synthetic(&w, &cfg, dt, o->weights_seed, e);
    if (rc) goto out;
    if (dump && (rc = fs_dump_set_attr_string(dump, "weights", w.source, e))) goto out;
    double t_load = now() - t0;

    if (!o->quiet)
        printf("flux-sim %s: %d double + %d single blocks, %d heads x %d, %s; weights: %s (%.2f s)\n"
               "  inputs: %s; batch %d, %d image + %d text tokens, %d steps\n",
               FLUX_SIM_VERSION, cfg.num_layers, cfg.num_single_layers, cfg.num_attention_heads,
               cfg.attention_head_dim, fs_dtype_name(dt), w.source, t_load, o->inputs ? o->inputs : "generated", in.B,
               in.S_img, in.S_txt, in.n_steps);

    /* 4. sample */
    fs_model m = {.cfg = cfg, .dtype = dt, .w = &w, .be = fs_backend_cpu()};
    fs_backend_cpu_set_threads(o->threads);
    if (dump) m.rec = fs_dump_recorder(dump);
    fs_step_hooks hooks = {.begin_step = dump_begin, .end_step = dump_end, .ctx = dump};
    t0 = now();
    if ((rc = fs_sample(&m, &in, dump ? &hooks : NULL, &lat, e))) goto out;
    double t_run = now() - t0;
    if (dump) {
        if ((rc = fs_dump_write_final(dump, &lat, e))) goto out;
        rc = fs_dump_close(dump, e);
        dump = NULL;
        if (rc) goto out;
    }
    if (!o->quiet) {
        double s = 0, s2 = 0;
        int64_t n = fs_tensor_numel(&lat), bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double v = fs_tensor_get(&lat, i);
            if (!isfinite(v)) bad++;
            s += v;
            s2 += v * v;
        }
        printf("  sampled in %.3f s (%.3f s/step); final latents mean %.6g std %.6g, %lld non-finite\n", t_run,
               t_run / in.n_steps, s / n, sqrt(s2 / n - (s / n) * (s / n)), (long long)bad);
        if (o->dump) printf("  dump: %s\n", o->dump);
    }
out:
    fs_dump_abort(dump);
    fs_tensor_free(&lat);
    fs_weights_free(&w);
    fs_inputs_free(&in);
    return rc;
}

int main(int argc, char **argv)
{
    opts o;
    fs_err e = {0};
    int rc = parse_args(argc, argv, &o, &e);
    if (rc < 0) return 0; /* --help / --version */
    if (!rc) rc = run(&o, &e);
    if (rc) {
        fprintf(stderr, "flux-sim: error: %s\n", e.msg);
        return 2;
    }
    return 0;
}
