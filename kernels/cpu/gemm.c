/* gemm.c — loom's own single-precision GEMM, and the double-precision reference that
 * checks any GEMM.
 *
 * loom_cpu_sgemm_fallback is what loom_cpu_sgemm (blas.c) runs when OpenBLAS cannot be
 * loaded or gives wrong answers, and in canonical mode (attention's per-head products
 * included). It is a GotoBLAS/BLIS-style blocked GEMM:
 *   for each NC-wide panel of op(B), for each chunk of its KC-deep slices (all of K when
 *   the packed chunk fits BPACK floats):
 *     pack the chunk's slices of B into NR-wide slivers (shared by all threads);
 *     each thread takes an MC-row block of C and, for each slice of the chunk in order,
 *     packs alpha*op(A)'s MC x KC block into MR-tall slivers and runs the MR x NR
 *     micro-kernel over (A sliver, B sliver) pairs, adding into C (storing, for the first
 *     slice of a beta-0 product: C is then never read). With alpha 1 the full MR-row
 *     tiles read op(A) in place instead (gemm_pack.h's a_slice: the same values in the same
 *     order) and only a block's last, partial sliver is packed.
 * So the threads meet at one barrier per chunk, not two per slice: on shared cores a
 * descheduled thread holds the others up less often. Products under SLAB_BELOW multiply-adds
 * skip the shared packs: each thread runs one slab of C alone (sgemm_slabs), no barriers.
 * Packing makes every micro-kernel access unit-stride and lets one code path serve all
 * four transpose combinations and any leading dimensions; edges are zero-padded in the
 * packs so the micro-kernel always computes a full tile and only the valid part is written.
 * The micro-kernel (gemm_kernel.h) is plain C over GCC vector types, compiled once per ISA
 * with a tile that fits that ISA's registers — AVX-512 8x32 (16 of 32 zmm accumulate),
 * AVX2+FMA 6x16 and SSE2 6x8 (12 of 16 ymm/xmm, as BLIS's and OpenBLAS's Haswell kernels)
 * — and chosen by loom_cpu_isa() (cpuid, or LOOM_CPU_ISA), so one binary runs everywhere;
 * the packing follows the chosen tile. At 1024^3, on the 2-core AVX-512 Xeon the 8x32 kernel
 * reached ~145 GFLOP/s on one thread and ~250 on two (OpenBLAS SkylakeX: ~150 and ~320);
 * docs/BENCHMARKS.md has the AVX2 figures.
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
 * the whole one; so does a different tile shape on the same ISA. Across ISAs: AVX-512 and
 * AVX2 both fuse each step into one FMA, so they give the same bits as each other; SSE2
 * has no FMA (a rounded multiply, then a rounded add), so its bits differ from theirs.
 * (Splitting K is a different sum.)
 */
#include "cpu_kernels.h"
#include "cpu_common.h"
#include "gemm_pack.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

typedef float v4 __attribute__((vector_size(16)));
typedef float v4u __attribute__((vector_size(16), aligned(4))); /* unaligned access to C */
#define UK_BODY micro_kernel_sse2_body
#define UK_DIRECT micro_kernel_sse2_direct
#define UK_NAME micro_kernel_sse2 /* 6x8: 12 xmm accumulators, 2 B, 1 broadcast (of 16) */
#define UK_TARGET
#define UK_V v4
#define UK_VU v4u
#define UK_VL 4
#define UK_MR 6
#define UK_NV 2
#include "gemm_kernel.h"

#if defined(__x86_64__)
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
#define UK_BODY micro_kernel_avx2_body
#define UK_DIRECT micro_kernel_avx2_direct
#define UK_NAME micro_kernel_avx2 /* 6x16: 12 ymm accumulators, 2 B, 1 broadcast (of 16) */
#define UK_TARGET LOOM_CPU_TARGET_AVX2
#define UK_V v8
#define UK_VU v8u
#define UK_VL 8
#define UK_MR 6
#define UK_NV 2
#include "gemm_kernel.h"
#define UK_BODY micro_kernel_avx512_body
#define UK_DIRECT micro_kernel_avx512_direct
#define UK_NAME micro_kernel_avx512 /* 8x32: 16 zmm accumulators, 2 B, 1 broadcast (of 32) */
#define UK_TARGET LOOM_CPU_TARGET_AVX512
#define UK_V v16
#define UK_VU v16u
#define UK_VL 16
#define UK_MR 8
#define UK_NV 2
#include "gemm_kernel.h"
#endif

