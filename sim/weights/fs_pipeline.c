#include "fs_pipeline.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Is anything at p (a file, a directory, a FIFO, a symlink even dangling or looping)? Optional
 * files (model_index.json, config.json, scheduler_config.json) that are present but not a
 * regular file are errors (probe T8: a dangling symlink from a broken Hugging Face cache was
 * silently "absent", and the default schedule or config used instead). */
static int present(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

/* 1 present and a regular file, 0 absent, -1 present but not usable (error in *e) */
static int optional_file(const char *p, const char *what, fs_err *e)
{
    if (!present(p)) return 0;
    return fs_require_regular_file(p, what, e) ? -1 : 1;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* dir + "/" + name (no doubled slash), malloc'd; NULL when out of memory. */
static char *join(const char *dir, const char *name)
{
    char *p = NULL;
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (asprintf(&p, "%.*s/%s", (int)n, dir, name) < 0) return NULL;
    return p;
}

/* The directory a path is in ("." for a bare name), malloc'd. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* Does the directory hold safetensors weights of its own? */
static int holds_weights(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    for (struct dirent *de; !found && (de = readdir(d));)
        found = de->d_name[0] != '.' && (ends_with(de->d_name, ".safetensors") || ends_with(de->d_name, ".safetensors.index.json"));
    closedir(d);
    return found;
}

/* A small JSON file: a regular file of at most 1 MiB, no NUL, read without blocking on a FIFO. */
static int read_small(const char *path, const char *what, char **out, fs_err *e)
{
    char p[320];
    int rc = fs_read_text_file(path, what, "a JSON file flux-sim reads is at most", 1u << 20, out, e);
    if (rc && strchr(path, '\n')) /* the message names the path raw: keep it one line */
        fs_errf(e, rc, "%s: cannot read %s", fs_printable(path, p, sizeof p, 256), what);
    return rc;
}

static cJSON *parse_json(const char *text, const char *path, fs_err *e)
{
    const char *at = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &at, 1);
    if (!root) {
        char x[96];
        fs_errf(e, FS_E_INPUT, "%s: malformed JSON near '%s'", path,
                at && *at ? fs_printable_n(at, strnlen(at, 20), x, sizeof x, 20) : "(end of file)");
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        fs_errf(e, FS_E_INPUT, "%s: not a JSON object", path);
        return NULL;
    }
    return root;
}

/* model_index.json, when present, must name diffusers' FluxTransformer2DModel (FLUX.1) or
 * Flux2Transformer2DModel (FLUX.2) as "transformer" (another pipeline's folder would otherwise
 * fail later with a shape error). */
static int is_flux_class(const char *s)
{
    return !strcmp(s, "FluxTransformer2DModel") || !strcmp(s, "Flux2Transformer2DModel");
}

static int check_model_index(const char *root, fs_err *e)
{
    char *path = join(root, "model_index.json"), *text = NULL;
    if (!path) return fs_errf(e, FS_E_NOMEM, "out of memory");
    int rc = FS_OK, has = optional_file(path, "model_index.json", e);
    if (has <= 0) {
        rc = has < 0 ? FS_E_INPUT : FS_OK;
        goto out;
    }
    if ((rc = read_small(path, "model_index.json", &text, e))) goto out;
    cJSON *j = parse_json(text, path, e);
    if (!j) {
        rc = FS_E_INPUT;
        goto out;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "transformer");
    const cJSON *cls = cJSON_IsArray(t) ? cJSON_GetArrayItem(t, 1) : NULL;
    char cb[200];
    if (t && !(cJSON_IsString(cls) && is_flux_class(cls->valuestring)))
        rc = fs_errf(e, FS_E_INPUT, "%s: \"transformer\" is %s, not [\"diffusers\", \"FluxTransformer2DModel\"] or "
                                    "Flux2Transformer2DModel: not a FLUX pipeline",
                     path, cJSON_IsString(cls) ? fs_printable(cls->valuestring, cb, sizeof cb, 100)
                                               : "not a [library, class] pair");
    cJSON_Delete(j);
out:
    free(text);
    free(path);
    return rc;
}

void fs_pipeline_free(fs_pipeline *p)
{
    if (!p) return;
    free(p->weights);
    free(p->config);
    free(p->scheduler);
    free(p->root);
    memset(p, 0, sizeof *p);
}

/* A pipeline folder: a directory with transformer/ and no weights of its own. */
static int is_pipeline_root(const char *dir)
{
    if (!is_dir(dir) || holds_weights(dir)) return 0;
    char *t = join(dir, "transformer");
    int yes = t && is_dir(t);
    free(t);
    return yes;
}

int fs_pipeline_weights_path(const char *path, char **out, fs_err *e)
{
    *out = is_pipeline_root(path) ? join(path, "transformer") : strdup(path);
    return *out ? FS_OK : fs_errf(e, FS_E_NOMEM, "out of memory");
}

int fs_pipeline_resolve(fs_pipeline *p, const char *weights, fs_err *e)
{
    memset(p, 0, sizeof *p);
    char *wdir = NULL, *up = NULL, *mi = NULL;
    int rc = FS_OK;
    if (is_pipeline_root(weights)) {
        p->root = strdup(weights);
        p->weights = join(weights, "transformer");
        wdir = p->weights ? strdup(p->weights) : NULL;
    } else {
        p->weights = strdup(weights);
        wdir = is_dir(weights) ? strdup(weights) : dir_of(weights);
        /* the pipeline root one level up, recognised by its model_index.json */
        up = wdir ? join(wdir, "..") : NULL;
        mi = up ? join(up, "model_index.json") : NULL;
        /* only something named model_index.json makes DIR/.. a pipeline root; check_model_index
         * then refuses it if it is not a regular file */
        if (mi && present(mi) && !(p->root = strdup(up))) {
            rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            goto out;
        }
    }
    if (!p->weights || !wdir) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    char *cfg = join(wdir, "config.json");
    if (!cfg) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    int has = optional_file(cfg, "config.json", e);
    if (has > 0) p->config = cfg;
    else free(cfg);
    if (has < 0) {
        rc = FS_E_INPUT;
        goto out;
    }
    if (p->root) {
        if ((rc = check_model_index(p->root, e))) goto out;
        char *sd = join(p->root, "scheduler"), *sc = sd ? join(sd, "scheduler_config.json") : NULL;
        free(sd);
        if (!sc) {
            rc = fs_errf(e, FS_E_NOMEM, "out of memory");
            goto out;
        }
        int hs = optional_file(sc, "scheduler_config.json", e);
        if (hs > 0) p->scheduler = sc;
        else free(sc);
        if (hs < 0) {
            rc = FS_E_INPUT;
            goto out;
        }
    }
out:
    free(wdir);
    free(up);
    free(mi);
    if (rc) fs_pipeline_free(p);
    return rc;
}

int fs_pipeline_config_file(fs_config *c, const char *path, fs_err *e)
{
    char *text = NULL;
    int rc = read_small(path, "config.json", &text, e);
    if (rc) return rc;
    cJSON *j = parse_json(text, path, e);
    free(text);
    if (!j) return FS_E_INPUT;
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(j, "_class_name");
    if (cls && !(cJSON_IsString(cls) && is_flux_class(cls->valuestring))) {
        char cb[200];
        rc = fs_errf(e, FS_E_INPUT, "%s: _class_name is %s, not FluxTransformer2DModel or Flux2Transformer2DModel", path,
                     cJSON_IsString(cls) ? fs_printable(cls->valuestring, cb, sizeof cb, 100) : "not a string");
        cJSON_Delete(j);
        return rc;
    }
    /* diffusers' FluxTransformer2DModel(axes_dims_rope=(16, 56, 56)) default: the Hub's
     * FLUX.1-dev/schnell config.json files were written before the key existed. */
    if (!cJSON_GetObjectItemCaseSensitive(j, "axes_dims_rope") && !(cls && !strcmp(cls->valuestring, "Flux2Transformer2DModel"))) {
        const int def[3] = {16, 56, 56};
        cJSON_AddItemToObject(j, "axes_dims_rope", cJSON_CreateIntArray(def, 3));
    }
    char *fixed = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!fixed) return fs_errf(e, FS_E_NOMEM, "out of memory");
    rc = fs_config_from_json(c, fixed, path, e);
    free(fixed);
    return rc;
}

