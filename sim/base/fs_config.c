#include "fs_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const preset_names[] = {"default", "flux-dev", "flux-schnell", "tiny", "odd", "flux2-dev",
                                           "flux2-klein-4b", "flux2-klein-9b", "flux2-default", "flux2-tiny", NULL};

const char *const *fs_config_preset_names(void) { return preset_names; }

int fs_config_preset(fs_config *c, const char *name, fs_err *e)
{
    memset(c, 0, sizeof *c);
    c->patch_size = 1;
    if (!strcmp(name, "flux-dev") || !strcmp(name, "flux-schnell")) {
        *c = (fs_config){.patch_size = 1, .in_channels = 64, .out_channels = 64, .num_layers = 19,
                         .num_single_layers = 38, .attention_head_dim = 128, .num_attention_heads = 24,
                         .joint_attention_dim = 4096, .pooled_projection_dim = 768,
                         .guidance_embeds = !strcmp(name, "flux-dev"), .axes_dims_rope = {16, 56, 56}};
    } else if (!strcmp(name, "default")) {
        /* The built-in demo model: FLUX.1's structure at a width a laptop runs in seconds.
         * 8 heads so TP/Ulysses degrees 1, 2, 4 and 8 all divide; guidance on, like dev. */
        *c = (fs_config){.patch_size = 1, .in_channels = 64, .out_channels = 64, .num_layers = 2,
                         .num_single_layers = 4, .attention_head_dim = 32, .num_attention_heads = 8,
                         .joint_attention_dim = 128, .pooled_projection_dim = 64, .guidance_embeds = 1,
                         .axes_dims_rope = {8, 12, 12}};
    } else if (!strcmp(name, "tiny")) { /* shapes of ../shared/reference/tiny */
        *c = (fs_config){.patch_size = 1, .in_channels = 16, .out_channels = 16, .num_layers = 2,
                         .num_single_layers = 4, .attention_head_dim = 32, .num_attention_heads = 4,
                         .joint_attention_dim = 64, .pooled_projection_dim = 32, .guidance_embeds = 1,
                         .axes_dims_rope = {8, 12, 12}};
    } else if (!strcmp(name, "odd")) { /* shapes of ../shared/reference/odd */
        *c = (fs_config){.patch_size = 1, .in_channels = 8, .out_channels = 8, .num_layers = 1,
                         .num_single_layers = 3, .attention_head_dim = 16, .num_attention_heads = 6,
                         .joint_attention_dim = 40, .pooled_projection_dim = 24, .guidance_embeds = 0,
                         .axes_dims_rope = {4, 6, 6}};
    } else if (!strncmp(name, "flux2-", 6)) {
        /* FLUX.2: diffusers' scripts/convert_flux2_to_diffusers.py get_flux2_transformer_config
         * (dev, klein-4b, klein-9b); flux2-tiny = ../shared/reference/flux2-tiny/config.json;
         * flux2-default the demo width, 8 heads like `default` */
        struct { const char *n; int in, L, SL, H, Dh, joint, g, ax; } f2[] = {
            {"flux2-dev", 128, 8, 48, 48, 128, 15360, 1, 32},  {"flux2-klein-4b", 128, 5, 20, 24, 128, 7680, 0, 32},
            {"flux2-klein-9b", 128, 8, 24, 32, 128, 12288, 0, 32}, {"flux2-tiny", 16, 2, 3, 4, 32, 48, 1, 8},
            {"flux2-default", 32, 2, 4, 8, 32, 128, 1, 8},
        };
        size_t i = 0;
        while (i < FS_ARRAY_LEN(f2) && strcmp(f2[i].n, name)) i++;
        if (i == FS_ARRAY_LEN(f2)) goto unknown;
        *c = (fs_config){.patch_size = 1, .in_channels = f2[i].in, .out_channels = f2[i].in, .num_layers = f2[i].L,
                         .num_single_layers = f2[i].SL, .attention_head_dim = f2[i].Dh,
                         .num_attention_heads = f2[i].H, .joint_attention_dim = f2[i].joint,
                         .guidance_embeds = f2[i].g, .family = FS_FLUX2, .n_axes = 4, .rope_theta = 2000,
                         .mlp_ratio = 3.0, .timestep_guidance_channels = 256, .eps = 1e-6,
                         .axes_dims_rope = {f2[i].ax, f2[i].ax, f2[i].ax, f2[i].ax}};
    } else {
        goto unknown;
    }
    if (c->family == FS_FLUX1) c->n_axes = 3;
    return FS_OK;
unknown:
    return fs_errf(e, FS_E_INPUT,
                   "unknown config preset '%s' (known: default, flux-dev, flux-schnell, tiny, odd, flux2-dev, "
                   "flux2-klein-4b, flux2-klein-9b, flux2-default, flux2-tiny)",
                   name);
}

