/* fs_comm.c — the only file that includes mpi.h. */
#include "fs_comm.h"

#include "fs_backend.h"

#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
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

/* bfloat16 moves as 16-bit words (all-gather, all-to-all, broadcast, p2p move bits) */
static MPI_Datatype mpi_type(fs_dtype dt) { return dt == FS_F64 ? MPI_DOUBLE : dt == FS_BF16 ? MPI_UINT16_T : MPI_FLOAT; }

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
    if (!world.h) return fs_errf(e, FS_E_NOMEM, "out of memory for the world communicator's handle");
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
    if (!out->h) return fs_errf(e, FS_E_NOMEM, "out of memory for a communicator handle (split of color %d)", color);
    MPI_Comm_split(COMM(parent), color, key, (MPI_Comm *)out->h);
    MPI_Comm_rank(COMM(out), &out->rank);
    MPI_Comm_size(COMM(out), &out->size);
    return FS_OK;
}

int fs_group_self(fs_group *out, fs_err *e)
{
    memset(out, 0, sizeof *out);
    out->h = malloc(sizeof(MPI_Comm));
    if (!out->h) return fs_errf(e, FS_E_NOMEM, "out of memory for the self communicator's handle");
    MPI_Comm_dup(MPI_COMM_SELF, (MPI_Comm *)out->h);
    out->rank = 0;
    out->size = 1;
    return FS_OK;
}

int fs_group_node_size(const fs_group *g)
{
    /* ranks of g sharing this machine's memory (MPI-3 shared-memory split) */
    MPI_Comm node;
    int n = 1;
    if (MPI_Comm_split_type(*(MPI_Comm *)g->h, MPI_COMM_TYPE_SHARED, g->rank, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return g->size;
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    return n;
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

/* ---------------------------------------------------------------- staging */

/* A host-addressable window on `n` elements at element offset `off` of t: its own memory when
 * t is host-addressable, else a staging buffer from the backend (downloaded when `fill`). */
typedef struct stage {
    void *p;
    int staged;
} stage;

static int stage_open(const fs_tensor *t, int64_t off, int64_t n, int fill, stage *s, fs_err *e)
{
    const size_t es = fs_dtype_size(t->dtype), bytes = (size_t)n * es;
    const char *src = (const char *)t->data + (size_t)off * es;
    s->staged = !fs_tensor_is_host(t);
    if (!s->staged) {
        s->p = (void *)src;
        return FS_OK;
    }
    fs_backend *be = t->be;
    s->p = NULL; /* a failed host_alloc need not set it: the error path frees only what it got */
    int rc = be->host_alloc(be, bytes ? bytes : 1, &s->p, e);
    if (!rc && fill && bytes) rc = be->download2d(be, s->p, bytes, src, bytes, bytes, 1, e);
    if (rc) {
        if (s->p) be->host_free(be, s->p);
        s->p = NULL;
        return fs_err_prefix(e, "staging %zu bytes for MPI: ", bytes);
    }
    return FS_OK;
}

/* Uploads the staged bytes back into t (when `back`) and releases the buffer. */
static int stage_close(const fs_tensor *t, int64_t off, int64_t n, int back, stage *s, fs_err *e)
{
    int rc = FS_OK;
    if (!s->staged || !s->p) return FS_OK;
    const size_t es = fs_dtype_size(t->dtype), bytes = (size_t)n * es;
    if (back && bytes) {
        rc = t->be->upload2d(t->be, (char *)t->data + (size_t)off * es, bytes, s->p, bytes, bytes, 1, e);
        if (rc) fs_err_prefix(e, "staging %zu bytes back from MPI: ", bytes);
    }
    t->be->host_free(t->be, s->p);
    s->p = NULL;
    return rc;
}

/* MPI counts are int: a single collective of 2^31 elements or more is refused, not cut. */
static int to_int(const int64_t *v, int n, int **out, fs_err *e)
{
    *out = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!*out) return fs_errf(e, FS_E_NOMEM, "out of memory for %d MPI counts", n);
    for (int i = 0; i < n; i++) {
        if (v[i] < 0 || v[i] > INT32_MAX) {
            free(*out);
            *out = NULL;
            return fs_errf(e, FS_E_INPUT, "a collective of %lld elements per rank exceeds MPI's 2^31 limit",
                           (long long)v[i]);
        }
        (*out)[i] = (int)v[i];
    }
    return FS_OK;
}

/* ---------------------------------------------------------------- tensor collectives */


static fs_bf16_order bf16_order = FS_BF16_ORDER_RANK;
void fs_comm_set_bf16_order(fs_bf16_order o) { bf16_order = o; }

/* bfloat16 sum of the group's partials: gather every partial (bits), then add them in bf16 —
 * float32 add, round to nearest even, per addition — in the chosen order, the same on every
 * rank, so the replicated result is bitwise identical across the group. */
static int allreduce_bf16(const fs_group *g, void *buf, int64_t n, fs_err *e)
{
    const int T = g->size;
    if (n > INT32_MAX) return fs_errf(e, FS_E_INPUT, "a bfloat16 all-reduce of %lld elements exceeds MPI's 2^31 limit", (long long)n);
    uint16_t *all = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n * T : 1)), *out = buf;
    if (!all) return fs_errf(e, FS_E_NOMEM, "out of memory gathering %d bfloat16 partials of %lld elements", T, (long long)n);
    MPI_Allgather(buf, (int)n, MPI_UINT16_T, all, (int)n, MPI_UINT16_T, COMM(g));
    const int64_t chunk = (n + T - 1) / T;
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        int first = 0, step = 1;
        if (bf16_order == FS_BF16_ORDER_REVERSE) first = T - 1, step = -1;
        else if (bf16_order == FS_BF16_ORDER_RING) first = (int)((i / chunk + 1) % T);
        int r = first;
        float acc = fs_bf16_to_float(all[(int64_t)r * n + i]);
        for (int k = 1; k < T; k++) {
            r = ((r + step) % T + T) % T;
            acc = fs_bf16_round(acc + fs_bf16_to_float(all[(int64_t)r * n + i]));
        }
        out[i] = fs_bf16_from_float(acc);
    }
    free(all);
    return FS_OK;
}

