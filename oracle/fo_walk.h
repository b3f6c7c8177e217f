/* fo_walk.h — the execution-order walk over dumps that diff, consistency and stats share:
 * /inputs, then the step groups by number, each in its `order` attribute's order, then /final;
 * and which names a producer declared it did not record.
 *
 * Used by the engine's files (fo_diff.c, fo_consistency.c, fo_stats.c); not needed by callers of
 * fo_diff.h. */
#ifndef FO_WALK_H
#define FO_WALK_H

#include "fo_dump.h"
#include "fo_steps.h"

typedef struct fo_walk_group {
    int step;        /* step number, or FO_STEP_INPUTS / FO_STEP_FINAL (fo_report.h) */
    char group[40];  /* "/inputs", "/step_0002", "/final" */
} fo_walk_group;

/* /inputs, every step number either file has (ascending; b may be NULL), /final. *out is
 * malloc'ed. -1 when out of memory. */
int fo_walk_groups(fo_file *a, fo_file *b, fo_walk_group **out, int *n);

/* The datasets of `wg` in `f`, in execution order, into out (freed and refilled); gpath gets the
 * group's path in f (step groups are looked up by number: step_0002 and step_2 are one step).
 * *present = 0 and an empty list when f lacks the group. A name the `order` lists but the group
 * does not hold is dropped here (the other file will see it as missing); a dataset the group
 * holds but `order` does not list is appended after the listed ones, so whatever a file holds is
 * compared, reported as on one side only, or the walk fails (a malformed `order` is an error,
 * never an empty step). */
int fo_walk_names(fo_file *f, const fo_walk_group *wg, char *gpath, size_t gn, fo_names *out, int *present, fs_err *e);

/* Membership tests on a name list: a sorted copy of the pointers (the strings stay owned by
 * the list, which must outlive the set). */
typedef struct fo_name_set {
    int n;
    char **v;
} fo_name_set;
int fo_name_set_make(const fo_names *l, fo_name_set *s); /* -1 when out of memory */
int fo_name_set_has(const fo_name_set *s, const char *name);
void fo_name_set_free(fo_name_set *s);

/* Did a step's `recorded_modules` declaration promise `name`? "all" (or no declaration, NULL)
 * promises every name; "depth<=N" promises the names of at most N dot-separated components,
 * a `#k` / `@k` suffix not counted (transformer_blocks.0#1 has depth 2,
 * time_text_embed.timestep_embedder.linear_1 depth 3), as the reference dumps use it;
 * "match:G1,G2" (flux-sim --dump-modules) promises latents_in, latents_out and the names one of
 * the fnmatch globs matches. Returns 1
 * (promised: its absence is unexplained), 0 (declared not recorded), or -1 (a declaration this
 * reader does not understand: treated as promising everything, so nothing is excused by it). */
int fo_modules_promise(const char *decl, const char *name);

/* What one file declares it did not record, for deciding whether a name it lacks is expected. */
typedef struct fo_decl {
    fo_steps steps;  /* recorded_steps (all when absent) */
    int partial_ok;  /* the file is partial and the user said --allow-partial: whatever it lacks is
                        explained by that */
} fo_decl;
/* Reads recorded_steps of f. Error: not a string or not a step list. */
int fo_decl_read(fo_file *f, int partial_ok, fo_decl *d, fs_err *e);
void fo_decl_free(fo_decl *d);
/* 1 when a file with declarations d, whose group for wg is present or not and (when present)
 * carries recorded_modules = modules_decl (NULL: none), declared it would not hold `name`: the
 * step is outside recorded_steps, recorded_modules excludes the name, or partial_ok. /inputs and
 * /final are never excused. */
int fo_decl_excuses(const fo_decl *d, const fo_walk_group *wg, int present, const char *modules_decl,
                    const char *name);

#endif
