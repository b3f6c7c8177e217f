/* bench_forward — single-rank forward throughput against sgemm on the same shapes.
 *
 * Config: FLUX.1-dev width (hidden 3072, 24 heads x 128, MLP 12288, joint 4096, pooled 768,
 * guidance), 1 double + 1 single block, 1024 image + 512 text tokens, batch 1, fp32, synthetic
 * weights. Model FLOPs: every Linear 2·in·out per token (row), attention 4·S²·D per block.
 * The sgemm reference times cblas_sgemm alone on exactly the forward's Linear shapes
 * (M = rows, N = out, K = in) and its attention GEMM shapes, in the same process and run.
 * Prints medians over --reps runs (default 5) and the ratio; peak RSS from getrusage.
 *
 * --backend cuda|hip (a GPU build, docs/gpu.md) runs the same forward on the GPU, in fp32 or
 * --precision bf16: weights and inputs uploaded first, each timed forward ends with the
 * backend's sync. The GEMM reference is then the backend's own gemm on the same shapes (cuBLAS,
 * or the tiled kernel with FLUX_SIM_GPU_GEMM=tiled), and both are reported against the GPU's
 * peak for the precision: a datasheet figure looked up by device name (dense tensor-core bf16,
 * non-tensor fp32; printed with its source), or --peak-tflops T. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "fs_model.h"
#include "fs_sampler.h"
#ifdef FS_WITH_GPU
#include "gpu/fs_backend_gpu.h"
#endif

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

/* Datasheet peaks (TFLOP/s, dense: bf16 on tensor cores, fp32 without TF32), by device name.
 * NVIDIA H100/H200/A100 and AMD MI250X/MI210 product pages; the first match wins. */
static const struct peak { const char *name; double bf16, fp32; } peaks[] = {
    {"H100 PCIe", 756, 51.2},  {"H100 NVL", 835, 60},      {"H100", 989.4, 66.9}, /* SXM: "H100 80GB HBM3" */
    {"H200", 989.4, 66.9},     {"A100", 312, 19.5},        {"MI250X", 383, 47.9},
    {"MI250", 362, 45.3},      {"MI210", 181, 22.6},
};

/* The GPU run: the forward on `be` in dt, the backend's gemm on the same shapes. */
static int bench_backend(fs_backend *be, fs_dtype dt, const fs_config *c, const fs_weights *w, const fs_inputs *in,
                         const shape *lin, size_t nlin, int64_t S, int64_t D, int64_t F, double model_flops,
                         double lin_flops, double attn_flops, int reps, double peak_arg, fs_err *e)
{
    const char *dtn = dt == FS_BF16 ? "bf16" : "fp32";
    fs_weights won = {0};
    fs_tensor hs = {0}, ehs = {0}, pp = {0};
    const fs_tensor *src[3] = {&in->hidden_states, &in->encoder_hidden_states, &in->pooled_projections};
    fs_tensor *dst[3] = {&hs, &ehs, &pp};
    double t0 = now();
    int rc = fs_weights_on(w, be, &won, e);
    for (int i = 0; i < 3 && !rc; i++)
        if (!(rc = fs_tensor_alloc_on(dst[i], be, dt, src[i]->ndim, src[i]->shape, e))) rc = fs_tensor_upload(dst[i], src[i], e);
    if (!rc) rc = be->sync(be, e);
    const double t_up = now() - t0;
    /* the backend's GEMM on the forward's shapes (attention's QKᵀ and PV per head included) */
    void *A = NULL, *W = NULL, *C = NULL;
    const size_t es = dt == FS_BF16 ? 2 : 4;
    if (!rc) rc = be->alloc(be, es * (size_t)(S * (D + F)), &A, e);
    if (!rc) rc = be->alloc(be, es * (size_t)(F * (D + F)), &W, e);
    if (!rc) rc = be->alloc(be, es * (size_t)(S * (D + F)), &C, e);
    if (!rc) rc = be->memset(be, A, 0x3C, es * (size_t)(S * (D + F)), e); /* 0x3C3C..: about 0.0115, not zeros */
    if (!rc) rc = be->memset(be, W, 0x3C, es * (size_t)(F * (D + F)), e);
    double *t_gemm = calloc((size_t)reps, sizeof(double)), *t_fwd = calloc((size_t)reps, sizeof(double));
    for (int r = 0; r < reps + 1 && !rc; r++) { /* +1: the first run warms up (cuBLAS heuristics, allocator) */
        double s = now();
        for (size_t i = 0; i < nlin && !rc; i++)
            for (int k = 0; k < lin[i].count && !rc; k++)
                rc = be->gemm(be, dt, lin[i].M, lin[i].N, lin[i].K, A, lin[i].K, W, lin[i].K, NULL, C, lin[i].N, e);
        for (int blk = 0; blk < 2 && !rc; blk++)
            for (int h = 0; h < 24 && !rc; h++) {
                rc = be->gemm(be, dt, S, S, 128, A, D, W, D, NULL, C, S, e);
                if (!rc) rc = be->gemm(be, dt, S, 128, S, C, S, W, S, NULL, A, D, e);
            }
        if (!rc) rc = be->sync(be, e);
        if (r) t_gemm[r - 1] = now() - s;
    }
    fs_model m = {.cfg = *c, .dtype = dt, .w = &won, .be = be};
    double ts = ((double *)in->timesteps.data)[0], g = 3.5;
    for (int r = 0; r < reps + 1 && !rc; r++) {
        fs_tensor out = {0};
        double s = now();
        rc = fs_model_forward(&m, &hs, &ehs, &pp, &ts, &g, &in->img_ids, &in->txt_ids, &out, e);
        if (!rc) rc = be->sync(be, e);
        if (r) t_fwd[r - 1] = now() - s;
        fs_tensor_free(&out);
    }
    if (!rc) {
        const double mg = median(t_gemm, reps), mf = median(t_fwd, reps);
        char desc[512] = "";
#ifdef FS_WITH_GPU
        fs_backend_gpu_describe(be, desc, sizeof desc);
        const char *dev = fs_backend_gpu_device_name(be);
#else
        const char *dev = "";
#endif
        double peak = peak_arg;
        const char *psrc = "--peak-tflops";
        for (size_t i = 0; !peak && i < sizeof peaks / sizeof *peaks; i++)
            if (strstr(dev, peaks[i].name)) {
                peak = dt == FS_BF16 ? peaks[i].bf16 : peaks[i].fp32;
                psrc = dt == FS_BF16 ? "datasheet, dense bf16 tensor cores" : "datasheet, fp32 without TF32";
            }
        printf("bench_forward: FLUX.1-dev width, 1 double + 1 single block, %lld tokens (image + text), %s, backend %s, "
               "%d reps after 1 warm-up (medians)\n  device: %s\n",
               (long long)S, dtn, be->name, reps, desc);
        printf("  model FLOPs per forward      %10.1f GFLOP (Linear %.1f + attention %.1f)\n", model_flops * 1e-9,
               lin_flops * 1e-9, attn_flops * 1e-9);
        printf("  %s gemm on the same shapes %8.4f s  %8.1f TFLOP/s\n", be->name, mg, model_flops / mg * 1e-12);
        printf("  flux-sim forward             %10.4f s  %8.1f TFLOP/s\n", mf, model_flops / mf * 1e-12);
        printf("  forward / gemm               %10.1f %%\n", 100.0 * mg / mf);
        if (peak > 0)
            printf("  peak %s                   %10.1f TFLOP/s (%s): forward at %.1f %%, gemm at %.1f %%\n", dtn, peak,
                   psrc, 100.0 * model_flops / mf * 1e-12 / peak, 100.0 * model_flops / mg * 1e-12 / peak);
        else
            printf("  peak %s: unknown for '%s' (pass --peak-tflops T)\n", dtn, dev);
        printf("  upload of weights and inputs %10.3f s\n", t_up);
    }
    free(t_gemm);
    free(t_fwd);
    be->free(be, A);
    be->free(be, W);
    be->free(be, C);
    fs_tensor_free(&hs);
    fs_tensor_free(&ehs);
    fs_tensor_free(&pp);
    fs_weights_free(&won);
    return rc;
}