int fs_pipeline_load_config(fs_config *c, const char *arg, fs_err *e)
{
    int is_preset = 0;
    for (const char *const *n = fs_config_preset_names(); *n; n++) is_preset |= !strcmp(*n, arg);
    struct stat st;
    const int exists = stat(arg, &st) == 0;
    if (is_preset || (!strchr(arg, '/') && !strstr(arg, ".json") && !exists)) return fs_config_preset(c, arg, e);
    if (!exists) return fs_errf(e, FS_E_INPUT, "%s: cannot open config: %s", arg, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return fs_pipeline_config_file(c, arg, e);
    /* a transformer folder, or a pipeline folder */
    char *a = join(arg, "config.json"), *t = join(arg, "transformer"), *b = t ? join(t, "config.json") : NULL;
    int rc;
    if (!a || !b) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
    else if (present(a)) rc = fs_pipeline_config_file(c, a, e); /* refuses a FIFO, a directory... by name */
    else if (present(b)) rc = fs_pipeline_config_file(c, b, e);
    else rc = fs_errf(e, FS_E_INPUT, "%s: directory holds neither config.json nor transformer/config.json", arg);
    free(a);
    free(t);
    free(b);
    return rc;
}

/* ---- scheduler_config.json ---- */

/* A number in [lo, hi] (finite: 1e999 parses as inf). The ranges are fs_pipeline.h's. */
static int sched_number(const cJSON *j, const char *k, double lo, double hi, double *v, const char *path, fs_err *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, k);
    if (!it) return FS_OK;
    if (!cJSON_IsNumber(it)) return fs_errf(e, FS_E_INPUT, "%s: scheduler key '%s' is not a number", path, k);
    const double d = it->valuedouble;
    if (!(d >= lo && d <= hi))
        return fs_errf(e, FS_E_INPUT, "%s: scheduler key '%s' = %g is outside [%g, %g] (FLUX.1 uses %s)", path, k, d, lo,
                       hi, !strcmp(k, "shift") ? "1.0 (schnell) or 3.0 (dev)" : !strcmp(k, "base_shift") ? "0.5" : "1.15");
    *v = d;
    return FS_OK;
}

