/* fs_comm.h — every MPI call of flux-sim lives behind this header (and fs_comm.c), so the rest of
 * the simulator reads as plain numerics (the ECP CoMD pattern). No mpi.h here.
 *
 * A group is a communicator plus this rank's place in it: the world, the tensor-parallel group,
 * the Ulysses group, the ring group, the sequence-parallel group (Ulysses x ring). Buffers are
 * typed by fs_dtype; counts and displacements are in elements. Collectives never fail
 * recoverably (MPI's default handler aborts the job): a failed collective cannot leave the other
 * ranks anywhere sensible. */
#ifndef FS_COMM_H
#define FS_COMM_H

#include "fs_common.h"

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
/* A group of one: this rank alone (for degrees of 1). */
void fs_group_self(fs_group *out);

void fs_barrier(const fs_group *g);
/* In-place sum over the group. */
void fs_allreduce_sum(const fs_group *g, fs_dtype dt, void *buf, int64_t n);
/* In-place max of ints over the group: how every rank agrees on an exit code. */
int fs_allreduce_max_int(const fs_group *g, int v);
void fs_allreduce_max_double(const fs_group *g, double *buf, int n);
void fs_bcast(const fs_group *g, int root, void *buf, size_t bytes);
/* Variable-size all-gather: rank r contributes counts[r] elements, placed at displs[r]. */
void fs_allgatherv(const fs_group *g, fs_dtype dt, const void *send, int64_t n, void *recv, const int64_t *counts,
                   const int64_t *displs);
/* Variable-size all-to-all of elements. */
void fs_alltoallv(const fs_group *g, fs_dtype dt, const void *send, const int64_t *scounts, const int64_t *sdispls,
                  void *recv, const int64_t *rcounts, const int64_t *rdispls);
/* Gather bytes to root: root receives counts[r] bytes at displs[r] (counts/displs only used at root). */
void fs_gatherv_bytes(const fs_group *g, int root, const void *send, int64_t n, void *recv, const int64_t *counts,
                      const int64_t *displs);
/* Every rank gets every rank's fixed-size record (recv: size*bytes). */
void fs_allgather_bytes(const fs_group *g, const void *send, size_t bytes, void *recv);
/* Gather a fixed-size record of `bytes` from every rank to root (recv: size*bytes at root). */
void fs_gather_bytes(const fs_group *g, int root, const void *send, size_t bytes, void *recv);

/* Non-blocking point-to-point for the ring: send `n` elements to `dst` and receive `m` from `src`
 * (tag distinguishes K and V). fs_ring_wait completes both. */
typedef struct fs_ring_req {
    void *r[2];
} fs_ring_req;
void fs_ring_start(const fs_group *g, fs_dtype dt, const void *send, int64_t n, int dst, void *recv, int64_t m,
                   int src, int tag, fs_ring_req *req);
void fs_ring_wait(fs_ring_req *req);

/* Stops the whole job with this exit code: for an error on one rank in the middle of a
 * collective sequence, where waiting for agreement would hang the others. */
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
