#include "fs_plan.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The FLUX.1 tensor-parallel plan: Megatron-style, as in diffusers' _tp_plan and
 * ../shared/seeds/000. This text is the one place that says how a block is split. */
static const char default_plan[] =
    "# FLUX.1 tensor-parallel plan (Megatron-style; diffusers _tp_plan / torchtitan vocabulary)\n"
    "#   <module glob>                              <style>         [packed input widths]\n"
    "# Unmatched modules are replicated: AdaLN linears (norm1*, norm.linear), QK norms, embedders,\n"
    "# norm_out, proj_out. colwise splits q/k/v by heads (H/T heads per rank, head-major columns).\n"
    "\n"
    "# double blocks: attention\n"
    "transformer_blocks.*.attn.to_q                 colwise\n"
    "transformer_blocks.*.attn.to_k                 colwise\n"
    "transformer_blocks.*.attn.to_v                 colwise\n"
    "transformer_blocks.*.attn.add_q_proj           colwise\n"
    "transformer_blocks.*.attn.add_k_proj           colwise\n"
    "transformer_blocks.*.attn.add_v_proj           colwise\n"
    "transformer_blocks.*.attn.to_out.0             rowwise\n"
    "transformer_blocks.*.attn.to_add_out           rowwise\n"
    "# double blocks: MLPs (image and text streams)\n"
    "transformer_blocks.*.ff.net.0.proj             colwise\n"
    "transformer_blocks.*.ff.net.2                  rowwise\n"
    "transformer_blocks.*.ff_context.net.0.proj     colwise\n"
    "transformer_blocks.*.ff_context.net.2          rowwise\n"
    "# single blocks: attention and MLP in parallel, one output projection on cat([attn, mlp])\n"
    "single_transformer_blocks.*.attn.to_q          colwise\n"
    "single_transformer_blocks.*.attn.to_k          colwise\n"
    "single_transformer_blocks.*.attn.to_v          colwise\n"
    "single_transformer_blocks.*.proj_mlp           colwise\n"
    "single_transformer_blocks.*.proj_out           packed_rowwise  D,4D\n";

/* The FLUX.2 plan: diffusers' Flux2Transformer2DModel._tp_plan, rule for rule (transformer_flux2.py;
 * PackedColwiseParallel([1, 1]) and the blocks the Linears carry written out as widths). */
static const char flux2_plan[] =
    "# FLUX.2 tensor-parallel plan (diffusers Flux2Transformer2DModel._tp_plan)\n"
    "#   <module glob>                                  <style>          [packed widths]\n"
    "# Unmatched modules are replicated: the shared modulations (double_stream_modulation_img/_txt,\n"
    "# single_stream_modulation), QK norms, embedders, norm_out, proj_out. F = the MLP width\n"
    "# (mlp_ratio x D). No biases anywhere in FLUX.2.\n"
    "\n"
    "# double blocks: attention\n"
    "transformer_blocks.*.attn.to_q                     colwise\n"
    "transformer_blocks.*.attn.to_k                     colwise\n"
    "transformer_blocks.*.attn.to_v                     colwise\n"
    "transformer_blocks.*.attn.to_out.0                 rowwise\n"
    "transformer_blocks.*.attn.add_q_proj               colwise\n"
    "transformer_blocks.*.attn.add_k_proj               colwise\n"
    "transformer_blocks.*.attn.add_v_proj               colwise\n"
    "transformer_blocks.*.attn.to_add_out               rowwise\n"
    "# double blocks: SwiGLU MLPs, linear_in = [gate | up], each half split on its own\n"
    "transformer_blocks.*.ff.linear_in                  packed_colwise   F,F\n"
    "transformer_blocks.*.ff.linear_out                 rowwise\n"
    "transformer_blocks.*.ff_context.linear_in          packed_colwise   F,F\n"
    "transformer_blocks.*.ff_context.linear_out         rowwise\n"
    "# single blocks: one Linear for q, k, v and the MLP input, one for cat([attn, mlp])\n"
    "single_transformer_blocks.*.attn.to_qkv_mlp_proj   packed_colwise   D,D,D,F,F\n"
    "single_transformer_blocks.*.attn.to_out            packed_rowwise   D,F\n";

