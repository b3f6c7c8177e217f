/* flux-oracle — compare flux-dump files (docs/oracle.md).
 *
 *   flux-oracle diff A.h5 B.h5 [--truth REF64.h5]   A = candidate, B = reference
 *   flux-oracle stats A.h5
 *   flux-oracle consistency r0.h5 r1.h5 ...
 *
 * The engine is oracle/fo_diff.h; this file parses arguments and renders its reports as a table,
 * one line (-q), JSON (--json), JUnit XML (--junit) or an HTML page with an SVG plot (--html).
 * Exit status as h5diff: 0 within tolerance, 1 divergent, 2 error (one line on stderr naming the
 * file and the cause, and no report file left behind). That contract holds even when libhdf5
 * crashes or hangs on a damaged file: see "crash and hang guard" below. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fo_diff.h"

#define VERSION "flux-oracle " FS_VERSION " (flux-dump v1)"
#define WATCHDOG_DEFAULT_S 60 /* one HDF5 metadata call taking a minute is a loop, not a slow disk */

/* ---------- crash and hang guard ----------
 *
 * libhdf5 1.10 segfaults or loops forever on some damaged files (its global heap, read for vlen
 * attributes such as `order`; damaged layouts), which no check before the read can rule out.
 * The reader (fo_dump.c) brackets every HDF5 call with fo_set_h5_hook's hook; here the hook
 * remembers which file and object HDF5 is reading and arms an alarm, and a handler for SIGSEGV,
 * SIGBUS, SIGFPE, SIGILL and SIGALRM prints one line naming them and exits 2. Only
 * async-signal-safe calls in the handler (write, unlink, _exit); the strings it prints are
 * copied in advance. */
#define GUARD_DEPTH 16
static struct {
    char file[512];
    char obj[512];
} g_stack[GUARD_DEPTH];
static volatile sig_atomic_t g_depth;
static volatile long g_h5_tid;    /* the thread inside HDF5 */
static unsigned g_watchdog_s = WATCHDOG_DEFAULT_S;
static char g_tmp_path[PATH_MAX + 64]; /* a report being written: removed if we die */

static void copy_str(char *dst, size_t n, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < n; i++) dst[i] = (src[i] >= 0x20 && src[i] < 0x7f) ? src[i] : '?';
    dst[i] = 0;
}

static void h5_hook(int entering, const char *file, const char *object)
{
    if (entering) {
        int d = g_depth;
        if (d < GUARD_DEPTH) {
            copy_str(g_stack[d].file, sizeof g_stack[d].file, file);
            copy_str(g_stack[d].obj, sizeof g_stack[d].obj, object);
        }
        if (d == 0) {
            g_h5_tid = (long)syscall(SYS_gettid);
            if (g_watchdog_s) alarm(g_watchdog_s);
        }
        g_depth = d + 1;
    } else if (g_depth > 0) {
        g_depth = g_depth - 1;
        if (g_depth == 0 && g_watchdog_s) alarm(0);
    }
}

static size_t cat(char *buf, size_t o, size_t n, const char *s)
{
    while (*s && o + 1 < n) buf[o++] = *s++;
    buf[o] = 0;
    return o;
}

static void fatal_signal(int sig)
{
    char m[1400];
    size_t o = 0;
    int d = g_depth;
    if (sig == SIGALRM && d == 0) return; /* fired as the last HDF5 call returned: not a hang */
    int in_h5 = d > 0 && (sig == SIGALRM || (long)syscall(SYS_gettid) == g_h5_tid);
    o = cat(m, o, sizeof m, "flux-oracle: error: ");
    if (in_h5) {
        int k = (d < GUARD_DEPTH ? d : GUARD_DEPTH) - 1;
        o = cat(m, o, sizeof m, g_stack[k].file);
        o = cat(m, o, sizeof m, ": corrupted HDF5 metadata (libhdf5 ");
        o = cat(m, o, sizeof m, sig == SIGALRM ? "hung" : "crashed");
        o = cat(m, o, sizeof m, " reading ");
        o = cat(m, o, sizeof m, g_stack[k].obj);
        if (sig == SIGALRM) {
            char num[24];
            int i = (int)sizeof num - 1;
            unsigned v = g_watchdog_s;
            num[i] = 0;
            do num[--i] = (char)('0' + v % 10), v /= 10;
            while (v && i > 0);
            o = cat(m, o, sizeof m, ": no answer in ");
            o = cat(m, o, sizeof m, num + i);
            o = cat(m, o, sizeof m, " s");
        }
        o = cat(m, o, sizeof m, ")\n");
    } else {
        o = cat(m, o, sizeof m, sig == SIGSEGV ? "internal error: SIGSEGV" : sig == SIGBUS ? "internal error: SIGBUS"
                                : sig == SIGFPE ? "internal error: SIGFPE" : sig == SIGILL ? "internal error: SIGILL"
                                                                              : "internal error: SIGALRM");
        o = cat(m, o, sizeof m, " outside libhdf5 (a bug in flux-oracle: please report it)\n");
    }
    if (g_tmp_path[0]) unlink(g_tmp_path);
    ssize_t w = write(STDERR_FILENO, m, o);
    (void)w;
    _exit(2);
}

static void install_guard(void)
{
    const char *w = getenv("FLUX_ORACLE_WATCHDOG");
    if (w && *w) {
        char *end;
        unsigned long v = strtoul(w, &end, 10);
        if (!*end && v <= 86400) g_watchdog_s = (unsigned)v;
    }
    /* an alternate stack, so a stack overflow inside HDF5 still reaches the handler */
    static char altstack[1 << 16];
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fatal_signal;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGALRM};
    for (size_t i = 0; i < FS_ARRAY_LEN(sigs); i++) sigaction(sigs[i], &sa, NULL);
    fo_set_h5_hook(h5_hook);
}

static void usage(FILE *o)
{
    fputs("usage: flux-oracle diff A.h5 B.h5 [options]      compare two dumps (A candidate, B reference)\n"
          "       flux-oracle stats A.h5 [options]          min/max/mean/std/NaN/Inf per dataset\n"
          "       flux-oracle consistency R0.h5 R1.h5 ...   per-rank dumps: replicated tensors must be\n"
          "                                                 bitwise identical on every rank\n"
          "\n"
          "Datasets are walked in execution order (/inputs, each step's `order`, /final) and the\n"
          "first divergent one is reported, with the ranks owning it when a `parallel` attribute\n"
          "carries a sharding map.\n"
          "\n"
          "Tolerance (docs/tolerances.md). A dataset passes iff no NaN/Inf faces a different value and\n"
          "  max|A-B| <= atol  OR  (rel L2 <= rtol AND max|A-B|/max|B| <= mtol)\n"
          "  --rtol X          bound on ||A-B||/||B||          [float32 2e-4, float64 1e-10]\n"
          "  --atol X          absolute floor on max|A-B|      [float32 1e-6, float64 1e-13]\n"
          "  --mtol X          bound on max|A-B|/max|B|, 0 off [float32 5e-4, float64 1e-9]\n"
          "                    defaults: the looser of the two files' dtypes\n"
          "  --truth T.h5      arbiter (a float64 run of the same problem): A, the candidate, passes where\n"
          "                    err(A,T) <= m*err(B,T) + tol/10 for rel L2 and max rel, B being the\n"
          "                    baseline (flux-sim's own run in A's precision). A bf16 GPU run:\n"
          "                    diff RUN.h5 SIM_BF16.h5 --truth SIM_FP64_MATCHED.h5 (docs/bf16.md)\n"
          "  --multiplier M    m of that rule for both metrics [2, as PyTorch's accuracy checker;\n"
          "                    bfloat16: 2 on rel L2, 3 on max rel, measured]\n"
          "\n"
          "What must be on both sides: every dataset one file recorded must be in the other, unless\n"
          "the file lacking it declares it unrecorded (root `recorded_steps`, a step's\n"
          "`recorded_modules`, e.g. \"depth<=2\"); else the comparison is an error (exit 2).\n"
          "  --modules G[,G]   compare only datasets of step groups whose names match one of the\n"
          "                    globs (fnmatch: 'transformer_blocks.*,proj_out'); /inputs, /final stay\n"
          "  --steps LIST      compare only these steps: 0,2-3\n"
          "  --strict          also names a file declared unrecorded count as divergences\n"
          "  --allow-partial   compare a partial dump (its producer did not finish) as far as it\n"
          "                    goes, instead of refusing it (exit 2)\n"
          "\n"
          "Output:\n"
          "  -q, --quiet       one line: the verdict and the first divergence\n"
          "  --json            JSON on stdout instead of the table (keys: docs/oracle.md)\n"
          "  --html FILE       also write a self-contained HTML report with an SVG plot\n"
          "  --junit FILE      also write JUnit XML: one testcase per compared tensor (diff)\n"
          "  --color, --no-color  highlight the first divergence [auto: when stdout is a terminal]\n"
          "  --block N         values read per dataset and file at a time [262144]\n"
          "  -h, --help        this help;  -V, --version\n"
          "\n"
          "Environment: OMP_NUM_THREADS  threads for data passes [all cores]\n"
          "             FLUX_ORACLE_WATCHDOG  seconds one HDF5 call may take before the file is\n"
          "                          declared corrupted [60; 0 = no limit]\n"
          "\n"
          "Exit status: 0 within tolerance (stats: everything finite), 1 divergent (stats: NaN/Inf\n"
          "found), 2 error (unreadable or corrupted file, not a flux-dump, partial dump, dumps of\n"
          "different models, names missing on one side, nothing compared, bad arguments, output\n"
          "not written). A tensor holding NaN/Inf never passes.\n",
          o);
}

