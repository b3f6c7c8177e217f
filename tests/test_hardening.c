/* test_hardening.c — the config reader and the TP plan loader on hostile input
 * (../shared/reliability-probe.md defects 2, 10, 12, 15, 16): every refusal is FS_E_INPUT (or
 * FS_E_IO for the OS), one line, naming the origin and the key, and nothing overflows. Runs under
 * `make sanitize` too, where an overflow or an out-of-range float->int cast is a failure. */
#include "fs_schedule.h"
#include "test_util.h"

#include <fcntl.h>
#include <math.h>
#include <limits.h>
#include <stddef.h>

#include "fs_config.h"
#include "fs_plan.h"
#include "fs_safetensors.h"

/* The 'tiny' reference config as JSON with one key replaced by `val` (raw JSON text). */
static void json_with(char *buf, size_t n, const char *key, const char *val)
{
    static const char *const keys[] = {"patch_size", "in_channels", "out_channels", "num_layers",
                                       "num_single_layers", "attention_head_dim", "num_attention_heads",
                                       "joint_attention_dim", "pooled_projection_dim", "guidance_embeds",
                                       "axes_dims_rope"};
    static const char *const vals[] = {"1", "16", "null", "2", "4", "32", "4", "64", "32", "true", "[8, 12, 12]"};
    size_t o = (size_t)snprintf(buf, n, "{");
    for (size_t i = 0; i < FS_ARRAY_LEN(keys); i++)
        o += (size_t)snprintf(buf + o, n - o, "%s\"%s\": %s", i ? ", " : "", keys[i],
                              key && !strcmp(key, keys[i]) ? val : vals[i]);
    snprintf(buf + o, n - o, "}");
}

/* Refused with FS_E_INPUT, one line, naming the origin and every string in `want` (NULL-ended). */
static void refused(const char *json, const char *w1, const char *w2)
{
    fs_config c;
    fs_err e = {0};
    int rc = fs_config_from_json(&c, json, "cfg.json", &e);
    if (rc != FS_E_INPUT) fail_msg("accepted (rc %d): %s", rc, json);
    if (strchr(e.msg, '\n')) fail_msg("message has a newline: %s", e.msg);
    if (!strstr(e.msg, "cfg.json")) fail_msg("message does not name the origin: %s", e.msg);
    if (w1 && !strstr(e.msg, w1)) fail_msg("message does not say '%s': %s", w1, e.msg);
    if (w2 && !strstr(e.msg, w2)) fail_msg("message does not say '%s': %s", w2, e.msg);
}

static void accepted(const char *json, fs_config *c)
{
    fs_err e = {0};
    if (fs_config_from_json(c, json, "cfg.json", &e)) fail_msg("refused: %s (%s)", e.msg, json);
}

/* probe #16 (libFuzzer): any integer key set to a number outside int was cast to int — undefined */
static void test_config_int_out_of_range(void **s)
{
    static const char *const ints[] = {"patch_size", "in_channels", "out_channels", "num_layers",
                                       "num_single_layers", "attention_head_dim", "num_attention_heads",
                                       "joint_attention_dim", "pooled_projection_dim"};
    static const char *const bad[] = {"3.1e79", "1e999", "-1e999", "-3e10", "2147483648", "-2147483649", "8.5",
                                      "\"16\"", "true", "[16]"};
    char js[1024];
    for (size_t k = 0; k < FS_ARRAY_LEN(ints); k++)
        for (size_t v = 0; v < FS_ARRAY_LEN(bad); v++) {
            /* out_channels null is legal; null is not in `bad` */
            json_with(js, sizeof js, ints[k], bad[v]);
            refused(js, ints[k], NULL);
        }
}

/* probe #15: non-integer axes_dims_rope were truncated by cJSON's valueint ([8.9,12.2,12] ran) */
static void test_config_axes_not_integers(void **s)
{
    char js[1024];
    json_with(js, sizeof js, "axes_dims_rope", "[8.9, 12.2, 12]");
    refused(js, "axes_dims_rope[0]", "8.9");
    json_with(js, sizeof js, "axes_dims_rope", "[8, 12, 1e300]");
    refused(js, "axes_dims_rope[2]", NULL);
    json_with(js, sizeof js, "axes_dims_rope", "[8, 12]");
    refused(js, "axes_dims_rope", NULL);
}

