/* fs_job.c — the run engine behind `flux-sim` (fs_job.h): configure, run, verdict.
 *
 * The order of a job, and why:
 *   0. the backend every activation lives in;
 *   1. rank 0 produces or loads the config and inputs, and broadcasts them (one source of truth,
 *      as the GPU scripts do); a run that cannot fit this machine is refused before anything big
 *      is made;
 *   2. the layout (tp x ulysses x ring) and the TP plan; an --inject that cannot act is refused;
 *   3. the weights: each rank only its TP shard (rank 0 the whole model while it runs the in-job
 *      --check reference), streamed block by block when big;
 *   4. the dumps and --check, created before any compute;
 *   5. --check's single-rank reference on rank 0 (and, in bf16, the matched float64 truth), after
 *      which rank 0 cuts its weights to its shard like every other rank;
 *   6. the run in the layout, recording through the sink; finishing publishes the dumps.
 * Every step ends with fs_job_agree, so all ranks leave a failed step together. */
#include "fs_job.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs_backend_cpu.h"
#include "fs_backends.h"
#include "fs_check.h"
#include "fs_cleanup.h"
#include "fs_dump.h"
#include "fs_inject_check.h"
#include "fs_model.h"
#include "fs_pipeline.h"
#include "fs_plan.h"
#include "fs_progress.h"
#include "fs_select.h"
#include "fs_sink.h"
#include "fs_version.h"
#include "fo_dump.h"

struct fs_job {
    fs_job_opts opt;
    const fs_job_opts *o; /* &opt */
    int root, quiet;
    fs_dtype dt, pdt;   /* the run's dtype; the dtype inputs and weights are made in (--match bf16) */
    fs_config cfg;
    fs_inputs in;
    fs_weights w, wb;   /* host weights, and as the backend computes with them */
    fs_dump *dump, *local;
    fs_tensor lat;
    fs_plan plan;
    fs_par par;
    fs_check *check;
    fs_sink *sink;
    fs_backend *be;
    fs_select sel;
    fs_select_filter fsink, fref;
    int made_dpr_dir;   /* this rank created the --dump-per-rank directory */
    char *peer_tmp;     /* [n_peer_tmp][PEER_TMP_MAX] the other ranks' per-rank temporaries, registered
                           for deletion while this rank runs ("" where not registered) */
    int n_peer_tmp;
    fs_progress prog;   /* rank 0's progress lines on stderr; every rank times its steps */
    char decl_modules[600], decl_steps[300];
    int tp, uly, ring;
    int ref_in_job, fused;
    int rc;             /* the outcome so far: decides what fs_job_free deletes */
    int must_abort;
    fs_job_summary sum;
};

fs_dtype fs_job_dtype(const fs_job_opts *o)
{
    return !strcmp(o->precision, "fp64") ? FS_F64 : !strcmp(o->precision, "bf16") ? FS_BF16 : FS_F32;
}

/* All ranks agree on an error: the worst code wins; rank 0 reports it (its own message, or a
 * note that another rank failed). */
