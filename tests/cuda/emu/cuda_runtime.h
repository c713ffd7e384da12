/* cuda_runtime.h (emulation) — CUDA C++'s kernel-side names over cuda_emu.cc's block
 * scheduler: every block's threads run as cooperative coroutines on one CPU thread,
 * switching at __syncthreads (and the shuffles and __syncthreads_or, built on it). Blocks
 * run one after another, so a __shared__ variable can be a plain static. Only what
 * kernels/cuda uses; the launch goes through LOOM_CUDA_LAUNCH (kernels.cuh). */
#ifndef LOOM_CUDA_EMU_RUNTIME_H
#define LOOM_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>

#include "cuda_runtime_api.h"

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

struct loom_emu_idx {
    unsigned x, y, z;
};
extern loom_emu_idx loom_emu_thread, loom_emu_block; /* set by the scheduler at each switch */
extern dim3 loom_emu_block_dim, loom_emu_grid_dim;

#define threadIdx loom_emu_thread
#define blockIdx loom_emu_block
#define blockDim loom_emu_block_dim
#define gridDim loom_emu_grid_dim
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline

void __syncthreads(void);
int __syncthreads_or(int pred);
double loom_emu_shfl_xor(double v, int mask);
template <typename F> static inline F __shfl_xor_sync(unsigned m, F v, int o)
{
    (void)m;
    return (F)loom_emu_shfl_xor((double)v, o);
}
/* A warp's butterfly reduction (kernels.cuh loom_warp_sum / loom_warp_max) in one exchange
 * instead of five shuffles: every lane publishes v; the first lane of the warp to resume
 * runs the whole xor tree over the warp's 32 values, lane l's value at each level
 * op(x[l], x[l ^ o]) as the shuffle loop computes it, into out[] (so each lane gets the
 * loop's bits), and every lane reads its own. */
const double *loom_emu_warp_values(double v, int *lane, double **out, int *first);
template <typename F, typename Op> static inline F loom_emu_warp_reduce(F v, Op op)
{
    int lane, first;
    double *out;
    const double *w = loom_emu_warp_values((double)v, &lane, &out, &first);
    if (first) {
        F x[32], y[32];
        for (int l = 0; l < 32; l++)
            x[l] = (F)w[l];
        for (int o = 16; o > 0; o >>= 1) {
            for (int l = 0; l < 32; l++)
                y[l] = op(x[l], x[l ^ o]);
            memcpy(x, y, sizeof x);
        }
        for (int l = 0; l < 32; l++)
            out[l] = (double)x[l];
    }
    return (F)out[lane];
}
static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The explicitly rounded arithmetic intrinsics: one IEEE fp32 operation each (the emulation
 * is built without contraction, so a plain operator rounds once too). */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }

static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Run body once per thread of every block of the grid. */
void loom_emu_launch(dim3 grid, dim3 block, std::function<void()> body);

#endif
