/* swiglu.c — the SwiGLU gate (Shazeer 2020; Llama's MLP: down(silu(gate x) * up x)):
 *   out[r,j] = silu(g) * u,  g = inp[r,j], u = inp[r,F+j],  silu(g) = g sigmoid(g),
 * over rows of inp (rows, 2F) = [gate | up] (the fused gate and up projections' output;
 * under tensor parallelism each rank's F columns of both).
 *
 * Backward: dinp (rows, 2F) OVERWRITTEN (no parameters). With s = sigmoid(g),
 *   d/dg = dout u s (1 + g (1 - s)),  d/du = dout silu(g).
 * sigmoid through loom_cpu_expf (vectorised; e^{-g} overflows to inf for g < -88, giving
 * s = 0 exactly, the right limit). Subnormal results flushed to 0 (cpu_common.h).
 * Rows are independent: the same bits for any thread count.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

LOOM_CPU_BODY swiglu_row_forward_body(float *restrict o, const float *restrict in, int F)
{
    for (int j = 0; j < F; j++) {
        const float g = in[j], u = in[F + j];
        const float s = 1.0f / (1.0f + loom_cpu_expf(-g));
        o[j] = loom_cpu_flush(g * s * u);
    }
}
LOOM_CPU_VARIANTS(swiglu_row_forward, (float *restrict o, const float *restrict in, int F),
                  (o, in, F))

LOOM_CPU_BODY swiglu_row_backward_body(float *restrict d, const float *restrict in,
                                       const float *restrict dout, int F)
{
    for (int j = 0; j < F; j++) {
        const float g = in[j], u = in[F + j];
        const float s = 1.0f / (1.0f + loom_cpu_expf(-g));
        d[j] = loom_cpu_flush(dout[j] * u * s * (1.0f + g * (1.0f - s)));
        d[F + j] = loom_cpu_flush(dout[j] * g * s);
    }
}
LOOM_CPU_VARIANTS(swiglu_row_backward,
                  (float *restrict d, const float *restrict in, const float *restrict dout, int F),
                  (d, in, dout, F))

void loom_cpu_swiglu_forward(float *out, const float *inp, size_t rows, int F)
{
    /* out (rows,F), inp (rows,2F) */
#pragma omp parallel for schedule(static) if (rows * F > LOOM_CPU_PAR_MIN)
    for (size_t r = 0; r < rows; r++)
        swiglu_row_forward(out + r * F, inp + r * 2 * F, F);
}

void loom_cpu_swiglu_backward(float *dinp, const float *inp, const float *dout, size_t rows, int F)
{
    /* dinp (rows,2F) =, inp (rows,2F), dout (rows,F) */
#pragma omp parallel for schedule(static) if (rows * F > LOOM_CPU_PAR_MIN)
    for (size_t r = 0; r < rows; r++)
        swiglu_row_backward(dinp + r * 2 * F, inp + r * 2 * F, dout + r * F, F);
}
