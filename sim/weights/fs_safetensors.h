/* fs_safetensors.h — read-only safetensors reader (one file, a directory, or the Hugging Face
 * sharded layout with *.safetensors.index.json).
 *
 * Files are mmap'd (read-only, MAP_PRIVATE), never read into memory: a FLUX.1-dev checkpoint is
 * 24-48 GB, and an F32 tensor in an F32 run is used in place.
 *
 * A file truncated while it is mapped (another process rewriting the checkpoint during a run,
 * probe T1) makes any later read of the lost pages a SIGBUS. Two defences:
 *   - bytes that are converted or copied (the header, fs_st_read, fs_st_pread) are read with
 *     pread(2) on a descriptor kept open, never through the mapping: a short read is an
 *     ordinary FS_E_IO error naming the file and tensor. No signal, no thread issue.
 *   - bytes used in place (views handed to GEMMs on OpenMP/BLAS threads) cannot be given an
 *     error return. fs_st_check_size() lets a caller verify the file has not shrunk right before
 *     it hands out a view (fs_weights_load does, for every view it makes), and every mapping is
 *     registered with a process-wide SIGBUS handler (installed on the first open, chaining to
 *     the one before it for faults elsewhere): a fault inside a checkpoint mapping prints one
 *     line naming the file, the tensor and the cause, runs fs_cleanup_run() (the dump
 *     temporaries) and _exits 2 -- the same thing flux-sim's SIGTERM handler does. A
 *     siglongjmp back to an fs_err is not possible there: the fault can be in a BLAS kernel on
 *     any OpenMP thread, and jumping out of it would leave the team's barrier and BLAS's state
 *     undefined. The handler is async-signal-safe (fstat, write, unlink, _exit; the registry
 *     is a fixed table published with atomic stores). The JSON header is parsed with
 * cJSON and every field is validated before any tensor is handed out (dtype, shape, offsets
 * inside the data region, no two tensors overlapping), so a pointer obtained from an entry is
 * always inside the mapping. Errors are FS_E_INPUT (the file is wrong) except for OS failures
 * (FS_E_IO) and malloc (FS_E_NOMEM); each names the file, the tensor and the cause.
 *
 * Byte order: safetensors is little-endian, and so is every host flux-sim runs on (checked at
 * compile time in fs_safetensors.c). */
#ifndef FS_SAFETENSORS_H
#define FS_SAFETENSORS_H

#include "fs_common.h"
#include "fs_tensor.h"

typedef enum fs_st_dtype { FS_ST_F32 = 0, FS_ST_F64, FS_ST_BF16, FS_ST_F16 } fs_st_dtype;

/* "F32", "F64", "BF16", "F16" — the spelling used in the header. */
const char *fs_st_dtype_name(fs_st_dtype dt);
size_t fs_st_dtype_size(fs_st_dtype dt);

typedef struct fs_st_entry {
    char *name;               /* owned */
    fs_st_dtype dtype;
    int ndim;                 /* 0..FS_MAX_DIMS (0 = a scalar, one element) */
    int64_t shape[FS_MAX_DIMS];
    uint64_t begin, end;      /* data_offsets, relative to the start of the data region */
    const void *data;         /* into the mapping: file byte 8 + header_len + begin */
    int file;                 /* index into the archive's files (0 for a lone fs_st_file) */
} fs_st_entry;

typedef struct fs_st_file {
    char *path;               /* owned, as opened */
    void *map;                /* whole file, PROT_READ, MAP_PRIVATE; NULL after release */
    size_t map_len;
    size_t data_start;        /* 8 + header length */
    fs_st_entry *ent;         /* [n], sorted by name */
    int n;
    int fd;                   /* kept open for pread and size checks; valid when fd_open */
    int fd_open;
    int guard;                /* slot in the SIGBUS registry + 1; 0 = none */
} fs_st_file;

/* Maps and validates one .safetensors file. On error *f is left closed (nothing to free). */
int fs_st_open(fs_st_file *f, const char *path, fs_err *e);
/* Entry by exact name (binary search), NULL if absent. */
const fs_st_entry *fs_st_find(const fs_st_file *f, const char *name);
/* Unmaps (unless released) and frees. Safe on a zeroed or already closed struct. */
void fs_st_close(fs_st_file *f);

