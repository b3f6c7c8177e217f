/* flux-oracle — compare flux-dump files (docs/oracle.md).
 *
 *   flux-oracle diff A.h5 B.h5 [--truth REF64.h5]   A = candidate, B = reference
 *   flux-oracle stats A.h5
 *   flux-oracle consistency r0.h5 r1.h5 ... | DIR [--ref REF.h5]
 *   flux-oracle diff DIR REF.h5 | diff r0.h5 r1.h5 ... REF.h5    per-rank dumps vs a global one
 *   flux-oracle assemble DIR | r0.h5 r1.h5 ... -o GLOBAL.h5
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
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fo_assemble.h"
#include "fo_diff.h"
#include "fo_render.h"

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
#define MAX_REPORTS 2 /* --html, --junit */
static char g_tmp_path[MAX_REPORTS][PATH_MAX + 64]; /* reports being written: removed if we die */

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
    for (int k = 0; k < MAX_REPORTS; k++)
        if (g_tmp_path[k][0]) unlink(g_tmp_path[k]);
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
          "       flux-oracle diff DIR B.h5 [options]       per-rank dumps (DIR/rank_<r>.h5, or R0.h5 R1.h5\n"
          "       flux-oracle diff R0.h5 R1.h5 ... B.h5     ...) against a global reference: each rank's\n"
          "                                                 piece against the slice its sharding map names\n"
          "       flux-oracle stats A.h5 [options]          min/max/mean/std/NaN/Inf per dataset\n"
          "       flux-oracle consistency DIR | R0.h5 R1.h5 ... [--ref B.h5]\n"
          "                                                 per-rank dumps: replicated tensors must be\n"
          "                                                 bitwise identical on every rank; with --ref the\n"
          "                                                 ranks differing from B are named, without it\n"
          "                                                 the split (which ranks agree with which)\n"
          "       flux-oracle assemble DIR | R0.h5 ... -o OUT.h5\n"
          "                                                 one global dump from every rank's dump\n"
          "  -o, --output FILE assemble: the global dump to write (via FILE.tmp.PID, renamed)\n"
          "  --ref B.h5        consistency: the reference that decides which ranks are wrong\n"
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
          "  --color, --no-color  highlight the first divergence [auto: when stdout is a terminal,\n"
          "                    TERM is set and not \"dumb\", and NO_COLOR is unset or empty]\n"
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

typedef struct opts {
    const char *cmd;
    const char *files[FO_MAX_RANKS];
    int nfiles;
    const char *truth, *html, *junit, *output, *ref;
    /* diff of per-rank dumps: the rank files (expanded from DIR) and what reports call A */
    int per_rank, from_dir, per_rank_n;
    char *label_a;
    fo_names expanded;      /* paths read from a folder (owned) */
    const char *shown[2];
    int quiet, json, strict, color;
    fo_diff_opts d;
    fo_globs globs;         /* --modules (owned) */
    fo_steps steps;         /* --steps (owned) */
    /* the verdict, decided once (fo_report_verdict) and rendered by every output */
    fo_verdict verdict;
    char why[1200];
} opts;

static void opts_free(opts *o)
{
    fo_globs_free(&o->globs);
    fo_steps_free(&o->steps);
    fo_names_free(&o->expanded);
    free(o->label_a);
}

static int g_out_errno;

static void note_stdout(void)
{
    if (ferror(stdout) && !g_out_errno) g_out_errno = errno ? errno : EIO;
}

static int g_said; /* an error line is on stderr already: the run's one line */

