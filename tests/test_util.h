/* test_util.h — helpers shared by the cmocka tests. */
#ifndef FS_TEST_UTIL_H
#define FS_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

/* Where the diffusers reference data lives: $FLUX_REFERENCE_DIR, else ../shared/reference
 * relative to the repo root (tests run from the root). Returns NULL when absent. */
static inline const char *fs_test_reference_dir(void)
{
    const char *env = getenv("FLUX_REFERENCE_DIR");
    const char *dir = env && *env ? env : "../shared/reference";
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return NULL;
    return dir;
}

/* Skip the current test, saying so on stderr in a way nobody can mistake for a pass. */
/* The Python interpreter a test runs for a cross-check: $PYTHON, else the first of `python3` on
 * PATH and /usr/bin/python3 that imports `modules` (e.g. "h5py" or "numpy, h5py"); NULL when none
 * does (the caller skips loudly). The one on PATH may be a pyenv shim without the packages. */
static inline const char *test_python(const char *modules)
{
    static char found[256];
    const char *env = getenv("PYTHON");
    const char *cands[] = {env && *env ? env : NULL, "python3", "/usr/bin/python3"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        if (!cands[i]) continue;
        char cmd[512];
        snprintf(cmd, sizeof cmd, "%s -c 'import %s' >/dev/null 2>&1", cands[i], modules);
        if (system(cmd) == 0) {
            snprintf(found, sizeof found, "%s", cands[i]);
            return found;
        }
    }
    return NULL;
}

#define FS_SKIP_LOUDLY(why)                                                                  \
    do {                                                                                     \
        fprintf(stderr, "\n*** SKIPPED %s: %s — this test did NOT run ***\n\n", __func__, why); \
        skip();                                                                              \
    } while (0)

/* A fresh temporary directory for a test (removed by the OS's tmp cleaning, not by us: a failing
 * test leaves its files for inspection). */
static inline const char *fs_test_tmpdir(char *buf, size_t n)
{
    snprintf(buf, n, "/tmp/fluxsim-test-XXXXXX");
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        abort();
    }
    return buf;
}

#endif
