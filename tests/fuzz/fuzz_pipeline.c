/* libFuzzer harness: the pipeline folder's JSON readers (fs_pipeline.c; probe 3 T7, T8, T12).
 * The first input byte picks the reader, the rest is the file:
 *   0: transformer/config.json (fs_pipeline_config_file)
 *   1: scheduler/scheduler_config.json (fs_pipeline_sched_file)
 *   2: model_index.json, through fs_pipeline_resolve of a pipeline folder holding it
 * Invariants: every error is one line with a known code and holds no control character (the
 * strings of the file are escaped); an accepted config passes fs_config_validate; an accepted
 * scheduler config has every value in fs_pipeline.h's ranges and gives finite sigmas and
 * timesteps for grids of 1 to 65536 image tokens. */
#include "fuzz_common.h"

#include <math.h>
#include <sys/stat.h>

#include "fs_pipeline.h"

static char g_dir[64];

static void setup(void)
{
    if (g_dir[0]) return;
    snprintf(g_dir, sizeof g_dir, "/tmp/fuzz_pipeline.XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    char p[160];
    snprintf(p, sizeof p, "%s/transformer", g_dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/scheduler", g_dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/transformer/x.safetensors", g_dir); /* a weights file, never opened here */
    FILE *f = fopen(p, "wb");
    if (f) fclose(f);
}

static void put(const char *rel, const uint8_t *d, size_t n)
{
    char p[160];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    if (n) fwrite(d, 1, n, f);
    fclose(f);
}

static void check_error(int rc, const fs_err *e)
{
    fuzz_check_error(rc, e);
    for (const char *c = e->msg; *c; c++)
        FUZZ_ASSERT((unsigned char)*c >= 0x20 && *c != 0x7f, "control character 0x%02x in '%s'", (unsigned char)*c, e->msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    setup();
    const int which = data[0] % 3;
    data++, size--;
    fs_err e = {0};
    char p[160];
    if (which == 0) {
        put("transformer/config.json", data, size);
        snprintf(p, sizeof p, "%s/transformer/config.json", g_dir);
        fs_config c;
        int rc = fs_pipeline_config_file(&c, p, &e);
        if (rc) check_error(rc, &e);
        else FUZZ_ASSERT(fs_config_validate(&c, "fuzz", &e) == 0, "accepted, then invalid: %s", e.msg);
    } else if (which == 1) {
        put("scheduler/scheduler_config.json", data, size);
        snprintf(p, sizeof p, "%s/scheduler/scheduler_config.json", g_dir);
        fs_sched_config s;
        int rc = fs_pipeline_sched_file(&s, p, &e);
        if (rc) {
            check_error(rc, &e);
        } else {
            FUZZ_ASSERT(s.shift >= FS_SCHED_SHIFT_MIN && s.shift <= FS_SCHED_SHIFT_MAX, "shift %g", s.shift);
            FUZZ_ASSERT(fabs(s.base_shift) <= FS_SCHED_MU_MAX && fabs(s.max_shift) <= FS_SCHED_MU_MAX, "shifts %g %g",
                        s.base_shift, s.max_shift);
            static const int seqs[] = {1, 16, 256, 4096, 65536};
            double sig[9], ts[8];
            for (size_t k = 0; k < sizeof seqs / sizeof *seqs; k++) {
                FUZZ_ASSERT(fs_sched_sigmas(&s, 8, seqs[k], FS_F32, sig, ts, &e) == 0, "%s", e.msg);
                for (int i = 0; i < 8; i++)
                    FUZZ_ASSERT(isfinite(sig[i]) && isfinite(ts[i]), "sigma %d = %g at %d tokens (dyn %d shift %g base %g "
                                "max %g lens %d %d)", i, sig[i], seqs[k], s.use_dynamic_shifting, s.shift, s.base_shift,
                                s.max_shift, s.base_image_seq_len, s.max_image_seq_len);
            }
        }
    } else {
        put("model_index.json", data, size);
        fs_pipeline pl;
        int rc = fs_pipeline_resolve(&pl, g_dir, &e);
        if (rc) check_error(rc, &e);
        else fs_pipeline_free(&pl);
    }
    return 0;
}
