/* fs_comm.h — every MPI call of flux-sim lives behind this header (and fs_comm.c), so the rest of
 * the simulator reads as plain numerics (the ECP CoMD pattern). No mpi.h here.
 *
 * A group is a communicator plus this rank's place in it: the world, the tensor-parallel group,
 * the Ulysses group, the ring group, the sequence-parallel group (Ulysses x ring).
 *
 * Two kinds of collectives:
 *  - on tensors (fs_*_t): the activations the model exchanges, in any memory space. When the
 *    tensor's memory is host-addressable (host tensors, the CPU backend) its pointer goes to MPI
 *    as it is; otherwise (a GPU, cpu-strict) the data is staged through host buffers from the
 *    backend's host_alloc (pinned on a GPU): download, MPI call, upload. One implementation of
 *    each collective whatever the backend; the staging is the only difference.
 *  - on host bytes (fs_bcast, fs_gather_bytes, ...): metadata, verdicts, and what recorders have
 *    already downloaded.
 * Counts and displacements are in elements. A collective's MPI errors abort the job (MPI's
 * default handler); staging failures (out of memory, a failed transfer) are returned — the
 * caller cannot be left in a collective the others completed, so the CLI then ends the job
 * (fs_comm_abort) naming the rank. */
#ifndef FS_COMM_H
#define FS_COMM_H

#include "fs_tensor.h"

typedef struct fs_group {
    int rank, size;
    void *h; /* MPI_Comm, owned */
} fs_group;

/* MPI_Init (thread level FUNNELED: only the main thread calls MPI; OpenMP/OpenBLAS threads
 * never do). Safe to call once; a singleton run without mpirun works. */
int fs_comm_init(int *argc, char ***argv, fs_err *e);
void fs_comm_finalize(void);
int fs_comm_initialized(void);
/* The world group (valid after fs_comm_init). */
const fs_group *fs_comm_world(void);
/* Split `parent` by color; ranks ordered by key. */
int fs_group_split(const fs_group *parent, int color, int key, fs_group *out, fs_err *e);
void fs_group_free(fs_group *g);
/* A group of one: this rank alone (for degrees of 1). FS_E_NOMEM when its handle cannot be
 * allocated. */
int fs_group_self(fs_group *out, fs_err *e);
/* How many ranks of g run on this rank's machine (share its memory); collective over g. */
int fs_group_node_size(const fs_group *g);

void fs_barrier(const fs_group *g);

/* ---- collectives on tensors (host or backend memory) ---- */
/* In-place sum over the group (TP row-parallel partials). float32/float64: MPI_SUM. bfloat16:
 * the partials are summed in bfloat16, one rounding per addition, rank by rank in the order
 * fs_comm_set_bf16_order chose — what NCCL's ring all-reduce does on GPUs (its order depends on
 * the chunk) — identically on every rank. */
int fs_allreduce_sum_t(const fs_group *g, fs_tensor *t, fs_err *e);
typedef enum fs_bf16_order {
    FS_BF16_ORDER_RANK = 0, /* p0 + p1 + ... + p_{T-1} */
    FS_BF16_ORDER_REVERSE,  /* p_{T-1} + ... + p0 */
    FS_BF16_ORDER_RING,     /* NCCL's ring: element chunk c of T starts at rank c+1 and goes round */
} fs_bf16_order;
void fs_comm_set_bf16_order(fs_bf16_order o);
/* Variable-size all-gather: rank r contributes counts[r] elements (the first counts[r] of its
 * `send`), placed at displs[r] of `recv`. */
int fs_allgatherv_t(const fs_group *g, const fs_tensor *send, fs_tensor *recv, const int64_t *counts,
                    const int64_t *displs, fs_err *e);
/* Variable-size all-to-all of elements between tensors of one dtype. */
int fs_alltoallv_t(const fs_group *g, const fs_tensor *send, const int64_t *scounts, const int64_t *sdispls,
                   fs_tensor *recv, const int64_t *rcounts, const int64_t *rdispls, fs_err *e);
/* Broadcast the whole tensor from root into every rank's own tensor (same dtype and numel). */
int fs_bcast_t(const fs_group *g, int root, fs_tensor *t, fs_err *e);

