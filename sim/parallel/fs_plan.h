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
 *   packed_colwise W1,..,Wn the output is n packed blocks (2 to 5) of widths W1..Wn (FLUX.2's
 *                           SwiGLU linear_in: F,F = [gate | up]; to_qkv_mlp_proj: D,D,D,F,F), each
 *                           split colwise on its own, so rank t computes rows o_k + [t·Wk/T,
 *                           (t+1)·Wk/T) of every block k and its output is [blk1_t | .. | blkn_t]
 *                           (diffusers' PackedColwiseParallel)
 *   replicate               every rank computes the whole Linear
 * Widths may be integers or multiples of D (hidden size) or F (the config's MLP width:
 * fs_config_mlp_hidden): "D", "4D", "F".
 * The built-in plans are fs_plan_default_text_for(cfg) (FLUX.1's is fs_plan_default_text(), FLUX.2's
 * follows diffusers' Flux2Transformer2DModel._tp_plan); `flux-sim --print-plan` prints it and
 * `--plan FILE` runs a user's plan (a plan with plain rowwise on single-block proj_out is the
 * seed's TP-1 bug, and --check says so). */
#ifndef FS_PLAN_H
#define FS_PLAN_H

#include "fs_config.h"
#include "fs_inject.h"

typedef enum fs_tp_style {
    FS_TP_REPLICATE = 0,
    FS_TP_COLWISE,
    FS_TP_ROWWISE,
    FS_TP_PACKED_ROWWISE,
    FS_TP_PACKED_COLWISE
} fs_tp_style;

#define FS_TP_MAX_BLOCKS 5 /* packed widths: to_qkv_mlp_proj's q, k, v, gate, up */

typedef struct fs_plan_rule {
    char glob[160];
    fs_tp_style style;
    int nsplit;                         /* packed widths given (2 for packed_rowwise) */
    char split[FS_TP_MAX_BLOCKS][16];   /* packed widths as written ("D", "4D", "F", "3072") */
    int line;
} fs_plan_rule;

typedef struct fs_plan {
    int n;
    fs_plan_rule *rules;
    char source[256]; /* "built-in Megatron plan" or the file path */
} fs_plan;

const char *fs_plan_default_text(void);               /* FLUX.1's */
const char *fs_plan_default_text_for(const fs_config *c); /* the config's family's */
int fs_plan_parse(fs_plan *p, const char *text, const char *origin, fs_err *e);
int fs_plan_load(fs_plan *p, const char *path, fs_err *e);
void fs_plan_free(fs_plan *p);
/* Style of `module`; for the packed styles, widths[0..n-1] receive the block widths resolved
 * against the config and *n their count (both may be NULL). A rule's index (or -1) in *rule. */
fs_tp_style fs_plan_lookup(const fs_plan *p, const fs_config *c, const char *module, int64_t widths[FS_TP_MAX_BLOCKS],
                           int *n, int *rule);
const char *fs_tp_style_name(fs_tp_style s);

/* ---- The TP split of one Linear: the ONE place the slicing arithmetic lives ----
 *
 * What TP rank t of T holds and computes of Linear `module` (weight [N, K], bias [N]) under the
 * plan. Weights (fs_weights_shard_of), fs_linear() in fs_layers.c, --check's sharding map and the
 * dump's `sharding` attribute all take their ranges from here. For the built-in plan and
 * FLUX.1-dev (D = 3072, T = 4, rank t):
 *   attn.to_q/to_k/to_v, add_*_proj, ff*.net.0.proj, proj_mlp   colwise   rows [t·N/4, (t+1)·N/4)
 *                                    (q/k/v: heads [6t, 6t+6) of 24, head-major columns)
 *   attn.to_out.0, to_add_out, ff*.net.2                        rowwise   cols [t·K/4, (t+1)·K/4)
 *   single_transformer_blocks.*.proj_out                        packed_rowwise D,4D: cols
 *                                    [768t, 768t+768) ∪ 3072 + [3072t, 3072t+3072) — the input is
 *                                    this rank's cat([attn_shard, mlp_shard])
 *   everything else (AdaLN linears, embedders, norm_out, proj_out)  replicate
 * Uneven widths are refused (FS_E_INPUT naming the module): N % T for colwise, K % T for
 * rowwise, A % T or B % T for packed_rowwise. */
typedef struct fs_tp_split {
    fs_tp_style style;
    int64_t N, K;         /* global output / input features */
    int64_t r0, r1;       /* weight rows = output features this rank computes (nr == 1) */
    int nr;               /* row intervals: 1, or the blocks of packed_colwise, whose rows are */
    int64_t rr[FS_TP_MAX_BLOCKS][2]; /* rr[0..nr-1] in this order (r0, r1 = rr[0][0], rr[nr-1][1]) */
    int nc;               /* input column intervals this rank holds (2 for packed_rowwise) */
    int64_t c[2][2];
    int bias_sharded;     /* colwise: the bias follows the rows; else the whole bias */
    int reduce;           /* partial sums all-reduced over the TP group, then the bias, once */
} fs_tp_split;
/* K = 0 (a bias on its own): rows only. `inj` (NULL: none) lets --inject re-create the wrong
 * splits people write, applied here after the correct split in one visible hook:
 * proj-out-contiguous (packed_rowwise cut as contiguous columns), adaln-sharded (AdaLN
 * modulation linears split row-parallel on their replicated input, never all-reduced),
 * missing-allreduce (row-parallel partials used as they are), rowwise-bias-every-rank (the bias
 * added on every rank before the all-reduce); fused-qkv-contiguous reports here, on the q/k/v
 * Linears it cuts (the cut itself is fs_weights_shard's). */
int fs_tp_split_of(const fs_plan *p, const fs_config *c, const char *module, int64_t N, int64_t K, int T, int t,
                   const fs_inject *inj, fs_tp_split *s, fs_err *e);
/* fs_tp_split_of, and in *wrong what those injections change in the Linear's forward beyond its
 * split (all zero without them): the injection's own state, which the production split does
 * not carry. For the code that runs the forward (fs_linear() in fs_layers.c). */
int fs_tp_split_of_injected(const fs_plan *p, const fs_config *c, const char *module, int64_t N, int64_t K, int T,
                            int t, const fs_inject *inj, fs_tp_split *s, fs_inject_linear *wrong, fs_err *e);
/* Output features (weight rows) this rank computes: the sum of the row intervals. */
static inline int64_t fs_tp_split_rows(const fs_tp_split *s)
{
    if (s->nr <= 1) return s->r1 - s->r0;
    int64_t n = 0;
    for (int i = 0; i < s->nr; i++) n += s->rr[i][1] - s->rr[i][0];
    return n;
}
/* Input features this rank's piece of the weight holds (sum of the column intervals). */
static inline int64_t fs_tp_split_cols(const fs_tp_split *s)
{
    int64_t n = 0;
    for (int i = 0; i < s->nc; i++) n += s->c[i][1] - s->c[i][0];
    return n;
}

#endif
