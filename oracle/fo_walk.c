/* fo_walk.c — execution-order walk and declared absences (see fo_walk.h). */
#include "fo_walk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fo_report.h"

int fo_walk_groups(fo_file *a, fo_file *b, fo_walk_group **out, int *n)
{
    int na = fo_file_nsteps(a), nb = b ? fo_file_nsteps(b) : 0;
    fo_walk_group *g = malloc((size_t)(na + nb + 2) * sizeof *g);
    if (!g) return -1;
    int k = 0, i = 0, j = 0;
    g[k].step = FO_STEP_INPUTS;
    snprintf(g[k++].group, sizeof g->group, "/inputs");
    while (i < na || j < nb) { /* merge the two ascending lists */
        int take_a = j >= nb || (i < na && fo_file_step_number(a, i) <= fo_file_step_number(b, j));
        int step = take_a ? fo_file_step_number(a, i) : fo_file_step_number(b, j);
        const char *name = take_a ? fo_file_step_group(a, i) : fo_file_step_group(b, j);
        if (take_a) i++;
        else j++;
        /* one number once, whichever file or spelling (step_2, step_0002) it came from */
        if (k > 1 && g[k - 1].step == step) continue;
        g[k].step = step;
        snprintf(g[k++].group, sizeof g->group, "%s", name);
    }
    g[k].step = FO_STEP_FINAL;
    snprintf(g[k++].group, sizeof g->group, "/final");
    *out = g;
    *n = k;
    return 0;
}

/* qsort_r of indices into a name array, by name then index (so the first mention sorts first) */
static int cmp_idx(const void *a, const void *b, void *names)
{
    int x = *(const int *)a, y = *(const int *)b;
    char **v = names;
    int c = strcmp(v[x], v[y]);
    return c ? c : (x > y) - (x < y);
}

int fo_walk_names(fo_file *f, const fo_walk_group *wg, char *gpath, size_t gn, fo_names *out, int *present, fs_err *e)
{
    fo_names_free(out);
    *present = 0;
    snprintf(gpath, gn, "%s", wg->group);
    if (wg->step >= 0) {
        int found = 0;
        for (int i = 0; i < fo_file_nsteps(f) && !found; i++)
            if (fo_file_step_number(f, i) == wg->step) {
                snprintf(gpath, gn, "%s", fo_file_step_group(f, i));
                found = 1;
            }
        if (!found) return FS_OK;
    } else if (!fo_is_group(f, gpath)) {
        return FS_OK;
    }
    *present = 1;
    fo_order_source src = FO_ORDER_NAME;
    int rc = fo_group_order(f, gpath, out, &src, e);
    if (rc) return rc;
    /* What `order` does not list is still in the file and must be compared: the group's
     * datasets are appended after the listed ones (nested groups' as "sub/name"). Without
     * `order`, fo_group_order listed them all already. */
    fo_names all = {0};
    if (src == FO_ORDER_ATTR && (rc = fo_group_datasets(f, gpath, &all, e))) return rc;
    if (all.n) {
        char **v = realloc(out->v, ((size_t)out->n + (size_t)all.n) * sizeof *v);
        if (!v) {
            fo_names_free(&all);
            return fs_errf(e, FS_E_NOMEM, "%s: %s: out of memory", FO_SHOW(fo_file_path(f)), gpath);
        }
        out->v = v;
        memcpy(out->v + out->n, all.v, (size_t)all.n * sizeof *v);
        out->n += all.n;
        free(all.v); /* the strings now belong to out */
    }
    /* A name listed twice (in `order`, or in `order` and among the appended) would be compared
     * twice: keep the first mention. Found by sorting (a damaged `order` may hold a million names;
     * pairwise checks would not end). */
    unsigned char *dup = calloc(out->n ? (size_t)out->n : 1, 1);
    int *idx = malloc((out->n ? (size_t)out->n : 1) * sizeof *idx);
    if (!dup || !idx) {
        free(dup), free(idx);
        return fs_errf(e, FS_E_NOMEM, "%s: %s: out of memory", FO_SHOW(fo_file_path(f)), gpath);
    }
    for (int i = 0; i < out->n; i++) idx[i] = i;
    qsort_r(idx, (size_t)out->n, sizeof *idx, cmp_idx, out->v);
    for (int i = 1; i < out->n; i++)
        if (!strcmp(out->v[idx[i]], out->v[idx[i - 1]])) dup[idx[i]] = 1; /* idx ties keep ascending order */
    int k = 0;
    for (int i = 0; i < out->n; i++) {
        int keep = 0;
        if (!dup[i]) {
            /* the whole name, however long: a path cut to a buffer names nothing and the dataset
             * would silently drop out of the comparison */
            char *p = fo_path_join(gpath, out->v[i]);
            if (!p) {
                for (int j = i; j < out->n; j++) free(out->v[j]);
                out->n = k;
                free(dup), free(idx);
                return fs_errf(e, FS_E_NOMEM, "%s: %s: out of memory", FO_SHOW(fo_file_path(f)), gpath);
            }
            keep = fo_is_dataset(f, p);
            free(p);
        }
        if (keep) out->v[k++] = out->v[i];
        else free(out->v[i]);
    }
    out->n = k;
    free(dup), free(idx);
    return FS_OK;
}

