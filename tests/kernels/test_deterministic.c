/* test_deterministic.c — canonical mode (loom_cpu_set_deterministic(1), the backend's
 * set_deterministic): every matmul output element gets bits that depend only on K and the
 * data. A linear layer split by output columns — forward's (BT,C) x (OC,C)^T with the
 * weight's rows (and the bias) cut into 2, 4, 8 blocks, or unevenly, each block a separate
 * call — gives exactly the columns of the unsplit call; so does matmul_backward's dweight
 * (and dbias) split by rows. Sizes from tiny (every tile an edge tile) to ones with K above
 * the GEMM's 256-deep slices and enough work to run on threads. The same bits on 1 and 2
 * OpenMP threads. Attention: heads [h0,h1) computed alone (their q|k|v columns as a
 * k-head qkv of width 3C k/NH) give those heads' bits of the full call, forward (out, att)
 * and backward (dqkv). The one-call chunk tree gives the bits of the gemm and accumulate
 * calls it stands for; so does the one-call tree of a layer norm's or a bias's gradient
 * (rep_chunk_tree) those of its per-chunk kernel calls and merges.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void assert_same(const char *what, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                      "%s[%zu]: %.9g split, %.9g whole", what, i, got[i], want[i]);
}

/* cols [o0,o1) of a (rows, ld) matrix into a dense (rows, o1-o0) one */
static float *cols_of(const float *x, int rows, int ld, int o0, int o1)
{
    float *y = kt_alloc((size_t)rows * (o1 - o0));
    for (int r = 0; r < rows; r++)
        memcpy(y + (size_t)r * (o1 - o0), x + (size_t)r * ld + o0, sizeof(float) * (o1 - o0));
    return y;
}

/* Forward and dweight/dbias of one (BT, C, OC) layer, whole and cut at bounds[0..nb]. */
static void check_split(int BT, int C, int OC, const int *bounds, int nb, int with_bias)
{
    float *inp = kt_alloc((size_t)BT * C), *w = kt_alloc((size_t)OC * C), *b = kt_alloc(OC);
    float *out = kt_alloc((size_t)BT * OC), *dout = kt_alloc((size_t)BT * OC);
    float *dw = kt_alloc((size_t)OC * C), *db = kt_alloc(OC);
    kt_fill(inp, (size_t)BT * C, 1, -1, 1);
    kt_fill(w, (size_t)OC * C, 2, -1, 1);
    kt_fill(b, OC, 3, -1, 1);
    kt_fill(dout, (size_t)BT * OC, 4, -1, 1);
    kt_fill(dw, (size_t)OC * C, 5, -1, 1); /* dweight, dbias accumulate onto these */
    kt_fill(db, OC, 6, -1, 1);
    float *dw0 = kt_alloc((size_t)OC * C), *db0 = kt_alloc(OC);
    memcpy(dw0, dw, sizeof(float) * OC * C);
    memcpy(db0, db, sizeof(float) * OC);
    loom_cpu_matmul_forward(out, inp, w, with_bias ? b : NULL, 1, BT, C, OC);
    loom_cpu_matmul_backward(NULL, dw, with_bias ? db : NULL, dout, inp, w, 1, BT, C, OC);
    /* The whole call against double-precision references, the bias included:
     * out = inp w^T + (b in every row); dweight = dw0 + dout^T inp; dbias = db0 + the
     * column sums of dout, as a (1 x BT) x (BT x OC) product of ones and dout. */
    float *brows = kt_alloc((size_t)BT * OC), *ones = kt_alloc(BT);
    for (int r = 0; r < BT; r++) {
        memcpy(brows + (size_t)r * OC, b, sizeof(float) * OC);
        ones[r] = 1.0f;
    }
    double err = loom_cpu_sgemm_check(0, 1, BT, OC, C, 1.0f, inp, C, w, C, with_bias ? 1.0f : 0.0f,
                                      brows, out, OC);
    ck_assert_msg(err < LOOM_CPU_SGEMM_TOL, "out %dx%dx%d%s: relative error %g", BT, C, OC,
                  with_bias ? " +bias" : "", err);
    err = loom_cpu_sgemm_check(1, 0, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dw0, dw, C);
    ck_assert_msg(err < LOOM_CPU_SGEMM_TOL, "dweight %dx%dx%d: relative error %g", BT, C, OC, err);
    if (with_bias) {
        err = loom_cpu_sgemm_check(0, 0, 1, OC, BT, 1.0f, ones, BT, dout, OC, 1.0f, db0, db, OC);
        ck_assert_msg(err < LOOM_CPU_SGEMM_TOL, "dbias %dx%dx%d: relative error %g", BT, C, OC, err);
    }
    free(brows), free(ones);
    for (int k = 0; k < nb; k++) {
        const int o0 = bounds[k], o1 = bounds[k + 1], n = o1 - o0;
        char what[96];
        float *o = kt_alloc((size_t)BT * n), *d = cols_of(dout, BT, OC, o0, o1);
        float *dwk = kt_alloc((size_t)n * C), *dbk = kt_alloc(n);
        memcpy(dwk, dw0 + (size_t)o0 * C, sizeof(float) * n * C);
        memcpy(dbk, db0 + o0, sizeof(float) * n);
        loom_cpu_matmul_forward(o, inp, w + (size_t)o0 * C, with_bias ? b + o0 : NULL, 1, BT, C,
                                n);
        loom_cpu_matmul_backward(NULL, dwk, with_bias ? dbk : NULL, d, inp, w + (size_t)o0 * C,
                                 1, BT, C, n);
        float *want = cols_of(out, BT, OC, o0, o1);
        snprintf(what, sizeof what, "out %dx%dx%d cols [%d,%d)%s", BT, C, OC, o0, o1,
                 with_bias ? " +bias" : "");
        assert_same(what, o, want, (size_t)BT * n);
        snprintf(what, sizeof what, "dweight %dx%dx%d rows [%d,%d)", BT, C, OC, o0, o1);
        assert_same(what, dwk, dw + (size_t)o0 * C, (size_t)n * C);
        if (with_bias) {
            snprintf(what, sizeof what, "dbias %dx%dx%d [%d,%d)", BT, C, OC, o0, o1);
            assert_same(what, dbk, db + o0, n);
        }
        free(o), free(d), free(dwk), free(dbk), free(want);
    }
    free(inp), free(w), free(b), free(out), free(dout), free(dw), free(db), free(dw0), free(db0);
}

