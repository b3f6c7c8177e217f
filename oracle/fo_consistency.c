/* fo_consistency.c — `flux-oracle consistency`: per-rank dumps of one parallel run, whose
 * replicated tensors must be bitwise identical on every rank (see fo_diff.h). */
#include "fo_diff.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fo_config.h"
#include "fo_walk.h"

#define DEFAULT_BLOCK (1 << 18) /* as fo_diff.c */

static void set_at(fo_entry *en, const fo_model_dims *md, int64_t at)
{
    en->at = at;
    if (at < 0) return;
    fo_unravel(at, en->ndim_a, en->shape_a, en->coords);
    fo_describe_coords(en->group, en->name, en->ndim_a, en->shape_a, en->coords, md->batch, md->s_txt, md->s_img,
                       md->heads, md->head_dim, en->where, sizeof en->where);
}

int fo_consistency_run(fo_file **files, int n, const fo_diff_opts *o, fo_report *r, fs_err *e)
{
    return fo_consistency_ref_run(files, n, NULL, o, r, e);
}

/* "0, 2" of the ranks in mask (file order) */
static const char *rank_list(const fo_report *r, uint64_t mask, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int j = 0; j < r->nfiles && o < n; j++)
        if (mask >> r->rank_of_file[j] & 1) o += (size_t)snprintf(buf + o, n - o, "%s%d", o ? ", " : "", r->rank_of_file[j]);
    return buf;
}
static const char *rank_word(uint64_t mask) { return mask & (mask - 1) ? "ranks" : "rank"; }

/* Does file i's copy of `name` pass against the reference's tensor (diff's rule)? *st: the metrics. */
static int copy_vs_ref(fo_file *f, const char *pf, fo_file *ref, const char *pr, const fo_tolerance tol, int64_t block,
                       fo_stats *st, int *pass, fs_err *e)
{
    fo_stream *sa = NULL, *sb = NULL;
    fo_dataset ia = {0}, ib = {0};
    int rc = fo_stream_open(f, pf, block, &sa, &ia, e);
    if (!rc) rc = fo_stream_open(ref, pr, block, &sb, &ib, e);
    if (!rc && (ia.ndim != ib.ndim || memcmp(ia.shape, ib.shape, sizeof ia.shape))) {
        char s1[160], s2[160];
        rc = fs_errf(e, FS_E_INPUT, "%s: %s has shape %s, the reference %s: not the same tensor", fo_file_path(ref), pr,
                     fo_shape_str(ib.ndim, ib.shape, s2, sizeof s2), fo_shape_str(ia.ndim, ia.shape, s1, sizeof s1));
    }
    fo_acc acc;
    fo_acc_init(&acc);
    for (;;) {
        if (rc) break;
        fo_view xa, xb;
        int64_t off, na, nb;
        if ((rc = fo_stream_view(sa, &xa, &off, &na, e)) || (rc = fo_stream_view(sb, &xb, &off, &nb, e)) || na == 0) break;
        fo_acc_add_view(&acc, xa, xb, na);
    }
    fo_acc_finish(&acc, st);
    *pass = fo_tolerance_pass(st, tol) && fo_stats_all_finite(st);
    fo_stream_close(sa), fo_stream_close(sb);
    return rc;
}