static int die(const char *msg)
{
    /* one line, whatever a file put into the message (names are escaped where they are
     * formatted; this is the backstop) */
    char shown[4200];
    fprintf(stderr, "flux-oracle: error: %s\n", fs_printable(msg, shown, sizeof shown, 2048));
    g_said = 1;
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
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) { NEED_VAL; o->output = val; }
        else if (!strcmp(a, "--ref")) { NEED_VAL; o->ref = val; }
        else if (!strcmp(a, "--steps")) {
            NEED_VAL;
            char why[256];
            fo_steps_free(&o->steps);
            if (fo_steps_parse(val, &o->steps, why, sizeof why)) { snprintf(err, en, "option --steps: %s", why); return -1; }
            o->d.steps = &o->steps;
        } else if (!strcmp(a, "--modules")) {
            NEED_VAL;
            char why[256];
            fo_globs_free(&o->globs);
            if (fo_globs_parse(val, &o->globs, why, sizeof why)) { snprintf(err, en, "option --modules: %s", why); return -1; }
            o->d.modules = &o->globs;
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
    if (!o->cmd) { snprintf(err, en, "no command: diff, stats, consistency or assemble (see --help)"); return -1; }
    /* diff: two files, or per-rank dumps (a folder, or several files) then the reference;
     * consistency and assemble: a folder or two or more rank files */
    const int is_diff = !strcmp(o->cmd, "diff"), is_cons = !strcmp(o->cmd, "consistency"),
              is_asm = !strcmp(o->cmd, "assemble");
    int want = is_diff ? -2 : !strcmp(o->cmd, "stats") ? 1 : is_cons || is_asm ? -1 : 0;
    if (!want) { snprintf(err, en, "unknown command '%s': diff, stats, consistency or assemble (see --help)", o->cmd); return -1; }
    if ((want > 0 && o->nfiles != want) || (want < 0 && o->nfiles < -want)) {
        snprintf(err, en, "%s takes %s, got %d file%s", o->cmd,
                 is_diff ? "two files (or per-rank dumps and a reference)" : want == 1 ? "one file" : "a folder or rank files",
                 o->nfiles, o->nfiles == 1 ? "" : "s");
        return -1;
    }
    if (o->output && !is_asm) { snprintf(err, en, "-o/--output applies to assemble only"); return -1; }
    if (is_asm && !o->output) { snprintf(err, en, "assemble needs -o GLOBAL.h5"); return -1; }
    if (o->ref && !is_cons) { snprintf(err, en, "--ref applies to consistency only (diff takes the reference as its last file)"); return -1; }
    if (is_asm && (o->json || o->html || o->junit || o->quiet || o->strict || o->d.modules || o->d.steps || o->d.allow_partial)) {
        snprintf(err, en, "assemble takes only its rank files and -o");
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
    printf("%sfirst divergence: %s%s\n", st->red, fo_entry_label(en->step, en->group, en->name, lb, sizeof lb), st->off);
    printf("  %s\n", en->msg ? en->msg : "");
    if (en->ranks_known && en->ranks)
        printf("  ranks: %s%s%s\n", fo_ranks_str(en->ranks, rk, sizeof rk), en->ranks_note ? " — " : "",
               en->ranks_note ? en->ranks_note : "");
    else if (en->ranks_note)
        printf("  ranks: %s\n", en->ranks_note);
}

static void print_only(const char *label, const fo_names *l)
{
    if (!l->n) return;
    printf("%d dataset%s only in %s:", l->n, l->n == 1 ? "" : "s", label);
    int show = l->n < 6 ? l->n : 5;
    for (int i = 0; i < show; i++) printf(" %s%s", FO_SHOW(l->v[i]), i + 1 < show ? "," : "");
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
        fo_step_label(en->step, sl, sizeof sl);
        fo_shape_str(en->ndim_a, en->shape_a, sa, sizeof sa);
        fo_shape_str(en->ndim_b, en->shape_b, sb, sizeof sb);
        snprintf(sh, sizeof sh, "%s%s%s", sa, en->kind == FO_SHAPE ? "|" : "", en->kind == FO_SHAPE ? sb : "");
        snprintf(dt, sizeof dt, "%s", fo_dtype_short(en->dtype_a));
        if (strcmp(en->dtype_a, en->dtype_b)) snprintf(dt, sizeof dt, "%s|%s", fo_dtype_short(en->dtype_a), fo_dtype_short(en->dtype_b));
        co[0] = 0;
        if (en->at >= 0) fo_coords_str(en->ndim_a, en->coords, co, sizeof co);
        snprintf(nf, sizeof nf, "%lld/%lld|%lld/%lld", (long long)en->st.nan_a, (long long)en->st.inf_a,
                 (long long)en->st.nan_b, (long long)en->st.inf_b);
        const char *mark = i == r->first ? ">> " : en->kind != FO_PASS && en->kind != FO_EMPTY ? " ! " : "   ";
        char nm[320];
        fs_printable(en->name, nm, sizeof nm, 200); /* a name from a file drives no terminal */
        const char *on = i == r->first ? st->red : "", *off = i == r->first ? st->off : "";
        if (en->kind == FO_SHAPE || en->kind == FO_EMPTY) {
            printf("%s%s%-5s %-*.*s %-16s %-7s %-9s %-16s %-9s %-9s %-12s %-9s %s%s\n", on, mark, sl, w, w, nm, sh,
                   dt, "-", "-", "-", "-", "-", "-", en->kind == FO_SHAPE ? "SHAPE" : "empty (0 elements)", off);
            continue;
        }
        char status[32];
        snprintf(status, sizeof status, "%s", en->kind == FO_PASS ? "ok" : en->kind == FO_TOL ? "DIVERGE"
                                             : en->kind == FO_NONFINITE ? "NONFINITE" : "UNEQUAL");
        if (cons && en->kind == FO_PASS) snprintf(status, sizeof status, "identical");
        printf("%s%s%-5s %-*.*s %-16s %-7s %-9.2e %-16s %-9.2e %-9.2e %-12.9f %-12s %s%s\n", on, mark, sl, w, w,
               nm, sh, dt, en->st.max_abs, co, en->st.rel_l2, fo_stats_max_rel(&en->st), en->st.cosine, nf,
               status, off);
    }
}


