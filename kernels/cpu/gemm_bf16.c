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
 * LOOM_CPU_BF16DOT=0 turns it off alone, to compare with the widening path). The backend
 * sends the backward products here only with LOOM_CPU_BF16DOT=all: split, they cost as
 * many vdpbf16ps pairs as the FMAs of an sgemm, and measured no faster (docs/BENCHMARKS.md).
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
 * blocking or the thread count, so row or column splits give the same bits. K is cut into
 * blocks of KC pairs; a block's tile starts from what the previous block left in C (an
 * exact fp32 store and load), so the blocking does not change the bits either.
 *
 * The backward products (loom_cpu_gemm_bf16_split, matmul_backward_bf16): dinp = dout W and
 * dW += dout^T inp, where W and inp hold bf16 values but dout is an fp32 gradient. Why not
 * round dout to bf16, as a GPU's autocast run does: loom's precision policy keeps gradients
 * in fp32 (issue 14), the CUDA backend's backward is cuBLAS SGEMM on them (docs/CUDA.md), and
 * the CPU is the reference that backend is checked against; and canonical mode must keep
 * sgemm's bits. So each dout value x is split into two bf16, hi = bf16(x) and lo = bf16(x -
 * hi) (x - hi is exact in fp32), leaving |x - hi - lo| <= 2^-18 |x|; a pair of A is (hi, lo)
 * of one k and the matching pair of B is (b, b), so one vdpbf16ps adds hi b + lo b, both
 * products exact. The result is within 2^-18 sum |x b| of the exact product plus the fp32
 * sums' rounding: fp32-accurate (tests: 5e-6 of sum |a b|; an SGEMM's own bound is K 2^-24),
 * at twice the forward's pairs per k. Subnormal pieces count as zero (DAZ), an infinite
 * hi keeps lo 0 (inf stays inf), and beta 1 starts the accumulator at C (dW's +=).
 */
#include "cpu_kernels.h"
#include "cpu_common.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { MR = 8, NR = 32, MC = 128, NC = 2048, KC = 384 /* pairs per block of K */ };

#if defined(__x86_64__)
#include <immintrin.h>

#define TARGET_BF16 __attribute__((target("arch=x86-64-v4,avx512bf16")))

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int has_bf16, bwd_on;

static void detect(void)
{
    __builtin_cpu_init();
    const char *off = getenv("LOOM_CPU_BF16DOT");
    has_bf16 = __builtin_cpu_supports("avx512bf16") && !(off && strcmp(off, "0") == 0);
    bwd_on = off && strcmp(off, "all") == 0; /* the backward products too */
}

int loom_cpu_gemm_bf16_available(void)
{
    pthread_once(&once, detect);
    return has_bf16 && loom_cpu_isa() == LOOM_CPU_ISA_AVX512;
}

int loom_cpu_gemm_bf16_backward_wanted(void)
{
    return loom_cpu_gemm_bf16_available() && bwd_on;
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

/* An operand: element (r, k) at f[r * rs + k * ks] (fp32) or h[...] (bf16 bits). */
typedef struct {
    const float *f;
    const uint16_t *h;
    size_t rs, ks;
} opnd;

/* The bf16 bits of element (r, k) (round to nearest even; exact for a bf16 value). */
static inline uint32_t bits_at(const opnd *o, size_t r, size_t k)
{
    const size_t at = r * o->rs + k * o->ks;
    return o->h ? o->h[at] : loom_cpu_bf16_from_f32(o->f[at]);
}

/* Split pairs of 16 fp32 values x: hi = bf16(x) low, lo = bf16(x - hi) high (x - hi is exact
 * in fp32; vcvtneps2bf16 rounds to nearest even and reads subnormals as zero). Where hi is
 * not finite lo is 0, so an inf stays inf (not inf - inf). */
TARGET_BF16 static inline __m512i split16(__m512 x)
{
    const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x));
    const __m512 r = _mm512_sub_ps(x, _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)));
    const __m512 rf = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), r);
    const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(rf));
    return _mm512_or_si512(hi, _mm512_slli_epi32(lo, 16));
}

/* Duplicated pairs (w low and high) of 16 bf16 values: fp32 holding them, or bits. */
TARGET_BF16 static inline __m512i dup16(const opnd *o, size_t at, __mmask16 m)
{
    __m512i w;
    if (o->h)
        w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, o->h + at));
    else
        w = _mm512_cvtepu16_epi32(
            (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, o->f + at)));
    return _mm512_or_si512(w, _mm512_slli_epi32(w, 16));
}

