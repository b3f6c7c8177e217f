#include "fs_check.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fo_config.h"
#include "fo_diff.h"
#include "fo_dump.h"
#include "fo_metrics.h"
#include "fo_walk.h"
#include "fs_gather.h"

typedef struct ref_entry {
    int step;
    char name[192];
    fs_tensor t;
} ref_entry;

/* A run recorded in memory on rank 0: the single-rank reference, or (bf16 runs) its matched
 * float64 truth. */
typedef struct ref_set {
    ref_entry *v;
    int n, cap, hint, step;
    double *buf; /* the entry asked for last, as doubles */
    size_t bufcap;
} ref_set;

struct fs_check {
    const fs_par *par;
    fs_dtype dt;
    fs_check_tol tol;
    /* reference: in memory (rank 0) or a file */
    ref_set ref, truth; /* truth.n > 0: the bf16 arbiter rule (fo_tolerance_arbiter) decides */
    fo_file *ref_file;
    fo_decl ref_decl; /* what ref_file declares it did not record */
    fo_dataset ds;
    /* progress */
    int step;
    int n_compared, n_excused, diverged;
    int agreed_error; /* an error every rank got from rank 0's verdict (not a local failure) */
    double worst, worst_ratio;
    char worst_where[256];
    char report[4096];
    int brk;              /* --break-on-divergence */
    int culprit;          /* rank 0: where the divergence shows */
    int64_t coords[FS_MAX_DIMS];
};

void fs_check_set_break(fs_check *ck, int on) { ck->brk = on; }

__attribute__((noinline)) void fs_check_break(const fs_divergence *dv)
{
    /* Under gdb this stops here; `up` is the record call, `up 2` the layer (linear, qk_norm,
     * ...) with its tensors. Without a debugger SIGTRAP ends the process, which is the point. */
    __asm__ volatile("" ::"r"(dv) : "memory");
    raise(SIGTRAP);
}

/* A saved reference of another model is an input error (exit 2), found before any compute: its
 * first tensors would otherwise differ in shape and read as a divergence (exit 1) of a layout
 * that has nothing wrong with it (probe defect #18). The token counts of its /inputs too. */
static int same_model(fo_file *f, const fs_par *par, fs_err *e)
{
    char why[512], *mine = fs_config_to_json(par->cfg);
    int same = 1;
    if (!mine) return fs_errf(e, FS_E_NOMEM, "out of memory");
    int rc = fo_config_compare(fo_file_config(f), "the reference", mine, "this run", &same, why, sizeof why, e);
    free(mine);
    if (rc) return rc;
    if (!same)
        return fs_errf(e, FS_E_INPUT, "the reference is a run of another model (reference vs this run: %s); it needs a "
                                      "single-rank dump of this model and these inputs", why);
    static const char *const in[2] = {"/inputs/hidden_states", "/inputs/encoder_hidden_states"};
    const int mine_tokens[2] = {par->S_img, par->S_txt};
    for (int k = 0; k < 2; k++) {
        fo_dataset ds = {0};
        fs_err ignore = {0};
        if (!fo_is_dataset(f, in[k]) || fo_dataset_info(f, in[k], &ds, &ignore) || ds.ndim < 2) continue;
        const int64_t theirs = ds.shape[1];
        fo_dataset_free(&ds);
        if (mine_tokens[k] > 0 && theirs != mine_tokens[k])
            return fs_errf(e, FS_E_INPUT, "the reference was run on %lld %s tokens, this run has %d; it needs a "
                                          "single-rank dump of these inputs (replay them with --inputs)",
                           (long long)theirs, k ? "text" : "image", mine_tokens[k]);
    }
    return FS_OK;
}

