#include "fs_par.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Can (tp, ulysses, ring) run this config? Returns NULL or the reason. */
static const char *layout_problem(const fs_config *c, int tp, int u, int r, char *buf, size_t n)
{
    const int H = c->num_attention_heads, D = fs_config_hidden(c), F = fs_config_mlp_hidden(c);
    if (tp < 1 || u < 1 || r < 1) return "degrees must be >= 1";
    const int64_t tu = (int64_t)tp * u; /* in 64 bits: tp and u may each be up to 10^6 */
    if (H % tu) {
        snprintf(buf, n, "%d heads are not divisible by tp·ulysses = %lld (each rank must own whole heads)", H,
                 (long long)tu);
        return buf;
    }
    if (D % tp || F % tp) {
        snprintf(buf, n, "hidden %d / MLP %d not divisible by tp = %d", D, F, tp);
        return buf;
    }
    return NULL;
}

void fs_par_default_layout(const fs_config *c, int world, int *tp, int *ulysses, int *ring)
{
    char buf[256];
    *tp = *ulysses = *ring = 1;
    if (!layout_problem(c, world, 1, 1, buf, sizeof buf)) *tp = world;
    else *ring = world; /* Ulysses needs the same divisibility as TP, so it is never the fallback */
    (void)ulysses;
}

/* Every layout of `world` ranks that can run the config, as command-line options. */
static const char *layouts_that_fit(const fs_config *c, int world, char *alt, size_t n)
{
    char why[256];
    size_t o = 0;
    alt[0] = 0;
    for (int a = 1; a <= world; a++)
        for (int b = 1; a * b <= world; b++)
            if (world % (a * b) == 0 && !layout_problem(c, a, b, world / (a * b), why, sizeof why) && o < n)
                o += (size_t)snprintf(alt + o, n - o, "%s--tp %d --ulysses %d --ring %d", o ? "; " : "", a, b, world / (a * b));
    return alt;
}

int fs_par_init(fs_par *p, const fs_group *world, const fs_config *c, int tp, int u, int r, fs_ring_rotate rotate,
                const fs_plan *plan, fs_err *e)
{
    return fs_par_init_mesh(p, world, c, 1, tp, u, r, rotate, FS_MESH_ULYSSES_INNER, plan, e);
}

int fs_par_init_cfg(fs_par *p, const fs_group *world, const fs_config *c, int cfg, int tp, int u, int r,
                    fs_ring_rotate rotate, const fs_plan *plan, fs_err *e)
{
    return fs_par_init_mesh(p, world, c, cfg, tp, u, r, rotate, FS_MESH_ULYSSES_INNER, plan, e);
}

int fs_par_init_mesh(fs_par *p, const fs_group *world, const fs_config *c, int cfg, int tp, int u, int r,
                     fs_ring_rotate rotate, fs_mesh_order mesh, const fs_plan *plan, fs_err *e)
{
    memset(p, 0, sizeof *p);
    char why[256], alt[512];
    /* the product in 64 bits, checked: an int product overflowed (undefined behaviour) and printed
     * "= -1486618624 ranks" for --tp, --ulysses and --ring 10^6 */
    int64_t ranks;
    char nr[32];
    const int ovf = __builtin_mul_overflow((int64_t)tp * u, (int64_t)r, &ranks);
    if (ovf) snprintf(nr, sizeof nr, "more than 2^63");
    else snprintf(nr, sizeof nr, "%lld", (long long)ranks);
    if (cfg != 1 && cfg != 2) return fs_errf(e, FS_E_INPUT, "CFG-parallel degree %d: true CFG has 2 passes (1 or 2)", cfg);
    if (cfg == 2 && world->size % 2)
        return fs_errf(e, FS_E_INPUT, "--cfg-parallel needs an even number of ranks (two rank groups), the job has %d",
                       world->size);
    const int inner = world->size / cfg;
    if (tp < 1 || u < 1 || r < 1 || ovf || ranks != inner) {
        if (cfg == 1)
            return fs_errf(e, FS_E_INPUT, "layout tp %d x ulysses %d x ring %d = %s ranks, but the job has %d; layouts for %d ranks: %s",
                           tp, u, r, nr, world->size, world->size, layouts_that_fit(c, world->size, alt, sizeof alt));
        return fs_errf(e, FS_E_INPUT, "--cfg-parallel: layout tp %d x ulysses %d x ring %d = %s ranks in each of the 2 CFG "
                       "groups, but the job has %d ranks (%d per group); layouts for %d ranks: %s",
                       tp, u, r, nr, world->size, inner, inner, layouts_that_fit(c, inner, alt, sizeof alt));
    }
    if (layout_problem(c, tp, u, r, why, sizeof why))
        return fs_errf(e, FS_E_INPUT, "layout tp %d x ulysses %d x ring %d cannot run this model: %s; layouts that can: %s",
                       tp, u, r, why, layouts_that_fit(c, inner, alt, sizeof alt));
    p->world = world->size;
    p->rank = world->rank;
    p->g_world = world;
    p->tp = tp;
    p->ulysses = u;
    p->ring = r;
    p->sp = u * r;
    p->rotate = rotate;
    p->plan = plan;
    p->cfg = c;
    p->cfg_par = cfg;
    p->cfg_rank = world->rank / inner;
    const int in_rank = world->rank % inner, k = p->cfg_rank; /* k: each CFG group its own colours */
    p->tp_rank = in_rank % tp;
    p->sp_rank = in_rank / tp;
    p->mesh = mesh;
    p->u_rank = mesh == FS_MESH_RING_INNER ? p->sp_rank / r : p->sp_rank % u;
    p->r_rank = fs_par_ring_of(p, p->sp_rank);
    int rc;
    /* TP group: same sp_rank. SP group: same tp_rank. Ulysses group: same tp_rank and ring
     * rank. Ring group: same tp_rank and ulysses rank. Keys keep the natural order. All of them
     * inside this rank's CFG group (k = 0 without --cfg-parallel: the colours of before). The CFG
     * group: the ranks of the same inner position, ordered by CFG rank. */
    if ((rc = fs_group_split(world, k * p->sp + p->sp_rank, p->tp_rank, &p->g_tp, e)) ||
        (rc = fs_group_split(world, k * tp + p->tp_rank, p->sp_rank, &p->g_sp, e)) ||
        (rc = fs_group_split(world, k * tp * r + p->tp_rank * r + p->r_rank, p->u_rank, &p->g_u, e)) ||
        (rc = fs_group_split(world, k * tp * u + p->tp_rank * u + p->u_rank, p->r_rank, &p->g_r, e)) ||
        (rc = fs_group_split(world, in_rank, p->cfg_rank, &p->g_cfg, e))) {
        fs_par_free(p);
        return rc;
    }
    return FS_OK;
}

