/* fo_render.c — the report files of flux-oracle: HTML (with an SVG plot) and JUnit XML, and the
 * small formatters the CLI's terminal output shares with them (see fo_render.h). */
#include "fo_render.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *fo_step_label(int step, char *buf, size_t n)
{
    if (step == FO_STEP_INPUTS) snprintf(buf, n, "in");
    else if (step == FO_STEP_FINAL) snprintf(buf, n, "final");
    else snprintf(buf, n, "%d", step);
    return buf;
}

/* "step 2 proj_out", "/inputs/hidden_states", "/final/latents": how a dataset is named in
 * messages (a /inputs dataset has no step). */
const char *fo_entry_label(int step, const char *group, const char *name, char *buf, size_t n)
{
    if (step >= 0) snprintf(buf, n, "step %d %s", step, FO_SHOW(name));
    else snprintf(buf, n, "%s/%s", group, FO_SHOW(name));
    return buf;
}

const char *fo_ranks_str(uint64_t m, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int r = 0; r < FO_MAX_RANKS && o < n; r++)
        if (m >> r & 1) o += (size_t)snprintf(buf + o, n - o, "%s%d", o ? "," : "", r);
    return buf;
}

const char *fo_dtype_short(const char *d)
{
    if (!strcmp(d, "float32")) return "f32";
    if (!strcmp(d, "float64")) return "f64";
    if (!strcmp(d, "float16")) return "f16";
    return d;
}

/* "276 tensors compared; 0 only in A, 0 only in B" (+ empty, excluded, undeclared, partial) */
const char *fo_counts_str(const fo_report *r, char *buf, size_t n)
{
    size_t o = (size_t)snprintf(buf, n, "%d tensor%s compared", r->n_compared, r->n_compared == 1 ? "" : "s");
    if (r->n_empty && o < n) o += (size_t)snprintf(buf + o, n - o, ", %d empty (not compared)", r->n_empty);
    if (o < n) o += (size_t)snprintf(buf + o, n - o, "; %d only in A", r->only_a.n);
    if (r->undeclared_a.n && o < n) o += (size_t)snprintf(buf + o, n - o, " (%d undeclared)", r->undeclared_a.n);
    if (o < n) o += (size_t)snprintf(buf + o, n - o, ", %d only in B", r->only_b.n);
    if (r->undeclared_b.n && o < n) o += (size_t)snprintf(buf + o, n - o, " (%d undeclared)", r->undeclared_b.n);
    if (r->excluded && o < n) o += (size_t)snprintf(buf + o, n - o, "; %d left out by --modules/--steps", r->excluded);
    if (r->partial_note && o < n) o += (size_t)snprintf(buf + o, n - o, "; %s", r->partial_note);
    return buf;
}

const char *fo_verdict_word(fo_verdict v) { return v == FO_VERDICT_PASS ? "PASS" : v == FO_VERDICT_DIVERGE ? "DIVERGE" : "ERROR"; }

/* ---------- HTML and XML text ---------- */

size_t fo_utf8_char(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (!n) return 0;
    const unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t k;
    uint32_t v, min;
    if (c >= 0xc2 && c <= 0xdf) k = 2, v = c & 0x1f, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) k = 3, v = c & 0x0f, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) k = 4, v = c & 0x07, min = 0x10000;
    else return 0; /* a continuation byte, 0xc0/0xc1 (always overlong) or 0xf5-0xff */
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    /* overlong forms (E0 80 BC is '<'), UTF-16 surrogates, beyond U+10FFFF */
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return k;
}

/* XML 1.0's Char production: what a well-formed document may hold, even escaped. */
static int xml_char(uint32_t c)
{
    return c == 0x9 || c == 0xa || c == 0xd || (c >= 0x20 && c <= 0xd7ff) || (c >= 0xe000 && c <= 0xfffd) ||
           (c >= 0x10000 && c <= 0x10ffff);
}

void fo_xml_esc(FILE *f, const char *s)
{
    if (!s) return;
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    while (n) {
        uint32_t c = 0;
        size_t k = fo_utf8_char(p, n, &c);
        if (k == 0 || !xml_char(c) || c == 0x7f || (c < 0x20 && c != '\n' && c != '\t')) {
            /* invalid UTF-8, U+FFFE/U+FFFF, control characters: shown, not passed on; every byte
             * of an invalid sequence on its own, as fs_printable does on a terminal */
            size_t bad = k ? k : 1;
            for (size_t i = 0; i < bad; i++) fprintf(f, "\\x%02X", p[i]);
            p += bad, n -= bad;
            continue;
        }
        switch (c) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fwrite(p, 1, k, f);
        }
        p += k, n -= k;
    }
}

