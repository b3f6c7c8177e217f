/* fs_comm.c — the only file that includes mpi.h. */
#include "fs_comm.h"

#include <hdf5.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static fs_group world;
static fs_comm_stats stats;

static void count(fs_comm_kind k, int64_t bytes)
{
    stats.calls[k]++;
    stats.bytes[k] += bytes;
}

void fs_comm_stats_get(fs_comm_stats *s) { *s = stats; }
void fs_comm_stats_reset(void) { memset(&stats, 0, sizeof stats); }
const char *fs_comm_kind_name(fs_comm_kind k)
{
    static const char *const n[] = {"allreduce", "alltoallv", "allgatherv", "ring p2p", "bcast", "gather"};
    return k < FS_COMM_NKINDS ? n[k] : "?";
}
static int inited, we_initialised;

#define COMM(g) (*(MPI_Comm *)(g)->h)

static MPI_Datatype mpi_type(fs_dtype dt) { return dt == FS_F64 ? MPI_DOUBLE : MPI_FLOAT; }

int fs_comm_init(int *argc, char ***argv, fs_err *e)
{
    if (inited) return FS_OK;
    int already = 0;
    MPI_Initialized(&already);
    if (!already) {
        int provided;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return fs_errf(e, FS_E_IO, "MPI_Init_thread failed");
        we_initialised = 1;
    }
    world.h = malloc(sizeof(MPI_Comm));
    MPI_Comm_dup(MPI_COMM_WORLD, (MPI_Comm *)world.h);
    MPI_Comm_rank(COMM(&world), &world.rank);
    MPI_Comm_size(COMM(&world), &world.size);
    inited = 1;
    return FS_OK;
}

int fs_comm_initialized(void) { return inited; }

void fs_comm_finalize(void)
{
    if (!inited) return;
    MPI_Comm_free((MPI_Comm *)world.h);
    free(world.h);
    world.h = NULL;
    inited = 0;
    if (we_initialised) MPI_Finalize();
}

const fs_group *fs_comm_world(void) { return &world; }

int fs_group_split(const fs_group *parent, int color, int key, fs_group *out, fs_err *e)
{
    memset(out, 0, sizeof *out);
    out->h = malloc(sizeof(MPI_Comm));
    if (!out->h) return fs_errf(e, FS_E_NOMEM, "out of memory");
    MPI_Comm_split(COMM(parent), color, key, (MPI_Comm *)out->h);
    MPI_Comm_rank(COMM(out), &out->rank);
    MPI_Comm_size(COMM(out), &out->size);
    return FS_OK;
}

void fs_group_self(fs_group *out)
{
    out->h = malloc(sizeof(MPI_Comm));
    MPI_Comm_dup(MPI_COMM_SELF, (MPI_Comm *)out->h);
    out->rank = 0;
    out->size = 1;
}

void fs_group_free(fs_group *g)
{
    if (!g || !g->h) return;
    MPI_Comm_free((MPI_Comm *)g->h);
    free(g->h);
    memset(g, 0, sizeof *g);
}

void fs_barrier(const fs_group *g) { MPI_Barrier(COMM(g)); }

/* MPI counts are int: split anything larger into chunks (FLUX-width activations exceed 2^31
 * bytes but not 2^31 elements per call in practice; be safe anyway). */
#define CHUNK ((int64_t)1 << 30)

void fs_allreduce_sum(const fs_group *g, fs_dtype dt, void *buf, int64_t n)
{
    if (g->size == 1) return;
    size_t es = fs_dtype_size(dt);
    count(FS_COMM_ALLREDUCE, n * (int64_t)es);
    for (int64_t o = 0; o < n; o += CHUNK) {
        int m = (int)(n - o < CHUNK ? n - o : CHUNK);
        MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)o * es, m, mpi_type(dt), MPI_SUM, COMM(g));
    }
}

int fs_allreduce_max_int(const fs_group *g, int v)
{
    int out = v;
    MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MAX, COMM(g));
    return out;
}

void fs_allreduce_max_double(const fs_group *g, double *buf, int n)
{
    MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_MAX, COMM(g));
}