int fs_check_create(fs_check **out, const fs_par *par, fs_dtype dt, fs_check_tol tol, int tol_given, const char *ref_path,
                    fs_err *e)
{
    fs_check *ck = calloc(1, sizeof *ck);
    if (!ck) return fs_errf(e, FS_E_NOMEM, "out of memory");
    ck->par = par;
    ck->dt = dt;
    ck->tol = tol;
    ck->worst = 0;
    if (ref_path && par->rank == 0) {
        /* a reference cut short would compare less than the run records and call that a pass */
        int rc = fo_file_open(&ck->ref_file, ref_path, e);
        if (!rc) rc = fo_require_complete(ck->ref_file, 0, NULL, e);
        if (!rc) rc = fo_decl_read(ck->ref_file, 0, &ck->ref_decl, e);
        if (!rc && par->cfg) rc = same_model(ck->ref_file, par, e);
        if (rc) {
            fs_err_prefix(e, "--check=%s: ", ref_path);
            fo_file_close(ck->ref_file);
            free(ck);
            return rc;
        }
        /* a saved reference of another dtype (a bf16 GPU run, a float32 dump) is judged by the
         * looser of the two dtypes' rules, as flux-oracle diff does — unless the user set them */
        if (!tol_given) ck->tol = fo_tolerance_looser(tol, fo_tolerance_layout(fo_file_dtype(ck->ref_file)));
    }
    *out = ck;
    return FS_OK;
}

static void ref_set_free(ref_set *r)
{
    for (int i = 0; i < r->n; i++) fs_tensor_free(&r->v[i].t);
    free(r->v);
    free(r->buf);
    memset(r, 0, sizeof *r);
}

void fs_check_free(fs_check *ck)
{
    if (!ck) return;
    ref_set_free(&ck->ref);
    ref_set_free(&ck->truth);
    fo_file_close(ck->ref_file);
    fo_decl_free(&ck->ref_decl);
    fo_dataset_free(&ck->ds);
    free(ck);
}

/* ---------------------------------------------------------------- reference capture */

static int set_begin(void *ctx, int step, double t, double s, double sn, fs_err *e)
{
    ((ref_set *)ctx)->step = step;
    return FS_OK;
}

static int set_record(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e)
{
    ref_set *rs = ctx;
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? 2 * rs->cap : 512;
        ref_entry *n = realloc(rs->v, (size_t)rs->cap * sizeof *n);
        if (!n) return fs_errf(e, FS_E_NOMEM, "--check: out of memory storing the reference");
        rs->v = n;
    }
    ref_entry *r = &rs->v[rs->n];
    r->step = rs->step;
    snprintf(r->name, sizeof r->name, "%s", name);
    int rc = fs_tensor_alloc(&r->t, t->dtype, t->ndim, t->shape, e);
    if (!rc) rc = fs_tensor_download(&r->t, t, e); /* a copy on the host: the recorder's own */
    if (rc) {
        fs_tensor_free(&r->t);
        return rc;
    }
    rs->n++;
    return FS_OK;
}

fs_recorder fs_check_ref_recorder(fs_check *ck) { return (fs_recorder){.fn = set_record, .ctx = &ck->ref}; }
fs_step_hooks fs_check_ref_hooks(fs_check *ck) { return (fs_step_hooks){.begin_step = set_begin, .ctx = &ck->ref}; }
fs_recorder fs_check_truth_recorder(fs_check *ck) { return (fs_recorder){.fn = set_record, .ctx = &ck->truth}; }
fs_step_hooks fs_check_truth_hooks(fs_check *ck) { return (fs_step_hooks){.begin_step = set_begin, .ctx = &ck->truth}; }

/* Entry (step, name) of an in-memory run as doubles with its shape; 0 if the run lacks it. */
static int set_lookup(ref_set *rs, int step, const char *name, const double **data, int *ndim, int64_t *shape)
{
    for (int k = 0; k < rs->n; k++) { /* names come in the same order: start from the hint */
        int i = (rs->hint + k) % rs->n;
        if (rs->v[i].step == step && !strcmp(rs->v[i].name, name)) {
            rs->hint = i + 1;
            const fs_tensor *t = &rs->v[i].t;
            size_t n = (size_t)fs_tensor_numel(t);
            if (n > rs->bufcap) {
                free(rs->buf);
                rs->buf = malloc((n ? n : 1) * sizeof(double));
                rs->bufcap = rs->buf ? n : 0;
                if (!rs->buf) return 0;
            }
            for (size_t j = 0; j < n; j++) rs->buf[j] = fs_tensor_get(t, (int64_t)j);
            *data = rs->buf;
            *ndim = t->ndim;
            memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
            return 1;
        }
    }
    return 0;
}

