#include "fs_sink.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "fs_gather.h"

struct fs_sink {
    fs_sink_opts o;
    int gather;            /* parallel run: the global dump is written collectively, by pieces */
    cJSON *sharding;       /* name -> distribution, for the global dump's `parallel` (first step) */
    cJSON *local_sharding; /* the same, for the per-rank file */
    int step;
    int agreed;            /* a failure every rank learnt together (fs_sink_agreed_error) */
};

/* A parallel run: a dump failure on one rank (a full disk, a write error) is agreed by every
 * rank before the next collective, so all of them leave the run at the same record with the
 * first failing rank's message, and the job ends normally (exit 2 everywhere, the dumps
 * deleted) instead of through MPI_Abort. */
static int parallel(const fs_sink *k) { return k->o.par && k->o.par->world > 1; }
static int sink_agree(fs_sink *k, int rc, fs_err *e)
{
    if (!parallel(k)) return rc;
    rc = fs_agree_error(k->o.par->g_world, rc, e);
    if (rc) k->agreed = 1;
    return rc;
}

int fs_sink_agreed_error(const fs_sink *s) { return s && s->agreed; }

int fs_sink_create(fs_sink **out, const fs_sink_opts *o, fs_err *e)
{
    fs_sink *s = calloc(1, sizeof *s);
    if (!s) return fs_errf(e, FS_E_NOMEM, "out of memory");
    s->o = *o;
    s->gather = o->par && o->par->world > 1;
    s->sharding = cJSON_CreateObject();
    s->local_sharding = cJSON_CreateObject();
    if (!s->sharding || !s->local_sharding) {
        fs_sink_free(s);
        return fs_errf(e, FS_E_NOMEM, "out of memory");
    }
    *out = s;
    return FS_OK;
}

void fs_sink_free(fs_sink *s)
{
    if (!s) return;
    fs_dump_abort(s->o.dump);
    fs_dump_abort(s->o.local);
    cJSON_Delete(s->sharding);
    cJSON_Delete(s->local_sharding);
    free(s);
}

static int sink_begin(void *ctx, int step, double t, double sg, double sn, fs_err *e)
{
    fs_sink *k = ctx;
    k->step = step;
    int rc = FS_OK;
    if (k->o.check) {
        fs_step_hooks h = fs_check_hooks(k->o.check);
        rc = h.begin_step(h.ctx, step, t, sg, sn, e);
    }
    if (!rc && k->o.dump) rc = fs_dump_begin_step(k->o.dump, step, t, sg, sn, e);
    if (!rc && k->o.local) rc = fs_dump_begin_step(k->o.local, step, t, sg, sn, e);
    if (k->o.dump || k->o.local) rc = sink_agree(k, rc, e);
    return rc;
}

static int sink_end(void *ctx, int step, fs_err *e)
{
    fs_sink *k = ctx;
    int rc = k->o.dump ? fs_dump_end_step(k->o.dump, e) : FS_OK;
    if (!rc && k->o.local) rc = fs_dump_end_step(k->o.local, e);
    if (k->o.dump || k->o.local) rc = sink_agree(k, rc, e);
    return rc;
}

/* flux-dump `sharding` entry of one dataset from every rank's piece. */
static cJSON *sharding_json(const fs_piece *pieces, int world)
{
    const fs_piece *p0 = &pieces[0];
    if (p0->sh.ndims == 0) return cJSON_CreateString("replicated");
    cJSON *dims = cJSON_CreateArray();
    for (int k = 0; k < p0->sh.ndims; k++) {
        cJSON *o = cJSON_CreateObject(), *ranges = cJSON_CreateArray();
        cJSON_AddNumberToObject(o, "dim", p0->sh.d[k].dim);
        for (int r = 0; r < world; r++) {
            cJSON *rr = cJSON_CreateArray();
            const fs_shard_dim *d = &pieces[r].sh.d[k];
            for (int i = 0; i < d->n; i++) {
                double iv[2] = {(double)d->iv[i][0], (double)d->iv[i][1]};
                cJSON_AddItemToArray(rr, cJSON_CreateDoubleArray(iv, 2));
            }
            cJSON_AddItemToArray(ranges, rr);
        }
        cJSON_AddItemToObject(o, "ranges", ranges);
        cJSON_AddItemToArray(dims, o);
    }
    if (p0->sh.ndims == 1) {
        cJSON *one = cJSON_DetachItemFromArray(dims, 0);
        cJSON_Delete(dims);
        return one;
    }
    cJSON *o = cJSON_CreateObject(); /* split on two axes: the flux-dump extension key "dims" */
    cJSON_AddItemToObject(o, "dims", dims);
    return o;
}

/* Every rank's piece of `t` (descriptors only), and at step 0 its entry in `map`. */
static int learn_pieces(fs_sink *k, const fs_tensor *t, const fs_shard *sh, const char *name, cJSON *map, fs_piece **all,
                        fs_err *e)
{
    const int W = k->o.par->world;
    *all = calloc((size_t)W, sizeof **all);
    if (!*all) return fs_errf(e, FS_E_NOMEM, "out of memory"); /* the others are in the collective: the CLI ends the job */
    fs_pieces_allgather(k->o.par->g_world, t, sh, *all);
    if (map && k->step == 0 && !cJSON_GetObjectItemCaseSensitive(map, name))
        cJSON_AddItemToObject(map, name, sharding_json(*all, W));
    else if (map && k->step > 0) {
        /* one entry per name holds for every step; where a later step is split otherwise (FLUX.2's
         * KV cache under Ulysses: step 0's image stream holds the reference tokens too) the name
         * gets none, rather than one that is wrong for some steps */
        cJSON *had = cJSON_GetObjectItemCaseSensitive(map, name), *now = had ? sharding_json(*all, W) : NULL;
        if (had && now && !cJSON_Compare(had, now, 1)) cJSON_DeleteItemFromObjectCaseSensitive(map, name);
        cJSON_Delete(now);
    }
    return FS_OK;
}

