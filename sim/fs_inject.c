#include "fs_inject.h"

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

int fs_inject_add(fs_inject *in, const char *spec, fs_err *e)
{
    if (!strncmp(spec, "nan-rank:", 9)) {
        char mod[192];
        int r, st;
        const char *p = spec + 9, *c1 = strchr(p, ':'), *c2 = c1 ? strrchr(c1 + 1, ':') : NULL;
        if (!c1 || !c2 || c2 == c1 || sscanf(p, "%d", &r) != 1 || sscanf(c2 + 1, "%d", &st) != 1 ||
            (size_t)(c2 - c1 - 1) >= sizeof mod || r < 0 || st < 0)
            return fs_errf(e, FS_E_INPUT, "--inject %s: expected nan-rank:RANK:MODULE:STEP", spec);
        memcpy(mod, c1 + 1, (size_t)(c2 - c1 - 1));
        mod[c2 - c1 - 1] = 0;
        in->mask |= 1u << FS_INJ_NAN_RANK;
        in->nan_rank = r;
        in->nan_step = st;
        snprintf(in->nan_module, sizeof in->nan_module, "%s", mod);
        return FS_OK;
    }
    for (int i = 0; i < FS_INJ_COUNT; i++)
        if (i != FS_INJ_NAN_RANK && !strcmp(spec, cat[i].name)) {
            in->mask |= 1u << i;
            return FS_OK;
        }
    return fs_errf(e, FS_E_INPUT, "--inject: unknown bug '%s' (flux-sim --inject list)", spec);
}
