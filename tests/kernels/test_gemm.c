/* test_gemm.c — gemm.c's order-of-operations contract, on every ISA this CPU has
 * (loom_cpu_sgemm_on runs the GEMM on a chosen ISA's micro-kernel in this process):
 *   - each ISA's result matches the double-precision reference (loom_cpu_sgemm_check);
 *   - on one ISA, the bits do not depend on the thread count (1, 2, 3), on splitting the
 *     product by rows or by columns into separate calls (cuts that are not multiples of
 *     any micro-tile, so edge tiles land in new places), or on the leading dimensions;
 *   - AVX-512 and AVX2 give the same bits as each other (both one FMA per step, in the
 *     same order; gemm.c's header). SSE2 (no FMA) is only held to the reference.
 * Shapes: all four transposes, K across the 256-deep slices, enough work to run threaded,
 * beta 0 (over NaN), 1 and another.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int ta, tb, M, N, K;
    float alpha, beta;
} gemm_case;

static const gemm_case cases[] = {
    {0, 0, 203, 171, 700, 1.0f, 0.0f},   {0, 1, 97, 301, 513, 0.75f, 1.0f},
    {1, 0, 256, 64, 256, -1.0f, 0.5f},   {1, 1, 61, 45, 1030, 1.0f, 0.0f},
    {0, 1, 1024, 96, 130, 1.0f, 1.0f},   {0, 0, 7, 2100, 300, 1.0f, 0.0f},
};

typedef struct {
    const gemm_case *c;
    float *A, *B, *C0;
    int lda, ldb, ldc, pad;
} problem;

/* The case's A, B and C0 with pad added to every leading dimension; the same values for
 * every pad (the padding holds other numbers, which must not be read). */
static problem make(const gemm_case *c, int pad)
{
    problem p = {c, NULL, NULL, NULL, (c->ta ? c->M : c->K) + pad, (c->tb ? c->K : c->N) + pad,
                 c->N + pad, pad};
    const int ra = c->ta ? c->K : c->M, rb = c->tb ? c->N : c->K;
    const size_t na = (size_t)ra * p.lda, nb = (size_t)rb * p.ldb, nc = (size_t)c->M * p.ldc;
    p.A = kt_alloc(na), p.B = kt_alloc(nb), p.C0 = kt_alloc(nc);
    kt_fill(p.A, na, 21 + pad, -1, 1);
    kt_fill(p.B, nb, 22 + pad, -1, 1);
    kt_fill(p.C0, nc, 23 + pad, -1, 1);
    const int wa = p.lda - pad, wb = p.ldb - pad, wc = p.ldc - pad;
    for (int r = 0; r < ra; r++)
        kt_fill(p.A + (size_t)r * p.lda, wa, 1000 + r, -1, 1);
    for (int r = 0; r < rb; r++)
        kt_fill(p.B + (size_t)r * p.ldb, wb, 5000 + r, -1, 1);
    for (int r = 0; r < c->M; r++) {
        float *row = p.C0 + (size_t)r * p.ldc;
        kt_fill(row, wc, 9000 + r, -1, 1);
        if (c->beta == 0.0f)
            for (int j = 0; j < wc; j++)
                row[j] = NAN; /* beta 0: C is never read */
    }
    return p;
}

static void release(problem *p)
{
    free(p->A), free(p->B), free(p->C0);
}

/* C = the product on isa, rows [r0,r1) and columns [c0,c1) only (one call), on nth threads;
 * C starts as a copy of C0. */
static void run_part(const problem *p, int isa, int nth, float *C, int r0, int r1, int c0, int c1)
{
    const gemm_case *c = p->c;
    const float *A = c->ta ? p->A + r0 : p->A + (size_t)r0 * p->lda;
    const float *B = c->tb ? p->B + (size_t)c0 * p->ldb : p->B + c0;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(nth);
    loom_cpu_sgemm_on(isa, c->ta, c->tb, r1 - r0, c1 - c0, c->K, c->alpha, A, p->lda, B, p->ldb,
                      c->beta, C + (size_t)r0 * p->ldc + c0, p->ldc);
    omp_set_num_threads(saved);
}

static float *run_whole(const problem *p, int isa, int nth)
{
    const size_t nc = (size_t)p->c->M * p->ldc;
    float *C = kt_alloc(nc);
    memcpy(C, p->C0, nc * sizeof(float));
    run_part(p, isa, nth, C, 0, p->c->M, 0, p->c->N);
    return C;
}

/* The valid M x N parts of two results (leading dims lx, ly) are the same bits. */
static void assert_bits(const char *what, const gemm_case *c, const float *x, int lx,
                        const float *y, int ly)
{
    for (int i = 0; i < c->M; i++)
        for (int j = 0; j < c->N; j++)
            ck_assert_msg(memcmp(&x[(size_t)i * lx + j], &y[(size_t)i * ly + j], 4) == 0,
                          "%s: %c%c %dx%dx%d C[%d][%d] = %.9g vs %.9g", what, c->ta ? 'T' : 'N',
                          c->tb ? 'T' : 'N', c->M, c->N, c->K, i, j, x[(size_t)i * lx + j],
                          y[(size_t)i * ly + j]);
}

