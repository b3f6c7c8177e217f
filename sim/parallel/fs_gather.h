/* fs_gather.h — assemble a global tensor on rank 0 from every rank's local piece.
 *
 * Two phases, so replicated tensors cost a hash, not a copy: (1) every rank sends rank 0 its
 * shape, its fs_shard and a 64-bit hash of its bytes; rank 0 groups ranks holding the same piece
 * (same shape and shard: e.g. the TP ranks of a sequence shard, or all ranks for a replicated
 * tensor) and checks their hashes agree; (2) one rank per group sends its bytes, and rank 0
 * places them by their intervals. Rank 0 also checks the pieces cover every element (a
 * mis-sized shard leaves holes) and that pieces of one copy overlap only where their bytes agree
 * (replicated tokens). Pieces of different copies (fs_shard.copy: independent computations of the
 * same elements) give one global tensor per copy. Collective over the world group. */
#ifndef FS_GATHER_H
#define FS_GATHER_H

#include "fs_comm.h"
#include "fs_record.h"

typedef struct fs_piece {
    int ndim;
    int64_t shape[FS_MAX_DIMS];
    fs_shard sh;
    uint64_t hash;
    int64_t nbytes;
} fs_piece;

typedef struct fs_gathered {
    fs_tensor global;  /* rank 0: the assembled tensor, in the local dtype; empty elsewhere */
    /* rank 0: pieces of other copies (fs_shard.copy c > 0) that overlap copy 0's: copies[c - 1]
     * is the global tensor with copy c's values where it holds them (ncopies of them; 0: none) */
    fs_tensor *copies;
    int ncopies;
    int world;
    fs_piece *pieces;  /* rank 0: [world], what each rank holds */
    int *group;        /* rank 0: [world], index of the first rank holding the same piece */
    int problem;       /* rank 0: 0 ok; 1 replicated copies differ; 2 pieces do not tile the tensor */
    int first_bad;     /* rank 0, problem 1: the first rank whose copy differs from its group's */
    char detail[512];  /* rank 0: which ranks disagree, or where the hole/overlap is */
} fs_gathered;

/* This rank's piece of a recorded tensor (no hash). */
fs_piece fs_piece_of(const fs_tensor *t, const fs_shard *sh);
/* Every rank's piece, on every rank (allgather of the descriptors, no data). */
int fs_pieces_allgather(const fs_group *world, const fs_tensor *t, const fs_shard *sh, fs_piece *all);
/* Global shape from all pieces (sharded axes: furthest interval end); -1 if unsharded axes
 * disagree between ranks. */
int fs_pieces_global_shape(const fs_piece *all, int world, int64_t *gshape);
/* The lowest rank holding the same piece as rank r (that rank writes it; the others are copies). */
int fs_pieces_first_holder(const fs_piece *all, int world, int r);

int fs_gather_to_root(const fs_group *world, const fs_tensor *t, const fs_shard *sh, fs_gathered *g, fs_err *e);
void fs_gathered_free(fs_gathered *g);
/* Ranks whose piece holds the global element at coords (rank 0): a list like "1, 3" in buf;
 * returns the lowest such rank, or -1. */
int fs_gathered_owners(const fs_gathered *g, const int64_t *coords, char *buf, size_t n);
/* "replicated" / "dim 1 [0,40)+[64,104)" description of rank r's piece. */
const char *fs_piece_describe(const fs_piece *p, char *buf, size_t n);

#endif