#define MAX_GLOBS 64

typedef struct opts {
    const char *cmd;
    const char *files[FO_MAX_RANKS];
    int nfiles;
    const char *truth, *html, *junit;
    int quiet, json, strict, color;
    fo_diff_opts d;
    char *globs[MAX_GLOBS]; /* --modules, split at commas (owned) */
    fo_steps steps;         /* --steps (owned) */
    /* the verdict, decided once (fo_report_verdict) and rendered by every output */
    fo_verdict verdict;
    char why[1200];
} opts;

static void opts_free(opts *o)
{
    for (int i = 0; i < o->d.n_modules; i++) free(o->globs[i]);
    fo_steps_free(&o->steps);
}

static int g_out_errno;

static void note_stdout(void)
{
    if (ferror(stdout) && !g_out_errno) g_out_errno = errno ? errno : EIO;
}

static int die(const char *msg)
{
    fprintf(stderr, "flux-oracle: error: %s\n", msg);
    return 2;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    *out = strtod(s, &end);
    return *end || end == s || !isfinite(*out) || *out < 0 ? -1 : 0;
}

static int parse_args(int argc, char **argv, opts *o, char *err, size_t en)
{
    memset(o, 0, sizeof *o);
    o->color = -1;
    int have_rtol = 0, have_atol = 0, have_mtol = 0;
    double rtol = 0, atol = 0, mtol = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VAL                                                               \
    do {                                                                       \
        if (!val) {                                                            \
            snprintf(err, en, "option %s needs a value (see --help)", a);      \
            return -1;                                                         \
        }                                                                      \
        i++;                                                                   \
    } while (0)
#define NUM(dst, flag)                                                                      \
    do {                                                                                    \
        NEED_VAL;                                                                           \
        if (parse_double(val, &dst)) {                                                      \
            snprintf(err, en, "option %s: '%s' is not a non-negative number", a, val);      \
            return -1;                                                                      \
        }                                                                                   \
        flag = 1;                                                                           \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
        else if (!strcmp(a, "-V") || !strcmp(a, "--version")) return 3;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = 1;
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--strict")) o->strict = 1;
        else if (!strcmp(a, "--allow-partial")) o->d.allow_partial = 1;
        else if (!strcmp(a, "--junit")) { NEED_VAL; o->junit = val; }
        else if (!strcmp(a, "--steps")) {
            NEED_VAL;
            char why[256];
            fo_steps_free(&o->steps);
            if (fo_steps_parse(val, &o->steps, why, sizeof why)) { snprintf(err, en, "option --steps: %s", why); return -1; }
            o->d.steps = &o->steps;
        } else if (!strcmp(a, "--modules")) {
            NEED_VAL;
            for (const char *p = val; *p;) {
                size_t len = strcspn(p, ",");
                if (len) {
                    if (o->d.n_modules == MAX_GLOBS) { snprintf(err, en, "option --modules: at most %d globs", MAX_GLOBS); return -1; }
                    if (!(o->globs[o->d.n_modules] = strndup(p, len))) { snprintf(err, en, "out of memory"); return -1; }
                    o->d.n_modules++;
                }
                p += len;
                if (*p == ',') p++;
            }
            if (!o->d.n_modules) { snprintf(err, en, "option --modules: no glob in '%s'", val); return -1; }
            o->d.modules = (const char *const *)o->globs;
        }
        else if (!strcmp(a, "--color")) o->color = 1;
        else if (!strcmp(a, "--no-color")) o->color = 0;
        else if (!strcmp(a, "--truth")) { NEED_VAL; o->truth = val; }
        else if (!strcmp(a, "--html")) { NEED_VAL; o->html = val; }
        else if (!strcmp(a, "--rtol")) NUM(rtol, have_rtol);
        else if (!strcmp(a, "--atol")) NUM(atol, have_atol);
        else if (!strcmp(a, "--mtol")) NUM(mtol, have_mtol);
        else if (!strcmp(a, "--multiplier")) { int dummy; NUM(o->d.multiplier, dummy); (void)dummy; }
        else if (!strcmp(a, "--block")) {
            double b; int dummy;
            NUM(b, dummy);
            (void)dummy;
            if (b < 1 || b > 1e12) { snprintf(err, en, "option --block: '%s' out of range", val); return -1; }
            o->d.block_elems = (int64_t)b;
        } else if (a[0] == '-' && a[1]) {
            snprintf(err, en, "unknown option '%s' (see --help)", a);
            return -1;
        } else if (!o->cmd) {
            o->cmd = a;
        } else {
            if (o->nfiles == FO_MAX_RANKS) { snprintf(err, en, "too many files (at most %d)", FO_MAX_RANKS); return -1; }
            o->files[o->nfiles++] = a;
        }
#undef NUM
#undef NEED_VAL
    }
    if (!o->cmd) { snprintf(err, en, "no command: diff, stats or consistency (see --help)"); return -1; }
    int want = !strcmp(o->cmd, "diff") ? 2 : !strcmp(o->cmd, "stats") ? 1 : !strcmp(o->cmd, "consistency") ? -2 : 0;
    if (!want) { snprintf(err, en, "unknown command '%s': diff, stats or consistency (see --help)", o->cmd); return -1; }
    if ((want > 0 && o->nfiles != want) || (want < 0 && o->nfiles < 2)) {
        snprintf(err, en, "%s takes %s file%s, got %d", o->cmd, want == 2 ? "two" : want == 1 ? "one" : "two or more",
                 want == 1 ? "" : "s", o->nfiles);
        return -1;
    }
    if (o->truth && strcmp(o->cmd, "diff")) { snprintf(err, en, "--truth applies to diff only"); return -1; }
    if (o->junit && strcmp(o->cmd, "diff")) { snprintf(err, en, "--junit applies to diff only"); return -1; }
    if (o->strict && strcmp(o->cmd, "diff")) { snprintf(err, en, "--strict applies to diff only"); return -1; }
    if (have_rtol || have_atol || have_mtol) {
        /* Overrides start from the defaults of the float32 row only for the fields not given,
         * resolved once the files' dtypes are known (see resolve_tol). */
        o->d.tol_given = 1;
        o->d.tol.rtol = have_rtol ? rtol : -1;
        o->d.tol.atol = have_atol ? atol : -1;
        o->d.tol.mtol = have_mtol ? mtol : -1;
    }
    return 0;
}

/* Fields not given on the command line come from the dtype defaults. */
static void resolve_tol(opts *o, fo_file *a, fo_file *b)
{
    if (!o->d.tol_given) return;
    fo_tolerance def = fo_tolerance_looser(fo_tolerance_default(fo_file_dtype(a)), fo_tolerance_default(fo_file_dtype(b)));
    if (o->d.tol.rtol < 0) o->d.tol.rtol = def.rtol;
    if (o->d.tol.atol < 0) o->d.tol.atol = def.atol;
    if (o->d.tol.mtol < 0) o->d.tol.mtol = def.mtol;
}

/* ---------- shared formatting ---------- */

