#include "fs_rng.h"

#include <math.h>
#include <stdint.h>

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

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
    uint64_t x = mix64(mix64(key ^ (index * 0x9e3779b97f4a7c15ULL)) + lane * 0xd1b54a32d192ed03ULL + 1);
    /* 53 random bits -> (0, 1): add half an ulp so 0 is impossible, and 1 cannot be reached. */
    return ((double)(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static inline void pair(uint64_t key, uint64_t k, double *r, double *theta)
{
    double u1 = fs_rng_uniform(key, k, 0), u2 = fs_rng_uniform(key, k, 1);
    *r = sqrt(-2.0 * log(u1));
    *theta = 6.283185307179586476925 * u2;
}

double fs_rng_normal(uint64_t key, uint64_t index)
{
    double r, th;
    pair(key, index >> 1, &r, &th);
    return r * ((index & 1) ? sin(th) : cos(th));
}

void fs_rng_normal_fill_scalar(uint64_t key, uint64_t first, int64_t n, double *out)
{
    int64_t i = 0;
    if (n > 0 && (first & 1)) { /* odd start: the sin half of a pair */
        out[i++] = fs_rng_normal(key, first);
    }
    for (; i + 1 < n; i += 2) {
        double r, th, s, c;
        pair(key, (first + (uint64_t)i) >> 1, &r, &th);
        sincos(th, &s, &c);
        out[i] = r * c;
        out[i + 1] = r * s;
    }
    if (i < n) out[i] = fs_rng_normal(key, first + (uint64_t)i);
}

void fs_rng_normal_fill(uint64_t key, uint64_t first, int64_t n, double *out)
{
    if (n <= 0) return;
    if (!fs_rng_fast_enabled()) {
        fs_rng_normal_fill_scalar(key, first, n, out);
        return;
    }
    /* Whole pairs go straight into out; a half pair at either end (odd first, odd end) is
     * generated whole into a scratch pair and the wanted half copied. */
    int64_t i = 0;
    double two[2];
    if (first & 1) {
        fs_rng_fast_pairs(key, first >> 1, 1, two);
        out[i++] = two[1];
    }
    const int64_t npairs = (n - i) / 2;
    if (npairs) fs_rng_fast_pairs(key, (first + (uint64_t)i) >> 1, npairs, out + i);
    i += 2 * npairs;
    if (i < n) {
        fs_rng_fast_pairs(key, (first + (uint64_t)i) >> 1, 1, two);
        out[i] = two[0];
    }
}
