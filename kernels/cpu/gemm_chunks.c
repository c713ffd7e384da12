/* gemm_chunks.c — canonical mode's chunk tree of products in one call.
 *
 * Canonical mode sums a layer's products over fixed chunks of K (core/model/gpt_parallel.c:
 * the input features of a row-parallel layer, the output features behind an input
 * gradient) and adds the chunk results in a binary-counter tree, so that tensor-parallel
 * ranks holding some of the chunks give the bits of one rank holding all. Run as one GEMM
 * call per chunk (per segment of a chunk) and one accumulate per merge, a tiny model's step
 * made 8-24 GEMM calls of K = 16..64 and 7 full-size accumulate passes per layer product,
 * each its own OpenMP fork and join: canonical tiny cost +30% over fast mode where the
 * kernels alone cost +7%.
 *
 * loom_cpu_gemm_chunk_tree computes the same thing in one parallel region: B's K-slices
 * for a group of chunks are packed once (shared by the threads), then each thread takes a
 * block of C's rows and, for each chunk in order, runs the chunk's slices into that rows'
 * part of the tree level the chunk lands on and merges the levels as the counter carries,
 * while those rows are in its cache.
 *
 * Bits: each element goes through exactly the operations of the per-call sequence —
 * every K-slice is the same micro-kernel call over the same packed values (gemm.c's
 * "Order of operations": a row split, the tile a thread computes and the blocking never
 * enter), the first slice of a chunk stores and the others add, as gemm with beta 0 then 1
 * does, and each merge is the same single add, older level += newer. test_deterministic
 * compares the two bit for bit.
 */
#include "cpu_kernels.h"
#include "cpu_common.h"
#include "gemm_pack.h"

#include <omp.h>

enum { MAX_SLICES = 256 }; /* K-slices in one call (more: the per-call path) */

/* One K-slice of a chunk: op(A)'s columns / op(B)'s rows [k0, k0 + kc), kc <= KC. */
typedef struct {
    int k0, kc, first; /* first: the chunk's first slice, which stores */
    size_t boff;       /* its B slivers in the group's pack (floats) */
} slice;

/* dst (rows, n; leading dim ldd) += src (leading dim lds): one merge of the tree. A copy
 * per ISA: inlined into the OpenMP function (built for the baseline) it ran 4 floats at a
 * time, a quarter of the tree's own time in a canonical tiny step. One add per element on
 * every ISA, so the same bits. */
LOOM_CPU_BODY add_rows_body(float *dst, int ldd, const float *src, int lds, int rows, int n)
{
    for (int i = 0; i < rows; i++) {
        float *restrict d = dst + (size_t)i * ldd;
        const float *restrict s = src + (size_t)i * lds;
#pragma omp simd
        for (int j = 0; j < n; j++)
            d[j] += s[j];
    }
}
LOOM_CPU_VARIANTS(add_rows, (float *dst, int ldd, const float *src, int lds, int rows, int n),
                  (dst, ldd, src, lds, rows, n))

/* The tree's level d for rows from i0: C itself at the bottom, then the scratch levels. */
static float *level_at(float *C, int ldc, float *const *levels, int N, int d, int i0, int *ld)
{
    *ld = d ? N : ldc;
    return d ? levels[d - 1] + (size_t)i0 * N : C + (size_t)i0 * ldc;
}

/* Levels filled after chunk c (0-based) is pushed, merging as the binary counter carries:
 * the chunk landed on level popcount(c); pushing it is an increment of the count. */
static void tree_push_rows(float *C, int ldc, float *const *levels, int N, int c, int i0,
                           int rows)
{
    int depth = __builtin_popcount((unsigned)c) + 1;
    for (unsigned p = (unsigned)c + 1; !(p & 1); p >>= 1, depth--) {
        int ld_dst, ld_src;
        float *dst = level_at(C, ldc, levels, N, depth - 2, i0, &ld_dst);
        const float *src = level_at(C, ldc, levels, N, depth - 1, i0, &ld_src);
        add_rows(dst, ld_dst, src, ld_src, rows, N);
    }
}

/* The per-call sequence (the definition of the result): one loom GEMM per chunk segment,
 * one add per merge. For what the one-region path does not take (too many slices, a chunk
 * whose B does not fit the pack, an empty segment, no pack buffer). */