/* Closed form of fs_config_params' element count (the unit tests compare the two). */
int64_t fs_config_num_params(const fs_config *c)
{
    if (c->family == FS_FLUX2) { /* no biases; see fs_config_params */
        const int64_t D = (int64_t)c->num_attention_heads * c->attention_head_dim, F = fs_config_mlp_hidden(c),
                      Dh = c->attention_head_dim, tg = c->timestep_guidance_channels;
        int64_t top = (int64_t)c->in_channels * D + (int64_t)c->joint_attention_dim * D + tg * D + D * D +
                      (c->guidance_embeds ? tg * D + D * D : 0) + 2 * 6 * D * D + 3 * D * D;
        int64_t dbl = 8 * D * D + 4 * Dh + 2 * (2 * F * D + F * D);
        int64_t sgl = (3 * D + 2 * F) * D + 2 * Dh + (D + F) * D;
        int64_t head = 2 * D * D + D * (int64_t)c->patch_size * c->patch_size * c->out_channels;
        return top + c->num_layers * dbl + c->num_single_layers * sgl + head;
    }
    const int64_t D = (int64_t)c->num_attention_heads * c->attention_head_dim, F = 4 * D,
                  Dh = c->attention_head_dim;
#define LIN(in, out) ((int64_t)(in) * (out) + (out))
    int64_t top = LIN(c->in_channels, D) + LIN(c->joint_attention_dim, D) + LIN(256, D) + LIN(D, D) +
                  (c->guidance_embeds ? LIN(256, D) + LIN(D, D) : 0) + LIN(c->pooled_projection_dim, D) + LIN(D, D);
    int64_t dbl = 2 * LIN(D, 6 * D) + 8 * LIN(D, D) + 4 * Dh + 2 * (LIN(D, F) + LIN(F, D));
    int64_t sgl = LIN(D, 3 * D) + 3 * LIN(D, D) + 2 * Dh + LIN(D, F) + LIN(D + F, D);
    int64_t head = LIN(D, 2 * D) + LIN(D, (int64_t)c->patch_size * c->patch_size * c->out_channels);
#undef LIN
    return top + c->num_layers * dbl + c->num_single_layers * sgl + head;
}

