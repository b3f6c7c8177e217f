/* fs_weights_load.c — fs_weights_load: safetensors (diffusers or BFL names) → fs_weights.
 *
 * Every parameter of fs_config_params(cfg) gets a "plan": which source tensor holds it, which
 * rows of that tensor, and where they go. Diffusers checkpoints are one plan per tensor, whole.
 * BFL checkpoints fuse some parameters (qkv, linear1) and store norm_out's halves in the other
 * order, so a plan is a row slice of a bigger tensor, or two slices swapped. A single contiguous
 * slice of an F32 source in an F32 run is used in place (a view into the mapping); anything
 * else is decoded into an owned tensor. */
#include "fs_backend.h"
#include "fs_pipeline.h"
#include "fs_safetensors.h"
#include "fs_weights_load.h"

#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BFL_PREFIX "model.diffusion_model."

typedef struct piece {
    int64_t src_r0, nrows, dst_r0; /* rows along the first dimension */
} piece;

typedef struct plan {
    char src[256];     /* full source tensor name, prefix included */
    int64_t src_rows;  /* first dimension the source must have (the fused size for BFL) */
    piece p[2];
    int np;
} plan;

enum fuse { F_NONE, F_QKV, F_LINEAR1, F_SWAP };

/* diffusers name stem → BFL stem. `slot` selects rows of a fused tensor (q/k/v = 0/1/2; the
 * MLP part of linear1 = 3). */
typedef struct rule {
    const char *diff, *bfl;
    enum fuse fuse;
    int slot;
} rule;

static const rule top_rules[] = {
    {"x_embedder", "img_in", F_NONE, 0},
    {"context_embedder", "txt_in", F_NONE, 0},
    {"time_text_embed.timestep_embedder.linear_1", "time_in.in_layer", F_NONE, 0},
    {"time_text_embed.timestep_embedder.linear_2", "time_in.out_layer", F_NONE, 0},
    {"time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer", F_NONE, 0},
    {"time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer", F_NONE, 0},
    {"time_text_embed.text_embedder.linear_1", "vector_in.in_layer", F_NONE, 0},
    {"time_text_embed.text_embedder.linear_2", "vector_in.out_layer", F_NONE, 0},
    /* BFL stores shift‖scale, diffusers' AdaLayerNormContinuous chunks scale‖shift. */
    {"norm_out.linear", "final_layer.adaLN_modulation.1", F_SWAP, 0},
    {"proj_out", "final_layer.linear", F_NONE, 0},
};

static const rule double_rules[] = {
    {"norm1.linear", "img_mod.lin", F_NONE, 0},
    {"norm1_context.linear", "txt_mod.lin", F_NONE, 0},
    {"attn.to_q", "img_attn.qkv", F_QKV, 0},
    {"attn.to_k", "img_attn.qkv", F_QKV, 1},
    {"attn.to_v", "img_attn.qkv", F_QKV, 2},
    {"attn.add_q_proj", "txt_attn.qkv", F_QKV, 0},
    {"attn.add_k_proj", "txt_attn.qkv", F_QKV, 1},
    {"attn.add_v_proj", "txt_attn.qkv", F_QKV, 2},
    {"attn.norm_q", "img_attn.norm.query_norm", F_NONE, 0},
    {"attn.norm_k", "img_attn.norm.key_norm", F_NONE, 0},
    {"attn.norm_added_q", "txt_attn.norm.query_norm", F_NONE, 0},
    {"attn.norm_added_k", "txt_attn.norm.key_norm", F_NONE, 0},
    {"attn.to_out.0", "img_attn.proj", F_NONE, 0},
    {"attn.to_add_out", "txt_attn.proj", F_NONE, 0},
    {"ff.net.0.proj", "img_mlp.0", F_NONE, 0},
    {"ff.net.2", "img_mlp.2", F_NONE, 0},
    {"ff_context.net.0.proj", "txt_mlp.0", F_NONE, 0},
    {"ff_context.net.2", "txt_mlp.2", F_NONE, 0},
};

static const rule single_rules[] = {
    {"norm.linear", "modulation.lin", F_NONE, 0},
    {"attn.to_q", "linear1", F_LINEAR1, 0},
    {"attn.to_k", "linear1", F_LINEAR1, 1},
    {"attn.to_v", "linear1", F_LINEAR1, 2},
    {"proj_mlp", "linear1", F_LINEAR1, 3},
    {"attn.norm_q", "norm.query_norm", F_NONE, 0},
    {"attn.norm_k", "norm.key_norm", F_NONE, 0},
    {"proj_out", "linear2", F_NONE, 0},
};

