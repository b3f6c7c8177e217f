/* fs_select.c — record selection (see fs_select.h). */
#include "fs_select.h"

#include "fs_dump.h" /* FS_DUMP_DECL_MAX */

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The option's text is the user's and may hold anything (a newline, an escape sequence): every
 * message shows it through fs_printable, so it stays one line and cannot drive the terminal. */
int fs_select_parse(fs_select *s, const char *modules, const char *steps, fs_err *e)
{
    char why[512], shown[700];
    memset(s, 0, sizeof *s);
    s->steps.all = 1;
    if (modules && fo_globs_parse(modules, &s->modules, why, sizeof why))
        return fs_errf(e, FS_E_INPUT, "--dump-modules: %s", fs_printable(why, shown, sizeof shown, 400));
    if (modules) {
        /* the dumps declare the selection in each step's `recorded_modules` (FS_DUMP_DECL_MAX):
         * one limit, checked here, so the writer never refuses what the parser accepted */
        char decl[FO_GLOBS_MAX * 260 + 16];
        const size_t len = strlen(fs_select_modules_decl(s, decl, sizeof decl));
        if (len > FS_DUMP_DECL_MAX) {
            fo_globs_free(&s->modules);
            return fs_errf(e, FS_E_INPUT, "--dump-modules: the selection declares as %zu characters ('match:' and the "
                                          "globs joined by ','); a dump records at most %d: use fewer or shorter globs",
                           len, FS_DUMP_DECL_MAX);
        }
    }
    if (steps && fo_steps_parse(steps, &s->steps, why, sizeof why)) {
        fo_globs_free(&s->modules);
        return fs_errf(e, FS_E_INPUT, "--dump-steps: %s", fs_printable(why, shown, sizeof shown, 400));
    }
    return FS_OK;
}

void fs_select_free(fs_select *s)
{
    if (!s) return;
    fo_globs_free(&s->modules);
    fo_steps_free(&s->steps);
}

int fs_select_all(const fs_select *s) { return !s || (!s->modules.n && s->steps.all); }
int fs_select_step(const fs_select *s, int step) { return !s || fo_steps_has(&s->steps, step); }

int fs_select_module(const fs_select *s, const char *name)
{
    if (!s || !s->modules.n) return 1;
    return !strcmp(name, "latents_in") || !strcmp(name, "latents_out") || fo_globs_match(&s->modules, name);
}

const char *fs_select_steps_decl(const fs_select *s, char *buf, size_t n)
{
    if (!s || s->steps.all) {
        snprintf(buf, n, "all");
        return buf;
    }
    return fo_steps_str(&s->steps, buf, n);
}

const char *fs_select_modules_decl(const fs_select *s, char *buf, size_t n)
{
    if (!s || !s->modules.n) {
        snprintf(buf, n, "all");
        return buf;
    }
    size_t o = (size_t)snprintf(buf, n, "match:");
    if (o < n) fo_globs_str(&s->modules, buf + o, n - o);
    return buf;
}

/* The one message for a selection that selects nothing (up front, or at the end of a step). */
static int no_match(const fs_select *s, fs_err *e)
{
    char g[FS_DUMP_DECL_MAX + 1], shown[400];
    return fs_errf(e, FS_E_INPUT, "--dump-modules %s: matches no module of this model (names as in a dump's `order`, "
                                  "e.g. 'single_transformer_blocks.0.*,proj_out')",
                   fs_printable(fo_globs_str(&s->modules, g, sizeof g), shown, sizeof shown, 300));
}

/* ---- the names a run records (fs_select.h) ---- */

void fs_names_free(fs_names *l)
{
    if (!l) return;
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

__attribute__((format(printf, 2, 3))) static int name(fs_names *l, const char *fmt, ...)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        char **v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return FS_E_NOMEM;
        l->v = v, l->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    int rc = vasprintf(&l->v[l->n], fmt, ap);
    va_end(ap);
    if (rc < 0) return FS_E_NOMEM;
    l->n++;
    return FS_OK;
}

#define NAME(...)                                           \
    do {                                                    \
        if ((rc = name(l, __VA_ARGS__))) return rc;         \
    } while (0)

/* An AdaLayerNorm (fs_layers.c: fs_ada_layer_norm_zero, fs_ada_layer_norm_continuous): its SiLU, Linear and
 * LayerNorm, then the returned tuple's k elements. */
static int ada_norm(fs_names *l, const char *p, int k)
{
    int rc;
    NAME("%s.silu", p);
    NAME("%s.linear", p);
    NAME("%s.norm", p);
    for (int i = 0; i < k; i++) NAME("%s#%d", p, i);
    return FS_OK;
}

