/* fo_steps.h — sets of step numbers written as text: "all", or "0,3" / "0,2-5".
 *
 * One parser for the two places a list of steps is written down: a dump's `recorded_steps`
 * root attribute (which steps a producer deliberately recorded; docs/dump-format.md) and
 * flux-oracle's `--steps` option (which steps the user wants compared). */
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

#endif
