/* test_gemm_bf16.c — gemm_bf16.c's vdpbf16ps product (AVX512_BF16) and the CPU backend's
 * matmul_forward_bf16 over it:
 *   - against a double reference, within 1e-6 of sum |a w| (each product is exact in fp32;
 *     only the fp32 sums round), on odd K, edge tiles and K > 256, from bf16 bits and from
 *     fp32 weights holding bf16 values (the same bits);
 *   - bits independent of the thread count, and of splitting the product by rows or by
 *     columns into separate calls (the order depends only on K: the file's header);
 *   - subnormal inputs count as zero (vdpbf16ps's DAZ; documented there);
 *   - canonical mode, or where unavailable (no avx512_bf16, or LOOM_CPU_ISA below avx512):
 *     loom_cpu_gemm_bf16 refuses (-1, C untouched) and matmul_forward_bf16 gives
 *     matmul_forward's bits;
 *   - the backward products (loom_cpu_gemm_bf16_split, matmul_backward_bf16): A any fp32,
 *     split into hi + lo bf16, within 5e-6 of sum |a b| of a double reference (the split
 *     leaves at most 2^-18 |a|; rounding A to one bf16 alone is ~1e-4 off here, so dropping
 *     lo fails), both transposes, beta 0 and 1, B as fp32 and as bits, K over several
 *     blocks; matmul_backward_bf16 within the same bound of matmul_backward, its bits
 *     independent of the thread count and of row / column splits; inf stays inf; refused
 *     (-1, nothing written) in canonical mode and where unavailable.
 */
#include "kernel_test.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

/* A (M,K) of bf16 values, W (N,K) as bits and widened. */
typedef struct {
    int M, N, K;
    float *A, *Wf, *C;
    uint16_t *W;
} prob;

static prob make(int M, int N, int K, uint32_t seed)
{
    prob p = {M, N, K, kt_alloc((size_t)M * K), kt_alloc((size_t)N * K),
              kt_alloc((size_t)M * N), malloc((size_t)N * K * 2)};
    kt_fill(p.A, (size_t)M * K, seed, -1.0f, 1.0f);
    kt_fill(p.Wf, (size_t)N * K, seed + 1, -0.1f, 0.1f);
    loom_cpu_round_bf16(p.A, p.A, (size_t)M * K);
    loom_cpu_f32_to_bf16(p.W, p.Wf, (size_t)N * K);
    loom_cpu_bf16_to_f32_n(p.Wf, p.W, (size_t)N * K);
    return p;
}

static void drop(prob *p)
{
    free(p->A), free(p->Wf), free(p->C), free(p->W);
}

START_TEST(against_double)
{
    if (!loom_cpu_gemm_bf16_available())
        return;
    static const int shapes[][3] = {{1, 1, 1}, {7, 33, 3}, {37, 65, 385}, {130, 96, 64}, {9, 4200, 40},
                                    {64, 40, 600}, {20, 50, 1700}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        prob p = make(shapes[s][0], shapes[s][1], shapes[s][2], 11 + (uint32_t)s);
        ck_assert_int_eq(loom_cpu_gemm_bf16(p.M, p.N, p.K, p.A, p.K, p.W, p.K, p.C, p.N), 0);
        const double err = loom_cpu_sgemm_check(0, 1, p.M, p.N, p.K, 1.0f, p.A, p.K, p.Wf, p.K,
                                                0.0f, NULL, p.C, p.N);
        ck_assert_msg(err <= 1e-6, "%dx%dx%d: %g of sum |a w|", p.M, p.N, p.K, err);
        float *C2 = kt_alloc((size_t)p.M * p.N);
        ck_assert_int_eq(loom_cpu_gemm_bf16_f32w(p.M, p.N, p.K, p.A, p.K, p.Wf, p.K, C2, p.N),
                         0);
        ck_assert(memcmp(C2, p.C, (size_t)p.M * p.N * sizeof(float)) == 0);
        free(C2);
        drop(&p);
    }
}
END_TEST