int main(int argc, char **argv)
{
    int reps = 5, bf16 = 0;
    int img_h = 32, img_w = 32, txt = 512;
    const char *backend = "cpu";
    fs_dtype dt = FS_F32;
    double peak = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--small")) { img_h = 8; img_w = 8; txt = 64; }
        else if (!strcmp(argv[i], "--bf16")) bf16 = 1; /* the cpu fp32 forward and the bf16 one, same run */
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc && (!strcmp(argv[i + 1], "fp32") || !strcmp(argv[i + 1], "bf16")))
            dt = !strcmp(argv[++i], "bf16") ? FS_BF16 : FS_F32;
        else if (!strcmp(argv[i], "--peak-tflops") && i + 1 < argc) peak = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_forward [--reps N] [--small] [--bf16] [--backend NAME] [--precision fp32|bf16] "
                            "[--peak-tflops T]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    fs_config c;
    fs_err e = {0};
    fs_config_preset(&c, "flux-dev", &e);
    c.num_layers = 1;
    c.num_single_layers = 1;
    const int64_t D = 3072, F = 4 * D, S_img = img_h * img_w, S_txt = txt, S = S_img + S_txt;

    double t0 = now();
    fs_weights w;
    if (fs_weights_synthetic(&w, &c, dt, 0, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
    double t_w = now() - t0, wbytes = 0;
    for (int i = 0; i < w.n; i++) wbytes += (double)fs_tensor_nbytes(&w.t[i]);
    fs_gen_params gp = {.seed = 0, .batch = 1, .grid_h = img_h, .grid_w = img_w, .txt_len = txt, .steps = 1, .guidance = 3.5};
    fs_sched_preset(&gp.sched, "dev", &e);
    fs_inputs in;
    if (fs_inputs_generate(&in, &c, FS_F32, &gp, &e) || (dt != FS_F32 && fs_inputs_convert(&in, dt, &e))) {
        fprintf(stderr, "%s\n", e.msg);
        return 2;
    }

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

    if (strcmp(backend, "cpu") || dt != FS_F32) {
        fs_backend *be = NULL;
        int rc = fs_backend_open(backend, &be, &e);
        if (!rc)
            rc = bench_backend(be, dt, &c, &w, &in, lin, sizeof lin / sizeof *lin, S, D, F, model_flops, lin_flops,
                               attn_flops, reps, peak, &e);
        if (rc) fprintf(stderr, "bench_forward: %s\n", e.msg);
        fs_backend_close(be);
        fs_inputs_free(&in);
        fs_weights_free(&w);
        return rc ? 2 : 0;
    }

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
