/* ab_forward — the FLUX.1-dev-width bench forward of another commit (its fs_model.c and CPU backend,
 * renamed old_*: tools/bench/ab-forward.sh builds it) against this tree's, in one process, alternated with the
 * sgemm pass on the forward's shapes (the order rotated rep by rep), at 1 and 2 threads. Prints the
 * medians, the ratios to sgemm (of the medians and rep by rep) and the speed-up.
 *
 *   tools/bench/ab-forward.sh COMMIT [REPS]      (REPS default 5, at most 64)
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "fs_model.h"
#include "fs_sampler.h"
fs_backend *old_backend_cpu(void);
int old_model_forward(const fs_model *m, const fs_tensor *hidden_states, const fs_tensor *encoder_hidden_states,
                      const fs_tensor *pooled, const double *timestep, const double *guidance,
                      const fs_tensor *img_ids, const fs_tensor *txt_ids, fs_tensor *out, fs_err *e);
static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + 1e-9 * ts.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static double med(double *v, int n) { double t[64]; memcpy(t, v, sizeof(double) * n); qsort(t, n, sizeof *t, cmp); return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]); }
typedef struct shape { int64_t M, N, K, count; } shape;
int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    const char *label = argc > 2 ? argv[2] : "old";
    if (reps < 1 || reps > 64) reps = 5;
    fs_config c; fs_err e = {0};
    fs_config_preset(&c, "flux-dev", &e); c.num_layers = 1; c.num_single_layers = 1;
    const int64_t D = 3072, F = 4 * D, S_img = 1024, S_txt = 512, S = S_img + S_txt;
    fs_weights w;
    if (fs_weights_synthetic(&w, &c, FS_F32, 0, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
    fs_gen_params gp = {.seed = 0, .batch = 1, .grid_h = 32, .grid_w = 32, .txt_len = 512, .steps = 1, .guidance = 3.5};
    fs_sched_preset(&gp.sched, "dev", &e);
    fs_inputs in;
    if (fs_inputs_generate(&in, &c, FS_F32, &gp, &e)) return 2;
    const shape lin[] = {
        {S_img, D, 64, 1}, {S_txt, D, 4096, 1}, {1, D, 256, 2}, {1, D, D, 2}, {1, D, 768, 1}, {1, D, D, 1},
        {1, 6 * D, D, 2}, {S_img, D, D, 4}, {S_txt, D, D, 4}, {S_img, F, D, 1}, {S_img, D, F, 1}, {S_txt, F, D, 1}, {S_txt, D, F, 1},
        {1, 3 * D, D, 1}, {S, D, D, 3}, {S, F, D, 1}, {S, D, D + F, 1}, {1, 2 * D, D, 1}, {S_img, 64, D, 1},
    };
    float *A = calloc((size_t)(S * (D + F)), 4), *B = calloc((size_t)(F * (D + F)), 4), *C = calloc((size_t)(S * (D + F)), 4);
    for (int64_t i = 0; i < S * (D + F); i++) A[i] = (float)((i % 13) - 6) * 0.01f;
    for (int64_t i = 0; i < F * (D + F); i++) B[i] = (float)((i % 7) - 3) * 0.01f;
    const double ts = ((double *)in.timesteps.data)[0], g = 3.5;
    fs_model mo = {.cfg = c, .dtype = FS_F32, .w = &w, .be = old_backend_cpu()}, mn = mo;
    mn.be = fs_backend_cpu();
    int th[2] = {1, 2};
    for (int ti = 0; ti < 2; ti++) {
        fs_backend_cpu_set_threads(th[ti]);
        double tg[64], to[64], tn[64];
        fs_tensor out, o2;
        old_model_forward(&mo, &in.hidden_states, &in.encoder_hidden_states, &in.pooled_projections, &ts, &g, &in.img_ids, &in.txt_ids, &out, &e);
        fs_model_forward(&mn, &in.hidden_states, &in.encoder_hidden_states, &in.pooled_projections, &ts, &g, &in.img_ids, &in.txt_ids, &o2, &e);
        double d2 = 0, n2 = 0;
        for (int64_t i = 0; i < fs_tensor_numel(&out); i++) { double d = ((float *)out.data)[i] - ((float *)o2.data)[i]; d2 += d * d; n2 += ((float *)out.data)[i] * (double)((float *)out.data)[i]; }
        fs_tensor_free(&out); fs_tensor_free(&o2);
        for (int r = 0; r < reps; r++)
            for (int k = 0; k < 3; k++) {
                const int which = (k + r) % 3; /* rotate the order rep by rep */
                double s = now();
                if (which == 0) {
                    for (size_t i = 0; i < sizeof lin / sizeof *lin; i++)
                        for (int q = 0; q < lin[i].count; q++)
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)lin[i].M, (int)lin[i].N, (int)lin[i].K, 1.0f, A, (int)lin[i].K, B, (int)lin[i].K, 0.0f, C, (int)lin[i].N);
                    for (int blk = 0; blk < 2; blk++)
                        for (int h = 0; h < 24; h++) {
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)S, (int)S, 128, 1.0f, A, (int)D, B, (int)D, 0.0f, C, (int)S);
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)S, 128, (int)S, 1.0f, C, (int)S, B, (int)D, 0.0f, A, (int)D);
                        }
                    tg[r] = now() - s;
                } else {
                    int rc = (which == 1 ? old_model_forward : fs_model_forward)(which == 1 ? &mo : &mn, &in.hidden_states, &in.encoder_hidden_states, &in.pooled_projections, &ts, &g, &in.img_ids, &in.txt_ids, &out, &e);
                    if (rc) { fprintf(stderr, "%s\n", e.msg); return 2; }
                    (which == 1 ? to : tn)[r] = now() - s;
                    fs_tensor_free(&out);
                }
            }
        double po[64], pn[64], sp[64];
        for (int r = 0; r < reps; r++) { po[r] = 100 * tg[r] / to[r]; pn[r] = 100 * tg[r] / tn[r]; sp[r] = to[r] / tn[r]; }
        const double mg = med(tg, reps), mo_ = med(to, reps), mn_ = med(tn, reps);
        printf("threads %d (OpenBLAS %d, OpenMP %d), %d reps, order rotated; output rel L2 new vs old %.2e\n", th[ti], openblas_get_num_threads(), omp_get_max_threads(), reps, sqrt(d2 / n2));
        printf("  sgemm        median %7.3f s   ", mg); for (int r = 0; r < reps; r++) printf(" %.3f", tg[r]); printf("\n");
        printf("  before (%s)  median", label); printf(" %7.3f s   ", mo_); for (int r = 0; r < reps; r++) printf(" %.3f", to[r]); printf("\n");
        printf("  after (this tree) median"); printf(" %7.3f s   ", mn_); for (int r = 0; r < reps; r++) printf(" %.3f", tn[r]); printf("\n");
        printf("  ratio of medians: before %.1f %%, after %.1f %%; paired rep medians: before %.1f %%, after %.1f %%; after/before speed-up %.3fx (paired median %.3fx)\n",
               100 * mg / mo_, 100 * mg / mn_, med(po, reps), med(pn, reps), mo_ / mn_, med(sp, reps));
        fflush(stdout);
    }
    return 0;
}
