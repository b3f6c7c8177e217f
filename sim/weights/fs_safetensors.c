#include "fs_safetensors.h"

#include "fs_cleanup.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fs_safetensors.c reads little-endian data in place; a big-endian host needs byte swapping here"
#endif

/* The safetensors reference implementation refuses headers above 100 MB; so do we, so that a
 * corrupted length cannot make cJSON chew through a multi-GB mapping. */
#define FS_ST_MAX_HEADER (100u * 1000u * 1000u)
/* Largest integer a JSON number (a double in cJSON) holds exactly. */
#define FS_ST_MAX_JSON_INT 9007199254740992.0

static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {
    [FS_ST_F32] = {"F32", 4},
    [FS_ST_F64] = {"F64", 8},
    [FS_ST_BF16] = {"BF16", 2},
    [FS_ST_F16] = {"F16", 2},
};

const char *fs_st_dtype_name(fs_st_dtype dt) { return st_dtypes[dt].name; }
size_t fs_st_dtype_size(fs_st_dtype dt) { return st_dtypes[dt].size; }

int64_t fs_st_numel(const fs_st_entry *en)
{
    int64_t n = 1;
    for (int i = 0; i < en->ndim; i++) n *= en->shape[i];
    return n;
}

static const char *shape_str(const int64_t *shape, int ndim, char *buf, size_t n)
{
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

/* A short, printable excerpt of arbitrary bytes for "malformed JSON near '...'" messages: the
 * header of a damaged file may hold binary garbage that must not end up on a terminal. */
static const char *excerpt(const char *p, const char *end, char *buf, size_t n)
{
    size_t o = 0;
    for (; p < end && o + 1 < n && o < 24; p++) buf[o++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
    buf[o] = 0;
    return buf;
}

/* Names and dtypes come from the file and end up in error messages, which must stay one line:
 * a name with a newline or an escape sequence (found by tests/fuzz/fuzz_safetensors.c) is refused
 * where it is read, and printed through excerpt() when it is. */
static int has_control_char(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return 1;
    return 0;
}

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp(((const fs_st_entry *)a)->name, ((const fs_st_entry *)b)->name);
}

static int cmp_entry_ptr_name(const void *a, const void *b)
{
    return strcmp((*(const fs_st_entry *const *)a)->name, (*(const fs_st_entry *const *)b)->name);
}

static int cmp_entry_ptr_offset(const void *a, const void *b)
{
    const fs_st_entry *x = *(const fs_st_entry *const *)a, *y = *(const fs_st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* A JSON number that is a non-negative integer exactly representable in a double. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0) || d > FS_ST_MAX_JSON_INT || d != floor(d)) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* Validates one header member and fills *en (name already set). data_len: bytes after the header. */
static int parse_entry(const char *path, const cJSON *it, fs_st_entry *en, uint64_t data_len, fs_err *e)
{
    const char *nm = en->name;
    if (!cJSON_IsObject(it))
        return fs_errf(e, FS_E_INPUT, "%s: tensor '%s': header entry is not a JSON object", path, nm);

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    if (!dt) return fs_errf(e, FS_E_INPUT, "%s: tensor '%s': no dtype in header entry", path, nm);
    if (!cJSON_IsString(dt))
        return fs_errf(e, FS_E_INPUT, "%s: tensor '%s': dtype is not a string", path, nm);
    int found = 0;
    for (size_t k = 0; k < FS_ARRAY_LEN(st_dtypes); k++)
        if (!strcmp(dt->valuestring, st_dtypes[k].name)) {
            en->dtype = (fs_st_dtype)k;
            found = 1;
        }
    if (!found) {
        char xb[32];
        return fs_errf(e, FS_E_INPUT, "%s: tensor '%s': unsupported dtype '%s' (flux-sim reads F32, F64, BF16, F16)",
                       path, nm, excerpt(dt->valuestring, dt->valuestring + strlen(dt->valuestring), xb, sizeof xb));
    }

    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    if (!sh) return fs_errf(e, FS_E_INPUT, "%s: tensor '%s': no shape in header entry", path, nm);
    if (!cJSON_IsArray(sh)) return fs_errf(e, FS_E_INPUT, "%s: tensor '%s': shape is not an array", path, nm);
    int nd = cJSON_GetArraySize(sh);
    if (nd > FS_MAX_DIMS)
        return fs_errf(e, FS_E_INPUT, "%s: tensor '%s': shape has %d dimensions, flux-sim supports at most %d", path,
                       nm, nd, FS_MAX_DIMS);
    en->ndim = nd;
    /* numel * elemsize without wrapping: a crafted shape must not multiply around to match a
     * small data_offsets span. */
    uint64_t nbytes = st_dtypes[en->dtype].size;
    for (int d = 0; d < nd; d++) {
        uint64_t v;
        if (!json_uint(cJSON_GetArrayItem(sh, d), &v))
            return fs_errf(e, FS_E_INPUT, "%s: tensor '%s': shape[%d] is not a non-negative integer", path, nm, d);
        en->shape[d] = (int64_t)v;
        if (v && nbytes > UINT64_MAX / v)
            return fs_errf(e, FS_E_INPUT, "%s: tensor '%s': shape overflows 64-bit byte count", path, nm);
        nbytes *= v;
    }

    const cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!off) return fs_errf(e, FS_E_INPUT, "%s: tensor '%s': no data_offsets in header entry", path, nm);
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_uint(cJSON_GetArrayItem(off, 0), &en->begin) ||
        !json_uint(cJSON_GetArrayItem(off, 1), &en->end))
        return fs_errf(e, FS_E_INPUT, "%s: tensor '%s': data_offsets is not [begin, end] of non-negative integers",
                       path, nm);
    if (en->end < en->begin)
        return fs_errf(e, FS_E_INPUT, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", path, nm,
                       (unsigned long long)en->begin, (unsigned long long)en->end);
    char sb[96];
    if (en->end - en->begin != nbytes)
        return fs_errf(e, FS_E_INPUT,
                       "%s: tensor '%s': shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] span %llu",
                       path, nm, shape_str(en->shape, nd, sb, sizeof sb), st_dtypes[en->dtype].name,
                       (unsigned long long)nbytes, (unsigned long long)en->begin, (unsigned long long)en->end,
                       (unsigned long long)(en->end - en->begin));
    if (en->end > data_len)
        return fs_errf(e, FS_E_INPUT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the data region (%llu bytes; "
                       "truncated file?)",
                       path, nm, (unsigned long long)en->begin, (unsigned long long)en->end,
                       (unsigned long long)data_len);
    return FS_OK;
}

