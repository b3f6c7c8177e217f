/* fs_weights_synth.c — synthetic weight values in bulk: fs_rng_normal_fill (vectorised, see
 * fs_rng_fast.c) plus the scaling of fs_weights_synthetic_value, threaded over blocks.
 *
 * Bit-identity with fs_weights_synthetic_value (fs_weights.c), which is the definition:
 *   Linear weight  z / sqrt((double)in)   (a division: z * (1/sqrt(in)) would differ)
 *   bias           0.05 * z
 *   RMSNorm weight 1.0 + 0.1 * z          (a multiply then an add: never an FMA)
 * then a cast to the run dtype (float: round to nearest even, as the scalar cast). This file is
 * compiled with -ffp-contract=off (Makefile) so the AVX2/AVX-512 clones below cannot fuse the
 * RMSNorm multiply-add; every other step is one correctly rounded IEEE operation whatever the
 * vector width. tests/test_rng.c checks the result against fs_weights_synthetic_value. */
#include "fs_weights.h"

#include <math.h>
#include <omp.h>

#include "fs_rng.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define SYNTH_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define SYNTH_CLONES
#endif

/* z -> stored value, one loop per (kind, dtype) so that each vectorises. */
SYNTH_CLONES static void scale_f32(int kind, double s, const double *restrict z, int64_t n, float *restrict out)
{
    switch (kind) {
    case FS_PARAM_LINEAR_W:
        for (int64_t k = 0; k < n; k++) out[k] = (float)(z[k] / s);
        break;
    case FS_PARAM_BIAS:
        for (int64_t k = 0; k < n; k++) out[k] = (float)(0.05 * z[k]);
        break;
    default:
        for (int64_t k = 0; k < n; k++) out[k] = (float)(1.0 + 0.1 * z[k]);
        break;
    }
}

SYNTH_CLONES static void scale_f64(int kind, double s, const double *restrict z, int64_t n, double *restrict out)
{
    switch (kind) {
    case FS_PARAM_LINEAR_W:
        for (int64_t k = 0; k < n; k++) out[k] = z[k] / s;
        break;
    case FS_PARAM_BIAS:
        for (int64_t k = 0; k < n; k++) out[k] = 0.05 * z[k];
        break;
    default:
        for (int64_t k = 0; k < n; k++) out[k] = 1.0 + 0.1 * z[k];
        break;
    }
}

/* 8 Ki elements: 64 KiB of normals per thread, in L2 between the generator and the scaling. */
enum { SYNTH_BLOCK = 8192 };

void fs_weights_synthetic_fill(const fs_param_desc *d, uint64_t seed, int64_t first, int64_t count, fs_dtype dt,
                               void *out)
{
    if (count <= 0) return;
    const uint64_t key = fs_rng_key(seed, d->name);
    const double s = d->kind == FS_PARAM_LINEAR_W ? sqrt((double)d->shape[1]) : 0.0;
    const int64_t nblk = (count + SYNTH_BLOCK - 1) / SYNTH_BLOCK;
    fs_rng_fast_enabled(); /* decide the RNG path once, before the threads start */
    /* Blocks are independent (the RNG is addressed by element), so any split over threads gives
     * the same values. Serial when already inside a parallel region (a caller's own threads). */
#pragma omp parallel for schedule(static) if (nblk > 1 && !omp_in_parallel())
    for (int64_t b = 0; b < nblk; b++) {
        double z[SYNTH_BLOCK];
        const int64_t o = b * SYNTH_BLOCK, m = count - o < SYNTH_BLOCK ? count - o : SYNTH_BLOCK;
        fs_rng_normal_fill(key, (uint64_t)(first + o), m, z);
        if (dt == FS_F64) scale_f64(d->kind, s, z, m, (double *)out + o);
        else if (dt == FS_F32) scale_f32(d->kind, s, z, m, (float *)out + o);
        else { /* bf16: what a bf16 run loads from a float32 checkpoint of these weights */
            float f[SYNTH_BLOCK];
            scale_f32(d->kind, s, z, m, f);
            for (int64_t k = 0; k < m; k++) ((uint16_t *)out)[o + k] = fs_bf16_from_float(f[k]);
        }
    }
}
