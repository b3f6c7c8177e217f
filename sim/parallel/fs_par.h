/* fs_par.h — the parallel layout of one run: the mesh, this rank's coordinates, the process
 * groups, and how the joint [text | image] sequence is split.
 *
 * Mesh: world = tp · ulysses · ring. rank = sp_rank · tp + tp_rank (TP innermost, as Megatron
 * places it inside a node); sp_rank = ring_rank · ulysses + ulysses_rank (Ulysses inner, ring
 * outer, as USP does by default), or with --mesh-order ring-inner ulysses_rank · ring + ring_rank. A TP group shares one sequence shard; a sequence-parallel (SP) group of
 * ulysses·ring ranks shares one head shard.
 *
 * Sequence sharding: text and image tokens are split separately over the SP group, each in
 * balanced contiguous chunks (the first S % P ranks get one extra token: uneven lengths are
 * exact, never padded, never dropped), and a rank's local joint sequence is
 * [its text chunk | its image chunk], as diffusers' context parallelism splits
 * encoder_hidden_states and hidden_states. RoPE uses the tokens' global ids.
 * Under --text replicated every SP rank's text chunk is the whole text, [0, S_txt): its local
 * joint sequence is [all text | its image chunk]. */
#ifndef FS_PAR_H
#define FS_PAR_H

#include "fs_comm.h"
#include "fs_config.h"
#include "fs_inject.h"
#include "fs_plan.h"

typedef enum fs_ring_rotate { FS_RING_ALLGATHER = 0, FS_RING_P2P } fs_ring_rotate;
/* Where the text tokens live under sequence parallelism (--text). SHARDED: split over the SP group
 * like the image tokens (diffusers' context parallelism). REPLICATED: every SP rank holds all of
 * them, only the image tokens are split (xDiT's joint tensors, sglang / vllm-omni
 * split_text_embed_in_sp=False); attention joins the text's K/V to the image's once
 * (fs_seqpar.h). */
typedef enum fs_text_place { FS_TEXT_SHARDED = 0, FS_TEXT_REPLICATED } fs_text_place;
/* Under replicated text, the ring step at which the text K/V join the image K/V, and the side of
 * the keys they go to (--joint; xDiT's joint_strategy): FRONT [text | chunk] at the first step,
 * REAR [chunk | text] at the last. */
typedef enum fs_joint_strategy { FS_JOINT_FRONT = 0, FS_JOINT_REAR } fs_joint_strategy;
/* The order of the two sequence-parallel mesh axes (--mesh-order), as yunchang's
 * set_seq_parallel_pg lays them out for xDiT, sglang and vllm-omni: ULYSSES_INNER
 * (use_ulysses_low=True, their default) makes a Ulysses group consecutive SP ranks,
 * sp_rank = ring_rank · ulysses + ulysses_rank; RING_INNER (use_ulysses_low=False) makes a ring
 * group consecutive, sp_rank = ulysses_rank · ring + ring_rank. SP rank q holds sequence chunk q
 * either way. */
typedef enum fs_mesh_order { FS_MESH_ULYSSES_INNER = 0, FS_MESH_RING_INNER } fs_mesh_order;
/* Padding layouts (--pad; VeOmni, vllm-omni auto_pad, sglang): the sequence is padded to a multiple
 * of the degree — each stream split in torch.chunk's ceil-sized chunks, every rank's exchanged
 * block (Ulysses) and ring chunk padded with zero tokens to the longest — and the pad keys are
 * masked out of every softmax (MASK: exact) or not (NOMASK: vllm-omni's mask_sp_padding=False; the
 * pad keys add exp(−max) terms to every denominator: inexact by design). NONE: the balanced
 * uneven split, nothing padded (today's layout). */
typedef enum fs_pad { FS_PAD_NONE = 0, FS_PAD_MASK, FS_PAD_NOMASK } fs_pad;