/* An integer in [1, hi], tested as a double before any cast (a float->int cast out of range is
 * undefined behaviour). */
static int sched_int(const cJSON *j, const char *k, int hi, int *v, const char *path, fs_err *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, k);
    if (!it) return FS_OK;
    const double d = cJSON_IsNumber(it) ? it->valuedouble : 0;
    if (!cJSON_IsNumber(it) || !(d >= 1 && d <= hi) || d != floor(d))
        return fs_errf(e, FS_E_INPUT, "%s: scheduler key '%s' is not an integer in [1, %d]", path, k, hi);
    *v = (int)d;
    return FS_OK;
}

/* A key flux-sim does not implement: fine when absent, null, false or the default string. */
static int sched_unsupported(const cJSON *j, const char *k, const char *default_str, const char *path, fs_err *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, k);
    if (!it || cJSON_IsNull(it) || cJSON_IsFalse(it)) return FS_OK;
    if (default_str && cJSON_IsString(it) && !strcmp(it->valuestring, default_str)) return FS_OK;
    char *v = cJSON_PrintUnformatted(it);
    int rc = fs_errf(e, FS_E_INPUT,
                     "%s: scheduler option %s = %.40s is not supported (flux-sim implements FLUX's "
                     "FlowMatchEulerDiscreteScheduler with its default sigmas and exponential shift only)",
                     path, k, v ? v : "?");
    free(v);
    return rc;
}

