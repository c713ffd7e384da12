/* gelu.c — GELU, tanh approximation (Hendrycks & Gimpel 2016, as GPT-2 and PyTorch's
 * approximate="tanh"):
 *   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3).
 * Computed through the identity 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e^{-2u}), so
 * gelu(x) = x s with s = sigmoid(2u): one exp (cpu_common.h, vectorised), no tanh call, and no
 * cancellation for large |u|.
 *
 * Backward: dinp OVERWRITTEN (there are no parameters). With s as above,
 *   d gelu / dx = s + x * d s/dx = s + x * 2 s (1 - s) * du/dx,
 *   du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
 * (sech^2(u) = 4 s (1 - s)). Subnormal results are flushed to 0 (cpu_common.h says why:
 * gelu(x) underflows for x below about -9). Elementwise, so out/dinp may alias inp/dout.
 * OpenMP splits the range into fixed chunks; each chunk runs an ISA-specific vectorised
 * loop.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f
enum { GELU_CHUNK = 8192 };

LOOM_CPU_BODY gelu_forward_range_body(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        const float u = GELU_K * (x + GELU_A * x * x * x);
        out[i] = loom_cpu_flush(x / (1.0f + loom_cpu_expf(-2.0f * u)));
    }
}
LOOM_CPU_VARIANTS(gelu_forward_range, (float *out, const float *inp, size_t n), (out, inp, n))

LOOM_CPU_BODY gelu_backward_range_body(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        const float u = GELU_K * (x + GELU_A * x * x * x);
        const float s = 1.0f / (1.0f + loom_cpu_expf(-2.0f * u));
        const float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        dinp[i] = loom_cpu_flush((s + x * 2.0f * s * (1.0f - s) * du) * dout[i]);
    }
}
LOOM_CPU_VARIANTS(gelu_backward_range, (float *dinp, const float *inp, const float *dout, size_t n),
                  (dinp, inp, dout, n))

void loom_cpu_gelu_forward(float *out, const float *inp, size_t n)
{
    /* out (n), inp (n) */
    const size_t nchunk = (n + GELU_CHUNK - 1) / GELU_CHUNK;
#pragma omp parallel for schedule(static) if (n > LOOM_CPU_PAR_MIN)
    for (size_t c = 0; c < nchunk; c++) {
        const size_t i0 = c * GELU_CHUNK, len = n - i0 < GELU_CHUNK ? n - i0 : GELU_CHUNK;
        gelu_forward_range(out + i0, inp + i0, len);
    }
}

void loom_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    /* dinp (n) =, inp (n), dout (n) */
    const size_t nchunk = (n + GELU_CHUNK - 1) / GELU_CHUNK;
#pragma omp parallel for schedule(static) if (n > LOOM_CPU_PAR_MIN)
    for (size_t c = 0; c < nchunk; c++) {
        const size_t i0 = c * GELU_CHUNK, len = n - i0 < GELU_CHUNK ? n - i0 : GELU_CHUNK;
        gelu_backward_range(dinp + i0, inp + i0, dout + i0, len);
    }
}