typedef struct fs_par {
    int world, rank;
    int tp, ulysses, ring, sp;            /* degrees; sp = ulysses · ring */
    /* --cfg-parallel: cfg_par = 2 rank groups of tp·sp ranks each, rank = cfg_rank · (tp·sp) + its rank
     * inside the group (xDiT's "tp-sp-pp-cfg-dp" order: CFG outside TP and SP). Group 0 runs the
     * prompt's transformer call, group 1 the negative prompt's; g_cfg pairs the ranks of the same
     * inner position (size cfg_par), over which the noise predictions are all-gathered. 1: none. */
    int cfg_par, cfg_rank;
    fs_group g_cfg;
    int tp_rank, u_rank, r_rank, sp_rank; /* this rank's coordinates */
    fs_group g_tp, g_u, g_r, g_sp;        /* groups (of size 1 when the degree is 1) */
    const fs_group *g_world;
    fs_ring_rotate rotate;
    fs_text_place text;                   /* set before fs_par_set_seq (default: sharded) */
    fs_joint_strategy joint;
    fs_mesh_order mesh;
    fs_pad pad;                           /* set before fs_par_set_seq (default: none) */
    const fs_plan *plan;                  /* TP plan (used when tp > 1) */
    const fs_config *cfg;                 /* the model fs_par_init was given (must outlive the par) */
    const fs_inject *inject;              /* --inject: bugs re-created on purpose (NULL: none) */
    /* sequence partition over sp ranks, set by fs_par_set_seq */
    int S_txt, S_img;
    int64_t *txt_lo, *txt_hi, *img_lo, *img_hi; /* [sp] */
} fs_par;

/* Checks the layout against the world size and the config (heads divisible by tp·ulysses,
 * hidden and MLP widths by tp) and creates the groups. The error message says why a layout
 * cannot work and lists the layouts that would. */
int fs_par_init(fs_par *p, const fs_group *world, const fs_config *c, int tp, int ulysses, int ring,
                fs_ring_rotate rotate, const fs_plan *plan, fs_err *e);
/* The same with cfg CFG-parallel rank groups (cfg 1 or 2): world = cfg · tp · ulysses · ring, and
 * every TP/SP group lies inside one CFG group. */
int fs_par_init_cfg(fs_par *p, const fs_group *world, const fs_config *c, int cfg, int tp, int ulysses, int ring,
                    fs_ring_rotate rotate, const fs_plan *plan, fs_err *e);
/* The same with the SP mesh axes in the given order (fs_par_init_cfg: FS_MESH_ULYSSES_INNER). */
int fs_par_init_mesh(fs_par *p, const fs_group *world, const fs_config *c, int cfg, int tp, int ulysses, int ring,
                     fs_ring_rotate rotate, fs_mesh_order mesh, const fs_plan *plan, fs_err *e);
/* The layout plain `mpirun -np N flux-sim` uses: TP over N if the heads divide (then the hidden
 * and MLP widths do too, D = H·Dh), else ring over N (any N: uneven token shards are exact). */
void fs_par_default_layout(const fs_config *c, int world, int *tp, int *ulysses, int *ring);
/* Partition S_txt text and S_img image tokens over the SP group. */
int fs_par_set_seq(fs_par *p, int S_txt, int S_img, fs_err *e);
void fs_par_free(fs_par *p);
/* "tp2 x ulysses1 x ring2 (p2p)" */
const char *fs_par_describe(const fs_par *p, char *buf, size_t n);

/* Local token counts of SP rank q. */
static inline int64_t fs_par_txt_n(const fs_par *p, int q) { return p->txt_hi[q] - p->txt_lo[q]; }
static inline int64_t fs_par_img_n(const fs_par *p, int q) { return p->img_hi[q] - p->img_lo[q]; }
/* The SP rank at Ulysses rank u and ring rank r, and the ring rank of SP rank q (--mesh-order). */
static inline int fs_par_sp_of(const fs_par *p, int u, int r)
{
    return p->mesh == FS_MESH_RING_INNER ? u * p->ring + r : r * p->ulysses + u;
}
static inline int fs_par_ring_of(const fs_par *p, int q) { return p->mesh == FS_MESH_RING_INNER ? q % p->ring : q / p->ulysses; }

#endif
