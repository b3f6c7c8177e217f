/* bench_synth — synthetic-weight generation speed, old path against new, in the same run.
 *
 * The parameters of one FLUX.1-dev-width block (default: single_transformer_blocks.0, 141.6 M
 * parameters; --block double: transformer_blocks.0, 339.8 M), generated as an fp32 run stores
 * them into one preallocated, already-touched buffer (so page faults are not timed):
 *   old  fs_weights_synthetic_fill_scalar: libm log/sqrt/sincos per pair, the scale per element,
 *        one thread (what fs_weights_synthetic did before fs_rng_fast.c);
 *   new  fs_weights_synthetic_fill at 1 and 2 OpenMP threads (the vector kernel fs_rng_fast_isa()
 *        names).
 * Wall-clock medians over --reps runs (default 5; the old path 3 at most, it is slow); ratios
 * are against the old median of this run. Also checks that both paths wrote the same bits.
 * --e2e adds the whole of fs_weights_synthetic for bench_forward's model (FLUX.1-dev width, 1 double +
 * 1 single block, 545.6 M parameters; allocation and fs_tensor_alloc's zero fill included): new
 * at 1 and 2 threads against the old path rebuilt from the same pieces (alloc + the scalar fill).
 * Also prints CPU seconds per parameter (all threads summed), which a busy machine disturbs less
 * than the wall clock, and the load average: wall figures compare only on a quiet machine. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fs_rng.h"
#include "fs_weights.h"

static double clk(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now(void) { return clk(CLOCK_MONOTONIC); }
static double cpu_total; /* process CPU seconds of the last run(), all threads */

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* fs_weights_synthetic as it was: every tensor allocated, then filled by the scalar path */
static int old_synthetic(fs_weights *w, const fs_config *c, fs_err *e)
{
    int rc = fs_weights_init_empty(w, c, FS_F32, e);
    for (int i = 0; !rc && i < w->n; i++) {
        const fs_param_desc *d = &w->desc[i];
        if (!(rc = fs_tensor_alloc(&w->t[i], FS_F32, d->ndim, d->shape, e)))
            fs_weights_synthetic_fill_scalar(d, 0, 0, fs_tensor_numel(&w->t[i]), FS_F32, w->t[i].data);
    }
    return rc;
}

static void e2e(int reps)
{
    fs_config c;
    fs_err e = {0};
    fs_config_preset(&c, "flux-dev", &e);
    c.num_layers = 1;
    c.num_single_layers = 1;
    fs_weights w;
    double t[100], n = 0;
    double t0 = now();
    if (old_synthetic(&w, &c, &e)) {
        fprintf(stderr, "bench_synth: %s\n", e.msg);
        exit(2);
    }
    const double t_old = now() - t0;
    for (int i = 0; i < w.n; i++) n += (double)fs_tensor_numel(&w.t[i]);
    fs_weights_free(&w);
    printf("  fs_weights_synthetic, FLUX.1-dev width 1 double + 1 single block (%.1f M parameters, allocation and zero "
           "fill included):\n    old, 1 thread:      %8.1f M params/s  (%.3f s, 1 run)\n",
           n / 1e6, n / t_old / 1e6, t_old);
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        for (int r = 0; r < reps; r++) {
            t0 = now();
            if (fs_weights_synthetic(&w, &c, FS_F32, 0, &e)) exit(2);
            t[r] = now() - t0;
            fs_weights_free(&w);
        }
        const double tm = median(t, reps);
        printf("    new, %d thread%s:     %8.1f M params/s  (%.3f s, median of %d)  %5.1fx old\n", th, th > 1 ? "s" : " ",
               n / tm / 1e6, tm, reps, t_old / tm);
    }
}

typedef void (*fill_fn)(const fs_param_desc *, uint64_t, int64_t, int64_t, fs_dtype, void *);

