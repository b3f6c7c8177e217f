/* fs_backends.h — the backends by name (--backend, FLUX_SIM_BACKEND): the registry.
 *
 * It sits above the implementations (fs_backend_cpu.c, fs_backend_strict.c, and in GPU builds
 * gpu/fs_backend_gpu.h, which it includes when compiled with -DFS_WITH_GPU): the interface in
 * fs_backend.h knows none of them by name. Adding a backend: register its name here
 * (docs/design.md, "Adding a backend"). */
#ifndef FS_BACKENDS_H
#define FS_BACKENDS_H

#include "fs_backend.h"

/* Backends by name: "cpu" (default), "cpu-strict" (test tool: memory host code cannot touch),
 * "cuda", "hip" (in GPU builds: `make GPU=cuda|hip`). A name this build or machine cannot serve
 * is an FS_E_INPUT error saying why ("no GPU found: ...", "this build has no CUDA backend"). */
int fs_backend_open(const char *name, fs_backend **be, fs_err *e);
/* Releases a backend from fs_backend_open (the CPU backends are static: no-op). */
void fs_backend_close(fs_backend *be);
/* The names this build knows, comma separated, for --help and messages. */
const char *fs_backend_names(void);

#endif
