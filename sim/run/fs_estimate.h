/* fs_estimate.h — what a run will need, before it allocates anything.
 *
 * Given a config, the batch, the token counts, the dtype and the parallel degrees, estimate per
 * rank the bytes of the weights, of the inputs, and of the forward's peak live activations, and
 * the size of one step of a full dump. The CLI calls fs_estimate_refuse() before it loads weights
 * or generates inputs, so a run that cannot fit says so in one line that names the option that
 * made it too big, instead of running for minutes or failing with an out-of-memory message that
 * names nothing. The struct is meant to be extended (FLOPs, collective volumes for a future
 * `flux-sim --estimate`); every field is computed from the request alone, no global state.
 *
 * All quantities are counts of live bytes of the current code (commit history: sim/model/fs_model.c,
 * fs_sampler.c, fs_seqpar.c); allocator slack and library buffers (MPI, OpenBLAS, HDF5) are not
 * included, so the real peak is at least this. Notation, per rank: B batch, Si/St/S image, text
 * and joint tokens of this rank (the global counts divided over sp = ulysses·ring, rounded up),
 * D hidden, F = 4D, Dl = D/tp and Fl = F/tp (the plan's colwise shards), Dh head_dim, es the
 * dtype size.
 *
 * Persistent through the forward (fs_model_forward): the image and text residual streams X, CX
 * (Si·D, St·D), temb, the ids and the RoPE tables (S·(3·8 + 2·Dh·es)); from the first single
 * block on, also the joint stream H (S·D). Everything of a block is freed by the time it
 * returns, so the peak is the largest phase of the two block kinds (fs_estimate.c lists them):
 *
 *   double block (FluxTransformerBlock, Flux2TransformerBlock): the joint attention
 *     (fs_joint_attention, fs_layers.c) frees its intermediates when it returns (since
 *     2026-11-28). Its phases: SDPA (the modulated inputs D, per stream q, k, v and the normed
 *     q, k 5·Dl, the joint q, k, v and output 4·Dl, per token), the output projections (+ the
 *     output's slices Dl and the projections' outputs D); then the MLPs, when alive are the
 *     modulated inputs and the attention outputs (2·D per token), and per image token norm2
 *     (FLUX.1 only), the modulated MLP input, the hidden before and after the activation (2·Fl)
 *     and the MLP output; the text MLP adds the same per text token while the image's stay.
 *     FLUX.1 also holds 12 AdaLN chunks per block (12·D per batch row; FLUX.2's are persistent).
 *   single block (FluxSingleTransformerBlock, Flux2SingleTransformerBlock): the MLP activation
 *     (modulated input D, hidden before and after 2·Fl), SDPA (+ q, k, v, normed q, k and the
 *     output 6·Dl), and its end, when alive are, per joint token, the modulated input,
 *     proj_out's output and the text/image slices recorded (3·D), the MLP hidden, its GELU and
 *     the cat([attn, mlp]) input of proj_out (3·Fl), q, k, v, the normed q, k, the attention
 *     output and the attention part of the concatenation (7·Dl).
 *   attention scratch: scaled_dot_product_attention never materialises S×S; each thread holds
 *     one score block of 256 query rows by the keys it attends (min(256, S)·Skv·es). Ulysses
 *     adds its head-sharded q, k, v, o and the all-to-all send/receive pair (6·B·S·Dl); ring
 *     attention adds the partial output and two LSE vectors, and the K/V of every ring member
 *     (allgather, as diffusers) or two double-buffered chunks each of K and V (p2p); counted in
 *     the SDPA phases.
 *   bf16 on the CPU: each phase also holds the float32 copies its op makes (element-wise ops and
 *     attention upcast their operands and output; a GEMM does too unless oneDNN's native bf16
 *     matmul runs it), and the largest phase with its copies is the peak.
 *
 * The other engines' layouts and FLUX.2's reference images (the request's last fields; fs_estimate.c
 * lists what each allocates): --text replicated puts every text token on each sequence-parallel
 * rank and runs the joint attention path (its slices, copies and text all-gather); --pad pads the
 * Ulysses blocks and ring chunks to the longest (ring: padded copies; Ulysses: within the 6·B·S·Dl
 * above); true CFG adds the negative prompt, the first call's velocity and the second call's
 * records; --cfg-parallel runs one call per rank and exchanges the velocities; --cfg-batched one
 * forward of batch 2B; the KV cache runs step 0 on [reference; noise] and keeps every block's
 * reference K and V.
 *
 * The dump estimate is exact: the element count of every dataset one step records (checked in
 * tests/test_estimate.c against golden/default-fp64.h5, and against real dumps with true CFG and
 * the KV cache), times es. With the KV cache dump_step_bytes is step 0's, the largest. */
