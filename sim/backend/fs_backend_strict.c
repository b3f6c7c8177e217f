/* fs_backend_strict.c — `--backend cpu-strict`: the CPU kernels behind memory the host cannot
 * touch. A test tool: it proves that the model, the sequence-parallel code, the sampler, the
 * collectives and the recorders reach activations only through backend ops, as they must for a
 * GPU whose memory the host cannot dereference.
 *
 * How: every pointer this backend hands out carries a tag bit that makes the address
 * non-canonical (x86-64: bit 62; AArch64, whose top byte is ignored by the MMU: bit 54), so a
 * host dereference of it — a stray loop, a memcpy, MPI reading it, a recorder — faults
 * (SIGSEGV) at the first byte. Pointer arithmetic inside a block keeps the tag, like arithmetic
 * on device pointers. Each op removes the tags of its arguments and calls the CPU kernel; an
 * argument without the tag is host memory handed to the backend by mistake, which the op
 * refuses (FS_E_INTERNAL, naming the op). The backend is not host_addressable, so fs_comm stages
 * every collective through host buffers, as for a GPU. */
#include <stdint.h>
#include <string.h>

#include "fs_backend_cpu.h"

#if defined(__aarch64__)
#define TAG ((uintptr_t)1 << 54)
#else
#define TAG ((uintptr_t)1 << 62)
#endif

int fs_backend_strict_is_tagged(const void *p) { return p && ((uintptr_t)p & TAG); }
static void *tag(void *p) { return p ? (void *)((uintptr_t)p | TAG) : NULL; }

/* The untagged address of p, or NULL with an error when p is not backend memory. */
static void *untag(const void *p, const char *op, const char *arg, int *rc, fs_err *e)
{
    if (!p) return NULL;
    if (!((uintptr_t)p & TAG)) {
        if (!*rc)
            *rc = fs_errf(e, FS_E_INTERNAL, "cpu-strict %s: %s is host memory, not backend memory (a missing upload?)", op,
                          arg);
        return NULL;
    }
    return (void *)((uintptr_t)p & ~TAG);
}

/* A copy of the tensor struct with its data untagged (NULL stays NULL). */
static fs_tensor plain(const fs_tensor *t, const char *op, const char *arg, int *rc, fs_err *e)
{
    fs_tensor v = {0};
    if (!t) return v;
    v = *t;
    v.data = untag(t->data, op, arg, rc, e);
    v.owns = 0;
    return v;
}

#define CPU (fs_backend_cpu_kernels())
#define BE ((fs_backend *)CPU)

static int s_alloc(fs_backend *be, size_t bytes, void **p, fs_err *e)
{
    int rc = CPU->alloc(BE, bytes, p, e);
    if (!rc) *p = tag(*p);
    return rc;
}
static void s_free(fs_backend *be, void *p)
{
    if (p) CPU->free(BE, (void *)((uintptr_t)p & ~TAG));
}
static int s_memset(fs_backend *be, void *p, int v, size_t n, fs_err *e)
{
    int rc = 0;
    void *q = untag(p, "memset", "ptr", &rc, e);
    return rc ? rc : CPU->memset(BE, q, v, n, e);
}
/* host_side: which side of the copy is host memory (untagged) */
static int copy(const char *op, void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t rows, int dst_host,
                int src_host, fs_err *e)
{
    int rc = 0;
    if (!w || !rows) return FS_OK;
    if (dst_host && fs_backend_strict_is_tagged(dst))
        return fs_errf(e, FS_E_INTERNAL, "cpu-strict %s: destination is backend memory, not host memory", op);
    if (src_host && fs_backend_strict_is_tagged(src))
        return fs_errf(e, FS_E_INTERNAL, "cpu-strict %s: source is backend memory, not host memory", op);
    void *d = dst_host ? dst : untag(dst, op, "dst", &rc, e);
    const void *s = src_host ? src : untag(src, op, "src", &rc, e);
    return rc ? rc : CPU->copy2d(BE, d, dp, s, sp, w, rows, e);
}
static int s_upload2d(fs_backend *be, void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t rows, fs_err *e)
{
    return copy("upload2d", dst, dp, src, sp, w, rows, 0, 1, e);
}
static int s_download2d(fs_backend *be, void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t rows, fs_err *e)
{
    return copy("download2d", dst, dp, src, sp, w, rows, 1, 0, e);
}
static int s_copy2d(fs_backend *be, void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t rows, fs_err *e)
{
    return copy("copy2d", dst, dp, src, sp, w, rows, 0, 0, e);
}
static int s_sync(fs_backend *be, fs_err *e) { return FS_OK; }
static int s_host_alloc(fs_backend *be, size_t bytes, void **p, fs_err *e) { return CPU->host_alloc(BE, bytes, p, e); }
static void s_host_free(fs_backend *be, void *p) { CPU->host_free(BE, p); }

static int s_gemm(fs_backend *be, fs_dtype dt, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W,
                  int64_t ldw, const void *bias, void *C, int64_t ldc, fs_err *e)
{
    int rc = 0;
    const void *a = untag(A, "gemm", "A", &rc, e), *w = untag(W, "gemm", "W", &rc, e), *b = untag(bias, "gemm", "bias", &rc, e);
    void *c = untag(C, "gemm", "C", &rc, e);
    return rc ? rc : CPU->gemm(BE, dt, M, N, K, a, lda, w, ldw, b, c, ldc, e);
}

/* Element-wise and normalisation ops: untag every tensor, then the CPU op. */
#define T1(op, y)                                                                 \
    int rc = 0;                                                                   \
    fs_tensor y##_ = plain(y, #op, #y, &rc, e);
