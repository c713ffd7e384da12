/* gemm_pack.h — what gemm.c's blocked GEMM and gemm_chunks.c's chunk trees share: the
 * blocking constants, the micro-kernel handle, the per-thread pack buffers and the
 * packing (gemm.c's header describes the scheme and its order of operations). Private to
 * kernels/cpu; static inline, so each file that includes it keeps its own buffers.
 */
#ifndef LOOM_CPU_GEMM_PACK_H
#define LOOM_CPU_GEMM_PACK_H

#include <stddef.h>
#include <stdlib.h>

enum {
    KC = 256,     /* depth of a packed slice (every ISA: the K-slices are the contract):
                   * A sliver (6-8 KB) + B sliver (8-32 KB) in L1/L2 */
    MC_MAX = 192, /* rows of A per packed block (a multiple of every MR): 192 KB, in L2 */
    NC = 2048,    /* columns of B per packed panel: 2 MB, stays in L2/L3 */
    BPACK = 1 << 20, /* floats of packed B (4 MB): K-slices packed at once (see below) */
    MR_MAX = 8,   /* the largest tile over the ISAs, for the stack packs */
    NR_MAX = 32
};

typedef void (*micro_kernel_fn)(int, const float *, const float *, float *, int, int, int, int);
/* A tile of mr full rows with op(A) read in place (gemm_kernel.h's UK_DIRECT): kc, a, its
 * strides along p and along the tile's rows, b, c, ldc, n (valid columns), store. */
typedef void (*micro_kernel_direct_fn)(int, const float *, int, int, const float *, float *, int,
                                       int, int);

/* One ISA's micro-kernel and the tile it computes (packing follows mr and nr). */
typedef struct {
    micro_kernel_fn run;
    micro_kernel_direct_fn direct;
    int mr, nr;
    const char *name;
} micro_kernel;

/* gemm.c: the micro-kernel of ISA level isa (LOOM_CPU_ISA_*; SSE2's above the CPU's best). */
micro_kernel loom_cpu_gemm_micro_kernel(int isa);

/* gemm_pack.c: pack_sliver's copying case for a full sliver of width W (a multiple of 8):
 * dst[p*W + r] = scale * X[(c0 + p)*ld + r0 + r]; W a multiple of 8, or 6. */
void loom_cpu_pack_rows(float *restrict dst, const float *X, int ld, int r0, int c0, int kc,
                        int W, float scale);
/* gemm_pack.c: pack_sliver's transposing case for a full sliver of width W (a multiple of
 * 8, or 6), in 8x8 blocks; the scalar loop's values. */
void loom_cpu_pack_transpose(float *restrict dst, const float *X, int ld, int r0, int c0, int kc,
                             int W, float scale);

/* A per-thread, 64-byte-aligned buffer of at least n floats, kept for the next call. */
static inline float *thread_buffer(int which, size_t n)
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

/* Inside a parallel region, called by every thread of the team: this thread's A-pack
 * buffer (MC_MAX x KC floats). *failed becomes 1 if any thread got none; the barrier makes
 * that visible to all before any of them starts work, so the team gives up together. */