int fs_pipeline_sched_file(fs_sched_config *s, const char *path, fs_err *e)
{
    char *text = NULL;
    int rc = read_small(path, "scheduler_config.json", &text, e);
    if (rc) return rc;
    cJSON *j = parse_json(text, path, e);
    free(text);
    if (!j) return FS_E_INPUT;
    /* FlowMatchEulerDiscreteScheduler.__init__ defaults */
    fs_sched_config d = {.use_dynamic_shifting = 0, .shift = 1.0, .base_shift = 0.5, .max_shift = 1.15,
                         .base_image_seq_len = 256, .max_image_seq_len = 4096};
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(j, "_class_name");
    const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(j, "use_dynamic_shifting");
    int ntt = 1000;
    char cb[200];
    if (cls && !(cJSON_IsString(cls) && !strcmp(cls->valuestring, "FlowMatchEulerDiscreteScheduler")))
        rc = fs_errf(e, FS_E_INPUT, "%s: _class_name is %s, not FlowMatchEulerDiscreteScheduler", path,
                     cJSON_IsString(cls) ? fs_printable(cls->valuestring, cb, sizeof cb, 100) : "not a string");
    else if (dyn && !cJSON_IsBool(dyn))
        rc = fs_errf(e, FS_E_INPUT, "%s: scheduler key 'use_dynamic_shifting' is not a boolean", path);
    if (!rc) d.use_dynamic_shifting = dyn && cJSON_IsTrue(dyn);
    if (!rc) rc = sched_number(j, "shift", FS_SCHED_SHIFT_MIN, FS_SCHED_SHIFT_MAX, &d.shift, path, e);
    if (!rc) rc = sched_number(j, "base_shift", -FS_SCHED_MU_MAX, FS_SCHED_MU_MAX, &d.base_shift, path, e);
    if (!rc) rc = sched_number(j, "max_shift", -FS_SCHED_MU_MAX, FS_SCHED_MU_MAX, &d.max_shift, path, e);
    if (!rc) rc = sched_int(j, "base_image_seq_len", FS_SCHED_SEQ_MAX, &d.base_image_seq_len, path, e);
    if (!rc) rc = sched_int(j, "max_image_seq_len", FS_SCHED_SEQ_MAX, &d.max_image_seq_len, path, e);
    if (!rc) rc = sched_int(j, "num_train_timesteps", 1 << 30, &ntt, path, e);
    if (!rc && ntt != 1000)
        rc = fs_errf(e, FS_E_INPUT, "%s: num_train_timesteps = %d; flux-sim's timesteps assume FLUX's 1000", path, ntt);
    static const char *const unsupported[] = {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
                                              "invert_sigmas", "shift_terminal", "stochastic_sampling"};
    for (size_t i = 0; !rc && i < FS_ARRAY_LEN(unsupported); i++) rc = sched_unsupported(j, unsupported[i], NULL, path, e);
    if (!rc) rc = sched_unsupported(j, "time_shift_type", "exponential", path, e);
    if (!rc && d.use_dynamic_shifting && d.max_image_seq_len == d.base_image_seq_len)
        rc = fs_errf(e, FS_E_INPUT, "%s: max_image_seq_len equals base_image_seq_len (%d): the dynamic shift is undefined",
                     path, d.base_image_seq_len);
    /* the dynamic shift extrapolates mu linearly in the image token count: its exp() must stay
     * finite in float32 (FLT_MAX = e^88.7) for every grid up to FS_SCHED_MU_TOKENS tokens */
    if (!rc && d.use_dynamic_shifting) {
        const double m = (d.max_shift - d.base_shift) / (double)(d.max_image_seq_len - d.base_image_seq_len);
        const double mu1 = d.base_shift + m * (1.0 - d.base_image_seq_len),
                     mu2 = d.base_shift + m * ((double)FS_SCHED_MU_TOKENS - d.base_image_seq_len);
        if (!(fabs(mu1) <= FS_SCHED_MU_EXTRAPOLATED && fabs(mu2) <= FS_SCHED_MU_EXTRAPOLATED))
            rc = fs_errf(e, FS_E_INPUT,
                         "%s: the dynamic shift (base_shift %g at %d tokens, max_shift %g at %d) reaches mu = %g at %s "
                         "tokens; |mu| must stay <= %g (exp(mu) finite in float32) for grids of 1 to %d tokens",
                         path, d.base_shift, d.base_image_seq_len, d.max_shift, d.max_image_seq_len,
                         fabs(mu1) > fabs(mu2) ? mu1 : mu2, fabs(mu1) > fabs(mu2) ? "1" : "65536",
                         FS_SCHED_MU_EXTRAPOLATED, FS_SCHED_MU_TOKENS);
    }
    cJSON_Delete(j);
    if (!rc) *s = d;
    return rc;
}
