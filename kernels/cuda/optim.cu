/* optim.cu — the optimizer updates over device memory (backend.h: adamw_update,
 * sgd_update), called by the optimizer plugins' step_backend with the constants their
 * host step computes. Each kernel is its plugin's element loop (plugins/optim/adamw/adamw.c,
 * plugins/optim/sgd/sgd.c) operation for operation, with every multiply, add, divide and
 * square root an explicitly rounded intrinsic: nvcc would otherwise fuse a * b + c into one
 * FMA (one rounding instead of two), and the host plugins are built without contraction,
 * so this is what gives the host step's bits.
 */
#include "kernels.cuh"

#define MUL __fmul_rn
#define ADD __fadd_rn
#define SUB __fsub_rn
#define DIV __fdiv_rn

#define GRID_STRIDE(i, n)                                                                      \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                     \
         i += (size_t)gridDim.x * blockDim.x)

__global__ void adamw_kernel(float *p, const float *grad, float *m, float *v, size_t n,
                             loom_adamw_consts c)
{
    const int small_w = c.w < 0.5f; /* ATen lerp's two forms, as adamw.c */
    GRID_STRIDE(i, n) {
        const float g = MUL(c.gs, grad[i]);
        const float mi = small_w ? ADD(m[i], MUL(c.w, SUB(g, m[i])))
                                 : SUB(g, MUL(SUB(g, m[i]), c.one_minus_w));
        const float vi = ADD(MUL(v[i], c.b2), MUL(MUL(c.one_minus_b2, g), g));
        m[i] = mi;
        v[i] = vi;
        const float denom = ADD(DIV(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
        p[i] = SUB(MUL(p[i], c.decay), DIV(MUL(c.step_size, mi), denom));
    }
}

__global__ void sgd_kernel(float *p, const float *grad, float *b, size_t n, loom_sgd_consts c)
{
    GRID_STRIDE(i, n) {
        const float g = ADD(MUL(c.gs, grad[i]), MUL(c.wd, p[i]));
        if (c.mu == 0.0f) {
            p[i] = SUB(p[i], MUL(c.lr, g));
            continue;
        }
        const float bi = ADD(MUL(c.mu, b[i]), g);
        b[i] = bi;
        p[i] = SUB(p[i], MUL(c.lr, c.nesterov ? ADD(g, MUL(c.mu, bi)) : bi));
    }
}

extern "C" void loom_cuda_adamw_update(float *param, const float *grad, float *m, float *v,
                                       size_t n, const loom_adamw_consts *c)
{
    if (n)
        LOOM_CUDA_LAUNCH("adamw_update", adamw_kernel, loom_cuda_blocks(n), LOOM_CUDA_THREADS, 0,
                         param, grad, m, v, n, *c);
}

extern "C" void loom_cuda_sgd_update(float *param, const float *grad, float *buf, size_t n,
                                     const loom_sgd_consts *c)
{
    if (n)
        LOOM_CUDA_LAUNCH("sgd_update", sgd_kernel, loom_cuda_blocks(n), LOOM_CUDA_THREADS, 0,
                         param, grad, buf, n, *c);
}
