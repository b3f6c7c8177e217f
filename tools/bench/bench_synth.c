/* bench_synth — synthetic-weight generation speed, the old libm path against the new one, in the
 * same run.
 *
 * The parameters of one FLUX.1-dev-width block (default: single_transformer_blocks.0, 141.6 M
 * parameters; --block double: transformer_blocks.0, 339.8 M), generated as an fp32 run stores
 * them into one preallocated, already-touched buffer (so page faults are not timed):
 *   old  fs_rng v1 as it was before this bench's commit, copied here (the library no longer has
 *        it): SplitMix64 uniforms, glibc's log/sqrt/sincos once per pair, the scale per element,
 *        one thread. Its values differ from the new ones in the last bits (docs/scale.md).
 *   new  fs_weights_synthetic_fill (fs_rng v2: libm-free, vectorised) at 1 and 2 OpenMP threads.
 * The three are timed round-robin — old, new 1 thread, new 2 threads, old, ... — --reps times
 * (default 5), so that a change in the machine's load during the run hits all three alike;
 * wall-clock medians, ratios against the old median of this run, and the median of the per-round
 * ratios. Also CPU seconds per parameter (all threads summed), which a busy machine disturbs less
 * than the wall clock, and the load average before and after: wall figures compare only on a
 * quiet machine. Checks that the new path at 1 and 2 threads wrote exactly the bits of the scalar
 * reference (fs_weights_synthetic_fill_scalar), and counts the fp32 values that differ from the
 * old path's. --e2e adds the whole of fs_weights_synthetic for bench_forward's model (FLUX.1-dev
 * width, 1 double + 1 single block, 545.6 M parameters; allocation and zero fill included). */