/* Parses and validates the header js[0, hlen) of file f (f->map, f->map_len set; the header was
 * read with pread, not through the mapping, and its length checked against the file size). */
static int parse_header(fs_st_file *f, const char *js, uint64_t hlen, fs_err *e)
{
    const char *path = f->path;
    const unsigned char *m = f->map;
    f->data_start = 8 + (size_t)hlen;
    const uint64_t data_len = f->map_len - f->data_start;
    const char *jend = js + hlen, *stop = NULL;
    char xb[32];

    /* WithLength: the header is not NUL-terminated (binary data follows it). */
    cJSON *root = cJSON_ParseWithLengthOpts(js, (size_t)hlen, &stop, 0);
    if (!root) {
        const char *at = stop && stop >= js && stop <= jend ? stop : js;
        while (at > js && at >= jend) at--; /* cJSON points one past the end on truncated input */
        return fs_errf(e, FS_E_INPUT, "%s: malformed JSON header at byte %zu of %llu: '%s'", path,
                       (size_t)(at - js) + 8, (unsigned long long)hlen + 8, excerpt(at, jend, xb, sizeof xb));
    }
    int rc = FS_OK;
    /* The writer pads the header with spaces to an 8-byte boundary; anything else after the
     * JSON value means the length is wrong or the header is damaged. */
    for (const char *p = stop; p && p < jend; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            rc = fs_errf(e, FS_E_INPUT, "%s: malformed JSON header: trailing bytes after the JSON value at byte %zu: "
                                        "'%s'", path, (size_t)(p - js) + 8, excerpt(p, jend, xb, sizeof xb));
            goto out;
        }
    if (!cJSON_IsObject(root)) {
        rc = fs_errf(e, FS_E_INPUT, "%s: header is not a JSON object", path);
        goto out;
    }

    int cap = cJSON_GetArraySize(root);
    f->ent = calloc(cap ? (size_t)cap : 1, sizeof *f->ent);
    if (!f->ent) {
        rc = fs_errf(e, FS_E_NOMEM, "%s: out of memory for %d header entries", path, cap);
        goto out;
    }
    for (const cJSON *it = root->child; it; it = it->next) {
        if (!it->string) continue; /* cannot happen for an object member */
        if (!strcmp(it->string, "__metadata__")) continue; /* free-form string map; not ours */
        if (has_control_char(it->string)) {
            char xb[32];
            rc = fs_errf(e, FS_E_INPUT, "%s: tensor name '%s' holds control characters", path,
                         excerpt(it->string, it->string + strlen(it->string), xb, sizeof xb));
            goto out;
        }
        fs_st_entry *en = &f->ent[f->n];
        if (!(en->name = strdup(it->string))) {
            rc = fs_errf(e, FS_E_NOMEM, "%s: out of memory", path);
            goto out;
        }
        f->n++;
        if ((rc = parse_entry(path, it, en, data_len, e))) goto out;
        en->data = m + f->data_start + en->begin;
    }

    qsort(f->ent, (size_t)f->n, sizeof *f->ent, cmp_entry_name);
    for (int i = 1; i < f->n; i++)
        if (!strcmp(f->ent[i - 1].name, f->ent[i].name)) {
            rc = fs_errf(e, FS_E_INPUT, "%s: tensor '%s' appears twice in the header", path, f->ent[i].name);
            goto out;
        }

    /* Overlap: sort the non-empty byte ranges by start; each must begin at or after the end of
     * the previous one. (A zero-byte tensor occupies nothing, wherever its offsets point.) */
    const fs_st_entry **by_off = malloc((f->n ? (size_t)f->n : 1) * sizeof *by_off);
    if (!by_off) {
        rc = fs_errf(e, FS_E_NOMEM, "%s: out of memory", path);
        goto out;
    }
    int m_ = 0;
    for (int i = 0; i < f->n; i++)
        if (f->ent[i].end > f->ent[i].begin) by_off[m_++] = &f->ent[i];
    qsort(by_off, (size_t)m_, sizeof *by_off, cmp_entry_ptr_offset);
    for (int i = 1; i < m_; i++)
        if (by_off[i]->begin < by_off[i - 1]->end) {
            rc = fs_errf(e, FS_E_INPUT, "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap in the data region",
                         path, by_off[i - 1]->name, (unsigned long long)by_off[i - 1]->begin,
                         (unsigned long long)by_off[i - 1]->end, by_off[i]->name,
                         (unsigned long long)by_off[i]->begin, (unsigned long long)by_off[i]->end);
            break;
        }
    free(by_off);
out:
    cJSON_Delete(root);
    return rc;
}

