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
    double worst, worst_max_rel, worst_ratio; /* the OK line's figures (note_worst) */
    char worst_where[256], worst_max_rel_where[256];
    char report[4096];
    int brk; /* --break-on-divergence */
    /* --pad nomask: the layout is inexact by design, so the values are measured, not judged: per
     * module the worst relative L2 and max rel over the steps (and copies), in first-seen order */
    int measure;
    struct measured {
        char name[192];
        double rl2, mrel;
    } *mods;
    int nmods, capmods;
    char *mreport;
};

/* --pad nomask: note module `name`'s error (the worst over the steps). */
static int note_measured(fs_check *ck, const char *name, const fo_stats *st, fs_err *e)
{
    int i = 0;
    while (i < ck->nmods && strcmp(ck->mods[i].name, name)) i++;
    if (i == ck->nmods) {
        if (ck->nmods == ck->capmods) {
            int cap = ck->capmods ? 2 * ck->capmods : 256;
            struct measured *m = realloc(ck->mods, sizeof *m * (size_t)cap);
            if (!m) return fs_errf(e, FS_E_NOMEM, "--check: out of memory for the measured modules");
            ck->mods = m, ck->capmods = cap;
        }
        snprintf(ck->mods[i].name, sizeof ck->mods[i].name, "%s", name);
        ck->mods[i].rl2 = ck->mods[i].mrel = 0;
        ck->nmods++;
    }
    if (st->rel_l2 > ck->mods[i].rl2) ck->mods[i].rl2 = st->rel_l2;
    if (fo_stats_max_rel(st) > ck->mods[i].mrel) ck->mods[i].mrel = fo_stats_max_rel(st);
    return FS_OK;
}

void fs_check_set_break(fs_check *ck, int on) { ck->brk = on; }

