/* flux-sim — run the FLUX.1 transformer on the CPU across MPI ranks with the GPU paths' sharding,
 * dump every module's output (flux-dump v1), and --check a layout against the single-rank run.
 *
 * Exit codes, the same on every rank: 0 success (and --check agrees), 1 --check found a
 * divergence, 2 usage or input error (one line on stderr naming file, tensor and cause; no
 * output file left behind). */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <getopt.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "fs_job.h"
#include "fs_pipeline.h"
#include "fs_sink.h"
#include "fs_debug.h"
#include "fs_cleanup.h"

#define FLUX_SIM_VERSION FS_VERSION

static void usage(FILE *f)
{
    fprintf(f,
            "usage: flux-sim [options]\n"
            "\n"
            "Runs the FLUX.1 or FLUX.2 transformer (diffusers FluxTransformer2DModel, Flux2Transformer2DModel)\n"
            "and its Euler sampling loop on the CPU, and optionally dumps every module's output to a\n"
            "flux-dump v1 HDF5 file.\n"
            "\n"
            "Model:\n"
            "  --config NAME|FILE    preset (default, flux-dev, flux-schnell, tiny, odd; FLUX.2: flux2-dev,\n"
            "                        flux2-klein-4b, flux2-klein-9b, flux2-default, flux2-tiny) or a diffusers\n"
            "                        config.json (its _class_name picks the family) [default: default, a\n"
            "                        small FLUX-shaped model]\n"
            "  --weights PATH        safetensors: a file, a *.safetensors.index.json, or a directory\n"
            "                        (diffusers or BFL names, F32/BF16/F16) [default: synthetic weights]\n"
            "  --weights-seed N      seed of the synthetic weights [0]\n"
            "  --precision P         fp32, fp64, or bf16 (bfloat16 storage, float32 compute, rounded where\n"
            "                        PyTorch's GPU kernels round: docs/bf16.md) [$FLUX_SIM_PRECISION, else fp32]\n"
            "  --match bf16          with fp32/fp64: solve the problem a bf16 run solves (weights and inputs\n"
            "                        rounded to bf16, timestep and guidance embedded as bf16 rounds them) at\n"
            "                        this precision: the reference a bf16 run is judged against\n"
            "  --stream M            on: hold only the block being computed (its parameters made from the\n"
            "                        checkpoint or generator before it, freed after; bit-identical, memory of\n"
            "                        one block instead of all); off: hold every parameter; auto: on when a\n"
            "                        rank's block parameters exceed 2 GiB [auto]; --no-stream = --stream off\n"
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
            "  --true-cfg-scale S    true classifier-free guidance (FluxPipeline's true_cfg_scale, FLUX.2\n"
            "                        klein base's guidance_scale; S > 1): each step also runs the negative\n"
            "                        prompt, v = v_neg + S (v - v_neg); its modules recorded as name@k [off]\n"
            "  --neg-txt-len N       tokens of the negative prompt [--txt-len]\n"
            "  --ref-grid HxW[,...]  FLUX.2: reference images (at most 8) of HxW tokens each through the\n"
            "                        KV cache (Flux2KleinKVPipeline: step 0 kv_cache_mode extract on\n"
            "                        [references; noise], later steps cached); one rank, --tp or\n"
            "                        --ulysses [none]\n"
            "  --scheduler S         dev (dynamic shift) or schnell (static shift 1) [dev if the config\n"
            "                        has a guidance embedder, else schnell]\n"
            "\n"
            "Parallel layout (run under mpirun; tp x ulysses x ring = number of ranks):\n"
            "  --tp T                tensor parallel degree (Megatron-style, by the TP plan)\n"
            "  --ulysses U           Ulysses sequence parallel degree (all-to-all over heads)\n"
            "  --ring R              ring attention degree (K/V rotate, LSE merge)\n"
            "  --ring-rotate M       allgather (as diffusers) or p2p (Isend/Irecv overlapped) [allgather]\n"
            "                        [default layout: tp = ranks if the heads divide, else ring]\n"
            "  --cfg-parallel        with true CFG: the prompt's and the negative prompt's transformer calls on\n"
            "                        two rank groups (sglang's, xDiT's CFG parallel), noise predictions\n"
            "                        all-gathered; tp x ulysses x ring = ranks / 2 inside each group\n"
            "  --cfg-batched         with true CFG on one rank: both calls as one forward of batch 2B, as\n"
            "                        diffusers' classic CFG batches them (every GEMM twice the rows)\n"
            "  --text P              under --ulysses/--ring: sharded (split like the image tokens, as\n"
            "                        diffusers) or replicated (every rank holds all text tokens, only the image\n"
            "                        tokens are split, as xDiT / sglang / vllm-omni) [sharded]\n"
            "  --mesh-order M        the two sequence-parallel axes: ulysses-inner (a Ulysses group is\n"
            "                        consecutive ranks; yunchang's use_ulysses_low, xDiT/sglang's default)\n"
            "                        or ring-inner (a ring group is) [ulysses-inner]\n"
            "  --pad P               under --ulysses/--ring: pad the sequence to a multiple of the degree\n"
            "                        (torch.chunk shards, zero pad tokens in every exchange) with the pad\n"
            "                        keys masked (mask: exact) or not (nomask: vllm-omni's default; --check\n"
            "                        then measures the error per module instead of judging it)\n"
            "                        [none: uneven shards exact, nothing padded]\n"
            "  --joint J             with --text replicated: the ring step the text K/V join the keys at, front\n"
            "                        (first step, in front) or rear (last step, behind), as xDiT's\n"
            "                        joint_strategy [front]\n"
            "  --allreduce-order O   bf16 runs: the order TP partials are summed in, one bf16 rounding per\n"
            "                        addition: rank, reverse, or ring (NCCL's per-chunk order) [rank]\n"
            "  --plan FILE           tensor-parallel plan to run instead of the built-in one\n"
            "  --print-plan          print the built-in TP plan (a starting point for --plan) and exit; after\n"
            "                        --config of a FLUX.2 model, FLUX.2's (diffusers' Flux2 _tp_plan)\n"
            "  --check[=REF.h5]      compare every module output of this layout with a single-rank run of the\n"
            "                        same weights and inputs (computed in this job, or a saved single-rank\n"
            "                        dump); stop at the first divergence and say where and which ranks\n"
            "  --comm-stats          print, per rank, the calls and bytes of every collective of the sampling\n"
            "                        loop (the numbers docs/parallel.md's communication table predicts)\n"
            "  --inject NAME         re-create a known silent parallel bug (repeatable; --inject list)\n"
            "  --break-on-divergence with --check: the rank where the divergence shows raises SIGTRAP inside\n"
            "                        the layer that diverged (run under gdb; tools/debug/flux-sim.gdb, docs/debugging.md)\n"
            "  --wait-for-debugger R rank R prints its pid and waits until a debugger attaches\n"
            "  --rtol X, --rtol-max X  --check tolerances (relative L2; max|d|/max|ref|) [by precision]\n"
            "\n"
            "Output:\n"
            "  --dump OUT.h5         write every module output of every step (flux-dump v1)\n"
            "  --dump-modules G[,G]  record only the modules whose names match one of these globs (fnmatch:\n"
            "                        'single_transformer_blocks.37.*,proj_out'; each step keeps latents_in and\n"
            "                        latents_out) — in the dumps and in --check, on both sides [all]\n"
            "  --dump-steps LIST     record only these steps: 0,2-3 [all]\n"
            "  --dump-per-rank DIR   also write DIR/rank_<r>.h5 per rank: its local view (replicated tensors in\n"
            "                        full, shards as held) with the `parallel` attribute (rank, sharding), for\n"
            "                        flux-oracle consistency\n"
            "  --dump-compress L     shuffle+deflate level 0-9 for a single-rank dump [0: none; activations are\n"
            "                        noise-like: level 1 saves ~10-20%% of disk and writes several times slower]\n"
            "  --threads N           OpenBLAS and OpenMP threads per rank, 1 to 4096 [all cores for one rank,\n"
            "                        1 per rank in a job of several ranks]\n"
            "  --backend B           where activations live and ops run: cpu; cpu-strict (a test tool: memory\n"
            "                        the host cannot dereference, collectives staged as on a GPU); cuda, hip\n"
            "                        in a make GPU=cuda|hip build (docs/gpu.md) [$FLUX_SIM_BACKEND, else cpu]\n"
            "  --lse-layout L        the LSE layout the attention kernel hands back: bhs ([B,H,S], CUDA flash)\n"
            "                        or bsh ([B,S,H], ROCm flash); the ring merge converts [the backend's own]\n"
            "  --estimate            compute nothing: print per rank the weights, activations, dump volume,\n"
            "                        FLOPs and collective bytes per step of the run the other options describe,\n"
            "                        here and on a GPU holding every weight, and whether it fits (docs/scale.md)\n"
            "  --device-mem SIZE     with --estimate: a GPU's memory (80G, 24GiB, 16GB) to judge the GPU column\n"
            "  --clean PATH          run nothing: remove the temporaries (PATH.tmp.<pid>.<host>) a killed run\n"
            "                        left for the dump PATH, or in the --dump-per-rank directory PATH, whose\n"
            "                        process is gone from this host (repeatable; a run writing PATH does it too)\n"
            "  -q, --quiet           print nothing but errors\n"
            "  -h, --help            this help;  -V, --version\n"
            "\n"
            "Exit status (same on every rank): 0 success / --check agrees, 1 --check diverged, 2 error\n"
            "(usage, input, I/O; one line on stderr). A run that cannot fit this machine's memory is refused\n"
            "before it allocates, naming the option that made it too big.\n"
            "Docs: README.md, docs/dump-format.md.\n");
}

