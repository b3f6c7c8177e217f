/* fo_rankdiff.c — `flux-oracle diff DIR REF.h5`: per-rank dumps compared with a global reference,
 * each rank's piece against the slice of the reference its own sharding map places it at (see
 * fo_diff.h, fo_rank_diff_run). The metrics, the tolerance rule and the messages are diff's
 * (fo_acc, fo_tolerance_pass, fo_diff_judge); this file only places the pieces. */
#include "fo_diff.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fo_walk.h"

#define DEFAULT_BLOCK (1 << 18) /* as fo_diff.c */

typedef struct rank_file {
    fo_file *f;
    int rank;
    cJSON *par;
    char gp[64];
    int present;
    fo_names names;
} rank_file;

typedef struct rank_ctx {
    rank_file *rf; /* in rank order */
    int n;
    fo_file *b;
    const fo_diff_opts *o;
    fo_report *r;
    fo_model_dims md;
    int64_t block;
} rank_ctx;

/* What one rank's piece of one dataset gave. */
typedef struct piece_res {
    fo_acc acc;
    fo_stats st;
    int64_t g_argmax; /* global flat index of st.argmax, -1 */
    double va, vb;
    int64_t g_mm, g_nf; /* first NaN/Inf mismatch, first non-finite value: global flat, -1 */
    double mm_a, mm_b, nf_a, nf_b;
} piece_res;

static const char *piece_note(const fo_piece *p, int found, int step, char *buf, size_t n)
{
    if (step < 0) snprintf(buf, n, "whole on every rank");
    else if (!found) snprintf(buf, n, "no sharding entry: whole on every rank");
    else if (p->replicated) snprintf(buf, n, "replicated");
    else {
        size_t o = (size_t)snprintf(buf, n, "sharded on dim");
        for (int i = 0; i < p->naxes && o < n; i++) o += (size_t)snprintf(buf + o, n - o, "%s %d", i ? "," : "", p->axis[i]);
    }
    return buf;
}

/* Streams rank file k's dataset `name` against the reference G (whole, as doubles) through the
 * piece's index maps. *shape_msg: a malloc'ed reason when the piece cannot be placed in G. */