static void run_whole(void *ctx, float *out)
{
    prob *p = ctx;
    ck_assert_int_eq(loom_cpu_gemm_bf16(p->M, p->N, p->K, p->A, p->K, p->W, p->K, out, p->N), 0);
}

START_TEST(splits_and_threads)
{
    if (!loom_cpu_gemm_bf16_available())
        return;
    prob p = make(300, 200, 390, 5);
    kt_assert_thread_independent("gemm_bf16", run_whole, &p, (size_t)p.M * p.N);
    run_whole(&p, p.C);
    float *S = kt_alloc((size_t)p.M * p.N);
    /* rows 0..123 and 123..300 as two calls; then columns 0..77 and 77..200 */
    ck_assert_int_eq(loom_cpu_gemm_bf16(123, p.N, p.K, p.A, p.K, p.W, p.K, S, p.N), 0);
    ck_assert_int_eq(loom_cpu_gemm_bf16(p.M - 123, p.N, p.K, p.A + (size_t)123 * p.K, p.K, p.W,
                                        p.K, S + (size_t)123 * p.N, p.N), 0);
    ck_assert_msg(memcmp(S, p.C, (size_t)p.M * p.N * sizeof(float)) == 0, "row split differs");
    memset(S, 0, (size_t)p.M * p.N * sizeof(float));
    ck_assert_int_eq(loom_cpu_gemm_bf16(p.M, 77, p.K, p.A, p.K, p.W, p.K, S, p.N), 0);
    ck_assert_int_eq(loom_cpu_gemm_bf16(p.M, p.N - 77, p.K, p.A, p.K, p.W + (size_t)77 * p.K,
                                        p.K, S + 77, p.N), 0);
    ck_assert_msg(memcmp(S, p.C, (size_t)p.M * p.N * sizeof(float)) == 0, "column split differs");
    free(S);
    drop(&p);
}
END_TEST

START_TEST(subnormal_inputs_are_zero)
{
    if (!loom_cpu_gemm_bf16_available())
        return;
    /* 1e-39 is a bf16 subnormal; times 1 it would be 1e-39, vdpbf16ps gives 0 */
    float a[2] = {loom_cpu_bf16_to_f32(loom_cpu_bf16_from_f32(1e-39f)), 0.0f}, c = -1.0f;
    uint16_t w[2] = {loom_cpu_bf16_from_f32(1.0f), 0};
    ck_assert(a[0] != 0.0f);
    ck_assert_int_eq(loom_cpu_gemm_bf16(1, 1, 2, a, 2, w, 2, &c, 1), 0);
    ck_assert_msg(c == 0.0f, "subnormal input gave %g", c);
}
END_TEST

START_TEST(fallback_bits)
{
    /* canonical mode always, and everywhere where unavailable: matmul_forward's bits */
    for (int canonical = 0; canonical < 2; canonical++) {
        if (!canonical && loom_cpu_gemm_bf16_available())
            continue;
        loom_cpu_set_deterministic(canonical);
        prob p = make(2 * 40, 96, 64, 9);
        float *bias = kt_alloc(96), *R = kt_alloc((size_t)p.M * p.N);
        kt_fill(bias, 96, 3, -1.0f, 1.0f);
        loom_cpu_matmul_forward_bf16(p.C, p.A, p.Wf, bias, 2, 40, 64, 96);
        loom_cpu_matmul_forward(R, p.A, p.Wf, bias, 2, 40, 64, 96);
        ck_assert(memcmp(R, p.C, (size_t)p.M * p.N * sizeof(float)) == 0);
        if (!loom_cpu_gemm_bf16_available()) {
            p.C[0] = 42.0f;
            ck_assert_int_eq(loom_cpu_gemm_bf16(p.M, p.N, p.K, p.A, p.K, p.W, p.K, p.C, p.N), -1);
            ck_assert(p.C[0] == 42.0f);
        }
        free(bias), free(R);
        drop(&p);
    }
    loom_cpu_set_deterministic(0);
}
END_TEST

