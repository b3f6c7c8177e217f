/* libFuzzer harness: the config reader (config.json files and a dump's `config` attribute).
 * Invariants: every error is one line; an accepted config passes fs_config_validate, survives
 * fs_config_to_json -> fs_config_from_json unchanged, has a parameter list whose element count
 * is fs_config_num_params, and the file reader agrees with the string reader. */
#include "fuzz_common.h"

#include "fs_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_as_string(data, size);
    fs_config c, d;
    fs_err e = {0};
    int rc = fs_config_from_json(&c, text, "fuzz.json", &e);
    if (rc) {
        fuzz_check_error(rc, &e);
    } else {
        FUZZ_ASSERT(fs_config_validate(&c, "fuzz.json", &e) == 0, "accepted, then invalid: %s", e.msg);
        char *js = fs_config_to_json(&c);
        FUZZ_ASSERT(js, "to_json failed");
        FUZZ_ASSERT(fs_config_from_json(&d, js, "round trip", &e) == 0, "%s: %s", js, e.msg);
        FUZZ_ASSERT(!memcmp(&c, &d, sizeof c), "round trip changed the config: %s", js);
        free(js);
        /* the list for small models only: 2048 blocks would make each input take 10 ms */
        if (c.num_layers + c.num_single_layers <= 64) {
            int n;
            fs_param_desc *pd = fs_config_params(&c, &n);
            FUZZ_ASSERT(pd, "out of memory");
            int64_t total = 0;
            for (int i = 0; i < n; i++) total += pd[i].shape[0] * (pd[i].ndim == 2 ? pd[i].shape[1] : 1);
            FUZZ_ASSERT(total == fs_config_num_params(&c), "list %lld vs closed form %lld", (long long)total,
                        (long long)fs_config_num_params(&c));
            free(pd);
        }
    }
    /* from a file: the same verdict, unless the bytes hold a NUL (the string reader stops there,
     * the file reader refuses) and are within the file reader's 1 MiB */
    if (!memchr(data, 0, size) && size <= (1 << 20)) {
        int rc2 = fs_config_from_file(&d, fuzz_as_file(data, size), &e);
        FUZZ_ASSERT(rc2 == rc, "string rc %d, file rc %d (%s)", rc, rc2, e.msg);
        if (!rc) FUZZ_ASSERT(!memcmp(&c, &d, sizeof c), "file and string readers disagree");
    }
    free(text);
    return 0;
}
