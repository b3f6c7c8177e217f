/* fs_gemm.c — the CPU backend's GEMM providers (fs_gemm.h): float32 through OpenBLAS or oneDNN's
 * sgemm, chosen once per process from the CPU and what OpenBLAS made of it; bfloat16 through
 * oneDNN's bf16 matmul on AMX, else widened to float32.
 *
 * The bf16 matmul's layouts, all views of the caller's memory (no copies on our side):
 *   src     A [M, K], strides (lda, 1), bf16
 *   weights Wᵀ [K, N] as a view of W [N, K]: strides (1, ldw), bf16 (oneDNN packs it into its
 *           VNNI blocks itself, per call: N·K·2 bytes read, a few percent of a large GEMM)
 *   bias    [1, N], bf16 (added to the float32 accumulator, converted exactly)
 *   dst     C [M, N], strides (ldc, 1), bf16: the accumulator + bias converted once, RNE
 * A primitive descriptor and a primitive are created per call: 0.13-0.32 ms measured (oneDNN
 * 2.6.3, avx512_core_bf16, loaded machine), against 15-140 ms for a FLUX-width GEMM. oneDNN's
 * primitive cache is switched off (capacity 0) unless ONEDNN_PRIMITIVE_CACHE_CAPACITY (or the
 * older DNNL_ name) is set: each cached brgemm matmul keeps ~10 MiB of JIT code buffers, so the
 * default capacity (1024) held 85-90 MiB more than --estimate models on the default bf16 run
 * (455-472 MiB peak against 379 with capacity 0 and 350 estimated; capacity 2 still held 19 MiB
 * more, capacity 8 all of it) — on an AMX CPU, where every bf16 GEMM comes here. The
 * OpenMP thread count is oneDNN's (its CPU runtime is OpenMP, the same libgomp as ours), so
 * fs_backend_cpu_set_threads governs it, for dnnl_sgemm too. */
#include "fs_gemm.h"

#include <stdint.h>

#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FS_STR_(x) #x
#define FS_STR(x) FS_STR_(x)

static pthread_once_t once = PTHREAD_ONCE_INIT;
static dnnl_engine_t eng;
static int native;          /* bf16 gemms of at least native_min_m rows go through oneDNN */
static int64_t native_min_m;
static dnnl_cpu_isa_t isa;  /* what oneDNN found */
static char last_impl[64] = "none yet";

static const char *isa_name(dnnl_cpu_isa_t i)
{
    switch ((int)i) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_sse41: return "sse41";
    default: return "other";
    }
}

/* The CPU's widest vector ISA for float32 FMA work: 3 AVX-512, 2 AVX2 + FMA, 1 older (GCC's
 * CPUID check, which includes the OS's XSAVE support for the wider registers). */
static int cpu_level(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 3;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
    return 1;
}

/* The ISA of the kernels OpenBLAS chose (openblas_get_corename: its DYNAMIC_ARCH table's name):
 * the AVX-512 cores, the AVX2 cores, anything else (Prescott, Nehalem, Sandybridge, ... — what
 * 0.3.21 falls back to on CPU models it does not know). */
static int blas_level(const char *core)
{
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Zen"};
    for (size_t i = 0; i < sizeof avx512 / sizeof *avx512; i++)
        if (!strcasecmp(core, avx512[i])) return 3;
    for (size_t i = 0; i < sizeof avx2 / sizeof *avx2; i++)
        if (!strcasecmp(core, avx2[i])) return 2;
    return 1;
}

static int f32_onednn;          /* fs_sgemm calls dnnl_sgemm */
static char f32_why[128] = "";  /* the reason, for fs_gemm_describe */