static const char *step_label(int step, char *buf, size_t n)
{
    if (step == FO_STEP_INPUTS) snprintf(buf, n, "in");
    else if (step == FO_STEP_FINAL) snprintf(buf, n, "final");
    else snprintf(buf, n, "%d", step);
    return buf;
}

/* "step 2 proj_out", "/inputs/hidden_states", "/final/latents": how a dataset is named in
 * messages (a /inputs dataset has no step). */
static const char *entry_label(int step, const char *group, const char *name, char *buf, size_t n)
{
    if (step >= 0) snprintf(buf, n, "step %d %s", step, name);
    else snprintf(buf, n, "%s/%s", group, name);
    return buf;
}

static const char *ranks_str(uint64_t m, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int r = 0; r < FO_MAX_RANKS && o < n; r++)
        if (m >> r & 1) o += (size_t)snprintf(buf + o, n - o, "%s%d", o ? "," : "", r);
    return buf;
}

static const char *dtype_short(const char *d)
{
    if (!strcmp(d, "float32")) return "f32";
    if (!strcmp(d, "float64")) return "f64";
    if (!strcmp(d, "float16")) return "f16";
    return d;
}

/* ---------- diff / consistency: table ---------- */

typedef struct style {
    const char *red, *bold, *dim, *off;
} style;

static void print_first(const fo_report *r, const style *st)
{
    const fo_entry *en = &r->v[r->first];
    char sl[16], rk[256];
    char lb[400];
    (void)sl;
    printf("%sfirst divergence: %s%s\n", st->red, entry_label(en->step, en->group, en->name, lb, sizeof lb), st->off);
    printf("  %s\n", en->msg ? en->msg : "");
    if (en->ranks_known && en->ranks)
        printf("  ranks: %s%s%s\n", ranks_str(en->ranks, rk, sizeof rk), en->ranks_note ? " — " : "",
               en->ranks_note ? en->ranks_note : "");
    else if (en->ranks_note)
        printf("  ranks: %s\n", en->ranks_note);
}

static void print_only(const char *label, const fo_names *l)
{
    if (!l->n) return;
    printf("%d dataset%s only in %s:", l->n, l->n == 1 ? "" : "s", label);
    int show = l->n < 6 ? l->n : 5;
    for (int i = 0; i < show; i++) printf(" %s%s", l->v[i], i + 1 < show ? "," : "");
    if (show < l->n) printf(", ... (--json lists all)");
    printf("\n");
}

static void print_table(const fo_report *r, const style *st)
{
    int w = 7;
    for (int i = 0; i < r->n; i++) {
        int l = (int)strlen(r->v[i].name);
        if (l > w) w = l;
    }
    if (w > 56) w = 56;
    int cons = r->mode == FO_MODE_CONSISTENCY;
    printf("%s   %-5s %-*s %-16s %-7s %-9s %-16s %-9s %-9s %-12s %-9s %s%s\n", st->bold, "step", w, "dataset", "shape",
           "dtype", "max|A-B|", "at", "rel L2", "max rel", "cosine", "NaN/Inf A|B", "status", st->off);
    for (int i = 0; i < r->n; i++) {
        const fo_entry *en = &r->v[i];
        char sl[16], sa[160], sb[160], sh[330], co[96], dt[40], nf[100];
        step_label(en->step, sl, sizeof sl);
        fo_shape_str(en->ndim_a, en->shape_a, sa, sizeof sa);
        fo_shape_str(en->ndim_b, en->shape_b, sb, sizeof sb);
        snprintf(sh, sizeof sh, "%s%s%s", sa, en->kind == FO_SHAPE ? "|" : "", en->kind == FO_SHAPE ? sb : "");
        snprintf(dt, sizeof dt, "%s", dtype_short(en->dtype_a));
        if (strcmp(en->dtype_a, en->dtype_b)) snprintf(dt, sizeof dt, "%s|%s", dtype_short(en->dtype_a), dtype_short(en->dtype_b));
        co[0] = 0;
        if (en->at >= 0) fo_coords_str(en->ndim_a, en->coords, co, sizeof co);
        snprintf(nf, sizeof nf, "%lld/%lld|%lld/%lld", (long long)en->st.nan_a, (long long)en->st.inf_a,
                 (long long)en->st.nan_b, (long long)en->st.inf_b);
        const char *mark = i == r->first ? ">> " : en->kind != FO_PASS && en->kind != FO_EMPTY ? " ! " : "   ";
        const char *on = i == r->first ? st->red : "", *off = i == r->first ? st->off : "";
        if (en->kind == FO_SHAPE || en->kind == FO_EMPTY) {
            printf("%s%s%-5s %-*.*s %-16s %-7s %-9s %-16s %-9s %-9s %-12s %-9s %s%s\n", on, mark, sl, w, w, en->name, sh,
                   dt, "-", "-", "-", "-", "-", "-", en->kind == FO_SHAPE ? "SHAPE" : "empty (0 elements)", off);
            continue;
        }
        char status[32];
        snprintf(status, sizeof status, "%s", en->kind == FO_PASS ? "ok" : en->kind == FO_TOL ? "DIVERGE"
                                             : en->kind == FO_NONFINITE ? "NONFINITE" : "UNEQUAL");
        if (cons && en->kind == FO_PASS) snprintf(status, sizeof status, "identical");
        printf("%s%s%-5s %-*.*s %-16s %-7s %-9.2e %-16s %-9.2e %-9.2e %-12.9f %-12s %s%s\n", on, mark, sl, w, w,
               en->name, sh, dt, en->st.max_abs, co, en->st.rel_l2, fo_stats_max_rel(&en->st), en->st.cosine, nf,
               status, off);
    }
}

/* "276 tensors compared; 0 only in A, 0 only in B" (+ empty, excluded, undeclared, partial) */
static const char *counts_str(const fo_report *r, char *buf, size_t n)
{
    size_t o = (size_t)snprintf(buf, n, "%d tensor%s compared", r->n_compared, r->n_compared == 1 ? "" : "s");
    if (r->n_empty && o < n) o += (size_t)snprintf(buf + o, n - o, ", %d empty (not compared)", r->n_empty);
    if (o < n) o += (size_t)snprintf(buf + o, n - o, "; %d only in A", r->only_a.n);
    if (r->undeclared_a.n && o < n) o += (size_t)snprintf(buf + o, n - o, " (%d undeclared)", r->undeclared_a.n);
    if (o < n) o += (size_t)snprintf(buf + o, n - o, ", %d only in B", r->only_b.n);
    if (r->undeclared_b.n && o < n) o += (size_t)snprintf(buf + o, n - o, " (%d undeclared)", r->undeclared_b.n);
    if (r->excluded && o < n) o += (size_t)snprintf(buf + o, n - o, "; %d left out by --modules/--steps", r->excluded);
    if (r->partial_note && o < n) o += (size_t)snprintf(buf + o, n - o, "; %s", r->partial_note);
    return buf;
}

static const char *verdict_word(fo_verdict v) { return v == FO_VERDICT_PASS ? "PASS" : v == FO_VERDICT_DIVERGE ? "DIVERGE" : "ERROR"; }

