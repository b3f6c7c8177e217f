#include "fs_estimate.h"

#include "fs_gemm.h"    /* fs_gemm_bf16_native: whether a bf16 GEMM of M rows makes float32 copies */
#include "fs_weights.h"   /* FS_STREAM_AUTO_BYTES */

#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Saturating arithmetic: a request of 64 x 2^23 tokens x 10^6 steps must report "more than
 * anything", never wrap around to a small number that passes the check. */
static uint64_t add(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t mul3(uint64_t a, uint64_t b, uint64_t c) { return mul(mul(a, b), c); }
static uint64_t max2(uint64_t a, uint64_t b) { return a > b ? a : b; }
static uint64_t min2(uint64_t a, uint64_t b) { return a < b ? a : b; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Elements of a Linear [out, in] with bias, split by the built-in TP plan's style. */
typedef enum { REP, COL, ROW } split;
static uint64_t lin(uint64_t in, uint64_t out, split s, uint64_t T)
{
    switch (s) {
    case COL: return add(mul(in, out / T), out / T); /* rows and bias rows split */
    case ROW: return add(mul(in / T, out), out);     /* columns split, bias whole (added once) */
    default: return add(mul(in, out), out);
    }
}

/* This rank's weight elements under the built-in plan (fs_plan.c's default_plan): attention
 * q/k/v and MLP up-projections colwise, out-projections rowwise, single-block proj_out packed
 * rowwise; everything else replicated (AdaLN linears included, as in the seed's TP: "AdaLN norm
 * linears are replicated"). Split into what stays made while streaming (embedders, norm_out,
 * proj_out) and one double and one single block. */
typedef struct welems { uint64_t top, dbl, sgl; } welems;
/* FLUX.2 (fs_flux2.c, the built-in FLUX.2 plan): no biases; the three shared modulations stay
 * made with the embedders; q/k/v, add_*_proj colwise, to_out.0/to_add_out/linear_out rowwise,
 * linear_in [2F, D] and to_qkv_mlp_proj [3D + 2F, D] packed colwise, to_out [D, D + F] packed
 * rowwise: every block Linear's elements divide by T. */
static welems weight_elems_parts_flux2(const fs_config *c, uint64_t T)
{
    const uint64_t D = (uint64_t)fs_config_hidden(c), F = (uint64_t)fs_config_mlp_hidden(c),
                   Dh = (uint64_t)c->attention_head_dim, tg = (uint64_t)c->timestep_guidance_channels;
    uint64_t top = add(mul((uint64_t)c->in_channels, D), mul((uint64_t)c->joint_attention_dim, D));
    top = add(top, mul(add(mul(tg, D), mul(D, D)), c->guidance_embeds ? 2 : 1));
    top = add(top, mul(15 * D, D));                                       /* modulations 6D + 6D + 3D */
    top = add(top, add(mul(2 * D, D), mul(D, (uint64_t)c->out_channels))); /* norm_out, proj_out */
    uint64_t dbl = add(mul(8, mul(D, D / T)), 4 * Dh);                    /* attention, QK norms */
    dbl = add(dbl, mul(2, add(mul(2 * F / T, D), mul(F / T, D))));      /* ff, ff_context */
    uint64_t sgl = add(add(mul((3 * D + 2 * F) / T, D), mul(D, (D + F) / T)), 2 * Dh);
    return (welems){top, dbl, sgl};
}

static welems weight_elems_parts(const fs_config *c, uint64_t T)
{
    if (c->family == FS_FLUX2) return weight_elems_parts_flux2(c, T);
    const uint64_t D = (uint64_t)c->num_attention_heads * (uint64_t)c->attention_head_dim, F = 4 * D,
                   Dh = (uint64_t)c->attention_head_dim;
    uint64_t top = add(add(lin((uint64_t)c->in_channels, D, REP, 1), lin((uint64_t)c->joint_attention_dim, D, REP, 1)),
                       add(lin(256, D, REP, 1), lin(D, D, REP, 1)));
    if (c->guidance_embeds) top = add(top, add(lin(256, D, REP, 1), lin(D, D, REP, 1)));
    top = add(top, add(lin((uint64_t)c->pooled_projection_dim, D, REP, 1), lin(D, D, REP, 1)));
    uint64_t dbl = mul(2, lin(D, 6 * D, REP, 1));                          /* norm1, norm1_context */
    dbl = add(dbl, mul(6, lin(D, D, COL, T)));                             /* to_q/k/v, add_q/k/v_proj */
    dbl = add(dbl, mul(2, lin(D, D, ROW, T)));                             /* to_out.0, to_add_out */
    dbl = add(dbl, 4 * Dh);                                                /* QK norms */
    dbl = add(dbl, mul(2, add(lin(D, F, COL, T), lin(F, D, ROW, T))));     /* ff, ff_context */
    uint64_t sgl = add(lin(D, 3 * D, REP, 1), mul(3, lin(D, D, COL, T)));
    sgl = add(sgl, add(2 * Dh, lin(D, F, COL, T)));
    sgl = add(sgl, lin(D + F, D, ROW, T));                                 /* packed rowwise: columns split */
    top = add(top, add(lin(D, 2 * D, REP, 1), lin(D, (uint64_t)c->out_channels, REP, 1))); /* norm_out, proj_out */
    return (welems){top, dbl, sgl};
}

static uint64_t weight_elems(const fs_config *c, uint64_t T)
{
    const welems w = weight_elems_parts(c, T);
    return add(w.top, add(mul((uint64_t)c->num_layers, w.dbl), mul((uint64_t)c->num_single_layers, w.sgl)));
}

/* Matmul FLOPs of one forward on a rank holding Si image + St text tokens (of Sg in all) under
 * TP degree T, counted as bench_forward counts them: 2·in·out per row of every Linear, 4·Sq·Skv·D
 * per attention (QKᵀ and P·V). Sequence parallelism leaves a rank its own queries against every
 * key: 4·B·S·Sg·D/T. */
static double forward_flops_flux2(const fs_config *c, double B, double Si, double St, double Sg, double T)
{
    const double D = fs_config_hidden(c), F = fs_config_mlp_hidden(c), Dl = D / T, Fl = F / T, S = Si + St,
                 tg = c->timestep_guidance_channels;
    double f = 2 * (Si * c->in_channels * D + St * (double)c->joint_attention_dim * D);
    f += 2 * ((tg * D + D * D) * (c->guidance_embeds ? 2 : 1) + 15 * D * D);       /* embedders, modulations */
    const double dbl = 2 * S * (3 * D * Dl + Dl * D + D * 2 * Fl + Fl * D) + 4 * S * Sg * Dl;
    const double sgl = 2 * S * (D * (3 * Dl + 2 * Fl) + (Dl + Fl) * D) + 4 * S * Sg * Dl;
    f += c->num_layers * dbl + c->num_single_layers * sgl;
    f += 2 * (D * 2 * D + Si * D * c->out_channels);
    return B * f;
}

static double forward_flops(const fs_config *c, double B, double Si, double St, double Sg, double T)
{
    if (c->family == FS_FLUX2) return forward_flops_flux2(c, B, Si, St, Sg, T);
    const double D = (double)c->num_attention_heads * c->attention_head_dim, F = 4 * D, Dl = D / T, Fl = F / T,
                 S = Si + St, Cin = c->in_channels, Cout = c->out_channels;
    double f = 2 * (Si * Cin * D + St * (double)c->joint_attention_dim * D);          /* x/context embedder */
    f += 2 * ((256.0 * D + D * D) * (c->guidance_embeds ? 2 : 1) + (double)c->pooled_projection_dim * D + D * D);
    const double dbl = 2 * (2 * D * 6 * D) + 2 * S * (3 * D * Dl + Dl * D + D * Fl + Fl * D) + 4 * S * Sg * Dl;
    const double sgl = 2 * D * 3 * D + 2 * S * (3 * D * Dl + D * Fl + (Dl + Fl) * D) + 4 * S * Sg * Dl;
    f += c->num_layers * dbl + c->num_single_layers * sgl;
    f += 2 * (D * 2 * D + Si * D * Cout);                                              /* norm_out, proj_out */
    return B * f;
}

/* Elements of every dataset one step of a full dump records (global shapes). Mirrors what
 * fs_flux1.c and fs_sampler.c record; tests/test_estimate.c checks it against a real dump. */
/* FLUX.2: what fs_flux2.c records (../shared/reference/flux2-tiny/README.md lists it) */
static uint64_t dump_step_elems_flux2(const fs_config *c, uint64_t B, uint64_t Si, uint64_t St)
{
    const uint64_t D = (uint64_t)fs_config_hidden(c), F = (uint64_t)fs_config_mlp_hidden(c),
                   Dh = (uint64_t)c->attention_head_dim, S = Si + St, Cin = (uint64_t)c->in_channels,
                   tg = (uint64_t)c->timestep_guidance_channels;
    uint64_t n = mul(2, mul3(B, Si, Cin));                          /* latents_in, latents_out */
    n = add(n, mul3(B, S, D));                                      /* x_embedder, context_embedder */
    uint64_t vec = mul(add(tg, 4 * D), c->guidance_embeds ? 2 : 1); /* time_proj(@1) + embedders (4 each) */
    vec = add(vec, D + 33 * D + 3 * D);                             /* time_guidance_embed, modulations, norm_out */
    n = add(n, mul(B, vec));
    n = add(n, mul3(2, S, Dh));                                     /* pos_embed#0/#1, pos_embed@1#0/#1 */
    const uint64_t dbl = add(mul(mul(B, Si), add(13 * D, 4 * F)), mul(mul(B, St), add(12 * D, 4 * F)));
    const uint64_t sgl = mul(mul(B, S), add(9 * D, 4 * F));
    n = add(n, add(mul((uint64_t)c->num_layers, dbl), mul((uint64_t)c->num_single_layers, sgl)));
    n = add(n, mul3(2, mul(B, Si), D));                             /* norm_out.norm, norm_out */
    n = add(n, mul3(B, Si, (uint64_t)c->out_channels));             /* proj_out */
    return n;
}

static uint64_t dump_step_elems(const fs_config *c, uint64_t B, uint64_t Si, uint64_t St)
{
    if (c->family == FS_FLUX2) return dump_step_elems_flux2(c, B, Si, St);
    const uint64_t D = (uint64_t)c->num_attention_heads * (uint64_t)c->attention_head_dim, F = 4 * D,
                   Dh = (uint64_t)c->attention_head_dim, S = Si + St, Cin = (uint64_t)c->in_channels,
                   Cout = (uint64_t)c->out_channels;
    uint64_t n = mul3(B, Si, Cin);                                  /* latents_in */
    n = add(n, mul3(B, Si, D));                                     /* x_embedder */
    n = add(n, mul3(B, St, D));                                     /* context_embedder */
    uint64_t temb = add(256, 4 * D);                                /* time_proj + timestep_embedder (4) */
    if (c->guidance_embeds) temb = add(temb, add(256, 4 * D));      /* time_proj@1 + guidance_embedder */
    temb = add(temb, 5 * D);                                        /* text_embedder (4) + time_text_embed */
    n = add(n, mul(B, temb));
    n = add(n, mul3(2, S, Dh));                                     /* pos_embed#0, #1 */
    /* double block: 11 vectors per stream (AdaLN silu, linear (6D), chunks #1..#4); image stream
     * 14 [Si, D] + 3 [Si, F], text stream 13 [St, D] + 3 [St, F] (see the list in the header) */
    uint64_t dbl = add(mul(B, 22 * D), add(mul(mul(B, Si), add(14 * D, 3 * F)), mul(mul(B, St), add(13 * D, 3 * F))));
    /* single block: silu, linear (3D), chunk #1; 10 [S, D] + 2 [S, F] */
    uint64_t sgl = add(mul(B, 5 * D), mul(mul(B, S), add(10 * D, 2 * F)));
    n = add(n, add(mul((uint64_t)c->num_layers, dbl), mul((uint64_t)c->num_single_layers, sgl)));
    n = add(n, add(mul(B, 3 * D), mul3(2, mul(B, Si), D)));         /* norm_out: silu, linear, norm, out */
    n = add(n, mul3(B, Si, Cout));                                  /* proj_out */
    n = add(n, mul3(B, Si, Cin));                                   /* latents_out */
    return n;
}

static int check_phases(const fs_estimate_req *r, fs_estimate *out, fs_err *e);

/* FLUX.2's KV cache, step 0 (fs_flux2.c): the blocks run on [reference; noise] (Sig + R image
 * tokens) and record it; latents_in/out, norm_out and proj_out hold the noise alone; the
 * reference's embedding is recorded as each module's next call (time_proj, the timestep and
 * guidance embedders, time_guidance_embed, the image and single-stream modulations: fs_select.c
 * flux2_names). */
static uint64_t dump_step0_kv_elems(const fs_config *c, uint64_t B, uint64_t Sig, uint64_t St, uint64_t R)
{
    const uint64_t D = (uint64_t)fs_config_hidden(c), Cin = (uint64_t)c->in_channels,
                   Cout = (uint64_t)c->out_channels, tg = (uint64_t)c->timestep_guidance_channels;
    uint64_t n = dump_step_elems(c, B, Sig + R, St);
    n -= mul3(B, R, add(2 * Cin, add(2 * D, Cout)));                 /* noise only: latents, norm_out, proj_out */
    const uint64_t ref = add(mul(add(tg, 4 * D), c->guidance_embeds ? 2 : 1), D + 13 * D + 7 * D);
    return add(n, mul(B, ref));
}

/* --text replicated: what fs_seqpar.c's joint_attention holds on top of the block's q, k, v and
 * output, in elements (it frees everything when it returns). si, St: this rank's image and (all)
 * text tokens; Sui: its Ulysses group's image tokens gathered (si without Ulysses); hb = Dl/U, one
 * token of a head block. Alive from the start: the text's head block sliced locally (tq, tk, tv:
 * 3·St·hb), the image rows copied out (iq, ik, iv: 3·si·Dl), under Ulysses their exchanged head
 * blocks (qu, ku, vu: 3·Sui·hb), the joint queries and output (qa, oa: 2·(Sui + St)·hb). Then
 * either the joined keys and values (ka, va: 2·(Sui + St)·hb, kept to the end) or the ring (its
 * partial output and LSEs, the image chunks gathered or double-buffered, the chunk the text joins
 * (jkc, jvc), --pad's copies: freed when the ring returns); then the output's image and text rows
 * (io, to), under Ulysses the image rows back to tokens (ix: si·Dl, through a send/receive pair)
 * and the text heads all-gathered (St·Dl). The scatter of q, k, v holds less than the end does. */
static uint64_t joint_attention_elems(uint64_t B, uint64_t si, uint64_t St, uint64_t Sui, uint64_t Dl, uint64_t Dh,
                                      uint64_t U, uint64_t R, uint64_t Sig0, int p2p, int pad)
{
    const uint64_t hb = Dl / U, Sq = add(Sui, St), BSq = mul(B, Sq);
    uint64_t common = add(mul3(3 * B, St, hb), mul3(3 * B, si, Dl));
    if (U > 1) common = add(common, mul3(3 * B, Sui, hb));
    common = add(common, mul3(2, BSq, hb));
    uint64_t post = mul3(B, Sq, hb); /* io, to */
    if (U > 1) post = add(post, add(mul3(B, si, Dl), max2(add(mul3(B, Sui, hb), mul3(B, si, Dl)), mul3(B, St, Dl))));
    if (R < 2) return add(common, add(mul3(2, BSq, hb), post));
    uint64_t ring = add(mul(BSq, hb), mul3(2, BSq, hb / Dh)); /* partial output, two LSEs (as the sharded path) */
    const uint64_t maxn = Sui;                                /* a ring chunk: a Ulysses group's image tokens */
    ring = add(ring, p2p ? mul3(4 * B, maxn, hb) : mul3(2 * B, pad ? mul(R, maxn) : Sig0, hb));
    ring = add(ring, mul3(2 * B, add(maxn, St), hb)); /* the step the text joins: [text | chunk] */
    if (pad && mul(R, maxn) != Sig0) /* uneven chunks: own K/V padded; mask: a chunk cut to its keys */
        ring = add(ring, mul3(pad == 1 ? 4 * B : 2 * B, maxn, hb));
    return add(common, max2(ring, post));
}

/* FLUX.2's KV cache (fs_layers.c kv_attention): its attention's own buffers, in elements, on top
 * of the block's q, k, v and output and of the cache itself. One rank (or TP): step 0 ("extract",
 * S tokens with the R reference ones) slices q into text, image and their concatenation, and
 * attends with the reference queries apart: 3·(S − R) + 2·R rows of Dl; a later step ("cached",
 * S1 tokens) builds [text | reference | image] keys and values: 2·(S1 + R) rows, with the slices
 * of the second under way (S1 + St + R). Under Ulysses (kv_attention_ulysses) the exchange is the
 * sharded path's (6·B·S·Dl, counted there) plus the reference's queries and output (2·R rows) or
 * the joined keys and values (2·(U·S1 + R) rows) of one head block (Dl/U). The larger of the two
 * steps, each at step 0's live set: a bound, higher than the later steps' by at most R·(D + 9·Dl)
 * a row. */
static uint64_t kv_attention_elems(uint64_t B, uint64_t S, uint64_t St, uint64_t R, uint64_t S1, uint64_t Dl, uint64_t U)
{
    if (U > 1) return mul3(2 * B, add(mul(U, S1), R), Dl / U);
    const uint64_t extract = add(mul(3, S > R ? S - R : 0), 2 * R), cached = add(add(mul(3, S1), 3 * R), St);
    return mul3(B, max2(extract, cached), Dl);
}

int fs_estimate_compute(const fs_estimate_req *r, fs_estimate *out, fs_err *e)
{
    memset(out, 0, sizeof *out);
    if (!r->cfg) return fs_errf(e, FS_E_INPUT, "estimate: no config");
    int rc = fs_config_validate(r->cfg, r->config_src ? r->config_src : "config", e);
    if (rc) return rc;
    if (r->dtype_size != 2 && r->dtype_size != 4 && r->dtype_size != 8)
        return fs_errf(e, FS_E_INPUT, "estimate: dtype size %d is not 2, 4 or 8", r->dtype_size);
    if (r->batch < 1 || r->img_tokens < 0 || r->txt_tokens < 0 || r->steps < 0 || r->tp < 0 || r->ulysses < 0 ||
        r->ring < 0 || r->threads < 0)
        return fs_errf(e, FS_E_INPUT, "estimate: batch %d, tokens %" PRId64 " + %" PRId64 ", steps %d, tp %d, ulysses %d, "
                                      "ring %d, threads %d: none may be negative, batch >= 1",
                       r->batch, r->img_tokens, r->txt_tokens, r->steps, r->tp, r->ulysses, r->ring, r->threads);
    const fs_config *c = r->cfg;
    const uint64_t es = (uint64_t)r->dtype_size, B = (uint64_t)r->batch;
    const int64_t tp = r->tp ? r->tp : 1, U = r->ulysses ? r->ulysses : 1, R = r->ring ? r->ring : 1, sp = U * R;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const uint64_t threads = r->threads ? (uint64_t)r->threads : (uint64_t)(ncpu > 0 ? ncpu : 1);
    /* F: the MLP up-projection's width per token (FLUX.2's SwiGLU linear_in makes [gate | up]:
     * 2·mlp_hidden); FLUX.2's blocks have their own phases below (flux2_dbl, flux2_sgl) */
    const uint64_t D = (uint64_t)c->num_attention_heads * (uint64_t)c->attention_head_dim,
                   F = c->family == FS_FLUX2 ? 2 * (uint64_t)fs_config_mlp_hidden(c) : 4 * D,
                   Dh = (uint64_t)c->attention_head_dim, Dl = D / (uint64_t)tp, Fl = F / (uint64_t)tp;
    /* The options of issue 20 and the KV cache (fs_estimate_req): what each changes.
     *  --text replicated: a sequence-parallel rank holds every text token (fs_par_set_seq), so its
     *    streams, blocks and ids are St = all of them; its attention runs the joint path
     *    (fs_seqpar.c joint_attention: its own buffers, below).
     *  --pad: torch.chunk's ceil-sized chunks — rank 0 holds ceil(S/P) of each stream, as the
     *    balanced split's largest chunk does, so the per-rank tokens do not change; the Ulysses
     *    blocks and ring chunks are padded to the longest (below).
     *  true CFG: two calls a step, one after the other; the second on the negative prompt (of its
     *    own length on one rank; as long as the prompt under sequence parallelism, fs_sample).
     *    The activations are the larger call's; the velocity of the first is kept meanwhile.
     *  --cfg-parallel: each rank runs one of the two calls (its group's layout is tp x ulysses x
     *    ring); --cfg-batched: one forward of batch 2B on one rank.
     *  reference images (FLUX.2 KV cache): step 0's image stream is [reference; noise], split over
     *    the sequence-parallel ranks as one stream (fs_sample's par0); its activations are the
     *    run's largest, and every block keeps the reference's K and V from then on. */
    const int repl = r->text_replicated && sp > 1, pad = r->pad && sp > 1, cfg = r->true_cfg,
              cfgpar = cfg && r->cfg_parallel, cfgbat = cfg && !cfgpar && r->cfg_batched;
    const uint64_t Rref = r->ref_tokens > 0 ? (uint64_t)r->ref_tokens : 0;
    const int64_t txt_act = cfg && r->neg_txt_tokens > r->txt_tokens ? r->neg_txt_tokens : r->txt_tokens;
    /* Bf: the batch of one forward (--cfg-batched: both calls' rows) */
    const uint64_t Bf = cfgbat ? 2 * B : B;
    /* this rank's tokens: the largest chunk of the balanced split (fs_par_set_seq); Si at step 0
     * (with the reference tokens), Si1 at the later steps (the noise: the sampler's slice) */
    const uint64_t Si = (uint64_t)ceil_div(r->img_tokens + (int64_t)Rref, sp),
                   Si1 = (uint64_t)ceil_div(r->img_tokens, sp),
                   St = repl ? (uint64_t)txt_act : (uint64_t)ceil_div(txt_act, sp),
                   S = Si + St, Sg = (uint64_t)r->img_tokens + Rref + (uint64_t)txt_act;
    out->tokens_rank = (int64_t)S;
    out->params = fs_config_num_params(c);

    /* weights: all of this rank's shard, or (streaming) what stays made plus the largest block */
    const uint64_t wT = r->full_weights ? 1 : (uint64_t)tp;
    const welems we = weight_elems_parts(c, wT);
    out->weight_resident_bytes = mul(weight_elems(c, wT), es);
    out->block_weight_bytes = mul(max2(c->num_layers ? we.dbl : 0, c->num_single_layers ? we.sgl : 0), es);
    /* --stream auto (-1): on when the rank's block parameters in the split it runs exceed
     * FS_STREAM_AUTO_BYTES (main_flux_sim.c decides the same way, from the store) */
    const welems wr = weight_elems_parts(c, (uint64_t)tp);
    const uint64_t blocks = mul(add(mul((uint64_t)c->num_layers, wr.dbl), mul((uint64_t)c->num_single_layers, wr.sgl)), es);
    out->streamed = r->stream < 0 ? blocks > (uint64_t)FS_STREAM_AUTO_BYTES : r->stream > 0;
    out->weight_bytes = out->streamed ? add(mul(we.top, es), out->block_weight_bytes) : out->weight_resident_bytes;
    /* a parameter stored in another dtype than the run's is read with pread through a bounce
     * buffer of at most 1 MiB and converted (fs_st_read; no page of the mapping is touched: a
     * truncated file is an error, not SIGBUS); one stored as the run computes is a view or read
     * straight into its tensor (counted in weight_bytes) */
    const uint64_t largest_param = mul(max2(max2(mul(6 * D, D), mul(D + F, D)), mul((uint64_t)c->joint_attention_dim, D)),
                                       (uint64_t)r->ckpt_dtype_size);
    if (r->ckpt_dtype_size > 0 && r->views_converted) /* the largest, an AdaLN linear [6D, D] */
        out->staging_bytes = largest_param;
    else if (r->ckpt_dtype_size > 0 && (uint64_t)r->ckpt_dtype_size != es)
        out->staging_bytes = min2((uint64_t)1 << 20, largest_param);

    /* fs_inputs (whole on every rank): noise, text embeddings, pooled, ids (f64), guidance,
     * sigmas, timesteps; the sampler's latents, this rank's slice and the velocity */
    const uint64_t Sig = (uint64_t)r->img_tokens, Stg = (uint64_t)r->txt_tokens, Cin = (uint64_t)c->in_channels;
    uint64_t in = mul(add(add(mul3(B, Sig, Cin), mul3(B, Stg, (uint64_t)c->joint_attention_dim)),
                          mul(B, (uint64_t)c->pooled_projection_dim)), es);
    in = add(in, mul3(Sig + Stg, (uint64_t)fs_config_axes(c), 8));
    in = add(in, mul(add(B, mul(2, (uint64_t)r->steps + 1)), 8));
    in = add(in, mul(add(mul3(2, B, mul(Sig, Cin)), mul3(B, Si1, Cin)), es)); /* latents, v (global); slice */
    if (cfg) { /* the negative prompt (its embeddings, pooled vector, ids; the scale) */
        const uint64_t Sng = (uint64_t)r->neg_txt_tokens;
        in = add(in, add(mul(add(mul3(B, Sng, (uint64_t)c->joint_attention_dim), mul(B, (uint64_t)c->pooled_projection_dim)), es),
                         add(mul3(Sng, (uint64_t)fs_config_axes(c), 8), 8)));
        /* the velocities: sequential, the first call's v while the second runs; --cfg-parallel, this
         * rank's and both gathered ([2B]) at the exchange; --cfg-batched, the batch-2B latents,
         * text and pooled copies through the forward (the 2B output comes after the peak) */
        if (cfgbat)
            in = add(in, mul(add(mul3(2 * B, Si1, Cin), mul(2 * B, add(mul(St, (uint64_t)c->joint_attention_dim),
                                                                      (uint64_t)c->pooled_projection_dim))), es));
        else in = add(in, mul(mul3(cfgpar ? 2 * B : B, Si1, Cin), es));
    }
    if (Rref) /* the reference latents and ids (global), and step 0's [reference; noise] rows of
               * this rank with the two parts they are copied from (fs_sample) */
        in = add(in, add(mul(add(mul3(B, Rref, Cin), mul3(2, B, mul(Si, Cin))), es), mul3(Rref, (uint64_t)fs_config_axes(c), 8)));
    out->input_bytes = in;

    /* persistent: X, CX, temb, ids (f64), cos/sin; H from the first single block on; the KV
     * cache's K and V of every block (this rank's heads: Dl/U under Ulysses, every reference token) */
    out->kv_cache_bytes = Rref ? mul(mul3(2 * ((uint64_t)c->num_layers + (uint64_t)c->num_single_layers), B, Rref),
                                     mul(Dl / (uint64_t)U, es))
                               : 0;
    const uint64_t pers_dbl = add(add(mul(add(mul3(Bf, S, D), mul(Bf, D)), es), add(mul3(S, 3, 8), mul(mul3(2, S, Dh), es))),
                                  out->kv_cache_bytes);
    const uint64_t pers_sgl = add(pers_dbl, mul(mul3(Bf, S, D), es));

    /* attention scratch: one score block per thread (float64: [256, Skv]; float32 and bf16, which
     * runs the float32 kernel: the fused kernel's [256, min(Skv, 512)] floats), plus SP buffers */
    const uint64_t h_dh = Dl / (uint64_t)U; /* one token of a Ulysses head block */
    /* the image tokens of a replicated-text rank's Ulysses group, gathered; a padded ring chunk */
    const uint64_t Sig0 = (uint64_t)r->img_tokens + Rref, Sui = U > 1 ? (pad ? mul(Si, U) : min2(mul(Si, U), Sig0)) : Si;
    const uint64_t maxn = repl ? Sui : mul(S, (uint64_t)U);
    uint64_t Skv = R > 1 ? (uint64_t)ceil_div((int64_t)Sg, R) : (U > 1 ? Sg : S);
    if (repl) Skv = R > 1 ? add(maxn, St) : add(Sui, St); /* the text joins one step's keys, or all of them */
    const uint64_t score = es == 8 ? mul(mul3(threads, 256, Skv ? Skv : 1), es)
                                   : mul(mul3(threads, 256, Skv ? min2(Skv, 512) : 1), 4);
    uint64_t scratch = score;
    uint64_t spbuf = 0;
    if (repl) spbuf = joint_attention_elems(Bf, Si, St, Sui, Dl, Dh, (uint64_t)U, (uint64_t)R, Sig0, r->ring_p2p, r->pad);
    else {
        /* --pad under Ulysses: the exchanged blocks are padded to the group's longest, rank 0's own
         * (S tokens: the 6·B·S·Dl below already); --pad mask's compaction copies K, then V, after
         * the exchange, when q, k, v and the copy are alive (4 of the 6 units): nothing more */
        if (U > 1) spbuf = add(spbuf, mul(mul3(6, Bf, S), Dl)); /* q, k, v, o head-sharded + a2a send/recv */
        if (R > 1) {
            const uint64_t Su = mul(S, (uint64_t)U); /* ring runs on the Ulysses layout */
            spbuf = add(spbuf, add(mul3(Bf, Su, h_dh), mul3(2, Bf, mul(Su, h_dh / Dh)))); /* partial output, two LSEs */
            if (!pad)
                spbuf = add(spbuf, r->ring_p2p ? mul(mul3(4, Bf, ceil_div((int64_t)Sg, R)), h_dh) : mul(mul3(2, Bf, Sg), h_dh));
            else /* --pad: every chunk at the longest (maxn = U·S), gathered or double-buffered; when
                  * the chunks are uneven, a shorter rank's own K and V copied to it (inject_pad_chunks)
                  * and, --pad mask, each padded chunk cut to its real keys (ring_step_at: one K and V
                  * copy at a time) */
                spbuf = add(spbuf, mul(mul3(Bf, add(r->ring_p2p ? 4 : mul(2, (uint64_t)R),
                                                    mul((uint64_t)R, maxn) == Sg ? 0 : r->pad == 1 ? 4 : 2),
                                            maxn),
                                       h_dh));
        }
    }
    if (Rref) spbuf = add(spbuf, kv_attention_elems(Bf, S, St, Rref, Si1 + St, Dl, (uint64_t)U));
    scratch = add(scratch, mul(spbuf, es));
    out->attn_scratch_bytes = scratch;

    /* The blocks' phases (header): what is alive at each, in elements on top of the persistent
     * part, and (bf16) the float32 copies the op running there makes. The peak is the largest
     * phase, copies included: a copy lives only while its op runs, so adding the largest copy to
     * the largest live set (as before 2026-11-28) counts two moments as one. */
    const uint64_t es2 = es == 2, BS = mul(Bf, S), BSi = mul(Bf, Si), BSt = mul(Bf, St);
    /* a bf16 GEMM of M rows is widened to float32 (copies of x, W and y) unless oneDNN's bf16
     * matmul serves it (AMX; AVX512-BF16 alone below FS_GEMM_BF16_WIDEN_M rows), whose working
     * memory (the weight reordered into its blocked layout, primitive cache, JIT code) it does
     * not report: counted as a float32 copy of W, which bounds the blocked bf16 copy (a bf16
     * --tp 2 --check rank of 80 tokens, every GEMM through oneDNN: 110 MiB measured, 96 without
     * it, 2026-11-28) */
    const int wide_i = es2 && !fs_gemm_bf16_native((int64_t)BSi), wide_j = es2 && !fs_gemm_bf16_native((int64_t)BS),
              wide_t = es2 && !fs_gemm_bf16_native((int64_t)BSt);
    const uint64_t n2 = 2; /* FLUX.1 keeps norm2 beside its modulated output */
    typedef struct { uint64_t live, copy, scratch; } phase; /* elements, float32 elements, bytes */
    /* double block (fs_joint_attention, then the MLPs): the attention's intermediates are freed
     * when it returns, before the MLPs */
    const uint64_t mods = mul3(12, Bf, D); /* FLUX.1's per-block modulation chunks */
    const phase flux1_dbl[] = {
        /* SDPA: the modulated inputs, q/k/v and normed q/k per stream, the joint q/k/v and the
         * output; the kernel upcasts q, k, v, o */
        {add(mul(BS, add(D, 9 * Dl)), mods), mul(BS, 4 * Dl), scratch},
        /* the output projections: + the output's two slices and to_out/to_add_out's outputs */
        {add(mul(BS, add(2 * D, 10 * Dl)), mods), es2 ? add(wide_i ? mul(BSi, add(Dl, D)) : 0, mul(D, Dl)) : 0, 0},
        /* the image MLP's activation: xm, cm and both attention outputs, norm2 (FLUX.1) and the
         * modulated input, the hidden before and after it; the element-wise op upcasts both */
        {add(add(mul(BS, 2 * D), mul(BSi, add(n2 * D, 2 * Fl))), mods), es2 ? mul(BSi, 2 * Fl) : 0, 0},
        /* its down projection: + its output (widened: x, W, y in float32) */
        {add(add(mul(BS, 2 * D), mul(BSi, add((n2 + 1) * D, 2 * Fl))), mods),
         es2 ? add(wide_i ? mul(BSi, add(Fl, D)) : 0, mul(Fl, D)) : 0, 0},
        /* the text MLP: the image's norm2/modulated input/MLP output stay until the block returns */
        {add(add(mul(BS, add(2 * D, (n2 + 1) * D)), mul(BSt, 2 * Fl)), mods), es2 ? mul(BSt, 2 * Fl) : 0, 0},
    };
    const uint64_t m3 = mul3(3, Bf, D);
    const phase flux1_sgl[] = {
        /* the MLP activation: modulated input, MLP hidden before and after (upcast both) */
        {add(mul(BS, add(D, 2 * Fl)), m3), es2 ? mul(BS, 2 * Fl) : 0, 0},
        /* SDPA: + q, k, v, normed q, k, the output */
        {add(mul(BS, add(add(D, 2 * Fl), 6 * Dl)), m3), mul(BS, 4 * Dl), scratch},
        /* proj_out (to_out) and the block's end: its output, the concatenation, the recorded
         * text/image slices (widened: proj_out's x, W, y in float32) */
        {add(mul(BS, add(add(3 * D, 3 * Fl), 7 * Dl)), m3),
         es2 ? add(wide_j ? add(mul(BS, add(Dl, Fl)), mul(BS, D)) : 0, mul(D, add(Dl, Fl))) : 0, 0},
    };
    /* FLUX.2 (fs_flux2.c), measured 2026-11-28 by the heap's live bytes at each step of the
     * blocks (flux2-default, 32x32 image + 256 text, batch 2, fp32: the single block's peak is
     * 34 units of B·S·D above its entry, where the FLUX.1 phases with F = 2·mlp_hidden counted 28:
     * 140 MiB estimated, 164-176 MiB peak RSS). Fm: mlp_hidden per token on this rank. A block's
     * tensors (t[] in double_block and single_block) are all freed when it returns, not when their
     * op is done, and fs_swiglu holds gate, up, silu(gate) and the product at once (4·Fm) on top
     * of linear_in's [gate | up] (2·Fm). */
    const uint64_t Fm = Fl / 2;
    const phase flux2_dbl[] = {
        /* SDPA and the output projections: as FLUX.1's (the modulations are persistent) */
        {mul(BS, add(D, 9 * Dl)), mul(BS, 4 * Dl), scratch},
        {mul(BS, add(2 * D, 10 * Dl)), es2 ? add(wide_i ? mul(BSi, add(Dl, D)) : 0, mul(D, Dl)) : 0, 0},
        /* the image SwiGLU: xm, cm, both attention outputs; norm2's modulated input, linear_in's
         * [gate | up] (2·Fm); fs_swiglu's gate and up, silu(gate) (bf16: silu upcasts its input
         * and output), then the product (bf16 mul: no copies) */
        {add(mul(BS, 2 * D), mul(BSi, add(D, 5 * Fm))), es2 ? mul(BSi, 2 * Fm) : 0, 0},
        {add(mul(BS, 2 * D), mul(BSi, add(D, 6 * Fm))), 0, 0},
        /* linear_out: [gate | up], the product and its output (widened: x, W, y in float32) */
        {add(mul(BS, 2 * D), mul(BSi, add(2 * D, 3 * Fm))), es2 ? add(wide_i ? mul(BSi, add(Fm, D)) : 0, mul(Fm, D)) : 0, 0},
        /* the text's: the image's modulated input and MLP output stay until the block returns */
        {add(mul(BS, 2 * D), add(mul(BSi, 2 * D), mul(BSt, add(D, 5 * Fm)))), es2 ? mul(BSt, 2 * Fm) : 0, 0},
        {add(mul(BS, 2 * D), add(mul(BSi, 2 * D), mul(BSt, add(D, 6 * Fm)))), 0, 0},
        {add(mul(BS, 2 * D), add(mul(BSi, 2 * D), mul(BSt, add(2 * D, 3 * Fm)))),
         es2 ? add(wide_t ? mul(BSt, add(Fm, D)) : 0, mul(Fm, D)) : 0, 0},
    };
    const phase flux2_sgl[] = {
        /* to_qkv_mlp_proj: the modulated input and [q | k | v | gate | up] (widened: x, W, y) */
        {mul(BS, add(D, add(3 * Dl, 2 * Fm))),
         es2 ? add(wide_j ? mul(BS, add(D, add(3 * Dl, 2 * Fm))) : 0, mul(D, add(3 * Dl, 2 * Fm))) : 0, 0},
        /* SDPA: + q, k, v and the MLP input copied out of it (3·Dl + 2·Fm), normed q, k, the output */
        {mul(BS, add(add(D, 9 * Dl), 4 * Fm)), mul(BS, 4 * Dl), scratch},
        /* the SwiGLU: + gate, up and silu(gate) (bf16: silu's input and output upcast), then the
         * product: four [.., Fm] */
        {mul(BS, add(add(D, 9 * Dl), 7 * Fm)), es2 ? mul(BS, 2 * Fm) : 0, 0},
        {mul(BS, add(add(D, 9 * Dl), 8 * Fm)), 0, 0},
        /* to_out: + cat[attn, mlp] (Dl + Fm) and its output (widened: x, W, y in float32) */
        {mul(BS, add(add(2 * D, 10 * Dl), 6 * Fm)),
         es2 ? add(wide_j ? add(mul(BS, add(Dl, Fm)), mul(BS, D)) : 0, mul(D, add(Dl, Fm))) : 0, 0},
    };
    const int f2 = c->family == FS_FLUX2;
    const phase *dbl = f2 ? flux2_dbl : flux1_dbl, *sgl = f2 ? flux2_sgl : flux1_sgl;
    const size_t ndbl = f2 ? sizeof flux2_dbl / sizeof *flux2_dbl : sizeof flux1_dbl / sizeof *flux1_dbl,
                 nsgl = f2 ? sizeof flux2_sgl / sizeof *flux2_sgl : sizeof flux1_sgl / sizeof *flux1_sgl;
    uint64_t dlive = 0, dall = 0, slive = 0, sall = 0, dl_dev = 0, sl_dev = 0;
    for (size_t k = 0; k < ndbl; k++) {
        const uint64_t live = mul(dbl[k].live, es);
        dlive = max2(dlive, add(live, dbl[k].scratch));
        dall = max2(dall, add(add(live, dbl[k].scratch), es2 ? mul(dbl[k].copy, 4) : 0));
        dl_dev = max2(dl_dev, live); /* a GPU: flash attention, no score blocks or copies */
    }
    for (size_t k = 0; k < nsgl; k++) {
        const uint64_t live = mul(sgl[k].live, es);
        slive = max2(slive, add(live, sgl[k].scratch));
        sall = max2(sall, add(add(live, sgl[k].scratch), es2 ? mul(sgl[k].copy, 4) : 0));
        sl_dev = max2(sl_dev, live);
    }
    out->act_double_bytes = dlive;
    out->act_single_bytes = slive;
    out->act_persistent_bytes = pers_dbl;
    out->act_peak_bytes = max2(add(pers_dbl, dlive), add(pers_sgl, slive));
    /* bf16 on the CPU (fs_backend_cpu.c): element-wise ops and attention compute in float32
     * copies of their operands, and so does a GEMM widened to float32 (fs_gemm.h): what the peak
     * phase adds, copies included. Measured 2026-11-28 (default config, batch 4, 64x64 tokens,
     * one bf16 rank, 1 thread, AVX512-BF16 without AMX): 355 MiB with fs_gemm's own choice (the
     * large GEMMs widened; this estimate 350). Forcing every GEMM through oneDNN
     * (FS_GEMM_BF16=onednn) measured 299 MiB before 7fc4699's GEMM providers (estimate 291), and
     * 441-497 MiB after them: ~85-120 MiB of it oneDNN's primitive cache (~10 MiB of JIT buffers per
     * GEMM shape), switched off since de1fc9b (fs_gemm.c). What is left, 368-379 MiB against 291, is
     * not modelled: it appears only when the float32 attention GEMMs go through dnnl_sgemm too
     * (FS_GEMM_F32=openblas: 300-308 MiB), is 11 MiB at 32x32 tokens, batch 1, and is not the
     * sgemm's own buffers (4-7 MiB measured alone) nor glibc's (MALLOC_* settings change nothing).
     * An AMX machine runs exactly that combination (OpenBLAS 0.3.21 picks Prescott there too). */
    if (es2) out->bf16_scratch_bytes = max2(add(pers_dbl, dall), add(pers_sgl, sall)) - out->act_peak_bytes;
    /* a GPU rank: every weight of its shard resident, activations in the run dtype, flash
     * attention (no score blocks, no float32 copies) */
    out->device_bytes = add(add(out->weight_resident_bytes, out->input_bytes),
                            max2(add(pers_dbl, dl_dev), add(pers_sgl, sl_dev)));

    /* FLOPs and collectives of one step, for this rank and the job: a step is one forward, or true
     * CFG's two (one after the other; --cfg-batched: one of batch 2B; --cfg-parallel: one per rank,
     * two in the job). With the KV cache the figures are the later steps' (the noise alone; the
     * attention to the cached reference keys not counted): step 0 runs on R more image tokens. */
    const uint64_t Sng = cfg ? (uint64_t)r->neg_txt_tokens : 0, Stp = repl ? Stg : (uint64_t)ceil_div(r->txt_tokens, sp),
                   Stn = repl ? Sng : (uint64_t)ceil_div((int64_t)Sng, sp), Sgp = Sig + Stg, Sgn = Sig + Sng;
    const int seqcfg = cfg && !cfgpar && !cfgbat;
    out->flops_step_rank = forward_flops(c, (double)Bf, (double)Si1, (double)Stp, (double)Sgp, (double)tp);
    if (seqcfg) out->flops_step_rank += forward_flops(c, (double)B, (double)Si1, (double)Stn, (double)Sgn, (double)tp);
    /* the job: replicated text is computed on every sequence-parallel rank */
    out->flops_step = forward_flops(c, (double)B, (double)Sig, (double)(repl ? Stg * (uint64_t)sp : Stg), (double)Sgp,
                                    (double)tp) * (double)tp;
    if (cfg)
        out->flops_step += forward_flops(c, (double)B, (double)Sig, (double)(repl ? Sng * (uint64_t)sp : Sng), (double)Sgn,
                                         (double)tp) * (double)tp;
    {
        const uint64_t L2 = (uint64_t)c->num_layers, L1 = (uint64_t)c->num_single_layers, attn = L2 + L1,
                       H = (uint64_t)c->num_attention_heads, Hl = H / (uint64_t)tp, hb = Hl / (uint64_t)U,
                       nc = seqcfg ? 2 : 1; /* forwards a step on this rank */
        if (tp > 1) /* to_out.0, to_add_out, ff.net.2, ff_context.net.2; single proj_out */
            out->allreduce = (fs_estimate_coll){(4 * L2 + L1) * nc,
                                                add(mul(mul(add(2 * L2, L1), mul3(Bf, Si1 + Stp, D)), es),
                                                    seqcfg ? mul(mul(add(2 * L2, L1), mul3(B, Si1 + Stn, D)), es) : 0)};
        /* rank 0 holds the largest chunk of every split (fs_par_set_seq gives the remainder first).
         * Sx: the tokens a rank puts through the sequence exchange (replicated text: its image
         * tokens only; the text's heads are sliced locally); Su: its Ulysses group's, gathered
         * (--pad: every block at the longest, rank 0's) */
        const uint64_t Sx = repl ? Si1 : Si1 + Stp, Sxg = repl ? Sig : Sgp;
        const uint64_t Su = pad ? mul(Sx, (uint64_t)U) : min2(mul(Sx, (uint64_t)U), Sxg);
        if (U > 1) {
            const uint64_t fwd = mul3(Bf, Sx, Dh * (Hl - hb)), bwd = mul3(Bf, hb * Dh, Su - Sx);
            out->alltoall = (fs_estimate_coll){4 * attn * nc, mul(mul(mul(attn, add(mul(3, fwd), bwd)), es), nc)};
            if (repl) /* the text rows' output heads, all-gathered over the Ulysses group (its own block sent) */
                out->text_gather = (fs_estimate_coll){attn * nc, mul(mul(attn, mul3(Bf, Stp, hb * Dh)), mul(es, nc))};
        }
        if (R > 1) {
            const uint64_t kv = mul3(2, Bf, mul(Su, hb * Dh)); /* K and V of this rank's ring chunk */
            if (r->ring_p2p) /* R-1 rotations, each sends K and V of a chunk (about Su tokens) */
                out->ring = (fs_estimate_coll){2 * (uint64_t)(R - 1) * attn * nc,
                                               mul(mul(mul3(attn, (uint64_t)(R - 1), kv), es), nc)};
            else
                out->ring = (fs_estimate_coll){2 * attn * nc, mul(mul(mul(attn, kv), es), nc)};
        }
        if (cfgpar) /* this rank's velocity [B, Si, C] to its CFG partner and back */
            out->cfg_gather = (fs_estimate_coll){1, mul(mul3(B, Si1, Cin), es)};
    }

    /* The dump. True CFG records the second call's modules too (renamed name@k, fs_sample's
     * cfg_record; latents_in/out once); --cfg-parallel and --cfg-batched replay them under the
     * same names, so the dump is the sequential run's. The KV cache's step 0 records its blocks
     * over [reference; noise] and the reference's embedding (dump_step0_kv_elems); the later steps
     * are plain. --text replicated and --pad record the global tensors as without them (one copy of
     * the text; no pad row): the dump does not change. */
    uint64_t later = dump_step_elems(c, B, Sig, Stg);
    if (cfg) later = add(later, dump_step_elems(c, B, Sig, Sng) - 2 * B * Sig * Cin);
    uint64_t first = Rref ? dump_step0_kv_elems(c, B, Sig, Stg, Rref) : later;
    if (r->modules_narrowed) /* only latents_in and latents_out are sure to be recorded */
        first = later = mul3(2, B, mul(Sig, Cin));
    out->dump_step_bytes = mul(max2(first, later), es);
    uint64_t dump_inputs = add(mul(add(add(mul3(B, Sig, Cin), mul3(B, Stg, (uint64_t)c->joint_attention_dim)),
                                       mul(B, (uint64_t)c->pooled_projection_dim)), es),
                               add(mul3(Sig + Stg, (uint64_t)fs_config_axes(c), 8), mul(add(B, mul(2, (uint64_t)r->steps + 1)), 8)));
    if (cfg) /* negative_encoder_hidden_states, negative_pooled_projections, negative_txt_ids, true_cfg_scale */
        dump_inputs = add(dump_inputs, add(mul(add(mul3(B, Sng, (uint64_t)c->joint_attention_dim),
                                                   mul(B, (uint64_t)c->pooled_projection_dim)), es),
                                           add(mul3(Sng, (uint64_t)fs_config_axes(c), 8), 8)));
    if (Rref) /* image_latents, image_latent_ids */
        dump_inputs = add(dump_inputs, add(mul3(B, Rref, mul(Cin, es)), mul3(Rref, (uint64_t)fs_config_axes(c), 8)));
    const uint64_t rec_steps = r->steps_recorded > 0 && r->steps_recorded < r->steps ? (uint64_t)r->steps_recorded
                                                                                     : (uint64_t)r->steps;
    /* every recorded step (step 0 among them, when a selection leaves the steps unknown here) */
    const uint64_t rec_bytes = rec_steps ? mul(add(first, mul(rec_steps - 1, later)), es) : 0;
    out->dump_bytes = add(add(rec_bytes, dump_inputs), mul3(B, Sig, mul(Cin, es)));
    /* --check in this job: rank 0 stores every reference tensor of every recorded step, in the run dtype */
    if (r->check_in_job) out->check_ref_bytes = rec_bytes;
    /* parallel recording: rank 0 assembles the widest global tensor ([B, S, F]); --check also
     * holds the reference and the assembled tensor as float64 */
    if (r->recording && (tp > 1 || sp > 1)) {
        const uint64_t widest = mul3(B, Sg, F);
        out->gather_bytes = add(mul(widest, es), r->check ? mul3(2, widest, 8) : 0);
    }
    /* --cfg-parallel keeps its call's records of the step (this rank's pieces: local tokens, at
     * most the global width) until the pair replays them; --cfg-batched the negative prompt's
     * half (global) until the forward returns. Host copies, the whole step's by its end: a bound */
    if (r->records && cfgpar)
        out->cfg_kept_bytes = mul(dump_step_elems(c, B, Si1, Stp) - 2 * B * Si1 * Cin, es);
    else if (r->records && cfgbat)
        out->cfg_kept_bytes = mul(dump_step_elems(c, B, Sig, Sng) - 2 * B * Sig * Cin, es);
    out->rank_bytes = add(add(add(r->baseline_bytes, add(out->weight_bytes, out->staging_bytes)),
                              add(out->input_bytes, out->bf16_scratch_bytes)),
                          add(add(out->act_peak_bytes, out->cfg_kept_bytes), add(out->check_ref_bytes, out->gather_bytes)));
    if (r->check_in_job) return check_phases(r, out, e);
    return FS_OK;
}

/* An in-job --check runs on rank 0, before its share of the parallel run, the single-rank
 * reference (main_flux_sim.c step 5: every token, the whole width, its weights streamed as the
 * run's are) and, in bf16, the matched float64 truth of the same problem (record_matched_truth:
 * float64 weights, inputs and activations). Each is a run of its own, estimated as one; what rank
 * 0 keeps grows through them: the reference (check_ref, in the run dtype) from the first on, the
 * truth (float64, the same tensors) from the second. Its peak is the largest phase:
 *   reference   ref.rank_bytes   + check_ref
 *   truth       truth.rank_bytes + check_ref + truth_ref
 *   parallel    rank_bytes (check_ref and gather included) + truth_ref
 * (Before 2026-11-24 only the last was counted: a bf16 --check of FLUX.1-dev was estimated at
 * 1.2 GiB on rank 0, whose float64 truth holds a 2.5 GiB double block.) */
static int check_phases(const fs_estimate_req *r, fs_estimate *out, fs_err *e)
{
    fs_estimate_req s = *r;
    s.tp = s.ulysses = s.ring = 1;
    s.full_weights = 1;
    s.check = s.check_in_job = s.recording = 0;
    /* the reference is the single-rank run: no sequence parallelism, true CFG's calls in sequence */
    s.text_replicated = s.pad = s.cfg_parallel = s.cfg_batched = s.records = 0;
    s.stream = out->streamed; /* fs_weights decides once for the job */
    fs_estimate ref, truth;
    int rc = fs_estimate_compute(&s, &ref, e);
    if (rc) return rc;
    uint64_t run = ref.rank_bytes, truth_ref = 0;
    if (r->dtype_size == 2) {
        s.dtype_size = 8;
        s.views_converted = 1;
        if ((rc = fs_estimate_compute(&s, &truth, e))) return rc;
        truth_ref = out->check_ref_bytes / 2 * 8; /* the same elements in float64 */
        run = max2(run, add(truth.rank_bytes, truth_ref));
    }
    out->truth_ref_bytes = truth_ref;
    out->check_run_bytes = run;
    out->rank_bytes = max2(add(run, out->check_ref_bytes), add(out->rank_bytes, truth_ref));
    return FS_OK;
}

uint64_t fs_estimate_phys_mem(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return 0;
    return mul((uint64_t)pages, (uint64_t)page);
}

/* A run in a container or under ulimit gets killed (or fails to allocate) at its limit, not at
 * the machine's: the refusal must compare with the smallest limit that applies. */
uint64_t fs_estimate_mem_limit(char *what, size_t n)
{
    uint64_t best = fs_estimate_phys_mem();
    snprintf(what, n, "this machine has");
    struct { int res; const char *name; } rl[] = {{RLIMIT_AS, "ulimit -v allows"}, {RLIMIT_DATA, "ulimit -d allows"}};
    for (size_t i = 0; i < sizeof rl / sizeof *rl; i++) {
        struct rlimit lim;
        if (getrlimit(rl[i].res, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && (!best || lim.rlim_cur < best)) {
            best = (uint64_t)lim.rlim_cur;
            snprintf(what, n, "%s", rl[i].name);
        }
    }
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r"); /* cgroup v2; "max" means none */
    unsigned long long cg;
    if (f) {
        if (fscanf(f, "%llu", &cg) == 1 && cg > 0 && (!best || cg < best)) {
            best = cg;
            snprintf(what, n, "the cgroup memory limit is");
        }
        fclose(f);
    }
    return best;
}

const char *fs_estimate_bytes_str(uint64_t n, char *buf, size_t len)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (n == UINT64_MAX) { /* saturated (add, mul): the true amount is at least this */
        snprintf(buf, len, "more than 16 EiB");
        return buf;
    }
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 6) {
        v /= 1024;
        u++;
    }
    if (u == 0) snprintf(buf, len, "%" PRIu64 " B", n);
    else if (v >= 99.95 || (double)(int64_t)(v * 10 + 0.5) == 10 * (double)(int64_t)(v + 0.05))
        snprintf(buf, len, "%.0f %s", v, unit[u]); /* "24 GiB", not "24.0 GiB" */
    else snprintf(buf, len, "%.1f %s", v, unit[u]);
    return buf;
}

/* 4000000 -> "4,000,000" */
static const char *grouped(uint64_t n, char *buf, size_t len)
{
    char d[32];
    int k = snprintf(d, sizeof d, "%" PRIu64, n), o = 0;
    for (int i = 0; i < k && (size_t)o + 2 < len; i++) {
        if (i && (k - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = d[i];
    }
    buf[o] = 0;
    return buf;
}

int fs_estimate_check(const fs_estimate_req *r, const fs_estimate *est, uint64_t mem_bytes, const char *mem_what,
                      uint64_t disk_free, fs_err *e)
{
    if (!mem_what) mem_what = "this machine has";
    char need[32], have[32], a[32], b[32], who[96];
    const uint64_t ranks = r->ranks_per_machine > 1 ? (uint64_t)r->ranks_per_machine : 1;
    const uint64_t total = mul(est->rank_bytes, ranks);
    if (mem_bytes && total > mem_bytes) {
        fs_estimate_bytes_str(mem_bytes, have, sizeof have);
        char per[64] = "per rank";
        if (ranks > 1) snprintf(per, sizeof per, "per rank (%" PRIu64 " ranks on this machine)", ranks);
        const uint64_t act = add(est->act_peak_bytes, est->input_bytes);
        const char *cfg = r->config_src ? r->config_src : "default";
        /* the largest term decides which option the message names */
        if (est->weight_bytes >= act && est->weight_bytes >= est->check_ref_bytes) {
            fs_estimate_bytes_str(mul(est->weight_bytes, ranks), need, sizeof need);
            return fs_errf(e, FS_E_INPUT,
                           "--config %s: %s parameters need ~%s %s for weights in %s; %s %s", cfg,
                           grouped((uint64_t)est->params, a, sizeof a), need, per,
                           r->dtype_size == 8 ? "fp64" : r->dtype_size == 2 ? "bf16" : "fp32", mem_what, have);
        }
        if (est->check_ref_bytes >= act) {
            fs_estimate_bytes_str(est->check_ref_bytes, need, sizeof need);
            return fs_errf(e, FS_E_INPUT,
                           "--check: the single-rank reference of %d steps is kept in memory on rank 0 and needs ~%s; "
                           "%s %s (use --check=REF.h5, or fewer --steps)",
                           r->steps, need, mem_what, have);
        }
        fs_estimate_bytes_str(mul(act, ranks), need, sizeof need);
        const char *what = "image";
        uint64_t tokens = (uint64_t)r->img_tokens;
        if (r->inputs_src) {
            snprintf(who, sizeof who, "--inputs %.60s", r->inputs_src);
            tokens = (uint64_t)(r->img_tokens + r->txt_tokens);
            what = "image + text";
        } else if (r->img_tokens >= r->txt_tokens) {
            snprintf(who, sizeof who, "--grid %dx%d", r->grid_h, r->grid_w);
        } else {
            snprintf(who, sizeof who, "--txt-len %" PRId64, r->txt_tokens);
            tokens = (uint64_t)r->txt_tokens;
            what = "text";
        }
        char bat[48] = "";
        if (r->batch > 1) snprintf(bat, sizeof bat, " at batch %d", r->batch);
        return fs_errf(e, FS_E_INPUT, "%s: %s %s tokens%s need ~%s %s for activations; %s %s", who,
                       grouped(tokens, b, sizeof b), what, bat, need, per, mem_what, have);
    }
    if (r->dump_path && !r->dump_compressed && disk_free != UINT64_MAX && est->dump_bytes > disk_free)
        return fs_errf(e, FS_E_INPUT, "--dump %s: the dump of %d steps will be ~%s; its file system has %s free",
                       r->dump_path, r->steps, fs_estimate_bytes_str(est->dump_bytes, need, sizeof need),
                       fs_estimate_bytes_str(disk_free, have, sizeof have));
    return FS_OK;
}

/* Free bytes of the file system that will hold `path` (its directory); UINT64_MAX if unknown. */
uint64_t fs_estimate_disk_free(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return UINT64_MAX;
    struct statvfs sv;
    int ok = statvfs(dirname(copy), &sv) == 0;
    free(copy);
    return ok ? mul((uint64_t)sv.f_bavail, (uint64_t)sv.f_frsize) : UINT64_MAX;
}

int fs_estimate_refuse(const fs_estimate_req *r, fs_estimate *out, fs_err *e)
{
    fs_estimate local;
    if (!out) out = &local;
    int rc = fs_estimate_compute(r, out, e);
    if (rc) return rc;
    char what[64];
    const uint64_t mem = fs_estimate_mem_limit(what, sizeof what);
    return fs_estimate_check(r, out, mem, what, r->dump_path ? fs_estimate_disk_free(r->dump_path) : UINT64_MAX, e);
}
