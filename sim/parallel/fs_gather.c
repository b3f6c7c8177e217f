#include "fs_gather.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_backend.h"

static int same_piece(const fs_piece *a, const fs_piece *b)
{
    if (a->ndim != b->ndim || a->sh.ndims != b->sh.ndims || a->sh.copy != b->sh.copy) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    for (int k = 0; k < a->sh.ndims; k++) {
        const fs_shard_dim *x = &a->sh.d[k], *y = &b->sh.d[k];
        if (x->dim != y->dim || x->n != y->n) return 0;
        for (int i = 0; i < x->n; i++)
            if (x->iv[i][0] != y->iv[i][0] || x->iv[i][1] != y->iv[i][1]) return 0;
    }
    return 1;
}

/* Global index along axis `dim` of local index `li` in piece p. */
static int64_t to_global(const fs_piece *p, int dim, int64_t li)
{
    for (int k = 0; k < p->sh.ndims; k++) {
        const fs_shard_dim *d = &p->sh.d[k];
        if (d->dim != dim) continue;
        for (int i = 0; i < d->n; i++) {
            int64_t len = d->iv[i][1] - d->iv[i][0];
            if (li < len) return d->iv[i][0] + li;
            li -= len;
        }
        return -1;
    }
    return li;
}

/* Global flat index of local element li of piece p in a tensor of gshape; 0 if outside. */
static int piece_global_index(const fs_piece *p, int64_t li, const int64_t *gshape, int64_t *gi_out)
{
    int64_t rem = li, gi = 0, stride = 1, idx[FS_MAX_DIMS];
    for (int d = p->ndim - 1; d >= 0; d--) {
        idx[d] = rem % p->shape[d];
        rem /= p->shape[d];
    }
    for (int d = p->ndim - 1; d >= 0; d--) {
        int64_t gd = to_global(p, d, idx[d]);
        if (gd < 0 || gd >= gshape[d]) return 0;
        gi += gd * stride;
        stride *= gshape[d];
    }
    *gi_out = gi;
    return 1;
}

const char *fs_piece_describe(const fs_piece *p, char *buf, size_t n)
{
    if (p->sh.ndims == 0) {
        snprintf(buf, n, "replicated");
        return buf;
    }
    size_t o = 0;
    for (int k = 0; k < p->sh.ndims && o < n; k++) {
        const fs_shard_dim *d = &p->sh.d[k];
        o += (size_t)snprintf(buf + o, n - o, "%sdim %d ", k ? ", " : "", d->dim);
        for (int i = 0; i < d->n && o < n; i++)
            o += (size_t)snprintf(buf + o, n - o, "%s[%lld,%lld)", i ? "+" : "", (long long)d->iv[i][0],
                                  (long long)d->iv[i][1]);
    }
    return buf;
}

fs_piece fs_piece_of(const fs_tensor *t, const fs_shard *sh)
{
    fs_piece p = {.ndim = t->ndim, .nbytes = (int64_t)fs_tensor_nbytes(t)};
    memcpy(p.shape, t->shape, sizeof p.shape);
    if (sh) p.sh = *sh;
    return p;
}

int fs_pieces_allgather(const fs_group *world, const fs_tensor *t, const fs_shard *sh, fs_piece *all)
{
    fs_piece mine = fs_piece_of(t, sh);
    fs_allgather_bytes(world, &mine, sizeof mine, all);
    return FS_OK;
}

int fs_pieces_global_shape(const fs_piece *all, int W, int64_t *gshape)
{
    int sharded_axis[FS_MAX_DIMS] = {0};
    memcpy(gshape, all[0].shape, sizeof(int64_t) * FS_MAX_DIMS);
    for (int r = 0; r < W; r++)
        for (int k = 0; k < all[r].sh.ndims; k++) sharded_axis[all[r].sh.d[k].dim] = 1;
    for (int d = 0; d < FS_MAX_DIMS; d++)
        if (sharded_axis[d]) gshape[d] = 0;
    for (int r = 0; r < W; r++) {
        const fs_piece *p = &all[r];
        if (p->ndim != all[0].ndim) return -1;
        for (int k = 0; k < p->sh.ndims; k++)
            for (int i = 0; i < p->sh.d[k].n; i++)
                if (p->sh.d[k].iv[i][1] > gshape[p->sh.d[k].dim]) gshape[p->sh.d[k].dim] = p->sh.d[k].iv[i][1];
        for (int d = 0; d < p->ndim; d++)
            if (!sharded_axis[d] && p->shape[d] != all[0].shape[d]) return -1;
    }
    return 0;
}

int fs_pieces_first_holder(const fs_piece *all, int W, int r)
{
    for (int q = 0; q < r && q < W; q++)
        if (same_piece(&all[q], &all[r])) return q;
    return r;
}

