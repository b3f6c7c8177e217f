/* fs_gemm_bf16.h — internal to the CPU backend: the bfloat16 nn.Linear on the CPU's own bf16
 * dot-product instructions, through oneDNN's matmul primitive (libdnnl, Debian's 2.6.3).
 *
 * The op's contract (fs_backend.h, gemm): C[M, N] = A[M, K] · W[N, K]ᵀ (+ bias[N]) with bfloat16
 * operands, the products summed in float32, the bias added in float32 and C rounded to bfloat16
 * once (round to nearest even). oneDNN's bf16 matmul does exactly that on AVX512-BF16
 * (vdpbf16ps) and AMX (tdpbf16ps): each bf16 × bf16 product is exact in float32 and is added to a
 * float32 accumulator; the bias is added to the accumulator, then one conversion to bf16. What
 * differs from the float32-sgemm path (cpu_gemm_bf16_sgemm in fs_backend_cpu.c) is only the
 * order of the float32 additions, and that these instructions treat subnormal inputs and results
 * as zero (DAZ/FTZ: values below 2^-126, never reached by FLUX's activations and weights).
 *
 * Runtime dispatch: oneDNN picks its kernel from CPUID (avx512_core_amx, avx512_core_bf16, ...).
 * This path is taken only when the effective ISA has native bf16 (avx512_core_bf16 or better):
 * on older CPUs oneDNN would emulate bf16 or fall to its reference kernel, and the sgemm path is
 * faster there. FS_GEMM_BF16=sgemm forces the sgemm path, FS_GEMM_BF16=onednn forces oneDNN
 * whatever the ISA (tests, A/B timing); ONEDNN_VERBOSE=1 prints each kernel that ran. */
#ifndef FS_GEMM_BF16_H
#define FS_GEMM_BF16_H

#include <stdint.h>

#include "fs_common.h"

/* 1 when fs_gemm_bf16_onednn serves the bf16 gemm op (decided once, from the ISA and
 * FS_GEMM_BF16); 0 when the sgemm path does. */
int fs_gemm_bf16_native(void);
/* The bf16 gemm op through oneDNN. Returns FS_OK, or an error (with *e) when oneDNN refuses
 * the shapes or runs out of memory. M, N > 0. */
int fs_gemm_bf16_onednn(int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *W, int64_t ldw,
                        const void *bias, void *C, int64_t ldc, fs_err *e);
/* A one-line description of the bf16 gemm path for benchmark headers: the path, the library
 * version, the ISA oneDNN found, and the implementation of the last oneDNN matmul created
 * ("brg:avx512_core_bf16", ...). Static storage. */
const char *fs_gemm_bf16_describe(void);

#endif
