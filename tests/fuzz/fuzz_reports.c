/* fuzz_reports.c — flux-oracle's report writers (oracle/fo_render.c: --junit, --html) on reports
 * whose names, messages, file names and verdict reason are the fuzzer's bytes.
 *
 * Input: a byte script. The first bytes pick the verdict, --strict, whether the comparison
 * failed (`err`), a truth file; then records separated by 0xFF, each a kind byte and text:
 * a compared entry (kind, step, name | message), a name only in A or B (declared or not), the
 * file names, the verdict's reason. The report is tallied (fo_report_tally) as the engine does.
 *
 * Invariant, on every input: both documents are well-formed XML (the HTML page is XHTML-clean:
 * the probe parsed it with minidom too) — valid UTF-8 of XML 1.0 characters only, every tag
 * closed in order, one root element, attributes quoted, `&` only in the five entities or a
 * character reference, no raw `<` in text or attribute values. Reliability probe 3, T9: names
 * with surrogates, U+FFFE, overlong forms or code points above U+10FFFF made both unreadable. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fo_render.h"
#include "fuzz_common.h"

/* ---- a small well-formedness checker (what xml.dom.minidom enforces, minus DTDs) ---- */

static int xml_char_ok(uint32_t c)
{
    return c == 0x9 || c == 0xa || c == 0xd || (c >= 0x20 && c <= 0xd7ff) || (c >= 0xe000 && c <= 0xfffd) ||
           (c >= 0x10000 && c <= 0x10ffff);
}

static int name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == ':' ||
           c == '-' || c == '.' || c >= 0x80;
}

/* `&...;` at s[i]: a predefined entity or a character reference. Returns its length or 0. */
static size_t entity(const char *s, size_t n, size_t i)
{
    static const char *const ents[] = {"&lt;", "&gt;", "&amp;", "&quot;", "&apos;"};
    for (size_t k = 0; k < 5; k++) {
        size_t l = strlen(ents[k]);
        if (i + l <= n && !memcmp(s + i, ents[k], l)) return l;
    }
    size_t j = i + 1;
    if (j < n && s[j] == '#') {
        j++;
        int hex = j < n && s[j] == 'x';
        if (hex) j++;
        size_t d0 = j;
        while (j < n && (hex ? strchr("0123456789abcdefABCDEF", s[j]) != NULL : (s[j] >= '0' && s[j] <= '9')) && s[j]) j++;
        if (j > d0 && j < n && s[j] == ';') return j + 1 - i;
    }
    return 0;
}

/* NULL when well-formed, else what is wrong (static text) and *at where. */
static const char *xml_wellformed(const char *s, size_t n, size_t *at)
{
    /* characters */
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t k = fo_utf8_char((const unsigned char *)s + i, n - i, &c);
        *at = i;
        if (!k) return "invalid UTF-8";
        if (!xml_char_ok(c)) return "a character XML 1.0 does not allow";
        i += k;
    }
    const char *stack[64];
    size_t slen[64];
    int depth = 0, roots = 0;
    for (size_t i = 0; i < n;) {
        *at = i;
        if (s[i] == '&') {
            size_t l = entity(s, n, i);
            if (!l) return "a bare & in text";
            i += l;
            continue;
        }
        if (s[i] != '<') {
            if (depth == 0 && !strchr(" \t\r\n", s[i])) return "text outside the root element";
            i++;
            continue;
        }
        if (i + 1 < n && s[i + 1] == '?') {
            const char *e = memmem(s + i, n - i, "?>", 2);
            if (!e) return "unterminated <?";
            i = (size_t)(e - s) + 2;
            continue;
        }
        if (i + 3 < n && !memcmp(s + i, "<!--", 4)) {
            const char *e = memmem(s + i + 4, n - i - 4, "-->", 3);
            if (!e) return "unterminated comment";
            i = (size_t)(e - s) + 3;
            continue;
        }
        if (i + 9 <= n && !memcmp(s + i, "<!DOCTYPE", 9)) {
            if (roots || depth) return "DOCTYPE after the root";
            const char *e = memchr(s + i, '>', n - i);
            if (!e) return "unterminated DOCTYPE";
            i = (size_t)(e - s) + 1;
            continue;
        }
        int closing = i + 1 < n && s[i + 1] == '/';
        size_t j = i + 1 + (size_t)closing, n0 = j;
        while (j < n && name_char((unsigned char)s[j])) j++;
        if (j == n0) return "a bare < in text";
        const char *name = s + n0;
        size_t nl = j - n0;
        if (closing) {
            while (j < n && strchr(" \t\r\n", s[j])) j++;
            if (j >= n || s[j] != '>') return "malformed end tag";
            if (depth == 0 || slen[depth - 1] != nl || memcmp(stack[depth - 1], name, nl)) return "end tag does not match";
            depth--;
            i = j + 1;
            continue;
        }
        /* attributes */
        int self = 0;
        for (;;) {
            size_t ws = j;
            while (j < n && strchr(" \t\r\n", s[j])) j++;
            if (j >= n) return "unterminated start tag";
            if (s[j] == '>') break;
            if (s[j] == '/' && j + 1 < n && s[j + 1] == '>') {
                self = 1, j++;
                break;
            }
            if (j == ws) return "attributes not separated by space";
            size_t a0 = j;
            while (j < n && name_char((unsigned char)s[j])) j++;
            if (j == a0 || j >= n || s[j] != '=') return "malformed attribute";
            j++;
            if (j >= n || (s[j] != '"' && s[j] != '\'')) return "unquoted attribute value";
            char q = s[j++];
            while (j < n && s[j] != q) {
                *at = j;
                if (s[j] == '<') return "< in an attribute value";
                if (s[j] == '&') {
                    size_t l = entity(s, n, j);
                    if (!l) return "a bare & in an attribute value";
                    j += l;
                } else j++;
            }
            if (j >= n) return "unterminated attribute value";
            j++;
        }
        if (depth == 0 && roots++) return "a second root element";
        if (!self) {
            if (depth == 64) return "nested too deep for this checker";
            stack[depth] = name, slen[depth] = nl, depth++;
        }
        i = j + 1;
    }
    *at = n;
    if (depth) return "unclosed element";
    if (!roots) return "no root element";
    return NULL;
}

