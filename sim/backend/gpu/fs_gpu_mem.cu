/* fs_gpu_mem.cu — the GPU backend's table: open/close, memory, transfers (CUDA and HIP).
 *
 * One stream per backend; every op and copy is issued on it, so ops run in program order and a
 * block freed by one tensor may be handed to the next at once (stream order protects it).
 * Memory goes through a small caching allocator (the model allocates and frees activations at
 * every op, and cudaFree synchronises the device): blocks are rounded to size classes and kept
 * on free lists; when cudaMalloc fails the cache is emptied and the allocation tried again. */
#include "fs_gpu_internal.h"

#include <map>
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unordered_map>
#include <unordered_set>

/* ------------------------------------------------------------------ errors */

int fs_gpu_rt_err(fs_err *e, const char *op, cudaError_t st)
{
    return fs_errf(e, st == cudaErrorMemoryAllocation ? FS_E_NOMEM : FS_E_INTERNAL, "%s backend: %s: %s (%s)",
                   FS_GPU_VENDOR, op, cudaGetErrorName(st), cudaGetErrorString(st));
}

int fs_gpu_after(fs_backend *be, const char *op, fs_err *e)
{
    cudaError_t st = cudaGetLastError();
    if (st != cudaSuccess) return fs_gpu_rt_err(e, op, st);
    if (gpu_ctx(be)->sync_each) {
        st = cudaStreamSynchronize(gpu_ctx(be)->stream);
        if (st != cudaSuccess) return fs_gpu_rt_err(e, op, st);
    }
    return FS_OK;
}

/* ------------------------------------------------------------------ caching allocator */

struct fs_gpu_cache {
    std::mutex mu;
    int enabled = 1;
    std::unordered_map<void *, size_t> live; /* pointer -> rounded size */
    std::multimap<size_t, void *> idle;      /* rounded size -> free block */
    size_t idle_bytes = 0;
    std::unordered_set<void *> unpinned;     /* host cache only: blocks from malloc, not pinned */
};

/* Size classes: multiples of 512 B below 1 MiB, then quarters of a power of two (<= 25% slack). */
static size_t round_class(size_t n)
{
    if (n < 512) return 512;
    if (n < ((size_t)1 << 20)) return (n + 511) / 512 * 512;
    size_t p = (size_t)1 << 20;
    while (p <= n / 2) p <<= 1; /* p <= n < 2p */
    size_t g = p / 4;
    return (n + g - 1) / g * g;
}

static void cache_release_idle(fs_gpu_cache *c)
{
    for (auto &kv : c->idle) (void)cudaFree(kv.second);
    c->idle.clear();
    c->idle_bytes = 0;
}

static int gpu_alloc(fs_backend *be, size_t bytes, void **ptr, fs_err *e)
{
    fs_gpu_cache *c = gpu_ctx(be)->cache;
    *ptr = NULL;
    size_t r = round_class(bytes);
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->enabled) {
        auto it = c->idle.find(r);
        if (it != c->idle.end()) {
            *ptr = it->second;
            c->idle.erase(it);
            c->idle_bytes -= r;
            c->live[*ptr] = r;
            return FS_OK;
        }
    }
    void *p = NULL;
    cudaError_t st = cudaMalloc(&p, r);
    if (st == cudaErrorMemoryAllocation && c->idle_bytes) {
        (void)cudaGetLastError(); /* clear it, give the cache back, try once more */
        (void)cudaStreamSynchronize(gpu_ctx(be)->stream);
        cache_release_idle(c);
        st = cudaMalloc(&p, r);
    }
    if (st != cudaSuccess) {
        (void)cudaGetLastError();
        size_t fr = 0, tot = 0;
        (void)cudaMemGetInfo(&fr, &tot);
        (void)cudaGetLastError();
        return fs_errf(e, st == cudaErrorMemoryAllocation ? FS_E_NOMEM : FS_E_INTERNAL,
                       "%s backend: alloc of %zu bytes failed: %s (%.1f of %.1f GiB free on device %d)", FS_GPU_VENDOR,
                       bytes, cudaGetErrorName(st), fr / 1073741824.0, tot / 1073741824.0, gpu_ctx(be)->device);
    }
    c->live[p] = r;
    *ptr = p;
    return FS_OK;
}

static void gpu_free(fs_backend *be, void *ptr)
{
    if (!ptr) return;
    fs_gpu_cache *c = gpu_ctx(be)->cache;
    std::lock_guard<std::mutex> lock(c->mu);
    auto it = c->live.find(ptr);
    if (it == c->live.end()) return; /* not ours (or freed twice): nothing to do, no error channel */
    size_t r = it->second;
    c->live.erase(it);
    if (c->enabled) {
        c->idle.emplace(r, ptr);
        c->idle_bytes += r;
    } else {
        (void)cudaFree(ptr);
    }
}