int fs_config_validate(const fs_config *c, const char *origin, fs_err *e)
{
    /* Each size against its range first; only then derived sizes, which cannot overflow once
     * their factors are in range (fs_config.h). */
    struct { const char *k; int v, lo, hi; const char *flux; } lim[] = {
        {"patch_size", c->patch_size, 1, 1, "1"},
        {"in_channels", c->in_channels, 1, FS_CONFIG_MAX_WIDTH, "64"},
        {"out_channels", c->out_channels, 1, FS_CONFIG_MAX_WIDTH, "64"},
        {"num_layers", c->num_layers, 0, FS_CONFIG_MAX_LAYERS, "19"},
        {"num_single_layers", c->num_single_layers, 0, FS_CONFIG_MAX_LAYERS, "38"},
        {"attention_head_dim", c->attention_head_dim, 1, FS_CONFIG_MAX_HEAD_DIM, "128"},
        {"num_attention_heads", c->num_attention_heads, 1, FS_CONFIG_MAX_HEADS, "24"},
        {"joint_attention_dim", c->joint_attention_dim, 1, FS_CONFIG_MAX_WIDTH, "4096"},
        /* FLUX.2 has no pooled vector (0); its sinusoid width is configurable */
        {"pooled_projection_dim", c->pooled_projection_dim, c->family == FS_FLUX2 ? 0 : 1, FS_CONFIG_MAX_WIDTH, "768"},
        {"timestep_guidance_channels", fs_config_time_channels(c), 2, FS_CONFIG_MAX_WIDTH, "256"},
        {"len(axes_dims_rope)", fs_config_axes(c), c->family == FS_FLUX2 ? 1 : 3, c->family == FS_FLUX2 ? FS_MAX_AXES : 3,
         "3 (FLUX.2: 4)"},
    };
    if (c->family != FS_FLUX1 && c->family != FS_FLUX2)
        return fs_errf(e, FS_E_INPUT, "%s: config family %d is neither FLUX.1 nor FLUX.2", origin, (int)c->family);
    for (size_t i = 0; i < FS_ARRAY_LEN(lim); i++) {
        if (lim[i].v >= lim[i].lo && lim[i].v <= lim[i].hi) continue;
        if (!strcmp(lim[i].k, "patch_size"))
            return fs_errf(e, FS_E_INPUT, "%s: config patch_size = %d; FLUX.1 uses 1 and flux-sim supports only 1",
                           origin, c->patch_size);
        if (lim[i].v < lim[i].lo)
            return fs_errf(e, FS_E_INPUT, "%s: config %s = %d, must be >= %d", origin, lim[i].k, lim[i].v, lim[i].lo);
        return fs_errf(e, FS_E_INPUT, "%s: config %s = %d exceeds flux-sim's limit of %d (FLUX.1 has %s)", origin,
                       lim[i].k, lim[i].v, lim[i].hi, lim[i].flux);
    }
    /* The Euler update adds the transformer's output (out_channels per token) to the latents
     * (in_channels per token) element by element: different widths would read past the end of
     * the output, silently. FluxPipeline needs them equal; FLUX configs leave out_channels null. */
    if (c->out_channels != c->in_channels)
        return fs_errf(e, FS_E_INPUT,
                       "%s: config out_channels = %d differs from in_channels = %d; the sampler adds the output to "
                       "the latents, so they must be equal (or out_channels null)",
                       origin, c->out_channels, c->in_channels);
    if (c->family == FS_FLUX2) {
        /* the sinusoid is [cos | sin] of channels/2 frequencies; diffusers pads an odd width with a
         * zero column, which no FLUX.2 uses: refused rather than silently half-supported */
        if (c->timestep_guidance_channels % 2)
            return fs_errf(e, FS_E_INPUT, "%s: config timestep_guidance_channels = %d must be even", origin,
                           c->timestep_guidance_channels);
        if (!(c->mlp_ratio > 0 && c->mlp_ratio <= 16))
            return fs_errf(e, FS_E_INPUT, "%s: config mlp_ratio = %g, must be in (0, 16] (FLUX.2 has 3.0)", origin,
                           c->mlp_ratio);
        /* a plausibility limit like the others: FLUX uses 10^4 and 2000; beyond 10^9 every axis'
         * frequencies underflow to a constant rotation */
        if (c->rope_theta < 1 || c->rope_theta > 1000000000)
            return fs_errf(e, FS_E_INPUT, "%s: config rope_theta = %d, must be in [1, 1e9] (FLUX.2 has 2000)", origin,
                           c->rope_theta);
        if (!(c->eps > 0 && c->eps < 1))
            return fs_errf(e, FS_E_INPUT, "%s: config eps = %g, must be in (0, 1) (FLUX.2 has 1e-06)", origin, c->eps);
    }
    /* fields the family does not have must be empty: a value there is a struct filled by mistake
     * (or a FLUX.2 config read as FLUX.1), never something to ignore */
    for (int i = fs_config_axes(c); i < FS_MAX_AXES; i++)
        if (c->axes_dims_rope[i])
            return fs_errf(e, FS_E_INPUT, "%s: config axes_dims_rope[%d] = %d beyond its %d axes", origin, i,
                           c->axes_dims_rope[i], fs_config_axes(c));
    if (c->family == FS_FLUX2 && c->pooled_projection_dim)
        return fs_errf(e, FS_E_INPUT, "%s: a FLUX.2 config with pooled_projection_dim = %d (FLUX.2 has no pooled vector)",
                       origin, c->pooled_projection_dim);
    if (c->family == FS_FLUX1 && (c->rope_theta || c->timestep_guidance_channels || c->mlp_ratio != 0 || c->eps != 0))
        return fs_errf(e, FS_E_INPUT, "%s: a FLUX.1 config with FLUX.2's rope_theta/timestep_guidance_channels/"
                                      "mlp_ratio/eps set (FLUX.1 fixes them; _class_name Flux2Transformer2DModel?)",
                       origin);
    if (c->guidance_embeds != 0 && c->guidance_embeds != 1)
        return fs_errf(e, FS_E_INPUT, "%s: config guidance_embeds = %d, must be 0 or 1", origin, c->guidance_embeds);
    int sum = 0;
    for (int i = 0; i < fs_config_axes(c); i++) {
        const int a = c->axes_dims_rope[i];
        if (a <= 0 || a % 2 || a > FS_CONFIG_MAX_HEAD_DIM)
            return fs_errf(e, FS_E_INPUT, "%s: config axes_dims_rope[%d] = %d, must be positive, even and <= %d", origin,
                           i, a, FS_CONFIG_MAX_HEAD_DIM);
        sum += a; /* <= 4 * 1024 */
    }
    if (sum != c->attention_head_dim)
        return fs_errf(e, FS_E_INPUT, "%s: config axes_dims_rope sums to %d but attention_head_dim is %d", origin, sum,
                       c->attention_head_dim);
    const int64_t hidden = (int64_t)c->num_attention_heads * c->attention_head_dim;
    if (hidden > FS_CONFIG_MAX_WIDTH)
        return fs_errf(e, FS_E_INPUT,
                       "%s: config num_attention_heads x attention_head_dim = %d x %d = %lld hidden features exceeds "
                       "flux-sim's limit of %d (FLUX.1 has 3072)",
                       origin, c->num_attention_heads, c->attention_head_dim, (long long)hidden, FS_CONFIG_MAX_WIDTH);
    if (c->family == FS_FLUX2 && fs_config_mlp_hidden(c) < 1)
        return fs_errf(e, FS_E_INPUT, "%s: config mlp_ratio = %g gives an MLP of width int(%lld x %g) = 0", origin,
                       c->mlp_ratio, (long long)hidden, c->mlp_ratio);
    const int64_t np = fs_config_num_params(c);
    if (np > FS_CONFIG_MAX_PARAMS)
        return fs_errf(e, FS_E_INPUT,
                       "%s: config describes a model of %.3g parameters (hidden %lld, %d double + %d single blocks), "
                       "above flux-sim's limit of %.0e (FLUX.1 has 1.19e10)",
                       origin, (double)np, (long long)hidden, c->num_layers, c->num_single_layers,
                       (double)FS_CONFIG_MAX_PARAMS);
    return FS_OK;
}