static inline float *team_a_buffer(int *failed)
{
    float *ap = thread_buffer(1, (size_t)MC_MAX * KC);
    if (!ap) {
#pragma omp atomic write
        *failed = 1;
    }
#pragma omp barrier
    return ap;
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
    if (trans && n == W && (W % 8 == 0 || W == 6)) {
        /* full slivers of every tile width (8: SSE2, 16: AVX2, 32: AVX-512) and of the
         * AVX2/SSE2 tiles' 6 rows: row p is a
         * run of X, copied as vectors (as a loop GCC turned it into a memmove call per
         * 32-128 bytes: 4% of a canonical tiny step) */
        loom_cpu_pack_rows(dst, X, ld, r0, c0, kc, W, scale);
    } else if (trans) { /* Y(r, c) = X[c*ld + r]: row p of the sliver is contiguous in X */
        for (int p = 0; p < kc; p++) {
            const float *src = X + (size_t)(c0 + p) * ld + r0;
            for (int r = 0; r < n; r++)
                dst[p * W + r] = scale * src[r];
            for (int r = n; r < W; r++)
                dst[p * W + r] = 0.0f;
        }
    } else if (n == W && (W % 8 == 0 || W == 6)) { /* a transpose, in 8x8 blocks */
        loom_cpu_pack_transpose(dst, X, ld, r0, c0, kc, W, scale);
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
static inline void pack_a(float *restrict dst, const float *A, int lda, int ta, int i0, int mc, int p0,
                   int kc, float alpha, int MR)
{
    for (int is = 0; is < mc; is += MR) {
        const int mr = mc - is < MR ? mc - is : MR;
        pack_sliver(dst, A, lda, ta, i0 + is, mr, p0, kc, MR, alpha);
        dst += (size_t)kc * MR;
    }
}

/* A product's A operand for one K-slice: when alpha is 1 the pack would copy op(A)'s values
 * unchanged (1 * x is x), so full MR-row tiles read op(A) in place (micro_kernel.direct) and
 * only the block's last, partial sliver (zero-padded) is packed, at its place in ap. The
 * micro-kernel sees the same values in the same order: the bits of the packed path, less
 * the copy (at canonical tiny's shapes the packs were a sixth of loom's GEMM time). */
typedef struct {
    const float *a; /* op(A)(i0, p0) */
    int sap, sar;   /* its strides along p and along the rows */
    int full;       /* rows [0, full) read in place, the rest from the pack */
} a_operand;

static inline a_operand a_slice(float *restrict ap, const float *A, int lda, int ta, int i0, int mc,
                                int p0, int kc, float alpha, int MR)
{
    if (alpha != 1.0f) {
        pack_a(ap, A, lda, ta, i0, mc, p0, kc, alpha, MR);
        return (a_operand){NULL, 0, 0, 0};
    }
    const int full = mc / MR * MR;
    if (full < mc)
        pack_a(ap + (size_t)full * kc, A, lda, ta, i0 + full, mc - full, p0, kc, alpha, MR);
    return ta ? (a_operand){A + (size_t)p0 * lda + i0, lda, 1, full}
              : (a_operand){A + (size_t)i0 * lda + p0, 1, lda, full};
}

/* The tile of rows [is, is + MR) of the block a_slice prepared: C's tile (valid m x n) +=
 * (or = with store) its A rows times the B sliver bs. */
static inline void a_tile(micro_kernel uk, const a_operand *a, const float *ap, int is, int kc,
                          const float *bs, float *c, int ldc, int m, int n, int store)
{
    if (is < a->full)
        uk.direct(kc, a->a + (size_t)is * a->sar, a->sap, a->sar, bs, c, ldc, n, store);
    else
        uk.run(kc, ap + (size_t)is * kc, bs, c, ldc, m, n, store);
}

/* Pack op(B)[p0 .. p0+kc, j0 .. j0+nr] into one NR-column sliver: as a sliver of op(B)^T,
 * whose rows are the columns j. */
static inline void pack_b_sliver(float *restrict dst, const float *B, int ldb, int tb, int p0, int kc,
                          int j0, int nr, int NR)
{
    pack_sliver(dst, B, ldb, !tb, j0, nr, p0, kc, NR, 1.0f);
}

/* Rows per A block: at most MC_MAX; with several threads, at least 4 blocks per thread
 * where blocks can keep 48 rows (a thread descheduled on shared cores then holds up less
 * of the work), and a multiple of the thread count, of near-equal heights (1024 rows on 2
 * threads: 8 blocks of 132 rows or less, not 5 of 192 and one of 64). A multiple of MR;
 * *blocks gets the number of blocks. */
static inline int row_block_height(int M, int MR, int nth, int *blocks)
{
    int n_ic = (M + MC_MAX - 1) / MC_MAX;
    if (nth > 1 && n_ic < 4 * nth) {
        const int finer = M / 48 < 4 * nth ? M / 48 : 4 * nth;
        n_ic = finer > n_ic ? finer : n_ic;
    }
    n_ic = (n_ic + nth - 1) / nth * nth;
    int mc = (M + n_ic - 1) / n_ic;
    mc = (mc + MR - 1) / MR * MR;
    *blocks = (M + mc - 1) / mc;
    return mc;
}

#endif
