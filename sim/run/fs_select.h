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
#include "fs_config.h"
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

/* ---- The names a run records, from the config alone ----
 * Every record of a step, in the order a run of `cfg` records them (fs_sample: latents_in, the
 * forward's modules as fs_layer_record names them, latents_out), built without computing
 * anything (with true CFG, the negative call's renamed records too). Per model family, told
 * apart by the config's diffusers class name (`_class_name` of fs_config_to_json): FLUX.1
 * (FluxTransformer2DModel) and FLUX.2 (Flux2Transformer2DModel) have a list; for a family
 * without one *known is 0 and the list is empty. tests/test_select.c checks the lists against
 * the names real runs record, for every preset of both families, guidance-free configs and
 * configs without one kind of block, so the two cannot drift apart silently. */
typedef struct fs_names {
    char **v;
    int n, cap;
} fs_names;
/* flags: FS_NAMES_TRUE_CFG: the run makes a second, negative-prompt call per step (true CFG),
 * whose records are renamed name@k as fs_sampler.c does; FS_NAMES_REF: FLUX.2 reference images
 * (the KV cache): step 0 also records the reference time embedding's calls (time_guidance_embed@1,
 * double_stream_modulation_img@1, single_stream_modulation@1 and their children), the list is
 * step 0's (a superset of the later steps'). */
enum { FS_NAMES_TRUE_CFG = 1, FS_NAMES_REF = 2 };
static inline int fs_names_flags(int true_cfg, int ref) { return (true_cfg ? FS_NAMES_TRUE_CFG : 0) | (ref ? FS_NAMES_REF : 0); }
int fs_record_names(const fs_config *cfg, int flags, fs_names *out, int *known, fs_err *e);
void fs_names_free(fs_names *l); /* leaves {0} */
/* Up-front refusal of --dump-modules globs that match no module `cfg` records (FS_E_INPUT, one
 * line naming the globs), before any input, weight or dump is made. FS_OK when there are no globs
 * or the family has no list (then the filter's end of the first recorded step still refuses). */
int fs_select_check_model(const fs_select *s, const fs_config *cfg, int flags, fs_err *e);

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
 * in the first step recorded: a selection that selects nothing is a mistake, not an empty dump.
 * For FLUX.1 and FLUX.2 fs_select_check_model refuses it before the run; this is the backstop for
 * a family without a names list. */
void fs_select_filter_init(fs_select_filter *f, const fs_select *sel, fs_recorder rec, fs_step_hooks hooks);
fs_recorder fs_select_filter_recorder(fs_select_filter *f); /* fn NULL when rec.fn is NULL */
fs_step_hooks fs_select_filter_hooks(fs_select_filter *f);

#endif