#include <math.h>
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
static double median(const double *v, int n)
{
    double s[100];
    memcpy(s, v, sizeof *v * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static void loadavg(double l[3])
{
    l[0] = l[1] = l[2] = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f) return;
    if (fscanf(f, "%lf %lf %lf", &l[0], &l[1], &l[2]) != 3) l[0] = -1;
    fclose(f);
}

/* ---- the old path: fs_rng v1 (libm) and the old scalar bulk fill, verbatim in substance ---- */
static inline uint64_t v1_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double v1_uniform(uint64_t key, uint64_t index, uint32_t lane)
{
    uint64_t x = v1_mix64(v1_mix64(key ^ (index * 0x9e3779b97f4a7c15ULL)) + lane * 0xd1b54a32d192ed03ULL + 1);
    return ((double)(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static void v1_pair(uint64_t key, uint64_t k, double *r, double *theta)
{
    double u1 = v1_uniform(key, k, 0), u2 = v1_uniform(key, k, 1);
    *r = sqrt(-2.0 * log(u1));
    *theta = 6.283185307179586476925 * u2;
}
static double v1_normal(uint64_t key, uint64_t index)
{
    double r, th;
    v1_pair(key, index >> 1, &r, &th);
    return r * ((index & 1) ? sin(th) : cos(th));
}
static void v1_normal_fill(uint64_t key, uint64_t first, int64_t n, double *out)
{
    int64_t i = 0;
    if (n > 0 && (first & 1)) out[i++] = v1_normal(key, first);
    for (; i + 1 < n; i += 2) {
        double r, th, s, c;
        v1_pair(key, (first + (uint64_t)i) >> 1, &r, &th);
        sincos(th, &s, &c);
        out[i] = r * c;
        out[i + 1] = r * s;
    }
    if (i < n) out[i] = v1_normal(key, first + (uint64_t)i);
}
static double v1_scale(const fs_param_desc *d, double z)
{
    switch (d->kind) {
    case FS_PARAM_LINEAR_W: return z / sqrt((double)d->shape[1]);
    case FS_PARAM_BIAS: return 0.05 * z;
    case FS_PARAM_RMS_W: return 1.0 + 0.1 * z;
    }
    return 0;
}
/* fs_weights_synthetic_fill_scalar as it was (fp32 only here) */
static void old_fill(const fs_param_desc *d, uint64_t seed, int64_t first, int64_t count, fs_dtype dt, void *out)
{
    enum { BLK = 4096 };
    double buf[BLK];
    const uint64_t key = fs_rng_key(seed, d->name);
    (void)dt;
    for (int64_t k0 = 0; k0 < count; k0 += BLK) {
        const int64_t m = count - k0 < BLK ? count - k0 : BLK;
        v1_normal_fill(key, (uint64_t)(first + k0), m, buf);
        for (int64_t k = 0; k < m; k++) ((float *)out)[k0 + k] = (float)v1_scale(d, buf[k]);
    }
}

/* fs_weights_synthetic as it was: every tensor allocated, then filled by the old path */
static int old_synthetic(fs_weights *w, const fs_config *c, fs_err *e)
{
    int rc = fs_weights_init_empty(w, c, FS_F32, e);
    for (int i = 0; !rc && i < w->n; i++) {
        const fs_param_desc *d = &w->desc[i];
        if (!(rc = fs_tensor_alloc(&w->t[i], FS_F32, d->ndim, d->shape, e)))
            old_fill(d, 0, 0, fs_tensor_numel(&w->t[i]), FS_F32, w->t[i].data);
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
    double t[3][100], n = 0;
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < 3; v++) {
            omp_set_num_threads(v == 2 ? 2 : 1);
            const double t0 = now();
            if (v == 0 ? old_synthetic(&w, &c, &e) : fs_weights_synthetic(&w, &c, FS_F32, 0, &e)) {
                fprintf(stderr, "bench_synth: %s\n", e.msg);
                exit(2);
            }
            t[v][r] = now() - t0;
            if (!n)
                for (int i = 0; i < w.n; i++) n += (double)fs_tensor_numel(&w.t[i]);
            fs_weights_free(&w);
        }
    const double to = median(t[0], reps);
    printf("  fs_weights_synthetic, FLUX.1-dev width 1 double + 1 single block (%.1f M parameters, allocation and zero "
           "fill included), round-robin, median of %d:\n    old, 1 thread:      %8.1f M params/s  (%.3f s)\n",
           n / 1e6, reps, n / to / 1e6, to);
    for (int v = 1; v <= 2; v++) {
        const double tm = median(t[v], reps);
        printf("    new, %d thread%s:     %8.1f M params/s  (%.3f s)  %5.1fx old\n", v, v > 1 ? "s" : " ", n / tm / 1e6,
               tm, to / tm);
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
    const size_t bytes = (size_t)total * sizeof(float);
    float *ref = malloc(bytes), *old = malloc(bytes), *nw = malloc(bytes);
    if (!ref || !old || !nw) {
        fprintf(stderr, "bench_synth: out of memory for 3 x %lld floats\n", (long long)total);
        return 2;
    }
    memset(old, 0, bytes); /* touch every page before timing */
    memset(nw, 0, bytes);
    double load0[3], load1[3];
    loadavg(load0);
    printf("bench_synth: %s* of FLUX.1-dev (%d tensors, %.1f M parameters), fp32 values\n", block, n, total / 1e6);
    printf("  new kernel: %s clone; load average before: %.2f %.2f %.2f (%d CPUs online)\n", fs_rng_isa(), load0[0],
           load0[1], load0[2], omp_get_num_procs());
    fflush(stdout);

    /* the scalar reference of the new definition, untimed */
    run(fs_weights_synthetic_fill_scalar, p, n, ref);

    double t[3][100], cpu[3][100];
    int same[3] = {1, 1, 1};
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < 3; v++) {
            omp_set_num_threads(v == 2 ? 2 : 1);
            float *buf = v == 0 ? old : nw;
            t[v][r] = run(v == 0 ? old_fill : fs_weights_synthetic_fill, p, n, buf);
            cpu[v][r] = cpu_total;
            if (v) {
                same[v] &= !memcmp(nw, ref, bytes);
                memset(nw, 0, bytes);
            }
        }
    loadavg(load1);
    const double to = median(t[0], reps), co = median(cpu[0], reps);
    printf("  wall-clock medians of %d rounds (old, new 1 thread, new 2 threads, round-robin):\n", reps);
    printf("    old (libm per pair, scalar scale), 1 thread: %8.1f M params/s  (%.3f s; %.2f CPU ns/param)\n",
           total / to / 1e6, to, co / total * 1e9);
    int rc = 0;
    for (int v = 1; v <= 2; v++) {
        double ratio[100];
        for (int r = 0; r < reps; r++) ratio[r] = t[0][r] / t[v][r];
        const double tm = median(t[v], reps), cm = median(cpu[v], reps);
        printf("    new (%s), %d thread%s:                %8.1f M params/s  (%.3f s; %.2f CPU ns/param)  %5.1fx old "
               "(median of per-round ratios %.1fx; CPU time per param %.1fx less)%s\n",
               fs_rng_isa(), v, v > 1 ? "s" : " ", total / tm / 1e6, tm, cm / total * 1e9, to / tm, median(ratio, reps),
               co / cm, same[v] ? "" : "  *** DIFFERS FROM THE SCALAR REFERENCE ***");
        if (!same[v]) rc = 1;
    }
    int64_t ndiff = 0;
    for (int64_t i = 0; i < total; i++) ndiff += memcmp(&old[i], &ref[i], sizeof *old) != 0;
    printf("  new == scalar reference bit for bit at 1 and 2 threads: %s; fp32 values that differ from the old "
           "path's: %lld of %lld (%.2g%%)\n",
           same[1] && same[2] ? "yes" : "NO", (long long)ndiff, (long long)total, 100.0 * (double)ndiff / (double)total);
    printf("  load average after: %.2f %.2f %.2f\n", load1[0], load1[1], load1[2]);
    free(ref);
    free(old);
    free(nw);
    free(p);
    free(all);
    if (with_e2e) e2e(reps < 3 ? reps : 3);
    return rc;
}
