/* fo_config.c — config checks and comparison (see fo_config.h). */
#include "fo_config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const model_keys[] = {"patch_size",          "in_channels",           "out_channels",
                                         "num_layers",          "num_single_layers",     "attention_head_dim",
                                         "num_attention_heads", "joint_attention_dim",   "pooled_projection_dim",
                                         "guidance_embeds",     "axes_dims_rope"};

/* Printable excerpt of where cJSON stopped: the attribute of a damaged file may hold binary. */
static void excerpt(const char *p, char *buf, size_t n)
{
    size_t o = 0;
    for (; p && *p && o + 1 < n && o < 24; p++) buf[o++] = (*p >= 0x20 && *p < 0x7f && *p != '\'') ? *p : '?';
    buf[o] = 0;
}

static int parse_obj(const char *json, const char *origin, cJSON **out, fs_err *e)
{
    *out = NULL;
    const char *end = NULL;
    cJSON *c = json ? cJSON_ParseWithOpts(json, &end, 1) : NULL;
    if (!c) {
        char ex[32];
        excerpt(end ? end : json, ex, sizeof ex);
        return fs_errf(e, FS_E_INPUT, "%s: attribute config is not valid JSON (near '%s')", origin, ex);
    }
    if (!cJSON_IsObject(c)) {
        cJSON_Delete(c);
        return fs_errf(e, FS_E_INPUT, "%s: attribute config is JSON but not an object", origin);
    }
    *out = c;
    return FS_OK;
}

int fo_config_check(const char *json, const char *origin, fs_err *e)
{
    cJSON *c;
    int rc = parse_obj(json, origin, &c, e);
    cJSON_Delete(c);
    return rc;
}

/* The value of `key` normalised for comparison: out_channels null/absent -> in_channels. */
static const cJSON *value_of(const cJSON *c, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, key);
    if (!strcmp(key, "out_channels") && (!v || cJSON_IsNull(v))) return cJSON_GetObjectItemCaseSensitive(c, "in_channels");
    return v;
}

/* Numbers, booleans (as 0/1), null, strings, arrays of those: equal in value. */
static int same_value(const cJSON *a, const cJSON *b, int depth)
{
    if (!a || !b) return a == b;
    if (depth > 8) return 0;
    int na = cJSON_IsNumber(a) || cJSON_IsBool(a), nb = cJSON_IsNumber(b) || cJSON_IsBool(b);
    if (na && nb) {
        double x = cJSON_IsBool(a) ? (double)cJSON_IsTrue(a) : a->valuedouble;
        double y = cJSON_IsBool(b) ? (double)cJSON_IsTrue(b) : b->valuedouble;
        return x == y;
    }
    if (cJSON_IsNull(a) || cJSON_IsNull(b)) return cJSON_IsNull(a) && cJSON_IsNull(b);
    if (cJSON_IsString(a) && cJSON_IsString(b)) return !strcmp(a->valuestring, b->valuestring);
    if (cJSON_IsArray(a) && cJSON_IsArray(b)) {
        if (cJSON_GetArraySize(a) != cJSON_GetArraySize(b)) return 0;
        const cJSON *x = a->child, *y = b->child;
        for (; x && y; x = x->next, y = y->next)
            if (!same_value(x, y, depth + 1)) return 0;
        return 1;
    }
    return 0;
}

/* A short printable form of a value ("2", "true", "[8, 12, 12]", "(absent)"). */
static void show(const cJSON *v, char *buf, size_t n)
{
    if (!v) {
        snprintf(buf, n, "(absent)");
        return;
    }
    char *t = cJSON_PrintUnformatted(v);
    if (!t) {
        snprintf(buf, n, "?");
        return;
    }
    /* cJSON prints [8,12,12]; readable and bounded, printable characters only */
    size_t o = 0;
    for (const char *p = t; *p && o + 2 < n && o < 40; p++) {
        buf[o++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
        if (*p == ',' && o + 2 < n) buf[o++] = ' ';
    }
    buf[o] = 0;
    cJSON_free(t);
}

int fo_config_compare(const char *ja, const char *origin_a, const char *jb, const char *origin_b, int *same, char *why,
                      size_t n, fs_err *e)
{
    *same = 0;
    if (why && n) why[0] = 0;
    cJSON *a = NULL, *b = NULL;
    int rc = parse_obj(ja, origin_a, &a, e);
    if (!rc) rc = parse_obj(jb, origin_b, &b, e);
    if (rc) {
        cJSON_Delete(a);
        cJSON_Delete(b);
        return rc;
    }
    size_t o = 0;
    int diffs = 0;
    for (size_t k = 0; k < FS_ARRAY_LEN(model_keys); k++) {
        const cJSON *x = value_of(a, model_keys[k]), *y = value_of(b, model_keys[k]);
        if (same_value(x, y, 0)) continue;
        diffs++;
        if (why && o < n) {
            char sx[48], sy[48];
            show(x, sx, sizeof sx);
            show(y, sy, sizeof sy);
            o += (size_t)snprintf(why + o, n - o, "%s%s %s vs %s", o ? ", " : "", model_keys[k], sx, sy);
        }
    }
    *same = diffs == 0;
    cJSON_Delete(a);
    cJSON_Delete(b);
    return FS_OK;
}