/* ------------------------------------------------------------------ transfers */

static int gpu_memset(fs_backend *be, void *ptr, int byte, size_t bytes, fs_err *e)
{
    if (!bytes) return FS_OK;
    cudaError_t st = cudaMemsetAsync(ptr, byte, bytes, gpu_ctx(be)->stream);
    return st == cudaSuccess ? fs_gpu_after(be, "memset", e) : fs_gpu_rt_err(e, "memset", st);
}

/* A 2-D copy on the backend's stream; contiguous blocks (or one row) go as one 1-D copy, which
 * also avoids cudaMemcpy2D's pitch limit for large tensors. */
static cudaError_t copy2d_async(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t rows,
                                cudaMemcpyKind kind, cudaStream_t s)
{
    if (rows == 1 || (dp == w && sp == w)) return cudaMemcpyAsync(dst, src, w * rows, kind, s);
    return cudaMemcpy2DAsync(dst, dp, src, sp, w, rows, kind, s);
}

static int check_pitches(const char *op, size_t dp, size_t sp, size_t w, size_t rows, fs_err *e)
{
    if (rows > 1 && (dp < w || sp < w))
        return fs_errf(e, FS_E_INTERNAL, "%s backend: %s: pitch smaller than the row (dpitch %zu, spitch %zu, width %zu)",
                       FS_GPU_VENDOR, op, dp, sp, w);
    return FS_OK;
}

/* Host → device. Returns when the host bytes have been read (the stream is synchronised), so
 * the caller may reuse or free `src` at once, pinned or not — fs_comm receives the next message
 * into the same staging buffer. */
static int gpu_upload2d(fs_backend *be, void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t rows,
                        fs_err *e)
{
    if (!w || !rows) return FS_OK;
    if (check_pitches("upload2d", dp, sp, w, rows, e)) return e->code;
    fs_gpu_ctx *c = gpu_ctx(be);
    cudaError_t st = copy2d_async(dst, dp, src, sp, w, rows, cudaMemcpyHostToDevice, c->stream);
    if (st == cudaSuccess) st = cudaStreamSynchronize(c->stream);
    return st == cudaSuccess ? FS_OK : fs_gpu_rt_err(e, "upload2d", st);
}

/* Device → host, synchronous: the host bytes are valid on return (and every op issued before
 * has finished: a kernel's failure surfaces here at the latest). */
static int gpu_download2d(fs_backend *be, void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t rows,
                          fs_err *e)
{
    if (!w || !rows) return FS_OK;
    if (check_pitches("download2d", dp, sp, w, rows, e)) return e->code;
    fs_gpu_ctx *c = gpu_ctx(be);
    cudaError_t st = copy2d_async(dst, dp, src, sp, w, rows, cudaMemcpyDeviceToHost, c->stream);
    if (st == cudaSuccess) st = cudaStreamSynchronize(c->stream);
    return st == cudaSuccess ? FS_OK : fs_gpu_rt_err(e, "download2d", st);
}

static int gpu_copy2d(fs_backend *be, void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t rows,
                      fs_err *e)
{
    if (!w || !rows || (dst == src && dp == sp)) return FS_OK;
    if (check_pitches("copy2d", dp, sp, w, rows, e)) return e->code;
    cudaError_t st = copy2d_async(dst, dp, src, sp, w, rows, cudaMemcpyDeviceToDevice, gpu_ctx(be)->stream);
    return st == cudaSuccess ? fs_gpu_after(be, "copy2d", e) : fs_gpu_rt_err(e, "copy2d", st);
}

static int gpu_sync(fs_backend *be, fs_err *e)
{
    cudaError_t st = cudaStreamSynchronize(gpu_ctx(be)->stream);
    return st == cudaSuccess ? FS_OK : fs_gpu_rt_err(e, "sync", st);
}

/* Pinned staging buffers (fs_comm takes one per collective and gives it back after): cached
 * like device blocks, since pinning is slow and cudaFreeHost synchronises the device. When
 * pinning fails (a memlock limit, a busy driver), plain malloc'd memory serves: slower
 * transfers, same results. */
static int gpu_host_alloc(fs_backend *be, size_t bytes, void **ptr, fs_err *e)
{
    fs_gpu_cache *c = gpu_ctx(be)->host_cache;
    *ptr = NULL;
    size_t r = round_class(bytes);
    std::lock_guard<std::mutex> lock(c->mu);
    auto it = c->idle.find(r);
    if (it != c->idle.end()) {
        *ptr = it->second;
        c->idle.erase(it);
        c->idle_bytes -= r;
        c->live[*ptr] = r;
        return FS_OK;
    }
    cudaError_t st = cudaHostAlloc(ptr, r, cudaHostAllocDefault);
    if (st != cudaSuccess) {
        (void)cudaGetLastError();
        *ptr = malloc(r);
        if (!*ptr)
            return fs_errf(e, FS_E_NOMEM,
                           "%s backend: host staging of %zu bytes: pinned allocation failed (%s) and so did malloc",
                           FS_GPU_VENDOR, bytes, cudaGetErrorName(st));
        c->unpinned.insert(*ptr);
    }
    c->live[*ptr] = r;
    return FS_OK;
}