int fs_job_agree(const fs_group *w, int rc, fs_err *e)
{
    /* main prints rank 0's message; a rank that failed alone (rank 0 fine) says why itself */
    int r0 = rc;
    fs_bcast(w, 0, &r0, sizeof r0);
    if (rc && !r0) fprintf(stderr, "flux-sim: error on rank %d: %s\n", w->rank, e->msg);
    int all = fs_allreduce_max_int(w, rc);
    if (all && !rc) fs_errf(e, all, "another rank failed (its message is above)");
    return all;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --config NAME|FILE|DIR (fs_pipeline_load_config); without it, the config.json beside --weights
 * (its transformer or pipeline folder, fs_pipeline.h): the checkpoint says what model it is.
 * Else the default preset. */
static int load_config(const char *name, const char *weights, fs_config *c, fs_err *e)
{
    if (name) return fs_pipeline_load_config(c, name, e);
    fs_pipeline p;
    int rc = weights ? fs_pipeline_resolve(&p, weights, e) : FS_OK;
    if (!rc) rc = weights && p.config ? fs_pipeline_config_file(c, p.config, e) : fs_config_preset(c, "default", e);
    if (weights) fs_pipeline_free(&p); /* resolve leaves p initialised either way */
    return rc;
}

/* --scheduler when given; else the pipeline's scheduler/scheduler_config.json when --weights is
 * in a pipeline folder; else FLUX.1-dev's (guidance embedder) or -schnell's. FLUX.2 runs them
 * with Flux2Pipeline's empirical mu (its scheduler config is FLUX.1-dev's). */
static int sched_for(const fs_job_opts *o, const fs_config *c, fs_sched_config *s, fs_err *e);
static int load_sched(const fs_job_opts *o, const fs_config *c, fs_sched_config *s, fs_err *e)
{
    int rc = sched_for(o, c, s, e);
    if (!rc && c->family == FS_FLUX2) s->empirical_mu = 1;
    return rc;
}
static int sched_for(const fs_job_opts *o, const fs_config *c, fs_sched_config *s, fs_err *e)
{
    if (!o->scheduler && o->weights) {
        fs_pipeline p;
        int rc = fs_pipeline_resolve(&p, o->weights, e);
        if (rc) return rc;
        if (p.scheduler) rc = fs_pipeline_sched_file(s, p.scheduler, e);
        const int done = p.scheduler != NULL;
        fs_pipeline_free(&p);
        if (rc || done) return rc;
    }
    /* FLUX.2 (dev and klein alike) ships FLUX.1-dev's dynamic-shift scheduler config */
    return fs_sched_preset(s, o->scheduler ? o->scheduler : (c->guidance_embeds || c->family == FS_FLUX2 ? "dev" : "schnell"), e);
}

/* A bfloat16 run replayed in float32 or float64 embeds other timesteps and guidance than it did
 * (3500 instead of the 3504 a bf16 transformer embeds): say so, once, before the user reads the
 * diff as a bug. */
static void note_bf16_replay(const fs_job_opts *o, fs_dtype dt)
{
    fo_file *f = NULL;
    fs_err ignore = {0};
    if (dt == FS_BF16 || o->match || fo_file_open(&f, o->inputs, &ignore)) return;
    if (!strcmp(fo_file_dtype(f), "bfloat16"))
        fprintf(stderr, "flux-sim: note: %s is a bfloat16 run; replaying it in %s embeds unrounded timesteps and guidance. "
                        "Replay it with --precision bf16, and judge it against --precision fp64 --match bf16 "
                        "(docs/bf16.md)\n",
                o->inputs, fs_dtype_name(dt));
    fo_file_close(f);
}

/* --check of a bf16 run (rank 0): also the matched float64 truth of the same problem — the bf16
 * weights and inputs promoted exactly to float64, the timesteps and guidance a bf16 transformer
 * embeds — so every tensor is judged by the measured bf16 arbiter rule (docs/bf16.md). */
static int record_matched_truth(const fs_config *cfg, fs_weights *w, const fs_inputs *in, fs_backend *be, fs_check *check,
                                const fs_select *sel, fs_progress *prog, fs_err *e)
{
    fs_select_filter f;
    fs_inputs tin = {0};
    fs_weights wb = {0};
    fs_tensor rl = {0};
    int rc = fs_inputs_copy(&tin, in, e);
    if (!rc) rc = fs_inputs_convert(&tin, FS_F64, e);
    if (!rc) fs_inputs_match_bf16(&tin);
    if (!rc) rc = fs_weights_set_dtype(w, FS_F64, e); /* made in bf16, promoted exactly */
    if (!rc) rc = fs_weights_on(w, be, &wb, e);
    if (!rc) {
        fs_select_filter_init(&f, sel, fs_check_truth_recorder(check), fs_check_truth_hooks(check));
        fs_model truth = {.cfg = *cfg, .dtype = FS_F64, .w = &wb, .stream = w->streaming ? w : NULL, .be = be,
                          .rec = fs_select_filter_recorder(&f), .match_bf16 = 1,
                          .on_block = fs_progress_block, .on_block_ctx = prog};
        fs_step_hooks h = fs_select_filter_hooks(&f);
        fs_progress_begin(prog, "matched fp64 truth", tin.n_steps);
        rc = fs_sample(&truth, &tin, &h, &rl, e);
        fs_progress_end(prog);
    }
    fs_tensor_free(&rl);
    fs_weights_free(&wb);
    if (!rc) rc = fs_weights_set_dtype(w, FS_BF16, e); /* back, for this rank's parallel run */
    fs_inputs_free(&tin);
    return rc;
}

/* --inputs of a dump whose producer did not finish (crashed, killed, disk full) is refused: its
 * inputs may be whole, but a replay is compared with that dump next, and half a run is not what
 * the user thinks they are replaying (docs/dump-format.md, completeness). */
static int inputs_complete(const char *path, fs_err *e)
{
    fo_file *f = NULL;
    fo_completeness c;
    int rc = fo_file_open(&f, path, e);
    if (!rc) rc = fo_file_completeness(f, &c, e);
    if (!rc && !c.complete)
        rc = fs_errf(e, FS_E_INPUT, "--inputs %s: partial dump (its producer did not finish): %s", path, c.reason);
    fo_file_close(f);
    return rc;
}

/* The run as fs_estimate sees it: sizes, layout, what is recorded, how weights are held. The
 * refusal before allocating and --estimate use the same request. full: this rank holds unsharded
 * weights (tp 1, rank 0 of an in-job --check, fused-qkv). */
/* What the inputs add beyond B, Si, St and the steps: true CFG's negative prompt (Sneg tokens;
 * cfg 0: none) and FLUX.2's reference tokens (Sref; 0: none). */
typedef struct est_extra {
    int cfg;
    int64_t Sneg, Sref;
} est_extra;

static est_extra gen_extra(const fs_job_opts *o)
{
    const int cfg = o->gen.true_cfg_scale > 0;
    return (est_extra){.cfg = cfg, .Sneg = cfg ? (o->gen.neg_txt_len > 0 ? o->gen.neg_txt_len : o->gen.txt_len) : 0,
                       .Sref = fs_gen_ref_tokens(&o->gen)};
}

static est_extra inputs_extra(const fs_inputs *in)
{
    const int cfg = in->true_cfg_scale > 0;
    return (est_extra){.cfg = cfg, .Sneg = cfg ? in->S_neg : 0, .Sref = in->S_ref};
}

static void estimate_request(const fs_job_opts *o, const fs_config *cfg, int B, int64_t Si, int64_t St, int steps, int tp,
                             int uly, int ring, const fs_select *sel, int root, int full, est_extra x, fs_estimate_req *r)
{
    const fs_dtype dt = !strcmp(o->precision, "fp64") ? FS_F64 : !strcmp(o->precision, "bf16") ? FS_BF16 : FS_F32;
    const int fused = fs_injected(&o->inject, FS_INJ_FUSED_QKV_CONTIGUOUS);
    *r = (fs_estimate_req){.cfg = cfg, .dtype_size = (int)fs_dtype_size(dt), .batch = B, .img_tokens = Si,
                           .txt_tokens = St, .steps = steps, .tp = tp, .ulysses = uly, .ring = ring,
                           .ring_p2p = o->rotate && !strcmp(o->rotate, "p2p"), .threads = o->threads,
                           .full_weights = full, .check = o->check, .check_in_job = root && o->check && !o->check_ref,
                           .recording = root && (o->dump || o->check), /* rank 0 assembles */ .ranks_per_machine = 1, .config_src = o->config,
                           .inputs_src = o->inputs, .grid_h = o->gen.grid_h, .grid_w = o->gen.grid_w,
                           .dump_path = o->dump, .dump_compressed = o->compress > 0,
                           .stream = fused || !strcmp(o->stream, "off") ? 0 : !strcmp(o->stream, "on") ? 1 : -1,
                           .steps_recorded = sel->steps.all ? 0 : sel->steps.n,
                           .modules_narrowed = sel->modules.n > 0, .baseline_bytes = FS_ESTIMATE_BASELINE,
                           /* FLUX.1 checkpoints ship in BF16; an F32 one is read as views (its pages
                              are the weights), which this slightly overstates */
                           .ckpt_dtype_size = o->weights ? 2 : 0};
    /* the other engines' layouts and the KV cache (fs_estimate.c says what each allocates) */
    r->text_replicated = o->text && !strcmp(o->text, "replicated");
    r->pad = !o->pad ? 0 : !strcmp(o->pad, "mask") ? 1 : 2;
    r->true_cfg = x.cfg;
    r->neg_txt_tokens = x.cfg ? x.Sneg : 0;
    r->cfg_parallel = o->cfg_parallel;
    r->cfg_batched = o->cfg_batched;
    r->records = o->dump || o->dump_per_rank || o->check; /* every rank records (fs_job_run) */
    r->ref_tokens = x.Sref;
    /* several ranks on one machine run one thread each unless --threads says otherwise */
    if (!o->threads && (int64_t)tp * uly * ring > 1) r->threads = 1; /* int64: the options are not checked yet */
}

/* A run that cannot fit is refused before its weights are made: the memory of every rank on
 * this machine (rank 0 holds the whole model during an in-job --check reference) against the
 * smallest limit that applies, and an uncompressed dump against its file system's free space. */
static int refuse_if_too_big(const fs_job_opts *o, const fs_config *cfg, int B, int64_t Si, int64_t St, int steps,
                             est_extra x, const fs_select *sel, int world_size, int ranks_here, fs_err *e)
{
    int tp = o->tp, uly = o->ulysses, ring = o->ring; /* the layout run() will pick */
    if (!tp && !uly && !ring) fs_par_default_layout(cfg, world_size / (o->cfg_parallel ? 2 : 1), &tp, &uly, &ring);
    tp = tp ? tp : 1;
    uly = uly ? uly : 1;
    ring = ring ? ring : 1;
    fs_estimate_req r0 = {0}, r1 = {0};
    fs_estimate e0, e1;
    const int fused = fs_injected(&o->inject, FS_INJ_FUSED_QKV_CONTIGUOUS);
    estimate_request(o, cfg, B, Si, St, steps, tp, uly, ring, sel, 1, tp == 1 || (o->check && !o->check_ref) || fused, x, &r0);
    estimate_request(o, cfg, B, Si, St, steps, tp, uly, ring, sel, 0, tp == 1 || fused, x, &r1);
    int rc = fs_estimate_compute(&r0, &e0, e);
    if (!rc) rc = fs_estimate_compute(&r1, &e1, e);
    if (rc) return rc;
    if (ranks_here > 1) { /* rank 0 and the others, as an average per rank for the message */
        r0.ranks_per_machine = ranks_here;
        e0.rank_bytes = (e0.rank_bytes + (uint64_t)(ranks_here - 1) * e1.rank_bytes) / (uint64_t)ranks_here;
    }
    char what[64];
    const uint64_t mem = fs_estimate_mem_limit(what, sizeof what);
    return fs_estimate_check(&r0, &e0, mem, what, o->dump ? fs_estimate_disk_free(o->dump) : UINT64_MAX, e);
}

/* A narrowed recording says so (docs/dump-format.md): root `recorded_steps`, each step's
 * `recorded_modules`, so a reader tells a module left out on purpose from a missing one. */
static int declare_selection(fs_dump *d, const char *modules, const char *steps, fs_err *e)
{
    int rc = fs_dump_set_recorded_modules(d, modules, e);
    if (!rc) rc = fs_dump_set_attr_string(d, "recorded_steps", steps, e);
    return rc;
}

/* Reference images (the KV cache) run on FLUX.2, on one rank, under --tp or --ulysses, without
 * true CFG; the run and --estimate refuse the rest alike. */
static int kv_refusal(const fs_job_opts *o, const fs_config *cfg, int uly, int ring, int true_cfg, fs_err *e)
{
    const int kv_per_rank = o->dump_per_rank && uly > 1; /* step 0's pieces differ from the later steps' */
    /* nor with the other engines' layouts (--text replicated, --pad: the step-0 partition of
     * [reference; noise] is the sharded-text, unpadded one) */
    const int kv_layout = (o->text && strcmp(o->text, "sharded")) || o->pad;
    if (cfg->family != FS_FLUX2 || ring > 1 || true_cfg || kv_per_rank || kv_layout)
        return fs_errf(e, FS_E_INPUT, "reference images (FLUX.2's KV cache: --ref-grid, /inputs/image_latents) run on "
                                      "FLUX.2, on one rank, under --tp or --ulysses, without true CFG; not %s",
                       cfg->family != FS_FLUX2 ? "on FLUX.1"
                       : ring > 1              ? "under --ring"
                       : kv_per_rank           ? "with --dump-per-rank under --ulysses"
                       : kv_layout             ? "with --text replicated or --pad"
                                               : "with --true-cfg-scale");
    return FS_OK;
}

/* --estimate (fs_job.h). The layout is --tp/--ulysses/--ring, or the default for the ranks the
 * job has. */
int fs_job_estimate_compute(const fs_job_opts *o, fs_job_estimate *est, fs_err *e)
{
    const fs_group *world = fs_comm_world();
    memset(est, 0, sizeof *est);
    fs_config cfg;
    memset(&cfg, 0, sizeof cfg);
    fs_inputs in = {0};
    fs_select sel = {0};
    int rc = fs_select_parse(&sel, o->dump_modules, o->dump_steps, e);
    int B = o->gen.batch, steps = o->gen.steps;
    int64_t Si = (int64_t)o->gen.grid_h * o->gen.grid_w, St = o->gen.txt_len;
    est_extra x = gen_extra(o);
    if (!rc && o->inputs) {
        if (!(rc = fs_dump_read_inputs(o->inputs, FS_F32, &cfg, &in, e))) {
            B = in.B;
            Si = in.S_img;
            St = in.S_txt;
            steps = in.n_steps;
            x = inputs_extra(&in);
        }
    } else if (!rc) rc = load_config(o->config, o->weights, &cfg, e);
    if (!rc) /* the run would refuse it up front too */
        rc = fs_select_check_model(&sel, &cfg,
                                   o->inputs ? fs_names_flags(in.true_cfg_scale > 0, in.S_ref > 0)
                                             : fs_names_flags(o->gen.true_cfg_scale > 0, o->gen.n_ref > 0), e);
    int tp = o->tp, uly = o->ulysses, ring = o->ring;
    if (!rc && !tp && !uly && !ring) fs_par_default_layout(&cfg, world->size / (o->cfg_parallel ? 2 : 1), &tp, &uly, &ring);
    tp = tp ? tp : 1;
    uly = uly ? uly : 1;
    ring = ring ? ring : 1;
    /* in int64: each degree is an unchecked option here (10^6 x 10^6 overflowed an int) */
    const int64_t n64 = (int64_t)tp * uly * ring;
    if (!rc && n64 > INT_MAX)
        rc = fs_errf(e, FS_E_INPUT, "--estimate: tp %d x ulysses %d x ring %d = %lld ranks: more than an MPI job can have",
                     tp, uly, ring, (long long)n64);
    const int n = rc ? 1 : (int)n64, fused = fs_injected(&o->inject, FS_INJ_FUSED_QKV_CONTIGUOUS);
    if (!rc && (cfg.num_attention_heads % tp || cfg.num_attention_heads / tp % uly))
        rc = fs_errf(e, FS_E_INPUT, "--estimate: %d heads do not divide over tp %d x ulysses %d",
                     cfg.num_attention_heads, tp, uly);
    /* the run's own partition check (fs_par_set_seq: no rank without a token), so --estimate
     * never describes a layout the run refuses. tp x ulysses divides the heads (<= 1024), so
     * ulysses x ring fits an int; a degree above every token count flux-sim runs is refused
     * before set_seq would size its tables by it. */
    if (!rc) {
        const int64_t sp = (int64_t)uly * ring;
        if (sp > (int64_t)FS_MAX_IMG_TOKENS + FS_MAX_TXT_TOKENS)
            rc = fs_errf(e, FS_E_INPUT, "ulysses %d x ring %d = %lld sequence-parallel ranks: more than the tokens of any "
                                        "run flux-sim runs (%d image + %d text), so a rank would hold no token",
                         uly, ring, (long long)sp, FS_MAX_IMG_TOKENS, FS_MAX_TXT_TOKENS);
        else {
            fs_par p;
            memset(&p, 0, sizeof p);
            p.sp = (int)sp;
            p.inject = o->inject.mask ? &o->inject : NULL;
            rc = fs_par_set_seq(&p, (int)St, (int)Si, e);
            fs_par_free(&p);
        }
    }
    /* reference images: the layouts the run refuses, and (fs_sample) a Ulysses rank 0 holding
     * only reference tokens at step 0 (the balanced split of [reference; noise] gives it the
     * first ceil((R + N) / P)) */
    if (!rc && x.Sref > 0) rc = kv_refusal(o, &cfg, uly, ring, x.cfg, e);
    if (!rc && x.Sref > 0 && (int64_t)uly * ring > 1 && (x.Sref + Si + (int64_t)uly * ring - 1) / ((int64_t)uly * ring) <= x.Sref)
        rc = fs_errf(e, FS_E_INPUT, "reference images under --ulysses %d: sequence-parallel rank 0 would hold only reference "
                                    "tokens at step 0 (%lld of %lld + %lld image tokens); use fewer ranks or a smaller reference",
                     uly, (long long)((x.Sref + Si + uly - 1) / uly), (long long)x.Sref, (long long)Si);
    fs_estimate_req r0 = {0}, r1 = {0};
    fs_estimate e0 = {0}, e1 = {0};
    if (!rc) {
        estimate_request(o, &cfg, B, Si, St, steps, tp, uly, ring, &sel, 1,
                         tp == 1 || (o->check && !o->check_ref) || fused, x, &r0);
        estimate_request(o, &cfg, B, Si, St, steps, tp, uly, ring, &sel, 0, tp == 1 || fused, x, &r1);
        if (!(rc = fs_estimate_compute(&r0, &e0, e))) rc = fs_estimate_compute(&r1, &e1, e);
        if (n == 1) { /* the one rank is rank 0 */
            r1 = r0;
            e1 = e0;
        }
    }
    fs_inputs_free(&in);
    fs_select_free(&sel);
    est->cfg = cfg;
    est->batch = B;
    est->steps = steps;
    est->s_img = Si;
    est->s_txt = St;
    est->tp = tp;
    est->ulysses = uly;
    est->ring = ring;
    est->ranks = n * (o->cfg_parallel ? 2 : 1); /* --cfg-parallel: two groups of this layout */
    est->r0 = r0;
    est->r1 = r1;
    est->e0 = e0;
    est->e1 = e1;
    /* every rank of the layout on this machine, saturating like fs_estimate (a wrapped sum printed
     * "need 6.6 EiB" for ~215 EiB, and could have wrapped below the limit) */
    uint64_t others, here;
    if (__builtin_mul_overflow((uint64_t)(est->ranks > 1 ? est->ranks - 1 : 0), e1.rank_bytes, &others) ||
        __builtin_add_overflow(e0.rank_bytes, others, &here))
        here = UINT64_MAX;
    est->here_bytes = here;
    return rc;
}

static int configure_backend(fs_job *j, fs_err *e)
{
    const fs_job_opts *o = j->o;
    const fs_group *world = fs_comm_world();
    int rc = FS_OK;
    /* 0. the backend every activation lives in */
    rc = fs_backend_open(o->backend, &j->be, e);
    if (!rc && o->lse_layout) j->be->lse_layout = !strcmp(o->lse_layout, "bsh") ? FS_LSE_BSH : FS_LSE_BHS;
    if ((rc = fs_job_agree(world, rc, e))) return rc;
    return rc;
}

static int configure_inputs(fs_job *j, fs_err *e)
{
    const fs_job_opts *o = j->o;
    const fs_group *world = fs_comm_world();
    int rc = FS_OK;
    /* 1. rank 0 produces or loads the config and inputs, and broadcasts them (the GPU scripts'
     *    setup: one source of truth, received into buffers every rank allocated itself) */
    const int ranks_here = fs_group_node_size(world); /* collective */
    if (j->root) {
        if (o->inputs) {
            /* the dump's config rules; --config, or else a config.json beside --weights, must agree */
            char what[600] = "";
            fs_config want = j->cfg;
            /* the inputs first: a file with no /inputs is named as such, not as a partial dump */
            if (!(rc = fs_dump_read_inputs(o->inputs, j->pdt, &j->cfg, &j->in, e)) && !(rc = inputs_complete(o->inputs, e)) &&
                o->config) {
                snprintf(what, sizeof what, "--config %s", o->config);
                rc = load_config(o->config, NULL, &want, e);
            } else if (!rc && o->weights) {
                fs_pipeline p;
                if (!(rc = fs_pipeline_resolve(&p, o->weights, e)) && p.config) {
                    snprintf(what, sizeof what, "%s (beside --weights)", p.config);
                    rc = fs_pipeline_config_file(&want, p.config, e);
                }
                fs_pipeline_free(&p); /* resolve leaves p initialised either way */
            }
            if (!rc && *what && memcmp(&want, &j->cfg, sizeof j->cfg))
                rc = fs_errf(e, FS_E_INPUT, "%s differs from the config stored in %s", what, o->inputs);
            if (!rc) rc = fs_select_check_model(&j->sel, &j->cfg, fs_names_flags(j->in.true_cfg_scale > 0, j->in.S_ref > 0), e);
            if (!rc)
                rc = refuse_if_too_big(o, &j->cfg, j->in.B, j->in.S_img, j->in.S_txt, j->in.n_steps, inputs_extra(&j->in),
                                       &j->sel, world->size, ranks_here, e);
        } else if (!(rc = load_config(o->config, o->weights, &j->cfg, e)) &&
                   /* --dump-modules that selects nothing of this model: refused before any work */
                   !(rc = fs_select_check_model(&j->sel, &j->cfg,
                                                fs_names_flags(o->gen.true_cfg_scale > 0, o->gen.n_ref > 0), e)) &&
                   /* too big for this machine? refused before the inputs or any weight is made */
                   !(rc = refuse_if_too_big(o, &j->cfg, o->gen.batch, (int64_t)o->gen.grid_h * o->gen.grid_w,
                                            o->gen.txt_len, o->gen.steps, gen_extra(o), &j->sel, world->size, ranks_here, e))) {
            fs_gen_params g = o->gen;
            rc = load_sched(o, &j->cfg, &g.sched, e);
            if (!rc) rc = fs_inputs_generate(&j->in, &j->cfg, j->pdt, &g, e);
        }
        if (!rc && j->pdt != j->dt) rc = fs_inputs_convert(&j->in, j->dt, e);
        if (!rc && o->match) fs_inputs_match_bf16(&j->in);
        if (!rc && o->inputs && !j->quiet) note_bf16_replay(o, j->dt);
    }
    if ((rc = fs_job_agree(world, rc, e))) return rc;
    fs_bcast(world, 0, &j->cfg, sizeof j->cfg);
    rc = fs_inputs_broadcast(world, 0, &j->in, &j->cfg, j->dt, &o->inject, e);
    if (rc) { /* the others are inside the broadcasts: agreeing would hang */
        j->must_abort = 1;
        return rc;
    }
    if (!j->sel.steps.all && j->sel.steps.v[j->sel.steps.n - 1] >= j->in.n_steps) /* every rank has both */
        rc = fs_errf(e, FS_E_INPUT, "--dump-steps %s: this run has %d step%s (0-%d)", j->decl_steps, j->in.n_steps,
                     j->in.n_steps == 1 ? "" : "s", j->in.n_steps - 1);
    if ((rc = fs_job_agree(world, rc, e))) return rc;
    return rc;
}

static int configure_layout(fs_job *j, fs_err *e)
{
    const fs_job_opts *o = j->o;
    const fs_group *world = fs_comm_world();
    int rc = FS_OK;
    /* 2. layout and plan */
    j->tp = o->tp, j->uly = o->ulysses, j->ring = o->ring;
    const int ncfg = o->cfg_parallel ? 2 : 1; /* --cfg-parallel: the layout is each CFG group's */
    if (!j->tp && !j->uly && !j->ring) fs_par_default_layout(&j->cfg, world->size / ncfg, &j->tp, &j->uly, &j->ring);
    j->tp = j->tp ? j->tp : 1;
    j->uly = j->uly ? j->uly : 1;
    j->ring = j->ring ? j->ring : 1;
    rc = o->plan ? fs_plan_load(&j->plan, o->plan, e) : fs_plan_parse(&j->plan, fs_plan_default_text_for(&j->cfg), j->cfg.family == FS_FLUX2 ? "built-in FLUX.2 plan" : "built-in plan", e);
    if (!rc)
        rc = fs_par_init_mesh(&j->par, world, &j->cfg, ncfg, j->tp, j->uly, j->ring,
                              o->rotate && !strcmp(o->rotate, "p2p") ? FS_RING_P2P : FS_RING_ALLGATHER,
                              o->mesh_order && !strcmp(o->mesh_order, "ring-inner") ? FS_MESH_RING_INNER
                                                                                    : FS_MESH_ULYSSES_INNER,
                              &j->plan, e);
    if (!rc && ncfg > 1 && !(j->in.true_cfg_scale > 0)) /* --inputs of a dump without true CFG */
        rc = fs_errf(e, FS_E_INPUT, "--cfg-parallel splits the two calls of true CFG over two rank groups, but %s has "
                                    "no true CFG (no negative prompt or true_cfg_scale)", o->inputs ? o->inputs : "this run");
    if (!rc && o->cfg_batched) { /* one forward of batch 2B: one rank, one prompt length */
        if (!(j->in.true_cfg_scale > 0))
            rc = fs_errf(e, FS_E_INPUT, "--cfg-batched batches the two calls of true CFG, but %s has no true CFG",
                         o->inputs ? o->inputs : "this run");
        else if (world->size > 1)
            rc = fs_errf(e, FS_E_INPUT, "--cfg-batched runs on one rank (the job has %d); the parallel form of true CFG is "
                                        "--cfg-parallel", world->size);
        else if (j->in.S_neg != j->in.S_txt)
            rc = fs_errf(e, FS_E_INPUT, "--cfg-batched stacks the prompt and the negative prompt into one batch: they need "
                                        "the same length (%d vs %d text tokens)", j->in.S_neg, j->in.S_txt);
    }
    j->par.inject = o->inject.mask ? &o->inject : NULL; /* before the partition: seq-uneven-chunk */
    /* before the partition too: replicated text is on every SP rank */
    j->par.text = o->text && !strcmp(o->text, "replicated") ? FS_TEXT_REPLICATED : FS_TEXT_SHARDED;
    j->par.joint = o->joint && !strcmp(o->joint, "rear") ? FS_JOINT_REAR : FS_JOINT_FRONT;
    j->par.pad = !o->pad ? FS_PAD_NONE : !strcmp(o->pad, "mask") ? FS_PAD_MASK : FS_PAD_NOMASK;
    if (!rc) rc = fs_par_set_seq(&j->par, j->in.S_txt, j->in.S_img, e);
    if (!rc) rc = fs_inject_refuse(j->par.inject, &j->par, &j->cfg, &j->in, e); /* an --inject that cannot act: exit 2 */
    /* true CFG's negative prompt is split like the prompt: the partition knows one text length */
    if (!rc && j->in.true_cfg_scale > 0 && j->par.sp > 1 && j->in.S_neg != j->in.S_txt)
        rc = fs_errf(e, FS_E_INPUT, "true CFG under sequence parallelism (%s%s) needs a negative prompt as long as the "
                                    "prompt (%d vs %d text tokens); tensor parallelism alone takes any length",
                     j->uly > 1 ? "--ulysses" : "--ring", j->uly > 1 && j->ring > 1 ? " x --ring" : "", j->in.S_neg,
                     j->in.S_txt);
    /* FLUX.2's KV cache for reference images: one rank, TP, Ulysses (fs_sample partitions step 0's
     * [reference; noise] on its own); not ring attention (not built), not true CFG
     * (Flux2KleinKVPipeline has none), not per-rank dumps under Ulysses (one sharding map entry
     * per name cannot say both step 0's split and the later steps') */
    if (!rc && j->in.S_ref > 0) rc = kv_refusal(o, &j->cfg, j->uly, j->ring, j->in.true_cfg_scale > 0, e);
    if ((rc = fs_job_agree(world, rc, e))) return rc;
    /* ranks sharing the cores: one thread each unless told otherwise */
    fs_backend_cpu_set_threads(o->threads ? o->threads : (world->size > 1 ? 1 : 0));
    if (o->ar_order)
        fs_comm_set_bf16_order(!strcmp(o->ar_order, "ring")      ? FS_BF16_ORDER_RING
                               : !strcmp(o->ar_order, "reverse") ? FS_BF16_ORDER_REVERSE
                                                                 : FS_BF16_ORDER_RANK);
    return rc;
}

static int configure_weights(fs_job *j, fs_err *e)
{
    const fs_job_opts *o = j->o;
    const fs_group *world = fs_comm_world();
    int rc = FS_OK;
    /* 3. weights: each rank holds only its TP shard of the plan-split Linears (synthetic: only
     *    those elements are generated; checkpoints: mmap'd, only the shard's rows and columns
     *    decoded, views where the bytes are already what the run computes with). Rank 0 holds
     *    the full model while it runs the in-job single-rank reference of --check, and remakes its
     *    shard afterwards. Streaming (--stream): only embedders, norm_out and proj_out stay made;
     *    each block's parameters are made before the block and dropped after it (fs_weights.h).
     *    fused-qkv-contiguous cuts q|k|v from full weights, so it holds them all, unstreamed. */
    double t0 = now();
    j->ref_in_job = o->check && !o->check_ref;
    j->fused = fs_injected(&o->inject, FS_INJ_FUSED_QKV_CONTIGUOUS);
    const int full = j->tp == 1 || (j->root && j->ref_in_job) || j->fused;
    fs_weights_opts wo = {.path = o->weights, .seed = o->weights_seed, .dtype = j->dt, .make_dtype = j->pdt, .plan = &j->plan,
                          .tp = full ? 1 : j->tp, .tp_rank = full ? 0 : j->par.tp_rank, .inj = j->par.inject,
                          .stream = !j->fused && strcmp(o->stream, "off")};
    rc = fs_weights_open(&j->w, &j->cfg, &wo, e);
    if (!rc && wo.stream && !strcmp(o->stream, "auto")) {
        /* stream only what is big (bit-identical either way): this rank's block parameters in the
         * split it runs with; every rank decides alike, by the largest */
        double bytes = (double)fs_weights_block_bytes(&j->w, j->tp, j->par.tp_rank, e);
        fs_allreduce_max_double(world, &bytes, 1);
        if (bytes < 0) rc = FS_E_INTERNAL;
        else if (bytes <= FS_STREAM_AUTO_BYTES) rc = fs_weights_set_streaming(&j->w, 0, e);
    }
    if (!rc && j->tp > 1 && j->fused && !(j->root && j->ref_in_job)) rc = fs_weights_shard(&j->w, &j->plan, j->tp, j->par.tp_rank, j->par.inject, e);
    if ((rc = fs_job_agree(world, rc, e))) return rc;
    j->sum.t_load = now() - t0;
    return rc;
}

/* Every rank learns the name of every rank's --dump-per-rank temporary as soon as it exists
 * (each carries its own writer's pid, so no rank can compute another's): a rank killed with
 * SIGKILL runs no handler, and mpirun then SIGTERMs the others, whose handlers delete the
 * temporaries they know (fs_cleanup), the dead rank's included. Collective. */
#define PEER_TMP_MAX 1024
static void publish_peer_tmps(fs_job *j, const fs_group *world)
{
    char mine[PEER_TMP_MAX] = "";
    const char *t = fs_dump_tmp_path(j->local);
    if (t && strlen(t) < sizeof mine) snprintf(mine, sizeof mine, "%s", t);
    j->peer_tmp = calloc((size_t)world->size, PEER_TMP_MAX);
    if (fs_allreduce_max_int(world, j->peer_tmp == NULL)) { /* every rank skips it alike */
        free(j->peer_tmp);
        j->peer_tmp = NULL;
        return;
    }
    fs_allgather_bytes(world, mine, PEER_TMP_MAX, j->peer_tmp);
    j->n_peer_tmp = world->size;
    for (int r = 0; r < world->size; r++) {
        char *p = j->peer_tmp + (size_t)r * PEER_TMP_MAX;
        p[PEER_TMP_MAX - 1] = 0;
        if (r == world->rank || !*p || fs_cleanup_add(p)) *p = 0; /* own: fs_dump registered it */
    }
}

static int configure_outputs(fs_job *j, fs_err *e)
{
    const fs_job_opts *o = j->o;
    const fs_group *world = fs_comm_world();
    int rc = FS_OK;
    /* 4. the dump is created before any compute: serial, or parallel HDF5 over all ranks (the
     *    global layout, each rank writing its hyperslabs; attributes identical on every rank) */
    char wdesc[600], producer[320];
    if (o->weights) snprintf(wdesc, sizeof wdesc, "%s", o->weights);
    else snprintf(wdesc, sizeof wdesc, "synthetic seed %llu", (unsigned long long)o->weights_seed);
    snprintf(producer, sizeof producer, "flux-sim %s (%s, %s%s)", FS_VERSION, j->be->name, fs_dtype_name(j->dt),
             o->match ? ", matched to bfloat16" : "");
    if (o->dump) {
        rc = world->size > 1 ? fs_dump_create_parallel(&j->dump, o->dump, world, &j->cfg, j->dt, producer, e)
                             : fs_dump_create(&j->dump, o->dump, &j->cfg, j->dt, producer, e);
        if (!rc && !(rc = fs_dump_set_deflate(j->dump, o->compress, e)) && !(rc = fs_dump_write_inputs(j->dump, &j->in, e)))
            rc = fs_dump_set_attr_string(j->dump, "weights", wdesc, e);
        if (!rc && o->match) rc = fs_dump_set_attr_string(j->dump, "matched_to", "bfloat16", e); /* as the reference's */
        if (!rc && !fs_select_all(&j->sel)) rc = declare_selection(j->dump, j->decl_modules, j->decl_steps, e);
    }
    if (!rc && o->dump_per_rank) {
        char path[1024], lprod[400];
        if (!mkdir(o->dump_per_rank, 0777)) j->made_dpr_dir = 1;
        else if (errno != EEXIST)
            rc = fs_errf(e, FS_E_IO, "%s: cannot create directory: %s", o->dump_per_rank, strerror(errno));
        snprintf(path, sizeof path, "%s/rank_%d.h5", o->dump_per_rank, world->rank);
        snprintf(lprod, sizeof lprod, "%s, rank %d local view", producer, world->rank);
        if (!rc && !(rc = fs_dump_create(&j->local, path, &j->cfg, j->dt, lprod, e)) &&
            !(rc = fs_dump_set_deflate(j->local, o->compress, e)) && !(rc = fs_dump_write_inputs(j->local, &j->in, e)))
            rc = fs_dump_set_attr_string(j->local, "weights", j->w.source, e);
        if (!rc && j->local && !fs_select_all(&j->sel)) rc = declare_selection(j->local, j->decl_modules, j->decl_steps, e);
    }
    if (o->dump_per_rank) { /* same on every rank: this job made the directory (one rank did); every
                               rank removes it if the job fails, or is killed, and it is empty */
        j->made_dpr_dir = fs_allreduce_max_int(world, j->made_dpr_dir);
        if (j->made_dpr_dir) fs_cleanup_add(o->dump_per_rank);
        publish_peer_tmps(j, world);
    }
    if (o->check) {
        fs_check_tol tol = fs_check_default_tol(j->dt);
        if (o->rtol > 0) tol.rtol = o->rtol;
        if (o->rtol_max > 0) tol.mtol = o->rtol_max;
        if (!rc) rc = fs_check_create(&j->check, &j->par, j->dt, tol, o->rtol > 0 || o->rtol_max > 0, o->check_ref, e);
        if (!rc) fs_check_set_break(j->check, o->brk);
    }
    if (!rc) { /* from here on the sink owns the dumps */
        fs_sink_opts so = {.par = &j->par, .dump = j->dump, .local = j->local, .check = j->check};
        if (!(rc = fs_sink_create(&j->sink, &so, e))) j->dump = j->local = NULL;
    }
    if ((rc = fs_job_agree(world, rc, e))) return rc;
    return rc;
}

int fs_job_configure(fs_job **jp, const fs_job_opts *opts, fs_err *e)
{
    fs_job *j = calloc(1, sizeof *j);
    *jp = j;
    if (!j) return fs_errf(e, FS_E_NOMEM, "flux-sim: out of memory for the job");
    j->opt = *opts;
    const fs_job_opts *o = j->o = &j->opt;
    const fs_group *world = fs_comm_world();
    j->root = world->rank == 0;
    j->quiet = o->quiet || !j->root;
    j->dt = fs_job_dtype(o);
    /* --match bf16: inputs and weights are made (or read) as a bf16 run has them, then converted
     * exactly to the run's precision */
    j->pdt = o->match ? FS_BF16 : j->dt;
    j->sum.t_reference = -1;
    fs_progress_init(&j->prog, j->quiet ? NULL : stderr);
    int rc = FS_OK;

    /* what is recorded (--dump-modules, --dump-steps): every rank parses the same options */
    if ((rc = fs_select_parse(&j->sel, o->dump_modules, o->dump_steps, e))) goto out;
    fs_select_modules_decl(&j->sel, j->decl_modules, sizeof j->decl_modules);
    fs_select_steps_decl(&j->sel, j->decl_steps, sizeof j->decl_steps);
    if (!(rc = configure_backend(j, e)) && !(rc = configure_inputs(j, e)) && !(rc = configure_layout(j, e)) &&
        !(rc = configure_weights(j, e)))
        rc = configure_outputs(j, e);
    if (rc) goto out;
    j->sum.cfg = j->cfg;
    j->sum.dtype = j->dt;
    j->sum.backend = j->be->name;
    j->sum.weights_src = j->w.source;
    j->sum.inputs = o->inputs;
    j->sum.plan_source = j->plan.source;
    j->sum.batch = j->in.B;
    j->sum.s_img = j->in.S_img;
    j->sum.s_txt = j->in.S_txt;
    j->sum.n_steps = j->in.n_steps;
    j->sum.world_size = world->size;
    j->sum.tp = j->tp;
    fs_par_describe(&j->par, j->sum.layout, sizeof j->sum.layout);
out:
    j->rc = rc;
    return rc;
}

/* 5. --check: rank 0 first records the single-rank reference of the same weights/inputs (and in
 *    bf16 the matched float64 truth), then cuts its weights to its TP shard like every other rank */
static int run_check_reference(fs_job *j, fs_err *e)
{
    const fs_job_opts *o = j->o;
    int rc = FS_OK;
    fs_select_filter_init(&j->fref, &j->sel, fs_check_ref_recorder(j->check), fs_check_ref_hooks(j->check));
    fs_model ref = {.cfg = j->cfg, .dtype = j->dt, .w = &j->wb, .be = j->be, .rec = fs_select_filter_recorder(&j->fref),
                    .match_bf16 = o->match != NULL, .on_block = fs_progress_block, .on_block_ctx = &j->prog};
    fs_step_hooks h = fs_select_filter_hooks(&j->fref);
    fs_tensor rl = {0};
    double t0 = now();
    ref.stream = j->w.streaming ? &j->w : NULL;
    fs_progress_begin(&j->prog, "single-rank reference", j->in.n_steps);
    if (!(rc = fs_weights_on(&j->w, j->be, &j->wb, e))) rc = fs_sample(&ref, &j->in, &h, &rl, e);
    fs_progress_end(&j->prog);
    fs_tensor_free(&rl);
    fs_weights_free(&j->wb);
    if (!rc && j->dt == FS_BF16) rc = record_matched_truth(&j->cfg, &j->w, &j->in, j->be, j->check, &j->sel, &j->prog, e);
    if (!rc && j->tp > 1 && j->fused) rc = fs_weights_shard(&j->w, &j->plan, j->tp, j->par.tp_rank, j->par.inject, e);
    else if (!rc && j->tp > 1) rc = fs_weights_resplit(&j->w, &j->plan, j->tp, j->par.tp_rank, j->par.inject, e);
    if (!rc) j->sum.t_reference = now() - t0;
    return rc;
}

/* The final latents' statistics (the CLI's one-line fingerprint of a run) and the run's times and
 * memory, for fs_job_summary. */
static int summarize(fs_job *j, fs_err *e)
{
    fs_tensor hl;
    int rc = fs_tensor_host_view(&j->lat, &hl, e);
    if (rc) return rc;
    double s = 0, s2 = 0;
    int64_t n = fs_tensor_numel(&hl), bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = fs_tensor_get(&hl, i);
        if (!isfinite(v)) bad++;
        s += v;
        s2 += v * v;
    }
    fs_tensor_free(&hl);
    j->sum.lat_mean = s / n;
    j->sum.lat_std = sqrt(s2 / n - (s / n) * (s / n));
    j->sum.lat_nonfinite = bad;
    fs_progress_step_summary(&j->prog, j->sum.step_summary, sizeof j->sum.step_summary);
    double rss;
    fs_mem_rss(&rss, &j->sum.peak_rss);
    return FS_OK;
}