/* FeedForward(GELU tanh): net.0 = GELU(proj), net.1 = Dropout, net.2 = Linear. */
static int feed_forward(fs_names *l, const char *p)
{
    int rc;
    NAME("%s.net.0.proj", p);
    NAME("%s.net.0", p);
    NAME("%s.net.1", p);
    NAME("%s.net.2", p);
    NAME("%s", p);
    return FS_OK;
}

/* TimestepEmbedding: linear_1, the activation, linear_2, the module. */
static int mlp_embedder(fs_names *l, const char *p, const char *act)
{
    int rc;
    NAME("%s.linear_1", p);
    NAME("%s.%s", p, act);
    NAME("%s.linear_2", p);
    NAME("%s", p);
    return FS_OK;
}

/* FLUX.1, as sim/model/fs_flux1.c records it (diffusers' FluxTransformer2DModel module paths). */
static int flux1_names(const fs_config *c, fs_names *l)
{
    int rc;
    char p[64];
    NAME("x_embedder");
    NAME("time_text_embed.time_proj");
    if ((rc = mlp_embedder(l, "time_text_embed.timestep_embedder", "act"))) return rc;
    if (c->guidance_embeds) {
        NAME("time_text_embed.time_proj@1"); /* the same time_proj module fires twice */
        if ((rc = mlp_embedder(l, "time_text_embed.guidance_embedder", "act"))) return rc;
    }
    if ((rc = mlp_embedder(l, "time_text_embed.text_embedder", "act_1"))) return rc;
    NAME("time_text_embed");
    NAME("context_embedder");
    NAME("pos_embed#0");
    NAME("pos_embed#1");
    static const char *const attn[] = {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "norm_q",
                                       "norm_k", "norm_added_q", "norm_added_k", "to_out.0", "to_out.1", "to_add_out"};
    for (int i = 0; i < c->num_layers; i++) {
        snprintf(p, sizeof p, "transformer_blocks.%d", i);
        char q[80];
        snprintf(q, sizeof q, "%s.norm1", p);
        if ((rc = ada_norm(l, q, 5))) return rc;
        snprintf(q, sizeof q, "%s.norm1_context", p);
        if ((rc = ada_norm(l, q, 5))) return rc;
        for (size_t k = 0; k < sizeof attn / sizeof *attn; k++) NAME("%s.attn.%s", p, attn[k]);
        NAME("%s.attn#0", p);
        NAME("%s.attn#1", p);
        NAME("%s.norm2", p);
        snprintf(q, sizeof q, "%s.ff", p);
        if ((rc = feed_forward(l, q))) return rc;
        NAME("%s.norm2_context", p);
        snprintf(q, sizeof q, "%s.ff_context", p);
        if ((rc = feed_forward(l, q))) return rc;
        NAME("%s#0", p);
        NAME("%s#1", p);
    }
    for (int i = 0; i < c->num_single_layers; i++) {
        snprintf(p, sizeof p, "single_transformer_blocks.%d", i);
        char q[80];
        snprintf(q, sizeof q, "%s.norm", p);
        if ((rc = ada_norm(l, q, 2))) return rc;
        NAME("%s.proj_mlp", p);
        NAME("%s.act_mlp", p);
        NAME("%s.attn.to_q", p);
        NAME("%s.attn.to_k", p);
        NAME("%s.attn.to_v", p);
        NAME("%s.attn.norm_q", p);
        NAME("%s.attn.norm_k", p);
        NAME("%s.attn", p);
        NAME("%s.proj_out", p);
        NAME("%s#0", p);
        NAME("%s#1", p);
    }
    if ((rc = ada_norm(l, "norm_out", 0))) return rc;
    NAME("norm_out");
    NAME("proj_out");
    return FS_OK;
}

/* FLUX.2, as sim/model/fs_flux2.c records it (diffusers' Flux2Transformer2DModel module paths):
 * the embedding and the three shared modulations come before the input projections, the blocks'
 * norms are plain LayerNorms, the MLPs SwiGLU (act_fn.gate_fn is its SiLU), pos_embed fires on
 * the image ids then the text ids (@1), to_add_out fires before to_out.0. */
static int flux2_ff(fs_names *l, const char *p)
{
    int rc;
    NAME("%s.linear_in", p);
    NAME("%s.act_fn.gate_fn", p);
    NAME("%s.act_fn", p);
    NAME("%s.linear_out", p);
    NAME("%s", p);
    return FS_OK;
}

