/* fs_kernels_cpu.h — internal to the CPU backend: its kernels, one function per op and dtype.
 *
 * Each kernel is written once, for an element type T, in fs_kernels_cpu.inc (cpu_kernel_<op>);
 * fs_kernels_cpu_f32.c and fs_kernels_cpu_f64.c compile it for float and double and export it as
 * cpu_<op>_f32 and cpu_<op>_f64 (declared here). fs_backend_cpu.c dispatches on the dtype and adds
 * the bfloat16 paths (upcast, the float32 kernel, round). The arguments are the op's in
 * fs_backend.h minus the backend and, for ops that cannot fail, the error sink; shapes and dtypes
 * have been checked by the caller. Memory is host memory: the strict backend untags first. */
#ifndef FS_KERNELS_CPU_H
#define FS_KERNELS_CPU_H

#include "fs_backend.h"

/* float32 (fs_kernels_cpu_f32.c: fs_vmath's exp and tanh, partial sums; see fs_kernels_cpu.inc) */
void cpu_gemm_f32(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W, int64_t ldw,
                  const void *bias, void *C, int64_t ldc);
void cpu_add_bias_f32(fs_tensor *y, const fs_tensor *bias);
void cpu_axpby_f32(fs_tensor *y, double a, const fs_tensor *x, double b);
void cpu_add_f32(fs_tensor *y, const fs_tensor *x, const fs_tensor *z);
void cpu_mul_f32(fs_tensor *y, const fs_tensor *x, const fs_tensor *z);
void cpu_silu_f32(fs_tensor *y, const fs_tensor *x);
void cpu_gelu_tanh_f32(fs_tensor *y, const fs_tensor *x);
void cpu_layernorm_f32(fs_tensor *y, const fs_tensor *x, double eps);
void cpu_rmsnorm_f32(fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps);
void cpu_modulate_f32(fs_tensor *y, const fs_tensor *x, const fs_tensor *scale, const fs_tensor *shift);
void cpu_gated_add_f32(fs_tensor *x, const fs_tensor *gate, const fs_tensor *y);
void cpu_rope_f32(fs_tensor *x, const fs_tensor *cos, const fs_tensor *sin);
int cpu_attention_f32(fs_tensor *out, fs_tensor *lse, fs_lse_layout layout, const fs_tensor *q, const fs_tensor *k,
                      const fs_tensor *v, double scale, fs_err *e);
void cpu_lse_convert_f32(fs_tensor *dst, fs_lse_layout dl, const fs_tensor *src, fs_lse_layout sl, int64_t B, int64_t H,
                         int64_t S);
void cpu_ring_merge_f32(fs_tensor *out, fs_tensor *lse, const fs_tensor *out_i, const fs_tensor *lse_i);
/* float32 nn.Linear with the bias rows written first, then C += A·Wᵀ (the float32 gemm op) */
void cpu_gemm_bias_first_f32(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W, int64_t ldw,
                             const void *bias, void *C, int64_t ldc);

/* float64 (fs_kernels_cpu_f64.c: libm, serial sums; bit for bit golden/default-fp64.h5) */
void cpu_gemm_f64(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W, int64_t ldw,
                  const void *bias, void *C, int64_t ldc);
void cpu_add_bias_f64(fs_tensor *y, const fs_tensor *bias);
void cpu_axpby_f64(fs_tensor *y, double a, const fs_tensor *x, double b);
void cpu_add_f64(fs_tensor *y, const fs_tensor *x, const fs_tensor *z);
void cpu_mul_f64(fs_tensor *y, const fs_tensor *x, const fs_tensor *z);
void cpu_silu_f64(fs_tensor *y, const fs_tensor *x);
void cpu_gelu_tanh_f64(fs_tensor *y, const fs_tensor *x);
void cpu_layernorm_f64(fs_tensor *y, const fs_tensor *x, double eps);
void cpu_rmsnorm_f64(fs_tensor *y, const fs_tensor *x, const fs_tensor *w, double eps);
void cpu_modulate_f64(fs_tensor *y, const fs_tensor *x, const fs_tensor *scale, const fs_tensor *shift);
void cpu_gated_add_f64(fs_tensor *x, const fs_tensor *gate, const fs_tensor *y);
void cpu_rope_f64(fs_tensor *x, const fs_tensor *cos, const fs_tensor *sin);
int cpu_attention_f64(fs_tensor *out, fs_tensor *lse, fs_lse_layout layout, const fs_tensor *q, const fs_tensor *k,
                      const fs_tensor *v, double scale, fs_err *e);
void cpu_lse_convert_f64(fs_tensor *dst, fs_lse_layout dl, const fs_tensor *src, fs_lse_layout sl, int64_t B, int64_t H,
                         int64_t S);
void cpu_ring_merge_f64(fs_tensor *out, fs_tensor *lse, const fs_tensor *out_i, const fs_tensor *lse_i);

#endif
