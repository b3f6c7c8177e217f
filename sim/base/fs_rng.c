/* fs_rng.c — counter-based normals, libm-free and exactly specified: the definition is in
 * fs_rng.h, its inline implementation in fs_rng_kernel.h (shared with fs_weights_synth.c);
 * tools/gen/fs_rng_ref.py is an independent numpy implementation. The scalar path (fs_rng_normal,
 * fs_rng_normal_fill_scalar) and the vector path (fs_rng_normal_fill) run the same inline
 * functions, so they agree bit for bit (tests/test_rng.c). */
#include "fs_rng.h"

#include "fs_rng_kernel.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RNG_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define RNG_CLONES
#endif

uint64_t fs_rng_key(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a 64 */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ULL;
    }
    return mix64(h ^ mix64(seed + 0x9e3779b97f4a7c15ULL));
}

double fs_rng_uniform(uint64_t key, uint64_t index, uint32_t lane)
{
    /* 53 random bits -> (0, 1): add half an ulp so 0 is impossible, and 1 cannot be reached. */
    return lane_v(pair_hash(key, index * RNG_GOLDEN), lane) * 0x1p-53;
}

/* The scalar reference: one pair per call, never inlined into a loop (so never vectorised). */
__attribute__((noinline)) static void pair_scalar(uint64_t key, uint64_t k, double *even, double *odd)
{
    rng_pair(key, k * RNG_GOLDEN, even, odd);
}

double fs_rng_normal(uint64_t key, uint64_t index)
{
    double e, o;
    pair_scalar(key, index >> 1, &e, &o);
    return (index & 1) ? o : e;
}

void fs_rng_normal_fill_scalar(uint64_t key, uint64_t first, int64_t n, double *out)
{
    for (int64_t i = 0; i < n; i++) out[i] = fs_rng_normal(key, first + (uint64_t)i);
}

double fs_rng_log(double u)
{
    /* rng_log_v works on v = u * 2^53 (exact for a normal u >= 2^-969) */
    return rng_log_v(u * 0x1p53);
}
void fs_rng_sincos2pi(double u, double *c, double *s) { rng_sincos2pi_t8(8.0 * u, c, s); }

/* Pairs k0 .. k0+np-1 into out[0 .. 2np): the vector loop (AVX-512 / AVX2 / SSE4.2 clones). */
RNG_CLONES static void pairs_vec(uint64_t key, uint64_t k0, int64_t np, double *restrict out)
{
    const uint64_t kg0 = k0 * RNG_GOLDEN;
#pragma omp simd
    for (int64_t j = 0; j < np; j++) {
        double e, o;
        rng_pair(key, kg0 + (uint64_t)j * RNG_GOLDEN, &e, &o); /* an induction variable: no multiply */
        out[2 * j] = e;
        out[2 * j + 1] = o;
    }
}

void fs_rng_normal_fill(uint64_t key, uint64_t first, int64_t n, double *out)
{
    if (n <= 0) return;
    /* Whole pairs go straight into out; a half pair at either end (odd first, odd end) is
     * generated whole into a scratch pair and the wanted half copied. */
    int64_t i = 0;
    double two[2];
    if (first & 1) {
        pairs_vec(key, first >> 1, 1, two);
        out[i++] = two[1];
    }
    const int64_t np = (n - i) / 2;
    if (np) pairs_vec(key, (first + (uint64_t)i) >> 1, np, out + i);
    i += 2 * np;
    if (i < n) {
        pairs_vec(key, (first + (uint64_t)i) >> 1, 1, two);
        out[i] = two[0];
    }
}

const char *fs_rng_isa(void)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return "avx512";
    if (__builtin_cpu_supports("avx2")) return "avx2";
    return "sse4.2";
#else
    return "portable";
#endif
}