/* Rows [i0, i0+mc) of A, pairs [p0, p0+pc), into MR-row slivers: dst[(is/MR) * pc * MR +
 * q * MR + r] = pair p0+q of row i0+is+r (rows past mc zero). Pairs: elements 2p and 2p+1
 * (an odd K's last pair padded with +0), or with `split` element p's hi and lo. */
TARGET_BF16 static void pack_a(uint32_t *restrict dst, const opnd *A, int i0, int mc, int p0,
                               int pc, int K, int split)
{
    for (int is = 0; is < mc; is += MR, dst += (size_t)pc * MR) {
        const int mr = mc - is < MR ? mc - is : MR;
        if (split && A->rs == 1) { /* the MR rows of a k are adjacent */
            const __mmask16 m = (__mmask16)((1u << mr) - 1);
            for (int q = 0; q < pc; q++) {
                const float *a = A->f + (size_t)(p0 + q) * A->ks + (size_t)(i0 + is);
                _mm256_store_si256((__m256i *)(dst + (size_t)q * MR),
                                   _mm512_castsi512_si256(split16(_mm512_maskz_loadu_ps(m, a))));
            }
            continue;
        }
        for (int r = 0; r < MR; r++) {
            if (r >= mr) {
                for (int q = 0; q < pc; q++)
                    dst[q * MR + r] = 0;
                continue;
            }
            const size_t row = (size_t)(i0 + is + r);
            int q = 0;
            if (split && A->ks == 1) { /* a row's k are adjacent: 16 at a time */
                const float *a = A->f + row * A->rs + p0;
                for (; q < pc; q += 16) {
                    const __mmask16 m = (__mmask16)(pc - q >= 16 ? 0xffff : (1u << (pc - q)) - 1);
                    uint32_t t[16] __attribute__((aligned(64)));
                    _mm512_store_si512((void *)t, split16(_mm512_maskz_loadu_ps(m, a + q)));
                    for (int s = 0; s < 16 && q + s < pc; s++)
                        dst[(q + s) * MR + r] = t[s];
                }
                continue;
            }
            if (split) { /* neither stride 1: element by element */
                for (; q < pc; q++) {
                    uint32_t t[16] __attribute__((aligned(64)));
                    const float x = A->f[row * A->rs + (size_t)(p0 + q) * A->ks];
                    _mm512_store_si512((void *)t, split16(_mm512_set1_ps(x)));
                    dst[q * MR + r] = t[0];
                }
                continue;
            }
            const int k0 = 2 * p0, k1 = 2 * (p0 + pc) < K ? 2 * (p0 + pc) : K;
            if (A->f && A->ks == 1) { /* 32 floats -> 16 pairs, RNE */
                const float *a = A->f + row * A->rs;
                for (; k0 + 2 * q + 32 <= (k1 & ~1); q += 16) {
                    __m512bh p = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(a + k0 + 2 * q + 16),
                                                     _mm512_loadu_ps(a + k0 + 2 * q));
                    uint32_t t[16] __attribute__((aligned(64)));
                    _mm512_store_si512((void *)t, (__m512i)p);
                    for (int s = 0; s < 16; s++)
                        dst[(q + s) * MR + r] = t[s];
                }
            }
            for (; q < pc; q++) {
                const int k = k0 + 2 * q;
                dst[q * MR + r] = bits_at(A, row, (size_t)k) |
                                  (k + 1 < k1 ? bits_at(A, row, (size_t)k + 1) : 0) << 16;
            }
        }
    }
}

/* Rows [j0, j0+nr) of W, pairs [p0, p0+pc), into one NR-wide sliver: dst[q * NR + c] = pair
 * p0+q of row j0+c (rows past nr zero). Pairs: elements 2p and 2p+1, or with `split`
 * element p twice (so one vdpbf16ps multiplies it by A's hi and lo). */