static int flux2_names(const fs_config *c, int ref, fs_names *l)
{
    int rc;
    char p[64], q[96];
    NAME("time_guidance_embed.time_proj");
    if ((rc = mlp_embedder(l, "time_guidance_embed.timestep_embedder", "act"))) return rc;
    if (c->guidance_embeds) {
        NAME("time_guidance_embed.time_proj@1");
        if ((rc = mlp_embedder(l, "time_guidance_embed.guidance_embedder", "act"))) return rc;
    }
    NAME("time_guidance_embed");
    static const char *const mods[] = {"double_stream_modulation_img", "double_stream_modulation_txt",
                                       "single_stream_modulation"};
    for (size_t k = 0; k < sizeof mods / sizeof *mods; k++) {
        NAME("%s.act_fn", mods[k]);
        NAME("%s.linear", mods[k]);
        NAME("%s", mods[k]);
    }
    if (ref) { /* the reference tokens' embedding (fs_flux2.c: ref_record): each module's next call */
        const int tp = c->guidance_embeds ? 2 : 1;
        NAME("time_guidance_embed.time_proj@%d", tp);
        for (const char *const *q = (const char *const[]){"linear_1", "act", "linear_2", "", NULL}; *q; q++)
            NAME("time_guidance_embed.timestep_embedder%s%s@1", **q ? "." : "", *q);
        if (c->guidance_embeds) {
            NAME("time_guidance_embed.time_proj@3");
            for (const char *const *q = (const char *const[]){"linear_1", "act", "linear_2", "", NULL}; *q; q++)
                NAME("time_guidance_embed.guidance_embedder%s%s@1", **q ? "." : "", *q);
        }
        NAME("time_guidance_embed@1");
        for (int k = 0; k < 3; k += 2) { /* the image and single-stream modulations */
            NAME("%s.act_fn@1", mods[k]);
            NAME("%s.linear@1", mods[k]);
            NAME("%s@1", mods[k]);
        }
    }
    NAME("x_embedder");
    NAME("context_embedder");
    NAME("pos_embed#0");
    NAME("pos_embed#1");
    NAME("pos_embed@1#0");
    NAME("pos_embed@1#1");
    static const char *const attn[] = {"to_q",   "to_k",   "to_v",         "add_q_proj",   "add_k_proj",
                                       "add_v_proj", "norm_q", "norm_k",   "norm_added_q", "norm_added_k",
                                       "to_add_out", "to_out.0", "to_out.1"};
    for (int i = 0; i < c->num_layers; i++) {
        snprintf(p, sizeof p, "transformer_blocks.%d", i);
        NAME("%s.norm1", p);
        NAME("%s.norm1_context", p);
        for (size_t k = 0; k < sizeof attn / sizeof *attn; k++) NAME("%s.attn.%s", p, attn[k]);
        NAME("%s.attn#0", p);
        NAME("%s.attn#1", p);
        NAME("%s.norm2", p);
        snprintf(q, sizeof q, "%s.ff", p);
        if ((rc = flux2_ff(l, q))) return rc;
        NAME("%s.norm2_context", p);
        snprintf(q, sizeof q, "%s.ff_context", p);
        if ((rc = flux2_ff(l, q))) return rc;
        NAME("%s#0", p);
        NAME("%s#1", p);
    }
    for (int i = 0; i < c->num_single_layers; i++) {
        snprintf(p, sizeof p, "single_transformer_blocks.%d", i);
        NAME("%s.norm", p);
        NAME("%s.attn.to_qkv_mlp_proj", p);
        NAME("%s.attn.norm_q", p);
        NAME("%s.attn.norm_k", p);
        NAME("%s.attn.mlp_act_fn.gate_fn", p);
        NAME("%s.attn.mlp_act_fn", p);
        NAME("%s.attn.to_out", p);
        NAME("%s.attn", p);
        NAME("%s", p);
    }
    if ((rc = ada_norm(l, "norm_out", 0))) return rc;
    NAME("norm_out");
    NAME("proj_out");
    return FS_OK;
}

/* One entry per model family with a names list, by diffusers class name. */
/* FLUX.1 has no reference images (the run refuses them, naming why): its names either way */
static int flux1_names_f(const fs_config *c, int ref, fs_names *l) { return flux1_names(c, l); }
static const struct {
    const char *class_name;
    int (*names)(const fs_config *, int ref, fs_names *);
} families[] = {
    {"FluxTransformer2DModel", flux1_names_f},
    {"Flux2Transformer2DModel", flux2_names},
};

/* True CFG (fs_sampler.c, cfg_record): the second, negative-prompt call of a step records each
 * name of the first as base@(k + calls of base)#tuple, where base is the name without its @k and
 * #tuple and calls the number of times the first call recorded that base. Appends those for the
 * names [from, l->n). */