static micro_kernel pick_micro_kernel(int isa)
{
#if defined(__x86_64__)
    switch (isa) {
    case LOOM_CPU_ISA_AVX512:
        return (micro_kernel){micro_kernel_avx512, micro_kernel_avx512_direct, 8, 32, "avx512 8x32"};
    case LOOM_CPU_ISA_AVX2:
        return (micro_kernel){micro_kernel_avx2, micro_kernel_avx2_direct, 6, 16, "avx2 6x16"};
    }
    return (micro_kernel){micro_kernel_sse2, micro_kernel_sse2_direct, 6, 8, "sse2 6x8"};
#else
    return (micro_kernel){micro_kernel_sse2, micro_kernel_sse2_direct, 6, 8, "base 6x8"};
#endif
}

micro_kernel loom_cpu_gemm_micro_kernel(int isa)
{
    return pick_micro_kernel(isa <= loom_cpu_isa_best() ? isa : LOOM_CPU_ISA_SSE2);
}

const char *loom_cpu_sgemm_fallback_isa(void)
{
    return pick_micro_kernel(loom_cpu_isa()).name;
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

/* One thread's product without an OpenMP region (attention's per-head products run it
 * inside theirs, where even a one-thread region costs a team's allocation and set-up):
 * for each NC panel and each K-slice in order, pack the slice of B, then each MC block of
 * A and the tiles — the micro-kernel calls of the blocked path, so its bits. Returns -1,
 * touching nothing, when a pack buffer cannot be had. */
static int sgemm_serial(micro_kernel uk, int ta, int tb, int M, int N, int K, float alpha,
                        const float *A, int lda, const float *B, int ldb, float beta, float *C,
                        int ldc)
{
    const int MR = uk.mr, NR = uk.nr;
    const int ncap = N < NC ? N : NC, npad = (ncap + NR - 1) / NR * NR;
    float *bp = thread_buffer(0, (size_t)KC * npad), *ap = thread_buffer(1, (size_t)MC_MAX * KC);
    if (!bp || !ap)
        return -1;
    if (beta != 0.0f && beta != 1.0f)
        for (int i = 0; i < M; i++)
            scale_row(C + (size_t)i * ldc, N, beta);
    for (int jc = 0; jc < N; jc += NC) {
        const int nc = N - jc < NC ? N - jc : NC, n_js = (nc + NR - 1) / NR;
        for (int pc = 0; pc < K; pc += KC) {
            const int kc = K - pc < KC ? K - pc : KC;
            for (int js = 0; js < n_js; js++)
                pack_b_sliver(bp + (size_t)js * KC * NR, B, ldb, tb, pc, kc, jc + js * NR,
                              nc - js * NR < NR ? nc - js * NR : NR, NR);
            for (int ic = 0; ic < M; ic += MC_MAX) {
                const int mcc = M - ic < MC_MAX ? M - ic : MC_MAX;
                const a_operand a = a_slice(ap, A, lda, ta, ic, mcc, pc, kc, alpha, MR);
                for (int js = 0; js < n_js; js++)
                    for (int is = 0; is < mcc; is += MR)
                        a_tile(uk, &a, ap, is, kc, bp + (size_t)js * KC * NR,
                               C + (size_t)(ic + is) * ldc + jc + js * NR, ldc,
                               mcc - is < MR ? mcc - is : MR,
                               nc - js * NR < NR ? nc - js * NR : NR, beta == 0.0f && pc == 0);
            }
        }
    }
    return 0;
}

/* Last resort when the per-thread pack buffers cannot be had: single-threaded, one MR x NR
 * tile at a time through stack packs (40 KB) and the same micro-kernel, K-slices in the same
 * order, so it gives the blocked path's bits exactly (see "Order of operations" above). */
static void sgemm_unblocked(micro_kernel uk, int ta, int tb, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, int ldb, float beta,
                            float *C, int ldc)
{
    const int MR = uk.mr, NR = uk.nr;
    float ap[KC * MR_MAX] __attribute__((aligned(64)));
    float bp[KC * NR_MAX] __attribute__((aligned(64)));
    if (beta != 0.0f && beta != 1.0f)
        for (int i = 0; i < M; i++)
            scale_row(C + (size_t)i * ldc, N, beta);
    for (int i0 = 0; i0 < M; i0 += MR) {
        const int mr = M - i0 < MR ? M - i0 : MR;
        for (int j0 = 0; j0 < N; j0 += NR) {
            const int nr = N - j0 < NR ? N - j0 : NR;
            for (int pc = 0; pc < K; pc += KC) {
                const int kc = K - pc < KC ? K - pc : KC;
                pack_a(ap, A, lda, ta, i0, mr, pc, kc, alpha, MR);
                pack_b_sliver(bp, B, ldb, tb, pc, kc, j0, nr, NR);
                uk.run(kc, ap, bp, C + (size_t)i0 * ldc + j0, ldc, mr, nr,
                       beta == 0.0f && pc == 0);
            }
        }
    }
}

/* Below this many multiply-adds a product is cut into one slab of C per thread, each run
 * by sgemm_serial with its own packs: one fork and join and no barrier, where the shared-
 * pack path below meets at three and each core reads the B slivers the other packed (the
 * tiny config's layer products, 8-25M; blas.c splits OpenBLAS's calls at the same size). */
#define SLAB_BELOW 134217728.0 /* 2^27 */

/* The product as nth slabs along the longer of M and N (edges on multiples of the tile),
 * one per thread. A row or column split gives the bits of the whole product ("Order of
 * operations" above); a thread without pack buffers runs its slab through the stack packs. */
static void sgemm_slabs(micro_kernel uk, int nth, int ta, int tb, int M, int N, int K,
                        float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                        float *C, int ldc)
{
    const int by_rows = M >= N, len = by_rows ? M : N, unit = by_rows ? uk.mr : uk.nr;
#pragma omp parallel for schedule(static) num_threads(nth)
    for (int p = 0; p < nth; p++) {
        const int s = (int)((long)len * p / nth) / unit * unit;
        const int e = p == nth - 1 ? len : (int)((long)len * (p + 1) / nth) / unit * unit;
        if (e <= s)
            continue;
        const int m = by_rows ? e - s : M, n = by_rows ? N : e - s;
        const float *a = by_rows ? (ta ? A + s : A + (size_t)s * lda) : A;
        const float *b = by_rows ? B : (tb ? B + (size_t)s * ldb : B + s);
        float *c = by_rows ? C + (size_t)s * ldc : C + s;
        if (sgemm_serial(uk, ta, tb, m, n, K, alpha, a, lda, b, ldb, beta, c, ldc) != 0)
            sgemm_unblocked(uk, ta, tb, m, n, K, alpha, a, lda, b, ldb, beta, c, ldc);
    }
}

void loom_cpu_sgemm_fallback(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                             int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    loom_cpu_sgemm_on(loom_cpu_isa(), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void loom_cpu_sgemm_on(int isa, int ta, int tb, int M, int N, int K, float alpha, const float *A,
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

    const micro_kernel uk = loom_cpu_gemm_micro_kernel(isa);
    const int MR = uk.mr, NR = uk.nr;
    /* one thread inside a parallel region (attention's per-head products) or for a product
     * too small to pay for waking the team */
    const int nth = omp_in_parallel() || (double)M * N * K < 8.0 * LOOM_CPU_PAR_MIN
                        ? 1
                        : omp_get_max_threads();
    if (nth == 1 &&
        sgemm_serial(uk, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == 0)
        return;
    if (nth > 1 && (double)M * N * K < SLAB_BELOW) {
        sgemm_slabs(uk, nth, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int n_ic;
    const int mc = row_block_height(M, MR, nth, &n_ic);
    /* B is packed a chunk of K-slices at a time (all of K when it fits BPACK floats), so
     * that a work item runs all the chunk's slices with no barrier between them. */
    const int ncap = N < NC ? N : NC, npad = (ncap + NR - 1) / NR * NR;
    int kq = BPACK / npad / KC * KC;
    kq = kq < KC ? KC : kq;
    kq = kq > (K + KC - 1) / KC * KC ? (K + KC - 1) / KC * KC : kq;
    float *bp = thread_buffer(0, (size_t)kq * npad);
    if (!bp) {
        sgemm_unblocked(uk, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int failed = 0;

#pragma omp parallel num_threads(nth)
    {
        float *ap = team_a_buffer(&failed);
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
            for (int p0 = 0; p0 < K; p0 += kq) {
                const int p1 = K - p0 < kq ? K : p0 + kq, n_pc = (p1 - p0 + KC - 1) / KC;
                /* sliver js of slice q at bp + (q n_js + js) KC NR */
#pragma omp for schedule(static)
                for (int qs = 0; qs < n_pc * n_js; qs++) {
                    const int pc = p0 + qs / n_js * KC, js = qs % n_js;
                    const int kc = p1 - pc < KC ? p1 - pc : KC;
                    const int nr = nc - js * NR < NR ? nc - js * NR : NR;
                    pack_b_sliver(bp + (size_t)qs * KC * NR, B, ldb, tb, pc, kc, jc + js * NR,
                                  nr, NR);
                }
#pragma omp for schedule(dynamic, 1)
                for (int item = 0; item < n_ic * n_jg; item++) {
                    const int ic = item / n_jg * mc, jg = item % n_jg;
                    const int mcc = M - ic < mc ? M - ic : mc;
                    const int js0 = (int)((long)n_js * jg / n_jg);
                    const int js1 = (int)((long)n_js * (jg + 1) / n_jg);
                    for (int pc = p0; pc < p1; pc += KC) { /* the K-slices in order */
                        const int kc = p1 - pc < KC ? p1 - pc : KC;
                        const float *bq = bp + (size_t)(pc - p0) / KC * n_js * KC * NR;
                        const a_operand a =
                            a_slice(ap, A, lda, ta, ic, mcc, pc, kc, alpha, MR);
                        for (int js = js0; js < js1; js++) {
                            const int nr = nc - js * NR < NR ? nc - js * NR : NR;
                            const float *bs = bq + (size_t)js * KC * NR;
                            for (int is = 0; is < mcc; is += MR) {
                                const int mr = mcc - is < MR ? mcc - is : MR;
                                a_tile(uk, &a, ap, is, kc, bs,
                                       C + (size_t)(ic + is) * ldc + jc + js * NR, ldc, mr, nr,
                                       beta == 0.0f && pc == 0);
                            }
                        }
                    }
                }
            }
        }
    }
    if (failed) /* a thread had no pack buffer: every thread stopped at the barrier, before
                 * touching C */
        sgemm_unblocked(uk, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* One element's reference error, its K products summed in double (exact products) as s, their
 * magnitudes as mag. */
static inline double check_err(float alpha, float beta, double s, double mag, const float *C0,
                               size_t at, float got)
{
    double c0 = beta == 0.0f ? 0.0 : (double)beta * C0[at]; /* beta 0: C0 unread (may be NULL) */
    double ref = alpha * s + c0;
    double scale = fabs(alpha) * mag + fabs(c0) + 1e-30;
    return isfinite(got) ? fabs((double)got - ref) / scale : INFINITY;
}

/* The reference's exact products and sums, 8 (SSE2, every x86-64) or 16 (AVX2) elements of a
 * row of C at once: check_tile_sse2 / check_tile_avx2 sum columns j0 .. j0+W-1 of row i over
 * p = 0 .. K-1 in order into s and mag. */
typedef double chk_v2d __attribute__((vector_size(16)));
typedef float chk_v2f __attribute__((vector_size(8)));
typedef long long chk_v2l __attribute__((vector_size(16)));
#define CHK_ABS2(x) ((chk_v2d)((chk_v2l)(x) & (chk_v2l){0x7fffffffffffffffLL, 0x7fffffffffffffffLL}))
static inline chk_v2d chk_load2(const float *x)
{
    chk_v2f f;
    memcpy(&f, x, sizeof f);
    return __builtin_convertvector(f, chk_v2d);
}
static void check_tile_sse2(const float *A, int lda, int ta, int i, const float *Bk, int N, int K,
                            int j0, double *s, double *mag)
{
    chk_v2d s0 = {0, 0}, s1 = s0, s2 = s0, s3 = s0, m0 = s0, m1 = s0, m2 = s0, m3 = s0;
    for (int p = 0; p < K; p++) {
        const double a = op_at(A, lda, ta, i, p);
        const chk_v2d av = {a, a};
        const float *b = Bk + (size_t)p * N + j0;
        chk_v2d t0 = av * chk_load2(b), t1 = av * chk_load2(b + 2);
        chk_v2d t2 = av * chk_load2(b + 4), t3 = av * chk_load2(b + 6);
        s0 += t0, s1 += t1, s2 += t2, s3 += t3;
        m0 += CHK_ABS2(t0), m1 += CHK_ABS2(t1), m2 += CHK_ABS2(t2), m3 += CHK_ABS2(t3);
    }
    memcpy(s + j0, &s0, 16), memcpy(s + j0 + 2, &s1, 16);
    memcpy(s + j0 + 4, &s2, 16), memcpy(s + j0 + 6, &s3, 16);
    memcpy(mag + j0, &m0, 16), memcpy(mag + j0 + 2, &m1, 16);
    memcpy(mag + j0 + 4, &m2, 16), memcpy(mag + j0 + 6, &m3, 16);
}
#if defined(__x86_64__) && defined(__GNUC__)
typedef double chk_v4d __attribute__((vector_size(32)));
typedef float chk_v4f __attribute__((vector_size(16)));
typedef long long chk_v4l __attribute__((vector_size(32)));
#define CHK_ABS4(x) ((chk_v4d)((chk_v4l)(x) & (chk_v4l){0x7fffffffffffffffLL, 0x7fffffffffffffffLL, \
                                                       0x7fffffffffffffffLL, 0x7fffffffffffffffLL}))
#define CHK_LOAD4(dst, x)                                                                    \
    do {                                                                                     \
        chk_v4f f_;                                                                          \
        memcpy(&f_, (x), sizeof f_);                                                         \
        (dst) = __builtin_convertvector(f_, chk_v4d);                                        \
    } while (0)
__attribute__((target("avx2"))) static void check_tile_avx2(const float *A, int lda, int ta,
                                                                int i, const float *Bk, int N,
                                                                int K, int j0, double *s,
                                                                double *mag)
{
    chk_v4d s0 = {0, 0, 0, 0}, s1 = s0, s2 = s0, s3 = s0, m0 = s0, m1 = s0, m2 = s0, m3 = s0;
    for (int p = 0; p < K; p++) {
        const double a = op_at(A, lda, ta, i, p);
        const chk_v4d av = {a, a, a, a};
        const float *b = Bk + (size_t)p * N + j0;
        chk_v4d t0, t1, t2, t3;
        CHK_LOAD4(t0, b);
        CHK_LOAD4(t1, b + 4);
        CHK_LOAD4(t2, b + 8);
        CHK_LOAD4(t3, b + 12);
        t0 *= av, t1 *= av, t2 *= av, t3 *= av;
        s0 += t0, s1 += t1, s2 += t2, s3 += t3;
        m0 += CHK_ABS4(t0), m1 += CHK_ABS4(t1), m2 += CHK_ABS4(t2), m3 += CHK_ABS4(t3);
    }
    memcpy(s + j0, &s0, 32), memcpy(s + j0 + 4, &s1, 32);
    memcpy(s + j0 + 8, &s2, 32), memcpy(s + j0 + 12, &s3, 32);
    memcpy(mag + j0, &m0, 32), memcpy(mag + j0 + 4, &m1, 32);
    memcpy(mag + j0 + 8, &m2, 32), memcpy(mag + j0 + 12, &m3, 32);
}
#define CHK_HAVE_AVX2 1
#endif

/* The reference sums each element's products in order p = 0 .. K-1. It copies op(B) into a
 * contiguous K x N block and runs along a row of C, 16 (AVX2, where loom_cpu_isa() runs it) or 8
 * elements' sums at once in registers (each still in that order: the same worst error, bit
 * for bit), so it is vectorized: the 256^3 case of the start-up check (blas.c's verify runs
 * two) took 30-36 ms on one Zen 3 core as one dot product per element, 9-12 ms with SSE2
 * and 6-7 ms with AVX2 so (tests/kernels/bench_sgemm_check). Without memory for the copy,
 * the old loop. */
double loom_cpu_sgemm_check(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                            int lda, const float *B, int ldb, float beta, const float *C0,
                            const float *C, int ldc)
{
    double worst = 0.0;
    const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    float *Bk = malloc(sizeof(float) * ((size_t)K * N + 1));
    double *acc = malloc(sizeof(double) * 2 * ((size_t)N + 1) * (size_t)nt);
    if (!Bk || !acc) {
        free(Bk);
        free(acc);
#pragma omp parallel for schedule(static) reduction(max : worst)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0.0, mag = 0.0;
                for (int p = 0; p < K; p++) {
                    double t = (double)op_at(A, lda, ta, i, p) * op_at(B, ldb, tb, p, j);
                    s += t;
                    mag += fabs(t);
                }
                double err = check_err(alpha, beta, s, mag, C0, (size_t)i * ldc + j,
                                       C[(size_t)i * ldc + j]);
                if (err > worst)
                    worst = err;
            }
        return worst;
    }
    for (int p = 0; p < K; p++)
        for (int j = 0; j < N; j++)
            Bk[(size_t)p * N + j] = op_at(B, ldb, tb, p, j);
#ifdef CHK_HAVE_AVX2
    /* the ISA loom's kernels run (isa.c: cpuid, or LOOM_CPU_ISA), so a forced sse2 run checks
     * with the SSE2 tiles too */
    const int avx2 = loom_cpu_isa() >= LOOM_CPU_ISA_AVX2;
#endif
#pragma omp parallel for schedule(static) num_threads(nt) reduction(max : worst)
    for (int i = 0; i < M; i++) {
        double *restrict s = acc + 2 * ((size_t)N + 1) * (size_t)omp_get_thread_num();
        double *restrict mag = s + N + 1;
        int j0 = 0;
#ifdef CHK_HAVE_AVX2
        if (avx2)
            for (; j0 + 16 <= N; j0 += 16)
                check_tile_avx2(A, lda, ta, i, Bk, N, K, j0, s, mag);
#endif
        for (; j0 + 8 <= N; j0 += 8)
            check_tile_sse2(A, lda, ta, i, Bk, N, K, j0, s, mag);
        for (int j = j0; j < N; j++) { /* the last N % 8 columns, one at a time */
            double sj = 0.0, mj = 0.0;
            for (int p = 0; p < K; p++) {
                double t = (double)op_at(A, lda, ta, i, p) * Bk[(size_t)p * N + j];
                sj += t;
                mj += fabs(t);
            }
            s[j] = sj;
            mag[j] = mj;
        }
        for (int j = 0; j < N; j++) {
            double err = check_err(alpha, beta, s[j], mag[j], C0, (size_t)i * ldc + j,
                                   C[(size_t)i * ldc + j]);
            if (err > worst)
                worst = err;
        }
    }
    free(Bk);
    free(acc);
    return worst;
}
