/* flux-sim — run the FLUX.1 transformer on the CPU across MPI ranks with the GPU paths' sharding,
 * dump every module's output (flux-dump v1), and --check a layout against the single-rank run.
 *
 * Exit codes, the same on every rank: 0 success (and --check agrees), 1 --check found a
 * divergence, 2 usage or input error (one line on stderr naming file, tensor and cause; no
 * output file left behind). */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "fs_check.h"
#include "fs_debug.h"
#include "fs_comm.h"
#include "fs_dump.h"
#include "fs_estimate.h"
#include "fs_gather.h"
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
            "  --grid HxW            image token grid (a 16H x 16W pixel image; H*W <= 4194304) [16x16]\n"
            "  --txt-len N           text tokens (<= 4194304) [32]\n"
            "  --batch N             batch size, 1 to 64 [1]\n"
            "  --steps N             denoising steps, 1 to 1000000 [4]\n"
            "  --guidance G          guidance scale, for configs with a guidance embedder; |G| <= 10000 [3.5]\n"
            "  --scheduler S         dev (dynamic shift) or schnell (static shift 1) [dev if the config\n"
            "                        has a guidance embedder, else schnell]\n"
            "\n"
            "Parallel layout (run under mpirun; tp x ulysses x ring = number of ranks):\n"
            "  --tp T                tensor parallel degree (Megatron-style, by the TP plan)\n"
            "  --ulysses U           Ulysses sequence parallel degree (all-to-all over heads)\n"
            "  --ring R              ring attention degree (K/V rotate, LSE merge)\n"
            "  --ring-rotate M       allgather (as diffusers) or p2p (Isend/Irecv overlapped) [allgather]\n"
            "                        [default layout: tp = ranks if the heads divide, else ring]\n"
            "  --plan FILE           tensor-parallel plan to run instead of the built-in one\n"
            "  --print-plan          print the built-in FLUX TP plan (a starting point for --plan) and exit\n"
            "  --check[=REF.h5]      compare every module output of this layout with a single-rank run of the\n"
            "                        same weights and inputs (computed in this job, or a saved single-rank\n"
            "                        dump); stop at the first divergence and say where and which ranks\n"
            "  --comm-stats          print, per rank, the calls and bytes of every collective of the sampling\n"
            "                        loop (the numbers docs/parallel.md's communication table predicts)\n"
            "  --inject NAME         re-create a known silent parallel bug (repeatable; --inject list)\n"
            "  --break-on-divergence with --check: the rank where the divergence shows raises SIGTRAP inside\n"
            "                        the layer that diverged (run under gdb; tools/flux-sim.gdb, docs/debugging.md)\n"
            "  --wait-for-debugger R rank R prints its pid and waits until a debugger attaches\n"
            "  --rtol X, --rtol-max X  --check tolerances (relative L2; max|d|/max|ref|) [by precision]\n"
            "\n"
            "Output:\n"
            "  --dump OUT.h5         write every module output of every step (flux-dump v1)\n"
            "  --dump-per-rank DIR   also write DIR/rank_<r>.h5 per rank: its local view (replicated tensors in\n"
            "                        full, shards as held) with the `parallel` attribute (rank, sharding), for\n"
            "                        flux-oracle consistency\n"
            "  --dump-compress L     shuffle+deflate level 0-9 for a single-rank dump [0: none; activations are\n"
            "                        noise-like: level 1 saves ~10-20%% of disk and writes several times slower]\n"
            "  --threads N           OpenBLAS and OpenMP threads per rank, 1 to 4096 [all cores for one rank,\n"
            "                        1 per rank when several ranks share the machine]\n"
            "  -q, --quiet           print nothing but errors\n"
            "  -h, --help            this help;  -V, --version\n"
            "\n"
            "Exit status (same on every rank): 0 success / --check agrees, 1 --check diverged, 2 error\n"
            "(usage, input, I/O; one line on stderr). A run that cannot fit this machine's memory is refused\n"
            "before it allocates, naming the option that made it too big.\n"
            "Docs: README.md, docs/dump-format.md.\n");
}

typedef struct opts {
    const char *config, *weights, *inputs, *dump, *dump_per_rank, *precision, *scheduler, *plan, *check_ref, *rotate;
    int tp, ulysses, ring, check, comm_stats, brk, wait_rank;
    fs_inject inject;
    double rtol, rtol_max;
    uint64_t weights_seed;
    fs_gen_params gen;
    int threads, quiet, compress;
    int gen_opt_given;
} opts;

