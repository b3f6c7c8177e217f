/* fs_gpu_attention.cu — attention with log-sum-exp, flash style (CUDA and HIP).
 *
 * out[b,i,h,:] = softmax_j(scale·q[b,i,h,:]·k[b,j,h,:])·v[b,j,h,:], q/out [B,Sq,H,Dh], k/v
 * [B,Skv,H,Dh]; lse[b,h,i] (natural log) in be->lse_layout: [B,H,S] or [B,S,H], indexed
 * explicitly. No S×S matrix exists: keys are visited in tiles with an online softmax (running
 * max m, running sum l, running unnormalised output o; each tile rescales them by exp(m_old −
 * m_new)). float64 computes in float64; float32 and bfloat16 in float32 (q, k, v widened as they
 * are loaded; out rounded once; lse float32).
 *
 * Work split: one block per (tile of query rows, head, batch). Each query row is owned by a group
 * of G = DMAX/8 lanes (G <= 32, so a group never straddles a wavefront of 32 or 64); lane t of
 * the group holds dims t, t+G, t+2G, … (8 of them) of q and o in registers. A tile of BK keys
 * and values is staged in shared memory (as the compute type); each score is a group-wide dot
 * product reduced with xor-shuffles of width G. DMAX is a template parameter (32, 64, 128, 256:
 * the smallest that holds the runtime Dh); BK keeps the two staged tiles within 32 KiB.
 * NaN behaves as in the CPU kernel: the max ignores NaN scores, their exp() carries NaN into the
 * sum and the output (the --inject nan-rank tests rely on NaN propagating). */
#include "fs_gpu_internal.h"

#include <math.h>

#define ATHREADS 256

__device__ __forceinline__ float a_exp(float x) { return expf(x); }
__device__ __forceinline__ double a_exp(double x) { return exp(x); }
__device__ __forceinline__ float a_log(float x) { return logf(x); }
__device__ __forceinline__ double a_log(double x) { return log(x); }

template <typename A, int DMAX> struct attn_cfg {
    static constexpr int PT = 8;                 /* dims per lane */
    static constexpr int G = DMAX / PT;          /* lanes per query row */
    static constexpr int ROWS = ATHREADS / G;    /* query rows per block */
    static constexpr int BK0 = 32768 / (2 * DMAX * (int)sizeof(A));
    static constexpr int BK = BK0 < 32 ? BK0 : 32; /* keys per staged tile */
};

template <typename S, int DMAX>
__global__ void __launch_bounds__(ATHREADS)
    k_attention(S *__restrict__ out, typename gio<S>::acc *__restrict__ lse, int lse_layout, const S *__restrict__ q,
                const S *__restrict__ k, const S *__restrict__ v, int64_t Sq, int64_t Skv, int64_t H, int64_t Dh,
                typename gio<S>::acc scale)
{
    typedef typename gio<S>::acc A;
    typedef attn_cfg<A, DMAX> C;
    constexpr int PT = C::PT, G = C::G, BK = C::BK;
    __shared__ A Ks[BK][DMAX];
    __shared__ A Vs[BK][DMAX];

    const int tid = (int)threadIdx.x, lane = tid % G;
    const int64_t h = blockIdx.y, b = blockIdx.z;
    const int64_t i = (int64_t)blockIdx.x * C::ROWS + tid / G; /* this group's query row */
    const bool live = i < Sq;
    const int64_t ld = H * Dh; /* elements between consecutive tokens */

    A qr[PT], o[PT];
    const S *qrow = q + ((b * Sq + (live ? i : 0)) * H + h) * Dh;
#pragma unroll
    for (int t = 0; t < PT; t++) {
        const int d = lane + G * t;
        qr[t] = (live && d < Dh) ? gio<S>::ld(qrow, d) : (A)0;
        o[t] = (A)0;
    }
    A m = -INFINITY, l = 0;

    const S *kb = k + (b * Skv * H + h) * Dh, *vb = v + (b * Skv * H + h) * Dh;
    for (int64_t j0 = 0; j0 < Skv; j0 += BK) {
        const int nk = Skv - j0 < BK ? (int)(Skv - j0) : BK;
        /* stage keys/values j0 .. j0+nk (rows of Dh, contiguous: coalesced) */
        for (int idx = tid; idx < BK * Dh; idx += ATHREADS) {
            const int j = idx / (int)Dh, d = idx % (int)Dh;
            const bool in = j < nk;
            Ks[j][d] = in ? gio<S>::ld(kb, (j0 + j) * ld + d) : (A)0;
            Vs[j][d] = in ? gio<S>::ld(vb, (j0 + j) * ld + d) : (A)0;
        }
        __syncthreads();

        A s[BK];
        A mt = m;
#pragma unroll
        for (int j = 0; j < BK; j++) {
            A part = 0;
#pragma unroll
            for (int t = 0; t < PT; t++) {
                const int d = lane + G * t;
                if (d < Dh) part += qr[t] * Ks[j][d];
            }
#pragma unroll
            for (int off = G / 2; off > 0; off >>= 1) part += FS_SHFL_XOR(part, off, G);
            s[j] = part * scale;
            if (j < nk) mt = s[j] > mt ? s[j] : mt; /* NaN never becomes the max (as on the CPU) */
        }
        const A alpha = m == -INFINITY ? (A)0 : a_exp(m - mt);
        A psum = 0;
#pragma unroll
        for (int t = 0; t < PT; t++) o[t] *= alpha;
#pragma unroll
        for (int j = 0; j < BK; j++) {
            const A p = j < nk ? a_exp(s[j] - mt) : (A)0;
            psum += p;
#pragma unroll
            for (int t = 0; t < PT; t++) {
                const int d = lane + G * t;
                if (d < Dh) o[t] += p * Vs[j][d];
            }
        }
        l = l * alpha + psum;
        m = mt;
        __syncthreads(); /* before the next tile overwrites Ks/Vs */
    }

    if (!live) return;
    const A inv = l == (A)0 ? (A)0 : (A)1 / l; /* Skv == 0: out 0, lse −inf (the CPU's GEMM with K = 0) */
    S *orow = out + ((b * Sq + i) * H + h) * Dh;
#pragma unroll
    for (int t = 0; t < PT; t++) {
        const int d = lane + G * t;
        if (d < Dh) gio<S>::st(orow, d, o[t] * inv);
    }
    if (lse && lane == 0) {
        const int64_t li = lse_layout == FS_LSE_BHS ? (b * H + h) * Sq + i : (b * Sq + i) * H + h;
        lse[li] = m + a_log(l);
    }
}