/* probe #2: sizes whose sum or product overflowed int (OOB write, SIGFPE) */
static void test_config_overflowing_sizes(void **s)
{
    char js[1024];
    /* axes summing past INT_MAX with head_dim 2 */
    snprintf(js, sizeof js, "{\"in_channels\": 16, \"num_layers\": 1, \"num_single_layers\": 1, "
                            "\"attention_head_dim\": 2, \"num_attention_heads\": 4, \"joint_attention_dim\": 8, "
                            "\"pooled_projection_dim\": 8, \"guidance_embeds\": false, "
                            "\"axes_dims_rope\": [2147483646, 2147483646, 6]}");
    refused(js, "axes_dims_rope[0]", NULL);
    json_with(js, sizeof js, "num_attention_heads", "1073741824"); /* 2^30: hidden wrapped to 0 -> SIGFPE */
    refused(js, "num_attention_heads", "limit");
    /* 65536 x 65536: each over its own limit; the product is never formed */
    snprintf(js, sizeof js, "{\"in_channels\": 16, \"num_layers\": 1, \"num_single_layers\": 1, "
                            "\"attention_head_dim\": 65536, \"num_attention_heads\": 65536, \"joint_attention_dim\": 8, "
                            "\"pooled_projection_dim\": 8, \"guidance_embeds\": false, "
                            "\"axes_dims_rope\": [21846, 21846, 21844]}");
    refused(js, "attention_head_dim", "limit");
}

/* probe #12: plausible-looking keys that made flux-sim allocate or zero-fill 8-361 GB */
static void test_config_plausibility_caps(void **s)
{
    char js[1024];
    json_with(js, sizeof js, "num_layers", "1000000000");
    refused(js, "num_layers", "1024");
    json_with(js, sizeof js, "num_single_layers", "1025");
    refused(js, "num_single_layers", "1024");
    json_with(js, sizeof js, "pooled_projection_dim", "2147483647");
    refused(js, "pooled_projection_dim", "limit");
    json_with(js, sizeof js, "in_channels", "2147483647");
    refused(js, "in_channels", "limit");
    json_with(js, sizeof js, "joint_attention_dim", "2147483647");
    refused(js, "joint_attention_dim", "limit");
    /* head_dim 2^30: over the head-dim limit */
    json_with(js, sizeof js, "attention_head_dim", "1073741824");
    refused(js, "attention_head_dim", NULL);
    /* every key at its limit: the parameter count (> 10^12) refuses it, naming the count */
    snprintf(js, sizeof js, "{\"in_channels\": 1048576, \"num_layers\": 1024, \"num_single_layers\": 1024, "
                            "\"attention_head_dim\": 1024, \"num_attention_heads\": 1024, "
                            "\"joint_attention_dim\": 1048576, \"pooled_projection_dim\": 1048576, "
                            "\"guidance_embeds\": true, \"axes_dims_rope\": [340, 342, 342]}");
    refused(js, "parameters", "1e+12");
    /* limits are inclusive: 1024 double blocks of a small model are fine */
    fs_config c;
    json_with(js, sizeof js, "num_layers", "1024");
    accepted(js, &c);
    assert_int_equal(c.num_layers, 1024);
    /* and FLUX.1-dev, the largest real config, is far inside */
    fs_config_preset(&c, "flux-dev", NULL);
    assert_int_equal(fs_config_validate(&c, "flux-dev", NULL), FS_OK);
}

/* out_channels != in_channels made the Euler update read past the transformer output */
static void test_config_out_channels(void **s)
{
    char js[1024];
    json_with(js, sizeof js, "out_channels", "8");
    refused(js, "out_channels = 8", "in_channels = 16");
    fs_config c;
    json_with(js, sizeof js, "out_channels", "16");
    accepted(js, &c);
    json_with(js, sizeof js, "out_channels", "null");
    accepted(js, &c);
    assert_int_equal(c.out_channels, 16);
}

static void test_config_json_text(void **s)
{
    char js[1024];
    json_with(js, sizeof js, NULL, NULL);
    fs_config c;
    accepted(js, &c);
    /* text after the object: a concatenated or damaged file */
    strcat(js, " {\"x\": 1}");
    refused(js, "malformed JSON", NULL);
    /* the error excerpt must stay one line, whatever the bytes near the error */
    refused("{\"in_channels\":\n\n\x01\x02", "malformed JSON", NULL);
    refused("[1, 2]", "not a JSON object", NULL);
}

