#include "fs_inject.h"

#include "fs_inputs.h"
#include "fs_par.h"
#include "fs_plan.h"
#include "fs_seqpar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a bug's hook needs to act at all ("cannot fire" without it) ... */
enum {
    N_RANKS2 = 1u << 0, /* 2+ ranks: the inputs are broadcast (a single rank broadcasts nothing) */
    N_TP = 1u << 1,     /* --tp >= 2: the TP plan is consulted */
    N_ULY = 1u << 2,    /* --ulysses >= 2: the all-to-alls exist */
    N_RING = 1u << 3,   /* --ring >= 2: ring attention and its merge exist */
    N_P2P = 1u << 4,    /* --ring-rotate p2p: a receive is outstanding while computing */
    N_SP = 1u << 5,     /* --ulysses or --ring >= 2: the sequence is split */
    N_GUID = 1u << 6,   /* a model with a guidance embedder: the guidance is broadcast */
    N_AT = 1u << 7,     /* RANK < ranks and STEP < --steps (nan-rank, fail-rank) */
    /* ... and what it needs to change a result once it acts ("fires but changes nothing") */
    H_RING_UNEVEN = 1u << 8,  /* ring chunks of unequal length: something is padded */
    H_ULY_UNEVEN = 1u << 9,   /* Ulysses shards of unequal length in some group */
    H_MULTIHEAD = 1u << 10,   /* > 1 head and > 1 query token per ring attention: (B,S,H) != (B,H,S) */
    H_IDS_MOVE = 1u << 11,    /* some rank's ids differ from the sequence start's */
    H_VALUE = 1u << 12,       /* the broadcast value is not all zeros (checked on rank 0) */
    /* the hook reports firing (fs_inject_fire): checked again after the run */
    REPORTS = 1u << 13,
};

/* THE table: every bug, what it does, where it comes from, what it needs, where it shows.
 * docs/bugs.md's summary reproduces it; docs/detection-matrix.md is its proof by real runs. */