static void print_diff_human(const fo_report *r, const opts *o, const style *st)
{
    char cn[2048], lb[400];
    const int cons = r->mode == FO_MODE_CONSISTENCY;
    if (o->quiet) {
        counts_str(r, cn, sizeof cn);
        if (o->verdict == FO_VERDICT_ERROR) {
            printf("%sERROR%s: %s (%s)\n", st->red, st->off, o->why, cn);
        } else if (r->first >= 0) {
            const fo_entry *en = &r->v[r->first];
            printf("%sDIVERGE%s at %s: %s (%d of %d compared tensors fail; %s)\n", st->red, st->off,
                   entry_label(en->step, en->group, en->name, lb, sizeof lb), en->msg, r->nfail, r->n_compared, cn);
        } else if (o->verdict == FO_VERDICT_DIVERGE) {
            printf("DIVERGE: names on one side only (--strict): %s\n", cn);
        } else {
            printf("PASS: %s; all %s\n", cn, cons ? "identical across ranks" : "within tolerance");
        }
        return;
    }
    print_table(r, st);
    printf("\n");
    if (cons) {
        printf("%d replicated datasets checked across %d rank files; %d names not marked replicated were not checked\n",
               r->n_compared, r->nfiles, r->unchecked);
        if (r->only_a.n) print_only("some ranks' files (missing on the ranks named)", &r->only_a);
    } else {
        print_only("A", &r->only_a);
        print_only("B", &r->only_b);
    }
    if (r->n_empty) {
        printf("%d empty dataset%s not compared:", r->n_empty, r->n_empty == 1 ? "" : "s");
        for (int i = 0, shown = 0; i < r->n && shown < 5; i++)
            if (r->v[i].kind == FO_EMPTY)
                printf("%s %s (%s)", shown++ ? "," : "", entry_label(r->v[i].step, r->v[i].group, r->v[i].name, lb, sizeof lb),
                       r->v[i].msg);
        printf("%s\n", r->n_empty > 5 ? ", ... (--json lists all)" : "");
    }
    if (r->first >= 0) print_first(r, st);
    counts_str(r, cn, sizeof cn);
    if (o->verdict == FO_VERDICT_ERROR)
        printf("%sERROR%s: %s\n(%s)\n", st->red, st->off, o->why, cn);
    else if (!cons)
        printf("%s: %d of %d compared tensors out of tolerance (rtol %g, atol %g, mtol %g%s); %s\n",
               verdict_word(o->verdict), r->nfail, r->n_compared, r->tol.rtol, r->tol.atol, r->tol.mtol,
               r->with_truth ? ", arbiter --truth" : "", cn);
    else
        printf("%s: %d of %d replicated datasets differ across ranks; %s\n", verdict_word(o->verdict), r->nfail,
               r->n_compared, cn);
    if (!cons && r->with_truth)
        printf("(arbiter: A's error vs the truth at most %g x B's on rel L2, %g x on max rel, + tol/10)\n", r->tol.m_rel,
               r->tol.m_max);
}

/* ---------- JSON ---------- */

static cJSON *json_shape(int ndim, const int64_t *shape)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < ndim; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[i]));
    return a;
}

static void json_num(cJSON *o, const char *k, double v)
{
    if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
    else cJSON_AddNullToObject(o, k); /* JSON has no Inf/NaN */
}

static void json_stats(cJSON *o, const fo_stats *s)
{
    json_num(o, "max_abs", s->max_abs);
    json_num(o, "rel_l2", s->rel_l2);
    json_num(o, "max_rel", fo_stats_max_rel(s));
    json_num(o, "cosine", s->cosine);
    cJSON_AddNumberToObject(o, "nan_a", (double)s->nan_a);
    cJSON_AddNumberToObject(o, "inf_a", (double)s->inf_a);
    cJSON_AddNumberToObject(o, "nan_b", (double)s->nan_b);
    cJSON_AddNumberToObject(o, "inf_b", (double)s->inf_b);
}

static cJSON *json_entry(const fo_entry *en)
{
    cJSON *o = cJSON_CreateObject();
    if (en->step >= 0) cJSON_AddNumberToObject(o, "step", en->step);
    else cJSON_AddNullToObject(o, "step");
    cJSON_AddStringToObject(o, "group", en->group);
    cJSON_AddStringToObject(o, "name", en->name);
    if (en->kind == FO_EMPTY) cJSON_AddNullToObject(o, "pass"); /* not compared: no verdict */
    else cJSON_AddBoolToObject(o, "pass", en->kind == FO_PASS);
    cJSON_AddStringToObject(o, "kind", fo_kind_name(en->kind));
    cJSON_AddItemToObject(o, "shape_a", json_shape(en->ndim_a, en->shape_a));
    cJSON_AddItemToObject(o, "shape_b", json_shape(en->ndim_b, en->shape_b));
    cJSON_AddStringToObject(o, "dtype_a", en->dtype_a);
    cJSON_AddStringToObject(o, "dtype_b", en->dtype_b);
    if (en->kind != FO_SHAPE && en->kind != FO_EMPTY) {
        json_stats(o, &en->st);
        if (en->at >= 0) {
            cJSON_AddItemToObject(o, "at", json_shape(en->ndim_a, en->coords));
            if (en->where[0]) cJSON_AddStringToObject(o, "where", en->where);
            json_num(o, "value_a", en->val_a);
            json_num(o, "value_b", en->val_b);
        }
        if (en->has_truth) {
            cJSON *t = cJSON_CreateObject();
            json_num(t, "rel_l2_a", en->st_a_truth.rel_l2);
            json_num(t, "rel_l2_b", en->st_b_truth.rel_l2);
            json_num(t, "max_rel_a", fo_stats_max_rel(&en->st_a_truth));
            json_num(t, "max_rel_b", fo_stats_max_rel(&en->st_b_truth));
            cJSON_AddItemToObject(o, "truth", t);
        }
    }
    cJSON *rk = cJSON_CreateArray();
    for (int r = 0; r < FO_MAX_RANKS; r++)
        if (en->ranks >> r & 1) cJSON_AddItemToArray(rk, cJSON_CreateNumber(r));
    cJSON_AddItemToObject(o, "ranks", rk);
    if (en->ranks_note) cJSON_AddStringToObject(o, "distribution", en->ranks_note);
    if (en->msg) cJSON_AddStringToObject(o, "message", en->msg);
    return o;
}

static void print_diff_json(const fo_report *r, const opts *o)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "verdict", o->verdict == FO_VERDICT_PASS      ? "pass"
                                             : o->verdict == FO_VERDICT_DIVERGE ? "diverge"
                                                                                 : "error");
    if (o->verdict == FO_VERDICT_ERROR) cJSON_AddStringToObject(root, "error", o->why);
    cJSON_AddStringToObject(root, "mode", r->mode == FO_MODE_DIFF ? "diff" : "consistency");
    cJSON *files = cJSON_CreateArray();
    for (int i = 0; i < o->nfiles; i++) cJSON_AddItemToArray(files, cJSON_CreateString(o->files[i]));
    cJSON_AddItemToObject(root, "files", files);
    if (o->truth) cJSON_AddStringToObject(root, "truth", o->truth);
    cJSON *tol = cJSON_CreateObject();
    cJSON_AddNumberToObject(tol, "rtol", r->tol.rtol);
    cJSON_AddNumberToObject(tol, "atol", r->tol.atol);
    cJSON_AddNumberToObject(tol, "mtol", r->tol.mtol);
    if (r->with_truth) cJSON_AddNumberToObject(tol, "multiplier", r->multiplier);
    cJSON_AddItemToObject(root, "tolerance", tol);
    if (r->first >= 0) cJSON_AddItemToObject(root, "first_divergence", json_entry(&r->v[r->first]));
    else cJSON_AddNullToObject(root, "first_divergence");
    cJSON_AddNumberToObject(root, "n_compared", r->n_compared);
    cJSON_AddNumberToObject(root, "n_failed", r->nfail);
    cJSON_AddNumberToObject(root, "n_empty", r->n_empty);
    cJSON_AddNumberToObject(root, "n_excluded", r->excluded);
    if (r->partial_note) cJSON_AddStringToObject(root, "partial", r->partial_note);
    if (r->mode == FO_MODE_CONSISTENCY) cJSON_AddNumberToObject(root, "n_unchecked", r->unchecked);
    cJSON *oa = cJSON_CreateArray(), *ob = cJSON_CreateArray();
    for (int i = 0; i < r->only_a.n; i++) cJSON_AddItemToArray(oa, cJSON_CreateString(r->only_a.v[i]));
    for (int i = 0; i < r->only_b.n; i++) cJSON_AddItemToArray(ob, cJSON_CreateString(r->only_b.v[i]));
    cJSON_AddItemToObject(root, "only_in_a", oa);
    cJSON_AddItemToObject(root, "only_in_b", ob);
    cJSON *ua = cJSON_CreateArray(), *ub = cJSON_CreateArray();
    for (int i = 0; i < r->undeclared_a.n; i++) cJSON_AddItemToArray(ua, cJSON_CreateString(r->undeclared_a.v[i]));
    for (int i = 0; i < r->undeclared_b.n; i++) cJSON_AddItemToArray(ub, cJSON_CreateString(r->undeclared_b.v[i]));
    cJSON_AddItemToObject(root, "undeclared_only_in_a", ua);
    cJSON_AddItemToObject(root, "undeclared_only_in_b", ub);
    cJSON *ds = cJSON_CreateArray();
    for (int i = 0; i < r->n; i++) cJSON_AddItemToArray(ds, json_entry(&r->v[i]));
    cJSON_AddItemToObject(root, "datasets", ds);
    char *txt = cJSON_Print(root);
    if (txt) puts(txt);
    free(txt);
    cJSON_Delete(root);
}

