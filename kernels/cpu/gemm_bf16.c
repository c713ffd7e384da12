/* gemm_bf16.c — C = A @ W^T with both operands bf16 values, on AVX512_BF16's vdpbf16ps
 * (fp32 accumulation): the forward product of a linear layer whose weight is a 16-bit
 * compute copy (gpt_precision.c) and whose input holds bf16-rounded values in fp32.
 *
 *   A: M x K fp32, leading dimension lda, every value a bf16 value (it is converted to bf16
 *      with round-to-nearest-even, which is exact for such values; others are rounded);
 *   W: N x K bf16 bits (uint16_t), leading dimension ldw, read directly (no widening pass);
 *   C: M x N fp32, leading dimension ldc; C = A W^T (beta 0: C is never read).
 *
 * Only where loom_cpu_gemm_bf16_available(): the CPU has AVX512_BF16 and the kernels run
 * at avx512 (LOOM_CPU_ISA=avx2/sse2 turns it off; an avx512 CPU without BF16 never has it;
 * LOOM_CPU_BF16DOT=0 turns it off alone, to compare with the widening path).
 * Elsewhere loom_cpu_gemm_bf16 returns -1 and writes nothing: callers keep their widening
 * path.
 *
 * How: A is packed whole into 8-row slivers of k-pairs (32 bits: the bf16 of a[i][2q] low,
 * a[i][2q+1] high; an odd K's last pair is padded with +0), W a panel of NC rows at a time
 * into 32-column slivers of the same pairs (so an LM head's pack stays NC K 2 bytes); the
 * 8x32 micro-kernel keeps 16 zmm accumulators and per pair broadcasts A's pair and issues
 * one vdpbf16ps per accumulator. Threads take MC-row blocks of each panel; the packs are
 * shared.
 *
 * Numerics (why it differs in the last bits from widening + sgemm): each product of two bf16
 * values is exact in fp32, but vdpbf16ps adds the two products of a pair to the accumulator
 * in its own order and rounding (not one FMA per k in increasing k), it treats subnormal
 * inputs as zero and flushes subnormal results to zero (DAZ/FTZ, whatever MXCSR says), and
 * K is summed whole (no 256-deep slices). Order of operations: C[i][j] = acc, acc = +0, then
 * for each pair q = 0, 1, ... in order acc = dpbf16(acc, a_i pair q, w_j pair q). That
 * depends only on row i of A, row j of W and K: not on M, N, the leading dimensions, the
 * blocking or the thread count, so row or column splits give the same bits.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { MR = 8, NR = 32, MC = 128, NC = 2048 };

#if defined(__x86_64__)
#include <immintrin.h>

#define TARGET_BF16 __attribute__((target("arch=x86-64-v4,avx512bf16")))

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int has_bf16;

static void detect(void)
{
    __builtin_cpu_init();
    const char *off = getenv("LOOM_CPU_BF16DOT");
    has_bf16 = __builtin_cpu_supports("avx512bf16") && !(off && strcmp(off, "0") == 0);
}

int loom_cpu_gemm_bf16_available(void)
{
    pthread_once(&once, detect);
    return has_bf16 && loom_cpu_isa() == LOOM_CPU_ISA_AVX512;
}

/* A per-thread 64-byte-aligned buffer of at least n uint32s, kept for the next call. */
static uint32_t *keep(int which, size_t n)
{
    static _Thread_local uint32_t *b[2];
    static _Thread_local size_t cap[2];
    if (cap[which] < n) {
        free(b[which]);
        b[which] = aligned_alloc(64, (n * 4 + 63) & ~(size_t)63);
        cap[which] = b[which] ? n : 0;
    }
    return b[which];
}

/* The bf16 of x (round to nearest even; exact when x is a bf16 value). */
static inline uint32_t to_bf16(float x)
{
    return loom_cpu_bf16_from_f32(x);
}

/* Rows [i0, i0+mc) of A into MR-row slivers: dst[(is/MR) * kp * MR + q * MR + r] = pair q
 * of row i0+is+r (rows past mc zero). */