#define T2(op, y, x) T1(op, y) fs_tensor x##_ = plain(x, #op, #x, &rc, e);
#define T3(op, y, x, z) T2(op, y, x) fs_tensor z##_ = plain(z, #op, #z, &rc, e);
#define T4(op, y, x, z, w) T3(op, y, x, z) fs_tensor w##_ = plain(w, #op, #w, &rc, e);
#define P(t) ((t) ? &t##_ : NULL)

static int s_convert(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e)
{
    T2(convert, y, x) return rc ? rc : CPU->convert(BE, &y_, &x_, e);
}
static int s_add(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *z, fs_err *e)
{
    T3(add, y, x, z) return rc ? rc : CPU->add(BE, &y_, &x_, &z_, e);
}
static int s_mul(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *z, fs_err *e)
{
    T3(mul, y, x, z) return rc ? rc : CPU->mul(BE, &y_, &x_, &z_, e);
}
static int s_add_bias(fs_backend *be, fs_tensor *y, const fs_tensor *b, fs_err *e)
{
    T2(add_bias, y, b) return rc ? rc : CPU->add_bias(BE, &y_, &b_, e);
}
static int s_axpby(fs_backend *be, fs_tensor *y, double a, const fs_tensor *x, double b, fs_err *e)
{
    T2(axpby, y, x) return rc ? rc : CPU->axpby(BE, &y_, a, &x_, b, e);
}
static int s_silu(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e)
{
    T2(silu, y, x) return rc ? rc : CPU->silu(BE, &y_, &x_, e);
}
static int s_gelu_tanh(fs_backend *be, fs_tensor *y, const fs_tensor *x, fs_err *e)
{
    T2(gelu_tanh, y, x) return rc ? rc : CPU->gelu_tanh(BE, &y_, &x_, e);
}
static int s_layernorm(fs_backend *be, fs_tensor *y, const fs_tensor *x, double eps, fs_err *e)
{
    T2(layernorm, y, x) return rc ? rc : CPU->layernorm(BE, &y_, &x_, eps, e);
}
static int s_rmsnorm(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps, fs_err *e)
{
    T3(rmsnorm, y, x, w) return rc ? rc : CPU->rmsnorm(BE, &y_, &x_, &w_, eps, e);
}
static int s_modulate(fs_backend *be, fs_tensor *y, const fs_tensor *x, const fs_tensor *scale, const fs_tensor *shift,
                      fs_err *e)
{
    T4(modulate, y, x, scale, shift) return rc ? rc : CPU->modulate(BE, &y_, &x_, &scale_, &shift_, e);
}
static int s_gated_add(fs_backend *be, fs_tensor *x, const fs_tensor *gate, const fs_tensor *y, fs_err *e)
{
    T3(gated_add, x, gate, y) return rc ? rc : CPU->gated_add(BE, &x_, &gate_, &y_, e);
}
static int s_rope(fs_backend *be, fs_tensor *x, const fs_tensor *cos, const fs_tensor *sin, fs_err *e)
{
    T3(rope, x, cos, sin) return rc ? rc : CPU->rope(BE, &x_, &cos_, &sin_, e);
}
static int s_attention(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *q, const fs_tensor *k,
                       const fs_tensor *v, double scale, fs_err *e)
{
    T4(attention, out, q, k, v) fs_tensor lse_ = plain(lse, "attention", "lse", &rc, e);
    /* the kernel writes the LSE in the convention this backend declares (layout settable with
     * --lse-layout; base and offset the CPU backend's, FLUX_SIM_LSE_CONVENTION) */
    fs_backend shim = *CPU;
    shim.lse_layout = be->lse_layout;
    shim.lse_base = be->lse_base;
    shim.lse_offset = be->lse_offset;
    return rc ? rc : CPU->attention(&shim, &out_, P(lse), &q_, &k_, &v_, scale, e);
}
static int s_lse_convert(fs_backend *be, fs_tensor *dst, fs_lse_layout dl, const fs_tensor *src, fs_lse_layout sl, int64_t B,
                         int64_t H, int64_t S, fs_err *e)
{
    T2(lse_convert, dst, src) return rc ? rc : CPU->lse_convert(BE, &dst_, dl, &src_, sl, B, H, S, e);
}
static int s_ring_merge(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *out_i, const fs_tensor *lse_i,
                        fs_err *e)
{
    T4(ring_merge, out, lse, out_i, lse_i) return rc ? rc : CPU->ring_merge(BE, &out_, &lse_, &out_i_, &lse_i_, e);
}

static fs_backend strict = {
    .name = "cpu-strict",
    .host_addressable = 0,
    .lse_layout = FS_LSE_BHS,
    .alloc = s_alloc, .free = s_free, .memset = s_memset, .upload2d = s_upload2d, .download2d = s_download2d,
    .copy2d = s_copy2d, .sync = s_sync, .host_alloc = s_host_alloc, .host_free = s_host_free,
    .gemm = s_gemm, .convert = s_convert, .add = s_add, .mul = s_mul, .add_bias = s_add_bias, .axpby = s_axpby, .silu = s_silu,
    .gelu_tanh = s_gelu_tanh, .layernorm = s_layernorm, .rmsnorm = s_rmsnorm, .modulate = s_modulate,
    .gated_add = s_gated_add, .rope = s_rope, .attention = s_attention, .lse_convert = s_lse_convert,
    .ring_merge = s_ring_merge,
};

fs_backend *fs_backend_cpu_strict(void)
{
    const fs_backend *cpu = fs_backend_cpu(); /* the same malloc tuning (same allocations underneath) */
    strict.lse_base = cpu->lse_base;          /* and the same reported LSE convention */
    strict.lse_offset = cpu->lse_offset;
    return &strict;
}
