/* fo_steps.c — step lists (see fo_steps.h). */
#include "fo_steps.h"

#include <ctype.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_common.h"

#define MAX_LISTED 1000000 /* total steps a list may name: far above any sampler's step count */

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* A decimal step number at *p (no sign), advancing *p; -1 when there is none or it is too big. */
static long parse_num(const char **p)
{
    const char *s = *p;
    if (!isdigit((unsigned char)*s)) return -1;
    long v = 0;
    while (isdigit((unsigned char)*s)) {
        v = v * 10 + (*s - '0');
        if (v >= FO_STEPS_MAX) return -1;
        s++;
    }
    *p = s;
    return v;
}

void fo_steps_free(fo_steps *s)
{
    if (!s) return;
    free(s->v);
    memset(s, 0, sizeof *s);
}

int fo_steps_parse(const char *text, fo_steps *out, char *why, size_t n)
{
    memset(out, 0, sizeof *out);
    if (!text) {
        snprintf(why, n, "no step list");
        return -1;
    }
    const char *p = text;
    while (*p == ' ') p++;
    if (!strncmp(p, "all", 3)) {
        const char *q = p + 3;
        while (*q == ' ') q++;
        if (!*q) {
            out->all = 1;
            return 0;
        }
    }
    int cap = 0;
    long total = 0;
    for (;;) {
        while (*p == ' ') p++;
        const char *item = p;
        long a = parse_num(&p), b = a;
        while (*p == ' ') p++;
        if (a >= 0 && *p == '-') {
            p++;
            while (*p == ' ') p++;
            b = parse_num(&p);
            while (*p == ' ') p++;
        }
        if (a < 0 || b < 0 || (*p && *p != ',')) {
            size_t len = strcspn(item, ",");
            /* the text comes from a file (recorded_steps) or the command line: escaped, so the
             * message stays one line (found by fuzz_oracle_walk) */
            char shown[200];
            snprintf(why, n, "'%s' is not a step number or a range A-B (steps are 0..%d)",
                     fs_printable_n(item, len, shown, sizeof shown, 40), FO_STEPS_MAX - 1);
            fo_steps_free(out);
            return -1;
        }
        if (b < a) {
            snprintf(why, n, "range %ld-%ld runs backwards", a, b);
            fo_steps_free(out);
            return -1;
        }
        total += b - a + 1;
        if (total > MAX_LISTED) {
            snprintf(why, n, "the list names more than %d steps", MAX_LISTED);
            fo_steps_free(out);
            return -1;
        }
        if (out->n + (b - a + 1) > cap) {
            int nc = cap ? cap : 16;
            while (nc < out->n + (b - a + 1)) nc *= 2;
            int *v = realloc(out->v, (size_t)nc * sizeof *v);
            if (!v) {
                snprintf(why, n, "out of memory");
                fo_steps_free(out);
                return -1;
            }
            out->v = v, cap = nc;
        }
        for (long k = a; k <= b; k++) out->v[out->n++] = (int)k;
        if (!*p) break;
        p++; /* the comma */
    }
    qsort(out->v, (size_t)out->n, sizeof *out->v, cmp_int);
    int k = 0;
    for (int i = 0; i < out->n; i++)
        if (!k || out->v[k - 1] != out->v[i]) out->v[k++] = out->v[i];
    out->n = k;
    return 0;
}

int fo_steps_has(const fo_steps *s, int step)
{
    if (!s) return 0;
    if (s->all) return 1;
    return s->n && bsearch(&step, s->v, (size_t)s->n, sizeof *s->v, cmp_int) != NULL;
}

const char *fo_steps_str(const fo_steps *s, char *buf, size_t n)
{
    if (!buf || !n) return buf;
    buf[0] = 0;
    if (s->all) {
        snprintf(buf, n, "all");
        return buf;
    }
    size_t o = 0;
    for (int i = 0; i < s->n && o < n;) {
        int j = i;
        while (j + 1 < s->n && s->v[j + 1] == s->v[j] + 1) j++;
        if (j > i) o += (size_t)snprintf(buf + o, n - o, "%s%d-%d", o ? "," : "", s->v[i], s->v[j]);
        else o += (size_t)snprintf(buf + o, n - o, "%s%d", o ? "," : "", s->v[i]);
        i = j + 1;
    }
    return buf;
}

/* ---------------------------------------------------------------- module globs */

void fo_globs_free(fo_globs *g)
{
    if (!g) return;
    for (int i = 0; i < g->n; i++) free(g->v[i]);
    free(g->v);
    memset(g, 0, sizeof *g);
}

int fo_globs_parse(const char *text, fo_globs *out, char *why, size_t n)
{
    memset(out, 0, sizeof *out);
    if (!text) {
        snprintf(why, n, "no glob");
        return -1;
    }
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, ",");
        while (len && *p == ' ') p++, len--;
        while (len && p[len - 1] == ' ') len--;
        if (len > 255) {
            char shown[200];
            snprintf(why, n, "glob '%s...' is longer than 255 characters", fs_printable_n(p, 40, shown, sizeof shown, 40));
            fo_globs_free(out);
            return -1;
        }
        if (len) {
            if (out->n == FO_GLOBS_MAX) {
                snprintf(why, n, "more than %d globs", FO_GLOBS_MAX);
                fo_globs_free(out);
                return -1;
            }
            char **v = realloc(out->v, (size_t)(out->n + 1) * sizeof *v);
            if (v) out->v = v;
            if (!v || !(out->v[out->n] = strndup(p, len))) {
                snprintf(why, n, "out of memory");
                fo_globs_free(out);
                return -1;
            }
            out->n++;
        }
        p += len;
        while (*p == ' ') p++;
        if (*p == ',') p++;
    }
    if (!out->n) {
        char shown[240];
        snprintf(why, n, "no glob in '%s'", fs_printable(text, shown, sizeof shown, 60));
        return -1;
    }
    return 0;
}

int fo_globs_match(const fo_globs *g, const char *name)
{
    if (!g || !g->n) return 1;
    for (int i = 0; i < g->n; i++)
        if (!fnmatch(g->v[i], name, 0)) return 1;
    return 0;
}

const char *fo_globs_str(const fo_globs *g, char *buf, size_t n)
{
    size_t o = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < g->n && o < n; i++) o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? "," : "", g->v[i]);
    return buf;
}