TARGET_BF16 static void pack_a(uint32_t *restrict dst, const float *A, int lda, int i0, int mc,
                               int K)
{
    const int kp = (K + 1) / 2, K2 = K & ~1;
    for (int is = 0; is < mc; is += MR, dst += (size_t)kp * MR) {
        const int mr = mc - is < MR ? mc - is : MR;
        for (int r = 0; r < MR; r++) {
            if (r >= mr) {
                for (int q = 0; q < kp; q++)
                    dst[q * MR + r] = 0;
                continue;
            }
            const float *a = A + (size_t)(i0 + is + r) * lda;
            int q = 0;
            for (; 2 * q + 32 <= K2; q += 16) { /* 32 floats -> 16 pairs, RNE */
                __m512bh p = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(a + 2 * q + 16),
                                                 _mm512_loadu_ps(a + 2 * q));
                uint32_t t[16] __attribute__((aligned(64)));
                _mm512_store_si512((void *)t, (__m512i)p);
                for (int s = 0; s < 16; s++)
                    dst[(q + s) * MR + r] = t[s];
            }
            for (; 2 * q < K2; q++)
                dst[q * MR + r] = to_bf16(a[2 * q]) | to_bf16(a[2 * q + 1]) << 16;
            if (K & 1)
                dst[q * MR + r] = to_bf16(a[K - 1]);
        }
    }
}

/* Columns [j0, j0+nr) (rows of W) into one NR-wide sliver: dst[q * NR + c] = pair q of row
 * j0+c (columns past nr zero). W is bf16 bits, or (Wf, W NULL) fp32 holding bf16 values,
 * narrowed here (exact for such values). */
static void pack_w(uint32_t *restrict dst, const uint16_t *W, const float *Wf, int ldw, int j0,
                   int nr, int K)
{
    const int kp = (K + 1) / 2;
    for (int c = 0; c < NR; c++) {
        if (c >= nr) {
            for (int q = 0; q < kp; q++)
                dst[q * NR + c] = 0;
            continue;
        }
        const size_t row = (size_t)(j0 + c) * ldw;
        for (int q = 0; q < kp; q++) {
            const int k = 2 * q;
            uint32_t lo, hi = 0;
            if (W) {
                lo = W[row + k];
                hi = k + 1 < K ? W[row + k + 1] : 0;
            } else {
                lo = loom_cpu_bf16_from_f32(Wf[row + k]);
                hi = k + 1 < K ? loom_cpu_bf16_from_f32(Wf[row + k + 1]) : 0;
            }
            dst[q * NR + c] = lo | hi << 16;
        }
    }
}

/* C (m x n valid part of an 8x32 tile) = A sliver (kp pairs x 8) . W sliver (kp x 32). */
TARGET_BF16 static void micro(int kp, const uint32_t *restrict a, const uint32_t *restrict w,
                              float *restrict c, int ldc, int m, int n)
{
    __m512 acc[MR][2];
    for (int i = 0; i < MR; i++)
        acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int q = 0; q < kp; q++) {
        const __m512bh w0 = (__m512bh)_mm512_load_si512((const void *)(w + (size_t)q * NR));
        const __m512bh w1 = (__m512bh)_mm512_load_si512((const void *)(w + (size_t)q * NR + 16));
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[q * MR + i]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], x, w0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], x, w1);
        }
    }
    if (m == MR && n == NR) {
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            _mm512_storeu_ps(c + (size_t)i * ldc, acc[i][0]);
            _mm512_storeu_ps(c + (size_t)i * ldc + 16, acc[i][1]);
        }
        return;
    }
    float t[MR][NR] __attribute__((aligned(64)));
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        _mm512_store_ps(&t[i][0], acc[i][0]);
        _mm512_store_ps(&t[i][16], acc[i][1]);
    }
    for (int i = 0; i < m; i++)
        memcpy(c + (size_t)i * ldc, t[i], (size_t)n * sizeof(float));
}