static int compare_piece(rank_ctx *c, int k, const fo_walk_group *wg, const char *name, const fo_dataset *G, fo_acc *u,
                         piece_res *pr, char **shape_msg, char *note, size_t note_n, char *dtype, fs_err *e)
{
    rank_file *rf = &c->rf[k];
    char *p = fo_path_join(rf->gp, name);
    if (!p) return fs_errf(e, FS_E_NOMEM, "out of memory");
    fo_stream *s = NULL;
    fo_dataset li = {0};
    fo_piece pc = {0};
    int found = 0;
    double *ref = NULL;
    int64_t *gi = NULL;
    int rc = fo_stream_open(rf->f, p, c->block, &s, &li, e);
    if (!rc && wg->step >= 0) rc = fo_piece_from_json(rf->par, name, rf->rank, li.ndim, &pc, &found, fo_file_path(rf->f), e);
    if (rc) goto out;
    memcpy(dtype, li.dtype, 16);
    piece_note(&pc, found, wg->step, note, note_n);
    char sl[160], sg[160];
    fo_shape_str(li.ndim, li.shape, sl, sizeof sl);
    fo_shape_str(G->ndim, G->shape, sg, sizeof sg);
    /* where each local axis lies in the global one: split[d] = index of the axis in pc, or -1 */
    int split[FO_MAX_DIMS];
    for (int d = 0; d < FO_MAX_DIMS; d++) split[d] = -1;
    for (int i = 0; i < pc.naxes; i++) split[pc.axis[i]] = i;
    if (li.ndim != G->ndim) {
        *shape_msg = fo_strdupf("rank %d holds %s, B %s: not a piece of it", rf->rank, sl, sg);
        goto out;
    }
    for (int d = 0; d < li.ndim; d++) {
        int i = split[d];
        if (i < 0 && li.shape[d] != G->shape[d]) {
            *shape_msg = fo_strdupf("rank %d holds %s, B %s, and its map (%s) does not split dim %d", rf->rank, sl, sg,
                                    note, d);
            goto out;
        }
        if (i >= 0 && pc.len[i] != li.shape[d]) {
            *shape_msg = fo_strdupf("rank %d holds %s but its sharding entry gives it %lld elements of dim %d", rf->rank,
                                    sl, (long long)pc.len[i], d);
            goto out;
        }
        if (i >= 0 && pc.gext[i] > G->shape[d]) {
            *shape_msg = fo_strdupf("the sharding entry of rank %d places dim %d up to %lld, past B's %s", rf->rank, d,
                                    (long long)pc.gext[i], sg);
            goto out;
        }
    }
    int64_t gstride[FO_MAX_DIMS], lc[FO_MAX_DIMS] = {0};
    for (int d = li.ndim - 1, m = 1; d >= 0; d--) gstride[d] = m, m *= G->shape[d];
    if (!(ref = malloc((size_t)(c->block > 0 ? c->block : 1) * sizeof *ref)) ||
        !(gi = malloc((size_t)(c->block > 0 ? c->block : 1) * sizeof *gi))) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    fo_acc_init(&pr->acc);
    pr->g_argmax = pr->g_mm = pr->g_nf = -1;
    for (;;) {
        fo_view xa;
        int64_t off, na;
        if ((rc = fo_stream_view(s, &xa, &off, &na, e))) goto out;
        if (na == 0) break;
        if (na > c->block) {
            rc = fs_errf(e, FS_E_INTERNAL, "block larger than asked");
            goto out;
        }
        for (int64_t j = 0; j < na; j++) { /* local coordinates counted up, placed globally */
            int64_t g = 0;
            for (int d = 0; d < li.ndim; d++) g += (split[d] < 0 ? lc[d] : pc.g[split[d]][lc[d]]) * gstride[d];
            gi[j] = g;
            ref[j] = G->data[g];
            for (int d = li.ndim - 1; d >= 0; d--) {
                if (++lc[d] < li.shape[d]) break;
                lc[d] = 0;
            }
        }
        int64_t prev_arg = pr->acc.s.argmax, prev_mm = pr->acc.s.n_nonfinite_mismatch;
        fo_acc_add_view(&pr->acc, xa, fo_view_f64(ref), na);
        fo_acc_add_view(u, xa, fo_view_f64(ref), na);
        if (pr->acc.s.argmax != prev_arg && pr->acc.s.argmax >= off) {
            int64_t j = pr->acc.s.argmax - off;
            pr->g_argmax = gi[j], pr->va = fo_view_at(xa, j), pr->vb = ref[j];
        }
        if (pr->g_nf < 0 && pr->acc.s.first_nonfinite >= off) {
            int64_t j = pr->acc.s.first_nonfinite - off;
            pr->g_nf = gi[j], pr->nf_a = fo_view_at(xa, j), pr->nf_b = ref[j];
        }
        if (pr->acc.s.n_nonfinite_mismatch != prev_mm && pr->g_mm < 0)
            for (int64_t j = 0; j < na; j++)
                if (fo_nonfinite_mismatch(fo_view_at(xa, j), ref[j])) {
                    pr->g_mm = gi[j], pr->mm_a = fo_view_at(xa, j), pr->mm_b = ref[j];
                    break;
                }
    }
    fo_acc_finish(&pr->acc, &pr->st);
out:
    fo_stream_close(s);
    fo_piece_free(&pc);
    free(ref), free(gi), free(p);
    return rc;
}

