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

const char *fs_plan_default_text(void) { return default_plan; }

const char *fs_tp_style_name(fs_tp_style s)
{
    switch (s) {
    case FS_TP_COLWISE: return "colwise";
    case FS_TP_ROWWISE: return "rowwise";
    case FS_TP_PACKED_ROWWISE: return "packed_rowwise";
    default: return "replicate";
    }
}

/* "3072", "D", "4D". At most 9 digits: with hidden <= 2^20 (fs_config.h) a width k·D then stays
 * below 2^50 and the sum of two widths cannot overflow int64 (fs_weights adds them). */
static int valid_width(const char *s)
{
    if (!*s) return 0;
    const char *p = s;
    while (isdigit((unsigned char)*p)) p++;
    return p - s <= 9 && (!*p || !strcmp(p, "D"));
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
        else if (!strcmp(style, "replicate")) r.style = FS_TP_REPLICATE;
        else {
            fs_plan_free(p);
            return fs_errf(e, FS_E_INPUT, "%s:%d: unknown style '%s' (colwise, rowwise, packed_rowwise, replicate)",
                           origin, lineno, style);
        }
        if (r.style == FS_TP_PACKED_ROWWISE) {
            char *comma = strchr(args, ',');
            if (nf < 3 || !comma) {
                fs_plan_free(p);
                return fs_errf(e, FS_E_INPUT, "%s:%d: packed_rowwise needs the two input widths, e.g. 'D,4D'", origin,
                               lineno);
            }
            *comma = 0;
            if (!valid_width(args) || !valid_width(comma + 1) || strlen(args) >= 16 || strlen(comma + 1) >= 16) {
                fs_plan_free(p);
                return fs_errf(e, FS_E_INPUT, "%s:%d: packed_rowwise widths '%s,%s' must be integers or kD (at most "
                                              "9 digits)", origin, lineno, args, comma + 1);
            }
            strcpy(r.split[0], args);
            strcpy(r.split[1], comma + 1);
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
    return k;
}

fs_tp_style fs_plan_lookup(const fs_plan *p, const fs_config *c, const char *module, int64_t widths[2], int *rule)
{
    if (rule) *rule = -1;
    for (int i = 0; p && i < p->n; i++)
        if (fnmatch(p->rules[i].glob, module, 0) == 0) {
            if (rule) *rule = i;
            if (p->rules[i].style == FS_TP_PACKED_ROWWISE && widths) {
                widths[0] = resolve(p->rules[i].split[0], c);
                widths[1] = resolve(p->rules[i].split[1], c);
            }
            return p->rules[i].style;
        }
    return FS_TP_REPLICATE;
}

/* AdaLN modulation linears: norm1.linear, norm1_context.linear (double blocks), norm.linear
 * (single blocks), norm_out.linear. */
static int is_adaln_linear(const char *m)
{
    return strstr(m, "norm1.linear") || strstr(m, "norm1_context.linear") || strstr(m, ".norm.linear") ||
           !strcmp(m, "norm_out.linear");
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
    int64_t widths[2] = {0, 0};
    *wrong = (fs_inject_linear){0};
    *s = (fs_tp_split){.style = FS_TP_REPLICATE, .N = N, .K = K, .r0 = 0, .r1 = N, .nc = 1, .c = {{0, K}}};
    if (T > 1) s->style = fs_plan_lookup(p, c, module, widths, NULL);
    switch (s->style) {
    case FS_TP_REPLICATE: break;
    case FS_TP_COLWISE: /* output rows; the bias follows them */
        if (N % T)
            return fs_errf(e, FS_E_INPUT, "%s: colwise over tp %d needs its %lld output features divisible by it", module,
                           T, (long long)N);
        s->r0 = t * (N / T);
        s->r1 = (t + 1) * (N / T);
        s->bias_sharded = 1;
        break;
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