/* The options are the job's (sim/run/fs_job.h): the CLI parses and prints, the library runs. */
typedef fs_job_opts opts;

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

/* --device-mem 80G: a decimal number (digits, optionally a point and more digits: no sign,
 * exponent, hex or blanks) with a unit; G, GiB = 2^30 (what nvidia-smi and torch report),
 * GB = 10^9 (datasheets), likewise M/MiB/MB and T/TiB/TB. At least 1 byte (0 means "not given")
 * and below 10^18. */
static int parse_size(const char *s, const char *opt, uint64_t *out, fs_err *e)
{
    static const struct { const char *u; double f; } units[] = {
        {"G", 1073741824.0}, {"GiB", 1073741824.0}, {"GB", 1e9}, {"M", 1048576.0}, {"MiB", 1048576.0},
        {"MB", 1e6}, {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12}};
    char shown[96];
    const char *p = s;
    while (isdigit((unsigned char)*p)) p++;
    const char *int_end = p;
    if (*p == '.') {
        p++;
        const char *frac = p;
        while (isdigit((unsigned char)*p)) p++;
        if (p == frac) p = s; /* "1." : not a decimal number */
    }
    if (int_end != s && p != s && strlen(s) < 64) {
        char num[64];
        snprintf(num, sizeof num, "%.*s", (int)(p - s), s);
        const double v = strtod(num, NULL);
        for (size_t i = 0; i < sizeof units / sizeof *units; i++)
            if (!strcmp(p, units[i].u)) {
                const double bytes = v * units[i].f;
                if (bytes < 1)
                    return fs_errf(e, FS_E_INPUT, "%s: '%s' is less than one byte: a device's memory is a positive size",
                                   opt, fs_printable(s, shown, sizeof shown, 64));
                if (bytes >= 1e18)
                    return fs_errf(e, FS_E_INPUT, "%s: '%s' is not a plausible device memory (at most 10^18 bytes)", opt,
                                   fs_printable(s, shown, sizeof shown, 64));
                *out = (uint64_t)bytes;
                return FS_OK;
            }
    }
    return fs_errf(e, FS_E_INPUT, "%s: '%s' is not a size such as 80G, 24GiB, 16GB or 512M (decimal digits and a unit)",
                   opt, fs_printable(s, shown, sizeof shown, 64));
}