/* An integer-valued JSON number inside int. cJSON keeps numbers as doubles: "3.1e79", "1e999"
 * (inf) or "8.9" must be refused here, since casting them to int is undefined or truncates. */
static int json_to_int(const cJSON *it, int *out)
{
    if (!cJSON_IsNumber(it)) return 0;
    const double d = it->valuedouble;
    if (!(d >= (double)INT_MIN && d <= (double)INT_MAX) || d != floor(d)) return 0;
    *out = (int)d;
    return 1;
}

/* A number for an error message: JSON text is arbitrary, so print the value cJSON parsed. */
static const char *num_str(const cJSON *it, char *buf, size_t n)
{
    if (cJSON_IsNumber(it)) snprintf(buf, n, "%.15g", it->valuedouble);
    else snprintf(buf, n, "%s", cJSON_IsString(it) ? "a string" : cJSON_IsBool(it) ? "a boolean" :
                                cJSON_IsArray(it) ? "an array" : cJSON_IsObject(it) ? "an object" : "not a number");
    return buf;
}

static int json_int(const cJSON *root, const char *key, int *out, int required, const char *origin, fs_err *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || cJSON_IsNull(it)) {
        if (required) return fs_errf(e, FS_E_INPUT, "%s: config key '%s' missing", origin, key);
        return FS_OK;
    }
    char nb[48];
    if (!json_to_int(it, out))
        return fs_errf(e, FS_E_INPUT, "%s: config key '%s' is %s, not an integer in the range of int", origin, key,
                       num_str(it, nb, sizeof nb));
    return FS_OK;
}

/* A short printable excerpt for "malformed JSON near '...'": the text may hold newlines or
 * binary bytes that must not turn a one-line error into several. */
