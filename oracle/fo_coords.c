/* fo_coords.c — element coordinates in words (see fo_coords.h). */
#include "fo_coords.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static size_t token_desc(char *buf, size_t n, int64_t s, int64_t S, int s_txt, int s_img)
{
    if (s_txt > 0 && s_img > 0 && S == s_txt + s_img)
        return s < s_txt ? (size_t)snprintf(buf, n, "text token %lld", (long long)s)
                         : (size_t)snprintf(buf, n, "image token %lld", (long long)(s - s_txt));
    if (s_img > 0 && S == s_img && S != s_txt) return (size_t)snprintf(buf, n, "image token %lld", (long long)s);
    if (s_txt > 0 && S == s_txt && S != s_img) return (size_t)snprintf(buf, n, "text token %lld", (long long)s);
    return (size_t)snprintf(buf, n, "token %lld", (long long)s);
}

void fo_describe_coords(const char *group, const char *name, int ndim, const int64_t *shape, const int64_t *coords,
                        int batch, int s_txt, int s_img, int heads, int head_dim, char *buf, size_t n)
{
    buf[0] = 0;
    if (n == 0 || (group && !strcmp(group, "/inputs"))) return;
    size_t o = 0;
#define ADD(...) (o += o < n ? (size_t)snprintf(buf + o, n - o, __VA_ARGS__) : 0)
    int attn = strstr(name, "attn") != NULL;
    if (ndim == 4) { /* q/k norms: [B, S, H, Dh] */
        ADD("batch %lld, ", (long long)coords[0]);
        if (o < n) o += token_desc(buf + o, n - o, coords[1], shape[1], s_txt, s_img);
        ADD(", head %lld, channel %lld", (long long)coords[2], (long long)coords[3]);
    } else if (ndim == 3) { /* [B, S, C] */
        ADD("batch %lld, ", (long long)coords[0]);
        if (o < n) o += token_desc(buf + o, n - o, coords[1], shape[1], s_txt, s_img);
        ADD(", channel %lld", (long long)coords[2]);
        if (attn && heads > 0 && head_dim > 0 && shape[2] == (int64_t)heads * head_dim)
            ADD(" (head %lld, dim %lld)", (long long)(coords[2] / head_dim), (long long)(coords[2] % head_dim));
    } else if (ndim == 2 && !strncmp(name, "pos_embed", 9)) { /* [S, Dh], no batch */
        if (o < n) o += token_desc(buf + o, n - o, coords[0], shape[0], s_txt, s_img);
        ADD(", channel %lld", (long long)coords[1]);
    } else if (ndim == 2 && (batch <= 0 || shape[0] == batch)) { /* [B, C]: embeddings, modulation */
        ADD("batch %lld, channel %lld", (long long)coords[0], (long long)coords[1]);
    }
#undef ADD
    if (o >= n) buf[n - 1] = 0;
}

/* A JSON number as an int when it is a whole number in int range, else 0 (unknown). */
static int json_int(const cJSON *v)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    return d >= 0 && d <= INT_MAX && d == floor(d) ? (int)d : 0;
}

static int dim_int(int64_t v) { return v >= 0 && v <= INT_MAX ? (int)v : 0; }

fo_model_dims fo_read_model_dims(fo_file *f)
{
    fo_model_dims m = {0};
    fo_dataset ds = {0};
    fs_err e;
    if (fo_is_dataset(f, "/inputs/hidden_states") && !fo_dataset_info(f, "/inputs/hidden_states", &ds, &e) &&
        ds.ndim == 3)
        m.batch = dim_int(ds.shape[0]), m.s_img = dim_int(ds.shape[1]);
    if (fo_is_dataset(f, "/inputs/encoder_hidden_states") &&
        !fo_dataset_info(f, "/inputs/encoder_hidden_states", &ds, &e) && ds.ndim == 3)
        m.s_txt = dim_int(ds.shape[1]);
    cJSON *c = cJSON_Parse(fo_file_config(f));
    if (c) {
        m.heads = json_int(cJSON_GetObjectItemCaseSensitive(c, "num_attention_heads"));
        m.head_dim = json_int(cJSON_GetObjectItemCaseSensitive(c, "attention_head_dim"));
        cJSON_Delete(c);
    }
    return m;
}
