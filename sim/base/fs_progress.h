/* fs_progress.h — what a long run says while it works (rank 0, on stderr).
 *
 * Full FLUX.1-dev on a CPU takes minutes per step, so a run must show it is alive and how far
 * it is: after each transformer block (fs_model.on_block) the reporter knows the phase (the
 * in-job reference, the matched truth, the run), step and block, and prints
 *   flux-sim: run: step 3/28, block 41/57 | 12m03s elapsed, ETA 1h10m | RSS 5.21 GiB (peak 6.10 GiB)
 * On a terminal it is one line rewritten in place (at most 5 times a second) and erased when the
 * phase ends (TERM=dumb: plain lines as in a log; NO_COLOR: rewritten without escape sequences); in a log it is a line per finished step, plus a line per block while a block-level
 * line has not been printed for 10 s — and nothing at all during a phase's first 2 s
 * ($FLUX_SIM_PROGRESS_AFTER seconds if set), so quick runs (tests, CI) print no progress. The reporter also keeps each step's wall time for
 * the run's summary. */
#ifndef FS_PROGRESS_H
#define FS_PROGRESS_H

#include <stdio.h>

typedef struct fs_progress {
    FILE *f;      /* NULL: silent (but still timing steps) */
    int tty;      /* a terminal that can rewrite a line (not TERM=dumb) */
    int esc;      /* may use ESC [K (not NO_COLOR): else blanks erase the rest of the line */
    int shown_len;/* characters of the line on screen */
    double after; /* seconds of a phase before its first line: 2, or $FLUX_SIM_PROGRESS_AFTER */
    char phase[32];
    int nsteps;
    double t0, last_line, step_end;
    int shown;        /* a TTY line is on screen */
    double *step_s;   /* [nsteps] wall seconds of each finished step of the phase */
    int steps_done;
} fs_progress;

/* f NULL: report nothing. */
void fs_progress_init(fs_progress *p, FILE *f);
/* A new phase ("reference", "truth", "run") of nsteps steps; the step times start afresh. */
void fs_progress_begin(fs_progress *p, const char *phase, int nsteps);
/* fs_model.on_block (ctx: the fs_progress). */
void fs_progress_block(void *ctx, int step, int done, int total);
/* The phase ended (clears the TTY line). */
void fs_progress_end(fs_progress *p);
/* The step times of the last phase; *n steps. */
const double *fs_progress_step_times(const fs_progress *p, int *n);
/* "0.51 0.50 0.52 s" for up to 8 steps, else "min 0.50 / median 0.51 / max 0.60 s over 28 steps". */
const char *fs_progress_step_summary(const fs_progress *p, char *buf, size_t n);
void fs_progress_free(fs_progress *p);

/* This process's resident set now and at its peak, bytes (/proc/self/status); 0 if unknown. */
void fs_mem_rss(double *now, double *peak);

#endif