/* Hands the mapping over to the caller, who must munmap(*addr, *len) once done with every
 * entry's data pointer; fs_st_close then frees the index only. The mapping leaves the SIGBUS
 * registry (the caller owns it now). */
void fs_st_release_map(fs_st_file *f, void **addr, size_t *len);

/* FS_OK when the file still has the size it had when opened; else FS_E_IO "the file is now N
 * bytes, M when it was opened (...)". Call before handing out a view. The messages of this and of
 * fs_st_pread / fs_st_read do not repeat the file and tensor: the caller prefixes them. */
int fs_st_check_size(const fs_st_file *f, fs_err *e);
/* Bytes [off, off + n) of entry `en`'s data (off relative to the tensor's first byte) into buf
 * with pread: never touches the mapping, so a file truncated meanwhile is an FS_E_IO error
 * (short read), not a SIGBUS. The range must lie inside the tensor (FS_E_INTERNAL otherwise). */
int fs_st_pread(const fs_st_file *f, const fs_st_entry *en, uint64_t off, size_t n, void *buf, fs_err *e);
/* fs_st_decode's conversion, reading the file with pread instead of the mapping. */
int fs_st_read(const fs_st_file *f, const fs_st_entry *en, int64_t first, int64_t count, fs_dtype dst_dt, void *dst,
               fs_err *e);

/* ---- Several files seen as one set of tensors ---- */
typedef struct fs_st_archive {
    char *path;               /* owned, as given to fs_st_archive_open */
    fs_st_file *files;        /* [nfiles] */
    int nfiles;
    const fs_st_entry **idx;  /* [n], every tensor of every file, sorted by name */
    int n;
} fs_st_archive;

/* `path` is one .safetensors file, a *.safetensors.index.json (Hugging Face sharded layout:
 * {"metadata": ..., "weight_map": {tensor: "shard file"}}, shard paths relative to the index's
 * directory), or a directory holding exactly one index json, or else exactly one .safetensors.
 * For an index, each tensor of weight_map must be in the shard it names, every tensor of a shard
 * must be listed in weight_map under that shard, and no name may appear twice.
 *
 * The index is read with fs_read_text_file (a regular file of at most 64 MiB, no NUL; a FIFO is
 * refused without blocking) and checked in O(n log n) (sorted arrays, no pairwise search).
 * Shard names are confined to the index's folder (probe T20): no absolute path, no '..'
 * component, and the file they resolve to (realpath) must lie inside the folder -- or, for a
 * Hugging Face cache (.../snapshots/<rev>/.../index.json, shards symlinked to ../blobs/<sha>),
 * inside that cache's blobs/ folder. */
int fs_st_archive_open(fs_st_archive *a, const char *path, fs_err *e);
const fs_st_entry *fs_st_archive_find(const fs_st_archive *a, const char *name);
/* Position of `name` in a->idx (for callers that track which tensors they used), or -1. */
int fs_st_archive_index(const fs_st_archive *a, const char *name);
/* The file an entry came from (for error messages). */
const char *fs_st_archive_file_of(const fs_st_archive *a, const fs_st_entry *en);
void fs_st_archive_close(fs_st_archive *a);

/* ---- Decoding ---- */
float fs_bf16_to_f32(uint16_t h);
float fs_f16_to_f32(uint16_t h);

int64_t fs_st_numel(const fs_st_entry *en);

/* Decodes flat elements [first, first + count) of `en` into dst, as float (FS_F32) or double
 * (FS_F64). Reads through memcpy, so the mapping may be unaligned. The range must lie inside the
 * tensor (checked: FS_E_INTERNAL otherwise, it is the caller's bug). For a row range [a, b) of a
 * 2-D [R, C] tensor, first = a*C and count = (b-a)*C. */
int fs_st_decode(const fs_st_entry *en, int64_t first, int64_t count, fs_dtype dst_dt, void *dst, fs_err *e);

#endif
