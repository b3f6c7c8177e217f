/* fs_rng.h — counter-based random numbers keyed by (seed, tensor name, element index).
 *
 * Why counter-based: element i of tensor "transformer_blocks.3.attn.to_q.weight" is a pure
 * function of (seed, name, i), so a rank that owns rows [a, b) of that weight generates exactly
 * its shard, bit-identical to the same rows of the full tensor, without materialising the rest.
 * The mixer is SplitMix64's finaliser applied twice (a stateless hash with full avalanche);
 * normals come from Box-Muller on two 53-bit uniforms of counter i/2: elements 2k and 2k+1
 * are the cos and sin outputs of the same pair, so bulk generation pays one log/sqrt/sincos per
 * two elements while any single element stays addressable. */
#ifndef FS_RNG_H
#define FS_RNG_H

#include <stdint.h>

/* Stream key of (seed, name): FNV-1a of the name mixed with the seed. */
uint64_t fs_rng_key(uint64_t seed, const char *name);
/* Uniform in (0, 1), never 0 or 1. */
double fs_rng_uniform(uint64_t key, uint64_t index, uint32_t lane);
/* Standard normal for element `index` of the stream. */
double fs_rng_normal(uint64_t key, uint64_t index);
/* out[i] = fs_rng_normal(key, first + i) for i < n, bit-identical. Takes the vectorised path of
 * fs_rng_fast.c when it is enabled (fs_rng_fast_enabled), else fs_rng_normal_fill_scalar. */
void fs_rng_normal_fill(uint64_t key, uint64_t first, int64_t n, double *out);
/* The libm path (one log/sqrt/sincos per pair), about twice as fast as element by element.
 * Kept callable for comparisons (tools/bench_synth.c, tests/test_rng.c). */
void fs_rng_normal_fill_scalar(uint64_t key, uint64_t first, int64_t n, double *out);

/* ---- fs_rng_fast.c: the AVX2+FMA transcription of glibc's log/sincos (see that file) ---- */
/* 1 when the fast path is in use: x86-64 CPU with AVX2 and FMA, glibc's sin/cos table found in
 * this process's libm, and the start-up self-test against libm passed; FLUX_SIM_SCALAR_RNG set in
 * the environment forces 0. Decided once per process, thread-safe. */
int fs_rng_fast_enabled(void);
/* "avx512", "avx2" or "libm": which kernel fs_rng_normal_fill runs (FLUX_SIM_RNG_NO_AVX512 set
 * in the environment keeps it at avx2). */
const char *fs_rng_fast_isa(void);
/* Pairs k0 .. k0+npairs-1: out[2j] = fs_rng_normal(key, 2(k0+j)), out[2j+1] = the odd element.
 * Returns -1 (out untouched) when the fast path is not enabled. Thread-safe. */
int fs_rng_fast_pairs(uint64_t key, uint64_t k0, int64_t npairs, double *out);
/* The self-test, with n_random extra random uniform pairs after the branch probes: counts
 * Box-Muller outputs that differ in any bit from scalar libm. Returns -1 when the fast path
 * cannot run here (then *mismatches is 0). For tests. */
int fs_rng_fast_check(uint64_t n_random, uint64_t seed, uint64_t *mismatches);

#endif
