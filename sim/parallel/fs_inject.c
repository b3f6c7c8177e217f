#include "fs_inject.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* THE table: every bug, what it does, where it comes from, what it needs, where it shows.
 * docs/bugs.md's summary reproduces it; docs/detection-matrix.md is its proof by real runs. */
static const fs_inject_info cat[FS_INJ_COUNT] = {
    [FS_INJ_PROJ_OUT_CONTIGUOUS] = {"proj-out-contiguous",
                                    "single-block proj_out row-parallel weight sliced as contiguous columns",
                                    "seed 000 TP-1; sglang#21664", FS_INJ_NEEDS_TP | FS_INJ_REPORTS,
                                    "--tp >= 2, alone or with --ulysses/--ring (e.g. --tp 2), with a plan that splits "
                                    "single-block proj_out packed_rowwise (the built-in one)"},
    [FS_INJ_TIMESTEP_TEMP_BCAST] = {"timestep-temp-bcast", "timesteps broadcast into a temporary: ranks != 0 keep zeros",
                                    "seed 000 TP-2", FS_INJ_NEEDS_RANKS2 | FS_INJ_MATTERS_VALUE,
                                    "every layout of 2 or more ranks (e.g. --tp 2, --ring 2)"},
    [FS_INJ_GUIDANCE_TEMP_BCAST] = {"guidance-temp-bcast", "the guidance value broadcast into a temporary: ranks != 0 keep 0",
                                    "seed 000 TP-2 class", FS_INJ_NEEDS_RANKS2 | FS_INJ_NEEDS_GUID | FS_INJ_MATTERS_VALUE,
                                    "every layout of 2 or more ranks, with a guidance-embedding model (default, tiny, "
                                    "flux-dev) and a non-zero --guidance"},
    [FS_INJ_LSE_LAYOUT] = {"lse-layout", "ring merge reads an LSE laid out (B,S,H) as if (B,H,S)",
                           "seed 001 TP-3; pytorch#171568", FS_INJ_NEEDS_RING | FS_INJ_MATTERS_MULTIHEAD | FS_INJ_REPORTS,
                           "--ring >= 2 (allgather or p2p), alone or with --ulysses/--tp, with more than one head per "
                           "rank (e.g. --ring 2)"},
    [FS_INJ_RING_NO_LSE] = {"ring-no-lse", "ring partials averaged instead of LSE-weighted", "common first attempt",
                            FS_INJ_NEEDS_RING | FS_INJ_REPORTS, "--ring >= 2 (allgather or p2p), alone or with --ulysses/--tp (e.g. --ring 2)"},
    [FS_INJ_ROPE_LOCAL_POS] = {"rope-local-pos", "context-parallel ranks rotate with local instead of global positions",
                               "diffusers#12443 class", FS_INJ_NEEDS_SP | FS_INJ_MATTERS_IDS_MOVE,
                               "--ulysses >= 2 or --ring >= 2, alone or with --tp (e.g. --ring 2, --ulysses 2)"},
    [FS_INJ_ULYSSES_HEAD_ORDER] = {"ulysses-head-order",
                                   "the two Ulysses all-to-alls disagree on which head block goes to which rank", "",
                                   FS_INJ_NEEDS_ULY | FS_INJ_REPORTS, "--ulysses >= 2, alone or with --ring/--tp (e.g. --ulysses 2)"},
    [FS_INJ_ROWWISE_BIAS_EVERY_RANK] = {"rowwise-bias-every-rank", "row-parallel bias added on every rank before the all-reduce",
                                        "", FS_INJ_NEEDS_TP | FS_INJ_REPORTS,
                                        "--tp >= 2, alone or with --ulysses/--ring (e.g. --tp 2), with a plan that has "
                                        "row-parallel Linears (the built-in one)"},
    [FS_INJ_MISSING_ALLREDUCE] = {"missing-allreduce", "row-parallel outputs used without their all-reduce", "",
                                  FS_INJ_NEEDS_TP | FS_INJ_REPORTS,
                                  "--tp >= 2, alone or with --ulysses/--ring (e.g. --tp 2), with a plan that has "
                                  "row-parallel Linears (the built-in one)"},
    [FS_INJ_ADALN_SHARDED] = {"adaln-sharded",
                              "AdaLN modulation linears split row-parallel over TP (each rank its slice of SiLU(temb)) "
                              "without the all-reduce: ranks modulate with different partial sums",
                              "", FS_INJ_NEEDS_TP | FS_INJ_REPORTS,
                              "--tp >= 2, alone or with --ulysses/--ring (e.g. --tp 2), with a plan that replicates "
                              "the AdaLN linears (the built-in one)"},
    [FS_INJ_OVERLAP_EARLY_READ] = {"overlap-early-read",
                                   "ring p2p: the next K/V chunk read before its Irecv completed (deterministically: the "
                                   "stale buffer)",
                                   "seed 003's overlap class", FS_INJ_NEEDS_RING | FS_INJ_NEEDS_P2P | FS_INJ_REPORTS,
                                   "--ring >= 2 --ring-rotate p2p, alone or with --ulysses/--tp (e.g. --ring 2 "
                                   "--ring-rotate p2p); the Ulysses all-to-all form is ulysses-early-read"},
    [FS_INJ_SEQ_UNEVEN_CHUNK] = {"seq-uneven-chunk",
                                 "sequence shards sized like torch.chunk (ceil) and the ring's K/V chunks all-gathered as if "
                                 "equal: padded with zero tokens that attention does not mask",
                                 "seed 002", FS_INJ_NEEDS_RING | FS_INJ_MATTERS_RING_UNEVEN | FS_INJ_NEEDS_NO_PAD | FS_INJ_REPORTS,
                                 "--ring >= 2 with ring chunks of unequal length, alone or with --ulysses/--tp (e.g. --ring 2 "
                                 "--grid 5x7 --txt-len 13); the Ulysses all-to-all form is ulysses-uneven-chunk"},
    [FS_INJ_FUSED_QKV_CONTIGUOUS] = {"fused-qkv-contiguous",
                                     "the fused [q|k|v] weight (BFL qkv / linear1) split contiguously across TP ranks "
                                     "instead of per q, k, v",
                                     "NeMo Automodel#1324", FS_INJ_NEEDS_TP | FS_INJ_REPORTS,
                                     "--tp >= 2, alone or with --ulysses/--ring (e.g. --tp 2), with a plan that splits "
                                     "attn.to_q/to_k/to_v colwise (the built-in one)"},
    [FS_INJ_ULYSSES_UNEVEN_CHUNK] = {"ulysses-uneven-chunk",
                                     "Ulysses all-to-all in torch.chunk-sized equal blocks: short shards zero-padded to "
                                     "the longest, the padding attended as tokens",
                                     "seed 002 under Ulysses", FS_INJ_NEEDS_ULY | FS_INJ_MATTERS_ULY_UNEVEN | FS_INJ_NEEDS_NO_PAD | FS_INJ_REPORTS,
                                     "--ulysses >= 2 with Ulysses shards of unequal length, alone or with --ring/--tp "
                                     "(e.g. --ulysses 2 --grid 5x7 --txt-len 13)"},
    [FS_INJ_ULYSSES_EARLY_READ] = {"ulysses-early-read",
                                   "Ulysses: attention reads the K/V all-to-all receive buffer before the exchange "
                                   "completed (deterministically: the other ranks' blocks as the fresh buffer held them, "
                                   "zeros)",
                                   "seed 003 under Ulysses", FS_INJ_NEEDS_ULY | FS_INJ_REPORTS,
                                   "--ulysses >= 2, alone or with --ring/--tp (e.g. --ulysses 2)"},
    [FS_INJ_PACKED_COLWISE_CONTIGUOUS] = {"packed-colwise-contiguous",
                                          "a packed column-parallel weight (FLUX.2's SwiGLU linear_in [gate|up], the "
                                          "single block's to_qkv_mlp_proj [q|k|v|gate|up]) split as plain colwise: "
                                          "contiguous rows, so a rank's gate and up (or q, k, v) are of other features",
                                          "sglang#21664 class; diffusers PackedColwiseParallel",
                                          FS_INJ_NEEDS_TP | FS_INJ_NEEDS_FLUX2 | FS_INJ_REPORTS,
                                          "--tp >= 2 on a FLUX.2 config (e.g. --config flux2-default --tp 2), with a plan "
                                          "that splits a Linear packed_colwise (the built-in FLUX.2 one)"},
    [FS_INJ_TXT_IDS_LOCAL] = {"txt-ids-local",
                              "the text position ids not split with the text tokens: every sequence-parallel rank "
                              "rotates its text shard with the ids of the text's start (the image ids are right)",
                              "diffusers#12737 (FLUX.2 _cp_plan: 'split will not be applied')",
                              FS_INJ_NEEDS_SP | FS_INJ_MATTERS_TXT_IDS_MOVE,
                              "--ulysses >= 2 or --ring >= 2 on a model whose text tokens have positions (FLUX.2; "
                              "FLUX.1's text ids are all zero), e.g. --config flux2-default --ring 2"},
    [FS_INJ_LSE_BASE2] = {"lse-base2",
                          "ring merge takes a natural-log LSE for base 2 and multiplies it by ln 2 (or a base-2 "
                          "LSE for natural log)",
                          "pytorch#181645 (flex_attention FLASH backend, fix #181824)", FS_INJ_NEEDS_RING | FS_INJ_REPORTS,
                          "--ring >= 2 (allgather or p2p), alone or with --ulysses/--tp (e.g. --ring 2)"},
    [FS_INJ_LSE_SHARD_OFFSET] = {"lse-shard-offset",
                                 "ring merge ignores the LSE's per-shard offset: a kernel's LSE against mean-centred K "
                                 "(lse − scale·q·mean(K_shard)) merged uncorrected, or an uncentred one 'corrected'",
                                 "ROCm/aiter#3334 (AITER Sage K smoothing)", FS_INJ_NEEDS_RING | FS_INJ_REPORTS,
                                 "--ring >= 2 (allgather or p2p), alone or with --ulysses/--tp (e.g. --ring 2); the "
                                 "error grows with the ring degree"},
    [FS_INJ_LSE_LAYOUT_GUESSED] = {"lse-layout-guessed",
                                   "ring code infers the LSE layout from its sizes: when a rank's query tokens equal its "
                                   "heads (S_local == H) it guesses the other vendor's layout and transposes the LSE",
                                   "vllm-omni#5543", FS_INJ_NEEDS_RING | FS_INJ_MATTERS_SQ_EQ_H | FS_INJ_REPORTS,
                                   "--ring >= 2 with some rank's ring-attention query length equal to its local head "
                                   "count (e.g. the default 8 heads, --ring 2 --grid 2x4 --txt-len 8: 8 tokens a rank)"},
    [FS_INJ_CFG_UNCOND_SEES_COND] = {"cfg-uncond-sees-cond",
                                     "CFG parallel: the negative prompt's rank group runs its transformer call on the "
                                     "prompt's cached text states instead of the negative prompt's (the pooled vector "
                                     "stays the negative one)",
                                     "vllm-omni#3646 (B23: the condition's KV cache leaked into the unconditional pass)",
                                     FS_INJ_NEEDS_CFGPAR | FS_INJ_REPORTS,
                                     "--cfg-parallel --true-cfg-scale S, with any inner layout (e.g. -np 2 "
                                     "--cfg-parallel --true-cfg-scale 4)"},
    [FS_INJ_REPLICATED_TEXT_ROTATED] = {"replicated-text-rotated",
                                        "replicated text sent round the ring as if sharded: the replicated-token "
                                        "dispatch is keyed on the Ulysses degree, so with --ulysses 1 every ring chunk "
                                        "carries the whole text and each rank attends it once per ring rank",
                                        "sglang#33327 (B4)",
                                        FS_INJ_NEEDS_RING | FS_INJ_NEEDS_TXT_REP | FS_INJ_NEEDS_ULY1 | FS_INJ_REPORTS,
                                        "--text replicated --ring >= 2 --ulysses 1, alone or with --tp (e.g. --text "
                                        "replicated --ring 2)"},
    [FS_INJ_JOINT_KV_WRONG_STEP] = {"joint-kv-wrong-step",
                                    "the replicated text K/V joined to the ring's keys at every ring step instead of "
                                    "once (the step condition of --joint front/rear dropped): the text counted ring "
                                    "times",
                                    "xDiT#611 (B2), vllm-omni#4689 (B3)",
                                    FS_INJ_NEEDS_RING | FS_INJ_NEEDS_TXT_REP | FS_INJ_REPORTS,
                                    "--text replicated --ring >= 2, alone or with --ulysses/--tp, --joint front or rear "
                                    "(e.g. --text replicated --ring 2 --joint rear)"},
    [FS_INJ_REPLICATED_KV_A2A] = {"replicated-kv-a2a",
                                  "the replicated text K/V sent through the Ulysses all-to-all with the image tokens "
                                  "instead of head-sliced locally: every receiver gets one copy of the text keys per "
                                  "Ulysses rank",
                                  "vllm-omni#6930 (B6), vllm-omni#1233 (B7)",
                                  FS_INJ_NEEDS_ULY | FS_INJ_NEEDS_TXT_REP | FS_INJ_REPORTS,
                                  "--text replicated --ulysses >= 2, alone or with --ring/--tp (e.g. --text replicated "
                                  "--ulysses 2)"},
    [FS_INJ_A2A_WORLD_GROUP] = {"a2a-world-group",
                                "USP: the Ulysses all-to-all run over the whole sequence-parallel group instead of "
                                "the Ulysses subgroup: every rank gathers the whole sequence with heads/(ulysses·ring) "
                                "heads, and the ring then merges its peers' K/V of other heads",
                                "sglang#33353 (B5)",
                                FS_INJ_NEEDS_ULY | FS_INJ_NEEDS_RING | FS_INJ_NEEDS_TXT_SHARD | FS_INJ_NEEDS_HEADS_SP |
                                    FS_INJ_REPORTS,
                                "--ulysses >= 2 --ring >= 2 (either --mesh-order), alone or with --tp, with the heads "
                                "divisible by tp·ulysses·ring (e.g. --ulysses 2 --ring 2)"},
    [FS_INJ_SHARD_FLOOR_DROP] = {"shard-floor-drop",
                                 "the sequence split in dim // world tokens a rank: the remainder tokens at the end are "
                                 "held by no rank, silently dropped from the run",
                                 "VeOmni#1139 (B11)", FS_INJ_NEEDS_SP | FS_INJ_MATTERS_SP_UNEVEN | FS_INJ_REPORTS,
                                 "--ulysses >= 2 or --ring >= 2 with a text or image length not divisible by "
                                 "ulysses·ring (e.g. --ring 2 --grid 5x7 --txt-len 13)"},
    [FS_INJ_PAD_MASK_IGNORED] = {"pad-mask-ignored",
                                 "--pad mask, but the attention backend takes the key mask through **kwargs and drops "
                                 "it: the zero pad keys enter every softmax",
                                 "VeOmni#1140 (B12)",
                                 FS_INJ_NEEDS_SP | FS_INJ_NEEDS_PAD_MASK | FS_INJ_MATTERS_SP_UNEVEN | FS_INJ_REPORTS,
                                 "--pad mask under --ulysses >= 2 or --ring >= 2 with some padding (a length not "
                                 "divisible by the degree, e.g. --ring 2 --grid 5x7 --txt-len 13 --pad mask)"},
    [FS_INJ_NAN_RANK] = {"nan-rank:RANK:MODULE:STEP", "one element of MODULE's output becomes NaN on RANK at STEP",
                         "seed 003's symptom", FS_INJ_NEEDS_AT | FS_INJ_REPORTS,
                         "every layout that has rank RANK, with STEP < --steps and MODULE a recorded module"},
    [FS_INJ_FAIL_RANK] = {"fail-rank:RANK:MODULE:STEP",
                          "a fault, not a bug: RANK fails with an out-of-memory error at MODULE, STEP while the others "
                          "wait in a collective (the job must end, naming the rank, not hang)",
                          "", FS_INJ_NEEDS_AT | FS_INJ_REPORTS, "every layout that has rank RANK, with STEP < --steps and MODULE a recorded module"},
};