int fs_allreduce_sum_t(const fs_group *g, fs_tensor *t, fs_err *e)
{
    if (g->size == 1) return FS_OK;
    const int64_t n = fs_tensor_numel(t);
    const size_t es = fs_dtype_size(t->dtype);
    stage s;
    int rc = stage_open(t, 0, n, 1, &s, e);
    if (rc) return rc;
    count(FS_COMM_ALLREDUCE, n * (int64_t)es);
    if (t->dtype == FS_BF16) rc = allreduce_bf16(g, s.p, n, e);
    else
        for (int64_t o = 0; o < n; o += CHUNK) {
            int m = (int)(n - o < CHUNK ? n - o : CHUNK);
            MPI_Allreduce(MPI_IN_PLACE, (char *)s.p + (size_t)o * es, m, mpi_type(t->dtype), MPI_SUM, COMM(g));
        }
    int rc2 = stage_close(t, 0, n, !rc, &s, e);
    return rc ? rc : rc2;
}

int fs_allgatherv_t(const fs_group *g, const fs_tensor *send, fs_tensor *recv, const int64_t *counts,
                    const int64_t *displs, fs_err *e)
{
    int *c = NULL, *d = NULL, rc;
    int64_t total = 0;
    for (int r = 0; r < g->size; r++)
        if (displs[r] + counts[r] > total) total = displs[r] + counts[r];
    const int64_t n = counts[g->rank];
    if (send->dtype != recv->dtype || n > fs_tensor_numel(send) || total > fs_tensor_numel(recv))
        return fs_errf(e, FS_E_INTERNAL, "all-gather: buffers do not match the counts");
    if ((rc = to_int(counts, g->size, &c, e)) || (rc = to_int(displs, g->size, &d, e))) {
        free(c);
        return rc;
    }
    stage ss, sr;
    if ((rc = stage_open(send, 0, n, 1, &ss, e))) goto out;
    if ((rc = stage_open(recv, 0, total, 0, &sr, e))) {
        stage_close(send, 0, n, 0, &ss, e);
        goto out;
    }
    if (g->size > 1) count(FS_COMM_ALLGATHER, n * (int64_t)fs_dtype_size(send->dtype));
    MPI_Allgatherv(ss.p, (int)n, mpi_type(send->dtype), sr.p, c, d, mpi_type(recv->dtype), COMM(g));
    rc = stage_close(send, 0, n, 0, &ss, e);
    int rc2 = stage_close(recv, 0, total, 1, &sr, e);
    rc = rc ? rc : rc2;
out:
    free(c);
    free(d);
    return rc;
}

