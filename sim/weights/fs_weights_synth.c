/* fs_weights_synth.c — synthetic weight values in bulk: the normals of fs_rng (its inline
 * kernel, fs_rng_kernel.h) generated and scaled in one vector loop, threaded over blocks.
 *
 * Bit-identity with fs_weights_synthetic_value (at the end of this file), which is the definition:
 *   Linear weight  z / sqrt((double)in)   (a division: z * (1/sqrt(in)) would differ)
 *   bias           0.05 * z
 *   RMSNorm weight 1.0 + 0.1 * z          (a multiply then an add: never an FMA)
 * then a cast to the run dtype (float: round to nearest even, as the scalar cast). This file is
 * compiled with -ffp-contract=off and without -ffast-math (Makefile), like fs_rng.c, so neither
 * the normals nor the RMSNorm multiply-add can be fused in any clone; every step is one correctly
 * rounded IEEE operation whatever the vector width. tests/test_rng.c checks the result against
 * fs_weights_synthetic_value and the scalar reference fs_weights_synthetic_fill_scalar. */
#include "fs_weights_synth.h"

#include <math.h>
#include <omp.h>

#include "fs_rng.h"
#include "fs_rng_kernel.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SYNTH_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define SYNTH_CLONES
#endif

/* Pairs k0 .. k0+np-1 of the stream, scaled, into out[0 .. 2np): one loop per (kind, dtype) so
 * that each vectorises; the normals never leave registers. */
#define PAIRS_LOOP(T, SCALE)                                                                        \
    do {                                                                                             \
        _Pragma("omp simd") for (int64_t j = 0; j < np; j++)                                         \
        {                                                                                            \
            double e, o;                                                                             \
            rng_pair(key, kg0 + (uint64_t)j * RNG_GOLDEN, &e, &o);                                   \
            out[2 * j] = (T)(SCALE(e));                                                              \
            out[2 * j + 1] = (T)(SCALE(o));                                                          \
        }                                                                                            \
    } while (0)
#define LINEAR(z) ((z) / s)
#define BIAS(z) (0.05 * (z))
#define RMS(z) (1.0 + 0.1 * (z))

SYNTH_CLONES static void pairs_f32(int kind, double s, uint64_t key, uint64_t k0, int64_t np, float *restrict out)
{
    const uint64_t kg0 = k0 * RNG_GOLDEN;
    switch (kind) {
    case FS_PARAM_LINEAR_W: PAIRS_LOOP(float, LINEAR); break;
    case FS_PARAM_BIAS: PAIRS_LOOP(float, BIAS); break;
    default: PAIRS_LOOP(float, RMS); break;
    }
}

SYNTH_CLONES static void pairs_f64(int kind, double s, uint64_t key, uint64_t k0, int64_t np, double *restrict out)
{
    const uint64_t kg0 = k0 * RNG_GOLDEN;
    switch (kind) {
    case FS_PARAM_LINEAR_W: PAIRS_LOOP(double, LINEAR); break;
    case FS_PARAM_BIAS: PAIRS_LOOP(double, BIAS); break;
    default: PAIRS_LOOP(double, RMS); break;
    }
}

/* 8 Ki elements per block (an even number): the unit of work of one thread. */
enum { SYNTH_BLOCK = 8192 };

/* Element i (global index) as a `dt` run stores it: the scalar definition, for the half pairs at
 * the ends of a block. */
static void one(const fs_param_desc *d, uint64_t seed, int64_t i, fs_dtype dt, void *out, int64_t at)
{
    const double v = fs_weights_synthetic_value(d, seed, i);
    if (dt == FS_F64) ((double *)out)[at] = v;
    else if (dt == FS_F32) ((float *)out)[at] = (float)v;
    else ((uint16_t *)out)[at] = fs_bf16_from_float((float)v);
}