static const int sizes[][3] = {
    {8, 16, 24},    /* every tile an edge tile */
    {64, 64, 256},  /* threaded */
    {96, 300, 136}, /* K = 300: two K-slices; N not a multiple of 32 */
    {37, 520, 72},  /* odd rows, three K-slices */
    {5, 24, 8},
};

START_TEST(test_matmul_split)
{
    loom_cpu_set_deterministic(1);
    ck_assert_int_eq(loom_cpu_deterministic(), 1);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int BT = sizes[s][0], C = sizes[s][1], OC = sizes[s][2];
        for (int nb = 2; nb <= 8; nb *= 2) {
            if (OC % nb)
                continue;
            int bounds[9];
            for (int k = 0; k <= nb; k++)
                bounds[k] = OC / nb * k;
            check_split(BT, C, OC, bounds, nb, 0);
            check_split(BT, C, OC, bounds, nb, 1);
        }
        const int uneven[4] = {0, 1, OC / 2 + 3 < OC ? OC / 2 + 3 : OC - 1, OC};
        check_split(BT, C, OC, uneven, 3, 1);
    }
    loom_cpu_set_deterministic(0);
    ck_assert_int_eq(loom_cpu_deterministic(), 0);
}
END_TEST

enum { TBT = 128, TC = 300, TOC = 200 };

static void forward(void *unused, float *o)
{
    float *inp = kt_alloc((size_t)TBT * TC), *w = kt_alloc((size_t)TOC * TC), *b = kt_alloc(TOC);
    kt_fill(inp, (size_t)TBT * TC, 1, -1, 1);
    kt_fill(w, (size_t)TOC * TC, 2, -1, 1);
    kt_fill(b, TOC, 3, -1, 1);
    loom_cpu_matmul_forward(o, inp, w, b, 1, TBT, TC, TOC);
    free(inp), free(w), free(b);
}

static void backward(void *unused, float *o)
{
    float *inp = kt_alloc((size_t)TBT * TC), *w = kt_alloc((size_t)TOC * TC);
    float *dout = kt_alloc((size_t)TBT * TOC);
    kt_fill(inp, (size_t)TBT * TC, 1, -1, 1);
    kt_fill(w, (size_t)TOC * TC, 2, -1, 1);
    kt_fill(dout, (size_t)TBT * TOC, 4, -1, 1);
    /* o = dinp (TBT,TC) | dweight (TOC,TC) | dbias (TOC) */
    loom_cpu_matmul_backward(o, o + (size_t)TBT * TC, o + (size_t)TBT * TC + (size_t)TOC * TC,
                             dout, inp, w, 1, TBT, TC, TOC);
    free(inp), free(w), free(dout);
}