__attribute__((noinline)) void fs_check_break(const fs_divergence *dv)
{
    /* Under gdb this stops here; `up` is the record call (chk_record), `up 4` the layer (linear,
     * qk_norm, ...) with its tensors (docs/debugging.md). Without a debugger SIGTRAP ends the
     * process, which is the point. */
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
    ck->measure = par->pad == FS_PAD_NOMASK && par->sp > 1;
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
    free(ck->mods);
    free(ck->mreport);
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

/* Entry (step, name) of an in-memory run as doubles with its shape; *found 0 if the run lacks it.
 * An error only when there is no memory to widen it. */
static int set_lookup(ref_set *rs, int step, const char *name, const double **data, int *ndim, int64_t *shape,
                      int *found, fs_err *e)
{
    *found = 0;
    for (int k = 0; k < rs->n; k++) { /* names come in the same order: start from the hint */
        int i = (rs->hint + k) % rs->n;
        if (rs->v[i].step != step || strcmp(rs->v[i].name, name)) continue;
        rs->hint = i + 1;
        const fs_tensor *t = &rs->v[i].t;
        size_t n = (size_t)fs_tensor_numel(t);
        if (n > rs->bufcap) {
            free(rs->buf);
            rs->buf = malloc((n ? n : 1) * sizeof(double));
            rs->bufcap = rs->buf ? n : 0;
            if (!rs->buf)
                return fs_errf(e, FS_E_NOMEM, "--check: out of memory widening step %d %s (%zu values) to float64",
                               step, name, n);
        }
        for (size_t j = 0; j < n; j++) rs->buf[j] = fs_tensor_get(t, (int64_t)j);
        *data = rs->buf;
        *ndim = t->ndim;
        memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        *found = 1;
        return FS_OK;
    }
    return FS_OK;
}

/* The reference tensor (step, name) as doubles with its shape; *found 0 if the reference lacks
 * it. An error when it holds the tensor but it cannot be read: that is not a hole to excuse. */
static int ref_lookup(fs_check *ck, int step, const char *name, const double **data, int *ndim, int64_t *shape,
                      int *found, fs_err *e)
{
    if (!ck->ref_file) return set_lookup(&ck->ref, step, name, data, ndim, shape, found, e);
    char path[256];
    *found = 0;
    snprintf(path, sizeof path, "/step_%04d/%s", step, name);
    if (!fo_is_dataset(ck->ref_file, path)) return FS_OK;
    int rc = fo_dataset_read(ck->ref_file, path, &ck->ds, e);
    if (!rc && ck->ds.ndim > FS_MAX_DIMS)
        rc = fs_errf(e, FS_E_INPUT, "%d dimensions, more than flux-sim's %d", ck->ds.ndim, FS_MAX_DIMS);
    if (rc) {
        fs_err_prefix(e, "--check=%s: reading %s: ", fo_file_path(ck->ref_file), path);
        return rc;
    }
    *data = ck->ds.data;
    *ndim = ck->ds.ndim;
    for (int d = 0; d < ck->ds.ndim; d++) shape[d] = ck->ds.shape[d];
    *found = 1;
    return FS_OK;
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

/* What rank 0 decided about one recorded tensor (judge), for the verdict every rank gets and, at a
 * divergence, for the hand-off to the debugger. */
typedef struct judgement {
    int verdict;                 /* FS_OK, FS_DIVERGED, or FS_E_INPUT (agreed; ck->report says why) */
    int culprit;                 /* FS_DIVERGED: the rank where it shows */
    int64_t coords[FS_MAX_DIMS]; /* FS_DIVERGED on values: the element the report names */
} judgement;

/* Assemble: this rank's tensor on the host (kept: gdb is handed it at a divergence) and the
 * global tensor on rank 0 (collective). *joined is 0 when it failed before the gather; the caller
 * then leaves at once, and the other ranks wait in the gather until the CLI ends the job. */
static int assemble(fs_check *ck, const fs_tensor *dev, const fs_shard *sh, fs_tensor *local, fs_gathered *g,
                    int *joined, fs_err *e)
{
    *joined = 0;
    int rc = fs_tensor_host_view(dev, local, e);
    if (rc) return rc;
    *joined = 1;
    return fs_gather_to_root(ck->par->g_world, local, sh, g, e);
}

/* "rank 0: dim 1 [0,40); rank 1: ..." — the distinct pieces, at most 8 (every report ends so). */
static void describe_pieces(const fs_gathered *g, char *buf, size_t n)
{
    size_t o = 0;
    int nshown = 0;
    buf[0] = 0;
    for (int r = 0; r < g->world && nshown < 8 && o < n; r++)
        if (g->group[r] == r) {
            char d[128];
            o += (size_t)snprintf(buf + o, n - o, "%srank %d%s: %s", nshown ? "; " : "", r,
                                  g->pieces[r].sh.ndims ? "" : " (and every rank with the same piece)",
                                  fs_piece_describe(&g->pieces[r], d, sizeof d));
            nshown++;
        }
}

/* The one DIVERGED report: where, the layout (with the tensor's shape and dtype when its values
 * were compared), the finding (lines joined by "\n  "), and which ranks hold what. */
static void report_divergence(fs_check *ck, const char *name, const char *tensor, const char *finding,
                              const char *held_by, const char *pieces)
{
    char lay[128];
    fs_par_describe(ck->par, lay, sizeof lay);
    ck->diverged = 1;
    snprintf(ck->report, sizeof ck->report,
             "flux-sim --check: DIVERGED at step %d, %s\n"
             "  layout: %s%s%s\n"
             "  %s\n"
             "  %s%s%spieces: %s\n",
             ck->step, name, lay, tensor[0] ? "; tensor " : "", tensor, finding,
             held_by[0] ? "element held by rank(s) " : "", held_by, held_by[0] ? "; " : "", pieces);
}

/* The OK line's figures: the worst of each quantity the rules judge, over the run, and where. A
 * tensor holding NaN/Inf (it passes only where both runs hold the same ones) counts as infinitely
 * far, so an OK over it cannot read as a small error. ct/bt (bf16): against the matched truth. */
static void note_worst(fs_check *ck, const char *name, const fo_stats *st, const fo_stats *ct, const fo_stats *bt)
{
    const int finite = fo_stats_all_finite(st);
    if (st->rel_l2 > ck->worst || !finite) {
        ck->worst = finite ? st->rel_l2 : INFINITY;
        snprintf(ck->worst_where, sizeof ck->worst_where, "step %d %s", ck->step, name);
    }
    if (fo_stats_max_rel(st) > ck->worst_max_rel || !finite) {
        ck->worst_max_rel = finite ? fo_stats_max_rel(st) : INFINITY;
        snprintf(ck->worst_max_rel_where, sizeof ck->worst_max_rel_where, "step %d %s", ck->step, name);
    }
    if (ct && bt->rel_l2 > 0 && ct->rel_l2 / bt->rel_l2 > ck->worst_ratio) ck->worst_ratio = ct->rel_l2 / bt->rel_l2;
}

/* Judge the values of a gathered tensor of the reference's shape: the metrics are the oracle's
 * (fo_compare, the arithmetic flux-oracle diff streams), the rule fo_tolerance's; the report
 * prints those very numbers. */
static int judge_values(fs_check *ck, const char *name, const fs_gathered *g, const double *ref, const char *pieces,
                        judgement *j, fs_err *e)
{
    const fs_tensor *gt = &g->global;
    const int64_t n = fs_tensor_numel(gt);
    double *a = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!a)
        return fs_errf(e, FS_E_NOMEM, "--check: out of memory widening step %d %s (%lld values) to float64", ck->step,
                       name, (long long)n);
    for (int64_t i = 0; i < n; i++) a[i] = fs_tensor_get(gt, i);
    fo_stats st, st_ct = {0}, st_bt = {0};
    fo_compare(a, ref, n, &st);
    /* bf16: the arbiter against the matched float64 truth (fo_tolerance_arbiter: the parallel
     * run's error may be m times the single-rank bf16 run's, plus a floor); otherwise the layout
     * rule on the distance to the single-rank run */
    const double *tru = NULL;
    int tnd = 0, arb = 0, rc = FS_OK;
    int64_t tshape[FS_MAX_DIMS];
    if (ck->truth.n > 0) rc = set_lookup(&ck->truth, ck->step, name, &tru, &tnd, tshape, &arb, e);
    if (!rc && arb) {
        fs_tensor tt = {.ndim = tnd};
        memcpy(tt.shape, tshape, sizeof(int64_t) * (size_t)tnd);
        if (fs_tensor_numel(&tt) != n) /* the truth is a run of the same problem: never another shape */
            rc = fs_errf(e, FS_E_INTERNAL, "--check: the matched float64 truth's step %d %s has %lld values, the run's %lld",
                         ck->step, name, (long long)fs_tensor_numel(&tt), (long long)n);
    }
    if (!rc && arb) {
        fo_compare(a, tru, n, &st_ct);
        fo_compare(ref, tru, n, &st_bt);
    }
    free(a);
    if (rc) return rc;
    int bad = arb ? !fo_tolerance_arbiter(&st_ct, &st_bt, ck->tol)
                  : !fo_tolerance_pass(&st, ck->tol); /* the oracle's rules, NaN/Inf included */
    note_worst(ck, name, &st, arb ? &st_ct : NULL, arb ? &st_bt : NULL);
    if (ck->measure) { /* --pad nomask: measured; a NaN/Inf the reference lacks is still a divergence */
        if ((rc = note_measured(ck, name, &st, e))) return rc;
        bad = st.n_nonfinite_mismatch > 0;
    }
    if (!bad) return FS_OK;

    /* where: the first NaN/Inf that the other side lacks, else the largest difference */
    const int nonfinite = st.n_nonfinite_mismatch > 0 && st.first_nonfinite >= 0;
    const int64_t at = nonfinite ? st.first_nonfinite : st.argmax >= 0 ? st.argmax : 0;
    char where_nf[160] = "", cs[96], owners[128], sbuf[96], tensor[128], arbiter[320] = "", finding[1024];
    if (nonfinite) /* the values AT the NaN/Inf, not the largest finite difference */
        snprintf(where_nf, sizeof where_nf, ": parallel %g, reference %g; over the finite elements max |Δ|",
                 fs_tensor_get(gt, at), ref[at]);
    fo_unravel(at, gt->ndim, gt->shape, j->coords);
    fo_coords_str(gt->ndim, j->coords, cs, sizeof cs);
    const int first_owner = fs_gathered_owners(g, j->coords, owners, sizeof owners);
    if (arb)
        snprintf(arbiter, sizeof arbiter,
                 "\n  vs the matched float64 truth: parallel rel L2 %.3g, max rel %.3g; single-rank bf16 %.3g, %.3g "
                 "(rule: <= %g x + %.1e, <= %g x + %.1e; docs/bf16.md)",
                 st_ct.rel_l2, fo_stats_max_rel(&st_ct), st_bt.rel_l2, fo_stats_max_rel(&st_bt),
                 fo_tolerance_m_rel(ck->tol), ck->tol.rtol / 10, fo_tolerance_m_max(ck->tol), ck->tol.mtol / 10);
    snprintf(finding, sizeof finding,
             "%s at %s (%s)%s = %.6g; relative L2 = %.3g, max |Δ|/max|ref| = %.3g (tolerance %.1e / %.1e)%s\n"
             "  non-finite: parallel %lld NaN %lld Inf, reference %lld NaN %lld Inf",
             nonfinite ? "first non-finite mismatch" : "max |Δ|", cs, axis_names(gt->ndim), where_nf, st.max_abs,
             st.rel_l2, fo_stats_max_rel(&st), ck->tol.rtol, ck->tol.mtol, arbiter, (long long)st.nan_a,
             (long long)st.inf_a, (long long)st.nan_b, (long long)st.inf_b);
    snprintf(tensor, sizeof tensor, "%s %s", fs_tensor_shape_str(gt, sbuf, sizeof sbuf), fs_dtype_name(ck->dt));
    report_divergence(ck, name, tensor, finding, owners, pieces);
    j->verdict = FS_DIVERGED;
    j->culprit = first_owner >= 0 ? first_owner : 0;
    return FS_OK;
}

/* Judge (rank 0): the gathered tensor against the reference. Fills j and, unless the tensor
 * agrees, ck->report. Returns an error only for a failure of its own (memory, an unreadable
 * reference), which every rank is then told of. */
static int judge(fs_check *ck, const char *name, const fs_gathered *g, judgement *j, fs_err *e)
{
    char pieces[256], sbuf[96], rbuf[96], finding[256];
    describe_pieces(g, pieces, sizeof pieces);
    j->culprit = g->problem == 1 ? g->first_bad : 0;
    if (g->problem) { /* copies of one piece disagree, or the pieces do not tile the tensor */
        report_divergence(ck, name, "", g->detail, "", pieces);
        j->verdict = FS_DIVERGED;
        return FS_OK;
    }
    const double *ref;
    int rnd, found;
    int64_t rshape[FS_MAX_DIMS];
    int rc = ref_lookup(ck, ck->step, name, &ref, &rnd, rshape, &found, e);
    if (rc) return rc;
    if (!found) {
        /* a reference file may have left it out on purpose (recorded_steps, recorded_modules:
         * diffusers' dumps keep depth<=2 after step 0); anything else is a hole in the
         * comparison, which is an error, never a silent skip */
        if (missing_excused(ck, name)) ck->n_excused++;
        else {
            snprintf(ck->report, sizeof ck->report, "--check: the reference %s has no step %d %s, which this run "
                     "records, and does not declare it unrecorded (recorded_steps, recorded_modules); narrow the run "
                     "with --dump-modules/--dump-steps to what the reference holds",
                     ck->ref_file ? fo_file_path(ck->ref_file) : "(in-job single-rank run)", ck->step, name);
            j->verdict = FS_E_INPUT;
        }
        return FS_OK;
    }
    fs_tensor rt = {.ndim = rnd};
    memcpy(rt.shape, rshape, sizeof(int64_t) * (size_t)rnd);
    int same = rnd == g->global.ndim;
    for (int d = 0; same && d < rnd; d++) same = rshape[d] == g->global.shape[d];
    ck->n_compared++;
    if (!same && ck->ref_file && !strcmp(name, "latents_in")) {
        /* the sampler's state: no layout changes its shape, a reference of other inputs (another
         * batch) does — an input error, not a divergence (#18) */
        snprintf(ck->report, sizeof ck->report,
                 "--check=%s: the reference was run on other inputs: its step %d latents_in is %s, this run's "
                 "is %s; it needs a single-rank dump of these inputs (replay them with --inputs)",
                 fo_file_path(ck->ref_file), ck->step, fs_tensor_shape_str(&rt, rbuf, sizeof rbuf),
                 fs_tensor_shape_str(&g->global, sbuf, sizeof sbuf));
        j->verdict = FS_E_INPUT;
        return FS_OK;
    }
    if (!same) {
        snprintf(finding, sizeof finding, "shape: parallel run assembles %s, single-rank reference has %s",
                 fs_tensor_shape_str(&g->global, sbuf, sizeof sbuf), fs_tensor_shape_str(&rt, rbuf, sizeof rbuf));
        report_divergence(ck, name, "", finding, "", pieces);
        j->verdict = FS_DIVERGED;
        return FS_OK;
    }
    rc = judge_values(ck, name, g, ref, pieces, j, e);
    /* the other copies of elements computed more than once (--text replicated under ring: each
     * ring rank's text), each judged against the reference as the first was */
    for (int c = 0; !rc && c < g->ncopies && j->verdict != FS_DIVERGED; c++) {
        fs_gathered gc = *g;
        gc.global = g->copies[c];
        rc = judge_values(ck, name, &gc, ref, pieces, j, e);
        if (!rc && j->verdict == FS_DIVERGED) {
            const size_t o = strlen(ck->report);
            snprintf(ck->report + o, sizeof ck->report - o, "  the values judged: copy %d of the elements computed more "
                     "than once (--text replicated: ring rank %d's own text)\n", c + 1, c + 1);
        }
    }
    return rc;
}

/* What rank 0 tells every rank when --break-on-divergence stops one: which rank, the shape of the
 * assembled tensor (ndim 0: none to hand over) and the element the report names. */
typedef struct handoff {
    int32_t culprit, ndim;
    int64_t shape[FS_MAX_DIMS];
    int64_t coords[FS_MAX_DIMS];
} handoff;

/* Hand-off (collective, at a divergence under --break-on-divergence): the rank where it shows gets
 * the reference and the assembled tensor (global layout, float64) from rank 0 into ref and glob
 * (the caller's, freed by it), and *dv filled for fs_check_break, so that both are in scope beside
 * its local tensor when it stops; *stop says whether this is that rank. The caller stops there
 * itself, so that the layer stays `up 4` from fs_check_break (docs/debugging.md). An allocation
 * that fails on rank 0 or the culprit is every rank's error (fs_agree_error), before any transfer
 * that would wait for it. */
static int hand_off(fs_check *ck, const char *name, const fs_tensor *local, const fs_gathered *g, const judgement *j,
                    fs_tensor *ref, fs_tensor *glob, fs_divergence *dv, int *stop, fs_err *e)
{
    const fs_par *p = ck->par;
    handoff h = {0};
    *stop = 0;
    if (p->rank == 0) {
        h.culprit = j->culprit;
        h.ndim = g->global.data ? g->global.ndim : 0;
        memcpy(h.shape, g->global.shape, sizeof h.shape);
        memcpy(h.coords, j->coords, sizeof h.coords);
    }
    fs_bcast(p->g_world, 0, &h, sizeof h);
    const int holds = p->rank == 0 || p->rank == h.culprit; /* the two ranks the tensors pass between */
    int rc = FS_OK;
    if (h.ndim > 0 && holds) {
        rc = fs_tensor_alloc(ref, FS_F64, h.ndim, h.shape, e);
        if (!rc) rc = fs_tensor_alloc(glob, FS_F64, h.ndim, h.shape, e);
        if (!rc && p->rank == 0) {
            /* looked up again: judge may not have (copies of a piece that disagree are a divergence
             * before any comparison), and the debugger wants it whenever it exists. A reference of
             * another size (a shape divergence) stays zeros. */
            const double *rd;
            int rnd, found;
            int64_t rs[FS_MAX_DIMS];
            rc = ref_lookup(ck, ck->step, name, &rd, &rnd, rs, &found, e);
            fs_tensor rt = {.ndim = found ? rnd : 0};
            memcpy(rt.shape, rs, sizeof(int64_t) * (size_t)rt.ndim);
            if (!rc && found && fs_tensor_numel(&rt) == fs_tensor_numel(ref)) memcpy(ref->data, rd, fs_tensor_nbytes(ref));
            if (!rc) rc = fs_tensor_copy(glob, &g->global, e);
        }
        if (rc)
            fs_err_prefix(e, "--check: diverged at step %d, %s; --break-on-divergence could not hand rank %d the "
                          "reference and the assembled tensor: ", ck->step, name, h.culprit);
    }
    rc = fs_agree_error(p->g_world, rc, e);
    if (!rc && h.ndim > 0 && h.culprit != 0) { /* rank 0 → culprit, through the world group */
        fs_group pair;
        rc = fs_group_split(p->g_world, holds ? 0 : 1, p->rank == 0 ? 0 : 1, &pair, e);
        if (!rc) {
            if (holds) {
                fs_bcast(&pair, 0, ref->data, fs_tensor_nbytes(ref));
                fs_bcast(&pair, 0, glob->data, fs_tensor_nbytes(glob));
            }
            fs_group_free(&pair);
        }
    }
    if (rc || p->rank != h.culprit) return rc;
    *dv = (fs_divergence){.step = ck->step, .module = name, .local = local, .reference = h.ndim ? ref : NULL,
                          .global = h.ndim ? glob : NULL, .rank = h.culprit};
    memcpy(dv->coords, h.coords, sizeof dv->coords);
    *stop = 1;
    return FS_OK;
}

/* The recorder of the parallel run (collective per tensor): assemble, judge on rank 0, every rank
 * gets the verdict, hand off to the debugger if asked, and every rank returns alike. */
static int chk_record(void *ctx, const char *name, const fs_tensor *dev, const fs_shard *sh, fs_err *e)
{
    fs_check *ck = ctx;
    const fs_par *p = ck->par;
    fs_tensor local = {0};
    fs_gathered g = {0};
    int joined;
    int rc = assemble(ck, dev, sh, &local, &g, &joined, e);
    if (!joined) return rc;
    int verdict = rc ? FS_E_INTERNAL : FS_OK;
    judgement j = {.verdict = FS_OK};
    if (!rc && p->rank == 0) {
        rc = judge(ck, name, &g, &j, e);
        verdict = rc ? rc : j.verdict;
    }
    fs_bcast(p->g_world, 0, &verdict, sizeof verdict);
    int hrc = FS_OK;
    if (verdict == FS_DIVERGED && ck->brk) {
        fs_tensor ref = {0}, glob = {0};
        fs_divergence dv;
        int stop;
        hrc = hand_off(ck, name, &local, &g, &j, &ref, &glob, &dv, &stop, e);
        if (stop) fs_check_break(&dv); /* here, not in hand_off: the layer is `up 4` from it */
        fs_tensor_free(&ref);
        fs_tensor_free(&glob);
    }
    fs_gathered_free(&g);
    fs_tensor_free(&local);
    if (hrc) { /* every rank got it from fs_agree_error: the job ends in agreement */
        ck->agreed_error = hrc;
        return hrc;
    }
    if (verdict == FS_E_INPUT) ck->agreed_error = verdict; /* every rank has it from rank 0's verdict */
    if (rc) return rc; /* this rank's own failure, with its context */
    if (verdict == FS_DIVERGED) {
        ck->diverged = 1;
        return fs_errf(e, FS_DIVERGED, "--check: diverged at step %d, %s", ck->step, name);
    }
    if (verdict == FS_E_INPUT)
        return p->rank == 0 ? fs_errf(e, verdict, "%s", ck->report)
                            : fs_errf(e, verdict, "--check: the reference lacks step %d %s", ck->step, name);
    if (verdict) return fs_errf(e, verdict, "--check: rank 0 could not assemble or compare step %d %s", ck->step, name);
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
    if (!ck->diverged && ck->measure) { /* --pad nomask: the layout's own error, measured per module */
        char lay[128];
        size_t cap = 2048 + (size_t)ck->nmods * 256, o;
        free(m->mreport);
        if (!(m->mreport = malloc(cap))) return "flux-sim --check: MEASURED (out of memory for the per-module report)\n";
        o = (size_t)snprintf(m->mreport, cap,
                             "flux-sim --check: MEASURED — %s: the sequence is padded without a key mask, so the zero "
                             "pad keys enter every softmax (vllm-omni's mask_sp_padding=False). That is a property of the "
                             "layout, not a bug: the numbers are its error against the exact single-rank run (--pad "
                             "mask is exact), measured, not judged. %d tensors compared; worst relative L2 %.3g (%s), "
                             "worst max rel %.3g (%s). Exit 0; pieces that do not tile, replicated copies that "
                             "disagree and NaN/Inf the reference lacks still fail (exit 1).\n"
                             "  per module, the worst over the steps: relative L2, max |Δ|/max|ref|\n",
                             fs_par_describe(ck->par, lay, sizeof lay), ck->n_compared, ck->worst, ck->worst_where,
                             ck->worst_max_rel, ck->worst_max_rel_where);
        for (int i = 0; i < ck->nmods && o < cap; i++)
            o += (size_t)snprintf(m->mreport + o, cap - o, "    %-56s %.3e  %.3e\n", ck->mods[i].name, ck->mods[i].rl2,
                                  ck->mods[i].mrel);
        return m->mreport;
    }
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
                     ck->worst_ratio, fo_tolerance_m_rel(ck->tol), ck->tol.rtol / 10);
        else {
            /* the two quantities the layout rule judged (fo_tolerance_pass), by flux-oracle's names
             * for them, with their bounds: rtol on relative L2, mtol on max rel = max|Δ|/max|ref| */
            char mtol[32] = "off", atol[32] = "";
            if (ck->tol.mtol > 0) snprintf(mtol, sizeof mtol, "%.1e", ck->tol.mtol);
            if (ck->tol.atol > 0) snprintf(atol, sizeof atol, ", atol %.1e", ck->tol.atol);
            snprintf(m->report, sizeof m->report,
                     "flux-sim --check: OK — %s reproduces the single-rank run: %d tensors compared%s, worst relative L2 "
                     "%.3g (%s), worst max rel %.3g (%s); tolerance rtol %.1e, mtol %s%s\n",
                     fs_par_describe(ck->par, lay, sizeof lay), ck->n_compared, ck->n_excused ? excused : "",
                     ck->worst, ck->worst_where, ck->worst_max_rel, ck->worst_max_rel_where, ck->tol.rtol, mtol, atol);
        }
    }
    return ck->report;
}