static const char *excerpt(const char *p, char *buf, size_t n)
{
    size_t o = 0;
    for (; p && *p && o + 1 < n && o < 20; p++) buf[o++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
    buf[o] = 0;
    return buf;
}

int fs_config_from_json(fs_config *c, const char *json, const char *origin, fs_err *e)
{
    memset(c, 0, sizeof *c);
    const char *at = NULL; /* not cJSON_GetErrorPtr(): a global */
    /* require_null_terminated: text after the object (a concatenated or damaged file) is an error */
    cJSON *root = cJSON_ParseWithOpts(json, &at, 1);
    if (!root) {
        char xb[32];
        return fs_errf(e, FS_E_INPUT, "%s: malformed JSON %s%s%s", origin, at && *at ? "near '" : "(ends too early)",
                       at && *at ? excerpt(at, xb, sizeof xb) : "", at && *at ? "'" : "");
    }
    int rc = FS_OK;
    if (!cJSON_IsObject(root)) {
        rc = fs_errf(e, FS_E_INPUT, "%s: config is not a JSON object", origin);
        goto out;
    }
    /* the family: _class_name as diffusers writes it; without one, FLUX.1 (older flux-sim dumps
     * and hand-written configs) */
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(root, "_class_name");
    if (cls && !cJSON_IsNull(cls)) {
        if (!cJSON_IsString(cls) || (strcmp(cls->valuestring, "FluxTransformer2DModel") &&
                                     strcmp(cls->valuestring, "Flux2Transformer2DModel"))) {
            char xb[32];
            rc = fs_errf(e, FS_E_INPUT,
                         "%s: config _class_name '%s' is not a FLUX transformer (FluxTransformer2DModel, "
                         "Flux2Transformer2DModel)", origin, cJSON_IsString(cls) ? excerpt(cls->valuestring, xb, sizeof xb) : "?");
            goto out;
        }
        if (!strcmp(cls->valuestring, "Flux2Transformer2DModel")) c->family = FS_FLUX2;
    }
    const int f2 = c->family == FS_FLUX2;
    c->patch_size = 1;
    c->out_channels = 0;
    if (f2) { /* Flux2Transformer2DModel.__init__'s defaults (FLUX.2 [dev]): diffusers applies them
                 to every key a config.json leaves out, so flux-sim does too */
        /* field by field: c was memset, so its padding stays zero (fuzz_config compares bytes) */
        c->in_channels = 128;
        c->num_layers = 8;
        c->num_single_layers = 48;
        c->attention_head_dim = 128;
        c->num_attention_heads = 48;
        c->joint_attention_dim = 15360;
        c->timestep_guidance_channels = 256;
        c->mlp_ratio = 3.0;
        c->rope_theta = 2000;
        c->eps = 1e-6;
        c->guidance_embeds = 1;
        c->n_axes = 4;
        for (int i = 0; i < 4; i++) c->axes_dims_rope[i] = 32;
    }
    struct { const char *k; int *v; int req; } keys[] = {
        {"patch_size", &c->patch_size, 0},
        {"in_channels", &c->in_channels, !f2},
        {"out_channels", &c->out_channels, 0},
        {"num_layers", &c->num_layers, !f2},
        {"num_single_layers", &c->num_single_layers, !f2},
        {"attention_head_dim", &c->attention_head_dim, !f2},
        {"num_attention_heads", &c->num_attention_heads, !f2},
        {"joint_attention_dim", &c->joint_attention_dim, !f2},
        {f2 ? "timestep_guidance_channels" : "pooled_projection_dim", f2 ? &c->timestep_guidance_channels : &c->pooled_projection_dim, !f2},
    };
    for (size_t i = 0; i < FS_ARRAY_LEN(keys); i++)
        if ((rc = json_int(root, keys[i].k, keys[i].v, keys[i].req, origin, e))) goto out;
    if (c->out_channels == 0) c->out_channels = c->in_channels; /* diffusers: out_channels or in_channels */
    if (f2) {
        if ((rc = json_int(root, "rope_theta", &c->rope_theta, 0, origin, e))) goto out;
        struct { const char *k; double *v; } reals[] = {{"mlp_ratio", &c->mlp_ratio}, {"eps", &c->eps}};
        for (size_t i = 0; i < FS_ARRAY_LEN(reals); i++) {
            const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, reals[i].k);
            if (!it || cJSON_IsNull(it)) continue;
            char nb[48];
            if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) {
                rc = fs_errf(e, FS_E_INPUT, "%s: config key '%s' is %s, not a finite number", origin, reals[i].k,
                             num_str(it, nb, sizeof nb));
                goto out;
            }
            *reals[i].v = it->valuedouble;
        }
    }
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(root, "guidance_embeds");
    if (f2 && !g) {
        /* default kept */
    } else if (!g || !cJSON_IsBool(g)) {
        rc = fs_errf(e, FS_E_INPUT, "%s: config key 'guidance_embeds' missing or not a boolean", origin);
        goto out;
    } else {
        c->guidance_embeds = cJSON_IsTrue(g);
    }
    const cJSON *ax = cJSON_GetObjectItemCaseSensitive(root, "axes_dims_rope");
    const int max_ax = f2 ? FS_MAX_AXES : 3;
    if (f2 && !ax) goto validate;
    if (!ax || !cJSON_IsArray(ax) || (f2 ? (cJSON_GetArraySize(ax) < 1 || cJSON_GetArraySize(ax) > max_ax)
                                         : cJSON_GetArraySize(ax) != 3)) {
        rc = fs_errf(e, FS_E_INPUT, "%s: config key 'axes_dims_rope' must be an array of %s integers", origin,
                     f2 ? "1 to 4" : "3");
        goto out;
    }
    c->n_axes = cJSON_GetArraySize(ax);
    memset(c->axes_dims_rope, 0, sizeof c->axes_dims_rope);
    for (int i = 0; i < c->n_axes; i++) {
        const cJSON *v = cJSON_GetArrayItem(ax, i);
        char nb[48];
        /* not valueint: cJSON truncates 8.9 to 8 and saturates 1e99 there */
        if (!json_to_int(v, &c->axes_dims_rope[i])) {
            rc = fs_errf(e, FS_E_INPUT, "%s: config axes_dims_rope[%d] is %s, not an integer in the range of int",
                         origin, i, num_str(v, nb, sizeof nb));
            goto out;
        }
    }