static int compare_entry(rank_ctx *c, const fo_walk_group *wg, const char *gb, fo_entry *en, fs_err *e)
{
    const char *name = en->name;
    const fo_tolerance tol = c->r->tol;
    char *pb = fo_path_join(gb, name), sa[160];
    if (!pb) return fs_errf(e, FS_E_NOMEM, "out of memory");
    fo_dataset G = {0};
    piece_res *pr = calloc((size_t)c->n, sizeof *pr);
    char *shape_msg = NULL, note[96] = "";
    int rc = pr ? fo_dataset_read(c->b, pb, &G, e) : fs_errf(e, FS_E_NOMEM, "out of memory");
    free(pb);
    if (rc) goto out;
    en->ndim_a = en->ndim_b = G.ndim;
    memcpy(en->shape_a, G.shape, sizeof G.shape);
    memcpy(en->shape_b, G.shape, sizeof G.shape);
    memcpy(en->dtype_b, G.dtype, sizeof G.dtype);
    en->ranks_known = 1;
    if (wg->step >= 0 && fo_parallel_partial(c->rf[0].par, name)) {
        en->kind = FO_EMPTY;
        en->ranks_note = strdup("partial sum");
        en->msg = strdup("a partial sum before a reduction (parallel \"partial\"): not comparable rank by rank; the "
                         "reduced output is compared");
        goto out;
    }
    fo_acc u;
    fo_acc_init(&u);
    int shape_rank = -1;
    for (int k = 0; k < c->n && !rc && !shape_msg; k++) {
        rc = compare_piece(c, k, wg, name, &G, &u, &pr[k], &shape_msg, note, sizeof note, en->dtype_a, e);
        if (shape_msg) shape_rank = c->rf[k].rank;
    }
    if (rc) goto out;
    en->ranks_note = strdup(note);
    if (shape_msg) {
        en->kind = FO_SHAPE;
        en->ranks = (uint64_t)1 << shape_rank;
        en->msg = fo_strdupf("shape mismatch: %s", shape_msg);
        goto out;
    }
    fo_acc_finish(&u, &en->st);
    if (en->st.n == 0) {
        en->kind = FO_EMPTY;
        en->msg = fo_strdupf("empty on both sides (shape %s): nothing to compare", fo_shape_str(G.ndim, G.shape, sa, sizeof sa));
        goto out;
    }
    /* The whole reference's scale: what a piece's differences are judged against. */
    fo_stats gs;
    fo_compare(G.data, G.data, G.numel, &gs);
    uint64_t bad = 0;
    int worst = -1, big = -1, mm = -1, nf = -1;
    for (int k = 0; k < c->n; k++) {
        fo_stats ps = pr[k].st;
        ps.max_abs_b = gs.max_abs_b;
        ps.rel_l2 = gs.norm_b > 0 ? ps.norm_diff / gs.norm_b : ps.norm_diff > 0 ? INFINITY : 0;
        int fails = !fo_tolerance_pass(&ps, tol) || !fo_stats_all_finite(&ps);
        if (fails) {
            bad |= (uint64_t)1 << c->rf[k].rank;
            if (worst < 0 || pr[k].st.max_abs > pr[worst].st.max_abs) worst = k;
        }
        if (pr[k].g_argmax >= 0 && (big < 0 || pr[k].st.max_abs > pr[big].st.max_abs)) big = k;
        if (mm < 0 && pr[k].g_mm >= 0) mm = k;
        if (nf < 0 && pr[k].g_nf >= 0) nf = k;
    }
    int pass = fo_tolerance_pass(&en->st, tol);
    if (pass && bad) {
        /* all pieces together pass, one alone does not (a replicated copy that differs): show it */
        en->st = pr[worst].st;
        big = worst;
        pass = 0;
    }
    en->st.argmax = big >= 0 ? pr[big].g_argmax : -1;
    if (big >= 0) en->val_a = pr[big].va, en->val_b = pr[big].vb;
    fo_diff_judge(en, &c->md, tol, pass, mm >= 0 ? pr[mm].g_mm : -1, mm >= 0 ? pr[mm].mm_a : 0, mm >= 0 ? pr[mm].mm_b : 0,
                  nf >= 0 ? pr[nf].g_nf : -1, nf >= 0 ? pr[nf].nf_a : 0, nf >= 0 ? pr[nf].nf_b : 0);
    if (en->kind != FO_PASS) {
        en->ranks = bad;
        int at = en->kind == FO_NONFINITE ? (mm >= 0 ? mm : nf) : big;
        if (!en->ranks && at >= 0) en->ranks = (uint64_t)1 << c->rf[at].rank;
        if (at >= 0 && en->msg) {
            char *m = fo_strdupf("%s (A: rank %d's piece)", en->msg, c->rf[at].rank);
            if (m) free(en->msg), en->msg = m;
        }
    }
out:
    fo_dataset_free(&G);
    free(pr);
    free(shape_msg);
    return rc;
}

