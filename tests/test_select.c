/* test_select.c — the module names a run records, known before the run (sim/run/fs_select.c,
 * fs_record_names), and the up-front refusal of a --dump-modules selection that matches none
 * (reliability probe 3, T19: it was refused only after step 0 had been computed).
 *
 * The names list is built from the config alone, beside the forward that really records the
 * names (sim/model/fs_flux1.c, fs_flux2.c, fs_layers.c). This test keeps the two one definition:
 * for every preset of both families (FLUX.1 and FLUX.2), at its real block counts and guidance
 * setting but small widths, with and without true CFG, and for configs without guidance or
 * without one kind of block, a real one-step run records exactly the listed names, in the listed
 * order. */
#include "test_util.h"

#include "fs_backends.h"
#include "fs_model.h"
#include "fs_sampler.h"
#include "fs_select.h"

typedef struct seen {
    char **v;
    int n, cap;
} seen;

static int keep_name(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e)
{
    seen *s = ctx;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->v = realloc(s->v, (size_t)s->cap * sizeof *s->v);
        assert_non_null(s->v);
    }
    s->v[s->n++] = strdup(name);
    return FS_OK;
}

/* cfg at small widths: the names depend only on the block counts and guidance_embeds */
static void shrink(fs_config *c)
{
    c->patch_size = 1;
    c->in_channels = c->out_channels = 8;
    c->num_attention_heads = 2;
    c->attention_head_dim = 16;
    c->joint_attention_dim = 16;
    c->pooled_projection_dim = 16;
    if (c->family == FS_FLUX2) /* 4 axes, no pooled vector, a small sinusoid */
        c->pooled_projection_dim = 0, c->timestep_guidance_channels = 32,
        c->axes_dims_rope[0] = c->axes_dims_rope[1] = c->axes_dims_rope[2] = c->axes_dims_rope[3] = 4;
    else
        c->axes_dims_rope[0] = 4, c->axes_dims_rope[1] = 6, c->axes_dims_rope[2] = 6;
}

/* One step of a real run of cfg records exactly fs_record_names' list. Returns the list's length. */
static int check_agrees(const char *label, const fs_config *cfg, double true_cfg, int ref)
{
    fs_err e = {0};
    fs_names l;
    int known = 0;
    assert_int_equal(fs_record_names(cfg, fs_names_flags(true_cfg > 0, ref), &l, &known, &e), 0);
    assert_true(known);
    fs_weights w;
    if (fs_weights_synthetic(&w, cfg, FS_F32, 0, &e)) fail_msg("%s: %s", label, e.msg);
    fs_gen_params gp = {.seed = 1, .batch = 1, .grid_h = 2, .grid_w = 2, .txt_len = 3, .steps = 1, .guidance = 3.5,
                        .true_cfg_scale = true_cfg, .n_ref = ref ? 1 : 0, .ref_h = {2}, .ref_w = {3}};
    assert_int_equal(fs_sched_preset(&gp.sched, "dev", NULL), 0);
    fs_inputs in;
    if (fs_inputs_generate(&in, cfg, FS_F32, &gp, &e)) fail_msg("%s: %s", label, e.msg);
    seen s = {0};
    fs_model m = {.cfg = *cfg, .dtype = FS_F32, .w = &w, .be = fs_backend_cpu(), .rec = {keep_name, &s}};
    fs_tensor lat;
    if (fs_sample(&m, &in, NULL, &lat, &e)) fail_msg("%s: %s", label, e.msg);
    int first = -1;
    for (int i = 0; i < l.n && i < s.n && first < 0; i++)
        if (strcmp(l.v[i], s.v[i])) first = i;
    if (first < 0 && l.n != s.n) first = l.n < s.n ? l.n : s.n;
    if (first >= 0)
        fail_msg("%s: the names list and the run differ at record %d: listed '%s', recorded '%s' (%d listed, %d "
                 "recorded)",
                 label, first, first < l.n ? l.v[first] : "(end)", first < s.n ? s.v[first] : "(end)", l.n, s.n);
    printf("  [%s%s%s] %d names (%d double + %d single blocks, guidance %d): the list = the run\n", label,
           true_cfg > 0 ? ", true CFG" : "", ref ? ", reference image (KV cache, step 0)" : "", l.n, cfg->num_layers, cfg->num_single_layers, cfg->guidance_embeds);
    int n = l.n;
    for (int i = 0; i < s.n; i++) free(s.v[i]);
    free(s.v);
    fs_names_free(&l);
    fs_tensor_free(&lat);
    fs_inputs_free(&in);
    fs_weights_free(&w);
    return n;
}