/* Every parameter of the block, one after the other into buf. */
static double run(fill_fn f, const fs_param_desc *p, int n, float *buf)
{
    double t0 = now(), c0 = clk(CLOCK_PROCESS_CPUTIME_ID);
    int64_t o = 0;
    for (int i = 0; i < n; i++) {
        const int64_t m = p[i].shape[0] * (p[i].ndim == 2 ? p[i].shape[1] : 1);
        f(&p[i], 0, 0, m, FS_F32, buf + o);
        o += m;
    }
    cpu_total = clk(CLOCK_PROCESS_CPUTIME_ID) - c0;
    return now() - t0;
}

int main(int argc, char **argv)
{
    int reps = 5, with_e2e = 0;
    const char *block = "single_transformer_blocks.0.";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--e2e")) with_e2e = 1;
        else if (!strcmp(argv[i], "--block") && i + 1 < argc) {
            i++;
            block = !strcmp(argv[i], "double") ? "transformer_blocks.0." : "single_transformer_blocks.0.";
        } else {
            fprintf(stderr, "usage: bench_synth [--reps N] [--block single|double] [--e2e]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 99) reps = 5;
    fs_config c;
    fs_err e = {0};
    fs_config_preset(&c, "flux-dev", &e);
    c.num_layers = 1;
    c.num_single_layers = 1;
    int nall = 0, n = 0;
    fs_param_desc *all = fs_config_params(&c, &nall), *p = calloc((size_t)nall, sizeof *p);
    if (!all || !p) return 2;
    int64_t total = 0;
    for (int i = 0; i < nall; i++)
        if (!strncmp(all[i].name, block, strlen(block))) {
            p[n] = all[i];
            total += p[n].shape[0] * (p[n].ndim == 2 ? p[n].shape[1] : 1);
            n++;
        }
    float *a = malloc((size_t)total * sizeof *a), *b = malloc((size_t)total * sizeof *b);
    if (!a || !b) {
        fprintf(stderr, "bench_synth: out of memory for 2 x %lld floats\n", (long long)total);
        return 2;
    }
    memset(a, 0, (size_t)total * sizeof *a); /* touch every page before timing */
    memset(b, 0, (size_t)total * sizeof *b);
    double load[3] = {0};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(la);
    }
    printf("bench_synth: %s* of FLUX.1-dev (%d tensors, %.1f M parameters), fp32 values, wall-clock medians\n",
           block, n, total / 1e6);
    printf("  fast kernel: %s; load average before: %.2f %.2f %.2f\n", fs_rng_fast_isa(), load[0], load[1], load[2]);
    fflush(stdout);

    const int old_reps = reps < 3 ? reps : 3;
    double t[100];
    double cpu[100];
    for (int r = 0; r < old_reps; r++) t[r] = run(fs_weights_synthetic_fill_scalar, p, n, a), cpu[r] = cpu_total;
    const double t_old = median(t, old_reps), c_old = median(cpu, old_reps);
    printf("  old (libm per pair, scalar scale), 1 thread: %8.1f M params/s  (%.3f s, median of %d; %.2f CPU ns/param)\n",
           total / t_old / 1e6, t_old, old_reps, c_old / total * 1e9);
    fflush(stdout);
    int rc = 0;
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        for (int r = 0; r < reps; r++) t[r] = run(fs_weights_synthetic_fill, p, n, b), cpu[r] = cpu_total;
        const double tm = median(t, reps), cm = median(cpu, reps);
        const int same = !memcmp(a, b, (size_t)total * sizeof *a);
        printf("  new (%s), %d thread%s:                %8.1f M params/s  (%.3f s, median of %d; %.2f CPU ns/param)  "
               "%5.1fx old%s\n",
               fs_rng_fast_isa(), th, th > 1 ? "s" : " ", total / tm / 1e6, tm, reps, cm / total * 1e9, t_old / tm,
               same ? "" : "  *** VALUES DIFFER FROM THE OLD PATH ***");
        if (!same) rc = 1;
        memset(b, 0, (size_t)total * sizeof *b);
    }
    free(a);
    free(b);
    free(p);
    free(all);
    if (with_e2e) e2e(reps < 3 ? reps : 3);
    return rc;
}