static int cmp_str(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }

int fo_name_set_make(const fo_names *l, fo_name_set *s)
{
    s->n = 0;
    s->v = malloc((l->n ? (size_t)l->n : 1) * sizeof *s->v);
    if (!s->v) return -1;
    if (l->n) memcpy(s->v, l->v, (size_t)l->n * sizeof *s->v); /* l->v is NULL for an empty list */
    s->n = l->n;
    qsort(s->v, (size_t)s->n, sizeof *s->v, cmp_str);
    return 0;
}

int fo_name_set_has(const fo_name_set *s, const char *name)
{
    return s->n && bsearch(&name, s->v, (size_t)s->n, sizeof *s->v, cmp_str) != NULL;
}

void fo_name_set_free(fo_name_set *s)
{
    free(s->v);
    s->v = NULL;
    s->n = 0;
}

int fo_modules_promise(const char *decl, const char *name)
{
    if (!decl || !strcmp(decl, "all")) return 1;
    if (!strncmp(decl, "match:", 6)) { /* flux-sim --dump-modules: the step's latents and the globs */
        fo_globs g = {0};
        char why[128];
        if (fo_globs_parse(decl + 6, &g, why, sizeof why)) return -1;
        int hit = !strcmp(name, "latents_in") || !strcmp(name, "latents_out") || fo_globs_match(&g, name);
        fo_globs_free(&g);
        return hit;
    }
    int depth = 0;
    char tail = 0;
    if (sscanf(decl, "depth<=%d%c", &depth, &tail) != 1 || depth < 1) return -1;
    int comps = 1;
    for (const char *p = name; *p && *p != '#' && *p != '@'; p++) comps += *p == '.';
    return comps <= depth;
}

int fo_decl_read(fo_file *f, int partial_ok, fo_decl *d, fs_err *e)
{
    memset(d, 0, sizeof *d);
    d->partial_ok = partial_ok;
    char *rs = NULL, why[200];
    int rc = fo_attr_string(f, "/", "recorded_steps", &rs, e);
    if (rc) return rc;
    if (!rs) {
        d->steps.all = 1;
        return FS_OK;
    }
    if (fo_steps_parse(rs, &d->steps, why, sizeof why))
        rc = fs_errf(e, FS_E_INPUT, "%s: attribute recorded_steps: %s", fo_file_path(f), why);
    free(rs);
    return rc;
}

void fo_decl_free(fo_decl *d)
{
    if (d) fo_steps_free(&d->steps);
}

int fo_decl_excuses(const fo_decl *d, const fo_walk_group *wg, int present, const char *modules_decl,
                    const char *name)
{
    if (d->partial_ok) return 1;
    if (wg->step < 0) return 0; /* /inputs and /final cannot be declared away */
    if (!fo_steps_has(&d->steps, wg->step)) return 1;
    if (!present) return 0;
    return fo_modules_promise(modules_decl, name) == 0;
}