/* Option values are parsed strictly: digits only (strtol/strtoull alone would accept leading
 * blanks, a sign that wraps, or a value out of range with errno = ERANGE saturated silently). */
static int parse_u64(const char *s, const char *opt, uint64_t *out, fs_err *e)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (!isdigit((unsigned char)s[0]) || *end)
        return fs_errf(e, FS_E_INPUT, "%s: '%s' is not a non-negative integer", opt, s);
    if (errno == ERANGE) return fs_errf(e, FS_E_INPUT, "%s: '%s' does not fit in 64 bits", opt, s);
    *out = v;
    return FS_OK;
}

/* An integer in [lo, hi]; `why` (may be NULL) says where the upper limit comes from. */
static int parse_int_in(const char *s, const char *opt, int lo, int hi, const char *why, int *out, fs_err *e)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!(isdigit((unsigned char)s[0]) || (s[0] == '-' && isdigit((unsigned char)s[1]))) || *end)
        return fs_errf(e, FS_E_INPUT, "%s: '%s' is not an integer", opt, s);
    if (errno == ERANGE || v < lo || v > hi)
        return fs_errf(e, FS_E_INPUT, "%s: %s is out of range: must be %d to %d%s%s", opt, s, lo, hi, why ? "; " : "",
                       why ? why : "");
    *out = (int)v;
    return FS_OK;
}

static int parse_int(const char *s, const char *opt, int lo, int *out, fs_err *e)
{
    return parse_int_in(s, opt, lo, 1000000, NULL, out, e);
}

/* --threads: the same fixed limit on every rank (a limit derived from this machine's CPUs could
 * differ between the nodes of one job). 4096 is above the hardware threads of any node flux-sim
 * targets and starts fine; 32768 makes libgomp fail thread creation (it exits 1, the divergence
 * code) and 10^6 overflows its stack. A limit on the user's processes is lower still. */
#define FS_MAX_THREADS 4096

static int parse_threads(const char *s, int *out, fs_err *e)
{
    int rc = parse_int_in(s, "--threads", 1, FS_MAX_THREADS, "more threads than any machine has cores only slow "
                                                             "the run down", out, e);
    struct rlimit rl;
    if (!rc && getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && geteuid() != 0 &&
        (rlim_t)*out >= rl.rlim_cur)
        rc = fs_errf(e, FS_E_INPUT, "--threads: %d threads exceed this user's process limit (ulimit -u %llu)", *out,
                     (unsigned long long)rl.rlim_cur);
    return rc;
}

/* --grid HxW: two positive integers and nothing else; the product is computed in 64 bits and
 * capped (FS_MAX_IMG_TOKENS) before anything is sized from it. */
static int parse_grid(const char *s, int *h, int *w, fs_err *e)
{
    const char *p = s;
    long long v[2];
    for (int i = 0; i < 2; i++) {
        if (!isdigit((unsigned char)*p)) goto bad;
        char *end;
        errno = 0;
        v[i] = strtoll(p, &end, 10);
        if (errno == ERANGE || v[i] < 1) goto bad;
        p = end;
        if (i == 0 && *p++ != 'x') goto bad;
    }
    if (*p) goto bad;
    if (v[0] > FS_MAX_IMG_TOKENS || v[1] > FS_MAX_IMG_TOKENS || v[0] * v[1] > FS_MAX_IMG_TOKENS)
        return fs_errf(e, FS_E_INPUT, "--grid %s: %.0f image tokens; flux-sim runs at most %d (2048x2048 tokens, a "
                                      "32768x32768-pixel image; FLUX.1 at 1024x1024 pixels is 64x64)",
                       s, (double)v[0] * (double)v[1], FS_MAX_IMG_TOKENS);
    *h = (int)v[0];
    *w = (int)v[1];
    return FS_OK;
bad:
    return fs_errf(e, FS_E_INPUT, "--grid: '%s' is not HxW with H, W >= 1 (e.g. 16x16)", s);
}

/* --guidance: diffusers scales it by 1000 and feeds it to a float32 sinusoid; beyond 1e4 the
 * argument (1e7) has no fractional bits left in float32 and the embedding is noise. FLUX.1-dev
 * uses 3.5. */
#define FS_MAX_GUIDANCE 1e4