static int negative_call_names(fs_names *l, int from)
{
    const int n1 = l->n;
    for (int i = from; i < n1; i++) {
        const char *nm = l->v[i], *hash = strchr(nm, '#'), *end = hash ? hash : nm + strlen(nm), *at = NULL;
        for (const char *p = nm; p < end; p++)
            if (*p == '@') at = p;
        const int blen = (int)((at ? at : end) - nm), k = at ? atoi(at + 1) : 0;
        int calls = 0;
        for (int j = from; j < n1; j++) { /* the first call's calls of the same base */
            const char *o = l->v[j], *oh = strchr(o, '#'), *oe = oh ? oh : o + strlen(o), *oa = NULL;
            for (const char *p = o; p < oe; p++)
                if (*p == '@') oa = p;
            if ((int)((oa ? oa : oe) - o) == blen && !strncmp(o, nm, (size_t)blen)) {
                const int ok = oa ? atoi(oa + 1) : 0;
                if (ok + 1 > calls) calls = ok + 1;
            }
        }
        int rc = name(l, "%.*s@%d%s", blen, nm, k + calls, hash ? hash : "");
        if (rc) return rc;
    }
    return FS_OK;
}

int fs_record_names(const fs_config *cfg, int flags, fs_names *out, int *known, fs_err *e)
{
    memset(out, 0, sizeof *out);
    *known = 0;
    /* the family by its class name, as the config writes itself: no dependence on how the
     * struct tells families apart */
    char *js = fs_config_to_json(cfg);
    cJSON *root = js ? cJSON_Parse(js) : NULL;
    free(js);
    if (!root) return fs_errf(e, FS_E_NOMEM, "out of memory listing the model's module names");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(root, "_class_name");
    int (*fn)(const fs_config *, int, fs_names *) = NULL;
    for (size_t i = 0; i < sizeof families / sizeof *families; i++)
        if (cJSON_IsString(cn) && !strcmp(cn->valuestring, families[i].class_name)) fn = families[i].names;
    cJSON_Delete(root);
    if (!fn) return FS_OK;
    int rc;
    fs_names *l = out;
    const int true_cfg = flags & FS_NAMES_TRUE_CFG;
    if ((rc = name(l, "latents_in")) || (rc = fn(cfg, !!(flags & FS_NAMES_REF), l)) ||
        (true_cfg && (rc = negative_call_names(l, 1))) ||
        (rc = name(l, "latents_out"))) {
        fs_names_free(out);
        return fs_errf(e, FS_E_NOMEM, "out of memory listing the model's module names");
    }
    *known = 1;
    return FS_OK;
}
#undef NAME

int fs_select_check_model(const fs_select *s, const fs_config *cfg, int flags, fs_err *e)
{
    if (!s || !s->modules.n) return FS_OK;
    fs_names l;
    int known, rc = fs_record_names(cfg, flags, &l, &known, e);
    if (rc || !known) return rc;
    int hit = 0;
    for (int i = 0; i < l.n && !hit; i++)
        hit = strcmp(l.v[i], "latents_in") && strcmp(l.v[i], "latents_out") && fo_globs_match(&s->modules, l.v[i]);
    fs_names_free(&l);
    return hit ? FS_OK : no_match(s, e);
}

static int filter_begin(void *ctx, int step, double t, double sg, double sn, fs_err *e)
{
    fs_select_filter *f = ctx;
    f->step = step;
    if (!fs_select_step(f->sel, step) || !f->hooks.begin_step) return FS_OK;
    return f->hooks.begin_step(f->hooks.ctx, step, t, sg, sn, e);
}

static int filter_end(void *ctx, int step, fs_err *e)
{
    fs_select_filter *f = ctx;
    if (!fs_select_step(f->sel, step)) return FS_OK;
    if (f->rec.fn && f->sel && f->sel->modules.n && !f->matched) return no_match(f->sel, e);
    return f->hooks.end_step ? f->hooks.end_step(f->hooks.ctx, step, e) : FS_OK;
}

static int filter_record(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e)
{
    fs_select_filter *f = ctx;
    if (!fs_select_step(f->sel, f->step) || !fs_select_module(f->sel, name)) return FS_OK;
    if (strcmp(name, "latents_in") && strcmp(name, "latents_out")) f->matched++;
    return f->rec.fn(f->rec.ctx, name, t, sh, e);
}

void fs_select_filter_init(fs_select_filter *f, const fs_select *sel, fs_recorder rec, fs_step_hooks hooks)
{
    memset(f, 0, sizeof *f);
    f->sel = sel;
    f->rec = rec;
    f->hooks = hooks;
}

fs_recorder fs_select_filter_recorder(fs_select_filter *f)
{
    return (fs_recorder){.fn = f->rec.fn ? filter_record : NULL, .ctx = f};
}

fs_step_hooks fs_select_filter_hooks(fs_select_filter *f)
{
    return (fs_step_hooks){.begin_step = filter_begin, .end_step = filter_end, .ctx = f};
}