validate:
    rc = fs_config_validate(c, origin, e);
out:
    cJSON_Delete(root);
    return rc;
}

/* A config.json is a few hundred bytes; 1 MiB leaves room for any comment-heavy variant while
 * keeping a wrong path (a checkpoint, /dev/zero) from being read into memory. */
#define FS_CONFIG_MAX_FILE (1 << 20)

int fs_config_from_file(fs_config *c, const char *path, fs_err *e)
{
    memset(c, 0, sizeof *c);
    char *buf;
    int rc = fs_read_text_file(path, "config", "a config.json is at most", FS_CONFIG_MAX_FILE, &buf, e);
    if (rc) return rc;
    rc = fs_config_from_json(c, buf, path, e);
    free(buf);
    return rc;
}

char *fs_config_to_json(const fs_config *c)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "_class_name", fs_config_class_name(c));
    /* the keys both families' configs start with, in diffusers' order */
    cJSON_AddNumberToObject(r, "patch_size", c->patch_size);
    cJSON_AddNumberToObject(r, "in_channels", c->in_channels);
    cJSON_AddNumberToObject(r, "out_channels", c->out_channels);
    cJSON_AddNumberToObject(r, "num_layers", c->num_layers);
    cJSON_AddNumberToObject(r, "num_single_layers", c->num_single_layers);
    cJSON_AddNumberToObject(r, "attention_head_dim", c->attention_head_dim);
    cJSON_AddNumberToObject(r, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(r, "joint_attention_dim", c->joint_attention_dim);
    if (c->family == FS_FLUX2) { /* then Flux2Transformer2DModel's own */
        cJSON_AddNumberToObject(r, "timestep_guidance_channels", c->timestep_guidance_channels);
        cJSON_AddNumberToObject(r, "mlp_ratio", c->mlp_ratio);
        cJSON_AddItemToObject(r, "axes_dims_rope", cJSON_CreateIntArray(c->axes_dims_rope, fs_config_axes(c)));
        cJSON_AddNumberToObject(r, "rope_theta", c->rope_theta);
        cJSON_AddNumberToObject(r, "eps", c->eps);
        cJSON_AddBoolToObject(r, "guidance_embeds", c->guidance_embeds);
    } else {
        cJSON_AddNumberToObject(r, "pooled_projection_dim", c->pooled_projection_dim);
        cJSON_AddBoolToObject(r, "guidance_embeds", c->guidance_embeds);
        cJSON_AddItemToObject(r, "axes_dims_rope", cJSON_CreateIntArray(c->axes_dims_rope, 3));
    }
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}

/* ---- parameter list ---- */

typedef struct plist {
    fs_param_desc *p;
    int n, cap;
} plist;

