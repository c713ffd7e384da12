/* distill.cu — knowledge distillation's loss rows (backend.h kd_rows): per row,
 * T^2 KL(p_t || p_s) with p = softmax(z / T) over V columns, and its gradient
 * scale * T (p_s - p_t), for a student and a teacher whose logits are both in device memory.
 *
 * The bits are core/model/gpt_distill.c's loom_kd_rows' where exp and log are (the
 * emulation's are the host's libm, so there they are its bits; nvcc's double exp and log are
 * within an ulp, not the same functions): one thread per row walks the columns in the
 * core's order, in double, every add and multiply that could meet another rounded alone
 * (__dadd_rn, __dmul_rn: nvcc contracts a * b + c into an FMA, the core's C does not). The
 * core keeps the two log-softmax rows in memory; here each entry z / T - lse is recomputed
 * where it is read, the same expression, so the same value. One thread per row is
 * R-way parallel, correct and slow for long rows; its speed is unmeasured.
 */
#include "kernels.cuh"

#include <math.h>

/* log-sum-exp of z / T over V columns (the core's log_softmax_t up to its last line). */
__device__ static double kd_lse(const float *z, int V, double T)
{
    double max = -INFINITY;
    for (int j = 0; j < V; j++)
        max = z[j] / T > max ? z[j] / T : max;
    double sum = 0.0;
    for (int j = 0; j < V; j++)
        sum = __dadd_rn(sum, exp(z[j] / T - max));
    return max + log(sum);
}

__global__ void kd_rows_kernel(const float *zs, size_t s_stride, const float *zt,
                               size_t t_stride, size_t R, int V, float T, float scale,
                               double *loss, float *grad)
{
    GRID_STRIDE(r, R)
    {
        const float *s = zs + r * s_stride, *t = zt + r * t_stride;
        const double Td = T, lse_s = kd_lse(s, V, Td), lse_t = kd_lse(t, V, Td);
        double kl = 0.0;
        for (int j = 0; j < V; j++) { /* a cached top-k row is -inf elsewhere: p_t = 0 */
            const double lt = t[j] / Td - lse_t, ls = s[j] / Td - lse_s, pt = exp(lt);
            if (pt > 0.0)
                kl = __dadd_rn(kl, __dmul_rn(pt, __dsub_rn(lt, ls)));
        }
        loss[r] = __dmul_rn(__dmul_rn(Td, Td), kl);
        if (!grad)
            continue;
        float *g = grad + r * s_stride;
        const double st = __dmul_rn((double)scale, Td);
        for (int j = 0; j < V; j++) {
            const double lt = t[j] / Td - lse_t, ls = s[j] / Td - lse_s;
            g[j] = (float)__dmul_rn(st, __dsub_rn(exp(ls), exp(lt)));
        }
        for (size_t j = (size_t)V; j < s_stride; j++)
            g[j] = 0.0f;
    }
}

extern "C" void loom_cuda_kd_rows(const float *zs, size_t s_stride, const float *zt,
                                  size_t t_stride, size_t R, int V, float T, float scale,
                                  double *loss, float *grad)
{
    if (R == 0)
        return;
    LOOM_CUDA_LAUNCH("kd_rows", kd_rows_kernel, loom_cuda_blocks(R), LOOM_CUDA_THREADS, 0, zs,
                     s_stride, zt, t_stride, R, V, T, scale, loss, grad);
}