static void init(void)
{
    isa = dnnl_get_effective_cpu_isa();
    /* float32: OpenBLAS when its kernels use the CPU's widest ISA, else oneDNN (fs_gemm.h) */
    const char *core = openblas_get_corename();
    const int cl = cpu_level(), bl = blas_level(core ? core : "");
    static const char *const lv[] = {"", "pre-AVX2", "AVX2", "AVX-512"};
    const char *f32 = getenv("FS_GEMM_F32");
    if (f32 && !strcmp(f32, "openblas")) f32_onednn = 0, snprintf(f32_why, sizeof f32_why, "forced by FS_GEMM_F32");
    else if (f32 && !strcmp(f32, "onednn")) f32_onednn = 1, snprintf(f32_why, sizeof f32_why, "forced by FS_GEMM_F32");
    else if (bl >= cl) f32_onednn = 0, snprintf(f32_why, sizeof f32_why, "its %s kernels match the CPU", lv[bl]);
    else
        f32_onednn = 1, snprintf(f32_why, sizeof f32_why, "OpenBLAS chose %s (%s) on an %s CPU", core ? core : "?", lv[bl],
                                 lv[cl]);
    /* bf16 (fs_gemm.h): oneDNN's matmul for every shape where the CPU has AMX tiles
     * (tdpbf16ps); with AVX512-BF16 alone (vdpbf16ps) only below FS_GEMM_BF16_WIDEN_M rows,
     * where widening the whole weight for a few rows costs more than the GEMM (M = 1: 1.4 ms
     * against 6.6 ms, 3072 x 3072); elsewhere the widened float32 path. The dnnl_cpu_isa_t enum
     * is a bit set: every level with a feature contains that level's bits. */
    const unsigned ui = (unsigned)isa;
    const int has_amx = (ui & (unsigned)dnnl_cpu_isa_avx512_core_amx) == (unsigned)dnnl_cpu_isa_avx512_core_amx;
    const int has_bf16 = (ui & (unsigned)dnnl_cpu_isa_avx512_core_bf16) == (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    /* only the two documented values force a path: an empty or unknown FS_GEMM_BF16 leaves the
     * choice to the CPU (an empty one used to force oneDNN for every shape) */
    const char *force = getenv("FS_GEMM_BF16");
    if (force && strcmp(force, "sgemm") && strcmp(force, "onednn")) force = NULL;
    native = force ? !strcmp(force, "onednn") : has_bf16;
    native_min_m = force || has_amx ? 0 : FS_GEMM_BF16_WIDEN_M;
    if (native && dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success) native = 0;
    if (!getenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY") && !getenv("DNNL_PRIMITIVE_CACHE_CAPACITY"))
        dnnl_set_primitive_cache_capacity(0); /* why: the header comment */
}

int fs_gemm_f32_onednn(void)
{
    pthread_once(&once, init);
    return f32_onednn;
}

void fs_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K, float alpha,
              const float *A, blasint lda, const float *B, blasint ldb, float beta, float *C, blasint ldc)
{
    pthread_once(&once, init);
    /* dnnl_sgemm is row-major; K = 0 (C = beta·C) and empty shapes stay with cblas, which
     * defines them */
    if (f32_onednn && order == CblasRowMajor && M > 0 && N > 0 && K > 0 &&
        dnnl_sgemm(ta == CblasTrans ? 'T' : 'N', tb == CblasTrans ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
                   ldc) == dnnl_success)
        return;
    cblas_sgemm(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

int fs_gemm_bf16_native(int64_t M)
{
    pthread_once(&once, init);
    return native && M < (native_min_m ? native_min_m : INT64_MAX);
}

const char *fs_gemm_describe(void)
{
    static char buf[384];
    pthread_once(&once, init);
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, sizeof buf, "fp32 gemm: %s (%s); bf16 gemm: %s (oneDNN %d.%d.%d, ISA %s; last matmul: %s)",
             f32_onednn ? "oneDNN sgemm" : "OpenBLAS", f32_why,
             !native ? "widened to fp32, rounded once" : native_min_m ? "oneDNN bf16 matmul below " FS_STR(FS_GEMM_BF16_WIDEN_M) " rows, else widened to fp32" : "oneDNN bf16 matmul",
             v->major, v->minor, v->patch, isa_name(isa), native ? last_impl : "-");
    return buf;
}

#define CK(call, what)                                                                                      \
    do {                                                                                                    \
        dnnl_status_t s_ = (call);                                                                          \
        if (s_ != dnnl_success) {                                                                           \
            rc = fs_errf(e, s_ == dnnl_out_of_memory ? FS_E_NOMEM : FS_E_INTERNAL,                          \
                         "cpu backend: bf16 gemm [%lld x %lld x %lld]: oneDNN %s failed (status %d)", (long long)M, \
                         (long long)N, (long long)K, what, (int)s_);                                        \
            goto done;                                                                                      \
        }                                                                                                   \
    } while (0)

int fs_gemm_bf16_onednn(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W, int64_t ldw,
                        const void *bias, void *C, int64_t ldc, fs_err *e)
{
    pthread_once(&once, init);
    if (!eng && dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success)
        return fs_errf(e, FS_E_INTERNAL, "cpu backend: bf16 gemm: no oneDNN CPU engine");
    int rc = FS_OK;
    dnnl_memory_desc_t a_md, w_md, b_md, c_md;
    dnnl_matmul_desc_t mm;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t st = NULL;
    dnnl_memory_t am = NULL, wm = NULL, bm = NULL, cm = NULL;
    const dnnl_dims_t ad = {M, K}, as = {lda, 1}, wd = {K, N}, ws = {1, ldw}, bd = {1, N}, bs = {N, 1}, cd = {M, N},
                      cs = {ldc, 1};
    CK(dnnl_memory_desc_init_by_strides(&a_md, 2, ad, dnnl_bf16, as), "src descriptor");
    CK(dnnl_memory_desc_init_by_strides(&w_md, 2, wd, dnnl_bf16, ws), "weights descriptor");
    CK(dnnl_memory_desc_init_by_strides(&b_md, 2, bd, dnnl_bf16, bs), "bias descriptor");
    CK(dnnl_memory_desc_init_by_strides(&c_md, 2, cd, dnnl_bf16, cs), "dst descriptor");
    CK(dnnl_matmul_desc_init(&mm, &a_md, &w_md, bias ? &b_md : NULL, &c_md), "matmul descriptor");
    CK(dnnl_primitive_desc_create(&pd, &mm, NULL, eng, NULL), "primitive descriptor");
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
        strncmp(last_impl, impl, sizeof last_impl - 1))
        snprintf(last_impl, sizeof last_impl, "%s", impl);
    CK(dnnl_primitive_create(&prim, pd), "primitive");
    CK(dnnl_stream_create(&st, eng, dnnl_stream_default_flags), "stream");
    CK(dnnl_memory_create(&am, &a_md, eng, (void *)A), "src memory");
    CK(dnnl_memory_create(&wm, &w_md, eng, (void *)W), "weights memory");
    CK(dnnl_memory_create(&cm, &c_md, eng, C), "dst memory");
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, cm}};
    int nargs = 3;
    if (bias) {
        CK(dnnl_memory_create(&bm, &b_md, eng, (void *)bias), "bias memory");
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, bm};
    }
    CK(dnnl_primitive_execute(prim, st, nargs, args), "execute");
    CK(dnnl_stream_wait(st), "stream wait");
done:
    if (am) dnnl_memory_destroy(am);
    if (wm) dnnl_memory_destroy(wm);
    if (bm) dnnl_memory_destroy(bm);
    if (cm) dnnl_memory_destroy(cm);
    if (st) dnnl_stream_destroy(st);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    return rc;
}