/* A dataset as the reports name it, escaped: "step 2 NAME" or "/inputs/NAME", the whole name
 * (the terminal's fo_entry_label shortens it). */
static void xml_label(FILE *f, const fo_entry *en)
{
    if (en->step >= 0) fprintf(f, "step %d ", en->step);
    else fprintf(f, "%s/", en->group);
    fo_xml_esc(f, en->name);
}

/* The plot: x = position in execution order, y = log10 of the error (rel L2 as lines, one per
 * step group; max rel as dots), dashed lines at rtol and mtol, the first divergence marked. */
static void html_svg(FILE *f, const fo_report *r)
{
    const double W = 1100, H = 420, L = 70, R = 150, T = 30, B = 50;
    double lo = 0, hi = -20;
    int any = 0;
    for (int i = 0; i < r->n; i++) {
        const fo_entry *en = &r->v[i];
        if (en->kind == FO_SHAPE) continue;
        double v[2] = {en->st.rel_l2, fo_stats_max_rel(&en->st)};
        for (int k = 0; k < 2; k++)
            if (v[k] > 0 && isfinite(v[k])) {
                double l = log10(v[k]);
                if (!any || l < lo) lo = l;
                if (!any || l > hi) hi = l;
                any = 1;
            }
    }
    double tl[2] = {r->tol.rtol, r->tol.mtol};
    for (int k = 0; k < 2; k++)
        if (tl[k] > 0) {
            double l = log10(tl[k]);
            if (!any || l < lo) lo = l;
            if (!any || l > hi) hi = l;
            any = 1;
        }
    if (!any) lo = -8, hi = 0;
    lo = floor(lo) - 1; /* room below for exact zeros, drawn on the floor */
    hi = ceil(hi) + 1;  /* and above for non-finite / shape failures, drawn on the ceiling */
    if (hi - lo < 2) hi = lo + 2;
    int n = r->n > 1 ? r->n : 2;
#define X(i) (L + (W - L - R) * (double)(i) / (double)(n - 1))
#define Y(l) (T + (H - T - B) * (hi - (l)) / (hi - lo))
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n", W, H, W, H);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fcfcfc\" stroke=\"#999\"/>\n", L, T,
            W - L - R, H - T - B);
    for (int d = (int)lo; d <= (int)hi; d++) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>", L, Y(d), W - R, Y(d));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">1e%d</text>\n", L - 6, Y(d) + 4, d);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">datasets in execution order "
               "(/inputs, steps, /final)</text>\n", (L + W - R) / 2, H - 12);
    fprintf(f, "<text x=\"14\" y=\"%.1f\" transform=\"rotate(-90 14 %.1f)\" text-anchor=\"middle\">"
               "relative error (log scale)</text>\n", (T + H - B) / 2, (T + H - B) / 2);
    static const char *const pal[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
                                      "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"};
    /* One polyline per group (a step, /inputs, /final). */
    int gi = 0, legend = 0;
    for (int i = 0; i < r->n;) {
        int j = i;
        while (j < r->n && !strcmp(r->v[j].group, r->v[i].group)) j++;
        const char *col = pal[gi % (int)FS_ARRAY_LEN(pal)];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.4\" points=\"", col);
        for (int k = i; k < j; k++) {
            const fo_entry *en = &r->v[k];
            double v = en->st.rel_l2;
            double l = en->kind == FO_SHAPE || en->kind == FO_NONFINITE || !isfinite(v) ? hi : v > 0 ? log10(v) : lo;
            fprintf(f, "%.1f,%.1f ", X(k), Y(l));
        }
        fprintf(f, "\"/>\n");
        if (j - i == 1) { /* a one-dataset group (/final): a line of one point is invisible */
            const fo_entry *en = &r->v[i];
            double v = en->st.rel_l2;
            double l = en->kind == FO_SHAPE || en->kind == FO_NONFINITE || !isfinite(v) ? hi : v > 0 ? log10(v) : lo;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"6\" height=\"6\" fill=\"%s\"/>\n", X(i) - 3, Y(l) - 3, col);
        }
        for (int k = i; k < j; k++) {
            double v = fo_stats_max_rel(&r->v[k].st);
            if (r->v[k].kind == FO_SHAPE || !(v > 0) || !isfinite(v)) continue;
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"1.6\" fill=\"%s\" opacity=\"0.45\"/>", X(k), Y(log10(v)), col);
        }
        fprintf(f, "\n<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ccc\" stroke-dasharray=\"2,3\"/>\n",
                X(i), T, X(i), H - B);
        if (legend < 16) {
            char sl[16];
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>",
                    W - R + 12, T + 14.0 * legend + 8, W - R + 30, T + 14.0 * legend + 8, col);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s%s</text>\n", W - R + 34, T + 14.0 * legend + 12,
                    r->v[i].step >= 0 ? "step " : "", r->v[i].step >= 0 ? fo_step_label(r->v[i].step, sl, sizeof sl)
                                                                         : r->v[i].group + 1);
            legend++;
        }
        gi++;
        i = j;
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">lines: rel L2</text>", W - R + 12, T + 14.0 * legend + 22);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">dots: max rel</text>\n", W - R + 12, T + 14.0 * legend + 36);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">0: bottom edge</text>", W - R + 12, T + 14.0 * legend + 50);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">NaN/shape: top</text>\n", W - R + 12, T + 14.0 * legend + 64);
    if (r->tol.rtol > 0)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-dasharray=\"6,4\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\">rtol %g</text>\n",
                L, Y(log10(r->tol.rtol)), W - R, Y(log10(r->tol.rtol)), L + 4, Y(log10(r->tol.rtol)) - 4, r->tol.rtol);
    if (r->tol.mtol > 0)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-dasharray=\"1,3\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\">mtol %g</text>\n",
                L, Y(log10(r->tol.mtol)), W - R, Y(log10(r->tol.mtol)), L + 80, Y(log10(r->tol.mtol)) - 4, r->tol.mtol);
    if (r->first >= 0) {
        const fo_entry *en = &r->v[r->first];
        double v = en->st.rel_l2;
        double l = en->kind == FO_SHAPE || en->kind == FO_NONFINITE || !isfinite(v) ? hi : v > 0 ? log10(v) : lo;
        double mv = fo_stats_max_rel(&en->st);
        if (en->kind == FO_TOL && mv > 0 && isfinite(mv) && log10(mv) > l) l = log10(mv);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-width=\"1\"/>", X(r->first),
                T, X(r->first), H - B);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"6\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2.5\"/>",
                X(r->first), Y(l));
        int right = X(r->first) < (L + W - R) / 2;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\" font-weight=\"bold\" text-anchor=\"%s\">"
                   "first divergence: ", X(r->first) + (right ? 8 : -8), T + 14, right ? "start" : "end");
        xml_label(f, en);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