static void chunk_tree_by_calls(int ta, int tb, int M, int N, int chunks, int segs,
                                const int *start, const int *width, const float *A, int lda,
                                const float *B, int ldb, float *C, int ldc, float *const *levels)
{
    const int isa = loom_cpu_isa();
    for (int c = 0; c < chunks; c++) {
        int ld;
        float *dst = level_at(C, ldc, levels, N, __builtin_popcount((unsigned)c), 0, &ld);
        for (int s = 0; s < segs; s++) {
            const size_t k0 = (size_t)start[s] + (size_t)c * width[s];
            loom_cpu_sgemm_on(isa, ta, tb, M, N, width[s], 1.0f, ta ? A + k0 * lda : A + k0,
                              lda, tb ? B + k0 : B + k0 * ldb, ldb, s ? 1.0f : 0.0f, dst, ld);
        }
#pragma omp parallel for schedule(static) if ((size_t)M * N > LOOM_CPU_PAR_MIN)
        for (int i = 0; i < M; i++)
            tree_push_rows(C, ldc, levels, N, c, i, 1);
    }
}

/* What one call's row blocks share: the operands, the slices and the groups. */
typedef struct {
    micro_kernel uk;
    int ta, tb, N, n_js;
    const float *A, *B;
    int lda, ldb, ldc;
    float *C;
    float *const *levels;
    const slice *sl;
    const int *cs, *gc;
} tree_plan;

/* Packs the B slivers [qs0, qs1) of group g into bp (sliver js of slice q at q->boff +
 * js kc NR). */
static void tree_pack_b(const tree_plan *t, int g, float *bp, int qs0, int qs1)
{
    const int NR = t->uk.nr, q0 = t->cs[t->gc[g]];
    for (int qs = qs0; qs < qs1; qs++) {
        const slice *q = &t->sl[q0 + qs / t->n_js];
        const int js = qs % t->n_js, nr = t->N - js * NR < NR ? t->N - js * NR : NR;
        pack_b_sliver(bp + q->boff + (size_t)js * q->kc * NR, t->B, t->ldb, t->tb, q->k0, q->kc,
                      js * NR, nr, NR);
    }
}

/* Group g's chunks for rows [i0, i0 + mb) (at most MC_MAX): each chunk's slices into the
 * tree level it lands on, then the merges its push carries, while the rows are in cache. */
static void tree_rows(const tree_plan *t, int g, const float *bp, float *ap, int i0, int mb)
{
    const int MR = t->uk.mr, NR = t->uk.nr, N = t->N;
    for (int c = t->gc[g]; c < t->gc[g + 1]; c++) {
        int ld;
        float *dst = level_at(t->C, t->ldc, t->levels, N, __builtin_popcount((unsigned)c), i0,
                              &ld);
        for (int qi = t->cs[c]; qi < t->cs[c + 1]; qi++) {
            const slice *q = &t->sl[qi];
            const a_operand a = a_slice(ap, t->A, t->lda, t->ta, i0, mb, q->k0, q->kc, 1.0f, MR);
            for (int js = 0; js < t->n_js; js++) {
                const int nr = N - js * NR < NR ? N - js * NR : NR;
                const float *bs = bp + q->boff + (size_t)js * q->kc * NR;
                for (int is = 0; is < mb; is += MR)
                    a_tile(t->uk, &a, ap, is, q->kc, bs, dst + (size_t)is * ld + js * NR, ld,
                           mb - is < MR ? mb - is : MR, nr, q->first);
            }
        }
        tree_push_rows(t->C, t->ldc, t->levels, N, c, i0, mb);
    }
}

/* Below this many multiply-adds (gemm.c's SLAB_BELOW) each thread takes one slab of rows
 * and runs the whole tree over it with its own packs: one fork and join, no barriers, no
 * B slivers read from the other core's pack. A row split changes no bit. A thread without
 * pack buffers runs its slab through the per-call sequence. */
#define SLAB_BELOW 134217728.0 /* 2^27 */

static void tree_slabs(const tree_plan *t, int nth, int M, int n_g, size_t pack, int chunks,
                       int segs, const int *start, const int *width)
{
    const int MR = t->uk.mr;
    int depth = 0; /* levels in use: the largest popcount below chunks */
    for (int c = 0; c < chunks; c++)
        depth = __builtin_popcount((unsigned)c) > depth ? __builtin_popcount((unsigned)c) : depth;
#pragma omp parallel for schedule(static) num_threads(nth)
    for (int p = 0; p < nth; p++) {
        const int s = (int)((long)M * p / nth) / MR * MR;
        const int e = p == nth - 1 ? M : (int)((long)M * (p + 1) / nth) / MR * MR;
        if (e <= s)
            continue;
        float *bp = thread_buffer(0, pack), *ap = thread_buffer(1, (size_t)MC_MAX * KC);
        if (!bp || !ap) {
            float *lv[64];
            for (int d = 0; d < depth; d++)
                lv[d] = t->levels[d] + (size_t)s * t->N;
            chunk_tree_by_calls(t->ta, t->tb, e - s, t->N, chunks, segs, start, width,
                                t->ta ? t->A + s : t->A + (size_t)s * t->lda, t->lda, t->B,
                                t->ldb, t->C + (size_t)s * t->ldc, t->ldc, lv);
            continue;
        }
        for (int g = 0; g < n_g; g++) {
            tree_pack_b(t, g, bp, 0, (t->cs[t->gc[g + 1]] - t->cs[t->gc[g]]) * t->n_js);
            for (int i0 = s; i0 < e; i0 += MC_MAX)
                tree_rows(t, g, bp, ap, i0, e - i0 < MC_MAX ? e - i0 : MC_MAX);
        }
    }
}