int fs_alltoallv_t(const fs_group *g, const fs_tensor *send, const int64_t *scounts, const int64_t *sdispls,
                   fs_tensor *recv, const int64_t *rcounts, const int64_t *rdispls, fs_err *e)
{
    int *sc = NULL, *sd = NULL, *rcn = NULL, *rd = NULL, rc;
    int64_t stot = 0, rtot = 0, sent = 0;
    for (int r = 0; r < g->size; r++) {
        if (sdispls[r] + scounts[r] > stot) stot = sdispls[r] + scounts[r];
        if (rdispls[r] + rcounts[r] > rtot) rtot = rdispls[r] + rcounts[r];
        if (r != g->rank) sent += scounts[r];
    }
    if (send->dtype != recv->dtype || stot > fs_tensor_numel(send) || rtot > fs_tensor_numel(recv))
        return fs_errf(e, FS_E_INTERNAL, "all-to-all: buffers do not match the counts");
    if ((rc = to_int(scounts, g->size, &sc, e)) || (rc = to_int(sdispls, g->size, &sd, e)) ||
        (rc = to_int(rcounts, g->size, &rcn, e)) || (rc = to_int(rdispls, g->size, &rd, e)))
        goto out;
    stage ss, sr;
    if ((rc = stage_open(send, 0, stot, 1, &ss, e))) goto out;
    if ((rc = stage_open(recv, 0, rtot, 0, &sr, e))) {
        stage_close(send, 0, stot, 0, &ss, e);
        goto out;
    }
    count(FS_COMM_ALLTOALL, sent * (int64_t)fs_dtype_size(send->dtype));
    MPI_Alltoallv(ss.p, sc, sd, mpi_type(send->dtype), sr.p, rcn, rd, mpi_type(recv->dtype), COMM(g));
    rc = stage_close(send, 0, stot, 0, &ss, e);
    int rc2 = stage_close(recv, 0, rtot, 1, &sr, e);
    rc = rc ? rc : rc2;
out:
    free(sc);
    free(sd);
    free(rcn);
    free(rd);
    return rc;
}

int fs_bcast_t(const fs_group *g, int root, fs_tensor *t, fs_err *e)
{
    if (g->size == 1) return FS_OK;
    const int64_t n = fs_tensor_numel(t);
    stage s;
    int rc = stage_open(t, 0, n, g->rank == root, &s, e);
    if (rc) return rc;
    fs_bcast(g, root, s.p, fs_tensor_nbytes(t));
    return stage_close(t, 0, n, g->rank != root, &s, e);
}

