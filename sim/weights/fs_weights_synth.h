/* fs_weights_synth.h — synthetic weights, element by element: the deterministic values every
 * synthetic run, shard and checkpoint writer (tools/gen/make_checkpoint.c) agrees on.
 *
 * Element i of parameter `name` is fs_rng_normal(fs_rng_key(seed, name), i) scaled to the
 * magnitudes of ../shared/reference/README.md (Linear weight ~ N(0, 1/in), bias ~ N(0, 0.05^2),
 * RMSNorm weight ~ 1 + N(0, 0.1^2)). Below fs_weights, which builds whole models and shards on
 * it; it knows only a parameter's description, never a model. */
#ifndef FS_WEIGHTS_SYNTH_H
#define FS_WEIGHTS_SYNTH_H

#include <stdint.h>

#include "fs_config.h"

/* The value of element `index` of synthetic parameter `d` (what fs_weights_synthetic stores,
 * before rounding to the run dtype). For sharded generation and tests. */
double fs_weights_synthetic_value(const fs_param_desc *d, uint64_t seed, int64_t index);
/* Elements [first, first + count) of synthetic parameter `d` as a `dt` run stores them (float:
 * the value rounded to nearest even), into out (float or double): bit-identical to
 * fs_weights_synthetic_value element by element. Vectorised (fs_rng.c) and OpenMP-threaded
 * over blocks (serial inside a caller's parallel region). For generating without holding a whole
 * tensor (tools/gen/make_checkpoint.c) and for fs_weights_synthetic itself. */
void fs_weights_synthetic_fill(const fs_param_desc *d, uint64_t seed, int64_t first, int64_t count, fs_dtype dt,
                               void *out);
/* The same values by the plain scalar loop (fs_rng_normal per element, one thread): the
 * reference for benchmarks and tests. */
void fs_weights_synthetic_fill_scalar(const fs_param_desc *d, uint64_t seed, int64_t first, int64_t count, fs_dtype dt,
                                      void *out);

#endif
