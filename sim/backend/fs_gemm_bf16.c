/* fs_gemm_bf16.c — the bfloat16 nn.Linear through oneDNN's matmul primitive (fs_gemm_bf16.h).
 *
 * Layouts, all views of the caller's memory (no copies on our side):
 *   src     A [M, K], strides (lda, 1), bf16
 *   weights Wᵀ [K, N] as a view of W [N, K]: strides (1, ldw), bf16 (oneDNN packs it into its
 *           VNNI blocks itself, per call: N·K·2 bytes read, a few percent of a large GEMM)
 *   bias    [1, N], bf16 (added to the float32 accumulator, converted exactly)
 *   dst     C [M, N], strides (ldc, 1), bf16: the accumulator + bias converted once, RNE
 * A primitive descriptor is created per call (tens of microseconds); the primitive itself comes
 * from oneDNN's primitive cache after the first call on a shape (JIT code generated once). The
 * OpenMP thread count is oneDNN's (its CPU runtime is OpenMP, the same libgomp as ours), so
 * fs_backend_cpu_set_threads governs it. */
#include "fs_gemm_bf16.h"

#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static dnnl_engine_t eng;
static int native;          /* the bf16 gemm op goes through oneDNN */
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

static void init(void)
{
    isa = dnnl_get_effective_cpu_isa();
    /* native bf16 dot products: avx512_core_bf16 and the AMX levels above it (the enum is a
     * bit set; every level with bf16 contains avx512_core_bf16's bits) */
    const int has_bf16 = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) == (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    const char *force = getenv("FS_GEMM_BF16");
    native = force && !strcmp(force, "sgemm") ? 0 : force && !strcmp(force, "onednn") ? 1 : has_bf16;
    if (native && dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success) native = 0;
}

int fs_gemm_bf16_native(void)
{
    pthread_once(&once, init);
    return native;
}

const char *fs_gemm_bf16_describe(void)
{
    static char buf[256];
    pthread_once(&once, init);
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, sizeof buf, "%s (oneDNN %d.%d.%d, ISA %s; last matmul: %s)",
             native ? "oneDNN bf16 matmul" : "float32 sgemm, rounded", v->major, v->minor, v->patch, isa_name(isa),
             native ? last_impl : "-");
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