/* The reference tensor (step, name) as doubles with its shape; 0 if the reference lacks it. */
static int ref_lookup(fs_check *ck, int step, const char *name, const double **data, int *ndim, int64_t *shape)
{
    if (ck->ref_file) {
        char path[256];
        fs_err e = {0};
        snprintf(path, sizeof path, "/step_%04d/%s", step, name);
        if (!fo_is_dataset(ck->ref_file, path) || fo_dataset_read(ck->ref_file, path, &ck->ds, &e)) return 0;
        *data = ck->ds.data;
        *ndim = ck->ds.ndim;
        for (int d = 0; d < ck->ds.ndim && d < FS_MAX_DIMS; d++) shape[d] = ck->ds.shape[d];
        return 1;
    }
    return set_lookup(&ck->ref, step, name, data, ndim, shape);
}

/* ---------------------------------------------------------------- parallel comparison */

/* 1 when the reference file declares it did not record (step, name) (fo_decl_excuses: the step
 * is outside its recorded_steps, or the step group's recorded_modules leaves the name out). */
static int missing_excused(fs_check *ck, const char *name)
{
    if (!ck->ref_file) return 0; /* the in-job reference records what the run records */
    fo_walk_group wg = {.step = ck->step};
    snprintf(wg.group, sizeof wg.group, "/step_%04d", ck->step);
    const int present = fo_is_group(ck->ref_file, wg.group);
    char *decl = NULL;
    fs_err ignore = {0};
    if (present && fo_attr_string(ck->ref_file, wg.group, "recorded_modules", &decl, &ignore)) return 0;
    int ok = fo_decl_excuses(&ck->ref_decl, &wg, present, decl, name);
    free(decl);
    return ok;
}

static int chk_begin(void *ctx, int step, double t, double s, double sn, fs_err *e)
{
    ((fs_check *)ctx)->step = step;
    return FS_OK;
}

static const char *axis_names(int ndim)
{
    /* how coordinates read for FLUX tensors: [B, S, C], [B, S, H, Dh], [B, C], [S, Dh] */
    switch (ndim) {
    case 4: return "batch, token, head, dim";
    case 3: return "batch, token, channel";
    case 2: return "row, column";
    default: return "index";
    }
}