START_TEST(fast_with_bias)
{
    if (!loom_cpu_gemm_bf16_available())
        return;
    prob p = make(2 * 40, 96, 64, 21);
    float *bias = kt_alloc(96), *R = kt_alloc((size_t)p.M * p.N);
    kt_fill(bias, 96, 4, -1.0f, 1.0f);
    loom_cpu_matmul_forward_bf16(p.C, p.A, p.Wf, bias, 2, 40, 64, 96);
    ck_assert_int_eq(loom_cpu_gemm_bf16(p.M, p.N, p.K, p.A, p.K, p.W, p.K, R, p.N), 0);
    for (int i = 0; i < p.M; i++)
        for (int j = 0; j < p.N; j++) {
            const float want = R[(size_t)i * p.N + j] + bias[j];
            ck_assert(memcmp(&want, &p.C[(size_t)i * p.N + j], sizeof want) == 0);
        }
    free(bias), free(R);
    drop(&p);
}
END_TEST


/* The double reference's error of C = op(A) op(B) + beta C0, with A any fp32 and B bf16. */
START_TEST(split_against_double)
{
    if (!loom_cpu_gemm_bf16_available())
        return;
    static const int shapes[][3] = {{1, 1, 1}, {7, 33, 3}, {37, 65, 385}, {130, 96, 1000},
                                    {9, 70, 40}, {300, 40, 17}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int beta = 0; beta < 2; beta++) {
                const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                float *A = kt_alloc((size_t)M * K), *Bf = kt_alloc((size_t)K * N);
                float *C = kt_alloc((size_t)M * N), *C0 = kt_alloc((size_t)M * N);
                float *C2 = kt_alloc((size_t)M * N);
                uint16_t *Bh = malloc((size_t)K * N * 2);
                kt_fill(A, (size_t)M * K, 31 + (uint32_t)s, -1.0f, 1.0f); /* not rounded */
                kt_fill(Bf, (size_t)K * N, 32 + (uint32_t)s, -0.1f, 0.1f);
                kt_fill(C0, (size_t)M * N, 33 + (uint32_t)s, -0.5f, 0.5f);
                loom_cpu_f32_to_bf16(Bh, Bf, (size_t)K * N);
                loom_cpu_bf16_to_f32_n(Bf, Bh, (size_t)K * N);
                const int lda = ta ? M : K;
                memcpy(C, C0, (size_t)M * N * sizeof(float));
                ck_assert_int_eq(loom_cpu_gemm_bf16_split(ta, 0, M, N, K, A, lda, Bf, NULL, N,
                                                          beta, C, N), 0);
                const double err = loom_cpu_sgemm_check(ta, 0, M, N, K, 1.0f, A, lda, Bf, N,
                                                        (float)beta, beta ? C0 : NULL, C, N);
                ck_assert_msg(err <= 5e-6, "%dx%dx%d ta %d beta %d: %g of sum |a b|", M, N, K,
                              ta, beta, err);
                memcpy(C2, C0, (size_t)M * N * sizeof(float));
                ck_assert_int_eq(loom_cpu_gemm_bf16_split(ta, 0, M, N, K, A, lda, NULL, Bh, N,
                                                          beta, C2, N), 0);
                ck_assert(memcmp(C2, C, (size_t)M * N * sizeof(float)) == 0);
                free(A), free(Bf), free(C), free(C0), free(C2), free(Bh);
            }
}
END_TEST

/* dout (BT,OC) any fp32; inp (BT,C) and weight (OC,C) bf16 values. */
typedef struct {
    int BT, C, OC;
    float *dout, *inp, *w, *dinp, *dw, *db;
} bwd;