const char *fs_plan_default_text(void) { return default_plan; }
const char *fs_plan_default_text_for(const fs_config *c) { return c->family == FS_FLUX2 ? flux2_plan : default_plan; }

const char *fs_tp_style_name(fs_tp_style s)
{
    switch (s) {
    case FS_TP_COLWISE: return "colwise";
    case FS_TP_ROWWISE: return "rowwise";
    case FS_TP_PACKED_ROWWISE: return "packed_rowwise";
    case FS_TP_PACKED_COLWISE: return "packed_colwise";
    default: return "replicate";
    }
}

/* "3072", "D", "4D", "F", "2F". At most 9 digits: with hidden <= 2^20 and F <= 16·2^20
 * (fs_config.h) a width k·D or k·F then stays below 2^54 and the sum of five widths cannot
 * overflow int64 (fs_weights adds them). */
static int valid_width(const char *s)
{
    if (!*s) return 0;
    const char *p = s;
    while (isdigit((unsigned char)*p)) p++;
    return p - s <= 9 && (!*p || !strcmp(p, "D") || !strcmp(p, "F"));
}

int fs_plan_parse(fs_plan *p, const char *text, const char *origin, fs_err *e)
{
    memset(p, 0, sizeof *p);
    snprintf(p->source, sizeof p->source, "%s", origin);
    int lineno = 0, cap = 0;
    const char *s = text;
    while (*s) {
        const char *nl = strchr(s, '\n');
        size_t len = nl ? (size_t)(nl - s) : strlen(s);
        char line[512];
        lineno++;
        if (len >= sizeof line) {
            fs_plan_free(p);
            return fs_errf(e, FS_E_INPUT, "%s:%d: line too long", origin, lineno);
        }
        memcpy(line, s, len);
        line[len] = 0;
        s += len + (nl ? 1 : 0);
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char glob[256] = "", style[64] = "", args[64] = "", extra[8] = "";
        int nf = sscanf(line, "%255s %63s %63s %7s", glob, style, args, extra);
        if (nf <= 0) continue;
        fs_plan_rule r = {.line = lineno};
        if (strlen(glob) >= sizeof r.glob) {
            fs_plan_free(p);
            return fs_errf(e, FS_E_INPUT, "%s:%d: module glob too long", origin, lineno);
        }
        strcpy(r.glob, glob);
        if (nf < 2) {
            fs_plan_free(p);
            return fs_errf(e, FS_E_INPUT, "%s:%d: '%s' has no style (colwise, rowwise, packed_rowwise, replicate)",
                           origin, lineno, glob);
        }
        if (!strcmp(style, "colwise")) r.style = FS_TP_COLWISE;
        else if (!strcmp(style, "rowwise")) r.style = FS_TP_ROWWISE;
        else if (!strcmp(style, "packed_rowwise")) r.style = FS_TP_PACKED_ROWWISE;
        else if (!strcmp(style, "packed_colwise")) r.style = FS_TP_PACKED_COLWISE;
        else if (!strcmp(style, "replicate")) r.style = FS_TP_REPLICATE;
        else {
            fs_plan_free(p);
            return fs_errf(e, FS_E_INPUT,
                           "%s:%d: unknown style '%s' (colwise, rowwise, packed_rowwise, packed_colwise, replicate)",
                           origin, lineno, style);
        }
        if (r.style == FS_TP_PACKED_ROWWISE || r.style == FS_TP_PACKED_COLWISE) {
            const int rowwise = r.style == FS_TP_PACKED_ROWWISE;
            if (nf < 3 || !strchr(args, ',')) {
                fs_plan_free(p);
                return fs_errf(e, FS_E_INPUT, "%s:%d: %s needs the %s widths, e.g. '%s'", origin, lineno, style,
                               rowwise ? "two input" : "2 to 5 output block", rowwise ? "D,4D" : "D,D,D,F,F");
            }
            char wcopy[64];
            snprintf(wcopy, sizeof wcopy, "%s", args);
            char *save = NULL;
            for (char *tok = strtok_r(wcopy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (r.nsplit == FS_TP_MAX_BLOCKS || !valid_width(tok) || strlen(tok) >= sizeof r.split[0]) {
                    fs_plan_free(p);
                    return fs_errf(e, FS_E_INPUT, "%s:%d: %s widths '%s': at most %d, each an integer, kD or kF (at "
                                                  "most 9 digits)", origin, lineno, style, args, FS_TP_MAX_BLOCKS);
                }
                strcpy(r.split[r.nsplit++], tok);
            }
            /* "D,,4D" and "D," would otherwise lose a width silently */
            int commas = 0;
            for (const char *q = args; *q; q++) commas += *q == ',';
            if (commas + 1 != r.nsplit || (rowwise && r.nsplit != 2) || r.nsplit < 2) {
                fs_plan_free(p);
                return fs_errf(e, FS_E_INPUT, "%s:%d: %s widths '%s': %s", origin, lineno, style, args,
                               rowwise ? "exactly two, e.g. 'D,4D'" : "2 to 5, none empty, e.g. 'D,D,D,F,F'");
            }
            nf--;
        }
        if (nf > 2) {
            fs_plan_free(p);
            return fs_errf(e, FS_E_INPUT, "%s:%d: unexpected text after '%s %s'", origin, lineno, glob, style);
        }
        if (p->n == cap) {
            cap = cap ? 2 * cap : 32;
            fs_plan_rule *nr = realloc(p->rules, (size_t)cap * sizeof *nr);
            if (!nr) {
                fs_plan_free(p);
                return fs_errf(e, FS_E_NOMEM, "out of memory");
            }
            p->rules = nr;
        }
        p->rules[p->n++] = r;
    }
    return FS_OK;
}

/* The built-in plan is 2 KB; 1 MiB is room for any hand-written plan (thousands of rules) and
 * keeps a wrong path (a checkpoint, /dev/zero) from being read. A longer file is refused, never
 * cut: a cut plan silently loses its last rules (seed 000's proj_out rule among them). */
#define FS_PLAN_MAX_FILE (1 << 20)

int fs_plan_load(fs_plan *p, const char *path, fs_err *e)
{
    memset(p, 0, sizeof *p);
    char *buf;
    int rc = fs_read_text_file(path, "plan", "a plan is at most", FS_PLAN_MAX_FILE, &buf, e);
    if (rc) return rc;
    rc = fs_plan_parse(p, buf, path, e);
    /* a plan that splits nothing runs "tp N" as N replicas and --check says OK: almost certainly
     * the wrong file, so it is an error, not a plan */
    if (!rc && p->n == 0) {
        fs_plan_free(p);
        rc = fs_errf(e, FS_E_INPUT, "%s: plan has no rules (only blank lines and comments)", path);
    }
    free(buf);
    return rc;
}

void fs_plan_free(fs_plan *p)
{
    if (!p) return;
    free(p->rules);
    memset(p, 0, sizeof *p);
}

static int64_t resolve(const char *w, const fs_config *c)
{
    char *end;
    long long k = strtoll(w, &end, 10);
    if (end == w) k = 1;
    if (*end == 'D') return k * fs_config_hidden(c);
    if (*end == 'F') return k * fs_config_mlp_hidden(c);
    return k;
}

fs_tp_style fs_plan_lookup(const fs_plan *p, const fs_config *c, const char *module, int64_t widths[FS_TP_MAX_BLOCKS],
                           int *n, int *rule)
{
    if (rule) *rule = -1;
    if (n) *n = 0;
    for (int i = 0; p && i < p->n; i++)
        if (fnmatch(p->rules[i].glob, module, 0) == 0) {
            if (rule) *rule = i;
            for (int k = 0; widths && k < p->rules[i].nsplit; k++) widths[k] = resolve(p->rules[i].split[k], c);
            if (n) *n = p->rules[i].nsplit;
            return p->rules[i].style;
        }
    return FS_TP_REPLICATE;
}

/* AdaLN modulation linears: norm1.linear, norm1_context.linear (double blocks), norm.linear
 * (single blocks), norm_out.linear; FLUX.2's shared double_stream_modulation_img/_txt.linear and
 * single_stream_modulation.linear. */
static int is_adaln_linear(const char *m)
{
    return strstr(m, "norm1.linear") || strstr(m, "norm1_context.linear") || strstr(m, ".norm.linear") ||
           !strcmp(m, "norm_out.linear") || strstr(m, "_modulation_img.linear") || strstr(m, "_modulation_txt.linear") ||
           !strcmp(m, "single_stream_modulation.linear");
}

/* q, k, v (and the context stream's add_*_proj): what fused-qkv-contiguous cuts (fs_weights.c) */
static int is_qkv_linear(const char *m)
{
    static const char *const tails[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                                        "attn.add_v_proj"};
    size_t ml = strlen(m);
    for (size_t i = 0; i < FS_ARRAY_LEN(tails); i++) {
        size_t tl = strlen(tails[i]);
        if (ml >= tl && !strcmp(m + ml - tl, tails[i])) return 1;
    }
    return 0;
}

/* --inject: the TP split of `module` made wrong on purpose, after the correct one (see
 * fs_tp_split_of in fs_plan.h); what the forward must do differently goes to *wrong. */
static void inject_wrong_split(const fs_inject *in, const char *module, int T, int t, fs_tp_split *s,
                               fs_inject_linear *wrong)
{
    if (!in || T < 2) return;
    if (fs_injected(in, FS_INJ_PACKED_COLWISE_CONTIGUOUS) && s->style == FS_TP_PACKED_COLWISE) {
        /* sglang#21664's sibling: a packed [gate | up] (or [q|k|v|gate|up]) Linear loaded as
         * plain colwise, rows [t·N/T, (t+1)·N/T): rank 0 gets gate and the first part of up of
         * other features, SwiGLU pairs a gate with the wrong up */
        s->nr = 1;
        s->r0 = s->rr[0][0] = t * (s->N / T);
        s->r1 = s->rr[0][1] = (t + 1) * (s->N / T);
        fs_inject_fire(FS_INJ_PACKED_COLWISE_CONTIGUOUS);
    }
    if (fs_injected(in, FS_INJ_PROJ_OUT_CONTIGUOUS) && s->style == FS_TP_PACKED_ROWWISE && s->K) {
        /* seed 000 TP-1: columns [t·K/T, (t+1)·K/T) of the [attn | mlp] input, as if it were one
         * contiguous row-parallel input; the rank's input is still [attn_t | mlp_t] */
        s->nc = 1;
        s->c[0][0] = t * (s->K / T);
        s->c[0][1] = (t + 1) * (s->K / T);
        fs_inject_fire(FS_INJ_PROJ_OUT_CONTIGUOUS);
    }
    if (fs_injected(in, FS_INJ_ADALN_SHARDED) && s->style == FS_TP_REPLICATE && is_adaln_linear(module) && s->K &&
        s->K % T == 0) {
        s->style = FS_TP_ROWWISE; /* each rank its slice of SiLU(temb) and of W's columns ... */
        s->nc = 1;
        s->c[0][0] = t * (s->K / T);
        s->c[0][1] = (t + 1) * (s->K / T);
        wrong->input_whole = 1; /* ... read from the whole, replicated input ... */
        s->reduce = 0;          /* ... and no all-reduce: every rank modulates with its own partial sum */
        fs_inject_fire(FS_INJ_ADALN_SHARDED);
    }
    if (fs_injected(in, FS_INJ_MISSING_ALLREDUCE) && s->reduce) {
        s->reduce = 0; /* partial + bias, as is */
        fs_inject_fire(FS_INJ_MISSING_ALLREDUCE);
    }
    if (fs_injected(in, FS_INJ_ROWWISE_BIAS_EVERY_RANK) && s->reduce) {
        wrong->bias_before_reduce = 1;
        fs_inject_fire(FS_INJ_ROWWISE_BIAS_EVERY_RANK);
    }
    /* fused-qkv-contiguous cuts the weights themselves (fs_weights_shard): it acts on exactly the
     * q/k/v Linears the plan splits colwise */
    if (fs_injected(in, FS_INJ_FUSED_QKV_CONTIGUOUS) && s->style == FS_TP_COLWISE && is_qkv_linear(module))
        fs_inject_fire(FS_INJ_FUSED_QKV_CONTIGUOUS);
}

int fs_tp_split_of(const fs_plan *p, const fs_config *c, const char *module, int64_t N, int64_t K, int T, int t,
                   const fs_inject *inj, fs_tp_split *s, fs_err *e)
{
    fs_inject_linear ignored;
    return fs_tp_split_of_injected(p, c, module, N, K, T, t, inj, s, &ignored, e);
}

int fs_tp_split_of_injected(const fs_plan *p, const fs_config *c, const char *module, int64_t N, int64_t K, int T,
                            int t, const fs_inject *inj, fs_tp_split *s, fs_inject_linear *wrong, fs_err *e)
{
    int64_t widths[FS_TP_MAX_BLOCKS] = {0};
    int nw = 0;
    *wrong = (fs_inject_linear){0};
    *s = (fs_tp_split){.style = FS_TP_REPLICATE, .N = N, .K = K, .r0 = 0, .r1 = N, .nr = 1, .rr = {{0, N}}, .nc = 1,
                       .c = {{0, K}}};
    if (T > 1) s->style = fs_plan_lookup(p, c, module, widths, &nw, NULL);
    switch (s->style) {
    case FS_TP_REPLICATE: break;
    case FS_TP_COLWISE: /* output rows; the bias follows them */
        if (N % T)
            return fs_errf(e, FS_E_INPUT, "%s: colwise over tp %d needs its %lld output features divisible by it", module,
                           T, (long long)N);
        s->r0 = s->rr[0][0] = t * (N / T);
        s->r1 = s->rr[0][1] = (t + 1) * (N / T);
        s->bias_sharded = 1;
        break;
    case FS_TP_PACKED_COLWISE: { /* each output block split colwise on its own: rows o_k + t·W_k/T.. */
        int64_t sum = 0;
        for (int k = 0; k < nw; k++) sum += widths[k];
        if (sum != N) {
            char ws[128] = "";
            for (int k = 0, o = 0; k < nw; k++) o += snprintf(ws + o, sizeof ws - o, "%s%lld", k ? "," : "", (long long)widths[k]);
            return fs_errf(e, FS_E_INPUT, "%s: packed_colwise widths %s sum to %lld, but it has %lld output features",
                           module, ws, (long long)sum, (long long)N);
        }
        int64_t o = 0;
        for (int k = 0; k < nw; k++) {
            if (widths[k] % T)
                return fs_errf(e, FS_E_INPUT, "%s: packed_colwise block %d of width %lld does not split over tp %d",
                               module, k, (long long)widths[k], T);
            s->rr[k][0] = o + t * (widths[k] / T);
            s->rr[k][1] = o + (t + 1) * (widths[k] / T);
            o += widths[k];
        }
        s->nr = nw;
        s->r0 = s->rr[0][0];
        s->r1 = s->rr[nw - 1][1];
        s->bias_sharded = 1;
        break;
    }
    case FS_TP_ROWWISE: /* input columns; partials all-reduced, the whole bias added once after */
        if (K % T)
            return fs_errf(e, FS_E_INPUT, "%s: rowwise over tp %d needs its %lld input features divisible by it", module,
                           T, (long long)K);
        s->c[0][0] = t * (K / T);
        s->c[0][1] = (t + 1) * (K / T);
        s->reduce = 1;
        break;
    case FS_TP_PACKED_ROWWISE: { /* x = [a_t | b_t]: columns t·A/T.. and A + t·B/T.. */
        const int64_t A = widths[0], Bw = widths[1];
        if ((K && A + Bw != K) || A % T || Bw % T)
            return fs_errf(e, FS_E_INPUT, "%s: packed_rowwise widths %lld,%lld do not split %lld input features over tp %d",
                           module, (long long)A, (long long)Bw, (long long)K, T);
        s->nc = 2;
        s->c[0][0] = t * (A / T);
        s->c[0][1] = (t + 1) * (A / T);
        s->c[1][0] = A + t * (Bw / T);
        s->c[1][1] = A + (t + 1) * (Bw / T);
        s->reduce = 1;
        break;
    }
    }
    inject_wrong_split(inj, module, T, t, s, wrong); /* --inject: the wrong split, on purpose */
    return FS_OK;
}