/* ---- the SIGBUS guard of the mappings (fs_safetensors.h: why a handler, and why it exits) ---- */

#define GUARD_MAX 4096 /* mappings watched at once: FLUX.1-dev has 3 shards; 1-tensor shards ~1200 */
static struct guard_slot {
    uintptr_t lo; /* published last (release store); 0 free, 1 being filled */
    size_t len, data_start, want;
    int fd, n;
    const char *path;
    const fs_st_entry *ent;
} g_slots[GUARD_MAX];
static int g_nslots;                /* slots ever used (high-water mark) */
static struct sigaction g_old_bus;  /* the handler before ours (Open MPI's backtrace printer) */
static int g_installed;
static char g_who[96];              /* "flux-sim: error: " / "flux-sim: error on rank 1: " */

static size_t put(char *m, size_t o, size_t cap, const char *s, size_t max)
{
    for (size_t i = 0; s[i] && i < max && o + 1 < cap; i++)
        m[o++] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
    m[o] = 0;
    return o;
}

static size_t put_u64(char *m, size_t o, size_t cap, uint64_t v)
{
    char d[24];
    int i = (int)sizeof d - 1;
    d[i] = 0;
    do d[--i] = (char)('0' + v % 10), v /= 10;
    while (v && i > 0);
    return put(m, o, cap, d + i, sizeof d);
}

/* Async-signal-safe: reads the fixed table, fstat, write, unlink (fs_cleanup_run), _exit. */
static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    const uintptr_t a = (uintptr_t)si->si_addr;
    const int n = __atomic_load_n(&g_nslots, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        const struct guard_slot *g = &g_slots[i];
        const uintptr_t lo = __atomic_load_n(&g->lo, __ATOMIC_ACQUIRE);
        if (lo <= 1 || a < lo || a - lo >= g->len) continue;
        const uint64_t off = a - lo;
        const char *tensor = NULL;
        for (int k = 0; k < g->n && !tensor; k++)
            if (off >= g->data_start + g->ent[k].begin && off < g->data_start + g->ent[k].end) tensor = g->ent[k].name;
        struct stat st;
        const int have = fstat(g->fd, &st) == 0;
        char m[1024];
        size_t o = put(m, 0, sizeof m, g_who, sizeof g_who);
        o = put(m, o, sizeof m, g->path, 400);
        if (tensor) {
            o = put(m, o, sizeof m, ": tensor '", 16);
            o = put(m, o, sizeof m, tensor, 200);
            o = put(m, o, sizeof m, "'", 2);
        }
        o = put(m, o, sizeof m, ": byte ", 8);
        o = put_u64(m, o, sizeof m, off);
        o = put(m, o, sizeof m, " cannot be read any more (SIGBUS): the file ", 64);
        if (have) {
            o = put(m, o, sizeof m, "is now ", 8);
            o = put_u64(m, o, sizeof m, (uint64_t)st.st_size);
            o = put(m, o, sizeof m, " bytes, ", 8);
            o = put_u64(m, o, sizeof m, g->want);
            o = put(m, o, sizeof m, " when it was opened", 24);
        } else {
            o = put(m, o, sizeof m, "shrank", 8);
        }
        o = put(m, o, sizeof m, " (truncated or rewritten while the run used it)", 64);
        if (o + 1 < sizeof m) m[o++] = '\n';
        fs_cleanup_run();
        ssize_t w = write(STDERR_FILENO, m, o);
        (void)w;
        _exit(2);
    }
    /* not a checkpoint's page: whoever handled SIGBUS before us, or the default action */
    if (g_old_bus.sa_flags & SA_SIGINFO) {
        if (g_old_bus.sa_sigaction) {
            g_old_bus.sa_sigaction(sig, si, uc);
            return;
        }
    } else if (g_old_bus.sa_handler != SIG_DFL && g_old_bus.sa_handler != SIG_IGN) {
        g_old_bus.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL); /* returning re-executes the access: it faults again and kills */
}

static void guard_install(void)
{
    if (g_installed) return;
    g_installed = 1;
    const char *prog = program_invocation_short_name, *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (rank && strcmp(rank, "0") && strlen(rank) < 12) snprintf(g_who, sizeof g_who, "%.40s: error on rank %s: ", prog, rank);
    else snprintf(g_who, sizeof g_who, "%.40s: error: ", prog);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_old_bus);
}

/* Called from the thread that opens checkpoints (never from a handler). A full table only
 * means that mapping is not guarded: its reads still go through pread. */
static void guard_register(fs_st_file *f)
{
    guard_install();
    for (int i = 0; i < GUARD_MAX; i++) {
        uintptr_t z = 0;
        if (!__atomic_compare_exchange_n(&g_slots[i].lo, &z, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) continue;
        struct guard_slot *g = &g_slots[i];
        g->len = f->map_len;
        g->want = f->map_len;
        g->data_start = f->data_start;
        g->fd = f->fd;
        g->n = f->n;
        g->path = f->path;
        g->ent = f->ent;
        if (i + 1 > g_nslots) __atomic_store_n(&g_nslots, i + 1, __ATOMIC_RELEASE);
        __atomic_store_n(&g->lo, (uintptr_t)f->map, __ATOMIC_RELEASE);
        f->guard = i + 1;
        return;
    }
}

static void guard_unregister(fs_st_file *f)
{
    if (f->guard) __atomic_store_n(&g_slots[f->guard - 1].lo, 0, __ATOMIC_RELEASE);
    f->guard = 0;
}

/* pread until n bytes or end of file; returns the bytes read, -1 with errno on error */
static ssize_t pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got > (1u << 30) ? (1u << 30) : n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* The descriptor stays open while the file is (pread, size checks): a checkpoint of many small
 * shards can need more than the usual soft limit of 1024, so raise it to the hard limit once. */
static int open_ro(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && (errno == EMFILE)) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
            rl.rlim_cur = rl.rlim_max;
            if (setrlimit(RLIMIT_NOFILE, &rl) == 0) fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
            else errno = EMFILE;
        }
    }
    return fd;
}