static bwd make_bwd(int BT, int C, int OC, uint32_t seed)
{
    bwd b = {BT, C, OC, kt_alloc((size_t)BT * OC), kt_alloc((size_t)BT * C),
             kt_alloc((size_t)OC * C), kt_alloc((size_t)BT * C), kt_alloc((size_t)OC * C),
             kt_alloc((size_t)OC)};
    kt_fill(b.dout, (size_t)BT * OC, seed, -1e-3f, 1e-3f);
    kt_fill(b.inp, (size_t)BT * C, seed + 1, -1.0f, 1.0f);
    kt_fill(b.w, (size_t)OC * C, seed + 2, -0.1f, 0.1f);
    loom_cpu_round_bf16(b.inp, b.inp, (size_t)BT * C);
    loom_cpu_round_bf16(b.w, b.w, (size_t)OC * C);
    return b;
}

static void drop_bwd(bwd *b)
{
    free(b->dout), free(b->inp), free(b->w), free(b->dinp), free(b->dw), free(b->db);
}

/* the gradients start at 0.25 (dweight, dbias accumulate) */
static void bwd_run(bwd *b, int fast)
{
    for (size_t i = 0; i < (size_t)b->OC * b->C; i++)
        b->dw[i] = 0.25f;
    for (int i = 0; i < b->OC; i++)
        b->db[i] = 0.25f;
    if (fast)
        ck_assert_int_eq(loom_cpu_matmul_backward_bf16(b->dinp, b->dw, b->db, b->dout, b->inp,
                                                       b->w, 0, 1, b->BT, b->C, b->OC), 0);
    else
        loom_cpu_matmul_backward(b->dinp, b->dw, b->db, b->dout, b->inp, b->w, 1, b->BT, b->C,
                                 b->OC);
}

static void run_bwd(void *ctx, float *out)
{
    bwd *b = ctx;
    bwd_run(b, 1);
    memcpy(out, b->dinp, (size_t)b->BT * b->C * sizeof(float));
    memcpy(out + (size_t)b->BT * b->C, b->dw, (size_t)b->OC * b->C * sizeof(float));
}

START_TEST(backward_products)
{
    if (!loom_cpu_gemm_bf16_available())
        return;
    bwd b = make_bwd(200, 72, 130, 41);
    const size_t nx = (size_t)b.BT * b.C, nw = (size_t)b.OC * b.C;
    bwd_run(&b, 0);
    float *x0 = kt_alloc(nx), *w0 = kt_alloc(nw), *b0 = kt_alloc((size_t)b.OC);
    memcpy(x0, b.dinp, nx * 4), memcpy(w0, b.dw, nw * 4), memcpy(b0, b.db, (size_t)b.OC * 4);
    bwd_run(&b, 1);
    ck_assert(memcmp(b0, b.db, (size_t)b.OC * 4) == 0); /* bias.c's, the same call */
    /* both within the bound of the double reference: against sgemm, its own error too */
    const double ex = loom_cpu_sgemm_check(0, 0, b.BT, b.C, b.OC, 1.0f, b.dout, b.OC, b.w, b.C,
                                           0.0f, NULL, b.dinp, b.C);
    float *c0 = kt_alloc(nw);
    for (size_t i = 0; i < nw; i++)
        c0[i] = 0.25f;
    const double ew = loom_cpu_sgemm_check(1, 0, b.OC, b.C, b.BT, 1.0f, b.dout, b.OC, b.inp,
                                           b.C, 1.0f, c0, b.dw, b.C);
    ck_assert_msg(ex <= 5e-6 && ew <= 5e-6, "dinp %g dweight %g", ex, ew);
    double dx = 0, dwd = 0; /* and close to matmul_backward's */
    for (size_t i = 0; i < nx; i++)
        dx = fmax(dx, fabs(b.dinp[i] - x0[i]));
    for (size_t i = 0; i < nw; i++)
        dwd = fmax(dwd, fabs(b.dw[i] - w0[i]));
    ck_assert_msg(dx < 1e-8 && dwd < 1e-6, "vs matmul_backward: dinp %g dweight %g", dx, dwd);
    /* threads; then rows of dinp (token rows) and of dweight (output features) split */
    kt_assert_thread_independent("matmul_backward_bf16", run_bwd, &b, nx + nw);
    bwd_run(&b, 1);
    float *sx = kt_alloc(nx), *sw = kt_alloc(nw);
    for (size_t i = 0; i < nw; i++)
        sw[i] = 0.25f;
    ck_assert_int_eq(loom_cpu_gemm_bf16_split(0, 0, 77, b.C, b.OC, b.dout, b.OC, b.w, NULL,
                                              b.C, 0, sx, b.C), 0);
    ck_assert_int_eq(loom_cpu_gemm_bf16_split(0, 0, b.BT - 77, b.C, b.OC,
                                              b.dout + (size_t)77 * b.OC, b.OC, b.w, NULL, b.C,
                                              0, sx + (size_t)77 * b.C, b.C), 0);
    ck_assert_msg(memcmp(sx, b.dinp, nx * 4) == 0, "dinp row split differs");
    ck_assert_int_eq(loom_cpu_gemm_bf16_split(1, 0, 50, b.C, b.BT, b.dout, b.OC, b.inp, NULL,
                                              b.C, 1, sw, b.C), 0);
    ck_assert_int_eq(loom_cpu_gemm_bf16_split(1, 0, b.OC - 50, 40, b.BT, b.dout + 50, b.OC,
                                              b.inp, NULL, b.C, 1, sw + (size_t)50 * b.C, b.C),
                     0);
    ck_assert_int_eq(loom_cpu_gemm_bf16_split(1, 0, b.OC - 50, b.C - 40, b.BT, b.dout + 50,
                                              b.OC, b.inp + 40, NULL, b.C, 1,
                                              sw + (size_t)50 * b.C + 40, b.C), 0);
    ck_assert_msg(memcmp(sw, b.dw, nw * 4) == 0, "dweight split differs");
    free(x0), free(w0), free(b0), free(c0), free(sx), free(sw);
    drop_bwd(&b);
}
END_TEST

