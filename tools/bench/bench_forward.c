/* bench_forward — single-rank forward throughput against sgemm on the same shapes.
 *
 * Config: FLUX.1-dev width (hidden 3072, 24 heads x 128, MLP 12288, joint 4096, pooled 768,
 * guidance), 1 double + 1 single block, 1024 image + 512 text tokens, batch 1, fp32, synthetic
 * weights. Model FLOPs: every Linear 2·in·out per token (row), attention 4·S²·D per block.
 * The sgemm reference times cblas_sgemm alone on exactly the forward's Linear shapes
 * (M = rows, N = out, K = in) and its attention GEMM shapes, in the same process and run.
 *
 * CPU fp32 (docs/performance.md): --reps times (default 5) the sgemm pass, the forward and the
 * forward again with block timestamps, alternated so that load from other processes falls on
 * all three alike; medians, the ratio of the medians and the rep-by-rep ratios. --threads 1,2
 * repeats that for each thread count (OpenBLAS and OpenMP, fs_backend_cpu_set_threads) with the
 * same weights. The forward's peak RSS is VmHWM after a warm-up forward, read before the sgemm
 * buffers are allocated. Per block: a recorder that only reads the clock and fs_model.on_block
 * time one double and one single block; 19 and 38 of them plus the rest (embedders, head) are the
 * full FLUX.1-dev depth at the same token count. --profile instead times one forward op by op
 * through a wrapper around the CPU backend (GEMM and its bias pass apart). --bf16 adds the
 * forward in bf16 emulation.
 *
 * --backend cuda|hip (a GPU build, docs/gpu.md) runs the same forward on the GPU, in fp32 or
 * --precision bf16: weights and inputs uploaded first, each timed forward ends with the
 * backend's sync. The GEMM reference is then the backend's own gemm on the same shapes (cuBLAS,
 * or the tiled kernel with FLUX_SIM_GPU_GEMM=tiled), and both are reported against the GPU's
 * peak for the precision: a datasheet figure looked up by device name (dense tensor-core bf16,
 * non-tensor fp32; printed with its source), or --peak-tflops T.
 *
 * --model flux2-dev: the FLUX.2 [dev] width instead (hidden 6144, 48 heads x 128, SwiGLU MLP
 * 18432, joint 15360, no pooled vector, the three shared modulations), 1 double + 1 single block
 * of Flux2Transformer2DModel; the sgemm reference on its Linear shapes. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include "fs_backends.h"
#include "fs_gemm.h"
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

/* The model benched: its name, heads and head dim (attention's per-head GEMMs), and the largest
 * operands of its GEMM shapes (the reference's buffers). */
static const char *g_model = "FLUX.1-dev";
static int64_t g_H = 24, g_Dh = 128, g_maxA, g_maxW, g_maxC;

static void size_buffers(const shape *lin, size_t n, int64_t S, int64_t D)
{
    g_maxA = S * D, g_maxW = S * D, g_maxC = S * S; /* attention: q/k/v [S, D], scores [S, S] */
    for (size_t i = 0; i < n; i++) {
        if (lin[i].M * lin[i].K > g_maxA) g_maxA = lin[i].M * lin[i].K;
        if (lin[i].N * lin[i].K > g_maxW) g_maxW = lin[i].N * lin[i].K;
        if (lin[i].M * lin[i].N > g_maxC) g_maxC = lin[i].M * lin[i].N;
    }
    if (g_maxC > g_maxA) g_maxA = g_maxC; /* PV writes its output into A */
}

/* A field of /proc/self/status ("VmHWM:", "VmRSS:") in MiB; 0 when unreadable. */
/* One pass of sgemm over the forward's shapes (every Linear as often as the forward runs it, and
 * per block and head attention's S×S×Dh and S×Dh×S products) through OpenBLAS (prov 0) or
 * oneDNN's dnnl_sgemm (prov 1), the two providers fs_sgemm chooses from; the seconds it took. */