/* --grid HxW: two positive integers and nothing else; the product is computed in 64 bits and
 * capped (FS_MAX_IMG_TOKENS) before anything is sized from it. */
static int parse_grid(const char *opt, const char *s, int *h, int *w, fs_err *e)
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
        return fs_errf(e, FS_E_INPUT, "%s %s: %.0f image tokens; flux-sim runs at most %d (2048x2048 tokens, a "
                                      "32768x32768-pixel image; FLUX.1 at 1024x1024 pixels is 64x64)",
                       opt, s, (double)v[0] * (double)v[1], FS_MAX_IMG_TOKENS);
    *h = (int)v[0];
    *w = (int)v[1];
    return FS_OK;
bad:
    return fs_errf(e, FS_E_INPUT, "%s: '%s' is not HxW with H, W >= 1 (e.g. 16x16)", opt, s);
}

/* --ref-grid HxW[,HxW...]: one grid per reference image, in the order the pipeline gets them */
static int parse_ref_grids(const char *s, fs_gen_params *g, fs_err *e)
{
    char buf[256];
    if (strlen(s) >= sizeof buf) return fs_errf(e, FS_E_INPUT, "--ref-grid: '%.40s...' is too long", s);
    strcpy(buf, s);
    int n = 0;
    int64_t R = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == FS_MAX_REF_IMAGES)
            return fs_errf(e, FS_E_INPUT, "--ref-grid %s: more than %d reference images (a replayed dump may hold any "
                                          "number)", s, FS_MAX_REF_IMAGES);
        int rc = parse_grid("--ref-grid", tok, &g->ref_h[n], &g->ref_w[n], e);
        if (rc) return rc;
        R += (int64_t)g->ref_h[n] * g->ref_w[n];
        n++;
    }
    /* "2x2," or ",2x2" or "2x2,,1x1" would lose a grid silently in strtok: refused */
    if (!n || s[0] == ',' || s[strlen(s) - 1] == ',' || strstr(s, ",,"))
        return fs_errf(e, FS_E_INPUT, "--ref-grid: '%s' is not HxW[,HxW...] with H, W >= 1 (e.g. 16x16,8x12)", s);
    if (R > FS_MAX_IMG_TOKENS)
        return fs_errf(e, FS_E_INPUT, "--ref-grid %s: %lld reference tokens; flux-sim runs at most %d", s, (long long)R,
                       FS_MAX_IMG_TOKENS);
    g->n_ref = n;
    return FS_OK;
}

/* --clean PATH... (main runs it instead of a job) */
#define MAX_CLEAN 64
static const char *clean_paths[MAX_CLEAN];
static int n_clean;

/* --guidance: diffusers scales it by 1000 and feeds it to a float32 sinusoid; beyond 1e4 the
 * argument (1e7) has no fractional bits left in float32 and the embedding is noise. FLUX.1-dev
 * uses 3.5. */
#define FS_MAX_GUIDANCE 1e4