void fs_bcast(const fs_group *g, int root, void *buf, size_t bytes)
{
    if (g->rank == root && g->size > 1) count(FS_COMM_BCAST, (int64_t)bytes);
    for (size_t o = 0; o < bytes; o += (size_t)CHUNK) {
        size_t m = bytes - o < (size_t)CHUNK ? bytes - o : (size_t)CHUNK;
        MPI_Bcast((char *)buf + o, (int)m, MPI_BYTE, root, COMM(g));
    }
}

static int *to_int(const int64_t *v, int n)
{
    int *o = malloc(sizeof(int) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        if (v[i] > INT32_MAX) fs_comm_abort(3); /* a single collective of > 2^31 elements: not supported */
        o[i] = (int)v[i];
    }
    return o;
}

void fs_allgatherv(const fs_group *g, fs_dtype dt, const void *send, int64_t n, void *recv, const int64_t *counts,
                   const int64_t *displs)
{
    int *c = to_int(counts, g->size), *d = to_int(displs, g->size);
    if (g->size > 1) count(FS_COMM_ALLGATHER, n * (int64_t)fs_dtype_size(dt));
    MPI_Allgatherv(send, (int)n, mpi_type(dt), recv, c, d, mpi_type(dt), COMM(g));
    free(c);
    free(d);
}

void fs_alltoallv(const fs_group *g, fs_dtype dt, const void *send, const int64_t *scounts, const int64_t *sdispls,
                  void *recv, const int64_t *rcounts, const int64_t *rdispls)
{
    int *sc = to_int(scounts, g->size), *sd = to_int(sdispls, g->size);
    int *rc = to_int(rcounts, g->size), *rd = to_int(rdispls, g->size);
    int64_t sent = 0;
    for (int r = 0; r < g->size; r++)
        if (r != g->rank) sent += scounts[r];
    count(FS_COMM_ALLTOALL, sent * (int64_t)fs_dtype_size(dt));
    MPI_Alltoallv(send, sc, sd, mpi_type(dt), recv, rc, rd, mpi_type(dt), COMM(g));
    free(sc);
    free(sd);
    free(rc);
    free(rd);
}

void fs_gatherv_bytes(const fs_group *g, int root, const void *send, int64_t n, void *recv, const int64_t *counts,
                      const int64_t *displs)
{
    int *c = NULL, *d = NULL;
    if (g->rank == root) {
        c = to_int(counts, g->size);
        d = to_int(displs, g->size);
    }
    if (g->rank != root) count(FS_COMM_GATHER, n);
    MPI_Gatherv(send, (int)n, MPI_BYTE, recv, c, d, MPI_BYTE, root, COMM(g));
    free(c);
    free(d);
}

void fs_allgather_bytes(const fs_group *g, const void *send, size_t bytes, void *recv)
{
    MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, COMM(g));
}

void fs_gather_bytes(const fs_group *g, int root, const void *send, size_t bytes, void *recv)
{
    MPI_Gather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root, COMM(g));
}

void fs_ring_start(const fs_group *g, fs_dtype dt, const void *send, int64_t n, int dst, void *recv, int64_t m,
                   int src, int tag, fs_ring_req *req)
{
    MPI_Request *r = malloc(2 * sizeof(MPI_Request));
    count(FS_COMM_RING_P2P, n * (int64_t)fs_dtype_size(dt));
    MPI_Irecv(recv, (int)m, mpi_type(dt), src, tag, COMM(g), &r[0]);
    MPI_Isend(send, (int)n, mpi_type(dt), dst, tag, COMM(g), &r[1]);
    req->r[0] = r;
}

void fs_ring_wait(fs_ring_req *req)
{
    MPI_Request *r = req->r[0];
    if (!r) return;
    MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    free(r);
    req->r[0] = NULL;
}

_Noreturn void fs_comm_abort(int code)
{
    if (inited) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

int fs_comm_set_fapl_mpio(const fs_group *g, int64_t fapl)
{
    return H5Pset_fapl_mpio((hid_t)fapl, COMM(g), MPI_INFO_NULL) < 0 ? -1 : 0;
}

uint64_t fs_hash_bytes(const void *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
