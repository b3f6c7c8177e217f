/* make-checkpoint — write flux-sim's synthetic weights as a real FLUX.1 checkpoint.
 *
 * A separate program rather than a flux-sim mode: it needs no MPI, no model and no inputs, and
 * it is the one tool here that writes tens of GB, so it has its own progress, interrupt and
 * disk-space handling (fs_ckpt.c) without adding a code path to the simulator's CLI.
 *
 * Exit status: 0 written (--verify: identical); 1 --verify found differing tensors; 2 any error
 * (one line on stderr, nothing left at OUT). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fs_ckpt.h"
#include "fs_pipeline.h"
#include "fs_rng.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: make-checkpoint [options] OUT\n"
            "\n"
            "Writes the synthetic weights flux-sim generates (--weights-seed N; the exact values of\n"
            "fs_weights_synthetic, rounded to the file dtype) as a real FLUX.1 or FLUX.2 checkpoint. Streams\n"
            "tensor by tensor; OUT is built under OUT.tmp-XXXXXX and renamed when complete; OUT must not\n"
            "exist.\n"
            "\n"
            "  --config NAME|FILE|DIR  preset (default, tiny, odd, flux-dev, flux-schnell, flux2-dev,\n"
            "                          flux2-klein-4b, flux2-klein-9b, flux2-default, flux2-tiny), a\n"
            "                          config.json, or a folder holding one [default]\n"
            "  --weights-seed N        seed of the synthetic weights [0]\n"
            "  --layout L              diffusers: OUT is a transformer/ folder (config.json, sharded\n"
            "                                     diffusion_pytorch_model-*.safetensors, index.json)\n"
            "                          pipeline:  OUT is a pipeline folder (model_index.json,\n"
            "                                     scheduler/scheduler_config.json, transformer/)\n"
            "                          bfl:       OUT is one .safetensors file with BFL names\n"
            "                                     (flux1-dev / flux2-dev.safetensors layout) [diffusers]\n"
            "  --dtype D               bf16, f16 or f32 [bf16, as the released checkpoints]\n"
            "  --max-shard-size S      shard size limit, Hugging Face style: 10GB (= 10^10 bytes), 5GiB,\n"
            "                          500MB, or bytes [10GB, what FLUX.1-dev's 3 shards were cut with]\n"
            "  --bfl-prefix            bfl layout: prefix names with model.diffusion_model.\n"
            "  --verify                read OUT back instead of writing it: every tensor's bytes against\n"
            "                          the synthetic weights of --config/--weights-seed/--dtype (any layout);\n"
            "                          exit 0 identical, 1 different (the first tensor named), 2 error\n"
            "  -q, --quiet             no progress on stderr\n"
            "  -h, --help\n"
            "\n"
            "FLUX.1-dev (11.9 B parameters) in BF16 is 23.8 GB, FLUX.2-dev (32.2 B) 64.4 GB; see docs/scale.md.\n");
}

static volatile sig_atomic_t interrupted = 0;
static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct prog {
    int quiet;
    double t0, last;
    int last_pct;
    const char *banner; /* printed before the first progress line, or with "wrote": a run that
                           fails before either prints its error line alone */
} prog;

static void print_banner(prog *p)
{
    if (p->banner && !p->quiet) fputs(p->banner, stderr);
    p->banner = NULL;
}

/* A line per 5 % (or every 10 s) on stderr; cancels on SIGINT/SIGTERM. */
static int progress(void *ctx, uint64_t done, uint64_t total)
{
    prog *p = ctx;
    if (interrupted) return 1;
    if (p->quiet || !total) return 0;
    const double t = now();
    const int pct = (int)(100.0 * (double)done / (double)total);
    if (t - p->t0 < 2) return 0; /* small checkpoints: no progress lines */
    if (pct / 5 > p->last_pct / 5 || t - p->last > 10 || done == total) {
        print_banner(p);
        const double rate = done / (t - p->t0 + 1e-9);
        fprintf(stderr, "make-checkpoint: %6.2f / %.2f GB (%3d%%), %.2f GB/s, %.0f s elapsed, ~%.0f s left\n", done / 1e9,
                total / 1e9, pct, rate / 1e9, t - p->t0, (double)(total - done) / (rate + 1));
        p->last_pct = pct;
        p->last = t;
    }
    return 0;
}

/* "10GB" = 10^10, "5GiB" = 5 * 2^30, "500MB", "1.5GB", "123": Hugging Face's max_shard_size
 * spelling, strictly: digits, an optional fraction, a unit; no sign, space, hex or exponent
 * (probe T18: " 10GB" and "0x10" were accepted through strtod). */
static int parse_size(const char *s, uint64_t *out)
{
    const char *p = s;
    if (*p < '0' || *p > '9') return -1;
    while (*p >= '0' && *p <= '9') p++;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9') return -1;
        while (*p >= '0' && *p <= '9') p++;
    }
    if (p - s > 30) return -1;
    char num[32];
    memcpy(num, s, (size_t)(p - s));
    num[p - s] = 0;
    const double v = strtod(num, NULL);
    static const struct { const char *u; double m; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"KiB", 1024.0},
        {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (!strcmp(p, units[i].u)) {
            const double b = floor(v * units[i].m);
            if (!(b >= 1) || b > 1.8e19) return -1;
            *out = (uint64_t)b;
            return 0;
        }
    return -1;
}

