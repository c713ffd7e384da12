/* residual.c — the residual connection: out = a + b, and acc += x, its gradient joining
 * the main path.
 *
 * No parameters. residual_forward OVERWRITES out (which may alias a or b); accumulate ADDS
 * into acc (it is the "+=" of a gradient that arrives along two paths). Elementwise and
 * memory-bound: OpenMP splits the range, the compiler vectorises each part.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

void loom_cpu_residual_forward(float *out, const float *a, const float *b, size_t n)
{
    /* out (n) =, a (n), b (n) */
#pragma omp parallel for simd schedule(static) if (n > LOOM_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void loom_cpu_accumulate(float *acc, const float *x, size_t n)
{
    /* acc (n) +=, x (n) */
#pragma omp parallel for simd schedule(static) if (n > LOOM_CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        acc[i] += x[i];
}
