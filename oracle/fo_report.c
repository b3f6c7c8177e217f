/* fo_report.c — report lifecycle and the verdict rule (see fo_report.h). */
#include "fo_report.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *fo_kind_name(fo_kind k)
{
    switch (k) {
    case FO_PASS: return "pass";
    case FO_TOL: return "tolerance";
    case FO_NONFINITE: return "nonfinite";
    case FO_SHAPE: return "shape";
    case FO_UNEQUAL: return "unequal";
    case FO_EMPTY: return "empty";
    }
    return "?";
}

char *fo_strdupf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}

void fo_report_init(fo_report *r, fo_mode mode)
{
    memset(r, 0, sizeof *r);
    r->mode = mode;
    r->first = -1;
}

void fo_report_free(fo_report *r)
{
    if (!r) return;
    for (int i = 0; i < r->n; i++) {
        free(r->v[i].name);
        free(r->v[i].ranks_note);
        free(r->v[i].msg);
    }
    free(r->v);
    fo_names_free(&r->only_a);
    fo_names_free(&r->only_b);
    fo_names_free(&r->undeclared_a);
    fo_names_free(&r->undeclared_b);
    free(r->partial_note);
    fo_report_init(r, r->mode);
}

void fo_stat_report_free(fo_stat_report *r)
{
    if (!r) return;
    for (int i = 0; i < r->n; i++) free(r->v[i].name);
    free(r->v);
    free(r->partial_note);
    memset(r, 0, sizeof *r);
    r->first_nonfinite = -1;
}

fo_entry *fo_report_add(fo_report *r, int step, const char *group, const char *name)
{
    if (r->n == r->cap) {
        int nc = r->cap ? 2 * r->cap : 256;
        fo_entry *p = realloc(r->v, (size_t)nc * sizeof *p);
        if (!p) return NULL;
        r->v = p;
        r->cap = nc;
    }
    fo_entry *en = &r->v[r->n];
    memset(en, 0, sizeof *en);
    en->name = strdup(name);
    if (!en->name) return NULL;
    r->n++;
    en->step = step;
    snprintf(en->group, sizeof en->group, "%s", group);
    en->at = -1;
    return en;
}

void fo_report_tally(fo_report *r)
{
    r->nfail = r->n_compared = r->n_empty = 0;
    r->first = -1;
    for (int k = 0; k < r->n; k++) {
        if (r->v[k].kind == FO_EMPTY) {
            r->n_empty++;
            continue;
        }
        r->n_compared++;
        if (r->v[k].kind != FO_PASS) {
            r->nfail++;
            if (r->first < 0) r->first = k;
        }
    }
}

int fo_names_push(fo_names *l, const char *group, const char *name)
{
    char **p = realloc(l->v, (size_t)(l->n + 1) * sizeof *p);
    if (!p) return -1;
    l->v = p;
    l->v[l->n] = fo_strdupf("%s/%s", group, name);
    if (!l->v[l->n]) return -1;
    l->n++;
    return 0;
}

fo_verdict fo_report_verdict(const fo_report *r, int strict, const char *file_a, const char *file_b, char *why,
                             size_t n)
{
    char dummy[8];
    if (!why) why = dummy, n = sizeof dummy;
    why[0] = 0;
    const char *fa = file_a ? file_a : "A", *fb = file_b ? file_b : "B";
    if (r->undeclared_a.n || r->undeclared_b.n) {
        /* name the side that lacks something; the first name in execution order */
        const fo_names *l = r->undeclared_a.n ? &r->undeclared_a : &r->undeclared_b;
        int other = r->undeclared_a.n ? r->undeclared_b.n : 0;
        if (r->mode == FO_MODE_CONSISTENCY)
            snprintf(why, n, "replicated %s is missing in some rank files%s", FO_SHOW(l->v[0]),
                     l->n > 1 ? " (and more: see the report)" : "");
        else {
            char more[48] = "";
            if (l->n > 1) snprintf(more, sizeof more, " (and %d more)", l->n - 1);
            snprintf(why, n,
                     "%s lacks %s%s that %s holds, and declares no reason (recorded_steps, recorded_modules)%s; "
                     "narrow the comparison with --modules/--steps if that is intended",
                     r->undeclared_a.n ? fb : fa, FO_SHOW(l->v[0]), more, r->undeclared_a.n ? fa : fb,
                     other ? "; names are missing on both sides" : "");
        }
        return FO_VERDICT_ERROR;
    }
    if (r->n_compared == 0) {
        if (r->mode == FO_MODE_CONSISTENCY)
            snprintf(why, n, "nothing compared: no dataset the sharding map marks replicated holds any values");
        else
            snprintf(why, n, "nothing compared: %s and %s share no dataset with values%s%s", fa, fb,
                     r->n_empty ? " (the common ones are all empty)" : "",
                     r->narrowed ? " among those --modules/--steps select" : "");
        return FO_VERDICT_ERROR;
    }
    if (r->nfail) return FO_VERDICT_DIVERGE;
    if (strict && (r->only_a.n || r->only_b.n)) return FO_VERDICT_DIVERGE;
    return FO_VERDICT_PASS;
}
