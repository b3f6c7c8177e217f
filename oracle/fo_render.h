/* fo_render.h — flux-oracle's report files, HTML (with an SVG plot) and JUnit XML, and the
 * formatters the CLI's terminal output shares with them.
 *
 * In the library (not in main_flux_oracle.c) so the fuzz harness tests/fuzz/fuzz_reports.c can
 * check on any report that what they write is well-formed: every name and message from a file
 * goes through fo_xml_esc, which passes on only XML 1.0 characters (invalid UTF-8 — overlong
 * forms, surrogates, code points above U+10FFFF —, U+FFFE/U+FFFF and control characters become
 * visible \xHH text) and escapes markup. */
#ifndef FO_RENDER_H
#define FO_RENDER_H

#include <stdint.h>
#include <stdio.h>

#include "fo_report.h"

/* What the CLI decided and the reports show besides the report itself. */
typedef struct fo_render_ctx {
    const char *const *files; /* the dumps compared: A, B (diff) or the rank files */
    int nfiles;
    const char *truth;  /* --truth file or NULL */
    int strict;         /* --strict */
    fo_verdict verdict; /* fo_report_verdict's */
    const char *why;    /* its reason ("" unless ERROR) */
} fo_render_ctx;

/* The HTML page (diff and consistency). `err` is unused: no page is written for a comparison
 * that could not run. */
void fo_html_report(FILE *f, const fo_report *r, const fo_render_ctx *o, const char *err);
/* JUnit XML (diff): one testcase per compared tensor; with `err` (the comparison could not run)
 * one <error> carrying it. */
void fo_junit_report(FILE *f, const fo_report *r, const fo_render_ctx *o, const char *err);

/* Text for XML and HTML (attribute values too), as described above. NULL writes nothing. */
void fo_xml_esc(FILE *f, const char *s);
/* Length (1-4) of the well-formed UTF-8 character at s (n bytes available) and its code point;
 * 0 for an invalid sequence (overlong, surrogate, > U+10FFFF, cut, stray continuation byte). */
size_t fo_utf8_char(const unsigned char *s, size_t n, uint32_t *cp);

/* "in", "final" or the step number */
const char *fo_step_label(int step, char *buf, size_t n);
/* "step 2 NAME", "/inputs/NAME": the name printable and shortened (FO_SHOW), for a terminal line */
const char *fo_entry_label(int step, const char *group, const char *name, char *buf, size_t n);
const char *fo_ranks_str(uint64_t m, char *buf, size_t n); /* "0,3" */
const char *fo_dtype_short(const char *d);                  /* "f32" for float32, ... */
/* "276 tensors compared; 0 only in A, 0 only in B" (+ empty, excluded, undeclared, partial) */
const char *fo_counts_str(const fo_report *r, char *buf, size_t n);
const char *fo_verdict_word(fo_verdict v); /* "PASS", "DIVERGE", "ERROR" */

#endif
