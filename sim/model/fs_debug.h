/* fs_debug.h — hooks for gdb (tools/debug/flux-sim.gdb, docs/debugging.md).
 *
 * The forward keeps the module it is in and the step in two globals gdb can print at any stop;
 * fs_debug_print_tensor is meant to be `call`ed from gdb; --wait-for-debugger parks a rank until
 * someone attaches and clears fs_debug_wait. */
#ifndef FS_DEBUG_H
#define FS_DEBUG_H

#include "fs_tensor.h"

extern char fs_debug_module[192]; /* last module the forward recorded (or is recording) */
extern int fs_debug_step;
extern volatile int fs_debug_wait;

/* Prints host and pid and sleeps until a debugger sets fs_debug_wait = 0. */
void fs_debug_wait_for_debugger(int rank);
/* Shape, dtype, min/max/mean/std, NaN/Inf counts and elements [first, first+n) to stdout. */
void fs_debug_print_tensor(const fs_tensor *t, int64_t first, int64_t n);

#endif