/* The cuts of [0, n) into pieces of 1, 5, 13, 37, ... (none a multiple of a tile). */
static int cuts(int n, int *b)
{
    static const int step[] = {1, 5, 13, 37, 83};
    int k = 0, at = 0;
    b[k++] = 0;
    for (int s = 0; at < n; s++) {
        at += step[s % 5] * (1 + s / 5);
        b[k++] = at < n ? at : n;
    }
    return k - 1;
}

static void check_isa(int isa)
{
    char what[96];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const gemm_case *c = &cases[i];
        problem p = make(c, 0);
        float *whole = run_whole(&p, isa, 1);
        const double err = loom_cpu_sgemm_check(c->ta, c->tb, c->M, c->N, c->K, c->alpha, p.A,
                                                p.lda, p.B, p.ldb, c->beta, p.C0, whole, p.ldc);
        ck_assert_msg(err <= LOOM_CPU_SGEMM_TOL, "%s: %c%c %dx%dx%d: error %g vs the double "
                      "reference", loom_cpu_isa_name(isa), c->ta ? 'T' : 'N', c->tb ? 'T' : 'N',
                      c->M, c->N, c->K, err);
        for (int nth = 2; nth <= 3; nth++) {
            float *t = run_whole(&p, isa, nth);
            snprintf(what, sizeof what, "%s, %d threads vs 1", loom_cpu_isa_name(isa), nth);
            assert_bits(what, c, t, p.ldc, whole, p.ldc);
            free(t);
        }
        int b[64];
        const size_t nc = (size_t)c->M * p.ldc;
        float *split = kt_alloc(nc);
        memcpy(split, p.C0, nc * sizeof(float));
        for (int k = 0, n = cuts(c->M, b); k < n; k++)
            run_part(&p, isa, 2, split, b[k], b[k + 1], 0, c->N);
        snprintf(what, sizeof what, "%s, split by rows vs whole", loom_cpu_isa_name(isa));
        assert_bits(what, c, split, p.ldc, whole, p.ldc);
        memcpy(split, p.C0, nc * sizeof(float));
        for (int k = 0, n = cuts(c->N, b); k < n; k++)
            run_part(&p, isa, 2, split, 0, c->M, b[k], b[k + 1]);
        snprintf(what, sizeof what, "%s, split by columns vs whole", loom_cpu_isa_name(isa));
        assert_bits(what, c, split, p.ldc, whole, p.ldc);
        free(split);
        /* other leading dimensions: the same inputs, padded */
        problem q = make(c, 5);
        float *padded = run_whole(&q, isa, 2);
        snprintf(what, sizeof what, "%s, padded leading dims vs dense", loom_cpu_isa_name(isa));
        assert_bits(what, c, padded, q.ldc, whole, p.ldc);
        free(padded);
        release(&q);
        free(whole);
        release(&p);
    }
}

START_TEST(test_each_isa)
{
    for (int isa = LOOM_CPU_ISA_SSE2; isa <= loom_cpu_isa_best(); isa++)
        check_isa(isa);
}
END_TEST

START_TEST(test_fma_isas_agree)
{
    if (loom_cpu_isa_best() < LOOM_CPU_ISA_AVX2)
        return; /* nothing to compare */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        problem p = make(&cases[i], 0);
        float *ref = run_whole(&p, LOOM_CPU_ISA_AVX2, 2);
        for (int isa = LOOM_CPU_ISA_AVX2 + 1; isa <= loom_cpu_isa_best(); isa++) {
            float *got = run_whole(&p, isa, 2);
            assert_bits("avx512 vs avx2", &cases[i], got, p.ldc, ref, p.ldc);
            free(got);
        }
        /* and the dispatched entry point runs the ISA in use */
        float *disp = kt_alloc((size_t)cases[i].M * p.ldc);
        memcpy(disp, p.C0, sizeof(float) * cases[i].M * p.ldc);
        loom_cpu_sgemm_fallback(cases[i].ta, cases[i].tb, cases[i].M, cases[i].N, cases[i].K,
                                cases[i].alpha, p.A, p.lda, p.B, p.ldb, cases[i].beta, disp,
                                p.ldc);
        float *on = run_whole(&p, loom_cpu_isa(), omp_get_max_threads());
        assert_bits("loom_cpu_sgemm_fallback vs loom_cpu_sgemm_on(loom_cpu_isa())", &cases[i],
                    disp, p.ldc, on, p.ldc);
        free(on), free(disp), free(ref);
        release(&p);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gemm");
    TCase *tc = tcase_create("gemm");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_each_isa);
    tcase_add_test(tc, test_fma_isas_agree);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
