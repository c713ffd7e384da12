/* gemm.c — loom's own single-precision GEMM, and the double-precision reference that
 * checks any GEMM.
 *
 * loom_cpu_sgemm_fallback is what loom_cpu_sgemm (blas.c) runs when OpenBLAS cannot be
 * loaded or gives wrong answers, and what attention.c runs per head. It is a
 * GotoBLAS/BLIS-style blocked GEMM:
 *   for each NC-wide panel of op(B), for each KC-deep slice of it:
 *     pack the KC x NC panel of B into NR-wide slivers (shared by all threads);
 *     each thread packs an MC x KC block of alpha*op(A) into MR-tall slivers and runs the
 *     MR x NR micro-kernel over (A sliver, B sliver) pairs, adding into C (storing, for
 *     the first slice of a beta-0 product: C is then never read).
 * Packing makes every micro-kernel access unit-stride and lets one code path serve all
 * four transpose combinations and any leading dimensions; edges are zero-padded in the
 * packs so the micro-kernel always computes a full tile and only the valid part is written.
 * The micro-kernel is plain C over GCC vector types, compiled three times (AVX-512,
 * AVX2+FMA, baseline) and chosen with cpuid, so one binary runs everywhere. On the 2-core
 * AVX-512 Xeon it reaches ~145 GFLOP/s on one thread and ~250 on two at 1024^3 (OpenBLAS
 * SkylakeX: ~150 and ~320).
 *
 * It does not: use threads inside an enclosing OpenMP parallel region (nested regions run
 * on one thread) or for products under 8 * LOOM_CPU_PAR_MIN multiply-adds, or split K
 * across threads — so each C element is summed in one fixed order and the result does not
 * depend on the thread count.
 *
 * Pack buffers are per thread and kept between calls (GEMMs repeat the same shapes every
 * step); if one cannot be allocated, the call runs tile by tile through stack packs.
 *
 * Order of operations (what loom_cpu_set_deterministic's canonical mode relies on): every
 * element C[i][j] is computed as
 *   c = beta == 0 ? (nothing) : beta == 1 ? C[i][j] : beta * C[i][j]
 *   for each K-slice [pc, pc+KC) in increasing pc (pc = 0, 256, 512, ...):
 *     acc = +0;  for p in the slice, in order: acc = acc + (alpha * a_ip) * b_pj
 *                (one fused multiply-add per p where the ISA has FMA: -ffp-contract=fast)
 *     c = (beta == 0 && pc == 0) ? acc : c + acc
 * The slice boundaries depend only on K; the multiply-adds for (i,j) depend only on row i
 * of op(A) and column j of op(B), because edge tiles are zero-padded and run the same
 * micro-kernel as full ones (the padded lanes are computed and discarded); M, N, the
 * leading dimensions, MC/NC blocking, the thread count and the thread that computes a tile
 * never enter. So a product split by rows or columns into separate calls gives the bits of
 * the whole one. (Not across machines with different ISAs: the micro-kernel is chosen by
 * cpuid, and the baseline build has no FMA. Splitting K is a different sum.)
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

enum {
    MR = 8,      /* micro-tile rows: 8 x 2 accumulators = 16 of the 32 zmm registers */
    NR = 32,     /* micro-tile columns: two 16-float vectors */
    KC = 256,    /* depth of a packed slice: an A sliver (8 KB) + B sliver (32 KB) ~ L1/L2 */
    MC_MAX = 192,/* rows of A per packed block: 192 KB, stays in L2 */
    NC = 2048    /* columns of B per packed panel: 2 MB, stays in L2/L3 */
};

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4))); /* unaligned access to C */

/* C (m x n valid part of an MR x NR tile, leading dim ldc) += A sliver (kc x MR, packed
 * k-major) @ B sliver (kc x NR, packed k-major); with store set, = instead of += (the first
 * K-slice of a beta-0 product: C is never read, so it needs no zeroing pass and NaNs in it
 * do not leak). always_inline so each target-specific wrapper below gets its own
 * vectorised copy. */