/* Every struct fs_config_validate may see, however wrong, is refused without UB (make sanitize
 * runs this under UBSan): each int field of the preset's struct at INT_MIN, -1, 0, INT_MAX; only 0
 * in one of the `zero_ok` fields may pass. */
static void validate_every_int_field(const char *preset, const size_t *zero_ok, size_t nzero)
{
    static const int vals[] = {INT_MIN, -1, 0, INT_MAX};
    fs_config base;
    fs_config_preset(&base, preset, NULL);
    for (size_t off = 0; off < offsetof(fs_config, mlp_ratio); off += sizeof(int))
        for (size_t v = 0; v < FS_ARRAY_LEN(vals); v++) {
            fs_config c = base;
            memcpy((char *)&c + off, &vals[v], sizeof(int));
            int legal = 0;
            for (size_t k = 0; k < nzero; k++) legal |= vals[v] == 0 && off == zero_ok[k];
            fs_err e = {0};
            int rc = fs_config_validate(&c, "x", &e);
            if (legal ? rc != FS_OK : rc != FS_E_INPUT)
                fail_msg("%s: field at byte %zu = %d: rc %d (%s)", preset, off, vals[v], rc, e.msg);
        }
}

static void test_config_validate_any_struct(void **s)
{
    /* FLUX.1 (tiny): axes_dims_rope[3], n_axes (0 = 3) and the FLUX.2-only fields may be 0, and
     * must be: any other value is refused */
    const size_t zero_ok[] = {offsetof(fs_config, num_layers), offsetof(fs_config, num_single_layers),
                              offsetof(fs_config, guidance_embeds), offsetof(fs_config, axes_dims_rope) + 3 * sizeof(int),
                              offsetof(fs_config, n_axes), offsetof(fs_config, rope_theta),
                              offsetof(fs_config, timestep_guidance_channels), offsetof(fs_config, family)};
    validate_every_int_field("tiny", zero_ok, FS_ARRAY_LEN(zero_ok));
}

/* The same for a FLUX.2 config (flux2-tiny): every int field (n_axes INT_MAX etc. refused;
 * family 0 makes it a FLUX.1 config with FLUX.2 fields: refused), and the two doubles */
static void test_config_validate_any_struct_flux2(void **s)
{
    const size_t zero_ok[] = {offsetof(fs_config, num_layers), offsetof(fs_config, num_single_layers),
                              offsetof(fs_config, guidance_embeds), offsetof(fs_config, pooled_projection_dim)};
    validate_every_int_field("flux2-tiny", zero_ok, FS_ARRAY_LEN(zero_ok));
    fs_config base;
    fs_config_preset(&base, "flux2-tiny", NULL);
    static const double dv[] = {0, -1, NAN, INFINITY, 1e300, 17};
    for (size_t v = 0; v < FS_ARRAY_LEN(dv); v++) {
        fs_config c = base;
        c.mlp_ratio = dv[v];
        assert_int_equal(fs_config_validate(&c, "x", NULL), FS_E_INPUT);
        c = base;
        c.eps = dv[v];
        assert_int_equal(fs_config_validate(&c, "x", NULL), FS_E_INPUT);
    }
}

/* fs_config_num_params (closed form, used by validate and fs_estimate) against the list */
static void test_config_num_params(void **s)
{
    for (const char *const *p = fs_config_preset_names(); *p; p++) {
        fs_config c;
        assert_int_equal(fs_config_preset(&c, *p, NULL), 0);
        int n;
        fs_param_desc *pd = fs_config_params(&c, &n);
        int64_t total = 0;
        for (int i = 0; i < n; i++) total += pd[i].shape[0] * (pd[i].ndim == 2 ? pd[i].shape[1] : 1);
        free(pd);
        if (total != fs_config_num_params(&c))
            fail_msg("%s: list %lld vs closed form %lld", *p, (long long)total, (long long)fs_config_num_params(&c));
    }
    fs_config c;
    fs_config_preset(&c, "flux-dev", NULL);
    assert_true(fs_config_num_params(&c) == 11901408320LL);
}