static const struct {
    const char *name, *what, *source;
    unsigned needs;
    const char *shows;
} cat[FS_INJ_COUNT] = {
    [FS_INJ_PROJ_OUT_CONTIGUOUS] = {"proj-out-contiguous",
                                    "single-block proj_out row-parallel weight sliced as contiguous columns",
                                    "seed 000 TP-1; sglang#21664", N_TP | REPORTS,
                                    "--tp >= 2, alone or with --ulysses/--ring (e.g. --tp 2), with a plan that splits "
                                    "single-block proj_out packed_rowwise (the built-in one)"},
    [FS_INJ_TIMESTEP_TEMP_BCAST] = {"timestep-temp-bcast", "timesteps broadcast into a temporary: ranks != 0 keep zeros",
                                    "seed 000 TP-2", N_RANKS2 | H_VALUE,
                                    "every layout of 2 or more ranks (e.g. --tp 2, --ring 2)"},
    [FS_INJ_GUIDANCE_TEMP_BCAST] = {"guidance-temp-bcast", "the guidance value broadcast into a temporary: ranks != 0 keep 0",
                                    "seed 000 TP-2 class", N_RANKS2 | N_GUID | H_VALUE,
                                    "every layout of 2 or more ranks, with a guidance-embedding model (default, tiny, "
                                    "flux-dev) and a non-zero --guidance"},
    [FS_INJ_LSE_LAYOUT] = {"lse-layout", "ring merge reads an LSE laid out (B,S,H) as if (B,H,S)",
                           "seed 001 TP-3; pytorch#171568", N_RING | H_MULTIHEAD | REPORTS,
                           "--ring >= 2 (allgather or p2p), alone or with --ulysses/--tp, with more than one head per "
                           "rank (e.g. --ring 2)"},
    [FS_INJ_RING_NO_LSE] = {"ring-no-lse", "ring partials averaged instead of LSE-weighted", "common first attempt",
                            N_RING | REPORTS, "--ring >= 2 (allgather or p2p), alone or with --ulysses/--tp (e.g. --ring 2)"},
    [FS_INJ_ROPE_LOCAL_POS] = {"rope-local-pos", "context-parallel ranks rotate with local instead of global positions",
                               "diffusers#12443 class", N_SP | H_IDS_MOVE,
                               "--ulysses >= 2 or --ring >= 2, alone or with --tp (e.g. --ring 2, --ulysses 2)"},
    [FS_INJ_ULYSSES_HEAD_ORDER] = {"ulysses-head-order",
                                   "the two Ulysses all-to-alls disagree on which head block goes to which rank", "",
                                   N_ULY | REPORTS, "--ulysses >= 2, alone or with --ring/--tp (e.g. --ulysses 2)"},
    [FS_INJ_ROWWISE_BIAS_EVERY_RANK] = {"rowwise-bias-every-rank", "row-parallel bias added on every rank before the all-reduce",
                                        "", N_TP | REPORTS,
                                        "--tp >= 2, alone or with --ulysses/--ring (e.g. --tp 2), with a plan that has "
                                        "row-parallel Linears (the built-in one)"},
    [FS_INJ_MISSING_ALLREDUCE] = {"missing-allreduce", "row-parallel outputs used without their all-reduce", "",
                                  N_TP | REPORTS,
                                  "--tp >= 2, alone or with --ulysses/--ring (e.g. --tp 2), with a plan that has "
                                  "row-parallel Linears (the built-in one)"},
    [FS_INJ_ADALN_SHARDED] = {"adaln-sharded",
                              "AdaLN modulation linears split row-parallel over TP (each rank its slice of SiLU(temb)) "
                              "without the all-reduce: ranks modulate with different partial sums",
                              "", N_TP | REPORTS,
                              "--tp >= 2, alone or with --ulysses/--ring (e.g. --tp 2), with a plan that replicates "
                              "the AdaLN linears (the built-in one)"},
    [FS_INJ_OVERLAP_EARLY_READ] = {"overlap-early-read",
                                   "ring p2p: the next K/V chunk read before its Irecv completed (deterministically: the "
                                   "stale buffer)",
                                   "seed 003's overlap class", N_RING | N_P2P | REPORTS,
                                   "--ring >= 2 --ring-rotate p2p, alone or with --ulysses/--tp (e.g. --ring 2 "
                                   "--ring-rotate p2p); the Ulysses all-to-all form is ulysses-early-read"},
    [FS_INJ_SEQ_UNEVEN_CHUNK] = {"seq-uneven-chunk",
                                 "sequence shards sized like torch.chunk (ceil) and the ring's K/V chunks all-gathered as if "
                                 "equal: padded with zero tokens that attention does not mask",
                                 "seed 002", N_RING | H_RING_UNEVEN | REPORTS,
                                 "--ring >= 2 with ring chunks of unequal length, alone or with --ulysses/--tp (e.g. --ring 2 "
                                 "--grid 5x7 --txt-len 13); the Ulysses all-to-all form is ulysses-uneven-chunk"},
    [FS_INJ_FUSED_QKV_CONTIGUOUS] = {"fused-qkv-contiguous",
                                     "the fused [q|k|v] weight (BFL qkv / linear1) split contiguously across TP ranks "
                                     "instead of per q, k, v",
                                     "NeMo Automodel#1324", N_TP | REPORTS,
                                     "--tp >= 2, alone or with --ulysses/--ring (e.g. --tp 2), with a plan that splits "
                                     "attn.to_q/to_k/to_v colwise (the built-in one)"},
    [FS_INJ_ULYSSES_UNEVEN_CHUNK] = {"ulysses-uneven-chunk",
                                     "Ulysses all-to-all in torch.chunk-sized equal blocks: short shards zero-padded to "
                                     "the longest, the padding attended as tokens",
                                     "seed 002 under Ulysses", N_ULY | H_ULY_UNEVEN | REPORTS,
                                     "--ulysses >= 2 with Ulysses shards of unequal length, alone or with --ring/--tp "
                                     "(e.g. --ulysses 2 --grid 5x7 --txt-len 13)"},
    [FS_INJ_ULYSSES_EARLY_READ] = {"ulysses-early-read",
                                   "Ulysses: attention reads the K/V all-to-all receive buffer before the exchange "
                                   "completed (deterministically: the other ranks' blocks as the fresh buffer held them, "
                                   "zeros)",
                                   "seed 003 under Ulysses", N_ULY | REPORTS,
                                   "--ulysses >= 2, alone or with --ring/--tp (e.g. --ulysses 2)"},
    [FS_INJ_NAN_RANK] = {"nan-rank:RANK:MODULE:STEP", "one element of MODULE's output becomes NaN on RANK at STEP",
                         "seed 003's symptom", N_AT | REPORTS,
                         "every layout that has rank RANK, with STEP < --steps and MODULE a recorded module"},
    [FS_INJ_FAIL_RANK] = {"fail-rank:RANK:MODULE:STEP",
                          "a fault, not a bug: RANK fails with an out-of-memory error at MODULE, STEP while the others "
                          "wait in a collective (the job must end, naming the rank, not hang)",
                          "", N_AT | REPORTS, "every layout that has rank RANK, with STEP < --steps and MODULE a recorded module"},
};

