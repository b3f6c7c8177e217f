/* fuzz_dump.c — libFuzzer harness for the dump reader's text parsers (tests/fuzz/README.md).
 *
 * The first input byte picks a target, the rest is its input:
 *   0  fo_steps_parse ("all", "0,2-5": recorded_steps and --steps); invariant: printing the set
 *      and parsing it again gives the same set
 *   1  fo_config_check / fo_config_compare (a dump's `config` JSON; two configs split at the
 *      first 0x01 byte); invariants: a valid config equals itself, equality is symmetric
 *   2  fo_shard_parse + fo_shard_owner (the `parallel` attribute's sharding map), for tensors of
 *      a few shapes taken from the input, every element's owner queried
 *   3  fo_modules_promise (a step's recorded_modules against a dataset name, split at 0x01)
 *   4  fs_h5_clean (HDF5 error text -> one line); invariant: the result fits, has no control
 *      character and no "0x" pointer field
 *   5  a whole dump: the bytes written to a temporary file and read the way flux-oracle reads
 *      (open, completeness, every group's `order`, every dataset streamed). Off unless
 *      FUZZ_DUMP_FILES=1: libhdf5 1.10 itself crashes on some damaged files (probe defect 6,
 *      handled in flux-oracle by its crash guard), which would bury the project's own findings.
 * Only project headers; no main(): link with -fsanitize=fuzzer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fo_config.h"
#include "fo_dump.h"
#include "fo_shard.h"
#include "fo_steps.h"
#include "fo_walk.h"
#include "fs_h5err.h"

#define CHECK(c)                                                                   \
    do {                                                                           \
        if (!(c)) {                                                                \
            fprintf(stderr, "fuzz_dump: invariant failed: %s (%s:%d)\n", #c, __FILE__, __LINE__); \
            abort();                                                               \
        }                                                                          \
    } while (0)

static void fuzz_steps(const char *t)
{
    fo_steps a = {0}, b = {0};
    char why[256], txt[1 << 16];
    if (fo_steps_parse(t, &a, why, sizeof why)) {
        CHECK(a.n == 0 && a.v == NULL && why[0]);
        return;
    }
    for (int i = 1; i < a.n; i++) CHECK(a.v[i - 1] < a.v[i]);
    fo_steps_str(&a, txt, sizeof txt);
    if (strlen(txt) + 1 < sizeof txt) { /* not cut: must read back as the same set */
        CHECK(fo_steps_parse(txt, &b, why, sizeof why) == 0);
        CHECK(a.all == b.all && a.n == b.n);
        for (int i = 0; i < a.n; i++) CHECK(a.v[i] == b.v[i] && fo_steps_has(&b, a.v[i]));
    }
    fo_steps_has(&a, -1);
    fo_steps_free(&a);
    fo_steps_free(&b);
}

static void fuzz_config(char *t)
{
    char *b = strchr(t, '\x01');
    if (b) *b++ = 0;
    fs_err e;
    int same = 0, same2 = 0;
    char why[600];
    if (fo_config_check(t, "a.h5", &e) == FS_OK) {
        CHECK(fo_config_compare(t, "a.h5", t, "a.h5", &same, why, sizeof why, &e) == FS_OK && same);
    } else {
        CHECK(e.code == FS_E_INPUT && !strchr(e.msg, '\n'));
    }
    if (b) {
        int r1 = fo_config_compare(t, "a.h5", b, "b.h5", &same, why, sizeof why, &e);
        int r2 = fo_config_compare(b, "b.h5", t, "a.h5", &same2, why, sizeof why, &e);
        CHECK((r1 == FS_OK) == (r2 == FS_OK));
        if (r1 == FS_OK) CHECK(same == same2);
    }
}