/* to_json -> from_json reproduces every preset */
static void test_config_round_trip(void **s)
{
    for (const char *const *p = fs_config_preset_names(); *p; p++) {
        fs_config a, b;
        fs_config_preset(&a, *p, NULL);
        char *js = fs_config_to_json(&a);
        fs_err e = {0};
        if (fs_config_from_json(&b, js, *p, &e)) fail_msg("%s: %s", *p, e.msg);
        assert_memory_equal(&a, &b, sizeof a);
        free(js);
    }
}

static const char *write_file(const char *dir, const char *name, const void *data, size_t n, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
    return path;
}

static void test_config_file(void **s)
{
    char dir[64], path[256], js[1024];
    fs_test_tmpdir(dir, sizeof dir);
    fs_config c;
    fs_err e = {0};
    assert_int_equal(fs_config_from_file(&c, dir, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "directory"));
    assert_int_equal(fs_config_from_file(&c, "/dev/null", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "not a regular file"));
    /* 2 MiB: refused by size before being read */
    char *big = malloc(2 << 20);
    memset(big, ' ', 2 << 20);
    write_file(dir, "big.json", big, 2 << 20, path, sizeof path);
    free(big);
    assert_int_equal(fs_config_from_file(&c, path, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "at most"));
    /* a NUL byte: cJSON would stop there and ignore the rest */
    json_with(js, sizeof js, NULL, NULL);
    size_t n = strlen(js);
    js[n] = 0;
    memcpy(js + n + 1, "garbage", 8);
    write_file(dir, "nul.json", js, n + 8, path, sizeof path);
    assert_int_equal(fs_config_from_file(&c, path, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "NUL"));
    /* the valid file itself */
    write_file(dir, "ok.json", js, n, path, sizeof path);
    assert_int_equal(fs_config_from_file(&c, path, &e), FS_OK);
    assert_int_equal(c.num_attention_heads, 4);
}

/* ---- TP plan (probe #10) ---- */

static const char rule[] = "single_transformer_blocks.*.proj_out rowwise\n";

static void test_plan_directory(void **s)
{
    char dir[64];
    fs_test_tmpdir(dir, sizeof dir);
    fs_plan p;
    fs_err e = {0};
    assert_int_equal(fs_plan_load(&p, dir, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, dir));
    assert_non_null(strstr(e.msg, "directory"));
    assert_int_equal(p.n, 0);
    assert_int_equal(fs_plan_load(&p, "/nonexistent/plan.txt", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "No such file"));
    assert_int_equal(fs_plan_load(&p, "/dev/null", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "not a regular file"));
}

/* 1 MiB of comments then a rule: was cut at 1 MiB - 1 bytes and ran without the rule */
static void test_plan_not_cut(void **s)
{
    char dir[64], path[256];
    fs_test_tmpdir(dir, sizeof dir);
    const size_t cap = 1 << 20, rl = strlen(rule);
    char *buf = malloc(cap + rl);
    for (size_t i = 0; i < cap; i += 64) {
        memset(buf + i, ' ', 64);
        buf[i] = '#';
        buf[i + 63] = '\n';
    }
    memcpy(buf + cap, rule, rl);
    fs_plan p;
    fs_err e = {0};
    /* over the limit: refused, saying so (not parsed without its last rule) */
    write_file(dir, "long.plan", buf, cap + rl, path, sizeof path);
    assert_int_equal(fs_plan_load(&p, path, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "at most 1048576 bytes"));
    /* exactly at the limit, rule last: read whole */
    memcpy(buf + cap - rl, rule, rl);
    buf[cap - rl - 1] = '\n'; /* ends the comment line the rule was written into */
    write_file(dir, "full.plan", buf, cap, path, sizeof path);
    assert_int_equal(fs_plan_load(&p, path, &e), FS_OK);
    assert_int_equal(p.n, 1);
    assert_string_equal(p.rules[0].glob, "single_transformer_blocks.*.proj_out");
    assert_int_equal(p.rules[0].style, FS_TP_ROWWISE);
    fs_plan_free(&p);
    free(buf);
}