static void test_names_agree_with_runs(void **state)
{
    (void)state;
    int checked = 0;
    for (const char *const *p = fs_config_preset_names(); *p; p++) {
        fs_config c;
        fs_err e = {0};
        assert_int_equal(fs_config_preset(&c, *p, &e), 0);
        fs_names l;
        int known = 0;
        assert_int_equal(fs_record_names(&c, 0, &l, &known, &e), 0);
        fs_names_free(&l);
        assert_true(known); /* every family has its list */
        shrink(&c);
        check_agrees(*p, &c, 0, 0);
        check_agrees(*p, &c, 3.0, 0); /* a second, negative-prompt call per step, renamed name@k */
        if (c.family == FS_FLUX2) check_agrees(*p, &c, 0, 1); /* step 0 of the KV cache */
        checked++;
    }
    assert_true(checked >= 8); /* default, flux-dev, flux-schnell, flux2-dev, flux2-klein-4b/9b, ... */
    /* guidance on and off, each kind of block absent, for both families */
    static const char *const fam[] = {"default", "flux2-default"};
    for (int f = 0; f < 2; f++) {
        fs_config c;
        assert_int_equal(fs_config_preset(&c, fam[f], NULL), 0);
        shrink(&c);
        for (int g = 0; g < 2; g++) {
            char label[96];
            c.guidance_embeds = g;
            c.num_layers = 0, c.num_single_layers = 2;
            snprintf(label, sizeof label, "%s: no double blocks, %s", fam[f], g ? "guidance" : "no guidance");
            check_agrees(label, &c, 0, f == 1);
            c.num_layers = 3, c.num_single_layers = 0;
            snprintf(label, sizeof label, "%s: no single blocks, %s", fam[f], g ? "guidance" : "no guidance");
            check_agrees(label, &c, 0, f == 1);
        }
    }
}

static int check_sel(const char *globs, const char *preset, fs_err *e)
{
    fs_config c;
    assert_int_equal(fs_config_preset(&c, preset, NULL), 0);
    fs_select s;
    assert_int_equal(fs_select_parse(&s, globs, NULL, e), 0);
    int rc = fs_select_check_model(&s, &c, 0, e);
    fs_select_free(&s);
    return rc;
}