/* ---------- HTML ---------- */

/* Length of the valid UTF-8 sequence at s (1-4), or 0 when it is not one. Names come from files
 * anyone may have written; XML and HTML readers reject invalid UTF-8, so such bytes become '?'. */
static int utf8_len(const unsigned char *s)
{
    if (s[0] < 0x80) return 1;
    int n = (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (!n || (n == 2 && s[0] < 0xc2) || (n == 4 && s[0] > 0xf4)) return 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return n;
}

/* Escaped text for HTML and XML (attributes too): markup characters as entities, control
 * characters (not allowed in XML 1.0) and invalid UTF-8 as '?'. */
static void html_esc(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; p && *p;) {
        int n = utf8_len(p);
        if (n == 0) {
            fputc('?', f), p++;
            continue;
        }
        if (n > 1) {
            fwrite(p, 1, (size_t)n, f), p += n;
            continue;
        }
        switch (*p) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(*p < 0x20 && *p != '\n' && *p != '\t' ? '?' : *p, f);
        }
        p++;
    }
}

/* ---------- report files: written whole or not at all ---------- */

typedef void (*writer_fn)(FILE *f, const fo_report *r, const opts *o, const char *err);

/* Writes `path` through `fn` into PATH.tmp.PID beside it, then renames it into place, so a full
 * disk or an interrupted run never leaves a truncated report at the path a CI job publishes. */
static int write_report_file(const char *path, const char *what, writer_fn fn, const fo_report *r, const opts *o,
                             const char *err, fs_err *e)
{
    int n = snprintf(g_tmp_path, sizeof g_tmp_path, "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof g_tmp_path) {
        g_tmp_path[0] = 0;
        return fs_errf(e, FS_E_IO, "%s: cannot write the %s: path too long", path, what);
    }
    FILE *f = fopen(g_tmp_path, "w");
    if (!f) {
        int rc = fs_errf(e, FS_E_IO, "%s: cannot write the %s: %s", path, what, strerror(errno));
        g_tmp_path[0] = 0;
        return rc;
    }
    fn(f, r, o, err);
    int bad = ferror(f), why = bad ? (errno ? errno : EIO) : 0;
    if (fflush(f) != 0 && !bad) bad = 1, why = errno;
    if (fsync(fileno(f)) != 0 && !bad && errno != EINVAL && errno != EROFS) bad = 1, why = errno;
    if (fclose(f) != 0 && !bad) bad = 1, why = errno;
    if (!bad && rename(g_tmp_path, path) != 0) bad = 1, why = errno;
    if (bad) unlink(g_tmp_path);
    g_tmp_path[0] = 0;
    if (bad) return fs_errf(e, FS_E_IO, "%s: cannot write the %s: %s", path, what, strerror(why));
    return FS_OK;
}

/* The plot: x = position in execution order, y = log10 of the error (rel L2 as lines, one per
 * step group; max rel as dots), dashed lines at rtol and mtol, the first divergence marked. */
static void html_svg(FILE *f, const fo_report *r)
{
    const double W = 1100, H = 420, L = 70, R = 150, T = 30, B = 50;
    double lo = 0, hi = -20;
    int any = 0;
    for (int i = 0; i < r->n; i++) {
        const fo_entry *en = &r->v[i];
        if (en->kind == FO_SHAPE) continue;
        double v[2] = {en->st.rel_l2, fo_stats_max_rel(&en->st)};
        for (int k = 0; k < 2; k++)
            if (v[k] > 0 && isfinite(v[k])) {
                double l = log10(v[k]);
                if (!any || l < lo) lo = l;
                if (!any || l > hi) hi = l;
                any = 1;
            }
    }
    double tl[2] = {r->tol.rtol, r->tol.mtol};
    for (int k = 0; k < 2; k++)
        if (tl[k] > 0) {
            double l = log10(tl[k]);
            if (!any || l < lo) lo = l;
            if (!any || l > hi) hi = l;
            any = 1;
        }
    if (!any) lo = -8, hi = 0;
    lo = floor(lo) - 1; /* room below for exact zeros, drawn on the floor */
    hi = ceil(hi) + 1;  /* and above for non-finite / shape failures, drawn on the ceiling */
    if (hi - lo < 2) hi = lo + 2;
    int n = r->n > 1 ? r->n : 2;
#define X(i) (L + (W - L - R) * (double)(i) / (double)(n - 1))
#define Y(l) (T + (H - T - B) * (hi - (l)) / (hi - lo))
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n", W, H, W, H);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fcfcfc\" stroke=\"#999\"/>\n", L, T,
            W - L - R, H - T - B);
    for (int d = (int)lo; d <= (int)hi; d++) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>", L, Y(d), W - R, Y(d));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">1e%d</text>\n", L - 6, Y(d) + 4, d);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">datasets in execution order "
               "(/inputs, steps, /final)</text>\n", (L + W - R) / 2, H - 12);
    fprintf(f, "<text x=\"14\" y=\"%.1f\" transform=\"rotate(-90 14 %.1f)\" text-anchor=\"middle\">"
               "relative error (log scale)</text>\n", (T + H - B) / 2, (T + H - B) / 2);
    static const char *const pal[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
                                      "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"};
    /* One polyline per group (a step, /inputs, /final). */
    int gi = 0, legend = 0;
    for (int i = 0; i < r->n;) {
        int j = i;
        while (j < r->n && !strcmp(r->v[j].group, r->v[i].group)) j++;
        const char *col = pal[gi % (int)FS_ARRAY_LEN(pal)];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.4\" points=\"", col);
        for (int k = i; k < j; k++) {
            const fo_entry *en = &r->v[k];
            double v = en->st.rel_l2;
            double l = en->kind == FO_SHAPE || en->kind == FO_NONFINITE || !isfinite(v) ? hi : v > 0 ? log10(v) : lo;
            fprintf(f, "%.1f,%.1f ", X(k), Y(l));
        }
        fprintf(f, "\"/>\n");
        if (j - i == 1) { /* a one-dataset group (/final): a line of one point is invisible */
            const fo_entry *en = &r->v[i];
            double v = en->st.rel_l2;
            double l = en->kind == FO_SHAPE || en->kind == FO_NONFINITE || !isfinite(v) ? hi : v > 0 ? log10(v) : lo;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"6\" height=\"6\" fill=\"%s\"/>\n", X(i) - 3, Y(l) - 3, col);
        }
        for (int k = i; k < j; k++) {
            double v = fo_stats_max_rel(&r->v[k].st);
            if (r->v[k].kind == FO_SHAPE || !(v > 0) || !isfinite(v)) continue;
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"1.6\" fill=\"%s\" opacity=\"0.45\"/>", X(k), Y(log10(v)), col);
        }
        fprintf(f, "\n<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ccc\" stroke-dasharray=\"2,3\"/>\n",
                X(i), T, X(i), H - B);
        if (legend < 16) {
            char sl[16];
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>",
                    W - R + 12, T + 14.0 * legend + 8, W - R + 30, T + 14.0 * legend + 8, col);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s%s</text>\n", W - R + 34, T + 14.0 * legend + 12,
                    r->v[i].step >= 0 ? "step " : "", r->v[i].step >= 0 ? step_label(r->v[i].step, sl, sizeof sl)
                                                                         : r->v[i].group + 1);
            legend++;
        }
        gi++;
        i = j;
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">lines: rel L2</text>", W - R + 12, T + 14.0 * legend + 22);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">dots: max rel</text>\n", W - R + 12, T + 14.0 * legend + 36);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">0: bottom edge</text>", W - R + 12, T + 14.0 * legend + 50);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">NaN/shape: top</text>\n", W - R + 12, T + 14.0 * legend + 64);
    if (r->tol.rtol > 0)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-dasharray=\"6,4\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\">rtol %g</text>\n",
                L, Y(log10(r->tol.rtol)), W - R, Y(log10(r->tol.rtol)), L + 4, Y(log10(r->tol.rtol)) - 4, r->tol.rtol);
    if (r->tol.mtol > 0)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-dasharray=\"1,3\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\">mtol %g</text>\n",
                L, Y(log10(r->tol.mtol)), W - R, Y(log10(r->tol.mtol)), L + 80, Y(log10(r->tol.mtol)) - 4, r->tol.mtol);
    if (r->first >= 0) {
        const fo_entry *en = &r->v[r->first];
        double v = en->st.rel_l2;
        double l = en->kind == FO_SHAPE || en->kind == FO_NONFINITE || !isfinite(v) ? hi : v > 0 ? log10(v) : lo;
        double mv = fo_stats_max_rel(&en->st);
        if (en->kind == FO_TOL && mv > 0 && isfinite(mv) && log10(mv) > l) l = log10(mv);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-width=\"1\"/>", X(r->first),
                T, X(r->first), H - B);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"6\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2.5\"/>",
                X(r->first), Y(l));
        int right = X(r->first) < (L + W - R) / 2;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\" font-weight=\"bold\" text-anchor=\"%s\">"
                   "first divergence: ", X(r->first) + (right ? 8 : -8), T + 14, right ? "start" : "end");
        char lb[400];
        html_esc(f, entry_label(en->step, en->group, en->name, lb, sizeof lb));
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
#undef X
#undef Y
}

