/* libFuzzer harness: TP plans. The input is a plan text, parsed directly (fs_plan_parse) and
 * loaded as a file (fs_plan_load); both must agree, and every rule found by lookup must be one of
 * the plan's, with packed_rowwise / packed_colwise widths resolved without overflow (FLUX.1 and
 * FLUX.2 configs: widths in D and F). */
#include "fuzz_common.h"

#include "fs_plan.h"

static const char *const modules[] = {
    "transformer_blocks.0.attn.to_q", "transformer_blocks.18.ff.net.2", "single_transformer_blocks.37.proj_out",
    "single_transformer_blocks.0.proj_mlp", "proj_out", "x_embedder", "transformer_blocks.3.attn.to_add_out",
    "transformer_blocks.0.ff.linear_in", "single_transformer_blocks.47.attn.to_qkv_mlp_proj",
    "single_transformer_blocks.2.attn.to_out",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_as_string(data, size);
    fs_plan p, q;
    fs_err e = {0}, e2 = {0};
    int rc = fs_plan_parse(&p, text, "fuzz.plan", &e);
    if (rc) fuzz_check_error(rc, &e);
    fs_config cfg[3];
    fs_config_preset(&cfg[0], "flux-dev", NULL);
    fs_config_preset(&cfg[1], "odd", NULL);
    fs_config_preset(&cfg[2], "flux2-dev", NULL);
    for (size_t m = 0; !rc && m < sizeof modules / sizeof *modules; m++)
        for (int c = 0; c < 3; c++) {
            int64_t w[FS_TP_MAX_BLOCKS] = {-1, -1, -1, -1, -1};
            int rule, nw = -1;
            fs_tp_style st = fs_plan_lookup(&p, &cfg[c], modules[m], w, &nw, &rule);
            FUZZ_ASSERT(rule >= -1 && rule < p.n, "rule %d of %d", rule, p.n);
            FUZZ_ASSERT(rule >= 0 ? st == p.rules[rule].style : st == FS_TP_REPLICATE, "style %d", (int)st);
            FUZZ_ASSERT(nw >= 0 && nw <= FS_TP_MAX_BLOCKS, "%d widths", nw);
            if (st == FS_TP_PACKED_ROWWISE) FUZZ_ASSERT(nw == 2 && w[0] >= 0 && w[1] >= 0, "widths %lld,%lld",
                                                        (long long)w[0], (long long)w[1]);
            if (st == FS_TP_PACKED_COLWISE) {
                FUZZ_ASSERT(nw >= 2, "packed_colwise with %d widths", nw);
                for (int k = 0; k < nw; k++) FUZZ_ASSERT(w[k] >= 0, "width %d = %lld", k, (long long)w[k]);
            }
            FUZZ_ASSERT(fs_tp_style_name(st) != NULL, "no name");
        }
    /* the loader reads the same text from a file: same verdict, except what it refuses on
     * purpose (a NUL byte, a plan without rules, more than 1 MiB) */
    const int has_nul = memchr(data, 0, size) != NULL;
    int rc2 = fs_plan_load(&q, fuzz_as_file(data, size), &e2);
    if (rc2) fuzz_check_error(rc2, &e2);
    if (has_nul || size > (1 << 20)) FUZZ_ASSERT(rc2 == FS_E_INPUT, "loaded a plan with a NUL byte / too long");
    else if (!rc && p.n == 0) FUZZ_ASSERT(rc2 == FS_E_INPUT && strstr(e2.msg, "no rules"), "empty plan loaded");
    else {
        FUZZ_ASSERT(rc2 == rc, "parse rc %d, load rc %d (%s)", rc, rc2, e2.msg);
        if (!rc) {
            FUZZ_ASSERT(q.n == p.n, "parse %d rules, load %d", p.n, q.n);
            for (int i = 0; i < p.n; i++)
                FUZZ_ASSERT(!strcmp(p.rules[i].glob, q.rules[i].glob) && p.rules[i].style == q.rules[i].style &&
                                p.rules[i].line == q.rules[i].line,
                            "rule %d differs", i);
        }
    }
    if (!rc) fs_plan_free(&p);
    if (!rc2) fs_plan_free(&q);
    free(text);
    return 0;
}
