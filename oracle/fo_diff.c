/* fo_diff.c — `flux-oracle diff`: two dumps (and an optional arbiter) compared dataset by
 * dataset in execution order (see fo_diff.h). */
#include "fo_diff.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fo_config.h"
#include "fo_walk.h"

#define DEFAULT_BLOCK (1 << 18) /* 256 Ki values: 2 MB of doubles per file; larger blocks were no faster */

int fo_narrowed_out(const fo_diff_opts *o, int step, const char *name)
{
    if (!o || step < 0) return 0; /* /inputs and /final are always compared */
    if (o->steps && !fo_steps_has(o->steps, step)) return 1;
    return o->modules && !fo_globs_match(o->modules, name);
}

int fo_require_complete(fo_file *f, int allow_partial, char **note, fs_err *e)
{
    if (note) *note = NULL;
    fo_completeness c;
    int rc = fo_file_completeness(f, &c, e);
    if (rc) return rc;
    if (c.complete) return FS_OK;
    char last[32];
    if (c.last_step >= 0) snprintf(last, sizeof last, "%d", c.last_step);
    else snprintf(last, sizeof last, "none");
    if (!allow_partial)
        return fs_errf(e, FS_E_INPUT, "%s: partial dump (last step present: %s): %s; --allow-partial compares what is there",
                       fo_file_path(f), last, c.reason);
    if (note && !(*note = fo_strdupf("%s is partial (last step present: %s; %s): compared what is there",
                                     fo_file_path(f), last, c.reason)))
        return fs_errf(e, FS_E_NOMEM, "out of memory");
    return FS_OK;
}

typedef struct diff_ctx {
    fo_file *a, *b, *t;
    const fo_diff_opts *o;
    fo_report *r;
    fo_model_dims md;
    int rank_a, rank_b;
    int64_t block;
    cJSON *par_a, *par_b; /* parsed `parallel` attributes, NULL when absent */
} diff_ctx;

static void set_at(fo_entry *en, const fo_model_dims *md, int64_t at)
{
    en->at = at;
    if (at < 0) return;
    fo_unravel(at, en->ndim_a, en->shape_a, en->coords);
    fo_describe_coords(en->group, en->name, en->ndim_a, en->shape_a, en->coords, md->batch, md->s_txt, md->s_img,
                       md->heads, md->head_dim, en->where, sizeof en->where);
}

