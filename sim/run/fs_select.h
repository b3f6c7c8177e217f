/* fs_select.h — what a run records: --dump-modules GLOB[,GLOB] and --dump-steps LIST.
 *
 * A long run of the real model cannot keep every module of every step (FLUX.1-dev at 1024² is
 * ~70 GB a step), and --check need not compare them all. One selection applies to every
 * consumer of a run's records — the dump, the per-rank dumps, and both sides of --check (the
 * in-job single-rank reference and its matched truth record the same selection) — by wrapping
 * a recorder and its step hooks: a step outside the list is never begun, a module the globs do
 * not match is never handed on. Every step recorded keeps latents_in and latents_out (the
 * step's input and output, one image-sized tensor each), so a narrowed dump still says where
 * the sampler was. The dump declares the selection (docs/dump-format.md): root attribute
 * `recorded_steps` ("all" or the list) and each step's `recorded_modules` ("all" or
 * "match:G1,G2"), so flux-oracle tells what was left out on purpose from what is missing.
 *
 * Decisions depend only on the step number and the module name, which every rank sees in the
 * same order: with a parallel layout every rank skips the same records (collectives stay
 * matched). */
#ifndef FS_SELECT_H
#define FS_SELECT_H

#include "fo_steps.h"
#include "fs_record.h"
#include "fs_sampler.h"

typedef struct fs_select {
    fo_globs modules; /* n == 0: every module */
    fo_steps steps;   /* all: every step */
} fs_select;

/* modules / steps NULL: everything. Errors name the option: "--dump-modules: no glob in ','". */
int fs_select_parse(fs_select *s, const char *modules, const char *steps, fs_err *e);
void fs_select_free(fs_select *s);
int fs_select_all(const fs_select *s); /* 1: records everything */
int fs_select_step(const fs_select *s, int step);
int fs_select_module(const fs_select *s, const char *name);
/* The declarations the dump carries: "all" or "0,2-3"; "all" or "match:G1,G2". */
const char *fs_select_steps_decl(const fs_select *s, char *buf, size_t n);
const char *fs_select_modules_decl(const fs_select *s, char *buf, size_t n);

/* A recorder + step hooks that pass on only the selected records to `rec` / `hooks`. The filter
 * keeps the current step; it must outlive the run it records. */
typedef struct fs_select_filter {
    const fs_select *sel;
    fs_recorder rec;
    fs_step_hooks hooks;
    int step;
    int64_t matched; /* records passed on other than latents_in/out */
} fs_select_filter;
/* The filter's end of step fails (FS_E_INPUT, naming the globs) when the globs matched no module
 * in the first step recorded: a selection that selects nothing is a mistake, not an empty dump. */
void fs_select_filter_init(fs_select_filter *f, const fs_select *sel, fs_recorder rec, fs_step_hooks hooks);
fs_recorder fs_select_filter_recorder(fs_select_filter *f); /* fn NULL when rec.fn is NULL */
fs_step_hooks fs_select_filter_hooks(fs_select_filter *f);

#endif