/* torch.chunk: chunks of ceil(S/P), the last ones shorter or empty (--inject seq-uneven-chunk). */
static void split_ceil(int64_t S, int P, int64_t *lo, int64_t *hi)
{
    int64_t c = (S + P - 1) / P;
    for (int q = 0; q < P; q++) {
        lo[q] = q * c < S ? q * c : S;
        hi[q] = (q + 1) * c < S ? (q + 1) * c : S;
    }
}

/* --inject shard-floor-drop (VeOmni#1139): chunks of S // P, the remainder S % P held by no rank. */
static void split_floor(int64_t S, int P, int64_t *lo, int64_t *hi)
{
    int64_t c = S / P;
    for (int q = 0; q < P; q++) lo[q] = q * c, hi[q] = (q + 1) * c;
}

static void split(int64_t S, int P, int64_t *lo, int64_t *hi)
{
    int64_t base = S / P, extra = S % P, off = 0;
    for (int q = 0; q < P; q++) {
        int64_t n = base + (q < extra ? 1 : 0);
        lo[q] = off;
        hi[q] = off + n;
        off += n;
    }
}

int fs_par_set_seq(fs_par *p, int S_txt, int S_img, fs_err *e)
{
    free(p->txt_lo);
    p->txt_lo = calloc(4 * (size_t)p->sp, sizeof(int64_t));
    if (!p->txt_lo) return fs_errf(e, FS_E_NOMEM, "out of memory");
    p->txt_hi = p->txt_lo + p->sp;
    p->img_lo = p->txt_hi + p->sp;
    p->img_hi = p->img_lo + p->sp;
    p->S_txt = S_txt;
    p->S_img = S_img;
    void (*how)(int64_t, int, int64_t *, int64_t *) =
        fs_injected(p->inject, FS_INJ_SHARD_FLOOR_DROP) && p->sp > 1                 ? split_floor
        : fs_injected(p->inject, FS_INJ_SEQ_UNEVEN_CHUNK) || p->pad != FS_PAD_NONE ? split_ceil /* padded at the end */
                                                                                    : split;
    if (how == split_floor && (S_txt % p->sp || S_img % p->sp)) fs_inject_fire(FS_INJ_SHARD_FLOOR_DROP);
    how(S_txt, p->sp, p->txt_lo, p->txt_hi);
    how(S_img, p->sp, p->img_lo, p->img_hi);
    if (p->text == FS_TEXT_REPLICATED) /* every SP rank holds the whole text */
        for (int q = 0; q < p->sp; q++) p->txt_lo[q] = 0, p->txt_hi[q] = S_txt;
    /* a rank may lack text or image tokens, not both: it would have no sequence at all */
    if (p->text == FS_TEXT_SHARDED && p->sp > S_txt && p->sp > S_img)
        return fs_errf(e, FS_E_INPUT, "%d text + %d image tokens cannot be split over %d sequence-parallel ranks "
                                      "(ulysses x ring): rank %d would hold no token; use at most %d",
                       S_txt, S_img, p->sp, p->sp - 1, S_txt > S_img ? S_txt : S_img);
    return FS_OK;
}

void fs_par_free(fs_par *p)
{
    if (!p) return;
    fs_group_free(&p->g_tp);
    fs_group_free(&p->g_sp);
    fs_group_free(&p->g_u);
    fs_group_free(&p->g_r);
    fs_group_free(&p->g_cfg);
    free(p->txt_lo);
    memset(p, 0, sizeof *p);
}

const char *fs_par_describe(const fs_par *p, char *buf, size_t n)
{
    snprintf(buf, n, "%stp %d x ulysses %d x ring %d%s%s", p->cfg_par > 1 ? "cfg 2 x " : "", p->tp, p->ulysses, p->ring,
             p->ring > 1 ? (p->rotate == FS_RING_P2P ? " (ring p2p)" : " (ring allgather)") : "",
             p->text != FS_TEXT_REPLICATED ? ""
             : p->sp > 1 ? (p->joint == FS_JOINT_REAR ? ", text replicated (joint rear)" : ", text replicated (joint front)")
                           : ", text replicated");
    if (p->pad != FS_PAD_NONE && p->sp > 1) {
        const size_t o = strlen(buf);
        snprintf(buf + o, n > o ? n - o : 0, ", padded %s", p->pad == FS_PAD_MASK ? "with a key mask" : "without a mask");
    }
    if (p->mesh == FS_MESH_RING_INNER && p->ulysses > 1 && p->ring > 1) {
        const size_t o = strlen(buf);
        snprintf(buf + o, n > o ? n - o : 0, ", ring inner");
    }
    return buf;
}