int fs_inject_nan_fired;
static unsigned fired; /* bit per fs_inj_id: the hook acted on this rank */

void fs_inject_fire(fs_inj_id id) { fired |= 1u << id; }

unsigned fs_inject_fired_mask(void) { return fired | (fs_inject_nan_fired ? 1u << FS_INJ_NAN_RANK : 0); }

const fs_inject_info *fs_inject_info_of(fs_inj_id id) { return id >= 0 && id < FS_INJ_COUNT ? &cat[id] : NULL; }

const char *fs_inject_catalogue(void)
{
    static char buf[16384];
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

int fs_inject_lse_layout_assumed(const fs_inject *in, int declared, int64_t S, int64_t H)
{
    /* FS_LSE_BHS = 0, FS_LSE_BSH = 1 (fs_backend.h) */
    if (fs_injected(in, FS_INJ_LSE_LAYOUT)) {
        fs_inject_fire(FS_INJ_LSE_LAYOUT);
        return !declared;
    }
    /* lse-layout-guessed: the sizes of [B, ?, ?] tell (B,H,S) from (B,S,H) only when S != H; when
     * they cannot (and transposing moves something: H > 1), the guess is the layout the code was
     * written for — the other vendor's */
    if (fs_injected(in, FS_INJ_LSE_LAYOUT_GUESSED) && S == H && H > 1) {
        fs_inject_fire(FS_INJ_LSE_LAYOUT_GUESSED);
        return !declared;
    }
    return declared;
}

int fs_inject_lse_base_assumed(const fs_inject *in, int declared)
{
    /* FS_LSE_LN = 0, FS_LSE_LOG2 = 1 */
    if (!fs_injected(in, FS_INJ_LSE_BASE2)) return declared;
    fs_inject_fire(FS_INJ_LSE_BASE2);
    return !declared;
}

int fs_inject_lse_offset_assumed(const fs_inject *in, int declared)
{
    /* FS_LSE_ABS = 0, FS_LSE_MEAN_K = 1 */
    if (!fs_injected(in, FS_INJ_LSE_SHARD_OFFSET)) return declared;
    fs_inject_fire(FS_INJ_LSE_SHARD_OFFSET);
    return !declared;
}