int fs_st_open(fs_st_file *f, const char *path, fs_err *e)
{
    memset(f, 0, sizeof *f);
    /* O_NONBLOCK: a FIFO or device named by mistake must fail the S_ISREG check, not hang open(). */
    int fd = open_ro(path);
    if (fd < 0) return fs_errf(e, FS_E_INPUT, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return fs_errf(e, FS_E_IO, "%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fs_errf(e, FS_E_INPUT, "%s: not a regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return fs_errf(e, FS_E_INPUT,
                       "%s: file is %lld bytes, shorter than the 8-byte header length that starts a safetensors file",
                       path, (long long)st.st_size);
    }
    /* the header through pread (into our memory), never through the mapping: a file cut between
     * fstat and here is a short read, not a SIGBUS */
    uint64_t hlen;
    char *hdr = NULL;
    ssize_t got = pread_full(fd, &hlen, 8, 0);
    int rc = FS_OK;
    if (got != 8) {
        rc = got < 0 ? fs_errf(e, FS_E_IO, "%s: cannot read: %s", path, strerror(errno))
                     : fs_errf(e, FS_E_IO, "%s: file shrank while its header was read", path);
    } else if (hlen > (uint64_t)st.st_size - 8) {
        rc = fs_errf(e, FS_E_INPUT,
                     "%s: header length %llu is beyond the file size (%lld bytes): not a safetensors file, or "
                     "truncated",
                     path, (unsigned long long)hlen, (long long)st.st_size);
    } else if (hlen > FS_ST_MAX_HEADER) {
        rc = fs_errf(e, FS_E_INPUT, "%s: header length %llu exceeds the 100 MB safetensors limit", path,
                     (unsigned long long)hlen);
    } else if (!(hdr = malloc(hlen ? (size_t)hlen : 1))) {
        rc = fs_errf(e, FS_E_NOMEM, "%s: out of memory for a %llu-byte header", path, (unsigned long long)hlen);
    } else if ((got = pread_full(fd, hdr, (size_t)hlen, 8)) != (ssize_t)hlen) {
        rc = got < 0 ? fs_errf(e, FS_E_IO, "%s: cannot read: %s", path, strerror(errno))
                     : fs_errf(e, FS_E_IO, "%s: file shrank while its header was read", path);
    }
    if (rc) {
        free(hdr);
        close(fd);
        return rc;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    if (map == MAP_FAILED) {
        free(hdr);
        close(fd);
        return fs_errf(e, FS_E_IO, "%s: cannot mmap %lld bytes: %s", path, (long long)st.st_size, strerror(err));
    }
    f->map = map;
    f->map_len = (size_t)st.st_size;
    f->fd = fd;
    f->fd_open = 1;
    if (!(f->path = strdup(path))) {
        free(hdr);
        fs_st_close(f);
        return fs_errf(e, FS_E_NOMEM, "out of memory");
    }
    rc = parse_header(f, hdr, hlen, e);
    free(hdr);
    if (rc) fs_st_close(f);
    else guard_register(f);
    return rc;
}

int fs_st_check_size(const fs_st_file *f, fs_err *e)
{
    struct stat st;
    if (!f->fd_open) return FS_OK;
    if (fstat(f->fd, &st) != 0) return fs_errf(e, FS_E_IO, "cannot stat the file: %s", strerror(errno));
    if ((uint64_t)st.st_size < f->map_len)
        return fs_errf(e, FS_E_IO, "the file is now %lld bytes, %zu when it was opened (truncated or rewritten during "
                                   "the run)",
                       (long long)st.st_size, f->map_len);
    return FS_OK;
}

int fs_st_pread(const fs_st_file *f, const fs_st_entry *en, uint64_t off, size_t n, void *buf, fs_err *e)
{
    const uint64_t size = en->end - en->begin;
    if (off > size || n > size - off)
        return fs_errf(e, FS_E_INTERNAL, "tensor '%s': read of bytes [%llu, %llu) outside its %llu", en->name,
                       (unsigned long long)off, (unsigned long long)(off + n), (unsigned long long)size);
    if (!f->fd_open) { /* a released file: the caller owns the mapping */
        memcpy(buf, (const char *)en->data + off, n);
        return FS_OK;
    }
    const uint64_t at = f->data_start + en->begin + off;
    ssize_t got = pread_full(f->fd, buf, n, at);
    if (got < 0) return fs_errf(e, FS_E_IO, "cannot read bytes [%llu, %llu) of the file: %s", (unsigned long long)at,
                                (unsigned long long)(at + n), strerror(errno));
    if ((size_t)got != n) {
        struct stat st;
        long long now = fstat(f->fd, &st) == 0 ? (long long)st.st_size : -1;
        return fs_errf(e, FS_E_IO, "bytes [%llu, %llu) cannot be read: the file is now %lld bytes, %zu when it was "
                                   "opened (truncated or rewritten during the run)",
                       (unsigned long long)at, (unsigned long long)(at + n), now, f->map_len);
    }
    return FS_OK;
}

const fs_st_entry *fs_st_find(const fs_st_file *f, const char *name)
{
    fs_st_entry key = {.name = (char *)name};
    return f->n ? bsearch(&key, f->ent, (size_t)f->n, sizeof *f->ent, cmp_entry_name) : NULL;
}

void fs_st_release_map(fs_st_file *f, void **addr, size_t *len)
{
    guard_unregister(f);
    *addr = f->map;
    *len = f->map_len;
    f->map = NULL;
    f->map_len = 0;
    if (f->fd_open) close(f->fd);
    f->fd_open = 0;
}

void fs_st_close(fs_st_file *f)
{
    if (!f) return;
    guard_unregister(f);
    for (int i = 0; i < f->n; i++) free(f->ent[i].name);
    free(f->ent);
    if (f->map) munmap(f->map, f->map_len);
    if (f->fd_open) close(f->fd);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* ---- archive ---- */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static char *path_join(const char *dir, const char *name)
{
    char *p = NULL;
    if (asprintf(&p, "%s%s%s", dir, (*dir && !ends_with(dir, "/")) ? "/" : "", name) < 0) return NULL;
    return p;
}

/* Every entry of every file into a->idx, sorted by name; a name in two files is an error. */
static int build_index(fs_st_archive *a, fs_err *e)
{
    int n = 0;
    for (int i = 0; i < a->nfiles; i++) n += a->files[i].n;
    a->idx = malloc((n ? (size_t)n : 1) * sizeof *a->idx);
    if (!a->idx) return fs_errf(e, FS_E_NOMEM, "%s: out of memory", a->path);
    for (int i = 0; i < a->nfiles; i++)
        for (int j = 0; j < a->files[i].n; j++) {
            a->files[i].ent[j].file = i;
            a->idx[a->n++] = &a->files[i].ent[j];
        }
    qsort(a->idx, (size_t)a->n, sizeof *a->idx, cmp_entry_ptr_name);
    for (int i = 1; i < a->n; i++)
        if (!strcmp(a->idx[i - 1]->name, a->idx[i]->name))
            return fs_errf(e, FS_E_INPUT, "%s: tensor '%s' is in both %s and %s", a->path, a->idx[i]->name,
                           a->files[a->idx[i - 1]->file].path, a->files[a->idx[i]->file].path);
    return FS_OK;
}

static int open_single(fs_st_archive *a, const char *file, fs_err *e)
{
    if (!(a->files = calloc(1, sizeof *a->files))) return fs_errf(e, FS_E_NOMEM, "out of memory");
    int rc = fs_st_open(&a->files[0], file, e);
    if (rc) return rc;
    a->nfiles = 1;
    return build_index(a, e);
}

/* One weight_map member: tensor name, shard name (both borrowed from the cJSON tree), its
 * position in the file and the index of its shard in a->files. */
typedef struct wm_member {
    const char *tensor, *shard;
    int idx, sk;
} wm_member;

static int cmp_member_shard(const void *a, const void *b)
{
    const wm_member *x = *(const wm_member *const *)a, *y = *(const wm_member *const *)b;
    int c = strcmp(x->shard, y->shard);
    return c ? c : (x->idx > y->idx) - (x->idx < y->idx);
}

static int cmp_member_tensor(const void *a, const void *b)
{
    const wm_member *x = *(const wm_member *const *)a, *y = *(const wm_member *const *)b;
    int c = strcmp(x->tensor, y->tensor);
    return c ? c : (x->idx > y->idx) - (x->idx < y->idx);
}

typedef struct shard_first {
    const char *name;
    int first, gid;
} shard_first;

static int cmp_shard_first(const void *a, const void *b)
{
    const shard_first *x = a, *y = b;
    return (x->first > y->first) - (x->first < y->first);
}

/* 1 when `p` is `root` or lies under it (both absolute, canonical) */
static int under(const char *p, const char *root)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/') return 1;
    return !strncmp(p, root, n) && (p[n] == '/' || p[n] == 0);
}

/* The path of shard `name` named by `index`, confined to the index's folder `dir` (probe T20: an
 * index is a text file that travels alone, and '../../etc/passwd' or '/etc/passwd' made flux-sim
 * open that file and print its first bytes as a header length). Refused: an absolute name, a
 * '..' component, a name that resolves (realpath: symlinks followed) outside the folder --
 * except into the blobs/ folder of the Hugging Face cache the index lives in
 * (<cache>/snapshots/<rev>/.../x.safetensors -> ../../blobs/<sha256>), the layout every
 * `huggingface-cli download` produces. A name that does not resolve (missing, a loop) is left
 * for fs_st_open to report. *out is malloc'd. */
static int shard_path(const char *index, const char *dir, const char *name, char **out, fs_err *e)
{
    *out = NULL;
    char pn[300], pi[300];
    const char *why = NULL;
    if (name[0] == '/') why = "an absolute path";
    for (const char *c = name; !why && *c;) {
        const char *end = strchr(c, '/');
        size_t len = end ? (size_t)(end - c) : strlen(c);
        if (len == 2 && c[0] == '.' && c[1] == '.') why = "a path with a '..' component";
        c += len + (end ? 1 : 0);
    }
    if (why)
        return fs_errf(e, FS_E_INPUT, "%s: weight_map names shard '%s', %s: shards must be inside the index's folder",
                       fs_printable(index, pi, sizeof pi, 200), fs_printable(name, pn, sizeof pn, 200), why);
    char *p = path_join(dir, name);
    if (!p) return fs_errf(e, FS_E_NOMEM, "out of memory");
    char *rp = realpath(p, NULL), *rd = rp ? realpath(*dir ? dir : ".", NULL) : NULL;
    int rc = FS_OK;
    if (rp && rd && !under(rp, rd)) {
        int ok = 0;
        char *snap = strstr(rd, "/snapshots/");
        if (snap) { /* a Hugging Face cache: <cache>/blobs holds the files the snapshot links to */
            char *blobs = NULL;
            if (asprintf(&blobs, "%.*s/blobs", (int)(snap - rd), rd) >= 0) {
                ok = under(rp, blobs);
                free(blobs);
            }
        }
        if (!ok) {
            char pr[300];
            rc = fs_errf(e, FS_E_INPUT,
                         "%s: weight_map names shard '%s', which resolves to %s, outside the index's folder: refused "
                         "(shards must be inside it)",
                         fs_printable(index, pi, sizeof pi, 200), fs_printable(name, pn, sizeof pn, 200),
                         fs_printable(rp, pr, sizeof pr, 200));
        }
    }
    free(rp);
    free(rd);
    if (rc) free(p);
    else *out = p;
    return rc;
}

static int open_index(fs_st_archive *a, const char *index, fs_err *e)
{
    char *text = NULL, *dir = NULL;
    wm_member *mem = NULL, **bys = NULL, **byt = NULL;
    shard_first *sf = NULL;
    int *rank_of = NULL;
    int nshards = 0, rc;
    char pi[300], pn[300], pv[300];
    cJSON *root = NULL;
    /* a regular file, opened O_NONBLOCK: a FIFO is refused at once, never waited on (probe T4) */
    if ((rc = fs_read_text_file(index, "safetensors index", "an index is at most", (size_t)64 << 20, &text, e)))
        return rc;
    const char *at = NULL; /* not cJSON_GetErrorPtr(): that is a global, and loaders may run in threads */
    root = cJSON_ParseWithOpts(text, &at, 1); /* 1: trailing garbage is an error too */
    if (!root) {
        char xb[32];
        rc = fs_errf(e, FS_E_INPUT, "%s: malformed JSON %s%s%s", fs_printable(index, pi, sizeof pi, 200),
                     at && *at ? "near '" : "(ends too early)", at && *at ? excerpt(at, at + strlen(at), xb, sizeof xb) : "",
                     at && *at ? "'" : "");
        goto out;
    }
    fs_printable(index, pi, sizeof pi, 200);
    const cJSON *wm = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        rc = fs_errf(e, FS_E_INPUT, "%s: no \"weight_map\" object (not a safetensors index)", pi);
        goto out;
    }
    int nmembers = 0;
    for (const cJSON *it = wm->child; it; it = it->next) nmembers++; /* cJSON_GetArraySize is an int walk too */
    if (nmembers == 0) {
        rc = fs_errf(e, FS_E_INPUT, "%s: weight_map is empty", pi);
        goto out;
    }
    if (!(mem = calloc((size_t)nmembers, sizeof *mem)) || !(bys = malloc((size_t)nmembers * sizeof *bys)) ||
        !(byt = malloc((size_t)nmembers * sizeof *byt)) || !(sf = malloc((size_t)nmembers * sizeof *sf)) ||
        !(rank_of = malloc((size_t)nmembers * sizeof *rank_of))) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    int k = 0;
    for (const cJSON *it = wm->child; it; it = it->next, k++) {
        if (has_control_char(it->string)) {
            char xb[32];
            rc = fs_errf(e, FS_E_INPUT, "%s: weight_map: tensor name '%s' holds control characters", pi,
                         excerpt(it->string, it->string + strlen(it->string), xb, sizeof xb));
            goto out;
        }
        if (!cJSON_IsString(it) || !*it->valuestring || has_control_char(it->valuestring)) {
            rc = fs_errf(e, FS_E_INPUT, "%s: weight_map entry for tensor '%s' is not a file name", pi,
                         fs_printable(it->string, pn, sizeof pn, 200));
            goto out;
        }
        mem[k] = (wm_member){.tensor = it->string, .shard = it->valuestring, .idx = k};
        bys[k] = byt[k] = &mem[k];
    }
    /* Distinct shard names, in order of first appearance: sort by name (ties by position), so each
     * group's first member is its first appearance; then order the groups by that. O(n log n):
     * the pairwise search this replaces took 103 s for 100 000 shards (probe T3). */
    qsort(bys, (size_t)nmembers, sizeof *bys, cmp_member_shard);
    for (int i = 0; i < nmembers; i++) {
        if (i == 0 || strcmp(bys[i]->shard, bys[i - 1]->shard))
            sf[nshards] = (shard_first){bys[i]->shard, bys[i]->idx, nshards}, nshards++;
        bys[i]->sk = nshards - 1; /* the group id for now */
    }
    qsort(sf, (size_t)nshards, sizeof *sf, cmp_shard_first);
    for (int g = 0; g < nshards; g++) rank_of[sf[g].gid] = g;
    for (int i = 0; i < nmembers; i++) mem[i].sk = rank_of[mem[i].sk];
    const char *slash = strrchr(index, '/');
    dir = slash ? strndup(index, (size_t)(slash - index + 1)) : strdup("");
    if (!dir || !(a->files = calloc((size_t)nshards, sizeof *a->files))) {
        rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        goto out;
    }
    for (int s = 0; s < nshards; s++) {
        char *p = NULL;
        if ((rc = shard_path(index, dir, sf[s].name, &p, e))) goto out;
        rc = fs_st_open(&a->files[s], p, e);
        free(p);
        if (rc) {
            fs_err_prefix(e, "%s names shard '%s': ", pi, fs_printable(sf[s].name, pn, sizeof pn, 200));
            goto out;
        }
        a->nfiles++;
    }
    /* Both directions: every weight_map name is in the shard it names, and every tensor of a
     * shard is listed under that shard (a stray tensor would otherwise be loaded silently). */
    for (int i = 0; i < nmembers; i++)
        if (!fs_st_find(&a->files[mem[i].sk], mem[i].tensor)) {
            rc = fs_errf(e, FS_E_INPUT, "%s: weight_map puts tensor '%s' in %s, but that file has no such tensor", pi,
                         fs_printable(mem[i].tensor, pn, sizeof pn, 200), a->files[mem[i].sk].path);
            goto out;
        }
    qsort(byt, (size_t)nmembers, sizeof *byt, cmp_member_tensor);
    for (int s = 0; s < nshards; s++)
        for (int j = 0; j < a->files[s].n; j++) {
            wm_member key = {.tensor = a->files[s].ent[j].name, .idx = -1}, *kp = &key;
            /* the first member of that name: idx -1 sorts before every real one */
            size_t lo = 0, hi = (size_t)nmembers;
            while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (cmp_member_tensor(&byt[mid], &kp) < 0) lo = mid + 1;
                else hi = mid;
            }
            const wm_member *v = lo < (size_t)nmembers && !strcmp(byt[lo]->tensor, key.tensor) ? byt[lo] : NULL;
            if (!v || v->sk != s) {
                rc = fs_errf(e, FS_E_INPUT, "%s: tensor '%s' is in %s but weight_map %s%s", pi,
                             fs_printable(key.tensor, pn, sizeof pn, 200), a->files[s].path,
                             v ? "puts it in " : "does not list it", v ? fs_printable(v->shard, pv, sizeof pv, 200) : "");
                goto out;
            }
        }
    if ((rc = build_index(a, e))) goto out;
    if (a->n != nmembers) /* only duplicate weight_map keys get here: every other case failed above */
        rc = fs_errf(e, FS_E_INPUT, "%s: weight_map lists %d names for %d distinct tensors (duplicate keys)", pi,
                     nmembers, a->n);
out:
    free(mem);
    free(bys);
    free(byt);
    free(sf);
    free(rank_of);
    free(dir);
    cJSON_Delete(root);
    free(text);
    return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Chooses what to open inside a directory: the one index, else the one .safetensors. */
static int open_dir(fs_st_archive *a, const char *dir, fs_err *e)
{
    DIR *d = opendir(dir);
    if (!d) return fs_errf(e, FS_E_INPUT, "%s: cannot open directory: %s", dir, strerror(errno));
    char *idx[2] = {0}, *st[2] = {0};
    int nidx = 0, nst = 0, rc = FS_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        /* Keep the first two names of each kind: enough to open the one, or to name two in the
         * error when there are several. */
        char **slot = NULL;
        if (ends_with(de->d_name, ".safetensors.index.json")) {
            if (nidx < 2) slot = &idx[nidx];
            nidx++;
        } else if (ends_with(de->d_name, ".safetensors")) {
            if (nst < 2) slot = &st[nst];
            nst++;
        }
        if (slot && !(*slot = strdup(de->d_name))) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
    }
    closedir(d);
    if (rc) goto out;
    if (nidx >= 2) {
        qsort(idx, 2, sizeof *idx, cmp_str);
        rc = fs_errf(e, FS_E_INPUT, "%s: %d *.safetensors.index.json files (%s, %s, ...); name the one to load", dir,
                     nidx, idx[0], idx[1]);
    } else if (nidx == 0 && nst == 0) {
        rc = fs_errf(e, FS_E_INPUT, "%s: directory holds no *.safetensors file and no *.safetensors.index.json", dir);
    } else if (nidx == 0 && nst >= 2) {
        qsort(st, 2, sizeof *st, cmp_str);
        rc = fs_errf(e, FS_E_INPUT,
                     "%s: %d *.safetensors files (%s, %s, ...) but no *.safetensors.index.json to say which tensor is "
                     "where; name one file",
                     dir, nst, st[0], st[1]);
    } else {
        char *p = path_join(dir, nidx ? idx[0] : st[0]);
        if (!p) rc = fs_errf(e, FS_E_NOMEM, "out of memory");
        else rc = nidx ? open_index(a, p, e) : open_single(a, p, e);
        free(p);
    }
out:
    for (int i = 0; i < 2; i++) free(idx[i]), free(st[i]);
    return rc;
}