int fs_inject_nan_fired;
static unsigned fired; /* bit per fs_inj_id: the hook acted on this rank */

void fs_inject_fire(fs_inj_id id) { fired |= 1u << id; }

const char *fs_inject_catalogue(void)
{
    static char buf[8192];
    size_t o = 0;
    for (int i = 0; i < FS_INJ_COUNT && o < sizeof buf; i++) {
        o += (size_t)snprintf(buf + o, sizeof buf - o, "  %-26s %s%s%s%s\n", cat[i].name, cat[i].what,
                              *cat[i].source ? " [" : "", cat[i].source, *cat[i].source ? "]" : "");
        if (o < sizeof buf) o += (size_t)snprintf(buf + o, sizeof buf - o, "  %-26s   shows under: %s\n", "", cat[i].shows);
    }
    return buf;
}

static int parse_at(const char *spec, const char *prefix, fs_inject_at *at, fs_err *e)
{
    char mod[192];
    int r, st;
    const char *p = spec + strlen(prefix), *c1 = strchr(p, ':'), *c2 = c1 ? strrchr(c1 + 1, ':') : NULL;
    if (!c1 || !c2 || c2 == c1 || sscanf(p, "%d", &r) != 1 || sscanf(c2 + 1, "%d", &st) != 1 ||
        (size_t)(c2 - c1 - 1) >= sizeof mod || r < 0 || st < 0)
        return fs_errf(e, FS_E_INPUT, "--inject %s: expected %sRANK:MODULE:STEP", spec, prefix);
    memcpy(mod, c1 + 1, (size_t)(c2 - c1 - 1));
    mod[c2 - c1 - 1] = 0;
    at->rank = r;
    at->step = st;
    snprintf(at->module, sizeof at->module, "%s", mod);
    return FS_OK;
}

int fs_inject_add(fs_inject *in, const char *spec, fs_err *e)
{
    if (!strncmp(spec, "nan-rank:", 9)) {
        in->mask |= 1u << FS_INJ_NAN_RANK;
        return parse_at(spec, "nan-rank:", &in->nan, e);
    }
    if (!strncmp(spec, "fail-rank:", 10)) {
        in->mask |= 1u << FS_INJ_FAIL_RANK;
        return parse_at(spec, "fail-rank:", &in->fail, e);
    }
    for (int i = 0; i < FS_INJ_COUNT; i++)
        if (i != FS_INJ_NAN_RANK && i != FS_INJ_FAIL_RANK && !strcmp(spec, cat[i].name)) {
            in->mask |= 1u << i;
            return FS_OK;
        }
    return fs_errf(e, FS_E_INPUT, "--inject: unknown bug '%s' (flux-sim --inject list)", spec);
}

int fs_inject_strikes(const fs_inject_at *at, int rank, const char *module, int step)
{
    return rank == at->rank && step == at->step && !strcmp(module, at->module);
}

/* AdaLN modulation linears: norm1.linear, norm1_context.linear (double blocks), norm.linear
 * (single blocks), norm_out.linear. */
static int is_adaln_linear(const char *m)
{
    return strstr(m, "norm1.linear") || strstr(m, "norm1_context.linear") || strstr(m, ".norm.linear") ||
           !strcmp(m, "norm_out.linear");
}