int fs_ring_start(const fs_group *g, const fs_tensor *send, int64_t n, int dst, fs_tensor *recv, int64_t m, int src,
                  int tag, fs_ring_req *req, fs_err *e)
{
    memset(req, 0, sizeof *req);
    if (n > INT32_MAX || m > INT32_MAX || n > fs_tensor_numel(send) || m > fs_tensor_numel(recv) ||
        send->dtype != recv->dtype)
        return fs_errf(e, FS_E_INTERNAL, "ring p2p: %lld / %lld elements do not fit the buffers or MPI's int", (long long)n,
                       (long long)m);
    stage ss, sr;
    int rc = stage_open(send, 0, n, 1, &ss, e);
    if (rc) return rc;
    if ((rc = stage_open(recv, 0, m, 0, &sr, e))) {
        stage_close(send, 0, n, 0, &ss, e);
        return rc;
    }
    MPI_Request *r = malloc(2 * sizeof(MPI_Request));
    if (!r) {
        stage_close(send, 0, n, 0, &ss, e);
        stage_close(recv, 0, m, 0, &sr, e);
        return fs_errf(e, FS_E_NOMEM, "ring p2p: out of memory for the request handles");
    }
    count(FS_COMM_RING_P2P, n * (int64_t)fs_dtype_size(send->dtype));
    MPI_Irecv(sr.p, (int)m, mpi_type(recv->dtype), src, tag, COMM(g), &r[0]);
    MPI_Isend(ss.p, (int)n, mpi_type(send->dtype), dst, tag, COMM(g), &r[1]);
    req->r = r;
    req->host_send = ss.staged ? ss.p : NULL;
    req->host_recv = sr.staged ? sr.p : NULL;
    req->recv = *recv;
    req->recv.owns = 0;
    req->recv_bytes = (size_t)m * fs_dtype_size(recv->dtype);
    return FS_OK;
}

int fs_ring_wait(fs_ring_req *req, fs_err *e)
{
    int rc = FS_OK;
    if (!req->r) return FS_OK;
    MPI_Waitall(2, req->r, MPI_STATUSES_IGNORE);
    free(req->r);
    req->r = NULL;
    fs_backend *be = req->recv.be;
    if (req->host_recv) { /* staged: only now does the received chunk reach backend memory */
        if (req->recv_bytes)
            rc = be->upload2d(be, req->recv.data, req->recv_bytes, req->host_recv, req->recv_bytes, req->recv_bytes, 1, e);
        be->host_free(be, req->host_recv);
    }
    if (req->host_send) be->host_free(be, req->host_send);
    req->host_recv = req->host_send = NULL;
    return rc;
}

/* ---------------------------------------------------------------- host collectives */

int fs_allreduce_max_int(const fs_group *g, int v)
{
    int out = v;
    MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MAX, COMM(g));
    return out;
}

int fs_agree_error(const fs_group *g, int rc, fs_err *e)
{
    if (g->size == 1) return rc;
    /* the lowest failing rank: max of size - rank over the failing ones */
    const int best = fs_allreduce_max_int(g, rc ? g->size - g->rank : 0);
    if (!best) return FS_OK;
    const int first = g->size - best;
    struct {
        int code;
        char msg[sizeof e->msg];
    } m = {0};
    if (g->rank == first) {
        m.code = rc;
        snprintf(m.msg, sizeof m.msg, "%s", e && e->msg[0] ? e->msg : "unknown error");
    }
    fs_bcast(g, first, &m, sizeof m);
    if (e) {
        e->code = m.code;
        if (first) snprintf(e->msg, sizeof e->msg, "rank %d: %.*s", first, (int)sizeof e->msg - 16, m.msg);
        else snprintf(e->msg, sizeof e->msg, "%s", m.msg);
    }
    return m.code;
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

int fs_gatherv_bytes(const fs_group *g, int root, const void *send, int64_t n, void *recv, const int64_t *counts,
                     const int64_t *displs, fs_err *e)
{
    int *c = NULL, *d = NULL, rc = FS_OK;
    if (n > INT32_MAX) return fs_errf(e, FS_E_INPUT, "a gather of %lld bytes exceeds MPI's 2^31 limit", (long long)n);
    if (g->rank == root && ((rc = to_int(counts, g->size, &c, e)) || (rc = to_int(displs, g->size, &d, e)))) {
        /* the others are about to send: the caller ends the job */
        free(c);
        return rc;
    }
    if (g->rank != root) count(FS_COMM_GATHER, n);
    MPI_Gatherv(send, (int)n, MPI_BYTE, recv, c, d, MPI_BYTE, root, COMM(g));
    free(c);
    free(d);
    return FS_OK;
}

void fs_allgather_bytes(const fs_group *g, const void *send, size_t bytes, void *recv)
{
    MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, COMM(g));
}

void fs_gather_bytes(const fs_group *g, int root, const void *send, size_t bytes, void *recv)
{
    MPI_Gather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root, COMM(g));
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