/* FLUX.2's BFL single file (flux2-dev.safetensors) as diffusers' scripts/convert_flux2_to_diffusers.py
 * maps it: the same fused qkv per stream as FLUX.1; the shared modulations keep their names
 * (".lin"); the single block's linear1/linear2 are already diffusers' fused to_qkv_mlp_proj and
 * to_out (no split); no biases, no pooled vector_in. */
static const rule top_rules2[] = {
    {"x_embedder", "img_in", F_NONE, 0},
    {"context_embedder", "txt_in", F_NONE, 0},
    {"time_guidance_embed.timestep_embedder.linear_1", "time_in.in_layer", F_NONE, 0},
    {"time_guidance_embed.timestep_embedder.linear_2", "time_in.out_layer", F_NONE, 0},
    {"time_guidance_embed.guidance_embedder.linear_1", "guidance_in.in_layer", F_NONE, 0},
    {"time_guidance_embed.guidance_embedder.linear_2", "guidance_in.out_layer", F_NONE, 0},
    {"double_stream_modulation_img.linear", "double_stream_modulation_img.lin", F_NONE, 0},
    {"double_stream_modulation_txt.linear", "double_stream_modulation_txt.lin", F_NONE, 0},
    {"single_stream_modulation.linear", "single_stream_modulation.lin", F_NONE, 0},
    {"norm_out.linear", "final_layer.adaLN_modulation.1", F_SWAP, 0}, /* shift‖scale → scale‖shift */
    {"proj_out", "final_layer.linear", F_NONE, 0},
};

static const rule double_rules2[] = {
    {"attn.to_q", "img_attn.qkv", F_QKV, 0},
    {"attn.to_k", "img_attn.qkv", F_QKV, 1},
    {"attn.to_v", "img_attn.qkv", F_QKV, 2},
    {"attn.add_q_proj", "txt_attn.qkv", F_QKV, 0},
    {"attn.add_k_proj", "txt_attn.qkv", F_QKV, 1},
    {"attn.add_v_proj", "txt_attn.qkv", F_QKV, 2},
    {"attn.norm_q", "img_attn.norm.query_norm", F_NONE, 0},
    {"attn.norm_k", "img_attn.norm.key_norm", F_NONE, 0},
    {"attn.norm_added_q", "txt_attn.norm.query_norm", F_NONE, 0},
    {"attn.norm_added_k", "txt_attn.norm.key_norm", F_NONE, 0},
    {"attn.to_out.0", "img_attn.proj", F_NONE, 0},
    {"attn.to_add_out", "txt_attn.proj", F_NONE, 0},
    {"ff.linear_in", "img_mlp.0", F_NONE, 0},
    {"ff.linear_out", "img_mlp.2", F_NONE, 0},
    {"ff_context.linear_in", "txt_mlp.0", F_NONE, 0},
    {"ff_context.linear_out", "txt_mlp.2", F_NONE, 0},
};

static const rule single_rules2[] = {
    {"attn.to_qkv_mlp_proj", "linear1", F_NONE, 0},
    {"attn.norm_q", "norm.query_norm", F_NONE, 0},
    {"attn.norm_k", "norm.key_norm", F_NONE, 0},
    {"attn.to_out", "linear2", F_NONE, 0},
};

static const rule *find_rule(const rule *r, size_t n, const char *stem)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(r[i].diff, stem)) return &r[i];
    return NULL;
}

static void plan_whole(plan *pl, const fs_param_desc *d)
{
    pl->src_rows = d->shape[0];
    pl->p[0] = (piece){0, d->shape[0], 0};
    pl->np = 1;
}

/* The BFL source of diffusers parameter d. Returns 0, or -1 for a name no rule covers (a
 * parameter list and a rule table out of step: flux-sim's bug, not the file's). */