/* q, k, v (and the context stream's add_*_proj): what fused-qkv-contiguous cuts (fs_weights.c) */
static int is_qkv_linear(const char *m)
{
    static const char *const tails[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                                        "attn.add_v_proj"};
    size_t ml = strlen(m);
    for (size_t i = 0; i < FS_ARRAY_LEN(tails); i++) {
        size_t tl = strlen(tails[i]);
        if (ml >= tl && !strcmp(m + ml - tl, tails[i])) return 1;
    }
    return 0;
}

void fs_inject_tp_split(const fs_inject *in, const char *module, int T, int t, fs_tp_split *s)
{
    if (!in || T < 2) return;
    if (fs_injected(in, FS_INJ_PROJ_OUT_CONTIGUOUS) && s->style == FS_TP_PACKED_ROWWISE && s->K) {
        /* seed 000 TP-1: columns [t·K/T, (t+1)·K/T) of the [attn | mlp] input, as if it were one
         * contiguous row-parallel input; the rank's input is still [attn_t | mlp_t] */
        s->nc = 1;
        s->c[0][0] = t * (s->K / T);
        s->c[0][1] = (t + 1) * (s->K / T);
        fs_inject_fire(FS_INJ_PROJ_OUT_CONTIGUOUS);
    }
    if (fs_injected(in, FS_INJ_ADALN_SHARDED) && s->style == FS_TP_REPLICATE && is_adaln_linear(module) && s->K &&
        s->K % T == 0) {
        s->style = FS_TP_ROWWISE; /* each rank its slice of SiLU(temb) and of W's columns ... */
        s->nc = 1;
        s->c[0][0] = t * (s->K / T);
        s->c[0][1] = (t + 1) * (s->K / T);
        s->input_replicated = 1;
        s->reduce = 0; /* ... and no all-reduce: every rank modulates with its own partial sum */
        fs_inject_fire(FS_INJ_ADALN_SHARDED);
    }
    if (fs_injected(in, FS_INJ_MISSING_ALLREDUCE) && s->reduce) {
        s->reduce = 0; /* partial + bias, as is */
        fs_inject_fire(FS_INJ_MISSING_ALLREDUCE);
    }
    if (fs_injected(in, FS_INJ_ROWWISE_BIAS_EVERY_RANK) && s->reduce) {
        s->bias_before_reduce = 1;
        fs_inject_fire(FS_INJ_ROWWISE_BIAS_EVERY_RANK);
    }
    /* fused-qkv-contiguous cuts the weights themselves (fs_weights_shard): it acts on exactly the
     * q/k/v Linears the plan splits colwise */
    if (fs_injected(in, FS_INJ_FUSED_QKV_CONTIGUOUS) && s->style == FS_TP_COLWISE && is_qkv_linear(module))
        fs_inject_fire(FS_INJ_FUSED_QKV_CONTIGUOUS);
}

int fs_inject_lse_layout_assumed(const fs_inject *in, int declared)
{
    /* FS_LSE_BHS = 0, FS_LSE_BSH = 1 (fs_backend.h) */
    if (!fs_injected(in, FS_INJ_LSE_LAYOUT)) return declared;
    fs_inject_fire(FS_INJ_LSE_LAYOUT);
    return !declared;
}

/* ---------------------------------------------------------------- refusal and "never fired" */

/* Why a requirement is not met here ("cannot fire"). */
static const char *missing_why(unsigned bit)
{
    switch (bit) {
    case N_RANKS2: return "a single rank broadcasts nothing";
    case N_TP: return "there is no tensor parallelism (--tp 1): the TP plan is never consulted";
    case N_ULY: return "there is no Ulysses all-to-all (--ulysses 1)";
    case N_RING: return "there is no ring attention (--ring 1)";
    case N_P2P: return "the ring rotates by all-gather: no receive is outstanding while a chunk is computed on";
    case N_SP: return "the sequence is not split (--ulysses 1 --ring 1): every rank holds every position";
    case N_GUID: return "the model has no guidance embedder: no guidance value is broadcast";
    default: return "?";
    }
}

