/* rep_tree.c — canonical mode's chunk tree of a replicated parameter's gradient in one
 * call (backend.h's rep_chunk_tree).
 *
 * Canonical mode sums a layer norm's or a bias's gradient over LOOM_CANONICAL_CHUNKS fixed
 * chunks of rows, added in a binary-counter tree (core/model/gpt_parallel.c), so that any
 * layout of the rows gives the bits of one rank. Made as one backend call per chunk, each
 * chunk (64 rows of the tiny config) was too small for the kernels to thread: eight
 * single-threaded layer-norm backwards and seven merges in a row, 0.7 ms a tiny step on
 * one core while the other slept, and long enough for it to fall asleep past libgomp's
 * bounded spin before the next product (a wake-up each). Here the chunks run on the
 * threads at once, each into its own slot, and the master merges the slots after.
 *
 * Bits: each chunk is the same kernel call over the same rows into a zeroed slot (inside
 * the region the kernel runs on its thread alone; its bits do not depend on the thread
 * count), and the merges are the same single adds in the same order (older += newer as
 * the counter carries), so the result is that of the per-chunk sequence.
 * test_deterministic compares the two bit for bit.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <string.h>

void loom_cpu_rep_chunk_tree(int kind, float *part, float *scratch, int chunks, float *dinp,
                             const float *dout, const float *inp, const float *weight,
                             const float *mean, const float *rstd, size_t rows, int C)
{
    /* part (n) =, scratch ((chunks - 1) n), n = 2C (kind 0: [dw | db]) or C (kind 1: db);
     * kind 0 also writes dinp (rows, C); chunk c: rows [c rc, (c + 1) rc), rc = rows / chunks */
    const size_t n = kind == 0 ? 2 * (size_t)C : (size_t)C, rc = rows / (size_t)chunks;
#pragma omp parallel for schedule(static) if (rows * (size_t)C > LOOM_CPU_PAR_MIN)
    for (int c = 0; c < chunks; c++) {
        float *slot = c ? scratch + (size_t)(c - 1) * n : part;
        const size_t r0 = (size_t)c * rc, off = r0 * (size_t)C;
        memset(slot, 0, n * sizeof(float));
        if (kind == 0)
            loom_cpu_layernorm_backward(dinp + off, slot, slot + C, dout + off, inp + off,
                                        weight, mean + r0, rstd + r0, 1, (int)rc, C);
        else
            loom_cpu_bias_backward(slot, dout + off, rc, C);
    }
    /* the binary counter: slot index and level of each sum on the stack */
    int stack[64], level[64], depth = 0;
    for (int c = 0; c < chunks; c++) {
        stack[depth] = c;
        level[depth++] = 0;
        while (depth > 1 && level[depth - 2] == level[depth - 1]) {
            float *dst = stack[depth - 2] ? scratch + (size_t)(stack[depth - 2] - 1) * n : part;
            loom_cpu_accumulate(dst, scratch + (size_t)(stack[depth - 1] - 1) * n, n);
            level[depth - 2]++;
            depth--;
        }
    }
}