static inline __attribute__((always_inline)) void
micro_kernel_body(int kc, const float *restrict a, const float *restrict b, float *restrict c,
                  int ldc, int m, int n, int store)
{
    v16 acc[MR][2];
    for (int i = 0; i < MR; i++)
        acc[i][0] = acc[i][1] = (v16){0};
    for (int p = 0; p < kc; p++) {
        const v16 b0 = *(const v16 *)(b + (size_t)p * NR);
        const v16 b1 = *(const v16 *)(b + (size_t)p * NR + 16);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            const float x = a[p * MR + i];
            /* broadcast (not (v16){0} + x: adding 0 is an add to keep, since -0 + 0 = +0) */
            const v16 ai = {x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
            acc[i][0] += ai * b0;
            acc[i][1] += ai * b1;
        }
    }
    if (m == MR && n == NR && store) {
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            *(v16u *)(c + (size_t)i * ldc) = acc[i][0];
            *(v16u *)(c + (size_t)i * ldc + 16) = acc[i][1];
        }
    } else if (m == MR && n == NR) {
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            *(v16u *)(c + (size_t)i * ldc) += acc[i][0];
            *(v16u *)(c + (size_t)i * ldc + 16) += acc[i][1];
        }
    } else {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                c[(size_t)i * ldc + j] = store ? acc[i][j / 16][j % 16]
                                               : c[(size_t)i * ldc + j] + acc[i][j / 16][j % 16];
    }
}

typedef void (*micro_kernel_fn)(int, const float *, const float *, float *, int, int, int, int);

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f,fma"))) static void
micro_kernel_avx512(int kc, const float *a, const float *b, float *c, int ldc, int m, int n,
                    int store)
{
    micro_kernel_body(kc, a, b, c, ldc, m, n, store);
}
__attribute__((target("avx2,fma"))) static void
micro_kernel_avx2(int kc, const float *a, const float *b, float *c, int ldc, int m, int n,
                  int store)
{
    micro_kernel_body(kc, a, b, c, ldc, m, n, store);
}
#endif
static void micro_kernel_base(int kc, const float *a, const float *b, float *c, int ldc, int m,
                              int n, int store)
{
    micro_kernel_body(kc, a, b, c, ldc, m, n, store);
}

static micro_kernel_fn pick_micro_kernel(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return micro_kernel_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return micro_kernel_avx2;
#endif
    return micro_kernel_base;
}

const char *loom_cpu_sgemm_fallback_isa(void)
{
    micro_kernel_fn k = pick_micro_kernel();
#if defined(__x86_64__) || defined(__i386__)
    if (k == micro_kernel_avx512)
        return "avx512";
    if (k == micro_kernel_avx2)
        return "avx2";
#endif
    return k == micro_kernel_base ? "baseline" : "?";
}

/* A per-thread, 64-byte-aligned buffer of at least n floats, kept for the next call. */
static float *thread_buffer(int which, size_t n)
{
    static _Thread_local float *buf[2];
    static _Thread_local size_t cap[2];
    if (cap[which] < n) {
        free(buf[which]);
        size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
        buf[which] = aligned_alloc(64, bytes);
        cap[which] = buf[which] ? n : 0;
    }
    return buf[which];
}

/* op(X)(r, c) of a row-major X stored with leading dimension ld. */
static inline float op_at(const float *X, int ld, int trans, int r, int c)
{
    return trans ? X[(size_t)c * ld + r] : X[(size_t)r * ld + c];
}

/* Packs scale * Y[r0 .. r0+n, c0 .. c0+kc] into one W-wide sliver, k-major:
 * dst[p*W + r] = scale * Y(r0 + r, c0 + p), rows n .. W-1 zero. Y is X (trans 0) or X^T
 * (trans 1) of a row-major X with leading dimension ld. The two cases get their own loops
 * (contiguous reads along p, or along r) rather than a branch per element. */