static int64_t tokens_of(const fs_par *p, int q) { return fs_par_txt_n(p, q) + fs_par_img_n(p, q); }

/* rows [lo, lo+n) of ids [S, 3] (float64, host) equal rows [0, n)? */
static int ids_same_as_start(const struct fs_inputs *inp, int img, int64_t lo, int64_t n)
{
    const fs_tensor *t = img ? &inp->img_ids : &inp->txt_ids;
    if (!lo || !n || !t->data || t->dtype != FS_F64 || t->ndim != 2) return 1;
    const int64_t w = t->shape[1];
    const double *d = t->data;
    for (int64_t i = 0; i < n * w; i++)
        if (d[lo * w + i] != d[i]) return 0;
    return 1;
}

static int all_zero(const fs_tensor *t)
{
    if (!t->data || t->dtype != FS_F64) return 0;
    const double *d = t->data;
    for (int64_t i = 0; i < fs_tensor_numel(t); i++)
        if (d[i] != 0) return 0;
    return 1;
}

/* Fills `why` and returns 1 when bug i, armed, changes nothing in this layout and shape. */
static int harmless(int i, const fs_inject *in, const fs_par *p, const fs_config *c, const struct fs_inputs *inp,
                    char *why, size_t n)
{
    const unsigned nd = cat[i].needs;
    if (nd & H_RING_UNEVEN) {
        int64_t lo = INT64_MAX, hi = 0;
        for (int j = 0; j < p->ring; j++) {
            int64_t t = fs_seqpar_ring_chunk(p, j);
            lo = t < lo ? t : lo;
            hi = t > hi ? t : hi;
        }
        if (lo == hi) {
            snprintf(why, n, "the sequence divides evenly over the %d ring ranks (%lld tokens each), so no chunk is "
                             "padded",
                     p->ring, (long long)lo);
            return 1;
        }
    }
    if (nd & H_ULY_UNEVEN) {
        int uneven = 0;
        int64_t t0 = tokens_of(p, 0);
        for (int j = 0; j < p->ring; j++)
            for (int w = 1; w < p->ulysses; w++)
                if (tokens_of(p, j * p->ulysses + w) != tokens_of(p, j * p->ulysses)) uneven = 1;
        if (!uneven) {
            snprintf(why, n, "the sequence divides evenly over the %d Ulysses ranks (%lld tokens each), so the "
                             "all-to-all's equal blocks need no padding",
                     p->ulysses, (long long)t0);
            return 1;
        }
    }
    if (nd & H_MULTIHEAD) {
        const int h = c->num_attention_heads / (p->tp * p->ulysses);
        int64_t maxq = 0;
        for (int j = 0; j < p->ring; j++) {
            int64_t t = fs_seqpar_ring_chunk(p, j);
            maxq = t > maxq ? t : maxq;
        }
        if (h == 1 || maxq <= 1) {
            snprintf(why, n, "each rank's ring attention has %s, so an LSE laid out (B,S,H) is the same memory as "
                             "(B,H,S)",
                     h == 1 ? "one head" : "one query token");
            return 1;
        }
    }
    if (nd & H_IDS_MOVE) {
        int moves = 0;
        for (int q = 0; q < p->sp && !moves; q++)
            moves = !ids_same_as_start(inp, 1, p->img_lo[q], fs_par_img_n(p, q)) ||
                    !ids_same_as_start(inp, 0, p->txt_lo[q], fs_par_txt_n(p, q));
        if (!moves) {
            snprintf(why, n, "every rank's token ids equal those at the start of the sequence, so local and global "
                             "positions give the same RoPE");
            return 1;
        }
    }
    /* the broadcast values: only world rank 0 holds them under these injections (the others keep
     * zeros); the CLI's agreement makes rank 0's verdict every rank's */
    if ((nd & H_VALUE) && p->rank == 0) {
        const fs_tensor *t = i == FS_INJ_GUIDANCE_TEMP_BCAST ? &inp->guidance : &inp->timesteps;
        if (all_zero(t)) {
            snprintf(why, n, "every %s value is 0, which is what the ranks != 0 keep",
                     i == FS_INJ_GUIDANCE_TEMP_BCAST ? "guidance" : "timestep");
            return 1;
        }
    }
    (void)in;
    return 0;
}