static void test_plan_empty_and_binary(void **s)
{
    char dir[64], path[256];
    fs_test_tmpdir(dir, sizeof dir);
    fs_plan p;
    fs_err e = {0};
    write_file(dir, "empty.plan", "", 0, path, sizeof path);
    assert_int_equal(fs_plan_load(&p, path, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "no rules"));
    write_file(dir, "comments.plan", "# nothing\n\n   # here\n", 21, path, sizeof path);
    assert_int_equal(fs_plan_load(&p, path, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "no rules"));
    char nul[64] = "a colwise\n";
    memcpy(nul + 11, rule, sizeof rule); /* the rule after a NUL would have been dropped */
    write_file(dir, "nul.plan", nul, 11 + sizeof rule - 1, path, sizeof path);
    assert_int_equal(fs_plan_load(&p, path, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "NUL byte at offset 10"));
    write_file(dir, "ok.plan", rule, sizeof rule - 1, path, sizeof path);
    assert_int_equal(fs_plan_load(&p, path, &e), FS_OK);
    assert_int_equal(p.n, 1);
    fs_plan_free(&p);
}

/* packed_rowwise widths: "kD" is k·hidden in int64 — a 14-digit k times a hidden size of 2^20
 * overflowed it (UB), and fs_weights adds two such widths */
static void test_plan_width_digits(void **s)
{
    fs_plan p;
    fs_err e = {0};
    assert_int_equal(fs_plan_parse(&p, "x packed_rowwise 99999999999999D,4D\n", "t.plan", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "t.plan:1"));
    assert_int_equal(fs_plan_parse(&p, "x packed_rowwise 999999999D,D\n", "t.plan", &e), FS_OK);
    fs_config c;
    fs_config_preset(&c, "flux-dev", NULL);
    int64_t w[FS_TP_MAX_BLOCKS];
    int nw = 0;
    assert_int_equal(fs_plan_lookup(&p, &c, "x", w, &nw, NULL), FS_TP_PACKED_ROWWISE);
    assert_true(nw == 2 && w[0] == 999999999LL * 3072 && w[1] == 3072);
    fs_plan_free(&p);
    /* packed_colwise: 2 to 5 widths, none empty; F is the config's MLP width */
    assert_int_equal(fs_plan_parse(&p, "x packed_colwise D,,F\n", "t.plan", &e), FS_E_INPUT);
    assert_int_equal(fs_plan_parse(&p, "x packed_colwise D,D,D,F,F,F\n", "t.plan", &e), FS_E_INPUT);
    assert_int_equal(fs_plan_parse(&p, "x packed_colwise D\n", "t.plan", &e), FS_E_INPUT);
    assert_int_equal(fs_plan_parse(&p, "x packed_rowwise D,F,F\n", "t.plan", &e), FS_E_INPUT);
    assert_int_equal(fs_plan_parse(&p, "x packed_colwise D,D,D,2F,3\n", "t.plan", &e), FS_OK);
    fs_config_preset(&c, "flux2-dev", NULL);
    assert_int_equal(fs_plan_lookup(&p, &c, "x", w, &nw, NULL), FS_TP_PACKED_COLWISE);
    assert_true(nw == 5 && w[0] == 6144 && w[2] == 6144 && w[3] == 2 * 18432 && w[4] == 3);
    fs_plan_free(&p);
}

/* ---- safetensors (found by tests/fuzz/fuzz_safetensors.c) ---- */