int fs_gather_to_root(const fs_group *world, const fs_tensor *dev, const fs_shard *sh, fs_gathered *g, fs_err *e)
{
    memset(g, 0, sizeof *g);
    const int W = world->size, root = 0, me = world->rank;
    /* the bytes this rank contributes, downloaded (a view when host-addressable) */
    fs_tensor host;
    int rc = fs_tensor_host_view(dev, &host, e);
    if (rc) return rc; /* the others go on into the gather: the CLI ends the job */
    const fs_tensor *t = &host;
    fs_piece mine = fs_piece_of(t, sh);
    mine.hash = fs_hash_bytes(t->data, fs_tensor_nbytes(t));
    g->world = W;
    if (me == root) {
        g->pieces = calloc((size_t)W, sizeof *g->pieces);
        g->group = calloc((size_t)W, sizeof *g->group);
        if (!g->pieces || !g->group) {
            fs_tensor_free(&host);
            return fs_errf(e, FS_E_NOMEM, "out of memory gathering %d pieces", W);
        }
    }
    fs_gather_bytes(world, root, &mine, sizeof mine, g->pieces);

    /* rank 0: group identical pieces, compare their hashes, choose senders */
    unsigned char *send = calloc((size_t)W, 1);
    if (!send) {
        fs_tensor_free(&host);
        return fs_errf(e, FS_E_NOMEM, "out of memory");
    }
    if (me == root) {
        size_t o = 0;
        for (int r = 0; r < W; r++) {
            g->group[r] = r;
            for (int q = 0; q < r; q++)
                if (g->group[q] == q && same_piece(&g->pieces[q], &g->pieces[r])) {
                    g->group[r] = q;
                    break;
                }
            if (g->group[r] == r) send[r] = 1;
            else if (g->pieces[r].hash != g->pieces[g->group[r]].hash) {
                if (!g->problem)
                    o += (size_t)snprintf(g->detail + o, sizeof g->detail - o, "ranks holding the same %s piece disagree:",
                                          g->pieces[r].sh.ndims ? "sharded" : "replicated");
                if (!g->problem) g->first_bad = r;
                g->problem = 1;
                if (o < sizeof g->detail)
                    o += (size_t)snprintf(g->detail + o, sizeof g->detail - o, " rank %d != rank %d;", r, g->group[r]);
            }
        }
    }
    fs_bcast(world, root, send, (size_t)W);

    /* phase 2: one copy of each distinct piece */
    int64_t *cnt = NULL, *dsp = NULL, total = 0;
    char *buf = NULL;
    if (me == root) {
        cnt = malloc(sizeof(int64_t) * 2 * (size_t)W);
        dsp = cnt ? cnt + W : NULL;
        for (int r = 0; cnt && r < W; r++) {
            cnt[r] = send[r] ? g->pieces[r].nbytes : 0;
            dsp[r] = total;
            total += cnt[r];
        }
        buf = malloc((size_t)total + 1);
        if (!cnt || !buf) rc = fs_errf(e, FS_E_NOMEM, "out of memory assembling %lld bytes", (long long)total);
    }
    if (!rc) rc = fs_gatherv_bytes(world, root, t->data, send[me] ? mine.nbytes : 0, buf, cnt, dsp, e);
    if (!rc && me == root) {
        int64_t gshape[FS_MAX_DIMS];
        int shape_ok = fs_pieces_global_shape(g->pieces, W, gshape) == 0;
        if (!shape_ok) {
            char a[64], b[64];
            g->problem = 2;
            fs_tensor ta = {.ndim = g->pieces[0].ndim}, tb = {.ndim = g->pieces[W - 1].ndim};
            memcpy(ta.shape, g->pieces[0].shape, sizeof ta.shape);
            memcpy(tb.shape, g->pieces[W - 1].shape, sizeof tb.shape);
            snprintf(g->detail, sizeof g->detail, "ranks hold pieces of incompatible shapes (rank 0 %s, rank %d %s)",
                     fs_tensor_shape_str(&ta, a, sizeof a), W - 1, fs_tensor_shape_str(&tb, b, sizeof b));
        } else if ((rc = fs_tensor_alloc(&g->global, t->dtype, g->pieces[0].ndim, gshape, e)) == FS_OK) {
            const int64_t N = fs_tensor_numel(&g->global);
            unsigned char *cov = calloc((size_t)N + 1, 1);
            if (!cov) {
                free(send);
                free(buf);
                free(cnt);
                fs_tensor_free(&host);
                return fs_errf(e, FS_E_NOMEM, "out of memory");
            }
            const size_t es = fs_dtype_size(t->dtype);
            /* copy 0's pieces first, then the other copies' (fs_shard.copy), each in rank order:
             * the global tensor takes an element from the first piece that holds it; a later
             * piece of the same copy must hold the same bytes (the layout replicates those tokens:
             * --text replicated's joint sequence); one of another copy goes to that copy's
             * tensor (below) */
            int ncopy = 1;
            for (int r = 0; r < W; r++)
                if (send[r] && g->pieces[r].sh.copy + 1 > ncopy) ncopy = g->pieces[r].sh.copy + 1;
            unsigned char *owner = calloc((size_t)N + 1, 1); /* copy + 1 of the piece that placed it */
            if (!owner) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            int other_copies = 0;
            for (int c = 0; c < ncopy && !rc; c++)
                for (int r = 0; r < W; r++) {
                    if (!send[r] || g->pieces[r].sh.copy != c) continue;
                    const fs_piece *p = &g->pieces[r];
                    int64_t n = 1;
                    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
                    const char *src = buf + dsp[r];
                    for (int64_t li = 0; li < n; li++) {
                        int64_t gi;
                        if (!piece_global_index(p, li, gshape, &gi)) continue;
                        char *dst = (char *)g->global.data + (size_t)gi * es;
                        if (cov[gi] && owner[gi] != c + 1) {
                            other_copies = 1;
                            continue;
                        }
                        if (cov[gi] && memcmp(dst, src + (size_t)li * es, es)) {
                            if (!g->problem) {
                                g->problem = 1;
                                g->first_bad = r;
                                snprintf(g->detail, sizeof g->detail, "ranks holding the same tokens disagree: rank %d's "
                                         "copy of global element %lld differs from a lower rank's (overlapping pieces "
                                         "must be bit-identical)", r, (long long)gi);
                            }
                            continue;
                        }
                        memcpy(dst, src + (size_t)li * es, es);
                        owner[gi] = (unsigned char)(c + 1);
                        if (cov[gi] < 255) cov[gi]++;
                    }
                }
            for (int64_t i = 0; i < N && !g->problem && !rc; i++)
                if (!cov[i]) {
                    g->problem = 2;
                    snprintf(g->detail, sizeof g->detail, "global element %lld is held by no piece: the shards do not "
                             "tile the tensor", (long long)i);
                    break;
                }
            /* the other copies: the global tensor with each copy's own values where it holds them */
            if (!rc && !g->problem && other_copies && ncopy > 1) {
                if (!(g->copies = calloc((size_t)ncopy - 1, sizeof *g->copies)))
                    rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                for (int c = 1; c < ncopy && !rc; c++) {
                    fs_tensor *a = &g->copies[c - 1];
                    if ((rc = fs_tensor_alloc(a, t->dtype, g->global.ndim, g->global.shape, e))) break;
                    g->ncopies = c;
                    memcpy(a->data, g->global.data, fs_tensor_nbytes(a));
                    for (int r = 0; r < W; r++) {
                        if (!send[r] || g->pieces[r].sh.copy != c) continue;
                        const fs_piece *p = &g->pieces[r];
                        int64_t n = 1, gi;
                        for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
                        for (int64_t li = 0; li < n; li++)
                            if (piece_global_index(p, li, gshape, &gi))
                                memcpy((char *)a->data + (size_t)gi * es, buf + dsp[r] + (size_t)li * es, es);
                    }
                }
            }
            free(owner);
            free(cov);
        }
    }
    free(send);
    free(buf);
    free(cnt);
    fs_tensor_free(&host);
    return rc;
}

void fs_gathered_free(fs_gathered *g)
{
    if (!g) return;
    for (int c = 0; c < g->ncopies; c++) fs_tensor_free(&g->copies[c]);
    free(g->copies);
    fs_tensor_free(&g->global);
    free(g->pieces);
    free(g->group);
    memset(g, 0, sizeof *g);
}

int fs_gathered_owners(const fs_gathered *g, const int64_t *coords, char *buf, size_t n)
{
    size_t o = 0;
    int first = -1;
    buf[0] = 0;
    for (int r = 0; r < g->world && o < n; r++) {
        const fs_piece *p = &g->pieces[r];
        int holds = 1;
        for (int k = 0; k < p->sh.ndims; k++) {
            const fs_shard_dim *d = &p->sh.d[k];
            int in = 0;
            for (int i = 0; i < d->n; i++) in |= coords[d->dim] >= d->iv[i][0] && coords[d->dim] < d->iv[i][1];
            holds &= in;
        }
        if (!holds) continue;
        if (first < 0) first = r;
        o += (size_t)snprintf(buf + o, n - o, "%s%d", o ? ", " : "", r);
    }
    return first;
}
