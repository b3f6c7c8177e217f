/* libFuzzer harness: the safetensors reader (fs_st_open's header parser and fs_st_decode).
 * The input is the whole file. Invariants: every error is one line; on success every entry's
 * data lies inside the mapping with the byte count its shape and dtype say, entries are sorted
 * and found by name, and decoding the first and last elements in both precisions stays inside. */
#include "fuzz_common.h"

#include "fs_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_as_file(data, size);
    fs_st_file f;
    fs_err e = {0};
    int rc = fs_st_open(&f, path, &e);
    if (rc) {
        fuzz_check_error(rc, &e);
        return 0;
    }
    const unsigned char *lo = f.map, *hi = lo + f.map_len;
    FUZZ_ASSERT(f.map_len == size && f.data_start >= 8 && f.data_start <= f.map_len, "data_start %zu of %zu",
                f.data_start, f.map_len);
    static float f32[4096];
    static double f64[4096];
    for (int i = 0; i < f.n; i++) {
        const fs_st_entry *en = &f.ent[i];
        const unsigned char *p = en->data;
        const int64_t n = fs_st_numel(en);
        const uint64_t bytes = (uint64_t)n * fs_st_dtype_size(en->dtype);
        FUZZ_ASSERT(n >= 0 && en->ndim >= 0 && en->ndim <= FS_MAX_DIMS, "'%s': numel %lld", en->name, (long long)n);
        FUZZ_ASSERT(p >= lo + f.data_start && p <= hi && bytes <= (uint64_t)(hi - p), "'%s' outside the mapping",
                    en->name);
        FUZZ_ASSERT(bytes == en->end - en->begin, "'%s': %llu bytes vs offsets span %llu", en->name,
                    (unsigned long long)bytes, (unsigned long long)(en->end - en->begin));
        FUZZ_ASSERT(fs_st_find(&f, en->name) == en, "'%s' not found by name", en->name);
        if (i) FUZZ_ASSERT(strcmp(f.ent[i - 1].name, en->name) < 0, "entries not sorted/unique at '%s'", en->name);
        const int64_t k = n < 4096 ? n : 4096;
        FUZZ_ASSERT(fs_st_decode(en, 0, k, FS_F32, f32, &e) == 0, "%s", e.msg);
        FUZZ_ASSERT(fs_st_decode(en, n - k, k, FS_F64, f64, &e) == 0, "%s", e.msg);
        /* a range outside the tensor is refused, never read */
        FUZZ_ASSERT(fs_st_decode(en, n - k, k + 1, FS_F32, f32, &e) == FS_E_INTERNAL, "decode past the end accepted");
    }
    FUZZ_ASSERT(!fs_st_find(&f, "\x01no such tensor"), "found a name that is not there");
    fs_st_close(&f);
    return 0;
}