/* A header whose dtype or tensor name holds a newline or an escape: the error stays one line */
static void test_safetensors_control_chars(void **s)
{
    char dir[64], path[256];
    fs_test_tmpdir(dir, sizeof dir);
    static const char *const hdrs[] = {
        "{\"x\":{\"dtype\":\"F\n64\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        "{\"a\\nb\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
        "{\"a\\u001b[31mred\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
    };
    for (size_t i = 0; i < FS_ARRAY_LEN(hdrs); i++) {
        unsigned char buf[256];
        uint64_t n = strlen(hdrs[i]);
        memcpy(buf, &n, 8);
        memcpy(buf + 8, hdrs[i], n);
        memset(buf + 8 + n, 0, 4);
        write_file(dir, "c.safetensors", buf, 8 + n + 4, path, sizeof path);
        fs_st_file f;
        fs_err e = {0};
        assert_int_equal(fs_st_open(&f, path, &e), FS_E_INPUT);
        if (strchr(e.msg, '\n') || strchr(e.msg, 0x1b)) fail_msg("header %zu: message not one clean line: %s", i, e.msg);
    }
}

/* fs_printable: what an error line may echo of hostile text */
static void test_printable(void **state)
{
    (void)state;
    char b[64];
    assert_string_equal(fs_printable("proj_out", b, sizeof b, 256), "proj_out");
    /* a newline and a terminal escape cannot add a line or drive the terminal */
    assert_string_equal(fs_printable("Flux\nflux-sim: OK\x1b[2J", b, sizeof b, 256), "Flux\\nflux-sim: OK\\x1B[2J");
    /* valid UTF-8 passes; surrogates, U+FFFE, overlong forms, > U+10FFFF and stray bytes do not */
    assert_string_equal(fs_printable("\xce\x94 \xe2\x80\x94", b, sizeof b, 256), "\xce\x94 \xe2\x80\x94");
    assert_string_equal(fs_printable("a\xed\xa0\x80", b, sizeof b, 256), "a\\xED\\xA0\\x80");
    assert_string_equal(fs_printable("\xef\xbf\xbe", b, sizeof b, 256), "\\xEF\\xBF\\xBE");
    assert_string_equal(fs_printable("\xe0\x80\xbc", b, sizeof b, 256), "\\xE0\\x80\\xBC");
    assert_string_equal(fs_printable("\xf4\x90\x80\x80", b, sizeof b, 256), "\\xF4\\x90\\x80\\x80");
    assert_string_equal(fs_printable("\xc3", b, sizeof b, 256), "\\xC3");
    /* long text is cut visibly, never silently, and never past the buffer */
    char big[5000];
    memset(big, 'L', sizeof big - 1);
    big[sizeof big - 1] = 0;
    fs_printable(big, b, sizeof b, 256);
    assert_true(strlen(b) < sizeof b);
    assert_non_null(strstr(b, "...(4999 bytes)"));
    fs_printable(big, b, sizeof b, 10);
    assert_string_equal(b, "LLLLLLLLLL...(4999 bytes)");
    char tiny[4];
    fs_printable("abcdef", tiny, sizeof tiny, 256);
    assert_int_equal(strlen(tiny), 3);
}

/* fs_require_regular_file: a FIFO is refused without being opened (an open would block) */
static void test_require_regular_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/fluxsim-reg-XXXXXX", p[128];
    assert_non_null(mkdtemp(dir));
    fs_err e = {0};
    snprintf(p, sizeof p, "%s/fifo.h5", dir);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(fs_require_regular_file(p, "dump", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "a FIFO"));
    unlink(p);
    snprintf(p, sizeof p, "%s/dangling", dir);
    assert_int_equal(symlink("/nonexistent/x", p), 0);
    assert_int_equal(fs_require_regular_file(p, "config", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "dangling symbolic link"));
    unlink(p);
    assert_int_equal(fs_require_regular_file(dir, "dump", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "a directory"));
    snprintf(p, sizeof p, "%s/f", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(fs_require_regular_file(p, "dump", &e), FS_OK);
    unlink(p);
    rmdir(dir);
}

/* the scheduler refuses a shift that overflows float32 (all-NaN sigmas) instead of running it */
static void test_sched_overflow(void **state)
{
    (void)state;
    fs_sched_config sc;
    fs_err e = {0};
    double sig[3], ts[2];
    assert_int_equal(fs_sched_preset(&sc, "dev", &e), FS_OK);
    assert_int_equal(fs_sched_sigmas(&sc, 2, 4096, FS_F32, sig, ts, &e), FS_OK);
    assert_true(isfinite(sig[0]) && isfinite(sig[1]));
    assert_int_equal(fs_sched_sigmas(&sc, 2, 1 << 22, FS_F32, sig, ts, &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "overflows float32"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_int_out_of_range),
        cmocka_unit_test(test_config_axes_not_integers),
        cmocka_unit_test(test_config_overflowing_sizes),
        cmocka_unit_test(test_config_plausibility_caps),
        cmocka_unit_test(test_config_out_channels),
        cmocka_unit_test(test_config_json_text),
        cmocka_unit_test(test_config_validate_any_struct),
        cmocka_unit_test(test_config_validate_any_struct_flux2),
        cmocka_unit_test(test_config_num_params),
        cmocka_unit_test(test_config_round_trip),
        cmocka_unit_test(test_config_file),
        cmocka_unit_test(test_plan_directory),
        cmocka_unit_test(test_plan_not_cut),
        cmocka_unit_test(test_plan_empty_and_binary),
        cmocka_unit_test(test_plan_width_digits),
        cmocka_unit_test(test_safetensors_control_chars),
        cmocka_unit_test(test_printable),
        cmocka_unit_test(test_require_regular_file),
        cmocka_unit_test(test_sched_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