/* A decimal integer of digits only that fits 64 bits (probe T18: " -1" was 2^64-1 through strtoull) */
static int parse_u64(const char *s, uint64_t *out)
{
    if (!*s) return -1;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    enum { O_CONFIG = 256, O_SEED, O_LAYOUT, O_DTYPE, O_SHARD, O_PREFIX, O_VERIFY };
    static const struct option lo[] = {{"config", required_argument, 0, O_CONFIG},
                                       {"weights-seed", required_argument, 0, O_SEED},
                                       {"layout", required_argument, 0, O_LAYOUT},
                                       {"dtype", required_argument, 0, O_DTYPE},
                                       {"max-shard-size", required_argument, 0, O_SHARD},
                                       {"bfl-prefix", no_argument, 0, O_PREFIX},
                                       {"verify", no_argument, 0, O_VERIFY},
                                       {"quiet", no_argument, 0, 'q'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    const char *config = "default";
    fs_ckpt_spec s = {.kind = FS_CKPT_DIFFUSERS, .dtype = FS_ST_BF16, .max_shard_bytes = 10000000000ULL, .bfl_prefix = ""};
    prog pg = {0};
    fs_err e = {0};
    int ch, rc = 0, verify = 0;
    char pb[160];
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "qh", lo, NULL)) != -1 && !rc) {
        switch (ch) {
        case O_CONFIG: config = optarg; break;
        case O_SEED:
            if (parse_u64(optarg, &s.seed))
                rc = fs_errf(&e, FS_E_INPUT, "--weights-seed: '%s' is not a decimal integer from 0 to 2^64-1",
                             fs_printable(optarg, pb, sizeof pb, 100));
            break;
        case O_LAYOUT:
            if (!strcmp(optarg, "diffusers")) s.kind = FS_CKPT_DIFFUSERS;
            else if (!strcmp(optarg, "pipeline")) s.kind = FS_CKPT_PIPELINE;
            else if (!strcmp(optarg, "bfl")) s.kind = FS_CKPT_BFL;
            else rc = fs_errf(&e, FS_E_INPUT, "--layout: '%s' is not diffusers, pipeline or bfl", fs_printable(optarg, pb, sizeof pb, 100));
            break;
        case O_DTYPE:
            if (!strcmp(optarg, "bf16")) s.dtype = FS_ST_BF16;
            else if (!strcmp(optarg, "f16")) s.dtype = FS_ST_F16;
            else if (!strcmp(optarg, "f32")) s.dtype = FS_ST_F32;
            else rc = fs_errf(&e, FS_E_INPUT, "--dtype: '%s' is not bf16, f16 or f32", fs_printable(optarg, pb, sizeof pb, 100));
            break;
        case O_SHARD:
            if (parse_size(optarg, &s.max_shard_bytes))
                rc = fs_errf(&e, FS_E_INPUT, "--max-shard-size: '%s' is not a size like 10GB, 5GiB, 500MB or a byte count",
                             fs_printable(optarg, pb, sizeof pb, 100));
            break;
        case O_PREFIX: s.bfl_prefix = "model.diffusion_model."; break;
        case O_VERIFY: verify = 1; break;
        case 'q': pg.quiet = 1; break;
        case 'h': usage(stdout); return 0;
        default:
            rc = fs_errf(&e, FS_E_INPUT, "unknown or incomplete option '%s' (see make-checkpoint --help)",
                         fs_printable(argv[optind - 1], pb, sizeof pb, 100));
        }
    }
    if (!rc && optind + 1 != argc)
        rc = fs_errf(&e, FS_E_INPUT, optind >= argc ? "no output path given (see make-checkpoint --help)"
                                                    : "exactly one output path expected (see make-checkpoint --help)");
    if (!rc && *s.bfl_prefix && s.kind != FS_CKPT_BFL) rc = fs_errf(&e, FS_E_INPUT, "--bfl-prefix needs --layout bfl");
    if (!rc) rc = fs_pipeline_load_config(&s.cfg, config, &e);
    if (rc) {
        fprintf(stderr, "make-checkpoint: error: %s\n", e.msg);
        return 2;
    }
    const char *out = argv[optind];
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    s.progress = progress;
    s.progress_ctx = &pg;
    pg.t0 = pg.last = now();
    pg.last_pct = -5;
    uint64_t bytes = 0;
    if (verify) {
        int differing = 0;
        if ((rc = fs_ckpt_verify(&s, out, &differing, &e)) || differing) {
            fprintf(stderr, "make-checkpoint: %s: %s\n", rc ? "error" : "verify", e.msg);
            return rc ? 2 : 1;
        }
        if (!pg.quiet)
            fprintf(stderr, "make-checkpoint: %s holds exactly the synthetic weights (seed %llu, %s); checked in %.1f s\n", out,
                    (unsigned long long)s.seed, fs_st_dtype_name(s.dtype), now() - pg.t0);
        return 0;
    }
    /* the checks first, so that an error is the only line (probe T18: the banner came first) */
    if ((rc = fs_ckpt_check_out(&s, out, &e))) {
        fprintf(stderr, "make-checkpoint: error: %s\n", e.msg);
        return 2;
    }
    char banner[1024];
    snprintf(banner, sizeof banner, "make-checkpoint: %s, %d double + %d single blocks, seed %llu, %s, %s layout (RNG kernel: %s)\n",
             fs_printable(out, pb, sizeof pb, 120), s.cfg.num_layers, s.cfg.num_single_layers, (unsigned long long)s.seed,
             fs_st_dtype_name(s.dtype), s.kind == FS_CKPT_BFL ? "BFL" : s.kind == FS_CKPT_PIPELINE ? "pipeline" : "diffusers",
             fs_rng_isa());
    pg.banner = banner;
    if ((rc = fs_ckpt_write(&s, out, &bytes, &e))) {
        fprintf(stderr, "make-checkpoint: error: %s\n", e.msg);
        return 2;
    }
    print_banner(&pg);
    if (!pg.quiet)
        fprintf(stderr, "make-checkpoint: wrote %s: %.3f GB of tensor data in %.1f s\n", out, bytes / 1e9, now() - pg.t0);
    return 0;
}