TARGET_BF16 static void pack_w(uint32_t *restrict dst, const opnd *W, int j0, int nr, int p0,
                               int pc, int K, int split)
{
    if (split && W->rs == 1) { /* the NR rows of a k are adjacent */
        const __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
        const __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xffff : nr > 16 ? (1u << (nr - 16)) - 1 : 0);
        for (int q = 0; q < pc; q++) {
            const size_t at = (size_t)(p0 + q) * W->ks + (size_t)j0;
            _mm512_store_si512((void *)(dst + (size_t)q * NR), dup16(W, at, m0));
            _mm512_store_si512((void *)(dst + (size_t)q * NR + 16), dup16(W, at + 16, m1));
        }
        return;
    }
    const int k0 = 2 * p0, k1 = 2 * (p0 + pc) < K ? 2 * (p0 + pc) : K;
    for (int c = 0; c < NR; c++) {
        if (c >= nr) {
            for (int q = 0; q < pc; q++)
                dst[q * NR + c] = 0;
            continue;
        }
        const size_t row = (size_t)(j0 + c);
        for (int q = 0; q < pc; q++) {
            if (split) {
                const uint32_t w = bits_at(W, row, (size_t)(p0 + q));
                dst[q * NR + c] = w | w << 16;
                continue;
            }
            const int k = k0 + 2 * q;
            dst[q * NR + c] = bits_at(W, row, (size_t)k) |
                              (k + 1 < k1 ? bits_at(W, row, (size_t)k + 1) : 0) << 16;
        }
    }
}

/* C (m x n valid part of an 8x32 tile) = (load ? C : 0) + A sliver (kp pairs x 8) . W
 * sliver (kp x 32), the pairs added in order. */
TARGET_BF16 static void micro(int kp, const uint32_t *restrict a, const uint32_t *restrict w,
                              float *restrict c, int ldc, int m, int n, int load)
{
    __m512 acc[MR][2];
    float t[MR][NR] __attribute__((aligned(64)));
    const int full = m == MR && n == NR;
    if (load && !full)
        for (int i = 0; i < m; i++)
            memcpy(t[i], c + (size_t)i * ldc, (size_t)n * sizeof(float));
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        if (!load)
            acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        else if (full) {
            acc[i][0] = _mm512_loadu_ps(c + (size_t)i * ldc);
            acc[i][1] = _mm512_loadu_ps(c + (size_t)i * ldc + 16);
        } else {
            acc[i][0] = _mm512_load_ps(&t[i][0]);
            acc[i][1] = _mm512_load_ps(&t[i][16]);
        }
    }
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
    if (full) {
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            _mm512_storeu_ps(c + (size_t)i * ldc, acc[i][0]);
            _mm512_storeu_ps(c + (size_t)i * ldc + 16, acc[i][1]);
        }
        return;
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        _mm512_store_ps(&t[i][0], acc[i][0]);
        _mm512_store_ps(&t[i][16], acc[i][1]);
    }
    for (int i = 0; i < m; i++)
        memcpy(c + (size_t)i * ldc, t[i], (size_t)n * sizeof(float));
}

/* C (M,N) = (beta ? C : 0) + sum over k of A(i,k) W(j,k), in pairs (the header's order).
 * K is cut into blocks of KC pairs; each block's tile starts from what the previous left in
 * C, so the bits are those of one pass over K. */
static int gemm(int M, int N, int K, const opnd *A, const opnd *W, int split, int beta,
                float *C, int ldc)
{
    if (!loom_cpu_gemm_bf16_available())
        return -1;
    if (M <= 0 || N <= 0)
        return 0;
    const int kp = split ? K : (K + 1) / 2;
    if (kp <= 0) {
        if (!beta)
            for (int i = 0; i < M; i++)
                memset(C + (size_t)i * ldc, 0, (size_t)N * sizeof(float));
        return 0;
    }
    const int ncap = N < NC ? N : NC, kcap = kp < KC ? kp : KC;
    uint32_t *wp = keep(1, (size_t)((ncap + NR - 1) / NR) * kcap * NR);
    if (!wp)
        return -1;
    const int nth = omp_in_parallel() || (double)M * N * K < 8.0 * LOOM_CPU_PAR_MIN
                        ? 1
                        : omp_get_max_threads();
    /* row blocks: MC rows, fewer when that leaves threads idle (the bits do not depend on
     * the blocking) */
    int mcb = MC;
    if (nth > 1 && (M + MC - 1) / MC % nth) {
        const int per = ((M + MC - 1) / MC + nth - 1) / nth * nth;
        mcb = ((M + per - 1) / per + MR - 1) / MR * MR;
    }
    const int n_ic = (M + mcb - 1) / mcb;
    int fail = 0;
#pragma omp parallel num_threads(nth)
    {
        uint32_t *ap = keep(0, (size_t)((mcb + MR - 1) / MR) * MR * kcap);
        if (!ap) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp barrier
        for (int p0 = 0; p0 < kp && !fail; p0 += KC) { /* a block of K's pairs */
            const int pc = kp - p0 < KC ? kp - p0 : KC, load = beta || p0 > 0;
            for (int jc = 0; jc < N; jc += NC) { /* a panel of W's rows (C's columns) */
                const int nc = N - jc < NC ? N - jc : NC, n_js = (nc + NR - 1) / NR;
#pragma omp for schedule(static)
                for (int js = 0; js < n_js; js++)
                    pack_w(wp + (size_t)js * pc * NR, W, jc + js * NR,
                           nc - js * NR < NR ? nc - js * NR : NR, p0, pc, K, split);
#pragma omp for schedule(dynamic, 1)
                for (int ib = 0; ib < n_ic; ib++) {
                    const int i0 = ib * mcb, mc = M - i0 < mcb ? M - i0 : mcb;
                    pack_a(ap, A, i0, mc, p0, pc, K, split);
                    for (int js = 0; js < n_js; js++) {
                        const int nr = nc - js * NR < NR ? nc - js * NR : NR;
                        for (int is = 0; is < mc; is += MR)
                            micro(pc, ap + (size_t)is * pc, wp + (size_t)js * pc * NR,
                                  C + (size_t)(i0 + is) * ldc + jc + js * NR, ldc,
                                  mc - is < MR ? mc - is : MR, nr, load);
                    }
                }
            }
        }
    }
    return fail ? -1 : 0;
}

