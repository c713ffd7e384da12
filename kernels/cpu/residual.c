/* residual.c — the residual connection: out = a + b, and acc += x, its gradient joining
 * the main path.
 *
 * No parameters. residual_forward OVERWRITES out (which may alias a or b); accumulate ADDS
 * into acc (it is the "+=" of a gradient that arrives along two paths). Elementwise and
 * memory-bound: OpenMP splits the range, the compiler vectorises each part.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <omp.h>
#include <string.h>

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

/* Below this many bytes one memset: a fork costs more than the second core saves. */
#define ZERO_PAR_BYTES ((size_t)1 << 20)

void loom_cpu_zero(void *p, size_t bytes)
{
    /* p (bytes) = 0. The backend's zero op: canonical mode's gradient tree (grad_sync.c)
     * zeroes a whole gradient buffer twice a step before adding into it, which on one
     * thread left the other core idle (a memset of the small config's 120 MB gradient,
     * ~4 ms) and, being longer than libgomp's bounded spin, let the other thread fall
     * asleep before the accumulate that follows. Memory, not bits: any split is the same. */
    if (bytes < ZERO_PAR_BYTES || omp_in_parallel()) {
        memset(p, 0, bytes);
        return;
    }
    const size_t pages = (bytes + 4095) / 4096;
#pragma omp parallel
    {
        const size_t nth = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
        const size_t s = pages * id / nth * 4096;
        const size_t e = id + 1 == nth ? bytes : pages * (id + 1) / nth * 4096;
        if (e > s)
            memset((char *)p + s, 0, e - s);
    }
}
