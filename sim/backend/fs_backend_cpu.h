/* fs_backend_cpu.h — internal: what the strict backend (fs_backend_strict.c) borrows from the CPU
 * backend. Everyone else uses fs_backend.h. */
#ifndef FS_BACKEND_CPU_H
#define FS_BACKEND_CPU_H

#include "fs_backend.h"

/* The CPU backend's table, ops and memory, without the process-wide malloc tuning of
 * fs_backend_cpu(): the strict backend calls these ops with untagged pointers. */
const fs_backend *fs_backend_cpu_kernels(void);

#endif