#ifndef FS_ESTIMATE_H
#define FS_ESTIMATE_H

#include "fs_config.h"

/* Limits on the run's sizes that hold whatever the config, so that no token or batch count can
 * overflow an int anywhere downstream (the model indexes tokens in int; B·(Si + St) <= 2^29) and
 * positions stay exact in float32 (diffusers casts the ids to float: exact up to 2^24). 2^22
 * image tokens is a 32768 x 32768 pixel image, 1024 times FLUX.1's 1024^2 (4096 tokens); 2^22
 * text tokens is 8192 times T5's 512. Anything larger is a typo, and is refused before any
 * allocation (flux-sim's --grid, --txt-len and --batch; a replayed dump's shapes). */
#define FS_MAX_BATCH 64                 /* time_text_embed keeps per-sample scalars on the stack */
#define FS_MAX_IMG_TOKENS (1 << 22)
#define FS_MAX_TXT_TOKENS (1 << 22)

typedef struct fs_estimate_req {
    const fs_config *cfg;
    int dtype_size;           /* 2 (bf16 storage), 4 (fp32) or 8 (fp64) */
    int batch;
    int64_t img_tokens;       /* global counts */
    int64_t txt_tokens;
    int steps;
    int tp, ulysses, ring;    /* degrees; 0 means 1 */
    int ring_p2p;             /* --ring-rotate p2p (two K/V chunks instead of all of them) */
    int threads;              /* attention threads of this rank; 0: the online CPUs */
    int full_weights;         /* this rank holds unsharded weights (tp 1, or rank 0 of an in-job --check) */
    int check;                /* --check (in this job or against a saved dump) */
    int check_in_job;         /* --check without =REF: rank 0 keeps every reference tensor of every step */
    int recording;            /* --dump or --check in a parallel run: rank 0 assembles global tensors */
    int ranks_per_machine;    /* ranks sharing this machine's memory; 0 means 1 */
    /* Where the sizes came from, so a refusal names the option that drove it. */
    const char *config_src;   /* the --config argument (preset or file), or NULL for the default */
    const char *inputs_src;   /* the --inputs dump the tokens and batch were replayed from, or NULL */
    int grid_h, grid_w;       /* --grid, when the inputs were generated */
    const char *dump_path;    /* --dump, for the free-space check (NULL: no dump) */
    int dump_compressed;      /* --dump-compress > 0: the size is not known in advance; no disk check */
    int stream;               /* weights streamed block by block: 1 on, 0 off, -1 auto (on above
                                 FS_STREAM_AUTO_BYTES of block parameters, as the CLI decides) */
    int steps_recorded;       /* --dump-steps: steps recorded (0: all) */
    int modules_narrowed;     /* --dump-modules: the recorded volume is that of the modules matched,
                                 not estimated (only latents_in/out are counted) */
    int ckpt_dtype_size;      /* weights read from a checkpoint stored in this element size (2: BF16,
                                 as FLUX.1 ships); 0: synthetic */
    int views_converted;      /* set by the estimate itself for the matched float64 truth of an in-job
                                 bf16 --check: its weights are made in bf16 as views of the
                                 checkpoint and converted, so the pages of the parameter being
                                 converted are mapped meanwhile (dropped after it) */
    uint64_t baseline_bytes;  /* the process itself (libraries, MPI, OpenBLAS and HDF5 buffers),
                                 added to rank_bytes; FS_ESTIMATE_BASELINE for flux-sim */
    /* The other engines' layouts (issue 20) and FLUX.2's reference images (issue 19); all 0: none,
     * and the estimate is the one above. fs_estimate.c says what each allocates. */
    int text_replicated;      /* --text replicated: every SP rank holds all text tokens */
    int pad;                  /* --pad: 0 none, 1 mask, 2 nomask (padded Ulysses blocks and ring chunks) */
    int true_cfg;             /* true CFG: a second transformer call per step, on the negative prompt */
    int64_t neg_txt_tokens;   /* the negative prompt's text tokens (with true_cfg) */
    int cfg_parallel;         /* --cfg-parallel: this rank runs one of the two calls (tp/ulysses/ring: a group's) */
    int cfg_batched;          /* --cfg-batched: both calls as one forward of batch 2B */
    int records;              /* a recorder runs on this rank (--dump, --dump-per-rank, --check): under
                                 --cfg-parallel and --cfg-batched one call's records of a step are kept */
    int64_t ref_tokens;       /* FLUX.2 KV cache: reference tokens (step 0 runs on [reference; noise],
                                 every block keeps their K and V for the later steps) */
} fs_estimate_req;