START_TEST(test_thread_independent)
{
    loom_cpu_set_deterministic(1);
    kt_assert_thread_independent("canonical forward", forward, NULL, (size_t)TBT * TOC);
    kt_assert_thread_independent("canonical backward", backward, NULL,
                                 (size_t)TBT * TC + (size_t)TOC * TC + TOC);
    loom_cpu_set_deterministic(0);
}
END_TEST

/* Heads [h0,h1) of a (B,T,3C) qkv as a k-head (B,T,3C') one, C' = C k / NH. */
static float *heads_of(const float *qkv, int B, int T, int C, int hs, int h0, int h1)
{
    const int Ck = (h1 - h0) * hs;
    float *y = kt_alloc((size_t)B * T * 3 * Ck);
    for (int bt = 0; bt < B * T; bt++)
        for (int part = 0; part < 3; part++)
            memcpy(y + (size_t)bt * 3 * Ck + part * Ck,
                   qkv + (size_t)bt * 3 * C + part * C + h0 * hs, sizeof(float) * Ck);
    return y;
}

START_TEST(test_attention_heads)
{
    enum { B = 2, T = 70, NH = 4, HS = 12, C = NH * HS }; /* T > 64: two causal row blocks */
    loom_cpu_set_deterministic(1);
    float *qkv = kt_alloc((size_t)B * T * 3 * C), *out = kt_alloc((size_t)B * T * C);
    float *att = kt_alloc((size_t)B * NH * T * T), *dout = kt_alloc((size_t)B * T * C);
    float *dqkv = kt_alloc((size_t)B * T * 3 * C), *scr = kt_alloc((size_t)2 * B * NH * T * T);
    kt_fill(qkv, (size_t)B * T * 3 * C, 1, -2, 2);
    kt_fill(dout, (size_t)B * T * C, 2, -1, 1);
    loom_cpu_attention_forward(out, att, qkv, B, T, C, NH);
    loom_cpu_attention_backward(dqkv, scr, dout, qkv, att, B, T, C, NH);
    const int ranges[][2] = {{0, 2}, {2, 4}, {1, 2}, {3, 4}, {1, 4}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
        const int h0 = ranges[r][0], h1 = ranges[r][1], k = h1 - h0, Ck = k * HS;
        float *q = heads_of(qkv, B, T, C, HS, h0, h1);
        float *o = kt_alloc((size_t)B * T * Ck), *a = kt_alloc((size_t)B * k * T * T);
        float *dq = kt_alloc((size_t)B * T * 3 * Ck), *s = kt_alloc((size_t)2 * B * k * T * T);
        float *d = cols_of(dout, B * T, C, h0 * HS, h1 * HS);
        loom_cpu_attention_forward(o, a, q, B, T, Ck, k);
        loom_cpu_attention_backward(dq, s, d, q, a, B, T, Ck, k);
        char what[64];
        float *want = cols_of(out, B * T, C, h0 * HS, h1 * HS);
        snprintf(what, sizeof what, "out heads [%d,%d)", h0, h1);
        assert_same(what, o, want, (size_t)B * T * Ck);
        for (int b = 0; b < B; b++) {
            snprintf(what, sizeof what, "att b%d heads [%d,%d)", b, h0, h1);
            assert_same(what, a + (size_t)b * k * T * T, att + ((size_t)b * NH + h0) * T * T,
                        (size_t)k * T * T);
        }
        float *dwant = heads_of(dqkv, B, T, C, HS, h0, h1);
        snprintf(what, sizeof what, "dqkv heads [%d,%d)", h0, h1);
        assert_same(what, dq, dwant, (size_t)B * T * 3 * Ck);
        free(q), free(o), free(a), free(dq), free(s), free(d), free(want), free(dwant);
    }
    free(qkv), free(out), free(att), free(dout), free(dqkv), free(scr);
    loom_cpu_set_deterministic(0);
}
END_TEST

/* One gemm_chunk_tree case: transposes, shape, chunks and segment widths (segment s
 * starts after all chunks of the segments before it, as the fused QKV's q, k, v). */
typedef struct {
    int ta, tb, M, N, chunks, segs, width[3], ldc_pad;
} tree_case;

/* C = the tree as the per-call sequence core/model/gpt_parallel.c made before the fused
 * call: one canonical gemm per chunk segment, one accumulate per merge. */
