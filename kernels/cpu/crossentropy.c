/* crossentropy.c — fused softmax + cross-entropy over the classifier's logits (llm.c's
 * fused classifier): one pass over each row gives the loss and, if asked, the gradient in
 * place of the logits, so the (BT, Vp) probabilities are never stored separately.
 *
 * Per row (logits x of Vp columns, the first V real, target y):
 *   m = max_{j<V} x_j,  S = sum_{j<V} e^{x_j - m}      (shifted: no overflow)
 *   loss = -log softmax(x)_y = log S + m - x_y
 *   if dloss != 0:  x_j <- dloss * (e^{x_j - m} / S - [j == y])  for j < V,
 *                   x_j <- 0                                       for V <= j < Vp.
 * The gradient OVERWRITES the logits (there are no parameters here); with dloss == 0 the
 * logits are left intact. A target outside [0, V) is ignored: loss 0, gradient row 0.
 * Gradient entries below FLT_MIN are flushed to 0 (they would slow the LM-head GEMMs that
 * read them; cpu_common.h says why).
 * Padded columns are never read, so their contents do not matter. Rows are independent
 * and run in parallel; e^x is cpu_common.h's vectorised expf.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <math.h>
#include <string.h>

/* One valid row: returns its loss; if dloss != 0 the row becomes its gradient. */
LOOM_CPU_CLONES static float ce_row(float *x, int y, float dloss, int V, int Vp)
{
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < V; j++)
        m = x[j] > m ? x[j] : m;
    const float xy = x[y];
    float s = 0.0f;
    if (dloss != 0.0f) {
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < V; j++) {
            const float e = loom_cpu_expf(x[j] - m);
            x[j] = e;
            s += e;
        }
        const float k = dloss / s;
#pragma omp simd
        for (int j = 0; j < V; j++)
            x[j] = loom_cpu_flush(x[j] * k); /* no subnormals into the LM-head GEMMs */
        x[y] -= dloss;
        memset(x + V, 0, (size_t)(Vp - V) * sizeof(float));
    } else {
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < V; j++)
            s += loom_cpu_expf(x[j] - m);
    }
    return logf(s) + (m - xy); /* m - xy first: small, and exact when close */
}

void loom_cpu_crossentropy_forward_backward(float *logits, float *losses, const int *targets,
                                            float dloss, int BT, int V, int Vp)
{
    /* logits (BT,Vp) in, gradient out if dloss != 0; losses (BT) =; targets (BT) */
#pragma omp parallel for schedule(static) if ((size_t)BT * V > LOOM_CPU_PAR_MIN)
    for (int i = 0; i < BT; i++) {
        float *x = logits + (size_t)i * Vp;
        const int y = targets[i];
        if (y >= 0 && y < V) {
            losses[i] = ce_row(x, y, dloss, V, Vp);
        } else {
            losses[i] = 0.0f;
            if (dloss != 0.0f)
                memset(x, 0, (size_t)Vp * sizeof(float));
        }
    }
}