/* Resident memory of a flux-sim rank before it allocates anything of the model: the binary, libc,
 * libgomp, OpenBLAS, HDF5 and Open MPI. Measured (maximum RSS, /usr/bin/time) on Debian 12 with
 * the `tiny` preset at 2x2 + 8 tokens, 1 step: 27-30 MiB per rank under mpirun -np 1 and 2,
 * 34 MiB single-process with 2 threads (docs/scale.md). */
#define FS_ESTIMATE_BASELINE ((uint64_t)32 << 20)

/* Calls and bytes of one kind of collective, per rank, per denoising step. */
typedef struct fs_estimate_coll {
    uint64_t calls;
    uint64_t bytes;           /* this rank's payload: sent (all-reduce: its buffer once) */
} fs_estimate_coll;

typedef struct fs_estimate {
    int64_t params;               /* whole model (fs_config_num_params) */
    int64_t tokens_rank;          /* joint tokens this rank holds (S above) */
    uint64_t weight_bytes;        /* this rank's weights */
    uint64_t input_bytes;         /* fs_inputs (every rank holds them whole) + the sampler's latents */
    uint64_t act_persistent_bytes;/* residual streams, ids, RoPE tables */
    uint64_t act_double_bytes;    /* peak of one double block, on top of the persistent part */
    uint64_t act_single_bytes;    /* peak of one single block, on top of the persistent part */
    uint64_t attn_scratch_bytes;  /* score blocks + sequence-parallel buffers */
    uint64_t act_peak_bytes;      /* persistent + the larger block peak (scratch included) */
    uint64_t check_ref_bytes;     /* in-job --check reference on rank 0 */
    uint64_t gather_bytes;        /* rank 0 assembling one global tensor (parallel recording) */
    uint64_t dump_step_bytes;     /* datasets of one step of a full dump (the KV cache: step 0's, the largest) */
    uint64_t dump_bytes;          /* the whole dump: every step + /inputs + /final */
    uint64_t truth_ref_bytes;     /* bf16 in-job --check: the matched float64 truth rank 0 keeps */
    uint64_t check_run_bytes;     /* in-job --check: the larger of rank 0's single-rank runs before the
                                     parallel one (the reference in the run dtype, every token and
                                     the whole width; bf16: the matched float64 truth), each alone */
    uint64_t rank_bytes;          /* the busiest rank: baseline + weights + staging + inputs + act_peak + check_ref + gather;
                                     in-job --check, rank 0: the largest of its phases (see fs_estimate.c) */
    int streamed;                 /* the weights are streamed (r->stream, auto resolved) */
    uint64_t weight_resident_bytes; /* every parameter of this rank's shard held at once (--stream off) */
    uint64_t block_weight_bytes;  /* the largest block's shard: what streaming holds beyond the embedders */
    uint64_t staging_bytes;       /* the checkpoint pages of the tensor being decoded (the largest) */
    uint64_t bf16_scratch_bytes;  /* bf16 on the CPU: float32 copies a kernel makes (largest Linear) */
    uint64_t device_bytes;        /* a GPU rank of the same layout and dtype holding every weight (the
                                     diffusers way): weight_resident + activations, no CPU scratch */
    double flops_step_rank;       /* matmul FLOPs of one step on this rank (Linear + attention) */
    double flops_step;            /* ... of the whole job (every rank) */
    fs_estimate_coll allreduce;   /* TP: one per row-parallel Linear (to_out, ff, proj_out, ...) */
    fs_estimate_coll alltoall;    /* Ulysses: q, k, v to head shards and the output back */
    fs_estimate_coll ring;        /* ring: K and V of every other member (allgather or p2p steps) */
    fs_estimate_coll text_gather; /* --text replicated under Ulysses: the text rows' output heads, all-gathered */
    fs_estimate_coll cfg_gather;  /* --cfg-parallel: the noise predictions, all-gathered over the CFG pair */
    uint64_t kv_cache_bytes;      /* FLUX.2 reference images: every block's cached K and V (in act_persistent) */
    uint64_t cfg_kept_bytes;      /* --cfg-parallel / --cfg-batched with a recorder: one call's records of a step,
                                     kept as host copies until the step's records are replayed */
} fs_estimate;