static const char *nonfinite_word(double v) { return isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"; }

typedef struct diff_job {  /* jobs[k] fills the report's entry k */
    char ga[64], gb[64], gt[64]; /* gt "" when the truth lacks the group */
    fo_stream *sa, *sb, *st; /* st NULL: no truth for this dataset */
    fo_dataset ia;           /* A's shape (B's too, unless the entry is FO_SHAPE) */
    fo_shard shard;
    int use_shard;
    double *rank_max;        /* [FO_MAX_RANKS] when use_shard */
    int rc;                  /* FS_OK, or the error in err */
    fs_err err;
} diff_job;

static void job_release(diff_job *j)
{
    fo_stream_close(j->sa), fo_stream_close(j->sb), fo_stream_close(j->st);
    j->sa = j->sb = j->st = NULL;
    fo_shard_free(&j->shard);
    free(j->rank_max);
    j->rank_max = NULL;
}

static int diff_open(diff_ctx *c, diff_job *j, fo_entry *en, fs_err *e)
{
    char *pa, *pb, *pt = NULL, sa_[160], sb_[160];
    const char *ga = j->ga, *gb = j->gb, *gt = j->gt[0] ? j->gt : NULL;
    pa = fo_path_join(ga, en->name);
    pb = fo_path_join(gb, en->name);
    fo_dataset ia = {0}, ib = {0}, it = {0};
    fo_shard shard = {0};
    int rc = FS_OK;
    if (!pa || !pb) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = fo_stream_open(c->a, pa, c->block, &j->sa, &ia, e))) goto out;
    if ((rc = fo_stream_open(c->b, pb, c->block, &j->sb, &ib, e))) goto out;
    en->ndim_a = ia.ndim, en->ndim_b = ib.ndim;
    memcpy(en->shape_a, ia.shape, sizeof ia.shape);
    memcpy(en->shape_b, ib.shape, sizeof ib.shape);
    memcpy(en->dtype_a, ia.dtype, sizeof ia.dtype);
    memcpy(en->dtype_b, ib.dtype, sizeof ib.dtype);
    int same_shape = ia.ndim == ib.ndim && !memcmp(ia.shape, ib.shape, (size_t)ia.ndim * sizeof *ia.shape);
    if (!same_shape) {
        en->kind = FO_SHAPE;
        en->msg = fo_strdupf("shape mismatch: A %s vs B %s", fo_shape_str(ia.ndim, ia.shape, sa_, sizeof sa_),
                            fo_shape_str(ib.ndim, ib.shape, sb_, sizeof sb_));
        goto out;
    }
    if (ia.numel == 0) { /* nothing to compare; a pass would claim agreement nobody checked */
        en->kind = FO_EMPTY;
        en->msg = fo_strdupf("empty on both sides (shape %s): nothing to compare",
                             fo_shape_str(ia.ndim, ia.shape, sa_, sizeof sa_));
        goto out;
    }
    if (c->t && gt) {
        if (!(pt = fo_path_join(gt, en->name))) {
            rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            goto out;
        }
        if (fo_is_dataset(c->t, pt)) {
            if ((rc = fo_stream_open(c->t, pt, c->block, &j->st, &it, e))) goto out;
            if (it.ndim != ia.ndim || memcmp(it.shape, ia.shape, (size_t)ia.ndim * sizeof *ia.shape)) {
                fo_stream_close(j->st); /* the truth has another shape: judge without it */
                j->st = NULL;
            }
        }
    }
    /* Rank attribution: a per-rank file is its rank; a global dump maps elements through its
     * sharding map (B's first: B is the reference, usually the single-device or parallel run
     * whose layout we want to blame). */
    if (c->rank_a >= 0 || c->rank_b >= 0) {
        en->ranks_known = 1;
        if (c->rank_a >= 0) en->ranks |= (uint64_t)1 << (c->rank_a % FO_MAX_RANKS);
        if (c->rank_b >= 0) en->ranks |= (uint64_t)1 << (c->rank_b % FO_MAX_RANKS);
        en->ranks_note = strdup("per-rank file");
    } else {
        int found = 0;
        for (int k = 0; k < 2 && !found; k++) {
            fo_file *f = k == 0 ? c->b : c->a;
            cJSON *root = k == 0 ? c->par_b : c->par_a;
            if (!root) continue;
            if ((rc = fo_shard_from_json(root, en->name, ia.ndim, ia.shape, &shard, &found, fo_file_path(f), e)))
                goto out;
        }
        if (found && shard.replicated) {
            en->ranks_note = strdup("replicated");
        } else if (found) {
            j->use_shard = 1;
            en->ranks_known = 1;
            j->rank_max = calloc(FO_MAX_RANKS, sizeof *j->rank_max);
            if (!j->rank_max) {
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                goto out;
            }
            char note[64];
            size_t o = (size_t)snprintf(note, sizeof note, "sharded on dim");
            for (int i = 0; i < shard.naxes && o < sizeof note; i++)
                o += (size_t)snprintf(note + o, sizeof note - o, "%s %d", i ? "," : "", shard.axis[i]);
            en->ranks_note = strdup(note);
        }
    }
out:
    free(pa), free(pb), free(pt);
    j->ia = ia;
    j->shard = shard;
    return rc;
}

