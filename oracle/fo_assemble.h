/* fo_assemble.h — per-rank dumps as a set: the rank files of a folder, whether a set is one
 * run's every rank, and `flux-oracle assemble`: one global flux-dump built from them.
 *
 * A per-rank dump (flux-sim --dump-per-rank, the flux_dump Python package) holds its rank's view:
 * /inputs and /final whole, each step dataset as the rank holds it, and a `parallel` attribute
 * with "rank", "world" and the `sharding` map that places every piece (fo_shard.h, fo_piece). */
#ifndef FO_ASSEMBLE_H
#define FO_ASSEMBLE_H

#include "fo_dump.h"

/* DIR/rank_<r>.h5 (r written without leading zeros), sorted by r, into out (malloc'ed paths).
 * Errors: DIR unreadable, no rank file in it, a rank missing between 0 and the largest. */
int fo_rank_dir(const char *dir, fo_names *out, fs_err *e);

/* FS_OK when the files are per-rank dumps (`parallel` with "rank" and "world") of one world
 * holding every rank 0..world-1 exactly once; else FS_E_INPUT naming the missing or repeated
 * rank ("rank 2 of world 4 is missing"). */
int fo_ranks_complete(fo_file **files, int n, fs_err *e);

/* Writes the global dump of per-rank dumps `files` (every rank of one run, complete, one model)
 * to `out`: the root attributes, /inputs and /final from rank 0 (`parallel` without "rank"),
 * every step dataset placed by its sharding map: pieces at their intervals, "replicated" and
 * unmapped datasets once (their copies must be bitwise identical). Refused with one line saying
 * where (FS_E_INPUT): a gap (a global element no rank holds), overlapping pieces or copies that
 * differ, a partial sum (`partial`: not assemblable), pieces of different dtypes. Written to
 * OUT.tmp.PID and renamed: OUT exists only complete; on any failure nothing is left. */
int fo_assemble(fo_file **files, int n, const char *out, fs_err *e);

#endif
