/* bench_forward — single-rank forward throughput against sgemm on the same shapes.
 *
 * Config: FLUX.1-dev width (hidden 3072, 24 heads x 128, MLP 12288, joint 4096, pooled 768,
 * guidance), 1 double + 1 single block, 1024 image + 512 text tokens, batch 1, fp32, synthetic
 * weights. Model FLOPs: every Linear 2·in·out per token (row), attention 4·S²·D per block.
 * The sgemm reference times cblas_sgemm alone on exactly the forward's Linear shapes
 * (M = rows, N = out, K = in) and its attention GEMM shapes, in the same process and run.
 * Prints medians over --reps runs (default 5) and the ratio; peak RSS from getrusage. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "fs_model.h"
#include "fs_sampler.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

typedef struct shape { int64_t M, N, K, count; } shape;

int main(int argc, char **argv)
{
    int reps = 5, bf16 = 0;
    int img_h = 32, img_w = 32, txt = 512;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--small")) { img_h = 8; img_w = 8; txt = 64; }
        else if (!strcmp(argv[i], "--bf16")) bf16 = 1;
        else { fprintf(stderr, "usage: bench_forward [--reps N] [--small] [--bf16]\n"); return 2; }
    }
    fs_config c;
    fs_err e = {0};
    fs_config_preset(&c, "flux-dev", &e);
    c.num_layers = 1;
    c.num_single_layers = 1;
    const int64_t D = 3072, F = 4 * D, S_img = img_h * img_w, S_txt = txt, S = S_img + S_txt;

    double t0 = now();
    fs_weights w;
    if (fs_weights_synthetic(&w, &c, FS_F32, 0, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
    double t_w = now() - t0, wbytes = 0;
    for (int i = 0; i < w.n; i++) wbytes += (double)fs_tensor_nbytes(&w.t[i]);
    fs_gen_params gp = {.seed = 0, .batch = 1, .grid_h = img_h, .grid_w = img_w, .txt_len = txt, .steps = 1, .guidance = 3.5};
    fs_sched_preset(&gp.sched, "dev", &e);
    fs_inputs in;
    if (fs_inputs_generate(&in, &c, FS_F32, &gp, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }

    /* The forward's GEMMs: (M rows, N out, K in) x count. */
    const shape lin[] = {
        {S_img, D, 64, 1}, {S_txt, D, 4096, 1},                       /* x_embedder, context_embedder */
        {1, D, 256, 2}, {1, D, D, 2}, {1, D, 768, 1}, {1, D, D, 1},   /* time/guidance/text embedders */
        {1, 6 * D, D, 2}, {S_img, D, D, 4}, {S_txt, D, D, 4},         /* double: AdaLN, img q,k,v,out; txt */
        {S_img, F, D, 1}, {S_img, D, F, 1}, {S_txt, F, D, 1}, {S_txt, D, F, 1}, /* double: ff, ff_context */
        {1, 3 * D, D, 1}, {S, D, D, 3}, {S, F, D, 1}, {S, D, D + F, 1}, /* single: AdaLN, qkv, proj_mlp, proj_out */
        {1, 2 * D, D, 1}, {S_img, 64, D, 1},                          /* norm_out.linear, proj_out */
    };
    double lin_flops = 0;
    for (size_t i = 0; i < sizeof lin / sizeof *lin; i++) lin_flops += 2.0 * lin[i].M * lin[i].N * lin[i].K * lin[i].count;
    const double attn_flops = 2 * 4.0 * (double)S * S * D; /* 2 blocks */
    const double model_flops = lin_flops + attn_flops;

    /* sgemm reference on the same shapes, attention's QKᵀ and PV per head included */
    float *A = calloc((size_t)(S * (D + F)), sizeof(float)), *B = calloc((size_t)(F * (D + F)), sizeof(float)),
          *C = calloc((size_t)(S * (D + F)), sizeof(float));
    for (int64_t i = 0; i < S * (D + F); i++) A[i] = (float)((i % 13) - 6) * 0.01f;
    for (int64_t i = 0; i < F * (D + F); i++) B[i] = (float)((i % 7) - 3) * 0.01f;
    double *t_gemm = malloc(sizeof(double) * (size_t)reps), *t_fwd = malloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        double s = now();
        for (size_t i = 0; i < sizeof lin / sizeof *lin; i++)
            for (int k = 0; k < lin[i].count; k++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)lin[i].M, (int)lin[i].N, (int)lin[i].K, 1.0f, A,
                            (int)lin[i].K, B, (int)lin[i].K, 0.0f, C, (int)lin[i].N);
        for (int blk = 0; blk < 2; blk++)
            for (int h = 0; h < 24; h++) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)S, (int)S, 128, 1.0f, A, (int)D, B, (int)D, 0.0f,
                            C, (int)S);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)S, 128, (int)S, 1.0f, C, (int)S, B, (int)D,
                            0.0f, A, (int)D);
            }
        t_gemm[r] = now() - s;
    }

    fs_model m = {.cfg = c, .dtype = FS_F32, .w = &w, .be = fs_backend_cpu()};
    double ts = ((double *)in.timesteps.data)[0], g = 3.5;
    for (int r = 0; r < reps; r++) {
        fs_tensor out;
        double s = now();
        if (fs_model_forward(&m, &in.hidden_states, &in.encoder_hidden_states, &in.pooled_projections, &ts, &g,
                             &in.img_ids, &in.txt_ids, &out, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
        t_fwd[r] = now() - s;
        fs_tensor_free(&out);
    }
    double mg = median(t_gemm, reps), mf = median(t_fwd, reps);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("bench_forward: FLUX.1-dev width, 1 double + 1 single block, %lld image + %lld text tokens, fp32, "
           "OpenBLAS %d threads, %d reps (medians)\n",
           (long long)S_img, (long long)S_txt, openblas_get_num_threads(), reps);
    printf("  model FLOPs per forward      %10.1f GFLOP (Linear %.1f + attention %.1f)\n", model_flops * 1e-9,
           lin_flops * 1e-9, attn_flops * 1e-9);
    printf("  sgemm on the same shapes     %10.3f s  %8.1f GFLOP/s\n", mg, model_flops / mg * 1e-9);
    printf("  flux-sim forward             %10.3f s  %8.1f GFLOP/s\n", mf, model_flops / mf * 1e-9);
    printf("  forward / sgemm              %10.1f %%   (target >= 70 %%)\n", 100.0 * mg / mf);
    printf("  peak RSS                     %10.1f MiB  (weights %.1f MiB fp32, generated in %.1f s)\n",
           ru.ru_maxrss / 1024.0, wbytes / 1048576.0, t_w);
    if (bf16) {
        /* the same forward in bf16 emulation (--precision bf16), same shapes, same run */
        fs_weights wb;
        fs_inputs ib;
        gp.seed = 0;
        if (fs_weights_synthetic(&wb, &c, FS_BF16, 0, &e) || fs_inputs_generate(&ib, &c, FS_BF16, &gp, &e)) {
            fprintf(stderr, "%s\n", e.msg);
            return 2;
        }
        fs_model mb = {.cfg = c, .dtype = FS_BF16, .w = &wb, .be = fs_backend_cpu()};
        double *t_b = malloc(sizeof(double) * (size_t)reps);
        for (int r = 0; r < reps; r++) {
            fs_tensor out;
            double s0 = now();
            if (fs_model_forward(&mb, &ib.hidden_states, &ib.encoder_hidden_states, &ib.pooled_projections, &ts, &g,
                                 &ib.img_ids, &ib.txt_ids, &out, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
            t_b[r] = now() - s0;
            fs_tensor_free(&out);
        }
        double mb_t = median(t_b, reps);
        printf("  flux-sim forward, bf16       %10.3f s  %8.1f GFLOP/s  (%.2fx the fp32 forward's time)\n", mb_t,
               model_flops / mb_t * 1e-9, mb_t / mf);
        free(t_b);
        fs_inputs_free(&ib);
        fs_weights_free(&wb);
    }
    free(A); free(B); free(C); free(t_gemm); free(t_fwd);
    fs_inputs_free(&in);
    fs_weights_free(&w);
    return 0;
}