static double sgemm_pass(int prov, const shape *lin, size_t nlin, int64_t S, int64_t D, float *A, float *B, float *C)
{
#define SG(ta, tb, M, N, K, a, lda, b, ldb, c, ldc)                                                                  \
    (prov ? (void)dnnl_sgemm(ta == CblasTrans ? 'T' : 'N', tb == CblasTrans ? 'T' : 'N', M, N, K, 1.0f, a, lda, b, ldb, \
                             0.0f, c, ldc)                                                                          \
          : cblas_sgemm(CblasRowMajor, ta, tb, (int)(M), (int)(N), (int)(K), 1.0f, a, (int)(lda), b, (int)(ldb), 0.0f, c, \
                        (int)(ldc)))
    const double s = now();
    for (size_t i = 0; i < nlin; i++)
        for (int k = 0; k < lin[i].count; k++)
            SG(CblasNoTrans, CblasTrans, lin[i].M, lin[i].N, lin[i].K, A, lin[i].K, B, lin[i].K, C, lin[i].N);
    for (int blk = 0; blk < 2; blk++)
        for (int h = 0; h < g_H; h++) {
            SG(CblasNoTrans, CblasTrans, S, S, g_Dh, A, D, B, D, C, S);
            SG(CblasNoTrans, CblasNoTrans, S, g_Dh, S, C, S, B, D, A, D);
        }
#undef SG
    return now() - s;
}

static double proc_status_mib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double v = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, strlen(field))) v = atof(line + strlen(field)) / 1024.0;
    if (f) fclose(f);
    return v;
}

/* Block times of one forward: a recorder that only reads the clock, and fs_model.on_block. A
 * double block runs from the last embedder output (pos_embed#1) to its on_block; the single
 * blocks from their first output (norm.silu, after the concatenation) to the last on_block. */
typedef struct blk_clock {
    int nd, ns;
    double t_start, t_dbl_start, t_dbl_end, t_sgl_start, t_sgl_end;
} blk_clock;
static int blk_rec(void *ctx, const char *name, const fs_tensor *t, const fs_shard *sh, fs_err *e)
{
    blk_clock *k = ctx;
    if (!strcmp(name, "pos_embed#1")) k->t_dbl_start = now();
    else if (!k->t_sgl_start && !strncmp(name, "single_transformer_blocks.0.", 28)) k->t_sgl_start = now();
    return 0;
}
static void blk_done(void *ctx, int step, int done, int total)
{
    blk_clock *k = ctx;
    if (done == k->nd) k->t_dbl_end = now();
    if (done == total) k->t_sgl_end = now();
}

/* Datasheet peaks (TFLOP/s, dense: bf16 on tensor cores, fp32 without TF32), by device name.
 * NVIDIA H100/H200/A100 and AMD MI250X/MI210 product pages; the first match wins. */
static const struct peak { const char *name; double bf16, fp32; } peaks[] = {
    {"H100 PCIe", 756, 51.2},  {"H100 NVL", 835, 60},      {"H100", 989.4, 66.9}, /* SXM: "H100 80GB HBM3" */
    {"H200", 989.4, 66.9},     {"A100", 312, 19.5},        {"MI250X", 383, 47.9},
    {"MI250", 362, 45.3},      {"MI210", 181, 22.6},
};

/* ---- --profile: one fp32 forward through a timing wrapper around the CPU backend's ops ---- */
enum { P_ALLOC, P_FREE, P_MEMSET, P_COPY, P_GEMV, P_GEMM, P_CONVERT, P_ADD, P_ADDBIAS, P_AXPBY, P_SILU, P_GELU,
       P_LN, P_RMS, P_MOD, P_GADD, P_ROPE, P_ATTN, P_NOPS };
static const char *pnames[P_NOPS] = {"alloc", "free", "memset (zero-fill)", "copy2d", "gemm M=1 (embedders, AdaLN)",
                                     "gemm M>1 (with its bias)", "convert", "add", "add_bias", "axpby", "silu",
                                     "gelu_tanh", "layernorm", "rmsnorm", "modulate", "gated_add", "rope", "attention"};
static double ptime[P_NOPS], pflop_gemm;
static long pcount[P_NOPS];
static fs_backend *preal;
#define PT(op, call)                    \
    do {                                \
        double s_ = now();              \
        int rc_ = (call);               \
        ptime[op] += now() - s_;        \
        pcount[op]++;                   \
        return rc_;                     \
    } while (0)
