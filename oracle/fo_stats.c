/* fo_stats.c — `flux-oracle stats`: per-dataset summaries of one dump, and where the first
 * NaN/Inf appears in execution order (see fo_diff.h). */
#include "fo_diff.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fo_config.h"
#include "fo_walk.h"

#define DEFAULT_BLOCK (1 << 18) /* as fo_diff.c */

int fo_stats_run(fo_file *a, const fo_diff_opts *o, fo_stat_report *r, fs_err *e)
{
    static const fo_diff_opts defaults = {0};
    if (!o) o = &defaults;
    memset(r, 0, sizeof *r);
    r->first_nonfinite = -1;
    int64_t block = o->block_elems > 0 ? o->block_elems : DEFAULT_BLOCK;
    int rc = fo_config_check(fo_file_config(a), fo_file_path(a), e);
    if (!rc) rc = fo_require_complete(a, o->allow_partial, &r->partial_note, e);
    if (rc) return rc;
    fo_walk_group *groups = NULL;
    int ng = 0;
    if (fo_walk_groups(a, NULL, &groups, &ng)) return fs_errf(e, FS_E_NOMEM, "out of memory");
    fo_names names = {0};
    for (int g = 0; g < ng && !rc; g++) {
        char gp[64];
        int present;
        if ((rc = fo_walk_names(a, &groups[g], gp, sizeof gp, &names, &present, e))) break;
        for (int k = 0; k < names.n && !rc; k++) {
            if (fo_narrowed_out(o, groups[g].step, names.v[k])) continue;
            if (r->n == r->cap) {
                int nc = r->cap ? 2 * r->cap : 256;
                fo_stat_entry *p = realloc(r->v, (size_t)nc * sizeof *p);
                if (!p) {
                    rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                    break;
                }
                r->v = p, r->cap = nc;
            }
            fo_stat_entry *en = &r->v[r->n];
            memset(en, 0, sizeof *en);
            if (!(en->name = strdup(names.v[k]))) {
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                break;
            }
            r->n++;
            en->step = groups[g].step;
            snprintf(en->group, sizeof en->group, "%s", groups[g].group);
            char *p = fo_path_join(gp, names.v[k]);
            if (!p) {
                rc = fs_errf(e, FS_E_NOMEM, "out of memory");
                break;
            }
            fo_stream *s = NULL;
            fo_dataset info = {0};
            rc = fo_stream_open(a, p, block, &s, &info, e);
            free(p);
            if (rc) break;
            en->ndim = info.ndim;
            memcpy(en->shape, info.shape, sizeof info.shape);
            memcpy(en->dtype, info.dtype, sizeof info.dtype);
            fo_summary_init(&en->s);
            for (;;) {
                fo_view x;
                int64_t off, cnt;
                if ((rc = fo_stream_view(s, &x, &off, &cnt, e)) || cnt == 0) break;
                int64_t before = en->s.first_nonfinite;
                fo_summary_add_view(&en->s, x, cnt);
                if (before < 0 && en->s.first_nonfinite >= 0) en->first_value = fo_view_at(x, en->s.first_nonfinite - off);
            }
            fo_stream_close(s);
            fo_summary_finish(&en->s);
            if (info.numel == 0) r->n_empty++;
            if (en->s.first_nonfinite >= 0) {
                fo_unravel(en->s.first_nonfinite, en->ndim, en->shape, en->coords);
                if (r->first_nonfinite < 0) r->first_nonfinite = r->n - 1;
            }
        }
    }
    fo_names_free(&names);
    free(groups);
    if (!rc && r->n == r->n_empty)
        rc = fs_errf(e, FS_E_INPUT, "%s: nothing to check: %s", fo_file_path(a),
                     r->n ? "every dataset is empty (0 elements)" : "no datasets (selected)");
    return rc;
}