/* Non-blocking point-to-point for the ring: send the first `n` elements of `send` to `dst` and
 * receive `m` elements from `src` into the start of `recv` (tag distinguishes K and V).
 * fs_ring_wait completes both; only then do `recv`'s elements hold the message (staged: they
 * are uploaded at the wait), and `send` may be reused. */
typedef struct fs_ring_req {
    void *r;              /* MPI_Request[2], owned */
    void *host_send, *host_recv; /* staging buffers (NULL when the tensors are host memory) */
    fs_tensor recv;       /* where the received bytes go (a view) */
    size_t recv_bytes;
} fs_ring_req;
int fs_ring_start(const fs_group *g, const fs_tensor *send, int64_t n, int dst, fs_tensor *recv, int64_t m, int src,
                  int tag, fs_ring_req *req, fs_err *e);
int fs_ring_wait(fs_ring_req *req, fs_err *e);

/* ---- collectives on host memory (metadata, verdicts, recorders' copies) ---- */
/* In-place max of ints over the group: how every rank agrees on an exit code. */
int fs_allreduce_max_int(const fs_group *g, int v);
/* Collective: agree on a failure. Every rank passes its own outcome (rc, with its message in
 * *e); when any rank failed, every rank returns the code of the lowest-numbered failing rank and
 * holds its message, prefixed "rank N: " when N is not 0 — so the one rank that prints says what
 * went wrong and where, and every rank exits alike. FS_OK when no rank failed. e may be NULL. */
int fs_agree_error(const fs_group *g, int rc, fs_err *e);
void fs_allreduce_max_double(const fs_group *g, double *buf, int n);
void fs_bcast(const fs_group *g, int root, void *buf, size_t bytes);
/* Gather bytes to root: root receives counts[r] bytes at displs[r] (counts/displs only used at
 * root; every count below 2^31). */
int fs_gatherv_bytes(const fs_group *g, int root, const void *send, int64_t n, void *recv, const int64_t *counts,
                     const int64_t *displs, fs_err *e);
/* Every rank gets every rank's fixed-size record (recv: size*bytes). */
void fs_allgather_bytes(const fs_group *g, const void *send, size_t bytes, void *recv);
/* Gather a fixed-size record of `bytes` from every rank to root (recv: size*bytes at root). */
void fs_gather_bytes(const fs_group *g, int root, const void *send, size_t bytes, void *recv);

/* Ends the whole job with this exit code (MPI_Abort): only the CLI calls it, for an error on
 * one rank in the middle of a collective sequence, where waiting for agreement would hang the
 * others. The library never exits. */
_Noreturn void fs_comm_abort(int code);

/* Bytes this rank sent per kind of collective since the last reset: how docs/parallel.md's
 * communication table is checked against the code (flux-sim --comm-stats). */
typedef enum fs_comm_kind {
    FS_COMM_ALLREDUCE = 0, /* TP row-parallel partial sums */
    FS_COMM_ALLTOALL,      /* Ulysses head/sequence exchange */
    FS_COMM_ALLGATHER,     /* ring K/V (allgather rotation), final latents */
    FS_COMM_RING_P2P,      /* ring K/V (p2p rotation) */
    FS_COMM_BCAST,         /* setup and --check verdicts */
    FS_COMM_GATHER,        /* --check / dump assembly on rank 0 */
    FS_COMM_NKINDS
} fs_comm_kind;
typedef struct fs_comm_stats {
    int64_t calls[FS_COMM_NKINDS];
    int64_t bytes[FS_COMM_NKINDS]; /* payload this rank sent (allreduce: its buffer size) */
} fs_comm_stats;
void fs_comm_stats_get(fs_comm_stats *s);
void fs_comm_stats_reset(void);
const char *fs_comm_kind_name(fs_comm_kind k);

/* Makes an HDF5 file-access property list use MPI-IO over g (parallel HDF5): the one place the
 * HDF5 writer needs the communicator, kept here so MPI stays in fs_comm.c. fapl is an hid_t. */
int fs_comm_set_fapl_mpio(const fs_group *g, int64_t fapl);

/* FNV-1a 64 of bytes: the cheap fingerprint replicated tensors exchange. */
uint64_t fs_hash_bytes(const void *p, size_t n);

#endif