#undef X
#undef Y
}

void fo_html_report(FILE *f, const fo_report *r, const fo_render_ctx *o, const char *err)
{
    (void)err;
    int v = o->verdict;
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>flux-oracle %s</title>\n",
            r->mode == FO_MODE_DIFF ? "diff" : "consistency");
    fputs("<style>\nbody{font-family:sans-serif;margin:20px;color:#222}\n"
          "table{border-collapse:collapse;font-size:12px;font-family:monospace}\n"
          "td,th{border-bottom:1px solid #ddd;padding:2px 8px;text-align:right;white-space:nowrap}\n"
          "td.n,th.n{text-align:left}\ntr.fail{background:#fdecea}\ntr.first{background:#f8b7b1;font-weight:bold}\n"
          ".pass{color:#2ca02c}.diverge{color:#d62728}\n"
          "#onlyfail:checked ~ table.all tr.ok{display:none}\n</style>\n</head>\n<body>\n", f);
    fprintf(f, "<h1>flux-oracle %s: <span class=\"%s\">%s</span></h1>\n<p>", r->mode == FO_MODE_DIFF ? "diff" : "consistency",
            v ? "diverge" : "pass", fo_verdict_word(o->verdict));
    for (int i = 0; i < o->nfiles; i++) {
        fputs(i ? "<br/><code>" : "<code>", f);
        fo_xml_esc(f, o->files[i]);
        fputs("</code>", f);
        if (r->mode == FO_MODE_DIFF) fputs(i == 0 ? " (A, candidate)" : " (B, reference)", f);
    }
    if (o->truth) {
        fputs("<br/>truth: <code>", f);
        fo_xml_esc(f, o->truth);
        fprintf(f, "</code> (m = %g)", r->multiplier);
    }
    char cn[2048];
    fprintf(f, "</p>\n<p>%d out of tolerance; rtol %g, atol %g, mtol %g. ", r->nfail, r->tol.rtol, r->tol.atol,
            r->tol.mtol);
    fo_xml_esc(f, fo_counts_str(r, cn, sizeof cn));
    fputs(".</p>\n", f);
    if (o->verdict == FO_VERDICT_ERROR) {
        fputs("<p class=\"diverge\"><b>Error:</b> ", f);
        fo_xml_esc(f, o->why);
        fputs("</p>\n", f);
    }
    if (r->first >= 0) {
        const fo_entry *en = &r->v[r->first];
        char rk[256];
        fputs("<p class=\"diverge\"><a href=\"#first\">First divergence</a>: <code>", f);
        xml_label(f, en);
        fputs("</code>: ", f);
        fo_xml_esc(f, en->msg);
        if (en->ranks) fprintf(f, "; ranks %s", fo_ranks_str(en->ranks, rk, sizeof rk));
        fputs("</p>\n", f);
    }
    html_svg(f, r);
    /* Failures only: a list first (works without CSS), then the table's toggle. */
    if (r->nfail) {
        fprintf(f, "<h2>Failing datasets (%d)</h2>\n<ul>\n", r->nfail);
        for (int i = 0; i < r->n; i++) {
            const fo_entry *en = &r->v[i];
            if (en->kind == FO_PASS || en->kind == FO_EMPTY) continue;
            fputs("<li><code>", f);
            xml_label(f, en);
            fputs("</code>: ", f);
            fo_xml_esc(f, en->msg);
            fputs("</li>\n", f);
        }
        fputs("</ul>\n", f);
    }
    fputs("<h2>All datasets</h2>\n<input type=\"checkbox\" id=\"onlyfail\"/> <label for=\"onlyfail\">show only failing "
          "datasets</label>\n", f);
    fputs("<table class=\"all\">\n<tr><th>#</th><th>step</th><th class=\"n\">dataset</th><th class=\"n\">shape</th><th>dtype</th>"
          "<th>max|A-B|</th><th class=\"n\">at</th><th>rel L2</th><th>max rel</th><th>cosine</th>"
          "<th>NaN/Inf A|B</th><th>ranks</th><th class=\"n\">status</th></tr>\n", f);
    for (int i = 0; i < r->n; i++) {
        const fo_entry *en = &r->v[i];
        char sl[16], sh[160], sb[160], co[96], rk[256];
        fo_shape_str(en->ndim_a, en->shape_a, sh, sizeof sh);
        fo_shape_str(en->ndim_b, en->shape_b, sb, sizeof sb);
        co[0] = 0;
        if (en->at >= 0) fo_coords_str(en->ndim_a, en->coords, co, sizeof co);
        fprintf(f, "<tr%s><td>%d</td><td>%s</td><td class=\"n\">", i == r->first ? " class=\"first\" id=\"first\""
                                                                     : en->kind != FO_PASS && en->kind != FO_EMPTY ? " class=\"fail\""
                                                                                                : " class=\"ok\"",
                i, fo_step_label(en->step, sl, sizeof sl));
        fo_xml_esc(f, en->name);
        fprintf(f, "</td><td class=\"n\">%s%s%s</td><td>%s%s%s</td>", sh, en->kind == FO_SHAPE ? " | " : "",
                en->kind == FO_SHAPE ? sb : "", fo_dtype_short(en->dtype_a), strcmp(en->dtype_a, en->dtype_b) ? "|" : "",
                strcmp(en->dtype_a, en->dtype_b) ? fo_dtype_short(en->dtype_b) : "");
        if (en->kind == FO_SHAPE || en->kind == FO_EMPTY)
            fputs("<td>-</td><td class=\"n\">-</td><td>-</td><td>-</td><td>-</td><td>-</td>", f);
        else
        {
            fprintf(f, "<td>%.3e</td><td class=\"n\" title=\"", en->st.max_abs);
            fo_xml_esc(f, en->where);
            fprintf(f, "\">%s</td><td>%.3e</td><td>%.3e</td><td>%.9f</td>"
                       "<td>%lld/%lld | %lld/%lld</td>",
                    co, en->st.rel_l2, fo_stats_max_rel(&en->st), en->st.cosine,
                    (long long)en->st.nan_a, (long long)en->st.inf_a, (long long)en->st.nan_b, (long long)en->st.inf_b);
        }
        fprintf(f, "<td>%s</td><td class=\"n\">%s</td></tr>\n", en->ranks ? fo_ranks_str(en->ranks, rk, sizeof rk) : "",
                en->kind == FO_PASS ? "ok" : en->kind == FO_EMPTY ? "empty (0 elements)" : fo_kind_name(en->kind));
    }
    fputs("</table>\n", f);
    for (int k = 0; k < 2; k++) {
        const fo_names *l = k ? &r->only_b : &r->only_a;
        if (!l->n) continue;
        fprintf(f, "<details><summary>%d only in %s</summary><pre>", l->n, k ? "B" : "A");
        for (int i = 0; i < l->n; i++) {
            fo_xml_esc(f, l->v[i]);
            fputc('\n', f);
        }
        fputs("</pre></details>\n", f);
    }
    fputs("</body>\n</html>\n", f);
}