int fo_consistency_ref_run(fo_file **files, int n, fo_file *ref, const fo_diff_opts *o, fo_report *r, fs_err *e)
{
    fo_report_init(r, FO_MODE_CONSISTENCY);
    r->narrowed = o->modules != NULL || o->steps != NULL;
    fo_tolerance ref_tol = {0};
    if (ref) {
        fo_diff_setup(r, o, files[0], ref, 0); /* the tolerance a diff against ref applies */
        ref_tol = r->tol;
    }
    r->tol = (fo_tolerance){.rtol = 0}; /* bitwise */
    r->nfiles = n;
    if (n < 2) return fs_errf(e, FS_E_INPUT, "consistency needs at least two per-rank dumps");
    if (n > FO_MAX_RANKS) return fs_errf(e, FS_E_INPUT, "consistency handles at most %d files", FO_MAX_RANKS);
    for (int i = 0; i < n; i++) {
        if (!fo_file_parallel(files[i]))
            return fs_errf(e, FS_E_INPUT, "%s: no 'parallel' attribute: not a per-rank dump", fo_file_path(files[i]));
        r->rank_of_file[i] = fo_parallel_rank(fo_file_parallel(files[i]));
        if (r->rank_of_file[i] < 0)
            return fs_errf(e, FS_E_INPUT, "%s: attribute parallel has no \"rank\": not a per-rank dump",
                           fo_file_path(files[i]));
        if (r->rank_of_file[i] >= FO_MAX_RANKS)
            return fs_errf(e, FS_E_INPUT, "%s: rank %d: at most %d ranks are supported", fo_file_path(files[i]),
                           r->rank_of_file[i], FO_MAX_RANKS);
        for (int j = 0; j < i; j++)
            if (r->rank_of_file[j] == r->rank_of_file[i])
                return fs_errf(e, FS_E_INPUT, "%s and %s both hold rank %d", fo_file_path(files[j]),
                               fo_file_path(files[i]), r->rank_of_file[i]);
    }
    /* One run's files: one model, each finished (or --allow-partial). */
    char *note = NULL;
    fo_decl decl[FO_MAX_RANKS];
    memset(decl, 0, sizeof decl);
    int rc = FS_OK;
    for (int i = 0; i < n && !rc; i++) {
        int same = 0;
        char why[600];
        if (i && !(rc = fo_config_compare(fo_file_config(files[0]), fo_file_path(files[0]), fo_file_config(files[i]),
                                          fo_file_path(files[i]), &same, why, sizeof why, e)) &&
            !same)
            rc = fs_errf(e, FS_E_INPUT, "%s and %s are dumps of different models (config: %s)", fo_file_path(files[0]),
                         fo_file_path(files[i]), why);
        if (!i) rc = fo_config_check(fo_file_config(files[0]), fo_file_path(files[0]), e);
        if (!rc) rc = fo_require_complete(files[i], o->allow_partial, &note, e);
        if (!rc) rc = fo_decl_read(files[i], note != NULL, &decl[i], e);
        if (note && !rc) {
            char *p = r->partial_note ? fo_strdupf("%s; %s", r->partial_note, note) : strdup(note);
            free(r->partial_note);
            r->partial_note = p;
        }
        free(note);
        note = NULL;
    }
    if (!rc && ref) rc = fo_same_model(files[0], ref, e);
    if (!rc && ref) rc = fo_require_complete(ref, 0, NULL, e);
    if (rc) {
        for (int i = 0; i < n; i++) fo_decl_free(&decl[i]);
        return rc;
    }
    cJSON *par = cJSON_Parse(fo_file_parallel(files[0]));
    if (!par || !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(par, "sharding"))) {
        cJSON_Delete(par);
        for (int i = 0; i < n; i++) fo_decl_free(&decl[i]);
        return fs_errf(e, FS_E_INPUT,
                       "%s: attribute parallel has no \"sharding\" map: which tensors must agree is unknown",
                       fo_file_path(files[0]));
    }
    int64_t block = o->block_elems > 0 ? o->block_elems : DEFAULT_BLOCK;
    fo_model_dims md = fo_read_model_dims(files[0]);
    fo_walk_group *groups = NULL;
    int ng = 0;
    if (fo_walk_groups(files[0], NULL, &groups, &ng)) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
    fo_names names = {0};
    fo_stream **st = calloc((size_t)n, sizeof *st);
    fo_acc *acc = calloc((size_t)n, sizeof *acc);
    char (*gp)[64] = calloc((size_t)n, sizeof *gp);
    int *present = calloc((size_t)n, sizeof *present);
    char **mdecl = calloc((size_t)n, sizeof *mdecl);
    if (!rc && (!st || !acc || !gp || !present || !mdecl)) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
    for (int g = 0; g < ng && !rc; g++) {
        if ((rc = fo_walk_names(files[0], &groups[g], gp[0], sizeof gp[0], &names, &present[0], e))) break;
        fo_names tmp = {0};
        for (int i = 1; i < n && !rc; i++)
            rc = fo_walk_names(files[i], &groups[g], gp[i], sizeof gp[i], &tmp, &present[i], e);
        fo_names_free(&tmp);
        for (int i = 0; i < n && !rc; i++) {
            free(mdecl[i]);
            mdecl[i] = NULL;
            if (groups[g].step >= 0 && present[i]) rc = fo_attr_string(files[i], gp[i], "recorded_modules", &mdecl[i], e);
        }
        for (int k = 0; k < names.n && !rc; k++) {
            const char *name = names.v[k];
            char *p = NULL;
            fo_dataset info = {0};
            fo_shard sh;
            int found;
            if (fo_narrowed_out(o, groups[g].step, name)) {
                r->excluded++;
                continue;
            }
#define JOIN(g)                                                                       \
    do {                                                                              \
        free(p);                                                                      \
        if (!(p = fo_path_join((g), name))) rc = fs_errf(e, FS_E_NOMEM, "out of memory"); \
    } while (0)
            JOIN(gp[0]);
            if (rc || (rc = fo_dataset_info(files[0], p, &info, e))) {
                free(p);
                break;
            }
            if ((rc = fo_shard_from_json(par, name, info.ndim, info.shape, &sh, &found, fo_file_path(files[0]), e))) {
                free(p);
                break;
            }
            int repl = found && sh.replicated;
            fo_shard_free(&sh);
            if (!repl) {
                free(p);
                r->unchecked++;
                continue;
            }
            /* Every rank must hold it. */
            int missing = 0;
            for (int i = 1; i < n && !rc; i++) {
                JOIN(gp[i]);
                if (!rc && !fo_is_dataset(files[i], p)) {
                    char *q = fo_strdupf("%s (rank %d)", name, r->rank_of_file[i]);
                    if (!q || fo_names_push(&r->only_a, groups[g].group, q) ||
                        (!fo_decl_excuses(&decl[i], &groups[g], present[i], mdecl[i], name) &&
                         fo_names_push(&r->undeclared_a, groups[g].group, q)))
                        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                    free(q);
                    missing = 1;
                }
            }
            if (missing || rc) {
                free(p);
                continue;
            }
            fo_entry *en = fo_report_add(r, groups[g].step, groups[g].group, name);
            if (!en) {
                free(p);
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                break;
            }
            en->ranks_known = 1;
            en->ranks_note = strdup("replicated");
            fo_dataset di[FO_MAX_RANKS];
            for (int i = 0; i < n && !rc; i++) {
                JOIN(gp[i]);
                memset(&di[i], 0, sizeof di[i]);
                if (!rc) rc = fo_stream_open(files[i], p, block, &st[i], &di[i], e);
                fo_acc_init(&acc[i]);
            }
            if (rc) goto close;
            en->ndim_a = en->ndim_b = di[0].ndim;
            memcpy(en->shape_a, di[0].shape, sizeof di[0].shape);
            memcpy(en->shape_b, di[0].shape, sizeof di[0].shape);
            memcpy(en->dtype_a, di[0].dtype, sizeof di[0].dtype);
            memcpy(en->dtype_b, di[0].dtype, sizeof di[0].dtype);
            if (di[0].numel == 0) { /* counted, not compared: empty replicas agree vacuously */
                en->kind = FO_EMPTY;
                en->msg = strdup("empty on every rank: nothing to compare");
            }
            int bad_shape = -1;
            for (int i = 1; i < n; i++)
                if (di[i].ndim != di[0].ndim || memcmp(di[i].shape, di[0].shape, sizeof di[0].shape)) bad_shape = i;
            if (bad_shape >= 0) {
                char s0[160], s1[160];
                en->kind = FO_SHAPE;
                en->ndim_b = di[bad_shape].ndim;
                memcpy(en->shape_b, di[bad_shape].shape, sizeof en->shape_b);
                en->ranks = (uint64_t)1 << r->rank_of_file[bad_shape];
                en->msg = fo_strdupf("replicated tensor has shape %s on rank %d but %s on rank %d",
                                    fo_shape_str(di[0].ndim, di[0].shape, s0, sizeof s0), r->rank_of_file[0],
                                    fo_shape_str(di[bad_shape].ndim, di[bad_shape].shape, s1, sizeof s1),
                                    r->rank_of_file[bad_shape]);
                goto close;
            }
            if (en->kind == FO_EMPTY) goto close;
            {
                /* eq[i*n+j]: files i and j identical so far (bitwise, as doubles: exact for every
                 * stored float type). */
                unsigned char eq[FO_MAX_RANKS * FO_MAX_RANKS];
                memset(eq, 1, (size_t)n * (size_t)n);
                const double *x[FO_MAX_RANKS];
                for (;;) {
                    int64_t off, cnt = 0, c2;
                    for (int i = 0; i < n && !rc; i++) rc = fo_stream_next(st[i], &x[i], &off, i ? &c2 : &cnt, e);
                    if (rc || cnt == 0) break;
                    for (int i = 0; i < n; i++)
                        for (int j = i + 1; j < n; j++)
                            if (eq[i * n + j] && memcmp(x[i], x[j], (size_t)cnt * sizeof(double)))
                                eq[i * n + j] = eq[j * n + i] = 0;
                    for (int i = 1; i < n; i++) fo_acc_add(&acc[i], x[i], x[0], cnt);
                }
                if (rc) goto close;
                /* No majority vote: identical everywhere, or a split reported as such. */
                int all_same = 1;
                for (int j = 1; j < n; j++) all_same &= eq[j];
                if (all_same) {
                    fo_acc_finish(&acc[1], &en->st); /* all zero: shows identical in tables */
                    goto close;
                }
                en->kind = FO_UNEQUAL;
                /* The groups of identical copies (file order of their first member). */
                int cls[FO_MAX_RANKS], ncls = 0;
                uint64_t members[FO_MAX_RANKS];
                for (int i = 0; i < n; i++) {
                    int k = 0;
                    for (; k < ncls; k++)
                        if (eq[cls[k] * n + i]) break;
                    if (k == ncls) cls[ncls] = i, members[ncls++] = 0;
                    members[k] |= (uint64_t)1 << r->rank_of_file[i];
                }
                char split[512];
                size_t so = 0;
                split[0] = 0;
                for (int k = 0; k < ncls && so < sizeof split; k++) {
                    char rl[256];
                    so += (size_t)snprintf(split + so, sizeof split - so, "%s%s", k ? " | " : "",
                                           rank_list(r, members[k], rl, sizeof rl));
                }
                /* metrics of the first copy that differs from file 0's (or file 0 against it) */
                int odd = 1;
                while (odd < n && eq[odd]) odd++;
                fo_acc_finish(&acc[odd < n ? odd : 1], &en->st);
                set_at(en, &md, en->st.n_nonfinite_mismatch ? en->st.first_nonfinite : en->st.argmax);
                char co[96], detail[400];
                fo_coords_str(en->ndim_a, en->coords, co, sizeof co);
                snprintf(detail, sizeof detail, "max|diff| %.3g at %s%s%s%s (rank %d vs rank %d), rel L2 %.3g, NaN %lld/%lld",
                         en->st.max_abs, co, en->where[0] ? " (" : "", en->where, en->where[0] ? ")" : "",
                         r->rank_of_file[odd < n ? odd : 1], r->rank_of_file[0], en->st.rel_l2,
                         (long long)en->st.nan_a, (long long)en->st.nan_b);
                uint64_t all = 0, wrong = 0;
                for (int k = 0; k < ncls; k++) all |= members[k];
                char why_ref[600] = "";
                if (ref) {
                    char *pr = fo_path_join(gp[0], name);
                    if (!pr) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                    for (int k = 0; k < ncls && !rc; k++) {
                        JOIN(gp[cls[k]]);
                        fo_stats rs;
                        int pass = 0;
                        if (!rc) rc = copy_vs_ref(files[cls[k]], p, ref, pr, ref_tol, block, &rs, &pass, e);
                        if (!rc && !pass) wrong |= members[k];
                    }
                    free(pr);
                    if (rc) goto close;
                }
                char rl[256], cl[256];
                if (ref && wrong && wrong != all) {
                    en->ranks = wrong;
                    snprintf(why_ref, sizeof why_ref, "%s %s differ%s from the reference %s; %s %s agree%s with it",
                             rank_word(wrong), rank_list(r, wrong, rl, sizeof rl), wrong & (wrong - 1) ? "" : "s",
                             fo_file_path(ref), rank_word(all & ~wrong), rank_list(r, all & ~wrong, cl, sizeof cl),
                             (all & ~wrong) & ((all & ~wrong) - 1) ? "" : "s");
                } else {
                    en->ranks = all;
                    if (ref)
                        snprintf(why_ref, sizeof why_ref, "%s", wrong ? "every copy differs from the reference"
                                                                      : "every copy is within tolerance of the reference");
                    else
                        snprintf(why_ref, sizeof why_ref,
                                 "without a reference no copy is known to be right (--ref REF.h5 names the ranks that "
                                 "differ from it)");
                }
                free(en->ranks_note);
                en->ranks_note = fo_strdupf("replicated; copies split %s", split);
                en->msg = fo_strdupf("replicated tensor differs across ranks: %d different copies, ranks %s; %s; %s", ncls,
                                     split, why_ref, detail);
            }
        close:
            free(p);
            p = NULL;
            for (int i = 0; i < n; i++) {
                fo_stream_close(st[i]);
                st[i] = NULL;
            }

        }
    }
    if (!rc) fo_report_tally(r);
    fo_names_free(&names);
    for (int i = 0; i < n; i++) {
        if (mdecl) free(mdecl[i]);
        fo_decl_free(&decl[i]);
    }
    free(mdecl);
    free(present);
    free(st);
    free(acc);
    free(gp);
    free(groups);
    cJSON_Delete(par);
    return rc;
}

