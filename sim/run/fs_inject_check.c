#include "fs_inject_check.h"

#include "fs_seqpar.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The validator of --inject against a run (fs_inject_check.h): it reads THE table
 * (fs_inject_info_of, sim/parallel/fs_inject.c) against the layout, the partition and the
 * inputs. It sits in run/, above the model, because it needs all three and a collective; the
 * hooks it checks stay in parallel/, a leaf the lower layers include. */

/* Why a requirement is not met here ("cannot fire"). */
static const char *missing_why(unsigned bit)
{
    switch (bit) {
    case FS_INJ_NEEDS_RANKS2: return "a single rank broadcasts nothing";
    case FS_INJ_NEEDS_TP: return "there is no tensor parallelism (--tp 1): the TP plan is never consulted";
    case FS_INJ_NEEDS_ULY: return "there is no Ulysses all-to-all (--ulysses 1)";
    case FS_INJ_NEEDS_RING: return "there is no ring attention (--ring 1)";
    case FS_INJ_NEEDS_P2P: return "the ring rotates by all-gather: no receive is outstanding while a chunk is computed on";
    case FS_INJ_NEEDS_SP: return "the sequence is not split (--ulysses 1 --ring 1): every rank holds every position";
    case FS_INJ_NEEDS_GUID: return "the model has no guidance embedder: no guidance value is broadcast";
    case FS_INJ_NEEDS_TXT_REP:
        return "the text is not replicated (--text sharded, or no sequence parallelism): no text K/V join the "
               "attention locally";
    case FS_INJ_NEEDS_ULY1:
        return "with --ulysses >= 2 a dispatch keyed on the Ulysses degree takes the replicated-text path, which is "
               "right";
    case FS_INJ_NEEDS_TXT_SHARD:
        return "the text is replicated: its heads are sliced locally, and only the image tokens are exchanged";
    case FS_INJ_NEEDS_HEADS_SP:
        return "the local heads do not divide by ulysses·ring: an all-to-all over the whole sequence-parallel group "
               "cannot split them (it fails loudly, not silently)";
    case FS_INJ_NEEDS_PAD_MASK: return "the sequence is not padded with a key mask (--pad mask): there is no mask to drop";
    case FS_INJ_NEEDS_NO_PAD:
        return "the layout pads already (--pad): its pad keys are masked (--pad mask; the mask's bug is "
               "pad-mask-ignored) or attended by design (--pad nomask)";
    case FS_INJ_NEEDS_FLUX2:
        return "the model is FLUX.1: none of its Linears is packed column-parallel (FLUX.2's linear_in and "
               "to_qkv_mlp_proj are)";
    case FS_INJ_NEEDS_CFGPAR:
        return "the cond and uncond passes are not on separate rank groups (no --cfg-parallel, or no true CFG)";
    default: return "?";
    }
}

/* Tokens SP rank q puts through the exchange (under --text replicated its image tokens only). */
static int64_t tokens_of(const fs_par *p, int q)
{
    return (fs_seqpar_text_joins(p) ? 0 : fs_par_txt_n(p, q)) + fs_par_img_n(p, q);
}

/* Query tokens of ring member j's attention: its chunk, and the replicated text that joins it. */
static int64_t ring_queries(const fs_par *p, int j)
{
    return fs_seqpar_ring_chunk(p, j) + (fs_seqpar_text_joins(p) ? p->S_txt : 0);
}