static void html_report(FILE *f, const fo_report *r, const opts *o, const char *err)
{
    (void)err;
    int v = o->verdict;
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>flux-oracle %s</title>\n",
            r->mode == FO_MODE_DIFF ? "diff" : "consistency");
    fputs("<style>\nbody{font-family:sans-serif;margin:20px;color:#222}\n"
          "table{border-collapse:collapse;font-size:12px;font-family:monospace}\n"
          "td,th{border-bottom:1px solid #ddd;padding:2px 8px;text-align:right;white-space:nowrap}\n"
          "td.n,th.n{text-align:left}\ntr.fail{background:#fdecea}\ntr.first{background:#f8b7b1;font-weight:bold}\n"
          ".pass{color:#2ca02c}.diverge{color:#d62728}\n"
          "#onlyfail:checked ~ table.all tr.ok{display:none}\n</style>\n</head>\n<body>\n", f);
    fprintf(f, "<h1>flux-oracle %s: <span class=\"%s\">%s</span></h1>\n<p>", r->mode == FO_MODE_DIFF ? "diff" : "consistency",
            v ? "diverge" : "pass", verdict_word(o->verdict));
    for (int i = 0; i < o->nfiles; i++) {
        fputs(i ? "<br/><code>" : "<code>", f);
        html_esc(f, o->files[i]);
        fputs("</code>", f);
        if (r->mode == FO_MODE_DIFF) fputs(i == 0 ? " (A, candidate)" : " (B, reference)", f);
    }
    if (o->truth) {
        fputs("<br/>truth: <code>", f);
        html_esc(f, o->truth);
        fprintf(f, "</code> (m = %g)", r->multiplier);
    }
    char cn[2048];
    fprintf(f, "</p>\n<p>%d out of tolerance; rtol %g, atol %g, mtol %g. ", r->nfail, r->tol.rtol, r->tol.atol,
            r->tol.mtol);
    html_esc(f, counts_str(r, cn, sizeof cn));
    fputs(".</p>\n", f);
    if (o->verdict == FO_VERDICT_ERROR) {
        fputs("<p class=\"diverge\"><b>Error:</b> ", f);
        html_esc(f, o->why);
        fputs("</p>\n", f);
    }
    if (r->first >= 0) {
        const fo_entry *en = &r->v[r->first];
        char lb[400], rk[256];
        fputs("<p class=\"diverge\"><a href=\"#first\">First divergence</a>: <code>", f);
        html_esc(f, entry_label(en->step, en->group, en->name, lb, sizeof lb));
        fputs("</code>: ", f);
        html_esc(f, en->msg);
        if (en->ranks) fprintf(f, "; ranks %s", ranks_str(en->ranks, rk, sizeof rk));
        fputs("</p>\n", f);
    }
    html_svg(f, r);
    /* Failures only: a list first (works without CSS), then the table's toggle. */
    if (r->nfail) {
        fprintf(f, "<h2>Failing datasets (%d)</h2>\n<ul>\n", r->nfail);
        for (int i = 0; i < r->n; i++) {
            const fo_entry *en = &r->v[i];
            if (en->kind == FO_PASS || en->kind == FO_EMPTY) continue;
            char lb[400];
            fputs("<li><code>", f);
            html_esc(f, entry_label(en->step, en->group, en->name, lb, sizeof lb));
            fputs("</code>: ", f);
            html_esc(f, en->msg);
            fputs("</li>\n", f);
        }
        fputs("</ul>\n", f);
    }
    fputs("<h2>All datasets</h2>\n<input type=\"checkbox\" id=\"onlyfail\"/> <label for=\"onlyfail\">show only failing "
          "datasets</label>\n", f);
    fputs("<table class=\"all\">\n<tr><th>#</th><th>step</th><th class=\"n\">dataset</th><th class=\"n\">shape</th><th>dtype</th>"
          "<th>max|A-B|</th><th class=\"n\">at</th><th>rel L2</th><th>max rel</th><th>cosine</th>"
          "<th>NaN/Inf A|B</th><th>ranks</th><th class=\"n\">status</th></tr>\n", f);
    for (int i = 0; i < r->n; i++) {
        const fo_entry *en = &r->v[i];
        char sl[16], sh[160], sb[160], co[96], rk[256];
        fo_shape_str(en->ndim_a, en->shape_a, sh, sizeof sh);
        fo_shape_str(en->ndim_b, en->shape_b, sb, sizeof sb);
        co[0] = 0;
        if (en->at >= 0) fo_coords_str(en->ndim_a, en->coords, co, sizeof co);
        fprintf(f, "<tr%s><td>%d</td><td>%s</td><td class=\"n\">", i == r->first ? " class=\"first\" id=\"first\""
                                                                     : en->kind != FO_PASS && en->kind != FO_EMPTY ? " class=\"fail\""
                                                                                                : " class=\"ok\"",
                i, step_label(en->step, sl, sizeof sl));
        html_esc(f, en->name);
        fprintf(f, "</td><td class=\"n\">%s%s%s</td><td>%s%s%s</td>", sh, en->kind == FO_SHAPE ? " | " : "",
                en->kind == FO_SHAPE ? sb : "", dtype_short(en->dtype_a), strcmp(en->dtype_a, en->dtype_b) ? "|" : "",
                strcmp(en->dtype_a, en->dtype_b) ? dtype_short(en->dtype_b) : "");
        if (en->kind == FO_SHAPE || en->kind == FO_EMPTY)
            fputs("<td>-</td><td class=\"n\">-</td><td>-</td><td>-</td><td>-</td><td>-</td>", f);
        else
            fprintf(f, "<td>%.3e</td><td class=\"n\" title=\"%s\">%s</td><td>%.3e</td><td>%.3e</td><td>%.9f</td>"
                       "<td>%lld/%lld | %lld/%lld</td>",
                    en->st.max_abs, en->where, co, en->st.rel_l2, fo_stats_max_rel(&en->st), en->st.cosine,
                    (long long)en->st.nan_a, (long long)en->st.inf_a, (long long)en->st.nan_b, (long long)en->st.inf_b);
        fprintf(f, "<td>%s</td><td class=\"n\">%s</td></tr>\n", en->ranks ? ranks_str(en->ranks, rk, sizeof rk) : "",
                en->kind == FO_PASS ? "ok" : en->kind == FO_EMPTY ? "empty (0 elements)" : fo_kind_name(en->kind));
    }
    fputs("</table>\n", f);
    for (int k = 0; k < 2; k++) {
        const fo_names *l = k ? &r->only_b : &r->only_a;
        if (!l->n) continue;
        fprintf(f, "<details><summary>%d only in %s</summary><pre>", l->n, k ? "B" : "A");
        for (int i = 0; i < l->n; i++) {
            html_esc(f, l->v[i]);
            fputc('\n', f);
        }
        fputs("</pre></details>\n", f);
    }
    fputs("</body>\n</html>\n", f);
}

/* ---------- JUnit XML ----------
 * One <testcase> per compared tensor (classname: the group, "step_0002" / "inputs" / "final";
 * name: the dataset), a <failure> carrying the metrics, tolerance and coordinates; <skipped> for
 * empty datasets and names one side declared unrecorded (<failure> with --strict); <error> for
 * names missing without a declaration and for a comparison that could not run at all (`err`:
 * partial dump, different models, unreadable file). */

