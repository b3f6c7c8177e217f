/* fs_plan.h — tensor-parallel plans as data.
 *
 * A plan is a list of rules "<module glob> <style> [args]" in the vocabulary diffusers' _tp_plan
 * and torchtitan use; the first rule whose glob (fnmatch) matches a Linear's module path decides
 * how that Linear is split over the TP group; modules no rule matches are replicated.
 *   colwise                 weight rows (outputs) split: rank t computes columns [t·N/T, (t+1)·N/T)
 *   rowwise                 weight columns (inputs) split contiguously; partial outputs all-reduced,
 *                           bias added once, after the reduction
 *   packed_rowwise A,B      the input is a per-rank concatenation [a_t | b_t] of two column-split
 *                           tensors of global widths A and B (single-block proj_out: D,4D), so rank
 *                           t's weight columns are [t·A/T, (t+1)·A/T) and A + [t·B/T, (t+1)·B/T)
 *   replicate               every rank computes the whole Linear
 * Widths may be integers or multiples of D (hidden size): "D", "4D".
 * The built-in FLUX plan is fs_plan_default_text(); `flux-sim --print-plan` prints it and
 * `--plan FILE` runs a user's plan (a plan with plain rowwise on single-block proj_out is the
 * seed's TP-1 bug, and --check says so). */
#ifndef FS_PLAN_H
#define FS_PLAN_H

#include "fs_config.h"

typedef enum fs_tp_style { FS_TP_REPLICATE = 0, FS_TP_COLWISE, FS_TP_ROWWISE, FS_TP_PACKED_ROWWISE } fs_tp_style;

typedef struct fs_plan_rule {
    char glob[160];
    fs_tp_style style;
    char split[2][16]; /* packed_rowwise widths as written ("D", "4D", "3072") */
    int line;
} fs_plan_rule;

typedef struct fs_plan {
    int n;
    fs_plan_rule *rules;
    char source[256]; /* "built-in Megatron plan" or the file path */
} fs_plan;

const char *fs_plan_default_text(void);
int fs_plan_parse(fs_plan *p, const char *text, const char *origin, fs_err *e);
int fs_plan_load(fs_plan *p, const char *path, fs_err *e);
void fs_plan_free(fs_plan *p);
/* Style of `module`; for packed_rowwise, widths[0..1] receive the two input widths resolved
 * against the config. A rule's index (or -1) in *rule. */
fs_tp_style fs_plan_lookup(const fs_plan *p, const fs_config *c, const char *module, int64_t widths[2], int *rule);
const char *fs_tp_style_name(fs_tp_style s);

#endif