void fo_diff_judge(fo_entry *en, const fo_model_dims *md, fo_tolerance tol, int pass, int64_t first_mismatch,
                   double fm_a, double fm_b, int64_t first_nf, double fn_a, double fn_b)
{
    if (en->st.n_nonfinite_mismatch) {
        en->kind = FO_NONFINITE;
        set_at(en, md, first_mismatch);
        en->val_a = fm_a, en->val_b = fm_b;
        int a_bad = !isfinite(fm_a);
        double bad = a_bad ? fm_a : fm_b, other = a_bad ? fm_b : fm_a;
        char ob[48], co[96];
        if (isfinite(other)) snprintf(ob, sizeof ob, "is finite (%.6g)", other);
        else snprintf(ob, sizeof ob, "holds %s", nonfinite_word(other));
        fo_coords_str(en->ndim_a, en->coords, co, sizeof co);
        en->msg = fo_strdupf("%s in %s where %s %s at %s%s%s%s: %lld such element%s (NaN A/B %lld/%lld, Inf A/B %lld/%lld)",
                            nonfinite_word(bad), a_bad ? "A" : "B", a_bad ? "B" : "A", ob, co, en->where[0] ? " (" : "",
                            en->where, en->where[0] ? ")" : "", (long long)en->st.n_nonfinite_mismatch,
                            en->st.n_nonfinite_mismatch == 1 ? "" : "s", (long long)en->st.nan_a,
                            (long long)en->st.nan_b, (long long)en->st.inf_a, (long long)en->st.inf_b);
    } else if (!fo_stats_all_finite(&en->st)) {
        /* The same NaN/Inf at the same places on both sides: the two runs agree on being broken.
         * That is not a pass (two all-NaN dumps would otherwise PASS). */
        en->kind = FO_NONFINITE;
        set_at(en, md, first_nf);
        en->val_a = fn_a, en->val_b = fn_b;
        char co[96];
        fo_coords_str(en->ndim_a, en->coords, co, sizeof co);
        en->msg = fo_strdupf("non-finite on both sides: %s in A and B at the same places, first at %s%s%s%s (NaN A/B "
                             "%lld/%lld, Inf A/B %lld/%lld); a tensor holding NaN/Inf never passes",
                             nonfinite_word(fn_a), co, en->where[0] ? " (" : "", en->where, en->where[0] ? ")" : "",
                             (long long)en->st.nan_a, (long long)en->st.nan_b, (long long)en->st.inf_a,
                             (long long)en->st.inf_b);
    } else {
        set_at(en, md, en->st.argmax);
        if (!pass) {
            en->kind = FO_TOL;
            char co[96], why[256];
            fo_coords_str(en->ndim_a, en->coords, co, sizeof co);
            double mr = fo_stats_max_rel(&en->st);
            if (en->has_truth) {
                double ma = fo_stats_max_rel(&en->st_a_truth), mb = fo_stats_max_rel(&en->st_b_truth);
                if (!(en->st_a_truth.rel_l2 <= tol.m_rel * en->st_b_truth.rel_l2 + tol.rtol / 10))
                    snprintf(why, sizeof why, "rel L2 vs truth: A %.3g > %g x B %.3g + %.3g", en->st_a_truth.rel_l2,
                             tol.m_rel, en->st_b_truth.rel_l2, tol.rtol / 10);
                else
                    snprintf(why, sizeof why, "max rel vs truth: A %.3g > %g x B %.3g + %.3g", ma, tol.m_max, mb,
                             tol.mtol / 10);
            } else if (!(en->st.rel_l2 <= tol.rtol)) {
                snprintf(why, sizeof why, "rel L2 %.3g > rtol %.3g (max rel %.3g)", en->st.rel_l2, tol.rtol, mr);
            } else {
                snprintf(why, sizeof why, "max rel %.3g > mtol %.3g (rel L2 %.3g within rtol %.3g)", mr, tol.mtol,
                         en->st.rel_l2, tol.rtol);
            }
            en->msg = fo_strdupf("out of tolerance: %s; max|A-B| %.3g at %s%s%s%s, A %.9g vs B %.9g; cosine %.9f", why,
                                en->st.max_abs, co, en->where[0] ? " (" : "", en->where, en->where[0] ? ")" : "",
                                en->val_a, en->val_b, en->st.cosine);
        }
    }
}

