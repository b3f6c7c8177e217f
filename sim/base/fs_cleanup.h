/* fs_cleanup.h — files to delete when the process dies before it could tidy up.
 *
 * A dump is written under a temporary name and renamed into place only when complete, so a
 * crash never leaves a complete-looking file; but the temporary itself (up to GBs) would stay.
 * Writers register their temporaries here; the CLI runs fs_cleanup_run() from its signal
 * handlers (SIGTERM/SIGINT/SIGHUP: what mpirun sends the ranks when a job is aborted or
 * interrupted) and before it ends a job with MPI_Abort. fs_cleanup_run is async-signal-safe
 * (unlink(2) and rmdir(2) only, no allocation): the registry is a fixed table. A directory
 * is removed after every file, if it is empty then.
 *
 * What no handler can catch (SIGKILL, a power loss) leaves the temporary: its name carries the
 * writer's pid and host (fs_dump.h), so the next run writing the same path, or `flux-sim --clean
 * PATH`, removes it once that process is gone (fs_dump_remove_stale). */
#ifndef FS_CLEANUP_H
#define FS_CLEANUP_H

/* Registers `path` (copied). 0 on success, -1 if the table is full or the path too long. */
int fs_cleanup_add(const char *path);
/* Forgets `path` (it was renamed into place or deleted by its owner). */
void fs_cleanup_remove(const char *path);
/* Deletes every registered path and forgets them. Async-signal-safe. */
void fs_cleanup_run(void);

#endif