static int sink_record(void *ctx, const char *name, const fs_tensor *dev, const fs_shard *sh, fs_err *e)
{
    fs_sink *k = ctx;
    fs_tensor host;
    int rc = fs_tensor_host_view(dev, &host, e); /* downloaded once, for every consumer */
    if (rc) return rc;
    const fs_tensor *t = &host;
    fs_piece *all = NULL;
    if (k->o.check) {
        fs_recorder r = fs_check_recorder(k->o.check);
        if ((rc = r.fn(r.ctx, name, t, sh, e))) goto out;
    }
    if (k->o.local) { /* this rank's view; at step 0 learn every rank's piece for the sharding map */
        rc = sink_agree(k, fs_dump_record(k->o.local, name, t, e), e); /* each rank writes its own file */
        if (rc) goto out;
        if (k->step == 0 && !cJSON_GetObjectItemCaseSensitive(k->local_sharding, name)) {
            if ((rc = learn_pieces(k, t, sh, name, k->local_sharding, &all, e))) goto out;
            free(all);
            all = NULL;
        }
    }
    if (!k->o.dump) goto out;
    if (!k->gather) {
        rc = fs_dump_record(k->o.dump, name, t, e);
        goto out;
    }
    /* parallel HDF5: every rank learns every piece (descriptors only), so all agree on the
     * global shape and on who writes each duplicate, then each writes its own hyperslab */
    const int W = k->o.par->world, me = k->o.par->rank;
    int64_t gshape[FS_MAX_DIMS];
    if ((rc = learn_pieces(k, t, sh, name, k->sharding, &all, e))) goto out;
    if (fs_pieces_global_shape(all, W, gshape)) rc = fs_errf(e, FS_E_INTERNAL, "%s: ranks hold incompatible pieces", name);
    if (!rc) rc = fs_dump_record_piece(k->o.dump, name, t, sh, gshape, fs_pieces_first_holder(all, W, me) == me, e);
    /* a failed write on one rank stops every rank at the same record (the dump agreed already) */
    rc = sink_agree(k, rc, e);
out:
    free(all);
    fs_tensor_free(&host);
    return rc;
}

fs_recorder fs_sink_recorder(fs_sink *s) { return (fs_recorder){.fn = sink_record, .ctx = s}; }
fs_step_hooks fs_sink_hooks(fs_sink *s) { return (fs_step_hooks){.begin_step = sink_begin, .end_step = sink_end, .ctx = s}; }

char *fs_parallel_json(const fs_par *par, int rank, const char *plan_source, cJSON *sharding)
{
    cJSON *pj = cJSON_CreateObject(), *mesh = cJSON_CreateObject();
    cJSON_AddNumberToObject(pj, "world", par->world);
    if (rank >= 0) cJSON_AddNumberToObject(pj, "rank", rank);
    cJSON_AddNumberToObject(mesh, "tp", par->tp);
    cJSON_AddNumberToObject(mesh, "ulysses", par->ulysses);
    cJSON_AddNumberToObject(mesh, "ring", par->ring);
    if (par->cfg_par > 1) cJSON_AddNumberToObject(mesh, "cfg", par->cfg_par); /* --cfg-parallel: outermost */
    cJSON_AddItemToObject(pj, "mesh", mesh);
    cJSON_AddStringToObject(pj, "ring_rotate", par->rotate == FS_RING_P2P ? "p2p" : "allgather");
    cJSON_AddStringToObject(pj, "tp_plan", plan_source);
    cJSON_AddItemToObject(pj, "sharding", sharding);
    char *js = cJSON_PrintUnformatted(pj);
    cJSON_Delete(pj);
    return js;
}

/* The `parallel` attribute (when there is a layout), /final/latents, and the file sealed
 * (fs_dump_seal: complete and closed, not yet renamed). */
static int seal_dump(fs_dump *d, const fs_par *par, int rank, const char *plan, cJSON **map, const fs_tensor *lat,
                     fs_err *e)
{
    int rc = FS_OK;
    if (par && (par->world > 1 || rank >= 0)) {
        char *js = fs_parallel_json(par, rank, plan, *map);
        *map = NULL;
        rc = js ? fs_dump_set_attr_string(d, "parallel", js, e) : fs_errf(e, FS_E_NOMEM, "out of memory");
        free(js);
    }
    if (!rc) rc = fs_dump_write_final(d, lat, e);
    if (!rc) rc = fs_dump_seal(d, e);
    return rc;
}

/* Every dump is sealed before any is published, and a parallel job agrees at each stage: the
 * per-rank files and the global dump appear together or not at all (a full disk on one rank at
 * the last flush deletes every rank's file). On failure fs_sink_free deletes what is left. */
int fs_sink_finish(fs_sink *s, const char *plan_source, const fs_tensor *latents, fs_err *e)
{
    int rc = FS_OK;
    if (s->o.local)
        rc = seal_dump(s->o.local, s->o.par, s->o.par ? s->o.par->rank : 0, plan_source, &s->local_sharding, latents, e);
    if (s->o.local) rc = sink_agree(s, rc, e);
    if (!rc && s->o.dump) rc = seal_dump(s->o.dump, s->o.par, -1, plan_source, &s->sharding, latents, e);
    if (!rc && s->o.local) {
        rc = fs_dump_publish(s->o.local, e); /* frees it in every case */
        s->o.local = NULL;
        rc = sink_agree(s, rc, e);
    }
    if (!rc && s->o.dump) {
        rc = fs_dump_publish(s->o.dump, e);
        s->o.dump = NULL;
    }
    return rc;
}
