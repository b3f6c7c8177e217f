#include "fs_cleanup.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

/* A rank registers its own temporaries, the --dump-per-rank directory and every other rank's
 * per-rank temporary (fs_job): a job of up to ~1000 ranks. 1 MiB of zero pages until used. */
#define MAX_PATHS 1024
#define MAX_LEN 1024

static char paths[MAX_PATHS][MAX_LEN];
static volatile sig_atomic_t used[MAX_PATHS];

int fs_cleanup_add(const char *path)
{
    size_t n = strlen(path);
    if (n >= MAX_LEN) return -1;
    for (int i = 0; i < MAX_PATHS; i++)
        if (!used[i]) {
            memcpy(paths[i], path, n + 1);
            used[i] = 1; /* set after the copy: a handler never sees a half-written path */
            return 0;
        }
    return -1;
}

void fs_cleanup_remove(const char *path)
{
    for (int i = 0; i < MAX_PATHS; i++)
        if (used[i] && !strcmp(paths[i], path)) used[i] = 0;
}

void fs_cleanup_run(void)
{
    /* files first, then directories (--dump-per-rank's), whatever the order they were registered
     * in: unlink refuses a directory (EISDIR); rmdir removes it only once it is empty */
    for (int i = 0; i < MAX_PATHS; i++)
        if (used[i] && unlink(paths[i]) == 0) used[i] = 0;
    for (int i = 0; i < MAX_PATHS; i++)
        if (used[i]) {
            rmdir(paths[i]);
            used[i] = 0;
        }
}