static int parse_args(int argc, char **argv, opts *o, fs_err *e)
{
    enum { O_CONFIG = 256, O_WEIGHTS, O_WSEED, O_PREC, O_INPUTS, O_SEED, O_GRID, O_TXT, O_BATCH, O_STEPS, O_GUID,
           O_SCHED, O_DUMP, O_THREADS, O_COMPRESS, O_TP, O_ULY, O_RING, O_ROT, O_PLAN, O_PPLAN, O_CHECK, O_RTOL,
           O_RTOLMAX, O_DPR, O_CSTATS, O_INJECT, O_BREAK, O_WAIT };
    static const struct option lo[] = {
        {"config", required_argument, 0, O_CONFIG},   {"weights", required_argument, 0, O_WEIGHTS},
        {"weights-seed", required_argument, 0, O_WSEED}, {"precision", required_argument, 0, O_PREC},
        {"inputs", required_argument, 0, O_INPUTS},   {"seed", required_argument, 0, O_SEED},
        {"grid", required_argument, 0, O_GRID},       {"txt-len", required_argument, 0, O_TXT},
        {"batch", required_argument, 0, O_BATCH},     {"steps", required_argument, 0, O_STEPS},
        {"guidance", required_argument, 0, O_GUID},   {"scheduler", required_argument, 0, O_SCHED},
        {"dump", required_argument, 0, O_DUMP},       {"threads", required_argument, 0, O_THREADS},
        {"dump-compress", required_argument, 0, O_COMPRESS},
        {"tp", required_argument, 0, O_TP},           {"ulysses", required_argument, 0, O_ULY},
        {"ring", required_argument, 0, O_RING},       {"ring-rotate", required_argument, 0, O_ROT},
        {"plan", required_argument, 0, O_PLAN},       {"print-plan", no_argument, 0, O_PPLAN},
        {"check", optional_argument, 0, O_CHECK},     {"rtol", required_argument, 0, O_RTOL},
        {"rtol-max", required_argument, 0, O_RTOLMAX}, {"dump-per-rank", required_argument, 0, O_DPR},
        {"comm-stats", no_argument, 0, O_CSTATS},     {"inject", required_argument, 0, O_INJECT},
        {"break-on-divergence", no_argument, 0, O_BREAK}, {"wait-for-debugger", required_argument, 0, O_WAIT},
        {"quiet", no_argument, 0, 'q'},               {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},             {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->wait_rank = -1;
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
        case O_GRID: rc = parse_grid(optarg, &o->gen.grid_h, &o->gen.grid_w, e); o->gen_opt_given = 1; break;
        case O_TXT:
            rc = parse_int_in(optarg, "--txt-len", 1, FS_MAX_TXT_TOKENS, "T5 gives FLUX.1 at most 512", &o->gen.txt_len, e);
            o->gen_opt_given = 1;
            break;
        case O_BATCH:
            /* refused here, not at step 0 after the inputs and the dump file exist */
            rc = parse_int_in(optarg, "--batch", 1, FS_MAX_BATCH, "the model supports at most 64", &o->gen.batch, e);
            o->gen_opt_given = 1;
            break;
        case O_STEPS: rc = parse_int(optarg, "--steps", 1, &o->gen.steps, e); o->gen_opt_given = 1; break;
        case O_GUID: {
            char *end;
            o->gen.guidance = strtod(optarg, &end);
            if (!*optarg || isspace((unsigned char)*optarg) || *end || !isfinite(o->gen.guidance))
                rc = fs_errf(e, FS_E_INPUT, "--guidance: '%s' is not a number", optarg);
            else if (fabs(o->gen.guidance) > FS_MAX_GUIDANCE)
                rc = fs_errf(e, FS_E_INPUT, "--guidance: %s is not a plausible guidance scale (|g| <= %g; FLUX.1-dev "
                                            "uses 3.5)", optarg, FS_MAX_GUIDANCE);
            o->gen_opt_given = 1;
            break;
        }
        case O_SCHED: o->scheduler = optarg; o->gen_opt_given = 1; break;
        case O_DUMP: o->dump = optarg; break;
        case O_DPR: o->dump_per_rank = optarg; break;
        case O_CSTATS: o->comm_stats = 1; break;
        case O_BREAK: o->brk = 1; break;
        case O_WAIT: rc = parse_int(optarg, "--wait-for-debugger", 0, &o->wait_rank, e); break;
        case O_INJECT:
            if (!strcmp(optarg, "list")) {
                printf("Bugs --inject re-creates in the parallel code path (docs/bugs.md):\n%s", fs_inject_catalogue());
                return -1;
            }
            rc = fs_inject_add(&o->inject, optarg, e);
            break;
        case O_THREADS: rc = parse_threads(optarg, &o->threads, e); break;
        case O_COMPRESS:
            rc = parse_int(optarg, "--dump-compress", 0, &o->compress, e);
            if (!rc && o->compress > 9) rc = fs_errf(e, FS_E_INPUT, "--dump-compress: %d is not a level 0-9", o->compress);
            break;
        case O_TP: rc = parse_int(optarg, "--tp", 1, &o->tp, e); break;
        case O_ULY: rc = parse_int(optarg, "--ulysses", 1, &o->ulysses, e); break;
        case O_RING: rc = parse_int(optarg, "--ring", 1, &o->ring, e); break;
        case O_ROT:
            o->rotate = optarg;
            if (strcmp(optarg, "allgather") && strcmp(optarg, "p2p"))
                rc = fs_errf(e, FS_E_INPUT, "--ring-rotate: '%s' is not allgather or p2p", optarg);
            break;
        case O_PLAN: o->plan = optarg; break;
        case O_PPLAN: fputs(fs_plan_default_text(), stdout); return -1;
        case O_CHECK:
            o->check = 1;
            o->check_ref = optarg;
            if (optarg && !*optarg) rc = fs_errf(e, FS_E_INPUT, "--check=: empty reference path");
            break;
        case O_RTOL:
        case O_RTOLMAX: {
            char *end;
            double v = strtod(optarg, &end);
            if (!*optarg || *end || !(v > 0) || !isfinite(v))
                rc = fs_errf(e, FS_E_INPUT, "%s: '%s' is not a positive number", ch == O_RTOL ? "--rtol" : "--rtol-max",
                             optarg);
            if (ch == O_RTOL) o->rtol = v;
            else o->rtol_max = v;
            break;
        }
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
    if (o->brk && !o->check) return fs_errf(e, FS_E_INPUT, "--break-on-divergence needs --check");
    if (o->inputs && o->gen_opt_given)
        return fs_errf(e, FS_E_INPUT, "--inputs replays a dump's inputs, sigmas and timesteps; it cannot be combined "
                                      "with --seed/--grid/--txt-len/--batch/--steps/--guidance/--scheduler");
    return FS_OK;
}

/* ---- recording consumers: the dump (global layout), --check, or both ---- */

typedef struct sink {
    fs_dump *dump;        /* serial dump, or every rank's handle of the parallel (MPI-IO) dump */
    fs_dump *local;       /* --dump-per-rank: this rank's file */
    cJSON *local_sharding;
    fs_check *check;
    const fs_par *par;
    int gather;           /* parallel run: gather every tensor to rank 0 before dumping */
    cJSON *sharding;      /* name -> distribution, for the `parallel` attribute (first step) */
    int step;
} sink;

static int sink_begin(void *ctx, int step, double t, double sg, double sn, fs_err *e)
{
    sink *k = ctx;
    k->step = step;
    int rc = FS_OK;
    if (k->check) {
        fs_step_hooks h = fs_check_hooks(k->check);
        rc = h.begin_step(h.ctx, step, t, sg, sn, e);
    }
    if (!rc && k->dump) rc = fs_dump_begin_step(k->dump, step, t, sg, sn, e);
    if (!rc && k->local) rc = fs_dump_begin_step(k->local, step, t, sg, sn, e);
    return rc;
}

static int sink_end(void *ctx, int step, fs_err *e)
{
    sink *k = ctx;
    int rc = k->dump ? fs_dump_end_step(k->dump, e) : FS_OK;
    if (!rc && k->local) rc = fs_dump_end_step(k->local, e);
    return rc;
}

/* flux-dump `sharding` entry of one dataset from every rank's piece. */
static cJSON *sharding_json(const fs_piece *pieces, int world)
{
    const fs_piece *p0 = &pieces[0];
    if (p0->sh.ndims == 0) return cJSON_CreateString("replicated");
    cJSON *dims = cJSON_CreateArray();
    for (int k = 0; k < p0->sh.ndims; k++) {
        cJSON *o = cJSON_CreateObject(), *ranges = cJSON_CreateArray();
        cJSON_AddNumberToObject(o, "dim", p0->sh.d[k].dim);
        for (int r = 0; r < world; r++) {
            cJSON *rr = cJSON_CreateArray();
            const fs_shard_dim *d = &pieces[r].sh.d[k];
            for (int i = 0; i < d->n; i++) {
                double iv[2] = {(double)d->iv[i][0], (double)d->iv[i][1]};
                cJSON_AddItemToArray(rr, cJSON_CreateDoubleArray(iv, 2));
            }
            cJSON_AddItemToArray(ranges, rr);
        }
        cJSON_AddItemToObject(o, "ranges", ranges);
        cJSON_AddItemToArray(dims, o);
    }
    if (p0->sh.ndims == 1) {
        cJSON *one = cJSON_DetachItemFromArray(dims, 0);
        cJSON_Delete(dims);
        return one;
    }
    cJSON *o = cJSON_CreateObject(); /* split on two axes: the flux-dump extension key "dims" */
    cJSON_AddItemToObject(o, "dims", dims);
    return o;
}

static int sink_record(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e)
{
    sink *k = ctx;
    int rc = FS_OK;
    if (k->check) {
        fs_recorder r = fs_check_recorder(k->check);
        if ((rc = r.fn(r.ctx, name, t, sh, e))) return rc;
    }
    if (k->local) { /* this rank's view; at step 0 learn every rank's piece for the sharding map */
        if ((rc = fs_dump_record(k->local, name, t, e))) fs_comm_abort(2);
        if (k->step == 0 && !cJSON_GetObjectItemCaseSensitive(k->local_sharding, name)) {
            fs_piece *all = calloc((size_t)k->par->world, sizeof *all);
            if (!all) fs_comm_abort(FS_E_NOMEM);
            fs_pieces_allgather(k->par->g_world, t, sh, all);
            cJSON_AddItemToObject(k->local_sharding, name, sharding_json(all, k->par->world));
            free(all);
        }
    }
    if (!k->dump) return FS_OK;
    if (!k->gather) return fs_dump_record(k->dump, name, t, e);
    /* parallel HDF5: every rank learns every piece (descriptors only), so all agree on the
     * global shape and on who writes each duplicate, then each writes its own hyperslab */
    const int W = k->par->world, me = k->par->rank;
    fs_piece *all = calloc((size_t)W, sizeof *all);
    int64_t gshape[FS_MAX_DIMS];
    if (!all) fs_comm_abort(FS_E_NOMEM);
    fs_pieces_allgather(k->par->g_world, t, sh, all);
    if (fs_pieces_global_shape(all, W, gshape)) rc = fs_errf(e, FS_E_INTERNAL, "%s: ranks hold incompatible pieces", name);
    if (!rc) rc = fs_dump_record_piece(k->dump, name, t, sh, gshape, fs_pieces_first_holder(all, W, me) == me, e);
    if (!rc && k->step == 0 && !cJSON_GetObjectItemCaseSensitive(k->sharding, name))
        cJSON_AddItemToObject(k->sharding, name, sharding_json(all, W));
    free(all);
    /* a failed write on one rank must stop every rank at the same record */
    if (fs_allreduce_max_int(k->par->g_world, rc) && !rc) rc = fs_errf(e, FS_E_IO, "another rank failed writing the dump");
    return rc;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The flux-dump `parallel` attribute: world, mesh, optional rank (-1: a global dump), extras,
 * and the sharding map (consumed). */
static char *parallel_json(const fs_par *par, int rank, const char *plan_source, cJSON *sharding)
{
    cJSON *pj = cJSON_CreateObject(), *mesh = cJSON_CreateObject();
    cJSON_AddNumberToObject(pj, "world", par->world);
    if (rank >= 0) cJSON_AddNumberToObject(pj, "rank", rank);
    cJSON_AddNumberToObject(mesh, "tp", par->tp);
    cJSON_AddNumberToObject(mesh, "ulysses", par->ulysses);
    cJSON_AddNumberToObject(mesh, "ring", par->ring);
    cJSON_AddItemToObject(pj, "mesh", mesh);
    cJSON_AddStringToObject(pj, "ring_rotate", par->rotate == FS_RING_P2P ? "p2p" : "allgather");
    cJSON_AddStringToObject(pj, "tp_plan", plan_source);
    cJSON_AddItemToObject(pj, "sharding", sharding);
    char *js = cJSON_PrintUnformatted(pj);
    cJSON_Delete(pj);
    return js;
}

/* All ranks agree on an error: the worst code wins; rank 0 reports it (its own message, or a
 * note that another rank failed). */
static int agree(const fs_group *w, int rc, fs_err *e)
{
    /* main prints rank 0's message; a rank that failed alone (rank 0 fine) says why itself */
    int r0 = rc;
    fs_bcast(w, 0, &r0, sizeof r0);
    if (rc && !r0) fprintf(stderr, "flux-sim: error on rank %d: %s\n", w->rank, e->msg);
    int all = fs_allreduce_max_int(w, rc);
    if (all && !rc) fs_errf(e, all, "another rank failed (its message is above)");
    return all;
}

static int load_config(const char *name, fs_config *c, fs_err *e)
{
    return (strchr(name, '/') || strstr(name, ".json")) ? fs_config_from_file(c, name, e) : fs_config_preset(c, name, e);
}

static int run(const opts *o, fs_err *e)
{
    const fs_group *world = fs_comm_world();
    const int root = world->rank == 0, quiet = o->quiet || !root;
    fs_dtype dt = strcmp(o->precision, "fp64") ? FS_F32 : FS_F64;
    fs_config cfg;
    fs_inputs in = {0};
    fs_weights w = {0};
    fs_dump *dump = NULL, *local = NULL;
    fs_tensor lat = {0};
    fs_plan plan = {0};
    fs_par par = {0};
    fs_check *check = NULL;
    sink sk = {0};
    int rc = FS_OK;
    memset(&cfg, 0, sizeof cfg);

    /* 1. rank 0 produces or loads the config and inputs, and broadcasts them (the GPU scripts'
     *    setup: one source of truth, received into buffers every rank allocated itself) */
    if (root) {
        if (o->inputs) {
            if (!(rc = fs_dump_read_inputs(o->inputs, dt, &cfg, &in, e)) && o->config) {
                fs_config want;
                if (!(rc = load_config(o->config, &want, e)) && memcmp(&want, &cfg, sizeof cfg))
                    rc = fs_errf(e, FS_E_INPUT, "--config %s differs from the config stored in %s", o->config, o->inputs);
            }
        } else if (!(rc = load_config(o->config ? o->config : "default", &cfg, e))) {
            fs_gen_params g = o->gen;
            rc = fs_sched_preset(&g.sched, o->scheduler ? o->scheduler : (cfg.guidance_embeds ? "dev" : "schnell"), e);
            if (!rc) rc = fs_inputs_generate(&in, &cfg, dt, &g, e);
        }
    }
    if ((rc = agree(world, rc, e))) goto out;
    fs_bcast(world, 0, &cfg, sizeof cfg);
    if ((rc = fs_inputs_broadcast(world, 0, &in, &cfg, dt, &o->inject, e))) goto out;

    /* 2. layout and plan */
    int tp = o->tp, uly = o->ulysses, ring = o->ring;
    if (!tp && !uly && !ring) fs_par_default_layout(&cfg, world->size, &tp, &uly, &ring);
    tp = tp ? tp : 1;
    uly = uly ? uly : 1;
    ring = ring ? ring : 1;
    rc = o->plan ? fs_plan_load(&plan, o->plan, e) : fs_plan_parse(&plan, fs_plan_default_text(), "built-in plan", e);
    /* --inject proj-out-contiguous: the wrong slice itself — packed_rowwise proj_out cut as
     * contiguous columns, for the weights and for the Linear alike (seed 000 TP-1) */
    if (!rc && fs_injected(&o->inject, FS_INJ_PROJ_OUT_CONTIGUOUS))
        for (int i = 0; i < plan.n; i++)
            if (plan.rules[i].style == FS_TP_PACKED_ROWWISE) plan.rules[i].style = FS_TP_ROWWISE;
    if (!rc)
        rc = fs_par_init(&par, world, &cfg, tp, uly, ring,
                         o->rotate && !strcmp(o->rotate, "p2p") ? FS_RING_P2P : FS_RING_ALLGATHER, &plan, e);
    par.inject = o->inject.mask ? &o->inject : NULL; /* before the partition: seq-uneven-chunk */
    if (!rc) rc = fs_par_set_seq(&par, in.S_txt, in.S_img, e);
    if ((rc = agree(world, rc, e))) goto out;
    /* ranks sharing the cores: one thread each unless told otherwise */
    fs_backend_cpu_set_threads(o->threads ? o->threads : (world->size > 1 ? 1 : 0));

    /* 3. weights: each rank holds only its TP shard of the plan-split Linears (synthetic: only
     *    those elements are generated; checkpoints: mmap'd, colwise shards stay views). Rank 0
     *    keeps full weights when it runs the in-job single-rank reference of --check. */
    double t0 = now();
    const int full = tp == 1 || (root && o->check && !o->check_ref) ||
                     fs_injected(&o->inject, FS_INJ_FUSED_QKV_CONTIGUOUS); /* it cuts the full q|k|v */
    if (o->weights) {
        rc = fs_weights_load(&w, &cfg, dt, o->weights, e);
        if (!rc && !full) rc = fs_weights_shard(&w, &plan, tp, par.tp_rank, e);
    } else {
        rc = full ? fs_weights_synthetic(&w, &cfg, dt, o->weights_seed, e)
                  : fs_weights_synthetic_shard(&w, &cfg, dt, o->weights_seed, &plan, tp, par.tp_rank, e);
    }
    if ((rc = agree(world, rc, e))) goto out;
    double t_load = now() - t0;

    /* 4. the dump is created before any compute: serial, or parallel HDF5 over all ranks (the
     *    global layout, each rank writing its hyperslabs; attributes identical on every rank) */
    char wdesc[600];
    if (o->weights) snprintf(wdesc, sizeof wdesc, "%s", o->weights);
    else snprintf(wdesc, sizeof wdesc, "synthetic seed %llu", (unsigned long long)o->weights_seed);
    if (o->dump) {
        char producer[256];
        snprintf(producer, sizeof producer, "flux-sim %s (cpu-openblas, %s)", FLUX_SIM_VERSION, fs_dtype_name(dt));
        rc = world->size > 1 ? fs_dump_create_parallel(&dump, o->dump, world, &cfg, dt, producer, e)
                             : fs_dump_create(&dump, o->dump, &cfg, dt, producer, e);
        if (!rc && !(rc = fs_dump_set_deflate(dump, o->compress, e)) && !(rc = fs_dump_write_inputs(dump, &in, e)))
            rc = fs_dump_set_attr_string(dump, "weights", wdesc, e);
    }
    if (!rc && o->dump_per_rank) {
        char path[1024], producer[256];
        if (mkdir(o->dump_per_rank, 0777) && errno != EEXIST)
            rc = fs_errf(e, FS_E_IO, "%s: cannot create directory: %s", o->dump_per_rank, strerror(errno));
        snprintf(path, sizeof path, "%s/rank_%d.h5", o->dump_per_rank, world->rank);
        snprintf(producer, sizeof producer, "flux-sim %s (cpu-openblas, %s), rank %d local view", FLUX_SIM_VERSION,
                 fs_dtype_name(dt), world->rank);
        if (!rc && !(rc = fs_dump_create(&local, path, &cfg, dt, producer, e)) &&
            !(rc = fs_dump_set_deflate(local, o->compress, e)) && !(rc = fs_dump_write_inputs(local, &in, e)))
            rc = fs_dump_set_attr_string(local, "weights", w.source, e);
    }
    if (o->check) {
        fs_check_tol tol = fs_check_default_tol(dt);
        if (o->rtol > 0) tol.rtol = o->rtol;
        if (o->rtol_max > 0) tol.mtol = o->rtol_max;
        if (!rc) rc = fs_check_create(&check, &par, dt, tol, o->check_ref, e);
        if (!rc) fs_check_set_break(check, o->brk);
    }
    if ((rc = agree(world, rc, e))) goto out;

    char lay[128];
    fs_par_describe(&par, lay, sizeof lay);
    if (!quiet)
        printf("flux-sim %s: %d double + %d single blocks, %d heads x %d, %s; weights: %s (%.2f s)\n"
               "  inputs: %s; batch %d, %d image + %d text tokens, %d steps\n"
               "  layout: %d rank%s, %s%s%s\n",
               FLUX_SIM_VERSION, cfg.num_layers, cfg.num_single_layers, cfg.num_attention_heads, cfg.attention_head_dim,
               fs_dtype_name(dt), w.source, t_load, o->inputs ? o->inputs : "generated", in.B, in.S_img, in.S_txt,
               in.n_steps, world->size, world->size > 1 ? "s" : "", lay, tp > 1 ? "; TP plan: " : "",
               tp > 1 ? plan.source : "");

    /* 5. --check: rank 0 first records the single-rank reference of the same weights/inputs */
    if (check && !o->check_ref && root) {
        fs_model ref = {.cfg = cfg, .dtype = dt, .w = &w, .be = fs_backend_cpu(), .rec = fs_check_ref_recorder(check)};
        fs_step_hooks h = fs_check_ref_hooks(check);
        fs_tensor rl = {0};
        t0 = now();
        rc = fs_sample(&ref, &in, &h, &rl, e);
        fs_tensor_free(&rl);
        if (!rc && !quiet) printf("  single-rank reference: %.3f s\n", now() - t0);
    }
    if ((rc = agree(world, rc, e))) goto out;

    /* 6. the run in this layout */
    fs_model m = {.cfg = cfg, .dtype = dt, .w = &w, .be = fs_backend_cpu(), .par = &par};
    /* decided from the options, which every rank has — `dump` exists on rank 0 only, and a
     * collective that one rank skips is a hang */
    const int recording = o->dump || o->dump_per_rank || check;
    sk = (sink){.dump = dump, .local = local, .check = check, .par = &par, .gather = world->size > 1,
                .sharding = cJSON_CreateObject(), .local_sharding = cJSON_CreateObject()};
    if (recording) m.rec = (fs_recorder){.fn = sink_record, .ctx = &sk};
    fs_step_hooks hooks = {.begin_step = sink_begin, .end_step = sink_end, .ctx = &sk};
    t0 = now();
    fs_comm_stats_reset();
    rc = fs_sample(&m, &in, &hooks, &lat, e);
    double t_run = now() - t0;
    if (o->comm_stats && (rc == FS_OK || rc == FS_DIVERGED)) {
        fs_comm_stats cs;
        fs_comm_stats_get(&cs);
        char line[512];
        size_t n = (size_t)snprintf(line, sizeof line, "comm-stats rank %d:", world->rank);
        for (int k = 0; k < FS_COMM_NKINDS; k++)
            n += (size_t)snprintf(line + n, sizeof line - n, " %s %lld/%lld", fs_comm_kind_name((fs_comm_kind)k),
                                  (long long)cs.calls[k], (long long)cs.bytes[k]);
        printf("%s (calls/bytes sent)\n", line);
        fflush(stdout);
    }
    if (rc == FS_DIVERGED) goto out; /* every rank got the same verdict from the same record */
    /* an error inside the forward (not a divergence) may have hit one rank only, in the middle of
     * a collective sequence: agreeing would hang, so the failing rank ends the job */
    if (rc && world->size > 1) {
        fprintf(stderr, "flux-sim: error on rank %d: %s\n", world->rank, e->msg);
        fs_comm_abort(2);
    }
    if (rc) goto out;
    if (local) {
        char *js = parallel_json(&par, world->rank, plan.source, sk.local_sharding);
        sk.local_sharding = NULL;
        rc = fs_dump_set_attr_string(local, "parallel", js, e);
        free(js);
        if (!rc) rc = fs_dump_write_final(local, &lat, e);
        if (!rc) rc = fs_dump_close(local, e);
        local = NULL;
    }
    if (dump) {
        if (world->size > 1) {
            char *js = parallel_json(&par, -1, plan.source, sk.sharding);
            sk.sharding = NULL;
            rc = fs_dump_set_attr_string(dump, "parallel", js, e);
            free(js);
        }
        if (!rc) rc = fs_dump_write_final(dump, &lat, e);
        if (!rc) rc = fs_dump_close(dump, e);
        dump = NULL;
    }
    if (!rc && fs_injected(&o->inject, FS_INJ_NAN_RANK) && !fs_allreduce_max_int(world, fs_inject_nan_fired))
        rc = fs_errf(e, FS_E_INPUT, "--inject nan-rank:%d:%s:%d never fired: no rank %d, no module '%s' recorded, or no "
                                    "step %d in this run (module paths as in a dump's `order`)",
                     o->inject.nan_rank, o->inject.nan_module, o->inject.nan_step, o->inject.nan_rank,
                     o->inject.nan_module, o->inject.nan_step);
    if ((rc = agree(world, rc, e))) goto out;
    if (!quiet) {
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
    if (check && root && (rc == FS_OK || rc == FS_DIVERGED)) fputs(fs_check_report(check), rc ? stderr : stdout);
    if (check && rc == FS_OK && fs_check_diverged(check)) rc = FS_DIVERGED;
    fs_dump_abort(dump);
    fs_dump_abort(local);
    cJSON_Delete(sk.sharding);
    cJSON_Delete(sk.local_sharding);
    fs_check_free(check);
    fs_tensor_free(&lat);
    fs_weights_free(&w);
    fs_inputs_free(&in);
    fs_par_free(&par);
    fs_plan_free(&plan);
    return rc;
}

int main(int argc, char **argv)
{
    opts o;
    fs_err e = {0};
    int rc = fs_comm_init(&argc, &argv, &e);
    if (rc) {
        fprintf(stderr, "flux-sim: error: %s\n", e.msg);
        return 2;
    }
    const int root = fs_comm_world()->rank == 0;
    rc = parse_args(argc, argv, &o, &e);
    if (!rc && o.wait_rank == fs_comm_world()->rank) fs_debug_wait_for_debugger(o.wait_rank);
    if (rc < 0) { /* --help / --version / --print-plan */
        fs_comm_finalize();
        return 0;
    }
    if (!rc) rc = run(&o, &e);
    if (rc && rc != FS_DIVERGED && root) fprintf(stderr, "flux-sim: error: %s\n", e.msg);
    fs_comm_finalize();
    return rc == FS_OK ? 0 : rc == FS_DIVERGED ? 1 : 2;
}
