/* fs_gpu_vendor.h — one kernel source, two vendors (the ggml pattern, written small).
 *
 * The GPU backend is written in CUDA C++. Compiled by nvcc it is CUDA; compiled by hipcc with
 * `-x hip` (clang defines __HIP__, hipcc adds __HIP_PLATFORM_AMD__) the names below map the CUDA
 * runtime and warp intrinsics onto HIP. Only what sim/backend/gpu/ uses is mapped; add a line when a
 * kernel needs a new name. cuBLAS exists on CUDA only (Debian 12 has no rocBLAS/hipBLAS):
 * FS_GPU_HAVE_BLAS says whether the GEMM may use it.
 *
 * Kernels are launched with FS_LAUNCH(kernel, grid, block, shmem, stream, args...) rather than
 * <<< >>>, so that one spelling serves both (kernel: a plain name; bind a template instance to a
 * local `auto k = &name<T>;` first). Warp width: gfx90a/gfx908 are wave64, RDNA and NVIDIA are
 * 32 — kernels use warpSize or reduce within sub-groups of at most 32 lanes (width argument). */
#ifndef FS_GPU_VENDOR_H
#define FS_GPU_VENDOR_H

#if defined(__HIP__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_HCC__)
#define FS_GPU_HIP 1
#include <hip/hip_runtime.h>

#define FS_GPU_VENDOR "hip"
#define FS_GPU_VENDOR_UPPER "HIP"
#define FS_GPU_HAVE_BLAS 0

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorMemoryAllocation hipErrorMemoryAllocation
#define cudaMemcpyKind hipMemcpyKind
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaSetDevice hipSetDevice
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceProp hipDeviceProp_t
#define cudaRuntimeGetVersion hipRuntimeGetVersion
#define cudaDriverGetVersion hipDriverGetVersion
#define cudaMemGetInfo hipMemGetInfo
#define cudaStream_t hipStream_t
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpy2DAsync hipMemcpy2DAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocDefault hipHostMallocDefault
#define cudaFreeHost hipHostFree

#ifndef FS_GPU_ARCH_NAME
#define FS_GPU_ARCH_NAME(prop) "%s", (prop).gcnArchName /* format and arguments: "gfx90a:sramecc+:xnack-" */
#endif

/* HIP's shuffles take no mask; the width argument is the same */
#define FS_SHFL_XOR(v, lanemask, width) __shfl_xor((v), (lanemask), (width))
#define FS_LAUNCH(kernel, grid, block, shmem, stream, ...) \
    hipLaunchKernelGGL(kernel, (grid), (block), (shmem), (stream), __VA_ARGS__)

#else /* CUDA */
#include <cuda_runtime.h>

#define FS_GPU_VENDOR "cuda"
#define FS_GPU_VENDOR_UPPER "CUDA"
#define FS_GPU_HAVE_BLAS 1
#ifndef FS_GPU_ARCH_NAME
#define FS_GPU_ARCH_NAME(prop) "sm_%d%d", (prop).major, (prop).minor /* format and arguments */
#endif

/* every lane of the warp takes part in every shuffle (callers keep whole warps converged) */
#define FS_SHFL_XOR(v, lanemask, width) __shfl_xor_sync(0xffffffffu, (v), (lanemask), (width))
#define FS_LAUNCH(kernel, grid, block, shmem, stream, ...) kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#endif

#endif