static void test_check_model(void **state)
{
    (void)state;
    fs_err e = {0};
    /* default: 2 double + 4 single blocks, guidance */
    assert_int_equal(check_sel("proj_out", "default", &e), 0);
    assert_int_equal(check_sel("single_transformer_blocks.3.*", "default", &e), 0);
    assert_int_equal(check_sel("nomatch,time_text_embed.guidance_embedder", "default", &e), 0);
    assert_int_equal(check_sel("transformer_blocks.9.*", "default", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "--dump-modules transformer_blocks.9.*: matches no module of this model"));
    assert_null(strchr(e.msg, '\n'));
    /* latents_in/out are always kept and do not count as a match */
    assert_int_equal(check_sel("latents_in,latents_out", "default", &e), FS_E_INPUT);
    /* flux-schnell has no guidance embedder; flux-dev has 19 double blocks (0..18) */
    assert_int_equal(check_sel("time_text_embed.guidance_embedder*", "flux-schnell", &e), FS_E_INPUT);
    assert_int_equal(check_sel("time_text_embed.guidance_embedder*", "flux-dev", &e), 0);
    assert_int_equal(check_sel("transformer_blocks.18.ff", "flux-dev", &e), 0);
    assert_int_equal(check_sel("transformer_blocks.19.*", "flux-dev", &e), FS_E_INPUT);
    /* hostile text stays one escaped line */
    assert_int_equal(check_sel("\033[2Jx,a\nb", "default", &e), FS_E_INPUT);
    assert_null(strchr(e.msg, '\n'));
    assert_null(strchr(e.msg, '\033'));
    /* the negative call's records (true CFG) match only when the run makes that call */
    {
        fs_config c;
        assert_int_equal(fs_config_preset(&c, "default", NULL), 0);
        fs_select s;
        assert_int_equal(fs_select_parse(&s, "x_embedder@1,time_text_embed.time_proj@3", NULL, &e), 0);
        assert_int_equal(fs_select_check_model(&s, &c, 0, &e), FS_E_INPUT);
        assert_int_equal(fs_select_check_model(&s, &c, 1, &e), 0);
        fs_select_free(&s);
    }
    /* FLUX.2: its own names (flux2-dev: 8 double blocks, 48 single, guidance; klein: none) */
    assert_int_equal(check_sel("single_transformer_blocks.47.attn.to_qkv_mlp_proj", "flux2-dev", &e), 0);
    assert_int_equal(check_sel("transformer_blocks.7.ff.act_fn.gate_fn", "flux2-dev", &e), 0);
    assert_int_equal(check_sel("double_stream_modulation_*", "flux2-klein-4b", &e), 0);
    assert_int_equal(check_sel("pos_embed@1#0", "flux2-tiny", &e), 0);
    assert_int_equal(check_sel("transformer_blocks.8.*", "flux2-dev", &e), FS_E_INPUT);
    assert_non_null(strstr(e.msg, "--dump-modules transformer_blocks.8.*: matches no module of this model"));
    assert_int_equal(check_sel("time_guidance_embed.guidance_embedder*", "flux2-klein-9b", &e), FS_E_INPUT);
    assert_int_equal(check_sel("time_guidance_embed.guidance_embedder*", "flux2-dev", &e), 0);
    /* FLUX.1 names are not FLUX.2's, and the other way round */
    assert_int_equal(check_sel("time_text_embed*,single_transformer_blocks.0.proj_mlp", "flux2-tiny", &e), FS_E_INPUT);
    assert_int_equal(check_sel("single_stream_modulation,transformer_blocks.0.ff.linear_in", "tiny", &e),
                     FS_E_INPUT);
    {
        fs_config c;
        assert_int_equal(fs_config_preset(&c, "flux2-tiny", NULL), 0);
        fs_select s;
        assert_int_equal(fs_select_parse(&s, "pos_embed@3#1", NULL, &e), 0); /* the negative call's text ids */
        assert_int_equal(fs_select_check_model(&s, &c, 0, &e), FS_E_INPUT);
        assert_int_equal(fs_select_check_model(&s, &c, FS_NAMES_TRUE_CFG, &e), 0);
        fs_select_free(&s);
        /* the reference embedding's calls (KV cache) match only with reference images */
        assert_int_equal(fs_select_parse(&s, "time_guidance_embed@1,single_stream_modulation.linear@1", NULL, &e), 0);
        assert_int_equal(fs_select_check_model(&s, &c, 0, &e), FS_E_INPUT);
        assert_int_equal(fs_select_check_model(&s, &c, FS_NAMES_REF, &e), 0);
        fs_select_free(&s);
    }
    /* no globs: nothing to check */
    assert_int_equal(check_sel(NULL, "default", &e), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_agree_with_runs),
        cmocka_unit_test(test_check_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
