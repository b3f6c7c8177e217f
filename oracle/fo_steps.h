/* fo_steps.h — selections written as text: sets of step numbers ("all", or "0,3" / "0,2-5")
 * and lists of module globs ("transformer_blocks.*,proj_out").
 *
 * One parser for each, for every place a selection is written down: a dump's `recorded_steps`
 * root attribute and a step's `recorded_modules` (what a producer deliberately recorded;
 * docs/dump-format.md), flux-oracle's `--steps` / `--modules` (what the user wants compared) and
 * flux-sim's `--dump-steps` / `--dump-modules` (what the user wants recorded). */
#ifndef FO_STEPS_H
#define FO_STEPS_H

#include <stddef.h>

#define FO_STEPS_MAX 1000000000 /* step numbers are 0..999999999 (step_<at most 9 digits>) */

typedef struct fo_steps {
    int all; /* 1: every step ("all"); v is empty */
    int n;   /* else the steps, ascending, no duplicates */
    int *v;
} fo_steps;

/* Parses `text`: "all", or comma-separated items, each a step number N or a range A-B (A <= B),
 * spaces around items allowed; duplicates and overlapping ranges merge. An empty list, a
 * negative or non-numeric item, or a number past FO_STEPS_MAX is an error: returns -1 with the
 * reason in why (no file name: the caller knows where the text came from), 0 on success. *out
 * is overwritten (initialise with {0}; free with fo_steps_free). Ranges are capped at 1e6 steps
 * in all, so a hostile "0-999999999" cannot allocate gigabytes. */
int fo_steps_parse(const char *text, fo_steps *out, char *why, size_t n);
int fo_steps_has(const fo_steps *s, int step); /* 1 when step is in the set */
void fo_steps_free(fo_steps *s);               /* safe on NULL; leaves {0} */
/* "0,2-5" (or "all") into buf, cut to fit n. */
const char *fo_steps_str(const fo_steps *s, char *buf, size_t n);

/* Module globs: fnmatch(3) patterns (no flags: '*' crosses dots) separated by commas, matched
 * against dataset names of a step group ("single_transformer_blocks.37.attn.to_q"). */
#define FO_GLOBS_MAX 64
typedef struct fo_globs {
    int n;   /* 0: match everything */
    char **v;
} fo_globs;
/* Parses "G1,G2": empty items are skipped; no glob at all, more than FO_GLOBS_MAX, or a glob
 * longer than 255 characters is an error (-1, reason in why). */
int fo_globs_parse(const char *text, fo_globs *out, char *why, size_t n);
int fo_globs_match(const fo_globs *g, const char *name); /* 1 when some glob matches (or n == 0) */
void fo_globs_free(fo_globs *g);
/* "G1,G2" into buf, cut to fit n. */
const char *fo_globs_str(const fo_globs *g, char *buf, size_t n);

#endif