static void fuzz_shard(const uint8_t *d, size_t n, const char *t)
{
    static const char *const names[] = {"x", "transformer_blocks.0.attn.to_q", "r", "joint", "two", ""};
    int ndim = n > 0 ? d[0] % 5 : 1;
    int64_t shape[FO_SHARD_MAX_DIMS];
    for (int i = 0; i < ndim; i++) shape[i] = n > (size_t)i + 1 ? d[i + 1] % 7 : 3;
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        fo_shard s;
        int found = 0;
        fs_err e;
        if (fo_shard_parse(t, names[k], ndim, shape, &s, &found, "f.h5", &e)) {
            CHECK(!found && s.naxes == 0 && !strchr(e.msg, '\n'));
            continue;
        }
        if (found) { /* every element of the tensor has a well-defined owner mask */
            int64_t total = 1, co[FO_SHARD_MAX_DIMS] = {0};
            for (int i = 0; i < ndim; i++) total *= shape[i];
            for (int64_t f = 0; f < total; f++) {
                int64_t r = f;
                for (int i = ndim - 1; i >= 0; i--) co[i] = r % shape[i], r /= shape[i];
                fo_shard_owner(&s, ndim, co);
            }
        }
        fo_shard_free(&s);
    }
    fo_parallel_rank(t);
}

static void fuzz_modules(char *t)
{
    char *name = strchr(t, '\x01');
    if (name) *name++ = 0;
    int p = fo_modules_promise(t, name ? name : "transformer_blocks.0#1");
    CHECK(p == -1 || p == 0 || p == 1);
    CHECK(fo_modules_promise(NULL, t) == 1);
}

static void fuzz_clean(const uint8_t *d, size_t n, const char *t)
{
    char out[300];
    size_t cap = n ? 1 + d[0] % sizeof out : sizeof out;
    fs_h5_clean(t, out, cap);
    CHECK(strlen(out) < cap);
    for (const char *p = out; *p; p++) CHECK((unsigned char)*p >= 0x20 && *p != 0x7f);
    CHECK(!strstr(out, "= 0x"));
}

static void fuzz_file(const uint8_t *d, size_t n)
{
    static int enabled = -1;
    if (enabled < 0) enabled = getenv("FUZZ_DUMP_FILES") && !strcmp(getenv("FUZZ_DUMP_FILES"), "1");
    if (!enabled) return;
    char path[] = "/tmp/fuzz_dump_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    if (write(fd, d, n) != (ssize_t)n) {
        close(fd);
        unlink(path);
        return;
    }
    close(fd);
    fo_file *f = NULL;
    fs_err e;
    if (fo_file_open(&f, path, &e) == FS_OK) {
        fo_completeness c;
        fo_file_completeness(f, &c, &e);
        fo_walk_group *g = NULL;
        int ng = 0;
        if (!fo_walk_groups(f, NULL, &g, &ng)) {
            fo_names names = {0};
            for (int i = 0; i < ng; i++) {
                char gp[64];
                int present;
                if (fo_walk_names(f, &g[i], gp, sizeof gp, &names, &present, &e)) continue;
                for (int k = 0; k < names.n; k++) {
                    char p[1100];
                    snprintf(p, sizeof p, "%s/%s", gp, names.v[k]);
                    fo_stream *s = NULL;
                    if (fo_stream_open(f, p, 64, &s, NULL, &e)) continue;
                    for (int blocks = 0; blocks < 1000; blocks++) {
                        fo_view v;
                        int64_t off, cnt;
                        if (fo_stream_view(s, &v, &off, &cnt, &e) || !cnt) break;
                    }
                    fo_stream_close(s);
                }
            }
            fo_names_free(&names);
            free(g);
        }
        fo_file_close(f);
    }
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1 << 20)) return 0;
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    char *t = malloc(n + 1); /* the parsers take C strings */
    if (!t) return 0;
    memcpy(t, d, n);
    t[n] = 0;
    switch (data[0] % 6) {
    case 0: fuzz_steps(t); break;
    case 1: fuzz_config(t); break;
    case 2: fuzz_shard(d, n, t); break;
    case 3: fuzz_modules(t); break;
    case 4: fuzz_clean(d, n, t); break;
    case 5: fuzz_file(d, n); break;
    }
    free(t);
    return 0;
}
