/* encoder.c — token + position embedding: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:], as
 * two ops so that tensor parallelism can split it: the token lookup over a slice of the
 * vocabulary rows (zeros for tokens another rank holds; the slices sum to the lookup), and
 * the positions added once, to any contiguous shard of the (B,T) rows.
 *
 * Backward: dwte and dwpe ACCUMULATE (+=) — they are parameter gradients; there is no input
 * gradient (tokens are integers).
 * Backward is parallel over columns, not rows: two rows with the same token add into the
 * same dwte row, so each thread owns a slice of the C columns and walks all (b,t) in order.
 * The position gradient is parallel over positions, each adding its B rows in order. No
 * atomics, and the sum order — hence the result — does not depend on the thread count.
 * Token ids are not checked here (the model checks them against the vocabulary).
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

/* Columns per work item in backward: one 64-byte cache line of floats. */
enum { ENC_COLS = 16 };

void loom_cpu_embedding_forward(float *out, const int *inp, const float *wte, int v0, int Vl,
                                size_t rows, int C)
{
#pragma omp parallel for schedule(static) if (rows * (size_t)C > LOOM_CPU_PAR_MIN)
    for (size_t i = 0; i < rows; i++) {
        float *o = out + i * (size_t)C;
        int v = inp[i] - v0;
        if (v >= 0 && v < Vl) {
            const float *te = wte + (size_t)v * C;
            for (int c = 0; c < C; c++)
                o[c] = te[c];
        } else {
            for (int c = 0; c < C; c++)
                o[c] = 0.0f;
        }
    }
}

void loom_cpu_embedding_backward(float *dwte, const float *dout, const int *inp, int v0, int Vl,
                                 size_t rows, int C)
{
    const int nblk = (C + ENC_COLS - 1) / ENC_COLS;
#pragma omp parallel for schedule(static) if (rows * (size_t)C > LOOM_CPU_PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        const int c0 = blk * ENC_COLS, c1 = c0 + ENC_COLS < C ? c0 + ENC_COLS : C;
        for (size_t i = 0; i < rows; i++) {
            int v = inp[i] - v0;
            if (v < 0 || v >= Vl)
                continue;
            const float *d = dout + i * (size_t)C;
            float *te = dwte + (size_t)v * C;
            for (int c = c0; c < c1; c++)
                te[c] += d[c];
        }
    }
}

void loom_cpu_position_forward(float *out, const float *wpe, size_t row0, size_t rows, int T, int C)
{
#pragma omp parallel for schedule(static) if (rows * (size_t)C > LOOM_CPU_PAR_MIN)
    for (size_t i = 0; i < rows; i++) {
        float *o = out + i * (size_t)C;
        const float *pe = wpe + ((row0 + i) % (size_t)T) * C;
        for (int c = 0; c < C; c++)
            o[c] += pe[c];
    }
}

void loom_cpu_position_backward(float *dwpe, const float *dout, int B, int T, int C)
{
#pragma omp parallel for schedule(static) if ((size_t)B * T * C > LOOM_CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        float *pe = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++)
                pe[c] += d[c];
        }
    }
}