int loom_cpu_gemm_bf16(int M, int N, int K, const float *A, int lda, const uint16_t *W,
                       int ldw, float *C, int ldc)
{
    const opnd a = {A, NULL, (size_t)lda, 1}, w = {NULL, W, (size_t)ldw, 1};
    return gemm(M, N, K, &a, &w, 0, 0, C, ldc);
}

int loom_cpu_gemm_bf16_f32w(int M, int N, int K, const float *A, int lda, const float *W,
                            int ldw, float *C, int ldc)
{
    const opnd a = {A, NULL, (size_t)lda, 1}, w = {W, NULL, (size_t)ldw, 1};
    return gemm(M, N, K, &a, &w, 0, 0, C, ldc);
}

int loom_cpu_gemm_bf16_split(int transa, int transb, int M, int N, int K, const float *A,
                             int lda, const float *Bf, const uint16_t *Bh, int ldb, int beta,
                             float *C, int ldc)
{
    /* op(A)(i,k) = A[i lda + k] or A[k lda + i]; the kernel's W(j,k) = op(B)(k,j) */
    const opnd a = {A, NULL, transa ? 1 : (size_t)lda, transa ? (size_t)lda : 1};
    const opnd w = {Bf, Bh, transb ? (size_t)ldb : 1, transb ? 1 : (size_t)ldb};
    return gemm(M, N, K, &a, &w, 1, beta, C, ldc);
}

#else

int loom_cpu_gemm_bf16_split(int transa, int transb, int M, int N, int K, const float *A,
                             int lda, const float *Bf, const uint16_t *Bh, int ldb, int beta,
                             float *C, int ldc)
{
    (void)transa, (void)transb, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)Bf;
    (void)Bh, (void)ldb, (void)beta, (void)C, (void)ldc;
    return -1;
}

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

int loom_cpu_gemm_bf16_backward_wanted(void)
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

/* backend.h's matmul_backward_dt for dt bf16 (the header's backward products): fast mode
 * where the CPU has AVX512_BF16; elsewhere -1 before anything is written, and the caller
 * runs matmul_backward (canonical mode: always, for the fixed order its layouts rely on). */
int loom_cpu_matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const void *weight, int weight_bits, int B,
                                  int T, int C, int OC)
{
    if (loom_cpu_deterministic() || !loom_cpu_gemm_bf16_available())
        return -1;
    const int BT = B * T;
    const float *wf = weight_bits ? NULL : weight;
    const uint16_t *wh = weight_bits ? weight : NULL;
    /* a failure (out of memory) happens before C is written: dinp is overwritten and
     * dweight untouched, so the caller's matmul_backward gives the same result */
    if (dinp && loom_cpu_gemm_bf16_split(0, 0, BT, C, OC, dout, OC, wf, wh, C, 0, dinp, C))
        return -1;
    if (dweight &&
        loom_cpu_gemm_bf16_split(1, 0, OC, C, BT, dout, OC, inp, NULL, C, 1, dweight, C))
        return -1;
    if (dbias)
        loom_cpu_bias_backward(dbias, dout, (size_t)BT, OC);
    return 0;
}