static inline __attribute__((always_inline)) void
pack_sliver(float *restrict dst, const float *X, int ld, int trans, int r0, int n, int c0,
            int kc, int W, float scale)
{
    if (trans) { /* Y(r, c) = X[c*ld + r]: row p of the sliver is contiguous in X */
        for (int p = 0; p < kc; p++) {
            const float *src = X + (size_t)(c0 + p) * ld + r0;
            for (int r = 0; r < n; r++)
                dst[p * W + r] = scale * src[r];
            for (int r = n; r < W; r++)
                dst[p * W + r] = 0.0f;
        }
    } else { /* Y(r, c) = X[r*ld + c]: column r of the sliver is contiguous in X */
        for (int r = 0; r < n; r++) {
            const float *src = X + (size_t)(r0 + r) * ld + c0;
            for (int p = 0; p < kc; p++)
                dst[p * W + r] = scale * src[p];
        }
        for (int p = 0; p < kc; p++)
            for (int r = n; r < W; r++)
                dst[p * W + r] = 0.0f;
    }
}

/* Pack alpha * op(A)[i0 .. i0+mc, p0 .. p0+kc] into MR-row slivers. */
static void pack_a(float *restrict dst, const float *A, int lda, int ta, int i0, int mc, int p0,
                   int kc, float alpha)
{
    for (int is = 0; is < mc; is += MR) {
        const int mr = mc - is < MR ? mc - is : MR;
        pack_sliver(dst, A, lda, ta, i0 + is, mr, p0, kc, MR, alpha);
        dst += (size_t)kc * MR;
    }
}

/* Pack op(B)[p0 .. p0+kc, j0 .. j0+nr] into one NR-column sliver: as a sliver of op(B)^T,
 * whose rows are the columns j. */
static void pack_b_sliver(float *restrict dst, const float *B, int ldb, int tb, int p0, int kc,
                          int j0, int nr)
{
    pack_sliver(dst, B, ldb, !tb, j0, nr, p0, kc, NR, 1.0f);
}

/* Row i of C (N wide) = beta * row (beta == 0 writes zeros, so NaNs in C do not leak). */
static void scale_row(float *row, int N, float beta)
{
    if (beta == 0.0f)
        memset(row, 0, (size_t)N * sizeof(float));
    else if (beta != 1.0f)
        for (int j = 0; j < N; j++)
            row[j] *= beta;
}

/* Last resort when the per-thread pack buffers cannot be had: single-threaded, one MR x NR
 * tile at a time through stack packs (40 KB) and the same micro-kernel, K-slices in the same
 * order, so it gives the blocked path's bits exactly (see "Order of operations" above). */
static void sgemm_unblocked(micro_kernel_fn kernel, int ta, int tb, int M, int N, int K,
                            float alpha, const float *A, int lda, const float *B, int ldb,
                            float beta, float *C, int ldc)
{
    float ap[KC * MR] __attribute__((aligned(64)));
    float bp[KC * NR] __attribute__((aligned(64)));
    if (beta != 0.0f && beta != 1.0f)
        for (int i = 0; i < M; i++)
            scale_row(C + (size_t)i * ldc, N, beta);
    for (int i0 = 0; i0 < M; i0 += MR) {
        const int mr = M - i0 < MR ? M - i0 : MR;
        for (int j0 = 0; j0 < N; j0 += NR) {
            const int nr = N - j0 < NR ? N - j0 : NR;
            for (int pc = 0; pc < K; pc += KC) {
                const int kc = K - pc < KC ? K - pc : KC;
                pack_a(ap, A, lda, ta, i0, mr, pc, kc, alpha);
                pack_b_sliver(bp, B, ldb, tb, pc, kc, j0, nr);
                kernel(kc, ap, bp, C + (size_t)i0 * ldc + j0, ldc, mr, nr,
                       beta == 0.0f && pc == 0);
            }
        }
    }
}