static void tree_by_calls(const tree_case *t, const int *start, const float *A, int lda,
                          const float *B, int ldb, float *C, float *const *levels)
{
    float *lv[4] = {C, levels[0], levels[1], levels[2]};
    const size_t n = (size_t)t->M * t->N;
    for (int c = 0, depth = 0, pushed = 0; c < t->chunks; c++) {
        for (int s = 0; s < t->segs; s++) {
            const size_t k0 = (size_t)start[s] + (size_t)c * t->width[s];
            loom_cpu_sgemm(t->ta, t->tb, t->M, t->N, t->width[s], 1.0f,
                           t->ta ? A + k0 * lda : A + k0, lda, t->tb ? B + k0 : B + k0 * ldb,
                           ldb, s ? 1.0f : 0.0f, lv[depth], t->N);
        }
        depth++;
        for (int p = ++pushed; !(p & 1); p >>= 1, depth--)
            loom_cpu_accumulate(lv[depth - 2], lv[depth - 1], n);
    }
}

static void check_tree(const tree_case *t, int threads)
{
    int start[3], K = 0;
    for (int s = 0; s < t->segs; s++) {
        start[s] = K;
        K += t->chunks * t->width[s];
    }
    const int lda = t->ta ? t->M : K, ldb = t->tb ? K : t->N, ldc = t->N + t->ldc_pad;
    float *A = kt_alloc((size_t)t->M * K), *B = kt_alloc((size_t)K * t->N);
    float *want = kt_alloc((size_t)t->M * t->N), *got = kt_alloc((size_t)t->M * ldc);
    float *lw[3], *lg[3];
    for (int l = 0; l < 3; l++) {
        lw[l] = kt_alloc((size_t)t->M * t->N);
        lg[l] = kt_alloc((size_t)t->M * t->N);
        kt_fill(lg[l], (size_t)t->M * t->N, 20 + l, -1, 1); /* scratch: stale values */
    }
    kt_fill(A, (size_t)t->M * K, 11, -1, 1);
    kt_fill(B, (size_t)K * t->N, 12, -1, 1);
    kt_fill(got, (size_t)t->M * ldc, 13, -1, 1); /* overwritten, the padding kept */
    float *got0 = kt_alloc((size_t)t->M * ldc);
    memcpy(got0, got, sizeof(float) * t->M * ldc);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    tree_by_calls(t, start, A, lda, B, ldb, want, lw);
    loom_cpu_gemm_chunk_tree(t->ta, t->tb, t->M, t->N, t->chunks, t->segs, start, t->width, A,
                             lda, B, ldb, got, ldc, lg);
    omp_set_num_threads(saved);
    char what[128];
    snprintf(what, sizeof what, "tree ta%d tb%d %dx%d chunks %d segs %d w %d threads %d", t->ta,
             t->tb, t->M, t->N, t->chunks, t->segs, t->width[0], threads);
    for (int i = 0; i < t->M; i++) {
        assert_same(what, got + (size_t)i * ldc, want + (size_t)i * t->N, (size_t)t->N);
        assert_same("padding of C", got + (size_t)i * ldc + t->N, got0 + (size_t)i * ldc + t->N,
                    (size_t)t->ldc_pad);
    }
    free(A), free(B), free(want), free(got), free(got0);
    for (int l = 0; l < 3; l++)
        free(lw[l]), free(lg[l]);
}

/* loom_cpu_gemm_chunk_tree (backend.h's gemm_chunk_tree) gives the bits of the per-call
 * sequence it stands for: the model's two uses (a row-parallel forward, A @ W^T over K
 * chunks; an input gradient over the fused QKV's three segments, k and v narrower as under
 * grouped-query attention), widths above the GEMM's 256-deep slice, chunks whose packed B
 * must be split in groups (N 1024) or does not fit at all (the per-call path), edge tiles,
 * a padded C, on 1 and 2 threads. */
START_TEST(test_chunk_tree)
{
    loom_cpu_set_deterministic(1);
    const tree_case cases[] = {
        {0, 1, 512, 128, 8, 1, {16}, 0},        /* tiny's attention projection */
        {0, 0, 512, 128, 8, 3, {16, 16, 16}, 0}, /* tiny's qkv input gradient */
        {0, 0, 97, 40, 4, 3, {24, 8, 8}, 5},    /* grouped kv widths, odd rows, padded C */
        {0, 1, 37, 136, 8, 1, {300}, 3},        /* two K-slices a chunk */
        {0, 0, 64, 72, 2, 1, {520}, 0},
        {1, 0, 50, 24, 8, 1, {7}, 0},
        {1, 1, 29, 33, 1, 2, {9, 5}, 0},
        {0, 1, 13, 1024, 4, 1, {300}, 0}, /* 3 chunks of B, then 1, a group */
        {0, 1, 7, 2048, 2, 1, {600}, 0},  /* a chunk over the pack: the per-call path */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int threads = 1; threads <= 2; threads++)
            check_tree(&cases[c], threads);
    loom_cpu_set_deterministic(0);
}
END_TEST