START_TEST(backward_inf_stays_inf)
{
    if (!loom_cpu_gemm_bf16_available())
        return;
    const float a[2] = {INFINITY, 1.0f}, b[2] = {1.0f, 1.0f};
    float c = 0.0f;
    ck_assert_int_eq(loom_cpu_gemm_bf16_split(0, 0, 1, 1, 2, a, 2, b, NULL, 1, 0, &c, 1), 0);
    ck_assert_msg(isinf(c) && c > 0, "inf gave %g", c);
}
END_TEST

START_TEST(backward_refused)
{
    for (int canonical = 0; canonical < 2; canonical++) {
        if (!canonical && loom_cpu_gemm_bf16_available())
            continue;
        loom_cpu_set_deterministic(canonical);
        bwd b = make_bwd(16, 8, 24, 7);
        b.dinp[0] = 42.0f, b.dw[0] = 43.0f, b.db[0] = 44.0f;
        ck_assert_int_eq(loom_cpu_matmul_backward_bf16(b.dinp, b.dw, b.db, b.dout, b.inp, b.w, 0,
                                                       2, 8, b.C, b.OC), -1);
        ck_assert(b.dinp[0] == 42.0f && b.dw[0] == 43.0f && b.db[0] == 44.0f);
        drop_bwd(&b);
    }
    loom_cpu_set_deterministic(0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gemm_bf16");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, against_double);
    tcase_add_test(tc, splits_and_threads);
    tcase_add_test(tc, subnormal_inputs_are_zero);
    tcase_add_test(tc, fallback_bits);
    tcase_add_test(tc, fast_with_bias);
    tcase_add_test(tc, split_against_double);
    tcase_add_test(tc, backward_products);
    tcase_add_test(tc, backward_inf_stays_inf);
    tcase_add_test(tc, backward_refused);
    suite_add_tcase(s, tc);
    printf("gemm_bf16: %s\n", loom_cpu_gemm_bf16_available() ? "vdpbf16ps" : "unavailable");
    return kt_run(s);
}