int fs_inject_refuse(const fs_inject *in, const fs_par *p, const fs_config *c, const struct fs_inputs *inp, fs_err *e)
{
    if (!in || !in->mask) return FS_OK;
    char lay[128], why[512], spec[256];
    fs_par_describe(p, lay, sizeof lay);
    for (int i = 0; i < FS_INJ_COUNT; i++) {
        if (!fs_injected(in, (fs_inj_id)i)) continue;
        const unsigned nd = cat[i].needs;
        const fs_inject_at *at = i == FS_INJ_NAN_RANK ? &in->nan : i == FS_INJ_FAIL_RANK ? &in->fail : NULL;
        if (at)
            snprintf(spec, sizeof spec, "%.*s:%d:%.160s:%d", (int)strcspn(cat[i].name, ":"), cat[i].name, at->rank,
                     at->module, at->step);
        else snprintf(spec, sizeof spec, "%s", cat[i].name);
        const int have[] = {[0] = p->world >= 2,
                            [1] = p->tp >= 2,
                            [2] = p->ulysses >= 2,
                            [3] = p->ring >= 2,
                            [4] = p->ring >= 2 && p->rotate == FS_RING_P2P,
                            [5] = p->sp >= 2,
                            [6] = inp->has_guidance};
        for (int b = 0; b < 7; b++)
            if ((nd & (1u << b)) && !have[b])
                return fs_errf(e, FS_E_INPUT, "--inject %s cannot fire under %s: %s; it shows under %s", spec, lay,
                               missing_why(1u << b), cat[i].shows);
        if (at && (at->rank >= p->world || at->step >= inp->n_steps))
            return fs_errf(e, FS_E_INPUT, "--inject %s cannot fire under %s: %s; it shows under %s", spec, lay,
                           at->rank >= p->world ? "this run has no such rank" : "this run has no such step", cat[i].shows);
        if (harmless(i, in, p, c, inp, why, sizeof why))
            return fs_errf(e, FS_E_INPUT, "--inject %s fires but cannot change anything under %s with %d text + %d image "
                                          "tokens: %s; it shows under %s",
                           spec, lay, p->S_txt, p->S_img, why, cat[i].shows);
    }
    return FS_OK;
}

int fs_inject_after_run(const fs_inject *in, const fs_group *world, fs_err *e)
{
    if (!in || !in->mask) return FS_OK;
    unsigned mine = fired | (fs_inject_nan_fired ? 1u << FS_INJ_NAN_RANK : 0), *all = NULL, any = 0;
    if (world && world->size > 1) {
        if (!(all = malloc(sizeof(unsigned) * (size_t)world->size))) return fs_errf(e, FS_E_NOMEM, "out of memory");
        fs_allgather_bytes(world, &mine, sizeof mine, all);
        for (int r = 0; r < world->size; r++) any |= all[r];
        free(all);
    } else
        any = mine;
    for (int i = 0; i < FS_INJ_COUNT; i++) {
        if (!fs_injected(in, (fs_inj_id)i) || !(cat[i].needs & REPORTS) || (any >> i & 1u)) continue;
        if (i == FS_INJ_NAN_RANK || i == FS_INJ_FAIL_RANK) {
            const fs_inject_at *at = i == FS_INJ_NAN_RANK ? &in->nan : &in->fail;
            return fs_errf(e, FS_E_INPUT, "--inject %.*s:%d:%s:%d never fired: no rank %d, no module '%s' recorded, or "
                                          "no step %d in this run (module paths as in a dump's `order`)",
                           (int)strcspn(cat[i].name, ":"), cat[i].name, at->rank, at->module, at->step, at->rank,
                           at->module, at->step);
        }
        return fs_errf(e, FS_E_INPUT, "--inject %s never fired in this run: the code it corrupts never ran (e.g. a --plan "
                                      "without the split it needs), so this is no clean pass; it shows under %s",
                       cat[i].name, cat[i].shows);
    }
    return FS_OK;
}