static int diff_pass(diff_ctx *c, diff_job *j, fo_entry *en, fs_err *e)
{
    fo_stream *sa = j->sa, *sb = j->sb, *st = j->st;
    const fo_dataset ia = j->ia;
    const fo_shard shard = j->shard;
    const int use_shard = j->use_shard;
    double *rank_max = j->rank_max;
    int rc = FS_OK;
    fo_acc ab, at, bt;
    fo_acc_init(&ab), fo_acc_init(&at), fo_acc_init(&bt);
    uint64_t nf_ranks = 0;
    int64_t first_mismatch = -1, first_nf = -1;
    double fm_a = 0, fm_b = 0, fn_a = 0, fn_b = 0;
    for (;;) {
        fo_view xa, xb, xt = {NULL, FO_V_F64};
        int64_t off, na, nb, offt, nt;
        if ((rc = fo_stream_view(sa, &xa, &off, &na, e))) goto out;
        if ((rc = fo_stream_view(sb, &xb, &off, &nb, e))) goto out;
        if (st && (rc = fo_stream_view(st, &xt, &offt, &nt, e))) goto out;
        if (na == 0) break;
        int64_t prev_arg = ab.s.argmax, prev_mm = ab.s.n_nonfinite_mismatch;
        fo_acc_add_view(&ab, xa, xb, na);
        if (ab.s.argmax != prev_arg && ab.s.argmax >= off)
            en->val_a = fo_view_at(xa, ab.s.argmax - off), en->val_b = fo_view_at(xb, ab.s.argmax - off);
        if (first_nf < 0 && ab.s.first_nonfinite >= off) {
            first_nf = ab.s.first_nonfinite;
            fn_a = fo_view_at(xa, first_nf - off), fn_b = fo_view_at(xb, first_nf - off);
        }
        if (ab.s.n_nonfinite_mismatch != prev_mm && first_mismatch < 0) {
            for (int64_t i = 0; i < na; i++) {
                double x = fo_view_at(xa, i), y = fo_view_at(xb, i);
                if (!fo_nonfinite_mismatch(x, y)) continue;
                first_mismatch = off + i, fm_a = x, fm_b = y;
                break;
            }
        }
        if (xt.p) {
            fo_acc_add_view(&at, xa, xt, na);
            fo_acc_add_view(&bt, xb, xt, na);
        }
        if (use_shard) {
            int64_t co[FO_MAX_DIMS];
            for (int64_t i = 0; i < na; i++) {
                double x = fo_view_at(xa, i), y = fo_view_at(xb, i), d = x - y;
                /* any NaN/Inf fails (see below), so its owners are the ranks to blame */
                int bad_nf = !isfinite(x) || !isfinite(y);
                if (!bad_nf && !(fabs(d) > 0)) continue;
                fo_unravel(off + i, ia.ndim, ia.shape, co);
                uint64_t m = fo_shard_owner(&shard, ia.ndim, co);
                if (bad_nf) nf_ranks |= m;
                else
                    for (int r = 0; r < FO_MAX_RANKS; r++)
                        if ((m >> r & 1) && fabs(d) > rank_max[r]) rank_max[r] = fabs(d);
            }
        }
    }
    fo_acc_finish(&ab, &en->st);
    const fo_tolerance tol = c->r->tol;
    int pass = fo_tolerance_pass(&en->st, tol);
    if (st) {
        en->has_truth = 1;
        fo_acc_finish(&at, &en->st_a_truth);
        fo_acc_finish(&bt, &en->st_b_truth);
        /* A is the candidate, B the baseline (e.g. flux-sim's own run of the same precision) */
        pass = en->st.n_nonfinite_mismatch == 0 && fo_tolerance_arbiter(&en->st_a_truth, &en->st_b_truth, tol);
    }
    fo_diff_judge(en, &c->md, tol, pass, first_mismatch, fm_a, fm_b, first_nf, fn_a, fn_b);
    if (use_shard && (en->kind == FO_NONFINITE)) en->ranks = nf_ranks;
    if (use_shard && en->kind == FO_TOL) {
        /* Ranks whose own elements would fail the max rel criterion (max|Δ| > mtol ·
         * max|B|); if none alone does (a diffuse rel-L2 failure), the owner of the largest
         * difference. */
        double thr = tol.mtol > 0 ? tol.mtol * en->st.max_abs_b : 0.1 * en->st.max_abs;
        if (thr < tol.atol) thr = tol.atol;
        for (int r = 0; r < FO_MAX_RANKS; r++)
            if (rank_max[r] > thr) en->ranks |= (uint64_t)1 << r;
        if (!en->ranks && en->at >= 0) en->ranks = fo_shard_owner(&shard, ia.ndim, en->coords);
    }
    if (pass && en->kind == FO_PASS && use_shard) en->ranks = 0;
out:
    return rc;
}

void fo_diff_setup(fo_report *r, const fo_diff_opts *o, fo_file *a, fo_file *b, int with_truth)
{
    r->tol = o->tol_given ? o->tol
                          : fo_tolerance_looser(fo_tolerance_default(fo_file_dtype(a)),
                                                fo_tolerance_default(fo_file_dtype(b)));
    /* the arbiter's multipliers: the dtypes' (bf16: measured, docs/bf16.md), or --multiplier for both */
    r->tol.m_rel = fo_tolerance_m_rel(r->tol);
    r->tol.m_max = fo_tolerance_m_max(r->tol);
    if (o->multiplier > 0) r->tol.m_rel = r->tol.m_max = o->multiplier;
    r->multiplier = r->tol.m_rel;
    r->with_truth = with_truth;
    r->narrowed = o->modules != NULL || o->steps != NULL;
}

