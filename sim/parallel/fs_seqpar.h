/* fs_seqpar.h — attention over a sequence split across ranks (context parallelism).
 *
 * Ulysses (DeepSpeed-Ulysses, diffusers' ulysses_degree): an all-to-all turns sequence-sharded,
 * all-heads Q/K/V into all-tokens, head-sharded ones (head block w to Ulysses rank w, token
 * chunks in rank order), local attention, and the inverse all-to-all. Uneven token counts use
 * Alltoallv counts: no padding, no dropped or duplicated token.
 * Ring (diffusers' ring_degree): every rank keeps its queries; K/V chunks visit it one by one,
 * each giving a partial (out_i, lse_i) merged with the LSE rule. Rotation: all-gather then visit
 * the chunks in ring order starting with its own, as diffusers does (FS_RING_ALLGATHER), or
 * point-to-point Isend/Irecv to the next rank while computing on the current chunk (FS_RING_P2P).
 * USP: Ulysses inside, ring across Ulysses groups.
 * Replicated text (--text replicated; xDiT, sglang, vllm-omni): only the image tokens are
 * exchanged and rotated; the text's Q/K/V heads are sliced locally, the text K/V join the keys
 * once (at the first ring step in front, or the last behind: --joint), and the text's output
 * heads are all-gathered over the Ulysses group. */
#ifndef FS_SEQPAR_H
#define FS_SEQPAR_H

#include "fs_backend.h"
#include "fs_par.h"

/* 1 when the text is replicated and joins attention locally (fs_seqpar.c's joint path): the
 * exchanges and ring chunks below then count image tokens only. */
int fs_seqpar_text_joins(const fs_par *p);
/* Tokens SP rank q puts through the Ulysses all-to-all: its own, or under --inject
 * ulysses-uneven-chunk its Ulysses group's longest shard (torch.chunk's equal blocks, short
 * ones zero-padded). */
int64_t fs_seqpar_uly_block(const fs_par *p, int q);
/* Tokens ring member j attends with: its Ulysses group's blocks, concatenated. */
int64_t fs_seqpar_ring_chunk(const fs_par *p, int j);

/* q, k, v, o: [B, s_local, H_local, Dh], s_local = this rank's text + image tokens. */
int fs_seqpar_attention(const fs_par *p, fs_backend *be, fs_tensor *o, const fs_tensor *q, const fs_tensor *k,
                        const fs_tensor *v, fs_err *e);

/* Ulysses alone (ring 1): x [B, s_local, Hl, Dh] → y [B, S_u, Hl/U, Dh] (allocated here: every
 * token of the group, member w's chunk at fs_uly_plan's toff[w], its text tokens then its image
 * tokens; this member's head block), and the inverse into a given x. For an attention other than
 * fs_seqpar_attention's plain one over the gathered keys (the FLUX.2 KV cache). */
int fs_seqpar_uly_to_heads(const fs_par *p, fs_backend *be, const fs_tensor *x, fs_tensor *y, fs_err *e);
int fs_seqpar_uly_to_tokens(const fs_par *p, fs_backend *be, const fs_tensor *y, fs_tensor *x, fs_err *e);

/* ---- Ulysses layout transforms: the local halves of the all-to-alls ----
 * Exposed for tests/test_parallel.c, which checks them against index formulas and a round trip
 * without MPI; fs_seqpar_attention is their one caller in the simulator.
 *
 * The exchange plan of this rank's Ulysses group (U members, this rank `me`), in tokens; the
 * counts and displacements (elements) are filled for one direction by fs_uly_counts_*. */
typedef struct fs_uly_plan {
    int U, me;
    int64_t *n;    /* [U] tokens member w owns */
    int64_t *x;    /* [U] tokens member w exchanges: n[w], or under --inject ulysses-uneven-chunk the longest */
    int64_t *toff; /* [U] where member w's tokens start in the gathered sequence */
    int64_t S_u;   /* the gathered sequence: the sum of x */
    int64_t *sc, *sd, *rc, *rd; /* [U] send / receive counts and displacements of one direction */
} fs_uly_plan;
int fs_uly_plan_make(const fs_par *p, fs_uly_plan *u, fs_err *e);
void fs_uly_plan_free(fs_uly_plan *u);
/* To heads (before attention), hb = Hl/U heads per block. Pack: x [B, s, Hl, Dh] into
 * send = U blocks, block w = [B, x_me, hb, Dh] of heads [w·hb, (w+1)·hb), at sd[w]; rows
 * past s left as they are (zeros in a fresh buffer). Unpack: received block w, [B, x_w, hb, Dh]
 * at rd[w], into tokens [toff_w, toff_w + x_w) of y [B, S_u, hb, Dh]; with `others` non-NULL the
 * blocks of every w != me are read from it instead (--inject ulysses-early-read). */
void fs_uly_counts_to_heads(fs_uly_plan *u, int64_t B, int64_t hb, int64_t Dh);
int fs_uly_pack_head_blocks(fs_backend *be, const fs_uly_plan *u, const fs_tensor *x, fs_tensor *send, fs_err *e);
int fs_uly_unpack_token_chunks(fs_backend *be, const fs_uly_plan *u, const fs_tensor *recv, const fs_tensor *others,
                               fs_tensor *y, fs_err *e);
/* Back to tokens (after attention): the inverse. Pack: tokens [toff_w, toff_w + x_w) of
 * y [B, S_u, hb, Dh] as block w [B, x_w, hb, Dh] at sd[w]. Unpack: received block w,
 * [B, x_me, hb, Dh] at rd[w], its first s tokens into heads [w·hb, (w+1)·hb) of x [B, s, Hl, Dh]
 * — or heads of block U-1-w with `flip` (--inject ulysses-head-order). */
void fs_uly_counts_to_tokens(fs_uly_plan *u, int64_t B, int64_t hb, int64_t Dh);
int fs_uly_pack_token_chunks(fs_backend *be, const fs_uly_plan *u, const fs_tensor *y, fs_tensor *send, fs_err *e);
int fs_uly_unpack_head_blocks(fs_backend *be, const fs_uly_plan *u, const fs_tensor *recv, int flip, fs_tensor *x,
                              fs_err *e);

#endif
