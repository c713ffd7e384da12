/* colsum.cuh — column sums over many rows without atomics: a block owns 32 columns (one
 * per lane, so reads coalesce) and 32 row lanes; lane y sums rows y, y+32, ... in order,
 * then the 32 lane sums are added in lane order. Fixed order for given (rows, cols): the
 * same bits every run, and whatever the grid. */
#ifndef LOOM_CUDA_COLSUM_CUH
#define LOOM_CUDA_COLSUM_CUH

#include "kernels.cuh"

enum { COLSUM_COLS = 32, COLSUM_LANES = 32 };

/* Sums two quantities per column: get(r, c, &a, &b) gives row r's terms. */
template <typename Get>
__device__ inline void colsum2(size_t rows, int cols, Get get, float *out_a, float *out_b)
{
    __shared__ float sa[COLSUM_LANES][COLSUM_COLS + 1], sb[COLSUM_LANES][COLSUM_COLS + 1];
    const int c = blockIdx.x * COLSUM_COLS + threadIdx.x;
    float a = 0.0f, b = 0.0f;
    if (c < cols)
        for (size_t r = threadIdx.y; r < rows; r += COLSUM_LANES) {
            float ta, tb;
            get(r, c, &ta, &tb);
            a += ta;
            b += tb;
        }
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float ta = 0.0f, tb = 0.0f;
        for (int y = 0; y < COLSUM_LANES; y++) {
            ta += sa[y][threadIdx.x];
            tb += sb[y][threadIdx.x];
        }
        if (out_a)
            out_a[c] += ta;
        if (out_b)
            out_b[c] += tb;
    }
}

#endif