static int p_alloc(fs_backend *b, size_t n, void **p, fs_err *e) { PT(P_ALLOC, preal->alloc(preal, n, p, e)); }
static void p_free(fs_backend *b, void *p)
{
    double s = now();
    preal->free(preal, p);
    ptime[P_FREE] += now() - s;
    pcount[P_FREE]++;
}
static int p_memset(fs_backend *b, void *p, int v, size_t n, fs_err *e) { PT(P_MEMSET, preal->memset(preal, p, v, n, e)); }
static int p_copy(fs_backend *b, void *d, size_t dp, const void *s, size_t sp, size_t w, size_t r, fs_err *e)
{
    PT(P_COPY, preal->copy2d(preal, d, dp, s, sp, w, r, e));
}
static int p_gemm(fs_backend *b, fs_dtype dt, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W,
                  int64_t ldw, const void *bias, void *C, int64_t ldc, fs_err *e)
{
    /* the backend's op as the forward calls it, its bias included */
    double s = now();
    int rc = preal->gemm(preal, dt, M, N, K, A, lda, W, ldw, bias, C, ldc, e);
    ptime[M == 1 ? P_GEMV : P_GEMM] += now() - s;
    pcount[M == 1 ? P_GEMV : P_GEMM]++;
    if (M > 1) pflop_gemm += 2.0 * M * N * K;
    return rc;
}
static int p_convert(fs_backend *b, fs_tensor *y, const fs_tensor *x, fs_err *e) { PT(P_CONVERT, preal->convert(preal, y, x, e)); }
static int p_add(fs_backend *b, fs_tensor *y, const fs_tensor *x, const fs_tensor *z, fs_err *e) { PT(P_ADD, preal->add(preal, y, x, z, e)); }
static int p_add_bias(fs_backend *b, fs_tensor *y, const fs_tensor *x, fs_err *e) { PT(P_ADDBIAS, preal->add_bias(preal, y, x, e)); }
static int p_axpby(fs_backend *b, fs_tensor *y, double a, const fs_tensor *x, double c, fs_err *e) { PT(P_AXPBY, preal->axpby(preal, y, a, x, c, e)); }
static int p_silu(fs_backend *b, fs_tensor *y, const fs_tensor *x, fs_err *e) { PT(P_SILU, preal->silu(preal, y, x, e)); }
static int p_gelu(fs_backend *b, fs_tensor *y, const fs_tensor *x, fs_err *e) { PT(P_GELU, preal->gelu_tanh(preal, y, x, e)); }
static int p_ln(fs_backend *b, fs_tensor *y, const fs_tensor *x, double eps, fs_err *e) { PT(P_LN, preal->layernorm(preal, y, x, eps, e)); }
static int p_rms(fs_backend *b, fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps, fs_err *e)
{
    PT(P_RMS, preal->rmsnorm(preal, y, x, w, eps, e));
}
static int p_mod(fs_backend *b, fs_tensor *y, const fs_tensor *x, const fs_tensor *sc, const fs_tensor *sh, fs_err *e)
{
    PT(P_MOD, preal->modulate(preal, y, x, sc, sh, e));
}
static int p_gadd(fs_backend *b, fs_tensor *x, const fs_tensor *g, const fs_tensor *y, fs_err *e) { PT(P_GADD, preal->gated_add(preal, x, g, y, e)); }
static int p_rope(fs_backend *b, fs_tensor *x, const fs_tensor *c, const fs_tensor *s, fs_err *e) { PT(P_ROPE, preal->rope(preal, x, c, s, e)); }
static int p_attn(fs_backend *b, fs_tensor *o, fs_tensor *l, const fs_tensor *q, const fs_tensor *k, const fs_tensor *v, double sc, fs_err *e)
{
    PT(P_ATTN, preal->attention(preal, o, l, q, k, v, sc, e));
}

