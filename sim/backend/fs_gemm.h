/* fs_gemm.h — internal to the CPU backend: who does its GEMMs, chosen at run time for the CPU at
 * hand (issue 22). Two providers, each a well-kept library with its own CPUID dispatch:
 * OpenBLAS (the system's, Debian 0.3.21) and oneDNN (libdnnl, Debian 2.6.3).
 *
 * float32 (every float32 nn.Linear and attention's Q·Kᵀ and P·V): fs_sgemm, cblas_sgemm's
 * signature (row-major only). It calls OpenBLAS when OpenBLAS runs kernels for the CPU's widest
 * vector ISA, else oneDNN's dnnl_sgemm. Why not always one of them: OpenBLAS picks its kernels by
 * CPU *model*, and 0.3.21 does not know every current one — on an Intel Xeon of family 6 model
 * 207 (AVX-512 + AVX512-BF16) it falls back to its Prescott (SSE3) kernels, 33 GFLOP/s on one
 * core where its SkylakeX kernels do 156 and oneDNN 150 (docs/performance.md). oneDNN dispatches
 * on CPUID *features*, so it is right on CPUs newer than the library; where OpenBLAS did detect
 * the CPU it is as fast or a few percent faster (AVX2: 80 vs 77 GFLOP/s) and keeps the float32
 * bits that earlier figures were measured with. FS_GEMM_F32=openblas|onednn forces a provider.
 * float64 always goes to OpenBLAS (cblas_dgemm): golden/default-fp64.h5 is compared bit for bit.
 *
 * bfloat16 (the bf16 gemm op, fs_backend.h's contract: bf16 operands, products summed in
 * float32, the bias added in float32, C rounded to bf16 once, RNE): on AMX, oneDNN's bf16 matmul
 * (tdpbf16ps: 10-25x the float32 path there); on AVX512-BF16 without AMX, oneDNN's vdpbf16ps
 * kernel below FS_GEMM_BF16_WIDEN_M rows and above it A and W widened to float32 (exact) and
 * fs_sgemm, 1.55x faster there (121 vs 78 GFLOP/s on the forward's Linear shapes, measured);
 * on CPUs without bf16 instructions always widened. Both satisfy the contract; only the order of
 * the float32 additions differs, and AMX/vdpbf16ps flush subnormal inputs and results (below
 * 2^-126, never reached by FLUX's activations) to zero. FS_GEMM_BF16=onednn|sgemm forces a path.
 * ONEDNN_VERBOSE=1 prints each oneDNN kernel that ran. */
#ifndef FS_GEMM_H
#define FS_GEMM_H

#include <cblas.h>
#include <stdint.h>

#include "fs_common.h"

/* cblas_sgemm, through the provider chosen for this CPU (row-major only; K = 0 and empty
 * shapes as cblas defines them). Thread-safe; inside an OpenMP parallel region it runs on the
 * calling thread. */
void fs_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K, float alpha,
              const float *A, blasint lda, const float *B, blasint ldb, float beta, float *C, blasint ldc);
/* 1 when fs_sgemm calls oneDNN, 0 when OpenBLAS (decided once). */
int fs_gemm_f32_onednn(void);

/* Rows from which a bf16 gemm on AVX512-BF16 without AMX is widened to float32 rather than run
 * on vdpbf16ps (measured on a Xeon of family 6 model 207, 3072 x 3072, 1 thread: oneDNN ahead
 * below 64 rows, even at 64-128, the widened path 1.5-2x ahead from 256). */
#define FS_GEMM_BF16_WIDEN_M 128
/* 1 when fs_gemm_bf16_onednn serves a bf16 gemm of M rows (decided from the ISA and
 * FS_GEMM_BF16 once, then by M); 0 when the widened float32 path (fs_sgemm) does. */
int fs_gemm_bf16_native(int64_t M);
/* The bf16 gemm op through oneDNN's bf16 matmul. Returns FS_OK, or an error (with *e) when
 * oneDNN refuses the shapes or runs out of memory. M, N > 0. */
int fs_gemm_bf16_onednn(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W, int64_t ldw,
                        const void *bias, void *C, int64_t ldc, fs_err *e);
/* One line for benchmark headers: the float32 provider (OpenBLAS's core name, or oneDNN's ISA)
 * and why, and the bf16 path (oneDNN's ISA and the last matmul kernel created, e.g.
 * "brg:avx512_core_amx_bf16"). Static storage. */
const char *fs_gemm_describe(void);

#endif