/* part = the replicated gradient's tree as core/model/gpt_parallel.c makes it without
 * the one call: per chunk, a zeroed tree level, the kernel over the chunk's rows into it,
 * then the merges as the counter carries. */
static void rep_by_calls(int kind, float *part, float *const *lv3, int chunks, float *dinp,
                         const float *dout, const float *inp, const float *w, const float *mean,
                         const float *rstd, size_t rows, int C)
{
    float *lv[4] = {part, lv3[0], lv3[1], lv3[2]};
    const size_t n = kind == 0 ? 2 * (size_t)C : (size_t)C, rc = rows / (size_t)chunks;
    for (int c = 0, depth = 0, pushed = 0; c < chunks; c++) {
        float *slot = lv[depth];
        const size_t r0 = (size_t)c * rc, off = r0 * (size_t)C;
        memset(slot, 0, n * sizeof(float));
        if (kind == 0)
            loom_cpu_layernorm_backward(dinp + off, slot, slot + C, dout + off, inp + off, w,
                                        mean + r0, rstd + r0, 1, (int)rc, C);
        else
            loom_cpu_bias_backward(slot, dout + off, rc, C);
        depth++;
        for (int p = ++pushed; !(p & 1); p >>= 1, depth--)
            loom_cpu_accumulate(lv[depth - 2], lv[depth - 1], n);
    }
}

/* loom_cpu_rep_chunk_tree (backend.h's rep_chunk_tree): the bits of rep_by_calls, part and
 * dinp, for layer norms and biases, 8 chunks (the model's) and 2, rows of a tiny step (512:
 * on the threads) and of a short one (one thread), on 1 and 2 threads. */
START_TEST(test_rep_chunk_tree)
{
    const struct { int kind, chunks, rows, C; } cases[] = {
        {0, 8, 512, 128}, {1, 8, 512, 384}, {0, 2, 48, 40}, {1, 8, 64, 24}, {0, 8, 1024, 96}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int threads = 1; threads <= 2; threads++) {
            const int kind = cases[k].kind, chunks = cases[k].chunks, C = cases[k].C;
            const size_t rows = (size_t)cases[k].rows, n = kind == 0 ? 2 * (size_t)C : (size_t)C;
            float *dout = kt_alloc(rows * C), *inp = kt_alloc(rows * C), *w = kt_alloc(C);
            float *mean = kt_alloc(rows), *rstd = kt_alloc(rows);
            float *d_want = kt_alloc(rows * C), *d_got = kt_alloc(rows * C);
            float *want = kt_alloc(n), *got = kt_alloc(n), *scratch = kt_alloc((chunks - 1) * n);
            float *lv[3] = {kt_alloc(n), kt_alloc(n), kt_alloc(n)};
            kt_fill(dout, rows * C, 31, -1, 1);
            kt_fill(inp, rows * C, 32, -2, 2);
            kt_fill(w, C, 33, 0.5f, 1.5f);
            kt_fill(mean, rows, 34, -0.1f, 0.1f);
            kt_fill(rstd, rows, 35, 0.5f, 2);
            kt_fill(got, n, 36, -1, 1); /* overwritten */
            kt_fill(scratch, (chunks - 1) * n, 37, -1, 1); /* stale */
            const int saved = omp_get_max_threads();
            omp_set_num_threads(threads);
            rep_by_calls(kind, want, lv, chunks, d_want, dout, inp, w, mean, rstd, rows, C);
            loom_cpu_rep_chunk_tree(kind, got, scratch, chunks, d_got, dout, inp, w, mean, rstd,
                                    rows, C);
            omp_set_num_threads(saved);
            char what[96];
            snprintf(what, sizeof what, "rep tree kind %d chunks %d rows %zu C %d threads %d",
                     kind, chunks, rows, C, threads);
            assert_same(what, got, want, n);
            if (kind == 0)
                assert_same("its dinp", d_got, d_want, rows * C);
            free(dout), free(inp), free(w), free(mean), free(rstd), free(d_want), free(d_got);
            free(want), free(got), free(scratch), free(lv[0]), free(lv[1]), free(lv[2]);
        }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("deterministic");
    TCase *tc = tcase_create("deterministic");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_matmul_split);
    tcase_add_test(tc, test_thread_independent);
    tcase_add_test(tc, test_attention_heads);
    tcase_add_test(tc, test_chunk_tree);
    tcase_add_test(tc, test_rep_chunk_tree);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