int fs_st_archive_open(fs_st_archive *a, const char *path, fs_err *e)
{
    memset(a, 0, sizeof *a);
    struct stat st;
    if (stat(path, &st) != 0) return fs_errf(e, FS_E_INPUT, "%s: cannot open: %s", path, strerror(errno));
    if (!(a->path = strdup(path))) return fs_errf(e, FS_E_NOMEM, "out of memory");
    int rc;
    if (S_ISDIR(st.st_mode)) rc = open_dir(a, path, e);
    else if (ends_with(path, ".json")) rc = open_index(a, path, e);
    else rc = open_single(a, path, e);
    if (rc) fs_st_archive_close(a);
    return rc;
}

int fs_st_archive_index(const fs_st_archive *a, const char *name)
{
    int lo = 0, hi = a->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(a->idx[mid]->name, name);
        if (!c) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

const fs_st_entry *fs_st_archive_find(const fs_st_archive *a, const char *name)
{
    int i = fs_st_archive_index(a, name);
    return i < 0 ? NULL : a->idx[i];
}

const char *fs_st_archive_file_of(const fs_st_archive *a, const fs_st_entry *en)
{
    return en->file >= 0 && en->file < a->nfiles ? a->files[en->file].path : "?";
}

void fs_st_archive_close(fs_st_archive *a)
{
    if (!a) return;
    for (int i = 0; i < a->nfiles; i++) fs_st_close(&a->files[i]);
    free(a->files);
    free(a->idx);
    free(a->path);
    memset(a, 0, sizeof *a);
}

/* ---- decoding ---- */

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float fs_bf16_to_f32(uint16_t h) { return fs_bf16_to_float(h); }

float fs_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mant << 13)); /* inf, nan (payload kept) */
    if (exp == 0) {
        if (!mant) return f32_from_bits(sign); /* ±0 */
        /* Subnormal half: mant · 2^-24. Normalise so the leading 1 becomes implicit. */
        int32_t e = 127 - 15 + 1;
        while (!(mant & 0x400)) {
            mant <<= 1;
            e--;
        }
        return f32_from_bits(sign | ((uint32_t)e << 23) | ((mant & 0x3ff) << 13));
    }
    return f32_from_bits(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

/* One loop per (source, destination) pair; memcpy loads because the mapping gives no alignment
 * guarantee (a header length that is not a multiple of 8 is legal). */
#define DECODE_LOOP(SRC_T, CONV, DST_T)                                 \
    do {                                                                \
        DST_T *d = dst;                                                 \
        for (int64_t i = 0; i < count; i++) {                           \
            SRC_T v;                                                    \
            memcpy(&v, s + (size_t)i * sizeof(SRC_T), sizeof(SRC_T));   \
            d[i] = (DST_T)CONV(v);                                      \
        }                                                               \
    } while (0)
#define ID(x) (x)

/* count elements at s (source dtype src) into dst as dst_dt */
static void convert(fs_st_dtype src, const unsigned char *s, int64_t count, fs_dtype dst_dt, void *dst)
{
    int to64 = dst_dt == FS_F64;
    if (dst_dt == FS_BF16) { /* a bf16 run: bf16 stays bits; anything else via float32, rounded once */
        if (src == FS_ST_BF16) {
            memcpy(dst, s, (size_t)count * 2);
            return;
        }
        uint16_t *d = dst;
        for (int64_t i = 0; i < count; i++) {
            float f;
            if (src == FS_ST_F32) memcpy(&f, s + (size_t)i * 4, 4);
            else if (src == FS_ST_F64) {
                double v;
                memcpy(&v, s + (size_t)i * 8, 8);
                f = (float)v;
            } else {
                uint16_t h;
                memcpy(&h, s + (size_t)i * 2, 2);
                f = fs_f16_to_f32(h);
            }
            d[i] = fs_bf16_from_float(f);
        }
        return;
    }
    switch (src) {
    case FS_ST_F32:
        if (to64) DECODE_LOOP(float, ID, double);
        else memcpy(dst, s, (size_t)count * 4);
        break;
    case FS_ST_F64:
        if (to64) memcpy(dst, s, (size_t)count * 8);
        else DECODE_LOOP(double, ID, float);
        break;
    case FS_ST_BF16:
        if (to64) DECODE_LOOP(uint16_t, fs_bf16_to_f32, double);
        else DECODE_LOOP(uint16_t, fs_bf16_to_f32, float);
        break;
    case FS_ST_F16:
        if (to64) DECODE_LOOP(uint16_t, fs_f16_to_f32, double);
        else DECODE_LOOP(uint16_t, fs_f16_to_f32, float);
        break;
    }
}

static int range_ok(const fs_st_entry *en, int64_t first, int64_t count, fs_err *e)
{
    int64_t n = fs_st_numel(en);
    if (first < 0 || count < 0 || first > n || count > n - first)
        return fs_errf(e, FS_E_INTERNAL, "tensor '%s': decode of elements [%lld, %lld) outside its %lld", en->name,
                       (long long)first, (long long)(first + count), (long long)n);
    return FS_OK;
}

int fs_st_decode(const fs_st_entry *en, int64_t first, int64_t count, fs_dtype dst_dt, void *dst, fs_err *e)
{
    int rc = range_ok(en, first, count, e);
    if (rc) return rc;
    convert(en->dtype, (const unsigned char *)en->data + (size_t)first * st_dtypes[en->dtype].size, count, dst_dt, dst);
    return FS_OK;
}

int fs_st_read(const fs_st_file *f, const fs_st_entry *en, int64_t first, int64_t count, fs_dtype dst_dt, void *dst,
               fs_err *e)
{
    int rc = range_ok(en, first, count, e);
    if (rc) return rc;
    const size_t ss = st_dtypes[en->dtype].size, ds = fs_dtype_size(dst_dt);
    const int same = (en->dtype == FS_ST_F32 && dst_dt == FS_F32) || (en->dtype == FS_ST_F64 && dst_dt == FS_F64) ||
                     (en->dtype == FS_ST_BF16 && dst_dt == FS_BF16);
    if (same) return fs_st_pread(f, en, (uint64_t)first * ss, (size_t)count * ss, dst, e);
    /* through a bounce buffer of at most 1 MiB, converted chunk by chunk */
    enum { CHUNK = 1 << 20 };
    const int64_t per = CHUNK / (int64_t)ss;
    unsigned char *buf = malloc(count * (int64_t)ss < CHUNK ? (size_t)(count * (int64_t)ss) + 1 : CHUNK);
    if (!buf) return fs_errf(e, FS_E_NOMEM, "out of memory");
    for (int64_t i = 0; i < count && !rc; i += per) {
        const int64_t m = count - i < per ? count - i : per;
        rc = fs_st_pread(f, en, (uint64_t)(first + i) * ss, (size_t)m * ss, buf, e);
        if (!rc) convert(en->dtype, buf, m, dst_dt, (char *)dst + (size_t)i * ds);
    }
    free(buf);
    return rc;
}