/* ---------- JUnit XML ----------
 * One <testcase> per compared tensor (classname: the group, "step_0002" / "inputs" / "final";
 * name: the dataset), a <failure> carrying the metrics, tolerance and coordinates; <skipped> for
 * empty datasets and names one side declared unrecorded (<failure> with --strict); <error> for
 * names missing without a declaration and for a comparison that could not run at all (`err`:
 * partial dump, different models, unreadable file). */

static const char *junit_class(const char *group)
{
    return group[0] == '/' ? group + 1 : group;
}

static void junit_only(FILE *f, const fo_names *l, const fo_names *undeclared, const char *side, const char *other,
                       int strict)
{
    for (int i = 0; i < l->n; i++) {
        const char *p = l->v[i] + (l->v[i][0] == '/'), *slash = strchr(p, '/');
        int und = 0;
        for (int k = 0; k < undeclared->n && !und; k++) und = !strcmp(undeclared->v[k], l->v[i]);
        fputs("  <testcase classname=\"", f);
        if (slash) {
            char *cls = strndup(p, (size_t)(slash - p));
            fo_xml_esc(f, cls ? cls : "?");
            free(cls);
        }
        fputs("\" name=\"", f);
        fo_xml_esc(f, slash ? slash + 1 : p);
        fputs("\" time=\"0\">", f);
        if (und)
            fprintf(f, "<error type=\"missing\" message=\"only in %s: %s lacks it and declares no reason\"/>", side, other);
        else if (strict)
            fprintf(f, "<failure type=\"only-in-%s\" message=\"only in %s: %s declared it unrecorded (--strict)\"/>",
                    side, side, other);
        else
            fprintf(f, "<skipped message=\"only in %s: %s declared it unrecorded\"/>", side, other);
        fputs("</testcase>\n", f);
    }
}

