/* rng.h — counter-based random numbers keyed by global indices.
 *
 * Every random draw in loom is a pure function of (seed, stream, index): weight init is
 * keyed by (seed, parameter name, logical element index), so a parameter gets the same
 * values whatever slice a rank holds — the property canonical mode needs. The mixer is
 * SplitMix64's finaliser (Steele, Lea & Flood 2014); normals use Box-Muller.
 */
#ifndef LOOM_CORE_RNG_H
#define LOOM_CORE_RNG_H

#include <stdint.h>

static inline uint64_t loom_rng_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A stream id from a string (FNV-1a then mixed). */
static inline uint64_t loom_rng_stream(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return loom_rng_mix(h);
}

/* Uniform in (0, 1], 53 bits. */
static inline double loom_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t r = loom_rng_mix(loom_rng_mix(seed ^ stream) + index);
    return ((r >> 11) + 1) * (1.0 / 9007199254740992.0);
}

/* Standard normal for (seed, stream, index). */
double loom_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

#endif