static int profile(fs_model *m, const fs_inputs *in, double ts, double g, fs_err *e)
{
    static fs_backend pb;
    preal = m->be;
    pb = *preal;
    pb.alloc = p_alloc; pb.free = p_free; pb.memset = p_memset; pb.copy2d = p_copy; pb.gemm = p_gemm;
    pb.convert = p_convert; pb.add = p_add; pb.add_bias = p_add_bias; pb.axpby = p_axpby; pb.silu = p_silu;
    pb.gelu_tanh = p_gelu; pb.layernorm = p_ln; pb.rmsnorm = p_rms; pb.modulate = p_mod; pb.gated_add = p_gadd;
    pb.rope = p_rope; pb.attention = p_attn;
    fs_model pm = *m;
    pm.be = &pb;
    double total = 0;
    for (int r = 0; r < 2; r++) { /* the first warms the heap up */
        memset(ptime, 0, sizeof ptime);
        memset(pcount, 0, sizeof pcount);
        pflop_gemm = 0;
        fs_tensor out;
        double s = now();
        if (fs_model_forward(&pm, &in->hidden_states, &in->encoder_hidden_states, &in->pooled_projections, &ts, &g,
                             &in->img_ids, &in->txt_ids, &out, e)) return 2;
        total = now() - s;
        fs_tensor_free(&out);
    }
    double acc = 0;
    printf("profile of one fp32 forward (%.3f s), OpenBLAS %d threads, OpenMP %d threads:\n", total,
           openblas_get_num_threads(), omp_get_max_threads());
    for (int i = 0; i < P_NOPS; i++) {
        if (!pcount[i]) continue;
        acc += ptime[i];
        printf("  %-30s %5ld calls %9.3f s  %5.1f %%%s\n", pnames[i], pcount[i], ptime[i], 100 * ptime[i] / total,
               i == P_GEMM ? "" : "");
        if (i == P_GEMM) printf("  %-30s %25.1f GFLOP/s\n", "", pflop_gemm / ptime[i] * 1e-9);
    }
    printf("  %-30s %20.3f s  %5.1f %%\n", "outside backend ops", total - acc, 100 * (total - acc) / total);
    return 0;
}

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
    for (int i = 0; i < 3 && !rc; i++) /* FLUX.2 has no pooled vector (ndim 0) */
        if (src[i]->ndim && !(rc = fs_tensor_alloc_on(dst[i], be, dt, src[i]->ndim, src[i]->shape, e)))
            rc = fs_tensor_upload(dst[i], src[i], e);
    if (!rc) rc = be->sync(be, e);
    const double t_up = now() - t0;
    /* the backend's GEMM on the forward's shapes (attention's QKᵀ and PV per head included) */
    void *A = NULL, *W = NULL, *C = NULL;
    const size_t es = dt == FS_BF16 ? 2 : 4;
    (void)F;
    if (!rc) rc = be->alloc(be, es * (size_t)g_maxA, &A, e);
    if (!rc) rc = be->alloc(be, es * (size_t)g_maxW, &W, e);
    if (!rc) rc = be->alloc(be, es * (size_t)g_maxC, &C, e);
    if (!rc) rc = be->memset(be, A, 0x3C, es * (size_t)g_maxA, e); /* 0x3C3C..: about 0.0115, not zeros */
    if (!rc) rc = be->memset(be, W, 0x3C, es * (size_t)g_maxW, e);
    double *t_gemm = calloc((size_t)reps, sizeof(double)), *t_fwd = calloc((size_t)reps, sizeof(double));
    for (int r = 0; r < reps + 1 && !rc; r++) { /* +1: the first run warms up (cuBLAS heuristics, allocator) */
        double s = now();
        for (size_t i = 0; i < nlin && !rc; i++)
            for (int k = 0; k < lin[i].count && !rc; k++)
                rc = be->gemm(be, dt, lin[i].M, lin[i].N, lin[i].K, A, lin[i].K, W, lin[i].K, NULL, C, lin[i].N, e);
        for (int blk = 0; blk < 2 && !rc; blk++)
            for (int h = 0; h < g_H && !rc; h++) {
                rc = be->gemm(be, dt, S, S, g_Dh, A, D, W, D, NULL, C, S, e);
                if (!rc) rc = be->gemm(be, dt, S, g_Dh, S, C, S, W, S, NULL, A, D, e);
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
        printf("bench_forward: %s width, 1 double + 1 single block, %lld tokens (image + text), %s, backend %s, "
               "%d reps after 1 warm-up (medians)\n  device: %s\n",
               g_model, (long long)S, dtn, be->name, reps, desc);
        printf("  OpenBLAS core %s; %s\n", openblas_get_corename(), fs_gemm_describe());
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
    int reps = 5, bf16 = 0, prof = 0, threads[8] = {0}, nthreads = 0;
    int img_h = 32, img_w = 32, txt = 512;
    const char *backend = "cpu";
    fs_dtype dt = FS_F32;
    double peak = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--small")) { img_h = 8; img_w = 8; txt = 64; }
        else if (!strcmp(argv[i], "--profile")) prof = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) { /* e.g. 1,2: each in turn, same weights */
            nthreads = 0; /* the last --threads wins */
            for (char *tok = strtok(argv[++i], ","); tok && nthreads < 8; tok = strtok(NULL, ","))
                if ((threads[nthreads++] = atoi(tok)) < 1) { fprintf(stderr, "bench_forward: --threads: %s\n", tok); return 2; }
        }
        else if (!strcmp(argv[i], "--bf16")) bf16 = 1; /* the cpu fp32 forward and the bf16 one, same run */
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc && (!strcmp(argv[i + 1], "fp32") || !strcmp(argv[i + 1], "bf16")))
            dt = !strcmp(argv[++i], "bf16") ? FS_BF16 : FS_F32;
        else if (!strcmp(argv[i], "--peak-tflops") && i + 1 < argc) peak = atof(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc && (!strcmp(argv[i + 1], "flux-dev") || !strcmp(argv[i + 1], "flux2-dev")))
            g_model = !strcmp(argv[++i], "flux2-dev") ? "FLUX.2-dev" : "FLUX.1-dev";
        else {
            fprintf(stderr, "usage: bench_forward [--reps N] [--small] [--bf16] [--threads N[,N...]] [--profile] "
                            "[--backend NAME] [--precision fp32|bf16] [--peak-tflops T] [--model flux-dev|flux2-dev]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    fs_config c;
    fs_err e = {0};
    const int f2 = !strcmp(g_model, "FLUX.2-dev");
    const char *preset = f2 ? "flux2-dev" : "flux-dev";
    fs_config_preset(&c, preset, &e);
    c.num_layers = 1;
    c.num_single_layers = 1;
    g_H = c.num_attention_heads, g_Dh = c.attention_head_dim;
    const int64_t D = fs_config_hidden(&c), F = fs_config_mlp_hidden(&c), S_img = img_h * img_w, S_txt = txt,
                  S = S_img + S_txt, Cin = c.in_channels, J = c.joint_attention_dim;

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
    const shape lin1[] = {
        {S_img, D, Cin, 1}, {S_txt, D, J, 1},                         /* x_embedder, context_embedder */
        {1, D, 256, 2}, {1, D, D, 2}, {1, D, 768, 1}, {1, D, D, 1},   /* time/guidance/text embedders */
        {1, 6 * D, D, 2}, {S_img, D, D, 4}, {S_txt, D, D, 4},         /* double: AdaLN, img q,k,v,out; txt */
        {S_img, F, D, 1}, {S_img, D, F, 1}, {S_txt, F, D, 1}, {S_txt, D, F, 1}, /* double: ff, ff_context */
        {1, 3 * D, D, 1}, {S, D, D, 3}, {S, F, D, 1}, {S, D, D + F, 1}, /* single: AdaLN, qkv, proj_mlp, proj_out */
        {1, 2 * D, D, 1}, {S_img, Cin, D, 1},                         /* norm_out.linear, proj_out */
    };
    const shape lin2[] = { /* FLUX.2 (fs_flux2.c): no biases, no pooled vector */
        {1, D, 256, 2}, {1, D, D, 2},                                 /* timestep/guidance embedders */
        {1, 6 * D, D, 2}, {1, 3 * D, D, 1},                           /* the three shared modulations */
        {S_img, D, Cin, 1}, {S_txt, D, J, 1},                         /* x_embedder, context_embedder */
        {S_img, D, D, 4}, {S_txt, D, D, 4},                           /* double: img q,k,v,out; txt */
        {S_img, 2 * F, D, 1}, {S_img, D, F, 1}, {S_txt, 2 * F, D, 1}, {S_txt, D, F, 1}, /* SwiGLU ff, ff_context */
        {S, 3 * D + 2 * F, D, 1}, {S, D, D + F, 1},                   /* single: to_qkv_mlp_proj, to_out */
        {1, 2 * D, D, 1}, {S_img, Cin, D, 1},                         /* norm_out.linear, proj_out */
    };
    const shape *lin = f2 ? lin2 : lin1;
    const size_t nlin = f2 ? sizeof lin2 / sizeof *lin2 : sizeof lin1 / sizeof *lin1;
    size_buffers(lin, nlin, S, D);
    double lin_flops = 0;
    for (size_t i = 0; i < nlin; i++) lin_flops += 2.0 * lin[i].M * lin[i].N * lin[i].K * lin[i].count;
    const double attn_flops = 2 * 4.0 * (double)S * S * D; /* 2 blocks */
    const double model_flops = lin_flops + attn_flops;

    if (strcmp(backend, "cpu") || dt != FS_F32) {
        fs_backend *be = NULL;
        int rc = fs_backend_open(backend, &be, &e);
        if (!rc)
            rc = bench_backend(be, dt, &c, &w, &in, lin, nlin, S, D, F, model_flops, lin_flops,
                               attn_flops, reps, peak, &e);
        if (rc) fprintf(stderr, "bench_forward: %s\n", e.msg);
        fs_backend_close(be);
        fs_inputs_free(&in);
        fs_weights_free(&w);
        return rc ? 2 : 0;
    }

    if (prof) {
        fs_model pm = {.cfg = c, .dtype = FS_F32, .w = &w, .be = fs_backend_cpu()};
        for (int ti = 0; ti < (nthreads ? nthreads : 1); ti++) {
            if (nthreads) fs_backend_cpu_set_threads(threads[ti]);
            if (profile(&pm, &in, ((double *)in.timesteps.data)[0], 3.5, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
        }
        return 0;
    }
    const int nth = nthreads ? nthreads : 1;
    if (!nthreads) threads[0] = 0; /* as the environment says */
    const int ndbl = c.num_layers, nsgl = c.num_single_layers;
    /* full depth: FLUX.1-dev's 19 double and 38 single blocks (FLUX.2-dev's 8 and 48) */
    fs_config full;
    fs_config_preset(&full, preset, &e);
    const double ts = ((double *)in.timesteps.data)[0], g = 3.5;
    fs_model m = {.cfg = c, .dtype = FS_F32, .w = &w, .be = fs_backend_cpu()};
    float *A = NULL, *B = NULL, *C = NULL;
    double *t_gemm = malloc(sizeof(double) * (size_t)reps), *t_fwd = malloc(sizeof(double) * (size_t)reps),
           *t_b = malloc(sizeof(double) * (size_t)reps), *t_p[4];
    for (int k = 0; k < 4; k++) t_p[k] = malloc(sizeof(double) * (size_t)reps);
    fs_weights wb = {0};
    fs_inputs ib = {0};
    const double rss0 = proc_status_mib("VmRSS:");
    double fwd_hwm = 0;
    printf("bench_forward: %s width, %d double + %d single block, %lld image + %lld text tokens, fp32, %d reps, "
           "sgemm and forward alternated (medians)\n",
           g_model, ndbl, nsgl, (long long)S_img, (long long)S_txt, reps);
    printf("  OpenBLAS core %s; %s\n", openblas_get_corename(), fs_gemm_describe());
    printf("  model FLOPs per forward      %10.1f GFLOP (Linear %.1f + attention %.1f)\n", model_flops * 1e-9,
           lin_flops * 1e-9, attn_flops * 1e-9);
    printf("  weights                      %10.1f MiB fp32, generated in %.1f s; RSS before the first forward %.1f MiB\n",
           wbytes / 1048576.0, t_w, rss0);
    fflush(stdout);
    for (int ti = 0; ti < nth; ti++) {
        if (threads[ti] > 0) fs_backend_cpu_set_threads(threads[ti]);
        /* a warm-up forward (heap, BLAS buffers, page faults); the first one, before the sgemm
         * buffers exist, gives the forward's peak RSS */
        fs_tensor out;
        if (fs_model_forward(&m, &in.hidden_states, &in.encoder_hidden_states, &in.pooled_projections, &ts, &g,
                             &in.img_ids, &in.txt_ids, &out, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
        fs_tensor_free(&out);
        if (!A) {
            fwd_hwm = proc_status_mib("VmHWM:");
            printf("  forward peak RSS             %10.1f MiB  (weights and inputs %.1f + the forward's own %.1f; VmHWM "
                   "before the sgemm buffers exist)\n",
                   fwd_hwm, rss0, fwd_hwm - rss0);
            /* sgemm reference on the same shapes, attention's QKᵀ and PV per head included */
            A = calloc((size_t)g_maxA, sizeof(float));
            B = calloc((size_t)g_maxW, sizeof(float));
            C = calloc((size_t)g_maxC, sizeof(float));
            for (int64_t i = 0; i < g_maxA; i++) A[i] = (float)((i % 13) - 6) * 0.01f;
            for (int64_t i = 0; i < g_maxW; i++) B[i] = (float)((i % 7) - 3) * 0.01f;
            /* a second warm-up, now that the buffers (0.94 GB) sit where the heap had the
             * forward's freed activations: without it the first timed forward faults in fresh
             * pages and ran 10-25 % slower than the others (docs/performance.md) */
            if (fs_model_forward(&m, &in.hidden_states, &in.encoder_hidden_states, &in.pooled_projections, &ts, &g,
                                 &in.img_ids, &in.txt_ids, &out, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
            fs_tensor_free(&out);
        }
        /* the provider fs_sgemm does not use, once: the baseline is the faster of the two */
        const double t_other = sgemm_pass(!fs_gemm_f32_onednn(), lin, nlin, S, D, A, B, C);
        for (int r = 0; r < reps; r++) {
            /* sgemm, the forward, the forward with block timestamps: alternated, so that load from
             * other processes falls on all three alike */
            t_gemm[r] = sgemm_pass(fs_gemm_f32_onednn(), lin, nlin, S, D, A, B, C);

            double s = now();
            if (fs_model_forward(&m, &in.hidden_states, &in.encoder_hidden_states, &in.pooled_projections, &ts, &g,
                                 &in.img_ids, &in.txt_ids, &out, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
            t_fwd[r] = now() - s;
            fs_tensor_free(&out);

            /* per block: a recorder that only takes the time at module outputs, and on_block */
            blk_clock k = {.nd = ndbl, .ns = nsgl};
            fs_model mb = m;
            mb.rec = (fs_recorder){.fn = blk_rec, .ctx = &k};
            mb.on_block = blk_done;
            mb.on_block_ctx = &k;
            k.t_start = now();
            if (fs_model_forward(&mb, &in.hidden_states, &in.encoder_hidden_states, &in.pooled_projections, &ts, &g,
                                 &in.img_ids, &in.txt_ids, &out, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
            const double t_end = now();
            fs_tensor_free(&out);
            t_p[0][r] = (k.t_dbl_end - k.t_dbl_start) / ndbl;          /* per double block */
            t_p[1][r] = (k.t_sgl_end - k.t_sgl_start) / nsgl;          /* per single block */
            t_p[2][r] = (t_end - k.t_start) - (k.t_dbl_end - k.t_dbl_start) - (k.t_sgl_end - k.t_sgl_start); /* the rest */
            t_p[3][r] = t_p[2][r] + full.num_layers * t_p[0][r] + full.num_single_layers * t_p[1][r];
        }
        double *ratio = malloc(sizeof(double) * (size_t)reps);
        for (int r = 0; r < reps; r++) ratio[r] = 100.0 * t_gemm[r] / t_fwd[r]; /* paired: the same rep */
        const double mg_used = median(t_gemm, reps), mf = median(t_fwd, reps);
        /* the ratio is taken against the best sgemm measured: the chosen provider's median, or
         * the other provider's single pass if that was faster (then the choice was wrong here) */
        const double mg = t_other < mg_used ? t_other : mg_used;
        if (t_other < mg_used)
            for (int r = 0; r < reps; r++) t_gemm[r] = t_other;
        printf("  -- OpenBLAS %d threads, OpenMP %d threads\n", openblas_get_num_threads(), omp_get_max_threads());
        printf("  sgemm on the same shapes     %10.3f s  %8.1f GFLOP/s  %s, the provider the forward uses (median)\n",
               mg_used, model_flops / mg_used * 1e-9, fs_gemm_f32_onednn() ? "oneDNN" : "OpenBLAS");
        printf("  sgemm, the other provider    %10.3f s  %8.1f GFLOP/s  %s, one pass%s\n", t_other,
               model_flops / t_other * 1e-9, fs_gemm_f32_onednn() ? "OpenBLAS" : "oneDNN",
               t_other < mg_used ? " (FASTER: the ratio below is against it)" : "");
        printf("  flux-sim forward             %10.3f s  %8.1f GFLOP/s\n", mf, model_flops / mf * 1e-9);
        printf("  forward / sgemm              %10.1f %%   (target >= 90 %%); rep by rep:", 100.0 * mg / mf);
        for (int r = 0; r < reps; r++) printf(" %.1f", ratio[r]);
        printf(" (median %.1f %%)\n", median(ratio, reps));
        free(ratio);
        const double pd = median(t_p[0], reps), ps = median(t_p[1], reps), pr = median(t_p[2], reps),
                     pf = median(t_p[3], reps);
        printf("  per block, %lld tokens        %10.3f s double, %.3f s single; embedders, concat and head %.3f s\n",
               (long long)S, pd, ps, pr);
        printf("  full depth (%d + %d blocks)   %10.1f s per forward, estimated (rest + %d x double + %d x single)\n",
               full.num_layers, full.num_single_layers, pf, full.num_layers, full.num_single_layers);
        if (bf16) {
            /* the same forward in bf16 emulation (--precision bf16), same shapes, same run */
            if (!wb.n) {
                gp.seed = 0;
                if (fs_weights_synthetic(&wb, &c, FS_BF16, 0, &e) || fs_inputs_generate(&ib, &c, FS_BF16, &gp, &e)) {
                    fprintf(stderr, "%s\n", e.msg);
                    return 2;
                }
            }
            fs_model mb = {.cfg = c, .dtype = FS_BF16, .w = &wb, .be = fs_backend_cpu()};
            /* the bf16 gemm op alone on the forward's Linear shapes (bias, as the forward's Linears),
             * alternated with the bf16 forward */
            const int64_t nb = 3 * D + 2 * F; /* the widest output */
            uint16_t *A16 = malloc(sizeof(uint16_t) * (size_t)g_maxA), *W16 = malloc(sizeof(uint16_t) * (size_t)g_maxW),
                     *C16 = malloc(sizeof(uint16_t) * (size_t)g_maxC), *b16 = malloc(sizeof(uint16_t) * (size_t)nb);
            for (int64_t i = 0; i < g_maxA; i++) A16[i] = fs_bf16_from_float((float)((i % 13) - 6) * 0.01f);
            for (int64_t i = 0; i < g_maxW; i++) W16[i] = fs_bf16_from_float((float)((i % 7) - 3) * 0.01f);
            for (int64_t i = 0; i < nb; i++) b16[i] = fs_bf16_from_float(0.01f * (float)(i % 5));
            double *t_bg = malloc(sizeof(double) * (size_t)reps);
            for (int r = 0; r < reps; r++) {
                double s0 = now();
                for (size_t i = 0; i < nlin; i++)
                    for (int k = 0; k < lin[i].count; k++)
                        if (mb.be->gemm(mb.be, FS_BF16, lin[i].M, lin[i].N, lin[i].K, A16, lin[i].K, W16, lin[i].K, f2 ? NULL : b16, C16,
                                        lin[i].N, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
                t_bg[r] = now() - s0;
                s0 = now();
                if (fs_model_forward(&mb, &ib.hidden_states, &ib.encoder_hidden_states, &ib.pooled_projections, &ts, &g,
                                     &ib.img_ids, &ib.txt_ids, &out, &e)) { fprintf(stderr, "%s\n", e.msg); return 2; }
                t_b[r] = now() - s0;
                fs_tensor_free(&out);
            }
            const double mb_t = median(t_b, reps), mbg = median(t_bg, reps);
            printf("  bf16 gemm, Linear shapes     %10.3f s  %8.1f GFLOP/s  (%s)\n", mbg, lin_flops / mbg * 1e-9,
                   fs_gemm_describe());
            free(A16); free(W16); free(C16); free(b16); free(t_bg);
            printf("  flux-sim forward, bf16       %10.3f s  %8.1f GFLOP/s  (%.2fx the fp32 forward's time)\n", mb_t,
                   model_flops / mb_t * 1e-9, mb_t / mf);
        }
        fflush(stdout);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("  process peak RSS             %10.1f MiB  (with the sgemm buffers%s)\n", ru.ru_maxrss / 1024.0,
           bf16 ? " and the bf16 weights" : "");
    free(A); free(B); free(C); free(t_gemm); free(t_fwd); free(t_b);
    for (int k = 0; k < 4; k++) free(t_p[k]);
    if (wb.n) { fs_inputs_free(&ib); fs_weights_free(&wb); }
    fs_inputs_free(&in);
    fs_weights_free(&w);
    return 0;
}
