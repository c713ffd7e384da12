/* rng.c — Box-Muller over the counter-based uniforms of rng.h. */
#include "rng.h"

#include <math.h>

double loom_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    /* Two uniforms per normal, from indices 2i and 2i+1 of the stream; one of the pair is
     * discarded so that element i depends on nothing but i. */
    double u1 = loom_rng_uniform(seed, stream, 2 * index);
    double u2 = loom_rng_uniform(seed, stream, 2 * index + 1);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}
