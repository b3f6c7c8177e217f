/* fs_backends.c — backends by name (--backend): fs_backends.h. Compiled with the GPU defines
 * (-DFS_WITH_GPU, -DFS_GPU_HIP) in GPU builds. */
#include "fs_backends.h"

#include <string.h>

#ifdef FS_WITH_GPU
#include "gpu/fs_backend_gpu.h"
#endif

const char *fs_backend_names(void)
{
#ifdef FS_WITH_GPU
    return "cpu, cpu-strict, " FS_GPU_BACKEND_NAMES;
#else
    return "cpu, cpu-strict";
#endif
}

int fs_backend_open(const char *name, fs_backend **be, fs_err *e)
{
    *be = NULL;
    if (!name || !strcmp(name, "cpu")) {
        *be = fs_backend_cpu();
        return FS_OK;
    }
    if (!strcmp(name, "cpu-strict")) {
        *be = fs_backend_cpu_strict();
        return FS_OK;
    }
    if (!strcmp(name, "cuda") || !strcmp(name, "hip")) {
#ifdef FS_WITH_GPU
        return fs_backend_gpu_open(name, be, e);
#else
        return fs_errf(e, FS_E_INPUT, "--backend %s: this build has no GPU backend (build with make GPU=cuda or GPU=hip; "
                                      "docs/gpu.md)", name);
#endif
    }
    return fs_errf(e, FS_E_INPUT, "--backend: unknown backend '%s' (this build knows: %s)", name, fs_backend_names());
}

void fs_backend_close(fs_backend *be)
{
#ifdef FS_WITH_GPU
    if (be && be != fs_backend_cpu() && be != fs_backend_cpu_strict()) fs_backend_gpu_close(be);
#else
    (void)be;
#endif
}