/* rows [lo, lo+n) of ids [S, 3] (float64, host) equal rows [0, n)? */
static int ids_same_as_start(const fs_inputs *inp, int img, int64_t lo, int64_t n)
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
static int harmless(int i, const fs_inject *in, const fs_par *p, const fs_config *c, const fs_inputs *inp,
                    char *why, size_t n)
{
    const unsigned nd = fs_inject_info_of((fs_inj_id)i)->needs;
    if (nd & FS_INJ_MATTERS_RING_UNEVEN) {
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
    if (nd & FS_INJ_MATTERS_ULY_UNEVEN) {
        int uneven = 0;
        int64_t t0 = tokens_of(p, 0);
        for (int j = 0; j < p->ring; j++)
            for (int w = 1; w < p->ulysses; w++)
                if (tokens_of(p, fs_par_sp_of(p, w, j)) != tokens_of(p, fs_par_sp_of(p, 0, j))) uneven = 1;
        if (!uneven) {
            snprintf(why, n, "the sequence divides evenly over the %d Ulysses ranks (%lld tokens each), so the "
                             "all-to-all's equal blocks need no padding",
                     p->ulysses, (long long)t0);
            return 1;
        }
    }
    if ((nd & FS_INJ_MATTERS_SP_UNEVEN) && !(p->S_img % p->sp) &&
        (fs_seqpar_text_joins(p) || !(p->S_txt % p->sp))) {
        snprintf(why, n, "the %s divide%s evenly over the %d sequence-parallel ranks: nothing is padded or left over",
                 fs_seqpar_text_joins(p) ? "image tokens" : "text and image tokens", fs_seqpar_text_joins(p) ? "" : "",
                 p->sp);
        return 1;
    }
    if (nd & FS_INJ_MATTERS_MULTIHEAD) {
        const int h = c->num_attention_heads / (p->tp * p->ulysses);
        int64_t maxq = 0;
        for (int j = 0; j < p->ring; j++) {
            int64_t t = ring_queries(p, j);
            maxq = t > maxq ? t : maxq;
        }
        if (h == 1 || maxq <= 1) {
            snprintf(why, n, "each rank's ring attention has %s, so an LSE laid out (B,S,H) is the same memory as "
                             "(B,H,S)",
                     h == 1 ? "one head" : "one query token");
            return 1;
        }
    }
    if (nd & FS_INJ_MATTERS_SQ_EQ_H) {
        /* each ring member j attends with its chunk's queries (its tokens, or under USP its
         * Ulysses group's S_u) over h = heads / (tp·ulysses) local heads */
        const int h = c->num_attention_heads / (p->tp * p->ulysses);
        int any = 0;
        char sizes[160] = "";
        size_t o = 0;
        for (int j = 0; j < p->ring; j++) {
            const int64_t t = ring_queries(p, j);
            if (t == h && h > 1) any = 1;
            if (o < sizeof sizes)
                o += (size_t)snprintf(sizes + o, sizeof sizes - o, "%s%lld", j ? ", " : "", (long long)t);
        }
        if (!any) {
            snprintf(why, n, "no rank's ring attention has as many query tokens as heads (S_local %s; H = %d%s), so "
                             "the LSE's sizes tell (B,H,S) from (B,S,H) and the guess is right",
                     sizes, h, h == 1 ? ", and one head transposes to itself" : "");
            return 1;
        }
    }
    if (nd & FS_INJ_MATTERS_IDS_MOVE) {
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
    if (nd & FS_INJ_MATTERS_TXT_IDS_MOVE) {
        int moves = 0;
        for (int q = 0; q < p->sp && !moves; q++) moves = !ids_same_as_start(inp, 0, p->txt_lo[q], fs_par_txt_n(p, q));
        if (!moves) {
            snprintf(why, n, "every rank's text ids equal those at the start of the text (FLUX.1's are all zero), so "
                             "the text rotates the same");
            return 1;
        }
    }
    /* the broadcast values: only world rank 0 holds them under these injections (the others keep
     * zeros); the CLI's agreement makes rank 0's verdict every rank's */
    if ((nd & FS_INJ_MATTERS_VALUE) && p->rank == 0) {
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

int fs_inject_refuse(const fs_inject *in, const fs_par *p, const fs_config *c, const fs_inputs *inp, fs_err *e)
{
    if (!in || !in->mask) return FS_OK;
    char lay[128], why[512], spec[256];
    fs_par_describe(p, lay, sizeof lay);
    for (int i = 0; i < FS_INJ_COUNT; i++) {
        if (!fs_injected(in, (fs_inj_id)i)) continue;
        const fs_inject_info *info = fs_inject_info_of((fs_inj_id)i);
        const unsigned nd = info->needs;
        const fs_inject_at *at = i == FS_INJ_NAN_RANK ? &in->nan : i == FS_INJ_FAIL_RANK ? &in->fail : NULL;
        if (at)
            snprintf(spec, sizeof spec, "%.*s:%d:%.160s:%d", (int)strcspn(info->name, ":"), info->name, at->rank,
                     at->module, at->step);
        else snprintf(spec, sizeof spec, "%s", info->name);
        /* what the hook needs to act, against this layout and model */
        const struct {
            unsigned need;
            int have;
        } layout[] = {{FS_INJ_NEEDS_RANKS2, p->world >= 2},
                      {FS_INJ_NEEDS_TP, p->tp >= 2},
                      {FS_INJ_NEEDS_ULY, p->ulysses >= 2},
                      {FS_INJ_NEEDS_RING, p->ring >= 2},
                      {FS_INJ_NEEDS_P2P, p->ring >= 2 && p->rotate == FS_RING_P2P},
                      {FS_INJ_NEEDS_SP, p->sp >= 2},
                      {FS_INJ_NEEDS_GUID, inp->has_guidance},
                      {FS_INJ_NEEDS_TXT_REP, p->text == FS_TEXT_REPLICATED && p->sp >= 2},
                      {FS_INJ_NEEDS_ULY1, p->ulysses == 1},
                      {FS_INJ_NEEDS_TXT_SHARD, p->text != FS_TEXT_REPLICATED},
                      {FS_INJ_NEEDS_HEADS_SP, c->num_attention_heads % (p->tp * p->sp) == 0},
                      {FS_INJ_NEEDS_PAD_MASK, p->pad == FS_PAD_MASK},
                      {FS_INJ_NEEDS_NO_PAD, p->pad == FS_PAD_NONE},
                      {FS_INJ_NEEDS_FLUX2, c->family == FS_FLUX2},
                      {FS_INJ_NEEDS_CFGPAR, p->cfg_par > 1 && inp->true_cfg_scale > 0}};
        for (size_t b = 0; b < FS_ARRAY_LEN(layout); b++)
            if ((nd & layout[b].need) && !layout[b].have)
                return fs_errf(e, FS_E_INPUT, "--inject %s cannot fire under %s: %s; it shows under %s", spec, lay,
                               missing_why(layout[b].need), info->shows);
        if (at && (at->rank >= p->world || at->step >= inp->n_steps))
            return fs_errf(e, FS_E_INPUT, "--inject %s cannot fire under %s: %s; it shows under %s", spec, lay,
                           at->rank >= p->world ? "this run has no such rank" : "this run has no such step", info->shows);
        if (harmless(i, in, p, c, inp, why, sizeof why))
            return fs_errf(e, FS_E_INPUT, "--inject %s fires but cannot change anything under %s with %d text + %d image "
                                          "tokens: %s; it shows under %s",
                           spec, lay, p->S_txt, p->S_img, why, info->shows);
    }
    return FS_OK;
}

int fs_inject_after_run(const fs_inject *in, const fs_group *world, fs_err *e)
{
    if (!in || !in->mask) return FS_OK;
    unsigned mine = fs_inject_fired_mask(), *all = NULL, any = 0;
    if (world && world->size > 1) {
        if (!(all = malloc(sizeof(unsigned) * (size_t)world->size))) return fs_errf(e, FS_E_NOMEM, "out of memory");
        fs_allgather_bytes(world, &mine, sizeof mine, all);
        for (int r = 0; r < world->size; r++) any |= all[r];
        free(all);
    } else
        any = mine;
    for (int i = 0; i < FS_INJ_COUNT; i++) {
        const fs_inject_info *info = fs_inject_info_of((fs_inj_id)i);
        if (!fs_injected(in, (fs_inj_id)i) || !(info->needs & FS_INJ_REPORTS) || (any >> i & 1u)) continue;
        if (i == FS_INJ_NAN_RANK || i == FS_INJ_FAIL_RANK) {
            const fs_inject_at *at = i == FS_INJ_NAN_RANK ? &in->nan : &in->fail;
            return fs_errf(e, FS_E_INPUT, "--inject %.*s:%d:%s:%d never fired: no rank %d, no module '%s' recorded, or "
                                          "no step %d in this run (module paths as in a dump's `order`)",
                           (int)strcspn(info->name, ":"), info->name, at->rank, at->module, at->step, at->rank,
                           at->module, at->step);
        }
        return fs_errf(e, FS_E_INPUT, "--inject %s never fired in this run: the code it corrupts never ran (e.g. a --plan "
                                      "without the split it needs), so this is no clean pass; it shows under %s",
                       info->name, info->shows);
    }
    return FS_OK;
}