/* Fills *out. FS_E_INPUT when the request itself is invalid (config rejected by
 * fs_config_validate, batch < 1, negative tokens, degrees < 0, dtype size not 2, 4 or 8). Sums and
 * products saturate at UINT64_MAX instead of wrapping. */
int fs_estimate_compute(const fs_estimate_req *r, fs_estimate *out, fs_err *e);

/* Physical memory of this machine (sysconf), 0 if unknown. */
uint64_t fs_estimate_phys_mem(void);

/* The memory this process may use: the least of the physical memory, `ulimit -v` (RLIMIT_AS),
 * `ulimit -d` (RLIMIT_DATA) and the cgroup v2 limit (/sys/fs/cgroup/memory.max). `what` receives
 * the phrase the refusal ends with: "this machine has", "ulimit -v allows", "ulimit -d allows",
 * "the cgroup memory limit is". 0 if nothing is known. */
uint64_t fs_estimate_mem_limit(char *what, size_t n);

/* The refusal itself, with the memory given (for tests): FS_E_INPUT when est->rank_bytes times
 * the ranks sharing the machine exceeds mem_bytes, or the uncompressed dump exceeds disk_free
 * (UINT64_MAX: unknown / not checked). The one line names the option behind the largest term, e.g.
 *   --grid 2000x2000: 4,000,000 image tokens need ~1.1 TiB per rank for activations; this machine has 24 GiB
 * mem_bytes 0 means unknown: no memory check. mem_what: the phrase before the amount (NULL:
 * "this machine has"). */
int fs_estimate_check(const fs_estimate_req *r, const fs_estimate *est, uint64_t mem_bytes, const char *mem_what,
                      uint64_t disk_free, fs_err *e);

/* Free bytes of the file system that will hold `path` (its directory); UINT64_MAX if unknown. */
uint64_t fs_estimate_disk_free(const char *path);

/* compute + check against fs_estimate_mem_limit() and the free space of the dump's directory:
 * the one call the CLI makes before allocating. */
int fs_estimate_refuse(const fs_estimate_req *r, fs_estimate *out, fs_err *e);

/* "1.2 GiB" (binary units, one decimal; bytes below 1 KiB as "512 B"); UINT64_MAX, what a
 * saturated sum or product gives, as "more than 16 EiB". */
const char *fs_estimate_bytes_str(uint64_t n, char *buf, size_t len);

#endif