/* The two files must describe one model; a malformed config is an error of that file. */
int fo_same_model(fo_file *a, fo_file *b, fs_err *e)
{
    int same = 0;
    char why[600];
    int rc = fo_config_compare(fo_file_config(a), fo_file_path(a), fo_file_config(b), fo_file_path(b), &same, why,
                               sizeof why, e);
    if (rc) return rc;
    if (!same)
        return fs_errf(e, FS_E_INPUT, "%s and %s are dumps of different models (config: %s): nothing to compare",
                       fo_file_path(a), fo_file_path(b), why);
    return FS_OK;
}

/* A step group's recorded_modules (NULL when the group or the attribute is absent). */
static int modules_decl(fo_file *f, const fo_walk_group *wg, const char *gpath, int present, char **out, fs_err *e)
{
    *out = NULL;
    if (wg->step < 0 || !present) return FS_OK;
    return fo_attr_string(f, gpath, "recorded_modules", out, e);
}

int fo_diff_run(fo_file *a, fo_file *b, fo_file *truth, const fo_diff_opts *o, fo_report *r, fs_err *e)
{
    fo_report_init(r, FO_MODE_DIFF);
    fo_diff_setup(r, o, a, b, truth != NULL);
    /* What makes a comparison meaningless is refused before anything is read: different models,
     * and files whose producer did not finish. */
    int rc = fo_same_model(a, b, e);
    if (!rc && truth) rc = fo_same_model(b, truth, e);
    char *note_a = NULL, *note_b = NULL;
    if (!rc) rc = fo_require_complete(a, o->allow_partial, &note_a, e);
    if (!rc) rc = fo_require_complete(b, o->allow_partial, &note_b, e);
    if (!rc && truth) rc = fo_require_complete(truth, o->allow_partial, NULL, e);
    if (!rc && (note_a || note_b)) {
        r->partial_note = note_a && note_b ? fo_strdupf("%s; %s", note_a, note_b) : note_a ? strdup(note_a) : strdup(note_b);
        if (!r->partial_note) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
    }
    const int partial_a = note_a != NULL, partial_b = note_b != NULL;
    free(note_a), free(note_b);
    if (rc) return rc;
    fo_decl da, db;
    memset(&db, 0, sizeof db);
    /* --allow-partial excuses only what a partial file lacks */
    if ((rc = fo_decl_read(a, partial_a, &da, e))) return rc;
    if ((rc = fo_decl_read(b, partial_b, &db, e))) {
        fo_decl_free(&da);
        return rc;
    }

    diff_ctx c = {.a = a, .b = b, .t = truth, .o = o, .r = r, .md = fo_read_model_dims(a),
                  .rank_a = fo_parallel_rank(fo_file_parallel(a)), .rank_b = fo_parallel_rank(fo_file_parallel(b)),
                  .block = o->block_elems > 0 ? o->block_elems : DEFAULT_BLOCK};
    for (int k = 0; k < 2 && !rc; k++) {
        fo_file *f = k ? b : a;
        if (!fo_file_parallel(f)) continue;
        cJSON *root = cJSON_Parse(fo_file_parallel(f));
        if (!root) rc = fs_errf(e, FS_E_INPUT, "%s: attribute parallel is not valid JSON", fo_file_path(f));
        *(k ? &c.par_b : &c.par_a) = root;
    }
    fo_walk_group *groups = NULL;
    int ng = 0;
    if (!rc && fo_walk_groups(a, b, &groups, &ng)) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
    fo_names na = {0}, nb = {0}, nt = {0};
    fo_name_set sa = {0}, sb = {0};
    diff_job *jobs = NULL;
    int nj = 0, jcap = 0;
    /* First the plan: every dataset both files hold, in execution order, as an entry and a job
     * (the report's entries do not move after this, so jobs may fill them in any order); and
     * every name only one side holds, excused by a declaration of the lacking side or not. */
    for (int g = 0; g < ng && !rc; g++) {
        char ga[64], gb[64], gt[64];
        int pa, pb, pt = 0;
        char *deca = NULL, *decb = NULL;
        if ((rc = fo_walk_names(a, &groups[g], ga, sizeof ga, &na, &pa, e))) break;
        if ((rc = fo_walk_names(b, &groups[g], gb, sizeof gb, &nb, &pb, e))) break;
        if (truth && (rc = fo_walk_names(truth, &groups[g], gt, sizeof gt, &nt, &pt, e))) break;
        if ((rc = modules_decl(a, &groups[g], ga, pa, &deca, e))) break;
        if ((rc = modules_decl(b, &groups[g], gb, pb, &decb, e))) {
            free(deca);
            break;
        }
        fo_name_set_free(&sa), fo_name_set_free(&sb);
        if (fo_name_set_make(&na, &sa) || fo_name_set_make(&nb, &sb)) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        for (int i = 0; i < na.n && !rc; i++) {
            if (fo_narrowed_out(o, groups[g].step, na.v[i])) {
                r->excluded++;
                continue;
            }
            if (!fo_name_set_has(&sb, na.v[i])) {
                if (fo_names_push(&r->only_a, groups[g].group, na.v[i]) ||
                    (!fo_decl_excuses(&db, &groups[g], pb, decb, na.v[i]) &&
                     fo_names_push(&r->undeclared_a, groups[g].group, na.v[i])))
                    rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                continue;
            }
            if (nj == jcap) {
                int nc = jcap ? 2 * jcap : 256;
                diff_job *p = realloc(jobs, (size_t)nc * sizeof *p);
                if (!p) {
                    rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                    break;
                }
                jobs = p, jcap = nc;
            }
            if (!fo_report_add(r, groups[g].step, groups[g].group, na.v[i])) {
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                break;
            }
            diff_job *j = &jobs[nj++];
            memset(j, 0, sizeof *j);
            snprintf(j->ga, sizeof j->ga, "%s", ga);
            snprintf(j->gb, sizeof j->gb, "%s", gb);
            snprintf(j->gt, sizeof j->gt, "%s", pt ? gt : "");
        }
        for (int i = 0; i < nb.n && !rc; i++) {
            if (fo_name_set_has(&sa, nb.v[i])) continue;
            if (fo_narrowed_out(o, groups[g].step, nb.v[i])) {
                r->excluded++;
                continue;
            }
            if (fo_names_push(&r->only_b, groups[g].group, nb.v[i]) ||
                (!fo_decl_excuses(&da, &groups[g], pa, deca, nb.v[i]) &&
                 fo_names_push(&r->undeclared_b, groups[g].group, nb.v[i])))
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        }
        free(deca), free(decb);
    }
    fo_name_set_free(&sa), fo_name_set_free(&sb);
    fo_names_free(&na), fo_names_free(&nb), fo_names_free(&nt);
    free(groups);
    fo_decl_free(&da), fo_decl_free(&db);
    /* Then the work, pipelined over two threads or more: this thread opens each dataset (HDF5,
     * which must stay on one thread at a time) and hands the data pass of every dataset whose
     * streams read straight from the file (no HDF5) to a task, so the metadata walk of the next
     * datasets overlaps the data passes of the previous ones. Each dataset is still computed
     * whole by one thread, so the results do not depend on the thread count. Datasets HDF5 must
     * read (compressed, big-endian, ...) pass right here. */
    if (!rc) {
#pragma omp parallel if (nj > 1)
#pragma omp single
        for (int k = 0; k < nj; k++) {
            diff_job *j = &jobs[k];
            fo_entry *en = &r->v[k];
            j->rc = diff_open(&c, j, en, &j->err);
            if (j->rc || en->kind == FO_SHAPE || en->kind == FO_EMPTY) {
                job_release(j);
                continue;
            }
            int direct = fo_stream_direct(j->sa) && fo_stream_direct(j->sb) && (!j->st || fo_stream_direct(j->st));
            if (direct) {
#pragma omp task firstprivate(j, en)
                {
                    j->rc = diff_pass(&c, j, en, &j->err);
                    job_release(j);
                }
            } else {
                j->rc = diff_pass(&c, j, en, &j->err);
                job_release(j);
            }
        }
        /* The first error in execution order is the one reported, as when walking serially. */
        for (int k = 0; k < nj && !rc; k++)
            if (jobs[k].rc) {
                rc = jobs[k].rc;
                if (e) *e = jobs[k].err;
            }
        if (!rc) fo_report_tally(r);
    }
    for (int k = 0; k < nj; k++) job_release(&jobs[k]);
    free(jobs);
    cJSON_Delete(c.par_a), cJSON_Delete(c.par_b);
    return rc;
}