static int chk_record(void *ctx, const char *name, const fs_tensor *dev, const fs_shard *sh, fs_err *e)
{
    fs_check *ck = ctx;
    const fs_par *p = ck->par;
    fs_gathered g;
    /* what this rank holds, on the host: gathered, and handed to gdb on a divergence */
    fs_tensor local;
    int rc = fs_tensor_host_view(dev, &local, e);
    if (rc) return rc;
    const fs_tensor *t = &local;
    rc = fs_gather_to_root(p->g_world, t, sh, &g, e);
    int verdict = rc ? FS_E_INTERNAL : FS_OK;
    if (!rc && p->rank == 0) {
        char lay[128], pieces[256] = "", sbuf[96], rbuf[96];
        fs_par_describe(p, lay, sizeof lay);
        size_t o = 0;
        int nshown = 0;
        for (int r = 0; r < g.world && nshown < 8; r++)
            if (g.group[r] == r) {
                char d[128];
                o += (size_t)snprintf(pieces + o, sizeof pieces - o, "%srank %d%s: %s", nshown ? "; " : "", r,
                                      g.pieces[r].sh.ndims ? "" : " (and every rank with the same piece)",
                                      fs_piece_describe(&g.pieces[r], d, sizeof d));
                nshown++;
            }
        const double *ref;
        int rnd;
        int64_t rshape[FS_MAX_DIMS];
        ck->culprit = g.problem == 1 ? g.first_bad : 0;
        if (g.problem) {
            ck->diverged = 1;
            snprintf(ck->report, sizeof ck->report,
                     "flux-sim --check: DIVERGED at step %d, %s\n"
                     "  layout: %s\n"
                     "  %s\n"
                     "  pieces: %s\n",
                     ck->step, name, lay, g.detail, pieces);
        } else if (!ref_lookup(ck, ck->step, name, &ref, &rnd, rshape)) {
            /* a reference file may have left it out on purpose (recorded_steps, recorded_modules:
             * diffusers' dumps keep depth<=2 after step 0); anything else is a hole in the
             * comparison, which is an error, never a silent skip */
            if (missing_excused(ck, name)) ck->n_excused++;
            else {
                snprintf(ck->report, sizeof ck->report, "--check: the reference %s has no step %d %s, which this run "
                         "records, and does not declare it unrecorded (recorded_steps, recorded_modules); narrow the run "
                         "with --dump-modules/--dump-steps to what the reference holds",
                         ck->ref_file ? fo_file_path(ck->ref_file) : "(in-job single-rank run)", ck->step, name);
                ck->agreed_error = FS_E_INPUT;
            }
        } else {
            fs_tensor rt = {.ndim = rnd};
            memcpy(rt.shape, rshape, sizeof(int64_t) * (size_t)rnd);
            int same = rnd == g.global.ndim;
            for (int d = 0; same && d < rnd; d++) same = rshape[d] == g.global.shape[d];
            ck->n_compared++;
            if (!same && ck->ref_file && !strcmp(name, "latents_in")) {
                /* the sampler's state: no layout changes its shape, a reference of other inputs
                 * (another batch) does — an input error, not a divergence (#18) */
                snprintf(ck->report, sizeof ck->report,
                         "--check=%s: the reference was run on other inputs: its step %d latents_in is %s, this run's "
                         "is %s; it needs a single-rank dump of these inputs (replay them with --inputs)",
                         fo_file_path(ck->ref_file), ck->step, fs_tensor_shape_str(&rt, rbuf, sizeof rbuf),
                         fs_tensor_shape_str(&g.global, sbuf, sizeof sbuf));
                ck->agreed_error = FS_E_INPUT;
            } else if (!same) {
                ck->diverged = 1;
                snprintf(ck->report, sizeof ck->report,
                         "flux-sim --check: DIVERGED at step %d, %s\n"
                         "  layout: %s\n"
                         "  shape: parallel run assembles %s, single-rank reference has %s\n"
                         "  pieces: %s\n",
                         ck->step, name, lay, fs_tensor_shape_str(&g.global, sbuf, sizeof sbuf),
                         fs_tensor_shape_str(&rt, rbuf, sizeof rbuf), pieces);
            } else {
                const int64_t n = fs_tensor_numel(&g.global);
                double *a = malloc(sizeof(double) * (size_t)(n ? n : 1));
                double refmax = 0;
                for (int64_t i = 0; i < n; i++) {
                    a[i] = fs_tensor_get(&g.global, i);
                    if (fabs(ref[i]) > refmax) refmax = fabs(ref[i]);
                }
                fo_stats st;
                fo_compare(a, ref, n, &st);
                double rel_max = refmax > 0 ? st.max_abs / refmax : (st.max_abs > 0 ? INFINITY : 0);
                /* bf16: the arbiter against the matched float64 truth (fo_tolerance_arbiter: the
                 * parallel run's error may be m times the single-rank bf16 run's, plus a floor);
                 * otherwise the layout rule on the distance to the single-rank run */
                const double *tru;
                int tnd;
                int64_t tshape[FS_MAX_DIMS];
                fo_stats st_ct = {0}, st_bt = {0};
                const int arb = ck->truth.n > 0 && set_lookup(&ck->truth, ck->step, name, &tru, &tnd, tshape);
                if (arb) {
                    fo_compare(a, tru, n, &st_ct);
                    fo_compare(ref, tru, n, &st_bt);
                }
                free(a);
                int bad = arb ? !fo_tolerance_arbiter(&st_ct, &st_bt, ck->tol)
                              : !fo_tolerance_pass(&st, ck->tol); /* the oracle's rules, NaN/Inf included */
                if (st.rel_l2 > ck->worst || !fo_stats_all_finite(&st)) {
                    ck->worst = fo_stats_all_finite(&st) ? st.rel_l2 : INFINITY;
                    snprintf(ck->worst_where, sizeof ck->worst_where, "step %d %s", ck->step, name);
                }
                if (arb && st_bt.rel_l2 > 0 && st_ct.rel_l2 / st_bt.rel_l2 > ck->worst_ratio)
                    ck->worst_ratio = st_ct.rel_l2 / st_bt.rel_l2;
                char arbiter[320] = "";
                if (arb)
                    snprintf(arbiter, sizeof arbiter,
                             "  vs the matched float64 truth: parallel rel L2 %.3g, max rel %.3g; single-rank bf16 %.3g, %.3g "
                             "(rule: <= %g x + %.1e, <= %g x + %.1e; docs/bf16.md)\n",
                             st_ct.rel_l2, fo_stats_max_rel(&st_ct), st_bt.rel_l2, fo_stats_max_rel(&st_bt),
                             ck->tol.m_rel > 0 ? ck->tol.m_rel : 2, ck->tol.rtol / 10, ck->tol.m_max > 0 ? ck->tol.m_max : 2,
                             ck->tol.mtol / 10);
                if (bad) {
                    int64_t at = st.argmax >= 0 ? st.argmax : 0, coords[FS_MAX_DIMS] = {0};
                    const int nonfinite = st.n_nonfinite_mismatch > 0 && st.first_nonfinite >= 0;
                    if (nonfinite) at = st.first_nonfinite;
                    char where_nf[160] = "";
                    if (nonfinite) /* the values AT the NaN/Inf, not the largest finite difference */
                        snprintf(where_nf, sizeof where_nf, ": parallel %g, reference %g; over the finite elements max |Δ|",
                                 fs_tensor_get(&g.global, at), ref[at]);
                    fo_unravel(at, g.global.ndim, g.global.shape, coords);
                    char cs[96], owners[128];
                    fo_coords_str(g.global.ndim, coords, cs, sizeof cs);
                    const int first_owner = fs_gathered_owners(&g, coords, owners, sizeof owners);
                    ck->diverged = 1;
                    ck->culprit = first_owner >= 0 ? first_owner : 0;
                    memcpy(ck->coords, coords, sizeof coords);
                    snprintf(ck->report, sizeof ck->report,
                             "flux-sim --check: DIVERGED at step %d, %s\n"
                             "  layout: %s; tensor %s %s\n"
                             "  %s%s at %s (%s)%s = %.6g; relative L2 = %.3g, max |Δ|/max|ref| = %.3g "
                             "(tolerance %.1e / %.1e)\n"
                             "%s"
                             "  non-finite: parallel %lld NaN %lld Inf, reference %lld NaN %lld Inf\n"
                             "  element held by rank(s) %s; pieces: %s\n",
                             ck->step, name, lay, fs_tensor_shape_str(&g.global, sbuf, sizeof sbuf), fs_dtype_name(ck->dt),
                             nonfinite ? "first non-finite mismatch" : "max |Δ|", "", cs, axis_names(g.global.ndim),
                             where_nf, st.max_abs, st.rel_l2, rel_max,
                             ck->tol.rtol, ck->tol.mtol, arbiter, (long long)st.nan_a, (long long)st.inf_a,
                             (long long)st.nan_b, (long long)st.inf_b, owners, pieces);
                }
            }
        }
        verdict = ck->diverged ? FS_DIVERGED : ck->agreed_error;
    }
    fs_bcast(p->g_world, 0, &verdict, sizeof verdict);
    if (verdict == FS_DIVERGED && ck->brk) {
        /* hand the rank where it shows the reference and the assembled tensor (global layout,
         * float64), so both are in scope next to its local tensor when it stops */
        int64_t hdr[2 + FS_MAX_DIMS + 1 + FS_MAX_DIMS] = {0};
        fs_tensor ref = {0}, glob = {0};
        if (p->rank == 0) {
            hdr[0] = ck->culprit;
            hdr[1] = g.global.data ? g.global.ndim : 0;
            for (int d = 0; d < (int)hdr[1]; d++) hdr[2 + d] = g.global.shape[d];
            for (int d = 0; d < FS_MAX_DIMS; d++) hdr[3 + FS_MAX_DIMS + d] = ck->coords[d];
        }
        fs_bcast(p->g_world, 0, hdr, sizeof hdr);
        const int culprit = (int)hdr[0], nd = (int)hdr[1];
        if (nd > 0 && (p->rank == 0 || p->rank == culprit)) {
            fs_tensor_alloc(&ref, FS_F64, nd, &hdr[2], NULL);
            fs_tensor_alloc(&glob, FS_F64, nd, &hdr[2], NULL);
            if (p->rank == 0) {
                const double *rd;
                int rnd;
                int64_t rs[FS_MAX_DIMS];
                if (ref_lookup(ck, ck->step, name, &rd, &rnd, rs) && fs_tensor_numel(&ref) == fs_tensor_numel(&g.global))
                    memcpy(ref.data, rd, fs_tensor_nbytes(&ref));
                fs_tensor_copy(&glob, &g.global, NULL);
            }
        }
        if (nd > 0 && culprit != 0) { /* rank 0 → culprit, through the world group */
            fs_group pair;
            fs_group_split(p->g_world, p->rank == 0 || p->rank == culprit ? 0 : 1, p->rank == 0 ? 0 : 1, &pair, NULL);
            if (p->rank == 0 || p->rank == culprit) {
                fs_bcast(&pair, 0, ref.data, fs_tensor_nbytes(&ref));
                fs_bcast(&pair, 0, glob.data, fs_tensor_nbytes(&glob));
            }
            fs_group_free(&pair);
        }
        if (p->rank == culprit) {
            fs_divergence dv = {.step = ck->step, .module = name, .local = t, .reference = nd ? &ref : NULL,
                                .global = nd ? &glob : NULL, .rank = culprit};
            for (int d = 0; d < FS_MAX_DIMS; d++) dv.coords[d] = hdr[3 + FS_MAX_DIMS + d];
            fs_check_break(&dv);
        }
        fs_tensor_free(&ref);
        fs_tensor_free(&glob);
    }
    fs_gathered_free(&g);
    fs_tensor_free(&local);
    if (verdict == FS_DIVERGED) {
        ck->diverged = 1;
        return fs_errf(e, FS_DIVERGED, "--check: diverged at step %d, %s", ck->step, name);
    }
    if (verdict == FS_E_INPUT) {
        ck->agreed_error = verdict;
        return p->rank == 0 ? fs_errf(e, verdict, "%s", ck->report)
                            : fs_errf(e, verdict, "--check: the reference lacks step %d %s", ck->step, name);
    }
    if (verdict) return fs_errf(e, verdict, "--check: gathering %s failed", name);
    return FS_OK;
}