static const char *junit_class(const char *group)
{
    return group[0] == '/' ? group + 1 : group;
}

static void junit_only(FILE *f, const fo_names *l, const fo_names *undeclared, const char *side, const char *other,
                       int strict)
{
    for (int i = 0; i < l->n; i++) {
        const char *p = l->v[i] + (l->v[i][0] == '/'), *slash = strchr(p, '/');
        int und = 0;
        for (int k = 0; k < undeclared->n && !und; k++) und = !strcmp(undeclared->v[k], l->v[i]);
        fputs("  <testcase classname=\"", f);
        if (slash) fprintf(f, "%.*s", (int)(slash - p), p);
        fputs("\" name=\"", f);
        html_esc(f, slash ? slash + 1 : p);
        fputs("\" time=\"0\">", f);
        if (und)
            fprintf(f, "<error type=\"missing\" message=\"only in %s: %s lacks it and declares no reason\"/>", side, other);
        else if (strict)
            fprintf(f, "<failure type=\"only-in-%s\" message=\"only in %s: %s declared it unrecorded (--strict)\"/>",
                    side, side, other);
        else
            fprintf(f, "<skipped message=\"only in %s: %s declared it unrecorded\"/>", side, other);
        fputs("</testcase>\n", f);
    }
}

static void junit_report(FILE *f, const fo_report *r, const opts *o, const char *err)
{
    int tests = 0, failures = 0, errors = 0, skipped = 0;
    if (err) tests = errors = 1;
    else {
        tests = r->n + r->only_a.n + r->only_b.n;
        failures = r->nfail + (o->strict ? r->only_a.n + r->only_b.n - r->undeclared_a.n - r->undeclared_b.n : 0);
        errors = r->undeclared_a.n + r->undeclared_b.n;
        skipped = r->n_empty + (o->strict ? 0 : r->only_a.n + r->only_b.n - r->undeclared_a.n - r->undeclared_b.n);
        if (r->n_compared == 0) tests++, errors++; /* the "nothing compared" case */
    }
    fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", f);
    fprintf(f, "<testsuites name=\"flux-oracle\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"%d\">\n", tests,
            failures, errors, skipped);
    fputs(" <testsuite name=\"flux-oracle diff ", f);
    html_esc(f, o->files[0]);
    fputs(" vs ", f);
    html_esc(f, o->files[1]);
    fprintf(f, "\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"%d\" time=\"0\">\n", tests, failures, errors,
            skipped);
    fputs("  <properties>\n   <property name=\"candidate\" value=\"", f);
    html_esc(f, o->files[0]);
    fputs("\"/>\n   <property name=\"reference\" value=\"", f);
    html_esc(f, o->files[1]);
    fputs("\"/>\n", f);
    if (o->truth) {
        fputs("   <property name=\"truth\" value=\"", f);
        html_esc(f, o->truth);
        fputs("\"/>\n", f);
    }
    if (!err) {
        char cn[2048];
        fprintf(f, "   <property name=\"tolerance\" value=\"rtol %g, atol %g, mtol %g%s\"/>\n", r->tol.rtol, r->tol.atol,
                r->tol.mtol, r->with_truth ? ", arbiter --truth" : "");
        fprintf(f, "   <property name=\"verdict\" value=\"%s\"/>\n", verdict_word(o->verdict));
        fputs("   <property name=\"summary\" value=\"", f);
        html_esc(f, counts_str(r, cn, sizeof cn));
        fputs("\"/>\n", f);
    }
    fputs("  </properties>\n", f);
    if (err) {
        fputs("  <testcase classname=\"flux-oracle\" name=\"comparison\" time=\"0\"><error type=\"error\" message=\"", f);
        html_esc(f, err);
        fputs("\"/></testcase>\n </testsuite>\n</testsuites>\n", f);
        return;
    }
    if (r->n_compared == 0) {
        fputs("  <testcase classname=\"flux-oracle\" name=\"comparison\" time=\"0\"><error type=\"nothing-compared\" "
              "message=\"", f);
        html_esc(f, o->why);
        fputs("\"/></testcase>\n", f);
    }
    for (int i = 0; i < r->n; i++) {
        const fo_entry *en = &r->v[i];
        char co[96], sa[160], sb[160];
        fprintf(f, "  <testcase classname=\"%s\" name=\"", junit_class(en->group));
        html_esc(f, en->name);
        fputs("\" time=\"0\">", f);
        if (en->kind == FO_EMPTY) {
            fputs("<skipped message=\"", f);
            html_esc(f, en->msg);
            fputs("\"/>", f);
        } else if (en->kind != FO_PASS) {
            fprintf(f, "<failure type=\"%s\" message=\"", fo_kind_name(en->kind));
            html_esc(f, en->msg);
            fputs("\">", f);
            if (en->kind == FO_SHAPE) {
                fprintf(f, "shape A %s vs B %s\n", fs_shape_str(en->ndim_a, en->shape_a, sa, sizeof sa),
                        fs_shape_str(en->ndim_b, en->shape_b, sb, sizeof sb));
            } else {
                fprintf(f, "rel L2 %.6g\nmax|A-B|/max|B| %.6g\nmax|A-B| %.6g\ncosine %.9f\n", en->st.rel_l2,
                        fo_stats_max_rel(&en->st), en->st.max_abs, en->st.cosine);
                fprintf(f, "tolerance rtol %g, atol %g, mtol %g%s\n", r->tol.rtol, r->tol.atol, r->tol.mtol,
                        en->has_truth ? " (arbiter --truth)" : "");
                fprintf(f, "NaN A/B %lld/%lld, Inf A/B %lld/%lld\n", (long long)en->st.nan_a, (long long)en->st.nan_b,
                        (long long)en->st.inf_a, (long long)en->st.inf_b);
                if (en->at >= 0) {
                    fprintf(f, "at %s", fo_coords_str(en->ndim_a, en->coords, co, sizeof co));
                    if (en->where[0]) {
                        fputs(" (", f);
                        html_esc(f, en->where);
                        fputs(")", f);
                    }
                    fprintf(f, ": A %.9g vs B %.9g\n", en->val_a, en->val_b);
                }
            }
            fputs("</failure>", f);
        }
        fputs("</testcase>\n", f);
    }
    junit_only(f, &r->only_a, &r->undeclared_a, "A", "B", o->strict);
    junit_only(f, &r->only_b, &r->undeclared_b, "B", "A", o->strict);
    fputs(" </testsuite>\n</testsuites>\n", f);
}

/* ---------- stats ---------- */

/* An error as the documented JSON, for consumers that read stdout only. */
static void json_error(const char *msg)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "verdict", "error");
    cJSON_AddStringToObject(root, "error", msg);
    char *t = cJSON_Print(root);
    if (t) puts(t);
    free(t);
    cJSON_Delete(root);
}