void loom_cpu_gemm_chunk_tree(int ta, int tb, int M, int N, int chunks, int segs,
                              const int *start, const int *width, const float *A, int lda,
                              const float *B, int ldb, float *C, int ldc, float *const *levels)
{
    if (M <= 0 || N <= 0 || chunks <= 0)
        return;
    const micro_kernel uk = loom_cpu_gemm_micro_kernel(loom_cpu_isa());
    const int MR = uk.mr, NR = uk.nr, n_js = (N + NR - 1) / NR, npad = n_js * NR;

    /* the slices, chunk by chunk (chunk c's are [cs[c], cs[c+1])), and the groups of
     * chunks whose B fits the pack together (group g: chunks [gc[g], gc[g+1])) */
    slice sl[MAX_SLICES];
    int cs[65], gc[65], n_sl = 0, n_g = 0, ok = chunks <= 64;
    size_t group = 0, pack = 0, work = 0;
    for (int c = 0; c < chunks && ok; c++) {
        cs[c] = n_sl;
        size_t floats = 0;
        for (int s = 0; s < segs && ok; s++) {
            ok = width[s] > 0; /* beta 0 over K = 0 writes zeros, then adds: keep the calls */
            for (int pc = 0; ok && pc < width[s]; pc += KC) {
                ok = n_sl < MAX_SLICES;
                if (!ok)
                    break;
                const int kc = width[s] - pc < KC ? width[s] - pc : KC;
                sl[n_sl++] = (slice){start[s] + c * width[s] + pc, kc, s == 0 && pc == 0, 0};
                floats += (size_t)kc * npad;
            }
        }
        ok = ok && floats <= BPACK;
        if (!ok)
            break;
        if (c == 0 || group + floats > BPACK) {
            gc[n_g++] = c;
            group = 0;
        }
        for (int q = cs[c]; q < n_sl; q++) {
            sl[q].boff = group;
            group += (size_t)sl[q].kc * npad;
            work += (size_t)sl[q].kc;
        }
        pack = group > pack ? group : pack;
    }
    float *bp = ok ? thread_buffer(0, pack) : NULL;
    if (!bp) {
        chunk_tree_by_calls(ta, tb, M, N, chunks, segs, start, width, A, lda, B, ldb, C, ldc,
                            levels);
        return;
    }
    cs[chunks] = n_sl;
    gc[n_g] = chunks;

    const int nth = omp_in_parallel() || (double)M * N * work < 8.0 * LOOM_CPU_PAR_MIN
                        ? 1
                        : omp_get_max_threads();
    const tree_plan t = {uk, ta, tb, N, n_js, A, B, lda, ldb, ldc, C, levels, sl, cs, gc};
    if (nth > 1 && (double)M * N * work < SLAB_BELOW) {
        tree_slabs(&t, nth, M, n_g, pack, chunks, segs, start, width);
        return;
    }
    int n_ic;
    const int mc = row_block_height(M, MR, nth, &n_ic);
    int failed = 0;
#pragma omp parallel num_threads(nth)
    {
        float *ap = team_a_buffer(&failed);
        for (int g = 0; g < n_g && !failed; g++) {
            const int q0 = cs[gc[g]], nq = cs[gc[g + 1]] - q0;
#pragma omp for schedule(static)
            for (int qs = 0; qs < nq * n_js; qs++)
                tree_pack_b(&t, g, bp, qs, qs + 1);
#pragma omp for schedule(dynamic, 1)
            for (int ib = 0; ib < n_ic; ib++)
                tree_rows(&t, g, bp, ap, ib * mc, M - ib * mc < mc ? M - ib * mc : mc);
        }
    }
    if (failed) /* every thread stopped at the barrier, before touching C */
        chunk_tree_by_calls(ta, tb, M, N, chunks, segs, start, width, A, lda, B, ldb, C, ldc,
                            levels);
}