static int plan_bfl(plan *pl, const fs_param_desc *d, const fs_config *c, const char *prefix)
{
    const int64_t D = fs_config_hidden(c), F = fs_config_mlp_hidden(c);
    const char *dot = strrchr(d->name, '.');
    if (!dot) return -1;
    const char *leaf = dot + 1; /* "weight" / "bias" */
    char stem[128];
    snprintf(stem, sizeof stem, "%.*s", (int)(dot - d->name), d->name);

    const rule *r = NULL;
    char block[64] = "";
    int i, used = 0;
    const int f2 = c->family == FS_FLUX2;
    if (sscanf(stem, "transformer_blocks.%d.%n", &i, &used) == 1 && used) {
        r = f2 ? find_rule(double_rules2, FS_ARRAY_LEN(double_rules2), stem + used)
               : find_rule(double_rules, FS_ARRAY_LEN(double_rules), stem + used);
        snprintf(block, sizeof block, "double_blocks.%d.", i);
    } else if (sscanf(stem, "single_transformer_blocks.%d.%n", &i, &used) == 1 && used) {
        r = f2 ? find_rule(single_rules2, FS_ARRAY_LEN(single_rules2), stem + used)
               : find_rule(single_rules, FS_ARRAY_LEN(single_rules), stem + used);
        snprintf(block, sizeof block, "single_blocks.%d.", i);
    } else {
        r = f2 ? find_rule(top_rules2, FS_ARRAY_LEN(top_rules2), stem) : find_rule(top_rules, FS_ARRAY_LEN(top_rules), stem);
    }
    if (!r) return -1;
    /* QK-norm weights are RMSNorm.scale in BFL's modules. */
    if (d->kind == FS_PARAM_RMS_W) leaf = "scale";
    snprintf(pl->src, sizeof pl->src, "%s%s%s.%s", prefix, block, r->bfl, leaf);

    switch (r->fuse) {
    case F_NONE: plan_whole(pl, d); break;
    case F_QKV:
        pl->src_rows = 3 * D;
        pl->p[0] = (piece){r->slot * D, D, 0};
        pl->np = 1;
        break;
    case F_LINEAR1:
        pl->src_rows = 3 * D + F;
        pl->p[0] = r->slot < 3 ? (piece){r->slot * D, D, 0} : (piece){3 * D, F, 0};
        pl->np = 1;
        break;
    case F_SWAP:
        pl->src_rows = 2 * D;
        pl->p[0] = (piece){D, D, 0}; /* scale: BFL's second half first */
        pl->p[1] = (piece){0, D, D}; /* shift */
        pl->np = 2;
        break;
    }
    int64_t rows = 0;
    for (int k = 0; k < pl->np; k++) rows += pl->p[k].nrows;
    return rows == d->shape[0] ? 0 : -1;
}

int fs_weights_bfl_source(const fs_param_desc *d, const fs_config *c, char *name, size_t name_len, int64_t *rows,
                          fs_bfl_piece p[2], int *np)
{
    plan pl = {0};
    if (plan_bfl(&pl, d, c, "")) return -1;
    snprintf(name, name_len, "%s", pl.src);
    *rows = pl.src_rows;
    *np = pl.np;
    for (int k = 0; k < pl.np; k++) p[k] = (fs_bfl_piece){pl.p[k].src_r0, pl.p[k].nrows, pl.p[k].dst_r0};
    return 0;
}

/* Which naming the checkpoint uses, from the first component of every key. A checkpoint that
 * mixes conventions is refused rather than half-loaded. */
enum naming { N_UNKNOWN, N_DIFFUSERS, N_BFL, N_BFL_PREFIXED };

static int is_bfl_key(const char *k)
{
    static const char *const tops[] = {"img_in.",     "txt_in.",       "time_in.",      "guidance_in.",
                                       "vector_in.",  "double_blocks.", "single_blocks.", "final_layer.",
                                       /* FLUX.2's shared modulations: the same name in both namings,
                                          ".lin" in BFL's */
                                       "double_stream_modulation_img.lin.", "double_stream_modulation_txt.lin.",
                                       "single_stream_modulation.lin."};
    for (size_t i = 0; i < FS_ARRAY_LEN(tops); i++)
        if (!strncmp(k, tops[i], strlen(tops[i]))) return 1;
    return 0;
}

static int is_diffusers_key(const char *k)
{
    static const char *const tops[] = {"x_embedder.",         "context_embedder.", "time_text_embed.",
                                       "transformer_blocks.", "single_transformer_blocks.", "norm_out.",
                                       "proj_out.", "time_guidance_embed.", "double_stream_modulation_img.linear.",
                                       "double_stream_modulation_txt.linear.", "single_stream_modulation.linear."};
    for (size_t i = 0; i < FS_ARRAY_LEN(tops); i++)
        if (!strncmp(k, tops[i], strlen(tops[i]))) return 1;
    return 0;
}

