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
/* out[i] = fs_rng_normal(key, first + i) for i < n, bit-identical, about twice as fast. */
void fs_rng_normal_fill(uint64_t key, uint64_t first, int64_t n, double *out);

#endif
