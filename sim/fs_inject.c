#include "fs_inject.h"

#include "fs_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name, *what, *source;
} cat[FS_INJ_COUNT] = {
    [FS_INJ_PROJ_OUT_CONTIGUOUS] = {"proj-out-contiguous",
                                    "single-block proj_out row-parallel weight sliced as contiguous columns",
                                    "seed 000 TP-1; sglang#21664"},
    [FS_INJ_TIMESTEP_TEMP_BCAST] = {"timestep-temp-bcast", "timesteps broadcast into a temporary: ranks != 0 keep zeros",
                                    "seed 000 TP-2"},
    [FS_INJ_GUIDANCE_TEMP_BCAST] = {"guidance-temp-bcast", "the guidance value broadcast into a temporary: ranks != 0 keep 0",
                                    "seed 000 TP-2 class"},
    [FS_INJ_LSE_LAYOUT] = {"lse-layout", "ring merge reads an LSE laid out (B,S,H) as if (B,H,S)",
                           "seed 001 TP-3; pytorch#171568"},
    [FS_INJ_RING_NO_LSE] = {"ring-no-lse", "ring partials averaged instead of LSE-weighted", "common first attempt"},
    [FS_INJ_ROPE_LOCAL_POS] = {"rope-local-pos", "context-parallel ranks rotate with local instead of global positions",
                               "diffusers#12443 class"},
    [FS_INJ_ULYSSES_HEAD_ORDER] = {"ulysses-head-order",
                                   "the two Ulysses all-to-alls disagree on which head block goes to which rank", ""},
    [FS_INJ_ROWWISE_BIAS_EVERY_RANK] = {"rowwise-bias-every-rank", "row-parallel bias added on every rank before the all-reduce",
                                        ""},
    [FS_INJ_MISSING_ALLREDUCE] = {"missing-allreduce", "row-parallel outputs used without their all-reduce", ""},
    [FS_INJ_ADALN_SHARDED] = {"adaln-sharded",
                              "AdaLN modulation linears split row-parallel over TP (each rank its slice of SiLU(temb)) "
                              "without the all-reduce: ranks modulate with different partial sums",
                              ""},
    [FS_INJ_OVERLAP_EARLY_READ] = {"overlap-early-read",
                                   "ring p2p: the next K/V chunk read before its Irecv completed (deterministically: the "
                                   "stale buffer)",
                                   "seed 003's overlap class"},
    [FS_INJ_SEQ_UNEVEN_CHUNK] = {"seq-uneven-chunk",
                                 "sequence shards sized like torch.chunk (ceil) and the ring's K/V chunks all-gathered as if "
                                 "equal: padded with zero tokens that attention does not mask",
                                 "seed 002"},
    [FS_INJ_FUSED_QKV_CONTIGUOUS] = {"fused-qkv-contiguous",
                                     "the fused [q|k|v] weight (BFL qkv / linear1) split contiguously across TP ranks "
                                     "instead of per q, k, v",
                                     "NeMo Automodel#1324"},
    [FS_INJ_NAN_RANK] = {"nan-rank:RANK:MODULE:STEP", "one element of MODULE's output becomes NaN on RANK at STEP",
                         "seed 003's symptom"},
    [FS_INJ_FAIL_RANK] = {"fail-rank:RANK:MODULE:STEP",
                          "a fault, not a bug: RANK fails with an out-of-memory error at MODULE, STEP while the others "
                          "wait in a collective (the job must end, naming the rank, not hang)",
                          ""},
};

int fs_inject_nan_fired;

const char *fs_inject_catalogue(void)
{
    static char buf[4096];
    size_t o = 0;
    for (int i = 0; i < FS_INJ_COUNT; i++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "  %-26s %s%s%s%s\n", cat[i].name, cat[i].what,
                              *cat[i].source ? " [" : "", cat[i].source, *cat[i].source ? "]" : "");
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

void fs_inject_tp_split(const fs_inject *in, const char *module, int T, int t, fs_tp_split *s)
{
    if (!in || T < 2) return;
    if (fs_injected(in, FS_INJ_PROJ_OUT_CONTIGUOUS) && s->style == FS_TP_PACKED_ROWWISE && s->K) {
        /* seed 000 TP-1: columns [t·K/T, (t+1)·K/T) of the [attn | mlp] input, as if it were one
         * contiguous row-parallel input; the rank's input is still [attn_t | mlp_t] */
        s->nc = 1;
        s->c[0][0] = t * (s->K / T);
        s->c[0][1] = (t + 1) * (s->K / T);
    }
    if (fs_injected(in, FS_INJ_ADALN_SHARDED) && s->style == FS_TP_REPLICATE && is_adaln_linear(module) && s->K &&
        s->K % T == 0) {
        s->style = FS_TP_ROWWISE; /* each rank its slice of SiLU(temb) and of W's columns ... */
        s->nc = 1;
        s->c[0][0] = t * (s->K / T);
        s->c[0][1] = (t + 1) * (s->K / T);
        s->input_replicated = 1;
        s->reduce = 0; /* ... and no all-reduce: every rank modulates with its own partial sum */
    }
    if (fs_injected(in, FS_INJ_MISSING_ALLREDUCE) && s->reduce) s->reduce = 0; /* partial + bias, as is */
    if (fs_injected(in, FS_INJ_ROWWISE_BIAS_EVERY_RANK) && s->reduce) s->bias_before_reduce = 1;
}

int fs_inject_lse_layout_assumed(const fs_inject *in, int declared)
{
    /* FS_LSE_BHS = 0, FS_LSE_BSH = 1 (fs_backend.h) */
    return fs_injected(in, FS_INJ_LSE_LAYOUT) ? !declared : declared;
}