int fs_job_run(fs_job *j, fs_err *e)
{
    const fs_job_opts *o = j->o;
    const fs_group *world = fs_comm_world();
    int rc = j->rc;
    if (rc) return rc; /* configure failed: nothing to run */

    if (j->ref_in_job && j->root) rc = run_check_reference(j, e);
    if (!rc) rc = fs_weights_on(&j->w, j->be, &j->wb, e);
    if ((rc = fs_job_agree(world, rc, e))) goto out;

    /* 6. the run in this layout */
    fs_model m = {.cfg = j->cfg, .dtype = j->dt, .w = &j->wb, .stream = j->w.streaming ? &j->w : NULL, .be = j->be,
                  .par = &j->par, .match_bf16 = o->match != NULL, .on_block = fs_progress_block, .on_block_ctx = &j->prog,
                  .cfg_batched = o->cfg_batched};
    /* decided from the options, which every rank has — `dump` exists on rank 0 only, and a
     * collective that one rank skips is a hang */
    const int recording = o->dump || o->dump_per_rank || j->check;
    fs_select_filter_init(&j->fsink, &j->sel, recording ? fs_sink_recorder(j->sink) : (fs_recorder){0},
                          fs_sink_hooks(j->sink));
    m.rec = fs_select_filter_recorder(&j->fsink);
    fs_step_hooks hooks = fs_select_filter_hooks(&j->fsink);
    double t0 = now();
    fs_comm_stats_reset();
    fs_progress_begin(&j->prog, world->size > 1 ? "parallel run" : "run", j->in.n_steps);
    rc = fs_sample(&m, &j->in, &hooks, &j->lat, e);
    fs_progress_end(&j->prog);
    j->sum.t_run = now() - t0;
    if (o->comm_stats && (rc == FS_OK || rc == FS_DIVERGED)) {
        fs_comm_stats_get(&j->sum.comm);
        j->sum.has_comm_stats = 1;
    }
    if (rc == FS_DIVERGED) goto out; /* every rank got the same verdict from the same record */
    if (rc && world->size > 1 && !fs_check_agreed_error(j->check) && !fs_sink_agreed_error(j->sink)) {
        j->must_abort = 1; /* failed alone, mid-loop: the others may be inside a collective */
        goto out;
    }
    if (rc) goto out;
    if (j->check) rc = fs_check_finish(j->check, e);
    if (!rc) rc = fs_sink_finish(j->sink, j->plan.source, &j->lat, e);
    int rc_inj = fs_inject_after_run(j->par.inject, world, rc ? NULL : e); /* a collective: armed but never fired */
    if (!rc) rc = rc_inj;
    if ((rc = fs_job_agree(world, rc, e))) goto out;
    double wpeak = (double)j->w.peak_bytes; /* every rank: a collective */
    fs_allreduce_max_double(world, &wpeak, 1);
    j->sum.weights_peak = wpeak;
    j->sum.streamed = j->w.streaming;
    rc = summarize(j, e);
out:
    if (j->check && rc == FS_OK && fs_check_diverged(j->check)) rc = FS_DIVERGED;
    j->rc = rc;
    return rc;
}