static void add(plist *l, fs_param_kind kind, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void add(plist *l, fs_param_kind kind, int64_t d0, int64_t d1, const char *fmt, ...)
{
    if (!l->p) return; /* an earlier allocation failed */
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        fs_param_desc *np = realloc(l->p, (size_t)l->cap * sizeof *np);
        if (!np) {
            free(l->p);
            l->p = NULL;
            return;
        }
        l->p = np;
    }
    fs_param_desc *d = &l->p[l->n++];
    memset(d, 0, sizeof *d);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->name, sizeof d->name, fmt, ap);
    va_end(ap);
    d->kind = kind;
    d->shape[0] = d0;
    d->shape[1] = d1;
    d->ndim = kind == FS_PARAM_LINEAR_W ? 2 : 1;
}

/* A Linear(in -> out) with bias: "<prefix>.weight" [out, in] and "<prefix>.bias" [out]. */
static void add_linear(plist *l, int64_t in, int64_t out, const char *prefix)
{
    add(l, FS_PARAM_LINEAR_W, out, in, "%s.weight", prefix);
    add(l, FS_PARAM_BIAS, out, 0, "%s.bias", prefix);
}

/* A Linear(in -> out) without bias (every Linear of FLUX.2): "<prefix>.weight" [out, in]. */
static void add_weight(plist *l, int64_t in, int64_t out, const char *prefix)
{
    add(l, FS_PARAM_LINEAR_W, out, in, "%s.weight", prefix);
}

/* Flux2Transformer2DModel's state_dict (55 tensors for flux2-tiny): no biases anywhere; the
 * modulation linears are shared by all blocks of a stream; SwiGLU linear_in is [gate | up]
 * (2·F rows); the single block's to_qkv_mlp_proj is [q | k | v | gate | up] (3·D + 2·F rows) and
 * its to_out reads cat[attn, mlp] (D + F columns). */