template <typename S, int DMAX>
static void launch(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *q, const fs_tensor *k,
                   const fs_tensor *v, double scale)
{
    typedef typename gio<S>::acc A;
    const int64_t B = q->shape[0], Sq = q->shape[1], H = q->shape[2], Dh = q->shape[3], Skv = k->shape[1];
    const dim3 grid((unsigned)((Sq + attn_cfg<A, DMAX>::ROWS - 1) / attn_cfg<A, DMAX>::ROWS), (unsigned)H, (unsigned)B);
    auto kern = &k_attention<S, DMAX>;
    FS_LAUNCH(kern, grid, ATHREADS, 0, gpu_ctx(be)->stream, (S *)out->data, lse ? (A *)lse->data : (A *)NULL,
              (int)be->lse_layout, (const S *)q->data, (const S *)k->data, (const S *)v->data, Sq, Skv, H, Dh, (A)scale);
}

int fs_gpu_attention(fs_backend *be, fs_tensor *out, fs_tensor *lse, const fs_tensor *q, const fs_tensor *k,
                     const fs_tensor *v, double scale, fs_err *e)
{
    const char *op = "attention";
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || out->ndim != 4)
        return fs_errf(e, FS_E_INTERNAL, "%s backend: %s: q, k, v, out must be [B, S, H, Dh]", FS_GPU_VENDOR, op);
    if (k->dtype != q->dtype || v->dtype != q->dtype || out->dtype != q->dtype)
        return fs_errf(e, FS_E_INTERNAL, "%s backend: %s: q, k, v, out dtypes differ", FS_GPU_VENDOR, op);
    const int64_t B = q->shape[0], Sq = q->shape[1], H = q->shape[2], Dh = q->shape[3];
    for (int d = 0; d < 4; d++)
        if (out->shape[d] != q->shape[d] || v->shape[d] != k->shape[d] || (d != 1 && k->shape[d] != q->shape[d]))
            return fs_errf(e, FS_E_INTERNAL, "%s backend: %s: shapes of q, k, v, out do not match", FS_GPU_VENDOR, op);
    if (Dh > 256 || Dh < 1)
        return fs_errf(e, FS_E_INPUT, "%s backend: %s: head dim %lld not supported (1..256)", FS_GPU_VENDOR, op, (long long)Dh);
    if (H > 65535 || B > 65535)
        return fs_errf(e, FS_E_INTERNAL, "%s backend: %s: more than 65535 heads or batches", FS_GPU_VENDOR, op);
    if (be->lse_layout != FS_LSE_BHS && be->lse_layout != FS_LSE_BSH)
        return fs_errf(e, FS_E_INTERNAL, "%s backend: %s: unknown LSE layout %d", FS_GPU_VENDOR, op, (int)be->lse_layout);
    if (lse) {
        const fs_dtype want = q->dtype == FS_F64 ? FS_F64 : FS_F32;
        if (lse->dtype != want)
            return fs_errf(e, FS_E_INTERNAL, "%s backend: %s: lse must be %s for %s q (got %s)", FS_GPU_VENDOR, op,
                           gpu_dtname(want), gpu_dtname(q->dtype), gpu_dtname(lse->dtype));
        if (gpu_numel(lse) < B * H * Sq)
            return fs_errf(e, FS_E_INTERNAL, "%s backend: %s: lse smaller than B·H·S", FS_GPU_VENDOR, op);
    }
    if (!B || !Sq || !H) return FS_OK;
    return gpu_dispatch(q->dtype, op, e, [&](auto t) {
        typedef typename decltype(t)::type S;
        if (Dh <= 32) launch<S, 32>(be, out, lse, q, k, v, scale);
        else if (Dh <= 64) launch<S, 64>(be, out, lse, q, k, v, scale);
        else if (Dh <= 128) launch<S, 128>(be, out, lse, q, k, v, scale);
        else launch<S, 256>(be, out, lse, q, k, v, scale);
        return fs_gpu_after(be, op, e);
    });
}