static int detect_naming(const fs_st_archive *a, enum naming *out, fs_err *e)
{
    const char *first[4] = {0}; /* an example key of each enum naming */
    const size_t plen = strlen(BFL_PREFIX);
    for (int i = 0; i < a->n; i++) {
        const char *k = a->idx[i]->name;
        enum naming n = N_UNKNOWN;
        if (!strncmp(k, BFL_PREFIX, plen) && is_bfl_key(k + plen)) n = N_BFL_PREFIXED;
        else if (is_bfl_key(k)) n = N_BFL;
        else if (is_diffusers_key(k)) n = N_DIFFUSERS;
        if (n != N_UNKNOWN && !first[n]) first[n] = k;
    }
    static const char *const what[] = {"", "diffusers", "BFL", "BFL prefixed with '" BFL_PREFIX "'"};
    *out = N_UNKNOWN;
    for (int n = N_DIFFUSERS; n <= N_BFL_PREFIXED; n++) {
        if (!first[n]) continue;
        if (*out != N_UNKNOWN)
            return fs_errf(e, FS_E_INPUT, "%s: checkpoint mixes %s names ('%s') and %s names ('%s')", a->path,
                           what[*out], first[*out], what[n], first[n]);
        *out = (enum naming)n;
    }
    /* Nothing recognisable: report the missing diffusers names, the format we write. */
    if (*out == N_UNKNOWN) *out = N_DIFFUSERS;
    return FS_OK;
}

static int shapes_equal(int nd, const int64_t *s, const fs_st_entry *en)
{
    if (nd != en->ndim) return 0;
    for (int k = 0; k < nd; k++)
        if (s[k] != en->shape[k]) return 0;
    return 1;
}

static const char *shape_str(int nd, const int64_t *s, char *buf, size_t n)
{
    fs_tensor t = {.ndim = nd};
    memcpy(t.shape, s, (size_t)nd * sizeof *s);
    return fs_tensor_shape_str(&t, buf, n);
}

/* ---------------------------------------------------------------- the loader as a source */

/* Where each parameter lives in an open checkpoint: its entry and the plan (pieces of rows). */
struct fs_wload {
    fs_st_archive a;
    const fs_st_entry **en; /* [n] */
    plan *pl;               /* [n] */
    int n;
};

void fs_wload_free(fs_wload *l)
{
    if (!l) return;
    fs_st_archive_close(&l->a); /* unmaps: views into it must be cleared first (fs_weights_free) */
    free(l->en);
    free(l->pl);
    free(l);
}

const char *fs_wload_path(const fs_wload *l) { return l->a.path; }

int fs_wload_nfiles(const fs_wload *l) { return l ? l->a.nfiles : 0; }

int fs_wload_maps(const fs_wload *l, const void *p, size_t n)
{
    for (int f = 0; l && f < l->a.nfiles; f++) {
        const char *lo = l->a.files[f].map, *hi = lo + l->a.files[f].map_len;
        if (lo && (const char *)p >= lo && (const char *)p + n <= hi) return 1;
    }
    return 0;
}