static void flux2_params(plist *l, const fs_config *c)
{
    const int64_t D = fs_config_hidden(c), F = fs_config_mlp_hidden(c), Dh = c->attention_head_dim,
                  tg = c->timestep_guidance_channels;
    char pre[128];
    add_weight(l, c->in_channels, D, "x_embedder");
    add_weight(l, c->joint_attention_dim, D, "context_embedder");
    add_weight(l, tg, D, "time_guidance_embed.timestep_embedder.linear_1");
    add_weight(l, D, D, "time_guidance_embed.timestep_embedder.linear_2");
    if (c->guidance_embeds) {
        add_weight(l, tg, D, "time_guidance_embed.guidance_embedder.linear_1");
        add_weight(l, D, D, "time_guidance_embed.guidance_embedder.linear_2");
    }
    add_weight(l, D, 6 * D, "double_stream_modulation_img.linear");
    add_weight(l, D, 6 * D, "double_stream_modulation_txt.linear");
    add_weight(l, D, 3 * D, "single_stream_modulation.linear");
    for (int i = 0; i < c->num_layers; i++) {
        static const char *const lin[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj",
                                          "attn.add_k_proj", "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out"};
        for (size_t k = 0; k < FS_ARRAY_LEN(lin); k++) {
            snprintf(pre, sizeof pre, "transformer_blocks.%d.%s", i, lin[k]);
            add_weight(l, D, D, pre);
        }
        static const char *const rms[] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
        for (size_t k = 0; k < FS_ARRAY_LEN(rms); k++)
            add(l, FS_PARAM_RMS_W, Dh, 0, "transformer_blocks.%d.attn.%s.weight", i, rms[k]);
        static const char *const ffs[] = {"ff", "ff_context"};
        for (size_t k = 0; k < 2; k++) {
            snprintf(pre, sizeof pre, "transformer_blocks.%d.%s.linear_in", i, ffs[k]);
            add_weight(l, D, 2 * F, pre);
            snprintf(pre, sizeof pre, "transformer_blocks.%d.%s.linear_out", i, ffs[k]);
            add_weight(l, F, D, pre);
        }
    }
    for (int i = 0; i < c->num_single_layers; i++) {
        snprintf(pre, sizeof pre, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", i);
        add_weight(l, D, 3 * D + 2 * F, pre);
        add(l, FS_PARAM_RMS_W, Dh, 0, "single_transformer_blocks.%d.attn.norm_q.weight", i);
        add(l, FS_PARAM_RMS_W, Dh, 0, "single_transformer_blocks.%d.attn.norm_k.weight", i);
        snprintf(pre, sizeof pre, "single_transformer_blocks.%d.attn.to_out", i);
        add_weight(l, D + F, D, pre);
    }
    add_weight(l, D, 2 * D, "norm_out.linear");
    add_weight(l, D, fs_config_out_width(c), "proj_out");
}

fs_param_desc *fs_config_params(const fs_config *c, int *n)
{
    plist l = {.p = malloc(256 * sizeof(fs_param_desc)), .n = 0, .cap = 256};
    if (c->family == FS_FLUX2) {
        flux2_params(&l, c);
        *n = l.n;
        return l.p;
    }
    const int64_t D = fs_config_hidden(c), F = fs_config_mlp_hidden(c), Dh = c->attention_head_dim;
    char pre[128];

    add_linear(&l, c->in_channels, D, "x_embedder");
    add_linear(&l, c->joint_attention_dim, D, "context_embedder");
    add_linear(&l, 256, D, "time_text_embed.timestep_embedder.linear_1");
    add_linear(&l, D, D, "time_text_embed.timestep_embedder.linear_2");
    if (c->guidance_embeds) {
        add_linear(&l, 256, D, "time_text_embed.guidance_embedder.linear_1");
        add_linear(&l, D, D, "time_text_embed.guidance_embedder.linear_2");
    }
    add_linear(&l, c->pooled_projection_dim, D, "time_text_embed.text_embedder.linear_1");
    add_linear(&l, D, D, "time_text_embed.text_embedder.linear_2");

    for (int i = 0; i < c->num_layers; i++) {
        static const char *const lin[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj",
                                          "attn.add_k_proj", "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out"};
        snprintf(pre, sizeof pre, "transformer_blocks.%d.norm1.linear", i);
        add_linear(&l, D, 6 * D, pre);
        snprintf(pre, sizeof pre, "transformer_blocks.%d.norm1_context.linear", i);
        add_linear(&l, D, 6 * D, pre);
        for (size_t k = 0; k < FS_ARRAY_LEN(lin); k++) {
            snprintf(pre, sizeof pre, "transformer_blocks.%d.%s", i, lin[k]);
            add_linear(&l, D, D, pre);
        }
        static const char *const rms[] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
        for (size_t k = 0; k < FS_ARRAY_LEN(rms); k++)
            add(&l, FS_PARAM_RMS_W, Dh, 0, "transformer_blocks.%d.attn.%s.weight", i, rms[k]);
        static const char *const ffs[] = {"ff", "ff_context"};
        for (size_t k = 0; k < 2; k++) {
            snprintf(pre, sizeof pre, "transformer_blocks.%d.%s.net.0.proj", i, ffs[k]);
            add_linear(&l, D, F, pre);
            snprintf(pre, sizeof pre, "transformer_blocks.%d.%s.net.2", i, ffs[k]);
            add_linear(&l, F, D, pre);
        }
    }
    for (int i = 0; i < c->num_single_layers; i++) {
        snprintf(pre, sizeof pre, "single_transformer_blocks.%d.norm.linear", i);
        add_linear(&l, D, 3 * D, pre);
        static const char *const qkv[] = {"attn.to_q", "attn.to_k", "attn.to_v"};
        for (size_t k = 0; k < 3; k++) {
            snprintf(pre, sizeof pre, "single_transformer_blocks.%d.%s", i, qkv[k]);
            add_linear(&l, D, D, pre);
        }
        add(&l, FS_PARAM_RMS_W, Dh, 0, "single_transformer_blocks.%d.attn.norm_q.weight", i);
        add(&l, FS_PARAM_RMS_W, Dh, 0, "single_transformer_blocks.%d.attn.norm_k.weight", i);
        snprintf(pre, sizeof pre, "single_transformer_blocks.%d.proj_mlp", i);
        add_linear(&l, D, F, pre);
        snprintf(pre, sizeof pre, "single_transformer_blocks.%d.proj_out", i);
        add_linear(&l, D + F, D, pre);
    }
    add_linear(&l, D, 2 * D, "norm_out.linear");
    add_linear(&l, D, fs_config_out_width(c), "proj_out");
    *n = l.n;
    return l.p;
}

int fs_param_find(const fs_param_desc *p, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(p[i].name, name)) return i;
    return -1;
}
