/* libFuzzer harness: the *.safetensors.index.json reader (fs_st_archive_open on an index; probe
 * 3 T3, T4, T20). The input is written as DIR/m.safetensors.index.json, where DIR holds two small
 * valid shards made once: a.safetensors (tensors "a", "b") and b.safetensors ("c"), plus
 * sub/c.safetensors ("d"). Invariants: every error is one line with a known code; an accepted
 * index opened only files inside DIR, every tensor of the archive is found by name, the names
 * are sorted and unique, and each entry's file is one of the archive's. */
#include "fuzz_common.h"

#include <limits.h>
#include <sys/stat.h>

#include "fs_safetensors.h"

static char g_dir[64], g_index[128];

static void write_shard(const char *name, const char *hdr_json, size_t data_len)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    size_t hl = strlen(hdr_json);
    uint64_t h = (hl + 7) / 8 * 8;
    fwrite(&h, 8, 1, f);
    fwrite(hdr_json, 1, hl, f);
    for (size_t i = hl; i < h; i++) fputc(' ', f);
    for (size_t i = 0; i < data_len; i++) fputc(0, f);
    fclose(f);
}

static void setup(void)
{
    if (g_dir[0]) return;
    snprintf(g_dir, sizeof g_dir, "/tmp/fuzz_index.XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    char sub[128];
    snprintf(sub, sizeof sub, "%s/sub", g_dir);
    mkdir(sub, 0755);
    write_shard("a.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                 "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}", 16);
    write_shard("b.safetensors", "{\"c\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2);
    write_shard("sub/c.safetensors", "{\"d\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}", 8);
    snprintf(g_index, sizeof g_index, "%s/m.safetensors.index.json", g_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    FILE *f = fopen(g_index, "wb");
    if (!f) abort();
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    fs_st_archive a;
    fs_err e = {0};
    int rc = fs_st_archive_open(&a, g_index, &e);
    if (rc) {
        fuzz_check_error(rc, &e);
        return 0;
    }
    char rdir[PATH_MAX];
    FUZZ_ASSERT(realpath(g_dir, rdir), "realpath");
    for (int i = 0; i < a.nfiles; i++) {
        char rp[PATH_MAX];
        FUZZ_ASSERT(realpath(a.files[i].path, rp), "shard %s vanished", a.files[i].path);
        FUZZ_ASSERT(!strncmp(rp, rdir, strlen(rdir)) && rp[strlen(rdir)] == '/', "opened %s outside %s", rp, rdir);
    }
    for (int i = 0; i < a.n; i++) {
        FUZZ_ASSERT(fs_st_archive_find(&a, a.idx[i]->name) == a.idx[i], "'%s' not found by name", a.idx[i]->name);
        FUZZ_ASSERT(i == 0 || strcmp(a.idx[i - 1]->name, a.idx[i]->name) < 0, "names not sorted/unique");
        FUZZ_ASSERT(a.idx[i]->file >= 0 && a.idx[i]->file < a.nfiles, "entry file %d of %d", a.idx[i]->file, a.nfiles);
        /* the bytes read through pread equal the mapping's */
        const fs_st_entry *en = a.idx[i];
        unsigned char buf[16];
        size_t nb = en->end - en->begin;
        FUZZ_ASSERT(nb <= sizeof buf, "size %zu", nb);
        FUZZ_ASSERT(fs_st_pread(&a.files[en->file], en, 0, nb, buf, &e) == 0, "%s", e.msg);
        FUZZ_ASSERT(!memcmp(buf, en->data, nb), "pread and mapping differ for '%s'", en->name);
    }
    fs_st_archive_close(&a);
    return 0;
}
