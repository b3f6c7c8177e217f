/* fs_h5err.h — HDF5's reason for a failure, as one clean line.
 *
 * Both the dump writer (sim/run/fs_dump.c) and the reader (oracle/fo_dump.c) end their one-line
 * errors with HDF5's cause. HDF5's own descriptions are not fit for that: some span two lines,
 * carry heap pointers ("buf = 0x7ffd...") and run to a kilobyte. This is the one place that
 * turns them into a line a user can read. */
#ifndef FS_H5ERR_H
#define FS_H5ERR_H

#include <stddef.h>

/* The innermost description on HDF5's default error stack, cleaned: control characters become
 * spaces, runs of spaces collapse, "key = 0x..." pointer fields are dropped, and a long
 * "what failed: k = v, ..., error message = 'why', ..." description is reduced to
 * "what failed: why". Cut at a word boundary (marked "...") to fit `n`. "HDF5 error" when the
 * stack is empty. Returns buf. */
const char *fs_h5_cause(char *buf, size_t n);

/* The cleaning alone, on any text (exposed for tests): `in` -> buf as above. */
const char *fs_h5_clean(const char *in, char *buf, size_t n);

#endif
