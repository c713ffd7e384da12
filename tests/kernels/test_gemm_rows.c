/* test_gemm_rows.c — gemm_rows.c's row-stable product (set_deterministic mode 2, what
 * generation with a key/value cache runs): correct against the double-precision reference,
 * and every row's bits the same whether it is computed alone (M = 1, a decode step) or
 * inside a larger product, for odd sizes, K past a multiple of 8, beta 0 and 1, and a
 * product large enough to run threaded. The linear layer adds its bias as beta-1 C.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

static float lcg(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) * (2.0 / 16777216.0) - 1.0);
}

static void check(int M, int N, int K, float beta)
{
    const int lda = K + 3, ldb = K + 1, ldc = N + 2;
    float *A = malloc(sizeof(float) * M * lda), *W = malloc(sizeof(float) * N * ldb);
    float *C0 = malloc(sizeof(float) * M * ldc), *C = malloc(sizeof(float) * M * ldc);
    float *row = malloc(sizeof(float) * ldc);
    unsigned s = (unsigned)(M * 131 + N * 7 + K);
    for (int i = 0; i < M * lda; i++)
        A[i] = lcg(&s);
    for (int i = 0; i < N * ldb; i++)
        W[i] = lcg(&s);
    for (int i = 0; i < M * ldc; i++)
        C0[i] = beta == 0.0f ? NAN : lcg(&s);
    memcpy(C, C0, sizeof(float) * M * ldc);
    loom_cpu_sgemm_rows(0, 1, M, N, K, 1.0f, A, lda, W, ldb, beta, C, ldc);
    double err = loom_cpu_sgemm_check(0, 1, M, N, K, 1.0f, A, lda, W, ldb, beta, C0, C, ldc);
    ck_assert_msg(err <= LOOM_CPU_SGEMM_TOL, "%dx%dx%d beta %g: relative error %g", M, N, K,
                  (double)beta, err);
    for (int i = 0; i < M; i++) {
        memcpy(row, C0 + (size_t)i * ldc, sizeof(float) * N);
        loom_cpu_sgemm_rows(0, 1, 1, N, K, 1.0f, A + (size_t)i * lda, lda, W, ldb, beta, row, ldc);
        ck_assert_msg(memcmp(row, C + (size_t)i * ldc, sizeof(float) * N) == 0,
                      "%dx%dx%d: row %d alone has other bits", M, N, K, i);
    }
    free(A);
    free(W);
    free(C0);
    free(C);
    free(row);
}

START_TEST(rows_are_stable)
{
    check(1, 5, 3, 0.0f);
    check(7, 13, 29, 0.0f);
    check(7, 13, 29, 1.0f);
    check(33, 130, 136, 0.0f);
    check(130, 384, 128, 1.0f); /* threaded */
}
END_TEST

START_TEST(linear_layer_bias)
{
    const int BT = 5, C = 19, OC = 11;
    float inp[5 * 19], w[11 * 19], bias[11], out[5 * 11], one[11];
    unsigned s = 3;
    for (int i = 0; i < BT * C; i++)
        inp[i] = lcg(&s);
    for (int i = 0; i < OC * C; i++)
        w[i] = lcg(&s);
    for (int i = 0; i < OC; i++)
        bias[i] = lcg(&s);
    loom_cpu_matmul_forward_rows(out, inp, w, bias, 1, BT, C, OC);
    for (int t = 0; t < BT; t++) {
        loom_cpu_matmul_forward_rows(one, inp + t * C, w, bias, 1, 1, C, OC);
        ck_assert(memcmp(one, out + t * OC, sizeof one) == 0);
        for (int o = 0; o < OC; o++) {
            double ref = bias[o];
            for (int k = 0; k < C; k++)
                ref += (double)inp[t * C + k] * w[o * C + k];
            ck_assert(fabs(ref - out[t * OC + o]) < 1e-5);
        }
    }
}
END_TEST

int main(void)
{
    Suite *su = suite_create("gemm_rows");
    TCase *tc = tcase_create("gemm_rows");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, rows_are_stable);
    tcase_add_test(tc, linear_layer_bias);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