static void host_release(fs_gpu_cache *c, void *p)
{
    auto u = c->unpinned.find(p);
    if (u != c->unpinned.end()) {
        c->unpinned.erase(u);
        free(p);
    } else {
        (void)cudaFreeHost(p);
    }
}

static void gpu_host_free(fs_backend *be, void *ptr)
{
    if (!ptr) return;
    fs_gpu_cache *c = gpu_ctx(be)->host_cache;
    std::lock_guard<std::mutex> lock(c->mu);
    auto it = c->live.find(ptr);
    if (it == c->live.end()) return;
    size_t r = it->second;
    c->live.erase(it);
    c->idle.emplace(r, ptr);
    c->idle_bytes += r;
}

/* ------------------------------------------------------------------ open / close */

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* The rank's index on its node, from the launcher's environment (0 when run without one). */
static int local_rank(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v) < 0 ? 0 : atoi(v);
    }
    return 0;
}

/* Every member by name (a member added to fs_backend.h and not set here stays NULL, which
 * tests/gpu/gpu_check.c reports). */
static void fill_table(fs_backend *b)
{
    b->name = FS_GPU_VENDOR;
    b->host_addressable = 0;
#ifdef FS_GPU_HIP
    b->lse_layout = FS_LSE_BSH; /* ROCm flash / CK's native layout */
#else
    b->lse_layout = FS_LSE_BHS; /* CUDA flash attention's */
#endif
    b->alloc = gpu_alloc;
    b->free = gpu_free;
    b->memset = gpu_memset;
    b->upload2d = gpu_upload2d;
    b->download2d = gpu_download2d;
    b->copy2d = gpu_copy2d;
    b->sync = gpu_sync;
    b->host_alloc = gpu_host_alloc;
    b->host_free = gpu_host_free;
    b->gemm = fs_gpu_gemm;
    b->convert = fs_gpu_convert;
    b->add = fs_gpu_add;
    b->mul = fs_gpu_mul;
    b->add_bias = fs_gpu_add_bias;
    b->axpby = fs_gpu_axpby;
    b->silu = fs_gpu_silu;
    b->gelu_tanh = fs_gpu_gelu_tanh;
    b->layernorm = fs_gpu_layernorm;
    b->rmsnorm = fs_gpu_rmsnorm;
    b->modulate = fs_gpu_modulate;
    b->gated_add = fs_gpu_gated_add;
    b->rope = fs_gpu_rope;
    b->attention = fs_gpu_attention;
    b->lse_convert = fs_gpu_lse_convert;
    b->ring_merge = fs_gpu_ring_merge;
}

static void ctx_destroy(fs_gpu_ctx *c)
{
    if (!c) return;
    if (c->stream) (void)cudaStreamSynchronize(c->stream);
    fs_gpu_gemm_fini(c);
    if (c->cache) {
        cache_release_idle(c->cache);
        for (auto &kv : c->cache->live) (void)cudaFree(kv.first);
        delete c->cache;
    }
    if (c->host_cache) {
        for (auto &kv : c->host_cache->idle) host_release(c->host_cache, kv.second);
        for (auto &kv : c->host_cache->live) host_release(c->host_cache, kv.first);
        delete c->host_cache;
    }
    if (c->stream) (void)cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    delete c;
}