static int run_stats(opts *o, const style *st)
{
    fs_err e = {0};
    fo_file *a = NULL;
    if (fo_file_open(&a, o->files[0], &e)) {
        if (o->json) json_error(e.msg);
        return die(e.msg);
    }
    fo_stat_report r;
    int rc = fo_stats_run(a, &o->d, &r, &e);
    if (rc) {
        fo_stat_report_free(&r);
        fo_file_close(a);
        if (o->json) json_error(e.msg);
        return die(e.msg);
    }
    char lb[400];
    int bad = r.first_nonfinite >= 0;
    errno = 0;
    char sl[16], sh[160], co[96];
    if (o->json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "verdict", bad ? "nonfinite" : "finite");
        cJSON_AddStringToObject(root, "file", o->files[0]);
        cJSON_AddStringToObject(root, "dtype", fo_file_dtype(a));
        cJSON_AddNumberToObject(root, "n_datasets", r.n);
        cJSON_AddNumberToObject(root, "n_empty", r.n_empty);
        if (r.partial_note) cJSON_AddStringToObject(root, "partial", r.partial_note);
        cJSON *ds = cJSON_CreateArray(), *first = NULL;
        for (int i = 0; i < r.n; i++) {
            const fo_stat_entry *en = &r.v[i];
            cJSON *j = cJSON_CreateObject();
            if (en->step >= 0) cJSON_AddNumberToObject(j, "step", en->step);
            else cJSON_AddNullToObject(j, "step");
            cJSON_AddStringToObject(j, "group", en->group);
            cJSON_AddStringToObject(j, "name", en->name);
            cJSON_AddItemToObject(j, "shape", json_shape(en->ndim, en->shape));
            cJSON_AddStringToObject(j, "dtype", en->dtype);
            cJSON_AddBoolToObject(j, "empty", en->s.n == 0);
            json_num(j, "min", en->s.min);
            json_num(j, "max", en->s.max);
            json_num(j, "mean", en->s.mean);
            json_num(j, "std", en->s.std);
            cJSON_AddNumberToObject(j, "nan", (double)en->s.nan);
            cJSON_AddNumberToObject(j, "inf", (double)en->s.inf);
            if (en->s.first_nonfinite >= 0) cJSON_AddItemToObject(j, "first_nonfinite_at", json_shape(en->ndim, en->coords));
            if (i == r.first_nonfinite) first = cJSON_Duplicate(j, 1);
            cJSON_AddItemToArray(ds, j);
        }
        if (first) cJSON_AddItemToObject(root, "first_nonfinite", first);
        else cJSON_AddNullToObject(root, "first_nonfinite");
        cJSON_AddItemToObject(root, "datasets", ds);
        char *txt = cJSON_Print(root);
        if (txt) puts(txt);
        free(txt);
        cJSON_Delete(root);
    } else if (o->quiet) {
        if (bad) {
            const fo_stat_entry *en = &r.v[r.first_nonfinite];
            printf("%sNONFINITE%s: first at %s %s (%s)\n", st->red, st->off,
                   entry_label(en->step, en->group, en->name, lb, sizeof lb), fo_coords_str(en->ndim, en->coords, co, sizeof co),
                   isnan(en->first_value) ? "NaN" : en->first_value > 0 ? "+Inf" : "-Inf");
        } else {
            printf("FINITE: %d datasets", r.n - r.n_empty);
            if (r.n_empty) printf(", %d empty (0 elements)", r.n_empty);
            if (r.partial_note) printf("; %s", r.partial_note);
            printf("\n");
        }
    } else {
        int w = 7;
        for (int i = 0; i < r.n; i++)
            if ((int)strlen(r.v[i].name) > w) w = (int)strlen(r.v[i].name);
        if (w > 56) w = 56;
        printf("%s   %-5s %-*s %-16s %-7s %-11s %-11s %-11s %-10s %-8s %s%s\n", st->bold, "step", w, "dataset", "shape",
               "dtype", "min", "max", "mean", "std", "NaN", "Inf", st->off);
        for (int i = 0; i < r.n; i++) {
            const fo_stat_entry *en = &r.v[i];
            const char *on = i == r.first_nonfinite ? st->red : "", *off = i == r.first_nonfinite ? st->off : "";
            if (en->s.n == 0) {
                printf("%s   %-5s %-*.*s %-16s %-7s empty (0 elements)\n", on, step_label(en->step, sl, sizeof sl), w, w,
                       en->name, fo_shape_str(en->ndim, en->shape, sh, sizeof sh), dtype_short(en->dtype));
                continue;
            }
            printf("%s%s%-5s %-*.*s %-16s %-7s %-11.4e %-11.4e %-11.4e %-10.3e %-8lld %lld%s\n", on,
                   i == r.first_nonfinite ? ">> " : en->s.nan || en->s.inf ? " ! " : "   ",
                   step_label(en->step, sl, sizeof sl), w, w, en->name, fo_shape_str(en->ndim, en->shape, sh, sizeof sh),
                   dtype_short(en->dtype), en->s.min, en->s.max, en->s.mean, en->s.std, (long long)en->s.nan,
                   (long long)en->s.inf, off);
        }
        printf("\n");
        if (r.partial_note) printf("%s\n", r.partial_note);
        if (bad) {
            const fo_stat_entry *en = &r.v[r.first_nonfinite];
            printf("%sfirst NaN/Inf in execution order: %s at %s (%s)%s\n", st->red,
                   entry_label(en->step, en->group, en->name, lb, sizeof lb), fo_coords_str(en->ndim, en->coords, co, sizeof co),
                   isnan(en->first_value) ? "NaN" : en->first_value > 0 ? "+Inf" : "-Inf", st->off);
        } else {
            printf("all %d datasets with values finite", r.n - r.n_empty);
            if (r.n_empty) printf("; %d empty (0 elements)", r.n_empty);
            printf("\n");
        }
    }
    note_stdout();
    fo_stat_report_free(&r);
    fo_file_close(a);
    return bad ? 1 : 0;
}

/* ---------- main ---------- */

/* Everything printed must have reached stdout: `diff --json > /full/disk/r.json` must not exit 0
 * with half a document there. glibc drops a buffer it failed to write, so the reason (errno) is
 * taken right after each block of output (note_stdout), not only at the final flush. */

static int finish(int status)
{
    note_stdout();
    errno = 0;
    int bad = fflush(stdout) != 0;
    int why = bad ? errno : 0;
    if (ferror(stdout)) bad = 1;
    if (g_out_errno) why = g_out_errno;
    if (bad) {
        fprintf(stderr, "flux-oracle: error: cannot write to standard output: %s\n", strerror(why ? why : EIO));
        return 2;
    }
    return status;
}

static int run(opts *o, const style *st)
{
    if (!strcmp(o->cmd, "stats")) {
        if (o->html) return die("--html applies to diff and consistency");
        return run_stats(o, st);
    }
    fs_err e = {0};
    fo_file *files[FO_MAX_RANKS] = {0}, *truth = NULL;
    int rc = 0;
    for (int i = 0; i < o->nfiles && !rc; i++) rc = fo_file_open(&files[i], o->files[i], &e);
    if (!rc && o->truth) rc = fo_file_open(&truth, o->truth, &e);
    fo_report r;
    fo_report_init(&r, FO_MODE_DIFF);
    const int diff = !strcmp(o->cmd, "diff");
    if (!rc) {
        if (diff) {
            resolve_tol(o, files[0], files[1]);
            rc = fo_diff_run(files[0], files[1], truth, &o->d, &r, &e);
        } else {
            rc = fo_consistency_run(files, o->nfiles, &o->d, &r, &e);
        }
    }
    int status;
    fs_err we = {0};
    if (rc) {
        /* The comparison could not run: the JUnit report still says so (one <error>), so a CI
         * job that publishes it shows the reason; the HTML report is not written. */
        if (o->json) json_error(e.msg);
        status = die(e.msg);
        if (o->junit && write_report_file(o->junit, "JUnit report", junit_report, &r, o, e.msg, &we))
            fprintf(stderr, "flux-oracle: error: %s\n", we.msg);
    } else {
        o->verdict = fo_report_verdict(&r, o->strict, o->files[0], diff ? o->files[1] : NULL, o->why, sizeof o->why);
        status = (int)o->verdict;
        errno = 0;
        if (o->json) print_diff_json(&r, o);
        else print_diff_human(&r, o, st);
        note_stdout();
        if (o->verdict == FO_VERDICT_ERROR) die(o->why);
        if (o->html && write_report_file(o->html, "HTML report", html_report, &r, o, NULL, &we)) status = die(we.msg);
        else if (o->junit && write_report_file(o->junit, "JUnit report", junit_report, &r, o, NULL, &we))
            status = die(we.msg);
    }
    fo_report_free(&r);
    for (int i = 0; i < o->nfiles; i++) fo_file_close(files[i]);
    fo_file_close(truth);
    return status;
}

int main(int argc, char **argv)
{
    /* Every dataset allocates block buffers of similar sizes (ours and HDF5's): keep freed
     * memory for reuse instead of returning it to the kernel and faulting it in again, which
     * cost a third of the run time on 300 MB dumps. Peak memory is unchanged. */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    opts o;
    char err[512];
    int pr = parse_args(argc, argv, &o, err, sizeof err);
    if (pr == 1) {
        usage(stdout);
        opts_free(&o);
        return finish(0);
    }
    if (pr == 3) {
        puts(VERSION);
        opts_free(&o);
        return finish(0);
    }
    if (pr < 0) {
        opts_free(&o);
        return die(err);
    }
    install_guard();
    int color = o.color >= 0 ? o.color : isatty(STDOUT_FILENO) && !o.json;
    style st = color ? (style){"\033[1;31m", "\033[1m", "\033[2m", "\033[0m"} : (style){"", "", "", ""};
    int status = run(&o, &st);
    opts_free(&o);
    return finish(status);
}