int fs_check_agreed_error(const fs_check *ck) { return ck && ck->agreed_error; }

int fs_check_finish(fs_check *ck, fs_err *e)
{
    int n = ck->n_compared;
    fs_bcast(ck->par->g_world, 0, &n, sizeof n); /* rank 0 compares; every rank returns the same */
    if (n > 0) return FS_OK;
    ck->agreed_error = FS_E_INPUT;
    return fs_errf(e, FS_E_INPUT, "--check compared nothing: %s", ck->ref_file ? "the reference holds none of what this "
                   "run recorded" : "this run recorded no tensor");
}

fs_recorder fs_check_recorder(fs_check *ck) { return (fs_recorder){.fn = chk_record, .ctx = ck}; }
fs_step_hooks fs_check_hooks(fs_check *ck) { return (fs_step_hooks){.begin_step = chk_begin, .ctx = ck}; }

int fs_check_diverged(const fs_check *ck) { return ck->diverged; }

const char *fs_check_report(const fs_check *ck)
{
    fs_check *m = (fs_check *)ck;
    if (!ck->diverged) {
        char lay[128], excused[96];
        snprintf(excused, sizeof excused, " (%d more the reference declares unrecorded)", ck->n_excused);
        if (ck->truth.n > 0)
            snprintf(m->report, sizeof m->report,
                     "flux-sim --check: OK — %s reproduces the single-rank %s run: %d tensors compared%s, worst relative "
                     "L2 %.3g (%s); against the matched float64 truth its error is at most %.2f x the single-rank run's "
                     "(rule: %g x + %.1e; docs/bf16.md)\n",
                     fs_par_describe(ck->par, lay, sizeof lay), fs_dtype_name(ck->dt), ck->n_compared,
                     ck->n_excused ? excused : "", ck->worst, ck->worst_where,
                     ck->worst_ratio, ck->tol.m_rel > 0 ? ck->tol.m_rel : 2, ck->tol.rtol / 10);
        else
            snprintf(m->report, sizeof m->report,
                     "flux-sim --check: OK — %s reproduces the single-rank run: %d tensors compared%s, worst relative L2 "
                     "%.3g (%s); tolerance %.1e (max-abs %.1e)\n",
                     fs_par_describe(ck->par, lay, sizeof lay), ck->n_compared,
                     ck->n_excused ? excused : "", ck->worst, ck->worst_where, ck->tol.rtol,
                     ck->tol.mtol);
    }
    return ck->report;
}
