/* fs_backend_gpu.h — the GPU backend (CUDA or HIP, one source: the .cu files of sim/backend/gpu/), seen from C.
 *
 * Built only with `make GPU=cuda` or `make GPU=hip` (docs/gpu.md); the registry,
 * sim/backend/fs_backends.c, includes this header when compiled with -DFS_WITH_GPU (and
 * -DFS_GPU_HIP for the HIP build) and hands the names "cuda" / "hip" to fs_backend_gpu_open. */
#ifndef FS_BACKEND_GPU_H
#define FS_BACKEND_GPU_H

#include "../fs_backend.h"

#ifdef FS_GPU_HIP
#define FS_GPU_BACKEND_NAMES "hip"
#else
#define FS_GPU_BACKEND_NAMES "cuda"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Opens the GPU backend `name` ("cuda" in a CUDA build, "hip" in a HIP build) on device
 * local_rank % device_count, where local_rank comes from OMPI_COMM_WORLD_LOCAL_RANK (or
 * MPI_LOCALRANKID, SLURM_LOCALID; 0 without them): several ranks may share one GPU. Its own
 * stream, a caching allocator, cuBLAS on CUDA. LSE layout: FS_LSE_BHS on CUDA, FS_LSE_BSH on
 * HIP (the vendors' flash kernels); the caller may change be->lse_layout afterwards.
 * Environment: FLUX_SIM_GPU_GEMM=cublas|tiled (CUDA default cublas; HIP has tiled only),
 * FLUX_SIM_GPU_SYNC=1 (synchronise after every op: errors name the op that faulted),
 * FLUX_SIM_GPU_CACHE=0 (cudaMalloc/cudaFree every tensor, for compute-sanitizer).
 * Without a device or driver: FS_E_INPUT and one line naming the runtime's answer, e.g.
 * "--backend cuda: no CUDA device: cudaGetDeviceCount returned 35 (cudaErrorInsufficientDriver: ...)". */
int fs_backend_gpu_open(const char *name, fs_backend **be, fs_err *e);
/* Waits for the stream, frees every cached block and the backend itself. NULL is a no-op. */
void fs_backend_gpu_close(fs_backend *be);
/* One line for logs: device, architecture, memory, rank-local device index, GEMM path, LSE
 * layout. */
const char *fs_backend_gpu_describe(const fs_backend *be, char *buf, size_t n);
/* Device name (as the runtime reports it), or "" when be is not a GPU backend. */
const char *fs_backend_gpu_device_name(const fs_backend *be);

#ifdef __cplusplus
}
#endif

#endif
