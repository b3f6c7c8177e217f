/* fs_kernels_cpu_f32.c — the CPU kernels of fs_kernels_cpu.inc for float32, exported as cpu_<op>_f32
 * (fs_kernels_cpu.h). FS_VEC_F32: exp and tanh vectorised (fs_vmath.h), the softmax's and the norms'
 * sums in partials, and the bias-first GEMM. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fs_gemm.h"
#include "fs_kernels_cpu.h"
#include "fs_vmath.h"

#define FS_VEC_F32 1
#define T float
#define GEMM fs_sgemm
#define EXP expf
#define LOG logf
#define TANH tanhf
#define LOG1P log1pf
#include "fs_kernels_cpu.inc"

/* the exported instances (fs_kernels_cpu.h) */
void cpu_gemm_f32(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W, int64_t ldw,
                  const void *bias, void *C, int64_t ldc)
{
    cpu_kernel_gemm(M, N, K, A, lda, W, ldw, bias, C, ldc);
}
void cpu_gemm_bias_first_f32(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W, int64_t ldw,
                             const void *bias, void *C, int64_t ldc)
{
    cpu_kernel_gemm_bias_first(M, N, K, A, lda, W, ldw, bias, C, ldc);
}
void cpu_add_bias_f32(fs_tensor *y, const fs_tensor *bias) { cpu_kernel_add_bias(y, bias); }
void cpu_axpby_f32(fs_tensor *y, double a, const fs_tensor *x, double b) { cpu_kernel_axpby(y, a, x, b); }
void cpu_add_f32(fs_tensor *y, const fs_tensor *x, const fs_tensor *z) { cpu_kernel_add(y, x, z); }
void cpu_mul_f32(fs_tensor *y, const fs_tensor *x, const fs_tensor *z) { cpu_kernel_mul(y, x, z); }
void cpu_silu_f32(fs_tensor *y, const fs_tensor *x) { cpu_kernel_silu(y, x); }
void cpu_gelu_tanh_f32(fs_tensor *y, const fs_tensor *x) { cpu_kernel_gelu_tanh(y, x); }
void cpu_layernorm_f32(fs_tensor *y, const fs_tensor *x, double eps) { cpu_kernel_layernorm(y, x, eps); }
void cpu_rmsnorm_f32(fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps)
{
    cpu_kernel_rmsnorm(y, x, w, eps);
}
void cpu_modulate_f32(fs_tensor *y, const fs_tensor *x, const fs_tensor *scale, const fs_tensor *shift)
{
    cpu_kernel_modulate(y, x, scale, shift);
}
void cpu_gated_add_f32(fs_tensor *x, const fs_tensor *gate, const fs_tensor *y) { cpu_kernel_gated_add(x, gate, y); }
void cpu_rope_f32(fs_tensor *x, const fs_tensor *cos, const fs_tensor *sin) { cpu_kernel_rope(x, cos, sin); }
int cpu_attention_f32(fs_tensor *out, fs_tensor *lse, fs_lse_layout layout, const fs_tensor *q, const fs_tensor *k,
                      const fs_tensor *v, double scale, fs_err *e)
{
    return cpu_kernel_attention(out, lse, layout, q, k, v, scale, e);
}
void cpu_lse_convert_f32(fs_tensor *dst, fs_lse_layout dl, const fs_tensor *src, fs_lse_layout sl, int64_t B, int64_t H,
                         int64_t S)
{
    cpu_kernel_lse_convert(dst, dl, src, sl, B, H, S);
}
void cpu_ring_merge_f32(fs_tensor *out, fs_tensor *lse, const fs_tensor *out_i, const fs_tensor *lse_i)
{
    cpu_kernel_ring_merge(out, lse, out_i, lse_i);
}