static int parse_args(int argc, char **argv, opts *o, fs_err *e)
{
    enum { O_CONFIG = 256, O_WEIGHTS, O_WSEED, O_PREC, O_INPUTS, O_SEED, O_GRID, O_TXT, O_BATCH, O_STEPS, O_GUID,
           O_SCHED, O_DUMP, O_THREADS, O_COMPRESS, O_TP, O_ULY, O_RING, O_ROT, O_PLAN, O_PPLAN, O_CHECK, O_RTOL,
           O_RTOLMAX, O_DPR, O_CSTATS, O_INJECT, O_BREAK, O_WAIT, O_BACKEND, O_LSE, O_MATCH, O_AR_ORDER, O_STREAM, O_NO_STREAM, O_DUMP_MODULES, O_DUMP_STEPS,
           O_ESTIMATE, O_DEVMEM, O_CLEAN, O_TRUECFG, O_NEGTXT, O_CFGPAR, O_CFGBAT, O_TEXT, O_JOINT, O_MESH, O_PAD,
           O_REFGRID };
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
        {"backend", required_argument, 0, O_BACKEND}, {"lse-layout", required_argument, 0, O_LSE},
        {"match", required_argument, 0, O_MATCH},     {"allreduce-order", required_argument, 0, O_AR_ORDER},
        {"stream", required_argument, 0, O_STREAM},   {"no-stream", no_argument, 0, O_NO_STREAM},
        {"dump-modules", required_argument, 0, O_DUMP_MODULES}, {"dump-steps", required_argument, 0, O_DUMP_STEPS},
        {"estimate", no_argument, 0, O_ESTIMATE},     {"device-mem", required_argument, 0, O_DEVMEM},
        {"clean", required_argument, 0, O_CLEAN},
        {"true-cfg-scale", required_argument, 0, O_TRUECFG}, {"neg-txt-len", required_argument, 0, O_NEGTXT},
        {"cfg-parallel", no_argument, 0, O_CFGPAR},   {"cfg-batched", no_argument, 0, O_CFGBAT},
        {"text", required_argument, 0, O_TEXT},       {"joint", required_argument, 0, O_JOINT},
        {"mesh-order", required_argument, 0, O_MESH}, {"pad", required_argument, 0, O_PAD},
        {"ref-grid", required_argument, 0, O_REFGRID},
        {"quiet", no_argument, 0, 'q'},               {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},             {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->wait_rank = -1;
    o->config = NULL;
    o->precision = getenv("FLUX_SIM_PRECISION") && *getenv("FLUX_SIM_PRECISION") ? getenv("FLUX_SIM_PRECISION") : "fp32";
    /* the environment sets the default backend, so a whole test suite or CI job can run on
     * another backend without touching its command lines (FLUX_SIM_BACKEND=cpu-strict make test) */
    o->backend = getenv("FLUX_SIM_BACKEND") && *getenv("FLUX_SIM_BACKEND") ? getenv("FLUX_SIM_BACKEND") : "cpu";
    o->stream = "auto";
    o->gen = (fs_gen_params){.seed = 0, .batch = 1, .grid_h = 16, .grid_w = 16, .txt_len = 32, .steps = 4,
                             .guidance = 3.5};
    opterr = 0;
    int ch, rc = FS_OK;
    while ((ch = getopt_long(argc, argv, "qhV", lo, NULL)) != -1 && !rc) {
        switch (ch) {
        case O_CONFIG: o->config = optarg; break;
        case O_WEIGHTS: o->weights = optarg; break;
        case O_WSEED: rc = parse_u64(optarg, "--weights-seed", &o->weights_seed, e); break;
        case O_PREC: o->precision = optarg; o->precision_given = 1; break;
        case O_MATCH:
            o->match = optarg;
            if (strcmp(optarg, "bf16")) rc = fs_errf(e, FS_E_INPUT, "--match: '%s' is not bf16 (the only run matched today)", optarg);
            break;
        case O_AR_ORDER:
            o->ar_order = optarg;
            if (strcmp(optarg, "rank") && strcmp(optarg, "reverse") && strcmp(optarg, "ring"))
                rc = fs_errf(e, FS_E_INPUT, "--allreduce-order: '%s' is not rank, reverse or ring", optarg);
            break;
        case O_STREAM:
            o->stream = optarg;
            if (strcmp(optarg, "auto") && strcmp(optarg, "on") && strcmp(optarg, "off"))
                rc = fs_errf(e, FS_E_INPUT, "--stream: '%s' is not auto, on or off", optarg);
            break;
        case O_NO_STREAM: o->stream = "off"; break;
        case O_DUMP_MODULES: o->dump_modules = optarg; break;
        case O_DUMP_STEPS: o->dump_steps = optarg; break;
        case O_INPUTS: o->inputs = optarg; break;
        case O_SEED: rc = parse_u64(optarg, "--seed", &o->gen.seed, e); o->gen_opt_given = 1; break;
        case O_GRID: rc = parse_grid("--grid", optarg, &o->gen.grid_h, &o->gen.grid_w, e); o->gen_opt_given = 1; break;
        case O_REFGRID:
            rc = parse_ref_grids(optarg, &o->gen, e);
            o->gen_opt_given = 1;
            break;
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
        case O_TRUECFG: { /* FluxPipeline's true_cfg_scale / Flux2KleinPipeline's guidance_scale: > 1 */
            char *end;
            o->gen.true_cfg_scale = strtod(optarg, &end);
            if (!*optarg || isspace((unsigned char)*optarg) || *end || !isfinite(o->gen.true_cfg_scale))
                rc = fs_errf(e, FS_E_INPUT, "--true-cfg-scale: '%s' is not a number", optarg);
            else if (!(o->gen.true_cfg_scale > 1 && o->gen.true_cfg_scale <= FS_MAX_GUIDANCE))
                rc = fs_errf(e, FS_E_INPUT, "--true-cfg-scale: %s: the pipelines run true CFG for a scale > 1 (and "
                                            "<= %g); 4.0 is klein base's default", optarg, FS_MAX_GUIDANCE);
            o->gen_opt_given = 1;
            break;
        }
        case O_NEGTXT:
            rc = parse_int_in(optarg, "--neg-txt-len", 1, FS_MAX_TXT_TOKENS, "as --txt-len", &o->gen.neg_txt_len, e);
            o->gen_opt_given = 1;
            break;
        case O_DUMP: o->dump = optarg; break;
        case O_DPR: o->dump_per_rank = optarg; break;
        case O_CSTATS: o->comm_stats = 1; break;
        case O_BREAK: o->brk = 1; break;
        case O_WAIT: rc = parse_int(optarg, "--wait-for-debugger", 0, &o->wait_rank, e); break;
        case O_BACKEND: o->backend = optarg; break;
        case O_LSE:
            o->lse_layout = optarg;
            if (strcmp(optarg, "bhs") && strcmp(optarg, "bsh"))
                rc = fs_errf(e, FS_E_INPUT, "--lse-layout: '%s' is not bhs or bsh", optarg);
            break;
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
        case O_TEXT:
            o->text = optarg;
            if (strcmp(optarg, "sharded") && strcmp(optarg, "replicated"))
                rc = fs_errf(e, FS_E_INPUT, "--text: '%s' is not sharded or replicated", optarg);
            break;
        case O_PAD:
            o->pad = optarg;
            if (strcmp(optarg, "mask") && strcmp(optarg, "nomask"))
                rc = fs_errf(e, FS_E_INPUT, "--pad: '%s' is not mask or nomask", optarg);
            break;
        case O_MESH:
            o->mesh_order = optarg;
            if (strcmp(optarg, "ulysses-inner") && strcmp(optarg, "ring-inner"))
                rc = fs_errf(e, FS_E_INPUT, "--mesh-order: '%s' is not ulysses-inner or ring-inner", optarg);
            break;
        case O_JOINT:
            o->joint = optarg;
            if (strcmp(optarg, "front") && strcmp(optarg, "rear"))
                rc = fs_errf(e, FS_E_INPUT, "--joint: '%s' is not front or rear", optarg);
            break;
        case O_PLAN: o->plan = optarg; break;
        case O_PPLAN: { /* the plan of --config's family, when --config came first and is a preset or
                           file we can read; FLUX.1's otherwise */
            fs_config pc;
            fs_err pe = {0};
            const int f2 = o->config && !fs_pipeline_load_config(&pc, o->config, &pe) && pc.family == FS_FLUX2;
            fputs(f2 ? fs_plan_default_text_for(&pc) : fs_plan_default_text(), stdout);
            return -1;
        }
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
        case O_ESTIMATE: o->estimate = 1; break;
        case O_CFGPAR: o->cfg_parallel = 1; break;
        case O_CFGBAT: o->cfg_batched = 1; break;
        case O_DEVMEM: rc = parse_size(optarg, "--device-mem", &o->device_mem, e); break;
        case O_CLEAN:
            if (!*optarg) rc = fs_errf(e, FS_E_INPUT, "--clean: empty path");
            else if (n_clean == MAX_CLEAN) rc = fs_errf(e, FS_E_INPUT, "--clean: more than %d paths", MAX_CLEAN);
            else clean_paths[n_clean++] = optarg;
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
    if (strcmp(o->precision, "fp32") && strcmp(o->precision, "fp64") && strcmp(o->precision, "bf16"))
        return fs_errf(e, FS_E_INPUT, "--precision: '%s' is not fp32, fp64 or bf16", o->precision);
    if (o->match && !strcmp(o->precision, "bf16"))
        return fs_errf(e, FS_E_INPUT, "--match bf16 is the high-precision reference of a bf16 run: use it with --precision "
                                      "fp64 (or fp32), not bf16");
    if (o->brk && !o->check) return fs_errf(e, FS_E_INPUT, "--break-on-divergence needs --check");
    if (o->device_mem && !o->estimate) return fs_errf(e, FS_E_INPUT, "--device-mem is a question for --estimate");
    if ((o->dump_modules || o->dump_steps) && !o->dump && !o->dump_per_rank && !o->check)
        return fs_errf(e, FS_E_INPUT, "%s selects what is recorded, but nothing records: add --dump, --dump-per-rank or --check",
                       o->dump_modules ? "--dump-modules" : "--dump-steps");
    if (o->inputs && o->gen_opt_given)
        return fs_errf(e, FS_E_INPUT, "--inputs replays a dump's inputs, sigmas and timesteps; it cannot be combined "
                                      "with --seed/--grid/--txt-len/--batch/--steps/--guidance/--scheduler/"
                                      "--true-cfg-scale/--neg-txt-len/--ref-grid");
    if (o->joint && !(o->text && !strcmp(o->text, "replicated")))
        return fs_errf(e, FS_E_INPUT, "--joint places the replicated text's K/V in the ring: add --text replicated");
    if (o->gen.neg_txt_len && !(o->gen.true_cfg_scale > 0))
        return fs_errf(e, FS_E_INPUT, "--neg-txt-len sets the negative prompt of true CFG: add --true-cfg-scale");
    if (o->cfg_parallel && !o->inputs && !(o->gen.true_cfg_scale > 0))
        return fs_errf(e, FS_E_INPUT, "--cfg-parallel splits the two calls of true CFG over two rank groups: add "
                                      "--true-cfg-scale (or --inputs of a true-CFG dump)");
    if (o->cfg_batched && o->cfg_parallel)
        return fs_errf(e, FS_E_INPUT, "--cfg-batched runs both calls of true CFG as one batch on one rank, --cfg-parallel "
                                      "on two rank groups: choose one");
    if (o->cfg_batched && !o->inputs && !(o->gen.true_cfg_scale > 0))
        return fs_errf(e, FS_E_INPUT, "--cfg-batched batches the two calls of true CFG: add --true-cfg-scale (or --inputs "
                                      "of a true-CFG dump)");
    return FS_OK;
}

static volatile sig_atomic_t sig_rank, sig_quiet; /* the signal handlers' state (below main's helpers) */

/* A run that fails on one rank in the middle of the sampling loop (not a --check divergence,
 * which every rank learns together) may leave the others inside a collective: agreeing would
 * hang. The failing rank says why, naming itself, and ends the job (exit 2). */
static _Noreturn void end_job(const fs_group *world, fs_err *e)
{
    sig_quiet = 1;    /* mpirun's SIGTERM may follow: this rank has said why already */
    fs_cleanup_run(); /* no dump temporary survives: this rank knows every name it could leave */
    fprintf(stderr, "flux-sim: error on rank %d: %s\n", world->rank, e->msg);
    fflush(stderr);
    fs_comm_abort(2);
}

/* --estimate: the run's needs (fs_job_estimate_compute), printed by rank 0; nothing is allocated
 * beyond the config (and a replayed dump's inputs); every rank of the layout is assumed on this
 * machine for "fits here". */
static int estimate_main(const opts *o, fs_err *e)
{
    fs_job_estimate est;
    int rc = fs_job_estimate_compute(o, &est, e);
    if (rc || fs_comm_world()->rank) return rc;
    const fs_config cfg = est.cfg;
    const fs_estimate_req r0 = est.r0, r1 = est.r1;
    const fs_estimate e0 = est.e0, e1 = est.e1;
    const int B = est.batch, steps = est.steps, tp = est.tp, uly = est.ulysses, ring = est.ring, n = est.ranks;
    const int64_t Si = est.s_img, St = est.s_txt;

    char b[16][32], what[64];
#define BY(i, v) fs_estimate_bytes_str((v), b[i], sizeof b[i])
    const char *dtn = !strcmp(o->precision, "bf16") ? "bf16" : o->precision;
    printf("flux-sim --estimate: %d double + %d single blocks, D %d (%.3g B parameters), %s; batch %d, %lld image + "
           "%lld text tokens, %d step%s\n",
           cfg.num_layers, cfg.num_single_layers, cfg.num_attention_heads * cfg.attention_head_dim,
           (double)e0.params * 1e-9, dtn, B, (long long)Si, (long long)St, steps, steps == 1 ? "" : "s");
    printf("  layout: %d rank%s, %stp %d x ulysses %d x ring %d%s%s%s; %lld tokens on the busiest rank\n", n, n > 1 ? "s" : "",
           o->cfg_parallel ? "cfg 2 x " : "", tp, uly, ring, ring > 1 ? (r0.ring_p2p ? " (p2p)" : " (allgather)") : "",
           r1.text_replicated && uly * ring > 1 ? ", text replicated" : "",
           !r1.pad || uly * ring < 2 ? "" : r1.pad == 1 ? ", padded with a key mask" : ", padded without a mask",
           (long long)e1.tokens_rank);
    if (r1.true_cfg) /* fs_estimate.c: what each form of true CFG holds */
        printf("  true CFG: %s, negative prompt of %lld tokens\n",
               r1.cfg_parallel ? "each CFG group runs one of the two calls" : r1.cfg_batched ? "both calls as one forward of batch 2B"
                                                                                        : "two calls a step, one after the other",
               (long long)r1.neg_txt_tokens);
    if (r1.ref_tokens)
        printf("  KV cache: %lld reference tokens; step 0 runs on %lld image tokens, the later steps on %lld with the "
               "reference's K and V cached\n",
               (long long)r1.ref_tokens, (long long)(Si + r1.ref_tokens), (long long)Si);
    printf("  per rank                            flux-sim here (CPU)   a GPU holding every weight\n");
    printf("    weights                           %10s%s   %10s\n", BY(0, e1.weight_bytes),
           e1.streamed ? " (streamed)" : "           ", BY(1, e1.weight_resident_bytes));
    if (e1.streamed) printf("      of which the largest block      %10s\n", BY(2, e1.block_weight_bytes));
    printf("    inputs and latents                %10s              %10s\n", BY(3, e1.input_bytes), BY(4, e1.input_bytes));
    printf("    activations at their peak         %10s              %10s\n", BY(5, e1.act_peak_bytes),
           BY(6, e1.device_bytes - e1.weight_resident_bytes - e1.input_bytes));
    if (e1.kv_cache_bytes) printf("      of which the KV cache           %10s\n", BY(7, e1.kv_cache_bytes));
    if (e1.staging_bytes) printf("    checkpoint pages being decoded    %10s\n", BY(7, e1.staging_bytes));
    if (e1.bf16_scratch_bytes) printf("    bf16 kernels' float32 copies      %10s\n", BY(7, e1.bf16_scratch_bytes));
    if (e1.cfg_kept_bytes) printf("    a CFG call's records, kept        %10s\n", BY(7, e1.cfg_kept_bytes));
    if (e1.gather_bytes) printf("    rank 0 assembling a global tensor %10s\n", BY(8, e1.gather_bytes));
    printf("    process (libraries, MPI, BLAS)    %10s\n", BY(9, r1.baseline_bytes));
    printf("    total                             %10s              %10s (model only: no text encoders, VAE, CUDA "
           "context or allocator cache)\n",
           BY(10, e1.rank_bytes), BY(11, e1.device_bytes));
    if (e0.rank_bytes != e1.rank_bytes)
        printf("    rank 0 (%s)  %10s\n",
               o->check && !o->check_ref && tp > 1 ? "runs the --check reference with every weight"
                                                     : "holds every weight",
               BY(12, e0.rank_bytes));
    if (e0.check_ref_bytes) printf("      of which the --check reference  %10s\n", BY(13, e0.check_ref_bytes));
    if (e0.truth_ref_bytes) printf("      and the float64 truth it keeps  %10s\n", BY(13, e0.truth_ref_bytes));
    if (e0.check_run_bytes) /* fs_estimate.c check_phases */
        printf("      %-32s%10s (%s, before the parallel run)\n",
               e0.truth_ref_bytes ? "its single-rank runs alone" : "its single-rank run alone", BY(13, e0.check_run_bytes),
               e0.truth_ref_bytes ? "the reference, then the matched float64 truth" : "the reference");
    const uint64_t here = est.here_bytes, mem = fs_estimate_mem_limit(what, sizeof what);
    printf("  fits here: %s (%d rank%s on this machine need %s; %s %s)\n", !mem || here <= mem ? "yes" : "NO", n,
           n > 1 ? "s" : "", BY(14, here), what, mem ? BY(15, mem) : "unknown");
    if (o->device_mem)
        printf("  fits a %s device: %s (%s per GPU)\n", BY(0, o->device_mem),
               e1.device_bytes <= o->device_mem ? "yes" : "NO", BY(1, e1.device_bytes));
    printf("  compute per step: %.2f TFLOP for the job, %.2f TFLOP on the busiest rank (matmuls: Linear + "
           "attention); %d step%s: %.1f TFLOP\n",
           e0.flops_step * 1e-12, e0.flops_step_rank * 1e-12, steps, steps == 1 ? "" : "s", e0.flops_step * steps * 1e-12);
    printf("  collectives per step, busiest rank (calls, bytes sent):");
    if (n == 1) printf(" none (one rank)");
    if (e1.allreduce.calls) printf(" all-reduce %llu, %s;", (unsigned long long)e1.allreduce.calls, BY(2, e1.allreduce.bytes));
    if (e1.alltoall.calls) printf(" all-to-all %llu, %s;", (unsigned long long)e1.alltoall.calls, BY(3, e1.alltoall.bytes));
    if (e1.ring.calls)
        printf(" ring %s %llu, %s;", r1.ring_p2p ? "p2p" : "allgather", (unsigned long long)e1.ring.calls,
               BY(4, e1.ring.bytes));
    if (e1.text_gather.calls)
        printf(" text all-gather %llu, %s;", (unsigned long long)e1.text_gather.calls, BY(4, e1.text_gather.bytes));
    if (e1.cfg_gather.calls) printf(" cfg all-gather %llu, %s;", (unsigned long long)e1.cfg_gather.calls, BY(4, e1.cfg_gather.bytes));
    printf("\n");
    printf("  dump: %s per step%s, %s for the run (uncompressed)\n", BY(5, e0.dump_step_bytes),
           r0.modules_narrowed ? " (latents only: the --dump-modules volume is not estimated)" : "",
           BY(6, e0.dump_bytes));
#undef BY
    return FS_OK;
}

/* Standard output is checked like any file written (probe T5, T17): a closed pipe (SIGPIPE is
 * ignored, so the write fails with EPIPE instead of killing the process and leaving the dump's
 * temporary) or a full disk (/dev/full) is an error, exit 2, one line on stderr. Called after
 * each group of lines, with errno cleared before the group: a failed write leaves its errno. */
static int stdout_check(fs_err *e)
{
    int err = errno;
    if (fflush(stdout) != 0) err = errno;
    if (!ferror(stdout)) return FS_OK;
    return fs_errf(e, FS_E_IO, "cannot write to standard output: %s", strerror(err ? err : EIO));
}

/* --clean PATH: what fs_dump_remove_stale finds, one line each on stdout. */
static void clean_report(void *ctx, const char *tmp, int removed, const char *why)
{
    char shown[600];
    int *found = ctx;
    (*found)++;
    printf("%s %s (%s)\n", removed ? "removed" : "kept", fs_printable(tmp, shown, sizeof shown, 500), why);
}

static int clean_main(fs_err *e)
{
    for (int i = 0; i < n_clean; i++) {
        int found = 0;
        char shown[600];
        errno = 0;
        if (fs_dump_remove_stale(clean_paths[i], clean_report, &found) < 0)
            return fs_errf(e, FS_E_IO, "--clean %s: cannot read its directory: %s",
                           fs_printable(clean_paths[i], shown, sizeof shown, 500), strerror(errno));
        if (!found) printf("flux-sim --clean %s: no temporary found\n", fs_printable(clean_paths[i], shown, sizeof shown, 500));
    }
    return stdout_check(e);
}

/* One job: configure, run, print what it did, the --check verdict. */
static int run(const opts *o, fs_err *e)
{
    const fs_group *world = fs_comm_world();
    const int quiet = o->quiet || world->rank != 0;
    fs_job *job = NULL;
    int rc = fs_job_configure(&job, o, e);
    const fs_job_summary *s = job ? fs_job_get_summary(job) : NULL;
    errno = 0;
    if (!rc && !quiet)
        printf("flux-sim %s: %d double + %d single blocks, %d heads x %d, %s on %s; weights: %s (%.2f s)\n"
               "  inputs: %s; batch %d, %d image + %d text tokens, %d steps\n"
               "  layout: %d rank%s, %s%s%s\n",
               FLUX_SIM_VERSION, s->cfg.num_layers, s->cfg.num_single_layers, s->cfg.num_attention_heads,
               s->cfg.attention_head_dim, fs_dtype_name(s->dtype), s->backend, s->weights_src, s->t_load,
               s->inputs ? s->inputs : "generated", s->batch, s->s_img, s->s_txt, s->n_steps, s->world_size,
               s->world_size > 1 ? "s" : "", s->layout, s->tp > 1 ? "; TP plan: " : "", s->tp > 1 ? s->plan_source : "");
    if (!rc) {
        /* stdout gone before the run (a closed pipe, a full disk): stop now, every rank alike,
         * and the job deletes what it created; a run whose report is lost is a failed run */
        rc = fs_job_agree(world, quiet ? FS_OK : stdout_check(e), e);
        if (rc) fs_job_cancel(job, rc);
    }
    if (!rc) rc = fs_job_run(job, e);
    if (fs_job_must_abort(job)) end_job(world, e);
    errno = 0;
    if ((rc == FS_OK || rc == FS_DIVERGED) && !quiet && s->t_reference >= 0)
        printf("  single-rank reference: %.3f s\n", s->t_reference);
    if ((rc == FS_OK || rc == FS_DIVERGED) && s->has_comm_stats) { /* every rank: its own counters */
        char line[512];
        size_t n = (size_t)snprintf(line, sizeof line, "comm-stats rank %d:", world->rank);
        for (int k = 0; k < FS_COMM_NKINDS; k++)
            n += (size_t)snprintf(line + n, sizeof line - n, " %s %lld/%lld", fs_comm_kind_name((fs_comm_kind)k),
                                  (long long)s->comm.calls[k], (long long)s->comm.bytes[k]);
        printf("%s (calls/bytes sent)\n", line);
        fflush(stdout);
    }
    if (rc == FS_OK && !quiet) {
        printf("  sampled in %.3f s (%.3f s/step); final latents mean %.6g std %.6g, %lld non-finite\n", s->t_run,
               s->t_run / s->n_steps, s->lat_mean, s->lat_std, (long long)s->lat_nonfinite);
        printf("  per step: %s; rank 0 peak RSS %.2f GiB\n", s->step_summary, s->peak_rss / 1073741824.0);
        printf("  weights held: %.1f MiB at most on a rank (%s; views into a checkpoint not counted)\n",
               s->weights_peak / 1048576.0, s->streamed ? "streamed block by block" : "every parameter resident");
        if (o->dump) printf("  dump: %s\n", o->dump);
    }
    const char *report = fs_job_check_report(job);
    if (report) fputs(report, rc ? stderr : stdout);
    fs_job_free(job);
    /* the run's files are published by now: the message says they are whole */
    if ((rc == FS_OK || rc == FS_DIVERGED) && stdout_check(e)) {
        if (o->dump || o->dump_per_rank) fs_err_prefix(e, "the run finished and its dumps are complete, but ");
        rc = FS_E_IO;
    }
    return rc;
}

/* SIGTERM / SIGINT / SIGHUP — a user's Ctrl-C or kill, or mpirun ending the job because another
 * rank failed or died: delete the dump temporaries, say so (rank 0 only, so a job prints one
 * line), and die of the signal (exit status 128 + N). Async-signal-safe: unlink and write only. */
static void on_signal(int sig)
{
    fs_cleanup_run();
    if (sig_rank == 0 && !sig_quiet) {
        static const char m1[] = "flux-sim: stopped by ",
                          m2[] = " (an interrupt, or mpirun ending the job after another rank failed); no dump was "
                                 "written\n";
        const char *name = sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM";
        ssize_t w = write(2, m1, sizeof m1 - 1);
        w += write(2, name, strlen(name));
        w += write(2, m2, sizeof m2 - 1);
        (void)w;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_signal_handlers(int rank)
{
    sig_rank = rank;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* A rank started by mpirun dies with it: if the launcher is killed with SIGKILL (a batch system's
 * time limit, `timeout -s KILL`) the kernel sends this rank SIGTERM, whose handler deletes the
 * dump temporaries (probe T10: before, every rank's temporary stayed). Only under a launcher: a
 * flux-sim started by a shell (nohup, a detached job) must outlive it. */
static void die_with_launcher(void)
{
    if (!getenv("OMPI_COMM_WORLD_RANK") && !getenv("PMIX_RANK") && !getenv("PMI_RANK")) return;
    const pid_t parent = getppid();
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) == 0 && getppid() != parent) raise(SIGTERM); /* already gone */
}

int main(int argc, char **argv)
{
    opts o;
    fs_err e = {0};
    setvbuf(stdout, NULL, _IOLBF, 0); /* a log sees each line when it is printed, not at exit */
    /* a closed stdout pipe is a write error (stdout_check), never a silent death by SIGPIPE that
     * leaves a dump temporary behind */
    signal(SIGPIPE, SIG_IGN);
    die_with_launcher();
    int rc = fs_comm_init(&argc, &argv, &e);
    if (rc) {
        fprintf(stderr, "flux-sim: error: %s\n", e.msg);
        return 2;
    }
    const int root = fs_comm_world()->rank == 0;
    install_signal_handlers(fs_comm_world()->rank);
    errno = 0;
    rc = parse_args(argc, argv, &o, &e);
    if (!rc && o.wait_rank == fs_comm_world()->rank) fs_debug_wait_for_debugger(o.wait_rank);
    if (rc < 0) { /* --help / --version / --print-plan / --inject list */
        rc = stdout_check(&e);
        if (rc && root) fprintf(stderr, "flux-sim: error: %s\n", e.msg);
        fs_comm_finalize();
        return rc ? 2 : 0;
    }
    if (!rc && n_clean) rc = root ? clean_main(&e) : FS_OK;
    else if (!rc && o.estimate) {
        errno = 0;
        if (!(rc = estimate_main(&o, &e))) rc = stdout_check(&e);
    } else if (!rc) rc = run(&o, &e);
    /* the outcome is decided and every dump published or deleted: a SIGTERM from here on is
     * mpirun ending the stragglers because another rank already exited non-zero (a race in every
     * failed job) and must not add a second message */
    sig_quiet = 1;
    if (rc && rc != FS_DIVERGED && root) {
        char shown[1200]; /* whatever a message quotes (an option's text, a file name) stays one line */
        fprintf(stderr, "flux-sim: error: %s\n", fs_printable(e.msg, shown, sizeof shown, sizeof e.msg));
    }
    fs_comm_finalize();
    return rc == FS_OK ? 0 : rc == FS_DIVERGED ? 1 : 2;
}