extern "C" int fs_backend_gpu_open(const char *name, fs_backend **be, fs_err *e)
{
    *be = NULL;
    if (!name || strcmp(name, FS_GPU_VENDOR))
        return fs_errf(e, FS_E_INPUT, "--backend %s: this build's GPU backend is %s (make GPU=%s builds the other; docs/gpu.md)",
                       name ? name : "(null)", FS_GPU_VENDOR, FS_GPU_VENDOR[0] == 'c' ? "hip" : "cuda");
    int ndev = 0;
    cudaError_t st = cudaGetDeviceCount(&ndev);
    if (st != cudaSuccess || ndev <= 0) {
        (void)cudaGetLastError();
        if (st != cudaSuccess)
            return fs_errf(e, FS_E_INPUT, "--backend %s: no %s device: %sGetDeviceCount returned %d (%s: %s)", name,
                           FS_GPU_VENDOR_UPPER, FS_GPU_VENDOR, (int)st, cudaGetErrorName(st), cudaGetErrorString(st));
        return fs_errf(e, FS_E_INPUT, "--backend %s: no %s device: %sGetDeviceCount found 0 devices", name,
                       FS_GPU_VENDOR_UPPER, FS_GPU_VENDOR);
    }
    fs_gpu_ctx *c = new fs_gpu_ctx();
    c->ndev = ndev;
    c->local_rank = local_rank();
    c->device = c->local_rank % ndev;
    c->sync_each = env_int("FLUX_SIM_GPU_SYNC", 0) != 0;
    c->cache = new fs_gpu_cache();
    c->cache->enabled = env_int("FLUX_SIM_GPU_CACHE", 1) != 0;
    c->host_cache = new fs_gpu_cache();
    st = cudaSetDevice(c->device);
    if (st != cudaSuccess) {
        fs_errf(e, FS_E_INPUT, "--backend %s: cannot use device %d of %d (local rank %d): %s: %s", name, c->device, ndev,
                c->local_rank, cudaGetErrorName(st), cudaGetErrorString(st));
        ctx_destroy(c);
        return FS_E_INPUT;
    }
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    if (cudaGetDeviceProperties(&prop, c->device) == cudaSuccess) {
        snprintf(c->devname, sizeof c->devname, "%s", prop.name);
        snprintf(c->arch, sizeof c->arch, FS_GPU_ARCH_NAME(prop));
        c->sms = prop.multiProcessorCount;
        c->mem_total = prop.totalGlobalMem;
    }
    (void)cudaRuntimeGetVersion(&c->rt_version);
    (void)cudaDriverGetVersion(&c->drv_version);
    (void)cudaGetLastError();
    st = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (st != cudaSuccess) {
        c->stream = NULL;
        fs_gpu_rt_err(e, "stream creation", st);
        fs_err_prefix(e, "--backend %s: ", name);
        ctx_destroy(c);
        return e ? e->code : FS_E_INTERNAL;
    }
    const char *g = getenv("FLUX_SIM_GPU_GEMM");
    if (g && *g && strcmp(g, "tiled") && strcmp(g, "cublas")) {
        ctx_destroy(c);
        return fs_errf(e, FS_E_INPUT, "FLUX_SIM_GPU_GEMM=%s: expected 'cublas' or 'tiled'", g);
    }
    c->gemm_tiled = !FS_GPU_HAVE_BLAS || (g && !strcmp(g, "tiled"));
    if (!FS_GPU_HAVE_BLAS && g && !strcmp(g, "cublas")) {
        ctx_destroy(c);
        return fs_errf(e, FS_E_INPUT, "FLUX_SIM_GPU_GEMM=cublas: the %s build has no BLAS library (tiled only)",
                       FS_GPU_VENDOR);
    }
    if (fs_gpu_gemm_init(c, e)) {
        int code = e ? e->code : FS_E_INTERNAL;
        fs_err_prefix(e, "--backend %s: ", name);
        ctx_destroy(c);
        return code;
    }
    fs_backend *b = (fs_backend *)calloc(1, sizeof *b);
    if (!b) {
        ctx_destroy(c);
        return fs_errf(e, FS_E_NOMEM, "--backend %s: out of memory", name);
    }
    fill_table(b);
    b->ctx = c;
    *be = b;
    return FS_OK;
}

extern "C" void fs_backend_gpu_close(fs_backend *be)
{
    if (!be) return;
    ctx_destroy(gpu_ctx(be));
    free(be);
}

extern "C" const char *fs_backend_gpu_describe(const fs_backend *be, char *buf, size_t n)
{
    const fs_gpu_ctx *c = be && be->alloc == gpu_alloc ? (const fs_gpu_ctx *)be->ctx : NULL;
    if (!c) {
        snprintf(buf, n, "(not a GPU backend)");
        return buf;
    }
    snprintf(buf, n,
             "%s (%s, %d %s, %.1f GiB), device %d of %d (local rank %d), %s runtime %d driver %d, gemm %s, lse layout %s%s",
             c->devname, c->arch, c->sms, FS_GPU_HAVE_BLAS ? "SMs" : "CUs", c->mem_total / 1073741824.0, c->device, c->ndev,
             c->local_rank, FS_GPU_VENDOR_UPPER, c->rt_version, c->drv_version,
             c->gemm_tiled ? "tiled" : "cublas", gpu_lse_name(be->lse_layout), c->sync_each ? ", sync after every op" : "");
    return buf;
}

extern "C" const char *fs_backend_gpu_device_name(const fs_backend *be)
{
    const fs_gpu_ctx *c = be && be->alloc == gpu_alloc ? (const fs_gpu_ctx *)be->ctx : NULL;
    return c ? c->devname : "";
}