static void check(const char *what, void (*fn)(FILE *, const fo_report *, const fo_render_ctx *, const char *),
                  const fo_report *r, const fo_render_ctx *ctx, const char *err)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) abort();
    fn(f, r, ctx, err);
    if (fclose(f) != 0) abort();
    size_t at = 0;
    const char *why = xml_wellformed(buf, len, &at);
    FUZZ_ASSERT(!why, "%s not well-formed: %s at byte %zu: ...%.60s", what, why, at, buf + (at > 20 ? at - 20 : 0));
    free(buf);
}

/* ---- the input as a report (read with fuzz_cursor / fuzz_text, fuzz_common.h) ---- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_cursor c = {data, size};
    fo_report r;
    const int flags = fuzz_byte(&c);
    fo_report_init(&r, (flags & 1) ? FO_MODE_CONSISTENCY : FO_MODE_DIFF);
    r.tol = (fo_tolerance){.rtol = 2e-4, .atol = 1e-6, .mtol = 5e-4};
    r.with_truth = (flags >> 1) & 1;
    char *files[3] = {strdup("A.h5"), strdup("B.h5"), NULL};
    char *why = strdup(""), *err = NULL, *note = NULL;
    static const char *const groups[] = {"/inputs", "/step_0000", "/step_0001", "/final"};
    for (int rec = 0; c.n && rec < 200; rec++) {
        int kind = fuzz_byte(&c), sub = fuzz_byte(&c);
        char *t = fuzz_text(&c, 0x01);
        switch (kind % 8) {
        case 0:
        case 1:
        case 2: { /* a compared entry: name, then its message after the first 0x01 */
            int g = sub % 4;
            char *msg = strchr(t, 0x01);
            if (msg) *msg++ = 0;
            fo_entry *en = fo_report_add(&r, g == 0 ? FO_STEP_INPUTS : g == 3 ? FO_STEP_FINAL : g - 1, groups[g], t);
            if (!en) abort();
            en->kind = (fo_kind)(sub / 4 % 6);
            en->ndim_a = en->ndim_b = 1;
            en->shape_a[0] = en->shape_b[0] = 4;
            snprintf(en->dtype_a, sizeof en->dtype_a, "float32");
            snprintf(en->dtype_b, sizeof en->dtype_b, (sub & 0x80) ? "float64" : "float32");
            en->st.rel_l2 = (sub & 0x40) ? 1e-3 * (sub & 7) : 0;
            en->st.max_abs = (double)(sub & 0x3f);
            en->at = (sub & 0x20) ? 2 : -1;
            en->coords[0] = 2;
            if (msg) snprintf(en->where, sizeof en->where, "%s", msg);
            if (en->kind != FO_PASS) en->msg = strdup(msg ? msg : t);
            if (sub & 0x10) en->ranks = (uint64_t)sub << 3, en->ranks_known = 1;
            break;
        }
        case 3:
        case 4: { /* a name on one side only, declared (excused) or not */
            fo_names *l = kind % 8 == 3 ? &r.only_a : &r.only_b;
            fo_names *u = kind % 8 == 3 ? &r.undeclared_a : &r.undeclared_b;
            const char *g = groups[sub % 4];
            if (fo_names_push(l, g, t) || ((sub & 4) && fo_names_push(u, g, t))) abort();
            break;
        }
        case 5: /* a file name */
            free(files[sub % 3]);
            files[sub % 3] = t;
            t = NULL;
            break;
        case 6: /* the verdict's reason, or the error of a comparison that could not run */
            if (sub & 1) free(err), err = t;
            else free(why), why = t;
            t = NULL;
            break;
        default: /* the partial note, or the tolerance */
            if (sub & 1) free(note), note = t, t = NULL;
            else r.excluded = sub;
        }
        free(t);
    }
    r.partial_note = note;
    fo_report_tally(&r);
    fo_render_ctx ctx = {.files = (const char *const *)files, .nfiles = 2, .truth = files[2],
                         .strict = (flags >> 2) & 1, .verdict = (fo_verdict)((flags >> 3) % 3), .why = why};
    check("JUnit XML", fo_junit_report, &r, &ctx, err);
    check("JUnit XML (no error)", fo_junit_report, &r, &ctx, NULL);
    check("HTML", fo_html_report, &r, &ctx, NULL);
    fo_report_free(&r);
    for (int i = 0; i < 3; i++) free(files[i]);
    free(why), free(err);
    return 0;
}