static void print_diff_human(const fo_report *r, const opts *o, const style *st)
{
    char cn[2048], lb[400];
    const int cons = r->mode == FO_MODE_CONSISTENCY;
    if (o->quiet) {
        fo_counts_str(r, cn, sizeof cn);
        if (o->verdict == FO_VERDICT_ERROR) {
            printf("%sERROR%s: %s (%s)\n", st->red, st->off, fs_printable(o->why, (char[2600]){0}, 2600, 1200), cn);
        } else if (r->first >= 0) {
            const fo_entry *en = &r->v[r->first];
            printf("%sDIVERGE%s at %s: %s (%d of %d compared tensors fail; %s)\n", st->red, st->off,
                   fo_entry_label(en->step, en->group, en->name, lb, sizeof lb), en->msg, r->nfail, r->n_compared, cn);
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
                printf("%s %s (%s)", shown++ ? "," : "", fo_entry_label(r->v[i].step, r->v[i].group, r->v[i].name, lb, sizeof lb),
                       r->v[i].msg);
        printf("%s\n", r->n_empty > 5 ? ", ... (--json lists all)" : "");
    }
    if (r->first >= 0) print_first(r, st);
    fo_counts_str(r, cn, sizeof cn);
    if (o->verdict == FO_VERDICT_ERROR)
        printf("%sERROR%s: %s\n(%s)\n", st->red, st->off, fs_printable(o->why, (char[2600]){0}, 2600, 1200), cn);
    else if (!cons)
        printf("%s: %d of %d compared tensors out of tolerance (rtol %g, atol %g, mtol %g%s); %s\n",
               fo_verdict_word(o->verdict), r->nfail, r->n_compared, r->tol.rtol, r->tol.atol, r->tol.mtol,
               r->with_truth ? ", arbiter --truth" : "", cn);
    else
        printf("%s: %d of %d replicated datasets differ across ranks; %s\n", fo_verdict_word(o->verdict), r->nfail,
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
    if (o->per_rank) cJSON_AddBoolToObject(root, "per_rank", 1);
    if (o->ref) cJSON_AddStringToObject(root, "reference", o->ref);
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


/* ---------- report files: all written whole, or none ---------- */

typedef void (*writer_fn)(FILE *f, const fo_report *r, const fo_render_ctx *o, const char *err);

typedef struct report_file {
    const char *path, *what; /* "r.html", "HTML report" */
    writer_fn fn;
} report_file;

static fo_render_ctx render_ctx(const opts *o)
{
    return (fo_render_ctx){.files = o->per_rank ? o->shown : o->files, .nfiles = o->per_rank ? 2 : o->nfiles,
                           .truth = o->truth, .strict = o->strict,
                           .verdict = o->verdict, .why = o->why};
}

static void discard_reports(void)
{
    for (int k = 0; k < MAX_REPORTS; k++)
        if (g_tmp_path[k][0]) unlink(g_tmp_path[k]), g_tmp_path[k][0] = 0;
}

/* Writes report k into PATH.tmp.PID beside its path (left there for write_reports). */
static int stage_report(int k, const report_file *rf, const fo_report *r, const opts *o, const char *err, fs_err *e)
{
    int n = snprintf(g_tmp_path[k], sizeof g_tmp_path[k], "%s.tmp.%ld", rf->path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof g_tmp_path[k]) {
        g_tmp_path[k][0] = 0;
        return fs_errf(e, FS_E_IO, "%s: cannot write the %s: path too long", FO_SHOW(rf->path), rf->what);
    }
    FILE *f = fopen(g_tmp_path[k], "w");
    if (!f) {
        int rc = fs_errf(e, FS_E_IO, "%s: cannot write the %s: %s", FO_SHOW(rf->path), rf->what, strerror(errno));
        g_tmp_path[k][0] = 0;
        return rc;
    }
    const fo_render_ctx ctx = render_ctx(o);
    errno = 0;
    rf->fn(f, r, &ctx, err);
    int bad = ferror(f), why = bad ? (errno ? errno : EIO) : 0;
    if (fflush(f) != 0 && !bad) bad = 1, why = errno;
    if (fsync(fileno(f)) != 0 && !bad && errno != EINVAL && errno != EROFS) bad = 1, why = errno;
    if (fclose(f) != 0 && !bad) bad = 1, why = errno;
    if (bad) return fs_errf(e, FS_E_IO, "%s: cannot write the %s: %s", FO_SHOW(rf->path), rf->what, strerror(why));
    return FS_OK;
}

/* The reports a run asked for, all or none: each is written into a temporary beside its path,
 * and only when every one is complete are they renamed into place (a full disk while writing
 * the JUnit file must not leave the HTML file published: a CI job would show a report of a run
 * that failed). Should a rename fail, the reports already published are removed again. */
static int write_reports(const report_file *rf, int n, const fo_report *r, const opts *o, const char *err, fs_err *e)
{
    int rc = FS_OK;
    for (int k = 0; k < n && !rc; k++) rc = stage_report(k, &rf[k], r, o, err, e);
    for (int k = 0; k < n && !rc; k++)
        if (rename(g_tmp_path[k], rf[k].path) != 0) {
            rc = fs_errf(e, FS_E_IO, "%s: cannot write the %s: %s", FO_SHOW(rf[k].path), rf[k].what, strerror(errno));
            for (int j = 0; j < k; j++) unlink(rf[j].path);
        } else {
            g_tmp_path[k][0] = 0;
        }
    discard_reports();
    return rc;
}

/* 0 when everything printed so far has reached stdout, else its errno (also kept in
 * g_out_errno). A closed pipe is EPIPE here: SIGPIPE is ignored (main). */
static int stdout_failed(void)
{
    note_stdout();
    errno = 0;
    if (fflush(stdout) != 0 && !g_out_errno) g_out_errno = errno ? errno : EIO;
    if (ferror(stdout) && !g_out_errno) g_out_errno = EIO;
    return g_out_errno;
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
                   fo_entry_label(en->step, en->group, en->name, lb, sizeof lb), fo_coords_str(en->ndim, en->coords, co, sizeof co),
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
            char nm[320];
            fs_printable(en->name, nm, sizeof nm, 200);
            if (en->s.n == 0) {
                printf("%s   %-5s %-*.*s %-16s %-7s empty (0 elements)\n", on, fo_step_label(en->step, sl, sizeof sl), w, w,
                       nm, fo_shape_str(en->ndim, en->shape, sh, sizeof sh), fo_dtype_short(en->dtype));
                continue;
            }
            printf("%s%s%-5s %-*.*s %-16s %-7s %-11.4e %-11.4e %-11.4e %-10.3e %-8lld %lld%s\n", on,
                   i == r.first_nonfinite ? ">> " : en->s.nan || en->s.inf ? " ! " : "   ",
                   fo_step_label(en->step, sl, sizeof sl), w, w, nm, fo_shape_str(en->ndim, en->shape, sh, sizeof sh),
                   fo_dtype_short(en->dtype), en->s.min, en->s.max, en->s.mean, en->s.std, (long long)en->s.nan,
                   (long long)en->s.inf, off);
        }
        printf("\n");
        if (r.partial_note) printf("%s\n", r.partial_note);
        if (bad) {
            const fo_stat_entry *en = &r.v[r.first_nonfinite];
            printf("%sfirst NaN/Inf in execution order: %s at %s (%s)%s\n", st->red,
                   fo_entry_label(en->step, en->group, en->name, lb, sizeof lb), fo_coords_str(en->ndim, en->coords, co, sizeof co),
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

/* --color / --no-color, else colour only on a terminal that can show it and a user who did not
 * opt out: NO_COLOR set and not empty (https://no-color.org), TERM unset or "dumb". */
static int want_color(const opts *o)
{
    if (o->color >= 0) return o->color;
    if (o->json || !isatty(STDOUT_FILENO)) return 0;
    const char *nc = getenv("NO_COLOR"), *term = getenv("TERM");
    if (nc && *nc) return 0;
    return term && *term && strcmp(term, "dumb") != 0;
}

/* Everything printed must have reached stdout: `diff --json > /full/disk/r.json` must not exit 0
 * with half a document there. glibc drops a buffer it failed to write, so the reason (errno) is
 * taken right after each block of output (note_stdout), not only at the final flush. */

static int finish(int status)
{
    int why = stdout_failed();
    if (why) {
        /* one line per run: an error said already is the cause to read */
        if (!g_said) fprintf(stderr, "flux-oracle: error: cannot write to standard output: %s\n", strerror(why));
        return 2;
    }
    return status;
}

/* Folders of rank files become their rank_<r>.h5 (diff: every argument but the reference); a
 * diff of several files, or of one per-rank file against a global dump, compares per rank. */
static int expand_ranks(opts *o)
{
    const int diff = !strcmp(o->cmd, "diff");
    if (!diff && strcmp(o->cmd, "consistency") && strcmp(o->cmd, "assemble")) return 0;
    const int nr = diff ? o->nfiles - 1 : o->nfiles; /* rank arguments */
    const char *out[FO_MAX_RANKS + 1];
    int n = 0;
    fs_err e = {0};
    struct stat sb;
    for (int i = 0; i < nr; i++) {
        if (stat(o->files[i], &sb) == 0 && S_ISDIR(sb.st_mode)) {
            if (nr != 1) return die("give one folder of rank files, or the rank files themselves, not both");
            if (fo_rank_dir(o->files[i], &o->expanded, &e)) return die(e.msg);
            if (o->expanded.n > FO_MAX_RANKS) return die("too many rank files (at most 64)");
            for (int k = 0; k < o->expanded.n; k++) out[n++] = o->expanded.v[k];
            o->from_dir = 1;
            o->label_a = strdup(o->files[i]);
        } else {
            out[n++] = o->files[i];
        }
    }
    if (diff) out[n++] = o->files[nr];
    if (n > FO_MAX_RANKS) return die("too many files (at most 64)");
    o->per_rank_n = diff ? n - 1 : n;
    if (diff && n == 2 && !o->from_dir) {
        /* one per-rank file against a global dump: per rank; two of either kind: as before */
        fo_file *a = NULL, *b = NULL;
        int ra = -1, rb = -1;
        if (!fo_file_open(&a, out[0], &e) && !fo_file_open(&b, out[1], &e))
            ra = fo_parallel_rank(fo_file_parallel(a)), rb = fo_parallel_rank(fo_file_parallel(b));
        fo_file_close(a), fo_file_close(b);
        o->per_rank = ra >= 0 && rb < 0;
    } else if (diff) {
        o->per_rank = 1;
    }
    for (int i = 0; i < n; i++) o->files[i] = out[i];
    o->nfiles = n;
    if (o->per_rank && !o->label_a)
        o->label_a = o->per_rank_n == 1 ? strdup(o->files[0])
                                        : fo_strdupf("%s ... %s (%d rank files)", o->files[0], o->files[o->per_rank_n - 1],
                                                     o->per_rank_n);
    if (o->per_rank && !o->label_a) return die("out of memory");
    o->shown[0] = o->label_a, o->shown[1] = o->files[o->nfiles - 1];
    return 0;
}

static int run_assemble(opts *o)
{
    fs_err e = {0};
    fo_file *files[FO_MAX_RANKS] = {0};
    int rc = 0;
    for (int i = 0; i < o->nfiles && !rc; i++) rc = fo_file_open(&files[i], o->files[i], &e);
    if (!rc) rc = fo_assemble(files, o->nfiles, o->output, &e);
    for (int i = 0; i < o->nfiles; i++) fo_file_close(files[i]);
    if (rc) return die(e.msg);
    printf("assembled %d rank files into %s\n", o->nfiles, o->output);
    fflush(stdout);
    note_stdout();
    return 0;
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
    fo_file *ref = NULL;
    if (!rc && o->ref) rc = fo_file_open(&ref, o->ref, &e);
    if (!rc && o->from_dir) rc = fo_ranks_complete(files, o->per_rank_n, &e);
    if (!rc && o->per_rank && o->truth) rc = fs_errf(&e, FS_E_INPUT, "--truth is not supported with per-rank dumps");
    if (!rc) {
        if (diff && o->per_rank) {
            resolve_tol(o, files[0], files[o->nfiles - 1]);
            rc = fo_rank_diff_run(files, o->nfiles - 1, files[o->nfiles - 1], &o->d, &r, &e);
        } else if (diff) {
            resolve_tol(o, files[0], files[1]);
            rc = fo_diff_run(files[0], files[1], truth, &o->d, &r, &e);
        } else {
            if (ref) resolve_tol(o, files[0], ref);
            rc = fo_consistency_ref_run(files, o->nfiles, ref, &o->d, &r, &e);
        }
    }
    int status;
    fs_err we = {0};
    report_file rf[MAX_REPORTS];
    int nrf = 0;
    if (rc) {
        /* The comparison could not run: the JUnit report still says so (one <error>), so a CI
         * job that publishes it shows the reason; the HTML report is not written. */
        if (o->json) json_error(e.msg);
        status = die(e.msg);
        if (o->junit) rf[nrf++] = (report_file){o->junit, "JUnit report", fo_junit_report};
        /* stdout gone (a closed pipe, a full disk): the run failed; no report claims otherwise */
        if (nrf && !stdout_failed() && write_reports(rf, nrf, &r, o, e.msg, &we))
            fprintf(stderr, "flux-oracle: error: %s\n", fs_printable(we.msg, (char[1100]){0}, 1100, 1023));
    } else {
        o->verdict = fo_report_verdict(&r, o->strict, o->per_rank ? o->label_a : o->files[0],
                                       diff ? o->files[o->nfiles - 1] : NULL, o->why, sizeof o->why);
        status = (int)o->verdict;
        errno = 0;
        if (o->json) print_diff_json(&r, o);
        else print_diff_human(&r, o, st);
        if (o->verdict == FO_VERDICT_ERROR) die(o->why);
        if (o->html) rf[nrf++] = (report_file){o->html, "HTML report", fo_html_report};
        if (o->junit) rf[nrf++] = (report_file){o->junit, "JUnit report", fo_junit_report};
        /* Reports only once stdout took the verdict: with stdout gone the run exits 2 (finish),
         * and a report saying PASS must not be left behind by a run that failed. */
        if (nrf && !stdout_failed() && write_reports(rf, nrf, &r, o, NULL, &we)) status = die(we.msg);
    }
    fo_report_free(&r);
    for (int i = 0; i < o->nfiles; i++) fo_file_close(files[i]);
    fo_file_close(truth);
    fo_file_close(ref);
    return status;
}

int main(int argc, char **argv)
{
    /* Every dataset allocates block buffers of similar sizes (ours and HDF5's): keep freed
     * memory for reuse instead of returning it to the kernel and faulting it in again, which
     * cost a third of the run time on 300 MB dumps. Peak memory is unchanged. */
    /* A closed stdout pipe (`flux-oracle diff a b | head -1`) is a write error like a full disk:
     * one line, exit 2, no report (finish, stdout_failed), not death by SIGPIPE (rc 141). */
    signal(SIGPIPE, SIG_IGN);
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
    if (expand_ranks(&o)) {
        opts_free(&o);
        return finish(2);
    }
    if (!strcmp(o.cmd, "assemble")) {
        int status = run_assemble(&o);
        opts_free(&o);
        return finish(status);
    }
    int color = want_color(&o);
    style st = color ? (style){"\033[1;31m", "\033[1m", "\033[2m", "\033[0m"} : (style){"", "", "", ""};
    int status = run(&o, &st);
    opts_free(&o);
    return finish(status);
}