const char *fs_job_check_report(const fs_job *j)
{
    if (!j || !j->check || !j->root || (j->rc != FS_OK && j->rc != FS_DIVERGED)) return NULL;
    return fs_check_report(j->check);
}

int fs_job_must_abort(const fs_job *j) { return j && j->must_abort; }

void fs_job_cancel(fs_job *j, int rc)
{
    if (j && rc) j->rc = rc;
}

const fs_job_summary *fs_job_get_summary(const fs_job *j) { return &j->sum; }

void fs_job_free(fs_job *j)
{
    if (!j) return;
    fs_sink_free(j->sink); /* aborts (deletes) any dump not finished */
    fs_dump_abort(j->dump);
    fs_dump_abort(j->local);
    /* a failed run leaves no --dump-per-rank directory it created (rmdir only removes it empty:
     * the other ranks' files, if any were published, keep it) */
    for (int r = 0; r < j->n_peer_tmp; r++) /* published or deleted by their ranks by now */
        if (j->peer_tmp[(size_t)r * PEER_TMP_MAX]) fs_cleanup_remove(j->peer_tmp + (size_t)r * PEER_TMP_MAX);
    free(j->peer_tmp);
    if (j->made_dpr_dir) {
        fs_cleanup_remove(j->o->dump_per_rank);
        if (j->rc && j->rc != FS_DIVERGED) rmdir(j->o->dump_per_rank);
    }
    fs_check_free(j->check);
    fs_tensor_free(&j->lat);
    fs_weights_free(&j->wb);
    fs_weights_free(&j->w);
    fs_inputs_free(&j->in);
    fs_par_free(&j->par);
    fs_plan_free(&j->plan);
    fs_backend_close(j->be);
    fs_select_free(&j->sel);
    fs_progress_free(&j->prog);
    free(j);
}