static int gemm(int M, int N, int K, const float *A, int lda, const uint16_t *W,
                const float *Wf, int ldw, float *C, int ldc)
{
    if (!loom_cpu_gemm_bf16_available())
        return -1;
    if (M <= 0 || N <= 0)
        return 0;
    const int kp = (K + 1) / 2, n_is = (M + MR - 1) / MR, n_ic = (M + MC - 1) / MC;
    const int ncap = N < NC ? N : NC, n_jcap = (ncap + NR - 1) / NR;
    uint32_t *ap = keep(0, (size_t)n_is * kp * MR), *wp = keep(1, (size_t)n_jcap * kp * NR);
    if (!ap || !wp)
        return -1;
    const int nth = omp_in_parallel() || (double)M * N * K < 8.0 * LOOM_CPU_PAR_MIN
                        ? 1
                        : omp_get_max_threads();
#pragma omp parallel num_threads(nth)
    {
#pragma omp for schedule(static)
        for (int is = 0; is < n_is; is++)
            pack_a(ap + (size_t)is * kp * MR, A, lda, is * MR,
                   M - is * MR < MR ? M - is * MR : MR, K);
        for (int jc = 0; jc < N; jc += NC) { /* a panel of W's rows (C's columns) */
            const int nc = N - jc < NC ? N - jc : NC, n_js = (nc + NR - 1) / NR;
#pragma omp for schedule(static)
            for (int js = 0; js < n_js; js++)
                pack_w(wp + (size_t)js * kp * NR, W, Wf, ldw, jc + js * NR,
                       nc - js * NR < NR ? nc - js * NR : NR, K);
#pragma omp for schedule(dynamic, 1)
            for (int ib = 0; ib < n_ic; ib++) {
                const int i0 = ib * MC, mc = M - i0 < MC ? M - i0 : MC;
                for (int js = 0; js < n_js; js++) {
                    const int nr = nc - js * NR < NR ? nc - js * NR : NR;
                    for (int is = 0; is < mc; is += MR)
                        micro(kp, ap + (size_t)(i0 + is) * kp, wp + (size_t)js * kp * NR,
                              C + (size_t)(i0 + is) * ldc + jc + js * NR, ldc,
                              mc - is < MR ? mc - is : MR, nr);
                }
            }
        }
    }
    return 0;
}

int loom_cpu_gemm_bf16(int M, int N, int K, const float *A, int lda, const uint16_t *W,
                       int ldw, float *C, int ldc)
{
    return gemm(M, N, K, A, lda, W, NULL, ldw, C, ldc);
}

int loom_cpu_gemm_bf16_f32w(int M, int N, int K, const float *A, int lda, const float *W,
                            int ldw, float *C, int ldc)
{
    return gemm(M, N, K, A, lda, NULL, W, ldw, C, ldc);
}

#else

int loom_cpu_gemm_bf16_f32w(int M, int N, int K, const float *A, int lda, const float *W,
                            int ldw, float *C, int ldc)
{
    (void)M, (void)N, (void)K, (void)A, (void)lda, (void)W, (void)ldw, (void)C, (void)ldc;
    return -1;
}

int loom_cpu_gemm_bf16_available(void)
{
    return 0;
}

int loom_cpu_gemm_bf16(int M, int N, int K, const float *A, int lda, const uint16_t *W,
                       int ldw, float *C, int ldc)
{
    (void)M, (void)N, (void)K, (void)A, (void)lda, (void)W, (void)ldw, (void)C, (void)ldc;
    return -1;
}

#endif

/* backend.h's matmul_forward_dt for dt bf16: in fast mode go through vdpbf16ps where the
 * CPU has it (the bits then differ from matmul_forward's in the last places: the header);
 * canonical mode (loom_cpu_deterministic) and CPUs without it run matmul_forward,
 * whose fixed order the canonical layouts rely on. */
void loom_cpu_matmul_forward_bf16(float *out, const float *inp, const float *weight,
                                  const float *bias, int B, int T, int C, int OC)
{
    const int BT = B * T;
    if (loom_cpu_deterministic() ||
        loom_cpu_gemm_bf16_f32w(BT, OC, C, inp, C, weight, C, out, OC) != 0) {
        loom_cpu_matmul_forward(out, inp, weight, bias, B, T, C, OC);
        return;
    }
    if (bias) /* out = acc + bias: one rounding, as sgemm's bias + acc */
#pragma omp parallel for schedule(static) if ((size_t)BT * OC > LOOM_CPU_PAR_MIN)
        for (int bt = 0; bt < BT; bt++)
            for (int o = 0; o < OC; o++)
                out[(size_t)bt * OC + o] += bias[o];
}