void fs_weights_synthetic_fill(const fs_param_desc *d, uint64_t seed, int64_t first, int64_t count, fs_dtype dt,
                               void *out)
{
    if (count <= 0) return;
    const uint64_t key = fs_rng_key(seed, d->name);
    const double s = d->kind == FS_PARAM_LINEAR_W ? sqrt((double)d->shape[1]) : 0.0;
    const int64_t nblk = (count + SYNTH_BLOCK - 1) / SYNTH_BLOCK;
    /* Blocks are independent (the RNG is addressed by element), so any split over threads gives
     * the same values; dynamic scheduling keeps both threads busy when one of them shares its
     * core with other work. Serial when already inside a parallel region (a caller's threads). */
#pragma omp parallel for schedule(dynamic, 1) if (nblk > 1 && !omp_in_parallel())
    for (int64_t b = 0; b < nblk; b++) {
        const int64_t o = b * SYNTH_BLOCK, m = count - o < SYNTH_BLOCK ? count - o : SYNTH_BLOCK;
        const int64_t g0 = first + o; /* global index of the block's first element */
        int64_t i = 0;                /* block-relative */
        if (g0 & 1) one(d, seed, g0, dt, out, o + i++); /* the sin half of a pair */
        const int64_t np = (m - i) / 2;
        const uint64_t k0 = (uint64_t)(g0 + i) >> 1;
        if (np) {
            if (dt == FS_F64) pairs_f64(d->kind, s, key, k0, np, (double *)out + o + i);
            else if (dt == FS_F32) pairs_f32(d->kind, s, key, k0, np, (float *)out + o + i);
            else { /* bf16: what a bf16 run loads from a float32 checkpoint of these weights */
                float f[SYNTH_BLOCK];
                pairs_f32(d->kind, s, key, k0, np, f);
                for (int64_t k = 0; k < 2 * np; k++) ((uint16_t *)out)[o + i + k] = fs_bf16_from_float(f[k]);
            }
        }
        i += 2 * np;
        if (i < m) one(d, seed, g0 + i, dt, out, o + i); /* the cos half of a pair */
    }
}

/* A standard normal z scaled to the magnitudes of ../shared/reference/README.md. */
static double synthetic_scale(const fs_param_desc *d, double z)
{
    switch (d->kind) {
    case FS_PARAM_LINEAR_W: return z / sqrt((double)d->shape[1]);
    case FS_PARAM_BIAS: return 0.05 * z;
    case FS_PARAM_RMS_W: return 1.0 + 0.1 * z;
    }
    return 0;
}

double fs_weights_synthetic_value(const fs_param_desc *d, uint64_t seed, int64_t index)
{
    /* The key depends on the name only, never on the shape: a shard of rows [a, b) is the
     * same numbers whatever the world size. */
    return synthetic_scale(d, fs_rng_normal(fs_rng_key(seed, d->name), (uint64_t)index));
}

/* The scalar reference of fs_weights_synthetic_fill: fs_rng_normal element by element (the
 * plain scalar loop, fs_rng_normal_fill_scalar), the scale per element, one thread. What the
 * fast path is tested against (tests/test_rng.c, tools/bench/bench_synth.c). */
void fs_weights_synthetic_fill_scalar(const fs_param_desc *d, uint64_t seed, int64_t first, int64_t count, fs_dtype dt,
                                      void *out)
{
    enum { BLK = 4096 };
    double buf[BLK];
    const uint64_t key = fs_rng_key(seed, d->name);
    for (int64_t k0 = 0; k0 < count; k0 += BLK) {
        const int64_t m = count - k0 < BLK ? count - k0 : BLK;
        fs_rng_normal_fill_scalar(key, (uint64_t)(first + k0), m, buf);
        if (dt == FS_F64)
            for (int64_t k = 0; k < m; k++) ((double *)out)[k0 + k] = synthetic_scale(d, buf[k]);
        else if (dt == FS_BF16)
            for (int64_t k = 0; k < m; k++) ((uint16_t *)out)[k0 + k] = fs_bf16_from_float((float)synthetic_scale(d, buf[k]));
        else
            for (int64_t k = 0; k < m; k++) ((float *)out)[k0 + k] = (float)synthetic_scale(d, buf[k]);
    }
}