int fs_wload_open(fs_wload **out, const fs_config *c, const fs_param_desc *desc, int n, const char *path, fs_err *e)
{
    *out = NULL;
    fs_wload *l = calloc(1, sizeof *l);
    if (!l) return fs_errf(e, FS_E_NOMEM, "out of memory");
    unsigned char *used = NULL;
    char *open_path = NULL; /* a pipeline folder's transformer/ (fs_pipeline.c), else path */
    int rc;
    if ((rc = fs_pipeline_weights_path(path, &open_path, e)) || (rc = fs_st_archive_open(&l->a, open_path, e))) {
        free(open_path);
        free(l);
        return rc;
    }
    free(open_path);
    enum naming naming;
    if ((rc = detect_naming(&l->a, &naming, e))) goto fail;
    /* a checkpoint of the other family (a BFL flux2-dev.safetensors has no config beside it, and
     * without --config the FLUX.1 `default` preset is assumed): say so, instead of a shape error */
    for (int k = 0; k < l->a.n; k++) {
        const char *key = l->a.idx[k]->name;
        const int f2key = strstr(key, "double_stream_modulation_img.") || strstr(key, "time_guidance_embed.");
        const int f1key = strstr(key, "time_text_embed.") || strstr(key, "vector_in.") || strstr(key, "img_mod.lin");
        if ((f2key && c->family != FS_FLUX2) || (f1key && c->family == FS_FLUX2)) {
            char kb[160];
            rc = fs_errf(e, FS_E_INPUT,
                         "%s: a %s checkpoint (tensor '%s') but the config is %s: give its config (--config %s or "
                         "its config.json)",
                         l->a.path, f2key ? "FLUX.2" : "FLUX.1", fs_printable(key, kb, sizeof kb, 80),
                         f2key ? "FLUX.1" : "FLUX.2", f2key ? "flux2-dev, flux2-klein-4b, flux2-klein-9b" : "flux-dev, flux-schnell");
            goto fail;
        }
    }
    const int bfl = naming == N_BFL || naming == N_BFL_PREFIXED;
    const char *prefix = naming == N_BFL_PREFIXED ? BFL_PREFIX : "";
    l->n = n;
    if (!(used = calloc(l->a.n ? (size_t)l->a.n : 1, 1)) || !(l->en = calloc((size_t)(n ? n : 1), sizeof *l->en)) ||
        !(l->pl = calloc((size_t)(n ? n : 1), sizeof *l->pl))) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto fail;
    }
    char sa[96], sb[96], what[448];
    for (int i = 0; i < n; i++) { /* every tensor is validated up front, even when streaming */
        const fs_param_desc *d = &desc[i];
        plan *pl = &l->pl[i];
        if (bfl) {
            if (plan_bfl(pl, d, c, prefix)) {
                rc = fs_errf(e, FS_E_INTERNAL, "no BFL name known for parameter '%s'", d->name);
                goto fail;
            }
            snprintf(what, sizeof what, "'%s' (BFL name for diffusers '%s')", pl->src, d->name);
        } else {
            snprintf(pl->src, sizeof pl->src, "%s", d->name);
            plan_whole(pl, d);
            snprintf(what, sizeof what, "'%s'", d->name);
        }
        int k = fs_st_archive_index(&l->a, pl->src);
        if (k < 0) {
            rc = fs_errf(e, FS_E_INPUT, "%s: missing tensor %s", l->a.path, what);
            goto fail;
        }
        const fs_st_entry *en = l->a.idx[k];
        int64_t want[FS_MAX_DIMS] = {pl->src_rows, d->shape[1]};
        if (!shapes_equal(d->ndim, want, en)) {
            rc = fs_errf(e, FS_E_INPUT, "%s: tensor %s: expected %s from config, file has %s",
                         fs_st_archive_file_of(&l->a, en), what, shape_str(d->ndim, want, sa, sizeof sa),
                         shape_str(en->ndim, en->shape, sb, sizeof sb));
            goto fail;
        }
        used[k] = 1;
        l->en[i] = en;
    }
    /* Unused tensors mean the config and the checkpoint disagree (schnell weights with a dev
     * config, a LoRA merged under new names, ...): loading "most of it" would run a different
     * model than the user thinks. */
    int nextra = 0, first = -1;
    for (int k = 0; k < l->a.n; k++)
        if (!used[k] && nextra++ == 0) first = k;
    if (nextra) {
        rc = fs_errf(e, FS_E_INPUT, "%s: unexpected tensor '%s' (%d tensor%s in the checkpoint that the config has no "
                                    "parameter for; wrong config?)",
                     fs_st_archive_file_of(&l->a, l->a.idx[first]), l->a.idx[first]->name, nextra, nextra == 1 ? "" : "s");
        goto fail;
    }
    free(used);
    *out = l;
    return FS_OK;
fail:
    free(used);
    fs_wload_free(l);
    return rc;
}

/* Parameter i's piece `sh` (rows [r0, r1) and column intervals) into t, in dtype dt: a view into
 * the mapping when the bytes already are what the run computes with, in one aligned piece (a
 * colwise row range of an F32 tensor in an fp32 run, of a BF16 one in a bf16 run); otherwise
 * only those rows and columns decoded — never the whole tensor.
 *
 * A checkpoint truncated during the run (probe T1: SIGBUS, rc 135, the dump temporary left):
 * decoded bytes are read with pread (fs_st_read), so a cut file is an ordinary error here; a
 * view is handed out only after fs_st_check_size has seen the file at its full size (with
 * streaming that is before every block), and a cut that lands while a GEMM reads a view is
 * caught by fs_safetensors.c's SIGBUS guard (one line, temporaries removed, exit 2). */
