/* fs_select.c — record selection (see fs_select.h). */
#include "fs_select.h"

#include "fs_dump.h" /* FS_DUMP_DECL_MAX */

#include <stdio.h>
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
    if (f->rec.fn && f->sel && f->sel->modules.n && !f->matched) {
        char g[FS_DUMP_DECL_MAX + 1], shown[400];
        return fs_errf(e, FS_E_INPUT, "--dump-modules %s: matches no module of this model (names as in a dump's `order`, "
                                      "e.g. 'single_transformer_blocks.0.*,proj_out')",
                       fs_printable(fo_globs_str(&f->sel->modules, g, sizeof g), shown, sizeof shown, 300));
    }
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
