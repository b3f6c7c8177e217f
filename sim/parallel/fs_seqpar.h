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
 * USP: Ulysses inside, ring across Ulysses groups. */
#ifndef FS_SEQPAR_H
#define FS_SEQPAR_H

#include "fs_backend.h"
#include "fs_par.h"

/* Tokens SP rank q puts through the Ulysses all-to-all: its own, or under --inject
 * ulysses-uneven-chunk its Ulysses group's longest shard (torch.chunk's equal blocks, short
 * ones zero-padded). */
int64_t fs_seqpar_uly_block(const fs_par *p, int q);
/* Tokens ring member j attends with: its Ulysses group's blocks, concatenated. */
int64_t fs_seqpar_ring_chunk(const fs_par *p, int j);

/* q, k, v, o: [B, s_local, H_local, Dh], s_local = this rank's text + image tokens. */
int fs_seqpar_attention(const fs_par *p, fs_backend *be, fs_tensor *o, const fs_tensor *q, const fs_tensor *k,
                        const fs_tensor *v, fs_err *e);

#endif