int fs_wload_make(const fs_wload *l, int i, const fs_param_desc *d, const fs_tp_split *sh, fs_dtype dt, fs_tensor *t,
                  fs_err *e)
{
    const fs_st_entry *en = l->en[i];
    const plan *pl = &l->pl[i];
    const int64_t K = d->ndim == 2 ? d->shape[1] : 1, cols = fs_tp_split_cols(sh);
    const int whole_cols = cols == K;
    const size_t es = fs_dtype_size(dt);
    int64_t shape[2] = {sh->r1 - sh->r0, d->ndim == 2 ? cols : 0};
    const int as_stored = (en->dtype == FS_ST_F32 && dt == FS_F32) || (en->dtype == FS_ST_BF16 && dt == FS_BF16) ||
                          (en->dtype == FS_ST_F64 && dt == FS_F64);
    /* one piece holding all the rows: the source rows are one contiguous range */
    for (int k = 0; as_stored && whole_cols && k < pl->np; k++) {
        const piece *pc = &pl->p[k];
        if (sh->r0 < pc->dst_r0 || sh->r1 > pc->dst_r0 + pc->nrows) continue;
        const char *first = (const char *)en->data + (size_t)((pc->src_r0 + sh->r0 - pc->dst_r0) * K) * es;
        if ((uintptr_t)first % es) break;
        int rc = fs_st_check_size(&l->a.files[en->file], e);
        if (rc) return fs_err_prefix(e, "%s: tensor '%s': ", fs_st_archive_file_of(&l->a, en), en->name);
        memset(t, 0, sizeof *t);
        t->dtype = dt;
        t->ndim = d->ndim;
        t->shape[0] = shape[0];
        if (d->ndim == 2) t->shape[1] = shape[1];
        t->data = (void *)first; /* PROT_READ mapping: a kernel writing a weight would fault */
        return FS_OK;
    }
    const fs_st_file *f = &l->a.files[en->file];
    int rc = fs_tensor_alloc(t, dt, d->ndim, shape, e);
    if (rc) return rc;
    for (int k = 0; k < pl->np; k++) {
        const piece *pc = &pl->p[k];
        const int64_t lo = sh->r0 > pc->dst_r0 ? sh->r0 : pc->dst_r0,
                      hi = sh->r1 < pc->dst_r0 + pc->nrows ? sh->r1 : pc->dst_r0 + pc->nrows;
        if (lo >= hi) continue;
        const int64_t src_row = pc->src_r0 + lo - pc->dst_r0;
        char *dst = (char *)t->data + (size_t)((lo - sh->r0) * cols) * es;
        if (whole_cols) { /* a contiguous block of rows */
            if ((rc = fs_st_read(f, en, src_row * K, (hi - lo) * K, dt, dst, e))) break;
            continue;
        }
        for (int64_t r = 0; r < hi - lo && !rc; r++)
            for (int c = 0, o = 0; c < sh->nc && !rc; c++) {
                const int64_t len = sh->c[c][1] - sh->c[c][0];
                rc = fs_st_read(f, en, (src_row + r) * K + sh->c[c][0], len, dt, dst + (size_t)(r * cols + o) * es, e);
                o += (int)len;
            }
    }
    if (rc) {
        fs_tensor_free(t);
        return fs_err_prefix(e, "%s: tensor '%s': ", fs_st_archive_file_of(&l->a, en), en->name);
    }
    return FS_OK; /* read with pread: no page of the mapping was touched, nothing to drop */
}

/* Streaming reads the whole checkpoint once per step: without this, every page read stays mapped
 * in our resident set (a 24 GB checkpoint would show as 24 GB RSS, and the kernel would keep it
 * counted against us until it reclaims). MADV_DONTNEED on a read-only file mapping only unmaps:
 * the pages stay in the page cache and a later read faults them back in, identical. Pages at the
 * range's ends may hold a neighbour's bytes; dropping them costs that neighbour a minor fault. */
void fs_wload_drop(const fs_wload *l, int i)
{
    const fs_st_entry *en = l->en[i];
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a0 = (uintptr_t)en->data / pg * pg;
    const uintptr_t a1 = (uintptr_t)en->data + (uintptr_t)(en->end - en->begin);
    if (a1 > a0) madvise((void *)a0, a1 - a0, MADV_DONTNEED);
}