static int by_rank(const void *x, const void *y)
{
    const rank_file *a = x, *b = y;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

int fo_rank_diff_run(fo_file **files, int n, fo_file *b, const fo_diff_opts *o, fo_report *r, fs_err *e)
{
    fo_report_init(r, FO_MODE_DIFF);
    if (n < 1) return fs_errf(e, FS_E_INPUT, "no per-rank dump to compare");
    if (n > FO_MAX_RANKS) return fs_errf(e, FS_E_INPUT, "at most %d per-rank dumps", FO_MAX_RANKS);
    fo_diff_setup(r, o, files[0], b, 0);
    r->nfiles = n;
    rank_file *rf = calloc((size_t)n, sizeof *rf);
    if (!rf) return fs_errf(e, FS_E_NOMEM, "out of memory");
    int rc = FS_OK, world = -1;
    for (int i = 0; i < n && !rc; i++) {
        rf[i].f = files[i];
        const char *pj = fo_file_parallel(files[i]);
        rf[i].rank = fo_parallel_rank(pj);
        if (!pj || rf[i].rank < 0) {
            rc = fs_errf(e, FS_E_INPUT, "%s: attribute parallel has no \"rank\": not a per-rank dump", fo_file_path(files[i]));
            break;
        }
        if (rf[i].rank >= FO_MAX_RANKS) {
            rc = fs_errf(e, FS_E_INPUT, "%s: rank %d: at most %d ranks are supported", fo_file_path(files[i]), rf[i].rank,
                         FO_MAX_RANKS);
            break;
        }
        if (!(rf[i].par = cJSON_Parse(pj))) {
            rc = fs_errf(e, FS_E_INPUT, "%s: attribute parallel is not valid JSON", fo_file_path(files[i]));
            break;
        }
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(rf[i].par, "world");
        int wi = cJSON_IsNumber(w) ? (int)w->valuedouble : -1;
        if (i == 0) world = wi;
        else if (wi != world)
            rc = fs_errf(e, FS_E_INPUT, "%s (world %d) and %s (world %d) are not ranks of one run", fo_file_path(files[0]),
                         world, fo_file_path(files[i]), wi);
        for (int j = 0; j < i && !rc; j++)
            if (rf[j].rank == rf[i].rank)
                rc = fs_errf(e, FS_E_INPUT, "%s and %s both hold rank %d", fo_file_path(files[j]), fo_file_path(files[i]),
                             rf[i].rank);
        if (!rc) rc = fo_same_model(files[i], b, e);
    }
    if (!rc) qsort(rf, (size_t)n, sizeof *rf, by_rank);
    for (int i = 0; i < n; i++) r->rank_of_file[i] = rf[i].rank;
    char *note_a = NULL, *note_b = NULL;
    int partial0 = 0; /* rank 0's file is partial (--allow-partial): what it lacks is excused */
    for (int i = 0; i < n && !rc; i++) {
        rc = fo_require_complete(rf[i].f, o->allow_partial, &note_a, e);
        if (note_a && i == 0) partial0 = 1;
        if (note_a) {
            char *p = r->partial_note ? fo_strdupf("%s; %s", r->partial_note, note_a) : strdup(note_a);
            free(r->partial_note), free(note_a);
            r->partial_note = p, note_a = NULL;
        }
    }
    if (!rc) rc = fo_require_complete(b, o->allow_partial, &note_b, e);
    if (note_b) {
        char *p = r->partial_note ? fo_strdupf("%s; %s", r->partial_note, note_b) : strdup(note_b);
        free(r->partial_note);
        r->partial_note = p;
    }
    fo_decl da = {0}, db = {0};
    int have_decl = 0;
    if (!rc && !(rc = fo_decl_read(rf[0].f, partial0, &da, e))) {
        if ((rc = fo_decl_read(b, note_b != NULL, &db, e))) fo_decl_free(&da);
        else have_decl = 1;
    }
    free(note_b);
    rank_ctx c = {.rf = rf, .n = n, .b = b, .o = o, .r = r, .md = fo_read_model_dims(b),
                  .block = o->block_elems > 0 ? o->block_elems : DEFAULT_BLOCK};
    fo_walk_group *groups = NULL;
    int ng = 0;
    if (!rc && fo_walk_groups(rf[0].f, b, &groups, &ng)) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
    fo_names nb = {0};
    fo_name_set sa = {0}, sb = {0}, si = {0};
    for (int g = 0; g < ng && !rc; g++) {
        char gb[64];
        int pb = 0;
        char *deca = NULL, *decb = NULL;
        for (int i = 0; i < n && !rc; i++)
            rc = fo_walk_names(rf[i].f, &groups[g], rf[i].gp, sizeof rf[i].gp, &rf[i].names, &rf[i].present, e);
        if (rc || (rc = fo_walk_names(b, &groups[g], gb, sizeof gb, &nb, &pb, e))) break;
        if (groups[g].step >= 0 && rf[0].present && (rc = fo_attr_string(rf[0].f, rf[0].gp, "recorded_modules", &deca, e)))
            break;
        if (groups[g].step >= 0 && pb && (rc = fo_attr_string(b, gb, "recorded_modules", &decb, e))) {
            free(deca);
            break;
        }
        fo_name_set_free(&sa), fo_name_set_free(&sb);
        if (fo_name_set_make(&rf[0].names, &sa) || fo_name_set_make(&nb, &sb)) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        /* one run's ranks record the same names */
        for (int i = 1; i < n && !rc; i++) {
            fo_name_set_free(&si);
            if (fo_name_set_make(&rf[i].names, &si)) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            for (int k = 0; k < rf[0].names.n && !rc; k++)
                if (!fo_name_set_has(&si, rf[0].names.v[k]))
                    rc = fs_errf(e, FS_E_INPUT, "%s lacks %s/%s that %s holds: the ranks of one run record the same names",
                                 fo_file_path(rf[i].f), groups[g].group, FO_SHOW(rf[0].names.v[k]), fo_file_path(rf[0].f));
            for (int k = 0; k < rf[i].names.n && !rc; k++)
                if (!fo_name_set_has(&sa, rf[i].names.v[k]))
                    rc = fs_errf(e, FS_E_INPUT, "%s lacks %s/%s that %s holds: the ranks of one run record the same names",
                                 fo_file_path(rf[0].f), groups[g].group, FO_SHOW(rf[i].names.v[k]), fo_file_path(rf[i].f));
        }
        for (int k = 0; k < rf[0].names.n && !rc; k++) {
            const char *name = rf[0].names.v[k];
            if (fo_narrowed_out(o, groups[g].step, name)) {
                r->excluded++;
                continue;
            }
            if (!fo_name_set_has(&sb, name)) {
                /* A partial sum the ranks declare (a row-parallel Linear's local product before
                 * its all-reduce, e.g. Megatron's `_Row.mm`) is the producer's own intermediate:
                 * a global reference has no such tensor, and its reduced output is compared. */
                int partial = groups[g].step >= 0 && fo_parallel_partial(rf[0].par, name);
                if (fo_names_push(&r->only_a, groups[g].group, name) ||
                    (!partial && !fo_decl_excuses(&db, &groups[g], pb, decb, name) &&
                     fo_names_push(&r->undeclared_a, groups[g].group, name)))
                    rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                continue;
            }
            fo_entry *en = fo_report_add(r, groups[g].step, groups[g].group, name);
            if (!en) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            else rc = compare_entry(&c, &groups[g], gb, en, e);
        }
        for (int k = 0; k < nb.n && !rc; k++) {
            if (fo_name_set_has(&sa, nb.v[k])) continue;
            if (fo_narrowed_out(o, groups[g].step, nb.v[k])) {
                r->excluded++;
                continue;
            }
            if (fo_names_push(&r->only_b, groups[g].group, nb.v[k]) ||
                (!fo_decl_excuses(&da, &groups[g], rf[0].present, deca, nb.v[k]) &&
                 fo_names_push(&r->undeclared_b, groups[g].group, nb.v[k])))
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        }
        free(deca), free(decb);
    }
    if (!rc) fo_report_tally(r);
    fo_name_set_free(&sa), fo_name_set_free(&sb), fo_name_set_free(&si);
    fo_names_free(&nb);
    free(groups);
    if (have_decl) fo_decl_free(&da), fo_decl_free(&db);
    for (int i = 0; i < n; i++) {
        cJSON_Delete(rf[i].par);
        fo_names_free(&rf[i].names);
    }
    free(rf);
    return rc;
}
