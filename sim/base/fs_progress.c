/* fs_progress.c — progress lines for long runs (see fs_progress.h). */
#include "fs_progress.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define QUIET_S 2.0      /* a phase shorter than this prints nothing in a log (FLUX_SIM_PROGRESS_AFTER) */
#define BLOCK_LINE_S 10.0 /* in a log, a block-level line at most this often */
#define TTY_REFRESH_S 0.2

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void fs_mem_rss(double *cur, double *peak)
{
    *cur = *peak = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        long kb;
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) *cur = 1024.0 * (double)kb;
        else if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) *peak = 1024.0 * (double)kb;
    }
    fclose(f);
}

void fs_progress_init(fs_progress *p, FILE *f)
{
    memset(p, 0, sizeof *p);
    p->f = f;
    /* a line rewritten in place needs a terminal that moves the cursor: TERM=dumb (Emacs shells,
     * some CI consoles) gets plain lines, as a log does. NO_COLOR (no-color.org): no escape
     * sequence at all; the line is still rewritten with \r, padded with blanks instead of
     * erased with ESC [K. */
    const char *term = getenv("TERM"), *nc = getenv("NO_COLOR");
    p->tty = f && isatty(fileno(f)) && !(term && !strcmp(term, "dumb"));
    p->esc = !(nc && *nc);
    const char *a = getenv("FLUX_SIM_PROGRESS_AFTER");
    char *end;
    p->after = QUIET_S;
    if (a && *a) {
        double v = strtod(a, &end);
        if (!*end && v >= 0) p->after = v;
    }
}

void fs_progress_free(fs_progress *p)
{
    free(p->step_s);
    p->step_s = NULL;
}

void fs_progress_begin(fs_progress *p, const char *phase, int nsteps)
{
    snprintf(p->phase, sizeof p->phase, "%s", phase);
    free(p->step_s);
    p->step_s = calloc((size_t)(nsteps > 0 ? nsteps : 1), sizeof *p->step_s);
    p->nsteps = nsteps;
    p->steps_done = 0;
    p->t0 = p->step_end = p->last_line = now();
    p->shown = 0;
}

static const char *dur(double s, char *buf, size_t n)
{
    if (s < 60) snprintf(buf, n, "%.1fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    return buf;
}

void fs_progress_block(void *ctx, int step, int done, int total)
{
    fs_progress *p = ctx;
    const double t = now();
    const int step_over = done == total;
    if (step_over && p->step_s && step >= 0 && step < p->nsteps) {
        p->step_s[step] = t - p->step_end;
        p->step_end = t;
        p->steps_done = step + 1;
    }
    if (!p->f) return;
    const double el = t - p->t0;
    if (p->tty ? el < p->after || (t - p->last_line < TTY_REFRESH_S && !step_over) : el < p->after || (!step_over && t - p->last_line < BLOCK_LINE_S))
        return;
    const double frac = ((double)step * total + done) / ((double)(p->nsteps > 0 ? p->nsteps : 1) * total);
    double rss, peak;
    fs_mem_rss(&rss, &peak);
    char e1[32], e2[32], line[256];
    const int len = snprintf(line, sizeof line, "flux-sim: %s: step %d/%d, block %d/%d | %s elapsed, ETA %s | RSS %.2f GiB "
                                               "(peak %.2f GiB)",
                             p->phase, step + 1, p->nsteps, done, total, dur(el, e1, sizeof e1),
                             frac > 0 ? dur(el * (1 - frac) / frac, e2, sizeof e2) : "?", rss / 1073741824.0,
                             peak / 1073741824.0);
    if (!p->tty) fprintf(p->f, "%s\n", line);
    else if (p->esc) fprintf(p->f, "\r%s\033[K", line);
    else fprintf(p->f, "\r%s%*s", line, p->shown_len > len ? p->shown_len - len : 0, ""); /* blanks over the rest */
    fflush(p->f);
    p->shown_len = len;
    p->shown = p->tty;
    p->last_line = t;
}

void fs_progress_end(fs_progress *p)
{
    if (p->f && p->shown) {
        if (p->esc) fputs("\r\033[K", p->f);
        else fprintf(p->f, "\r%*s\r", p->shown_len, "");
        fflush(p->f);
    }
    p->shown = 0;
    p->shown_len = 0;
}

const double *fs_progress_step_times(const fs_progress *p, int *n)
{
    *n = p->steps_done;
    return p->step_s;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

const char *fs_progress_step_summary(const fs_progress *p, char *buf, size_t n)
{
    int k;
    const double *v = fs_progress_step_times(p, &k);
    size_t o = 0;
    buf[0] = 0;
    if (k <= 0 || !v) return buf;
    if (k <= 8) {
        for (int i = 0; i < k && o < n; i++) o += (size_t)snprintf(buf + o, n - o, "%s%.3f", i ? " " : "", v[i]);
        if (o < n) snprintf(buf + o, n - o, " s");
        return buf;
    }
    double *s = malloc(sizeof *s * (size_t)k);
    if (!s) return buf;
    memcpy(s, v, sizeof *s * (size_t)k);
    qsort(s, (size_t)k, sizeof *s, cmp_d);
    snprintf(buf, n, "min %.3f / median %.3f / max %.3f s over %d steps", s[0], 0.5 * (s[(k - 1) / 2] + s[k / 2]),
             s[k - 1], k);
    free(s);
    return buf;
}