void loom_cpu_sgemm_fallback(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                             int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0 || alpha == 0.0f) {
#pragma omp parallel for schedule(static) if ((size_t)M * N > LOOM_CPU_PAR_MIN)
        for (int i = 0; i < M; i++)
            scale_row(C + (size_t)i * ldc, N, beta);
        return;
    }

    const micro_kernel_fn kernel = pick_micro_kernel();
    /* one thread inside a parallel region (attention's per-head products) or for a product
     * too small to pay for waking the team */
    const int nth = omp_in_parallel() || (double)M * N * K < 8.0 * LOOM_CPU_PAR_MIN
                        ? 1
                        : omp_get_max_threads();
    /* Rows per A block: enough blocks to keep every thread busy, at most MC_MAX. */
    int mc = (M + nth - 1) / nth;
    mc = (mc + MR - 1) / MR * MR;
    if (mc > MC_MAX)
        mc = MC_MAX;
    const int n_ic = (M + mc - 1) / mc;
    const int ncap = N < NC ? N : NC;
    float *bp = thread_buffer(0, (size_t)KC * ((ncap + NR - 1) / NR * NR));
    if (!bp) {
        sgemm_unblocked(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int failed = 0;

#pragma omp parallel num_threads(nth)
    {
        float *ap = thread_buffer(1, (size_t)MC_MAX * KC);
        if (!ap) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        /* C = beta C first, unless beta is 0 (the first K-slice stores) or 1 */
        if (!failed && beta != 0.0f && beta != 1.0f) {
#pragma omp for schedule(static)
            for (int i = 0; i < M; i++)
                scale_row(C + (size_t)i * ldc, N, beta);
        }
        for (int jc = 0; jc < N && !failed; jc += NC) {
            const int nc = N - jc < NC ? N - jc : NC;
            const int n_js = (nc + NR - 1) / NR;
            /* When there are fewer A blocks than threads, split the panel's slivers
             * into groups too, so that every thread has work. */
            int n_jg = n_ic >= nth ? 1 : (nth + n_ic - 1) / n_ic;
            if (n_jg > n_js)
                n_jg = n_js;
            for (int pc = 0; pc < K; pc += KC) {
                const int kc = K - pc < KC ? K - pc : KC;
#pragma omp for schedule(static)
                for (int js = 0; js < n_js; js++) {
                    int nr = nc - js * NR < NR ? nc - js * NR : NR;
                    pack_b_sliver(bp + (size_t)js * KC * NR, B, ldb, tb, pc, kc, jc + js * NR, nr);
                }
#pragma omp for schedule(dynamic, 1)
                for (int item = 0; item < n_ic * n_jg; item++) {
                    const int ic = item / n_jg * mc, jg = item % n_jg;
                    const int mcc = M - ic < mc ? M - ic : mc;
                    const int js0 = (int)((long)n_js * jg / n_jg);
                    const int js1 = (int)((long)n_js * (jg + 1) / n_jg);
                    pack_a(ap, A, lda, ta, ic, mcc, pc, kc, alpha);
                    for (int js = js0; js < js1; js++) {
                        const int nr = nc - js * NR < NR ? nc - js * NR : NR;
                        const float *bs = bp + (size_t)js * KC * NR;
                        for (int is = 0; is < mcc; is += MR) {
                            const int mr = mcc - is < MR ? mcc - is : MR;
                            kernel(kc, ap + (size_t)is * kc, bs,
                                   C + (size_t)(ic + is) * ldc + jc + js * NR, ldc, mr, nr,
                                   beta == 0.0f && pc == 0);
                        }
                    }
                }
            }
        }
    }
    if (failed) /* a thread had no pack buffer: every thread stopped at the barrier, before
                 * touching C */
        sgemm_unblocked(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

double loom_cpu_sgemm_check(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                            int lda, const float *B, int ldb, float beta, const float *C0,
                            const float *C, int ldc)
{
    double worst = 0.0;
#pragma omp parallel for schedule(static) reduction(max : worst)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0, mag = 0.0;
            for (int p = 0; p < K; p++) {
                double t = (double)op_at(A, lda, ta, i, p) * op_at(B, ldb, tb, p, j);
                s += t;
                mag += fabs(t);
            }
            double c0 = beta == 0.0f ? 0.0 : (double)beta * C0[(size_t)i * ldc + j];
            double ref = alpha * s + c0;
            double scale = fabs(alpha) * mag + fabs(c0) + 1e-30;
            double got = C[(size_t)i * ldc + j];
            double err = isfinite(got) ? fabs(got - ref) / scale : INFINITY;
            if (err > worst)
                worst = err;
        }
    return worst;
}