void fo_junit_report(FILE *f, const fo_report *r, const fo_render_ctx *o, const char *err)
{
    int tests = 0, failures = 0, errors = 0, skipped = 0;
    if (err) tests = errors = 1;
    else {
        tests = r->n + r->only_a.n + r->only_b.n;
        failures = r->nfail + (o->strict ? r->only_a.n + r->only_b.n - r->undeclared_a.n - r->undeclared_b.n : 0);
        errors = r->undeclared_a.n + r->undeclared_b.n;
        skipped = r->n_empty + (o->strict ? 0 : r->only_a.n + r->only_b.n - r->undeclared_a.n - r->undeclared_b.n);
        if (r->n_compared == 0) tests++, errors++; /* the "nothing compared" case */
    }
    fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", f);
    fprintf(f, "<testsuites name=\"flux-oracle\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"%d\">\n", tests,
            failures, errors, skipped);
    fputs(" <testsuite name=\"flux-oracle diff ", f);
    fo_xml_esc(f, o->files[0]);
    fputs(" vs ", f);
    fo_xml_esc(f, o->files[1]);
    fprintf(f, "\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"%d\" time=\"0\">\n", tests, failures, errors,
            skipped);
    fputs("  <properties>\n   <property name=\"candidate\" value=\"", f);
    fo_xml_esc(f, o->files[0]);
    fputs("\"/>\n   <property name=\"reference\" value=\"", f);
    fo_xml_esc(f, o->files[1]);
    fputs("\"/>\n", f);
    if (o->truth) {
        fputs("   <property name=\"truth\" value=\"", f);
        fo_xml_esc(f, o->truth);
        fputs("\"/>\n", f);
    }
    if (!err) {
        char cn[2048];
        fprintf(f, "   <property name=\"tolerance\" value=\"rtol %g, atol %g, mtol %g%s\"/>\n", r->tol.rtol, r->tol.atol,
                r->tol.mtol, r->with_truth ? ", arbiter --truth" : "");
        fprintf(f, "   <property name=\"verdict\" value=\"%s\"/>\n", fo_verdict_word(o->verdict));
        fputs("   <property name=\"summary\" value=\"", f);
        fo_xml_esc(f, fo_counts_str(r, cn, sizeof cn));
        fputs("\"/>\n", f);
    }
    fputs("  </properties>\n", f);
    if (err) {
        fputs("  <testcase classname=\"flux-oracle\" name=\"comparison\" time=\"0\"><error type=\"error\" message=\"", f);
        fo_xml_esc(f, err);
        fputs("\"/></testcase>\n </testsuite>\n</testsuites>\n", f);
        return;
    }
    if (r->n_compared == 0) {
        fputs("  <testcase classname=\"flux-oracle\" name=\"comparison\" time=\"0\"><error type=\"nothing-compared\" "
              "message=\"", f);
        fo_xml_esc(f, o->why);
        fputs("\"/></testcase>\n", f);
    }
    for (int i = 0; i < r->n; i++) {
        const fo_entry *en = &r->v[i];
        char co[96], sa[160], sb[160];
        fputs("  <testcase classname=\"", f);
        fo_xml_esc(f, junit_class(en->group));
        fputs("\" name=\"", f);
        fo_xml_esc(f, en->name);
        fputs("\" time=\"0\">", f);
        if (en->kind == FO_EMPTY) {
            fputs("<skipped message=\"", f);
            fo_xml_esc(f, en->msg);
            fputs("\"/>", f);
        } else if (en->kind != FO_PASS) {
            fprintf(f, "<failure type=\"%s\" message=\"", fo_kind_name(en->kind));
            fo_xml_esc(f, en->msg);
            fputs("\">", f);
            if (en->kind == FO_SHAPE) {
                fprintf(f, "shape A %s vs B %s\n", fs_shape_str(en->ndim_a, en->shape_a, sa, sizeof sa),
                        fs_shape_str(en->ndim_b, en->shape_b, sb, sizeof sb));
            } else {
                fprintf(f, "rel L2 %.6g\nmax|A-B|/max|B| %.6g\nmax|A-B| %.6g\ncosine %.9f\n", en->st.rel_l2,
                        fo_stats_max_rel(&en->st), en->st.max_abs, en->st.cosine);
                fprintf(f, "tolerance rtol %g, atol %g, mtol %g%s\n", r->tol.rtol, r->tol.atol, r->tol.mtol,
                        en->has_truth ? " (arbiter --truth)" : "");
                fprintf(f, "NaN A/B %lld/%lld, Inf A/B %lld/%lld\n", (long long)en->st.nan_a, (long long)en->st.nan_b,
                        (long long)en->st.inf_a, (long long)en->st.inf_b);
                if (en->at >= 0) {
                    fprintf(f, "at %s", fo_coords_str(en->ndim_a, en->coords, co, sizeof co));
                    if (en->where[0]) {
                        fputs(" (", f);
                        fo_xml_esc(f, en->where);
                        fputs(")", f);
                    }
                    fprintf(f, ": A %.9g vs B %.9g\n", en->val_a, en->val_b);
                }
            }
            fputs("</failure>", f);
        }
        fputs("</testcase>\n", f);
    }
    junit_only(f, &r->only_a, &r->undeclared_a, "A", "B", o->strict);
    junit_only(f, &r->only_b, &r->undeclared_b, "B", "A", o->strict);
    fputs(" </testsuite>\n</testsuites>\n", f);
}