/* test_blas.c — the GEMM path (loom_cpu_sgemm, whatever blas.c chose) and loom's own
 * blocked GEMM (loom_cpu_sgemm_fallback), each against the double-precision reference
 * loom_cpu_sgemm_check: all four transpose combinations, sizes that are not multiples of
 * the micro-tile, leading dimensions larger than the rows, alpha/beta, beta 0 over NaN,
 * empty products; and blas init's contract (description, idempotence, LOOM_OPENBLAS=none,
 * a pthread OpenBLAS split over loom's threads).
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void (*gemm_fn)(int, int, int, int, int, float, const float *, int, const float *, int,
                        float, float *, int);

/* Runs one product through f and checks it; pad is added to every leading dimension. */
static void check_one(gemm_fn f, int ta, int tb, int M, int N, int K, float alpha, float beta,
                      int pad)
{
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
    const size_t nc = (size_t)M * ldc;
    float *A = kt_alloc(na), *B = kt_alloc(nb), *C0 = kt_alloc(nc), *C = kt_alloc(nc);
    kt_fill(A, na, 1, -1, 1);
    kt_fill(B, nb, 2, -1, 1);
    kt_fill(C0, nc, 3, -1, 1);
    if (beta == 0.0f)
        for (size_t i = 0; i < nc; i++)
            C0[i] = NAN; /* beta 0 means C is not read */
    memcpy(C, C0, nc * sizeof(float));
    f(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    const double err =
        loom_cpu_sgemm_check(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, C, ldc);
    ck_assert_msg(err <= LOOM_CPU_SGEMM_TOL, "%c%c %dx%dx%d alpha %g beta %g pad %d: error %g",
                  ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, beta, pad, err);
    /* the padding columns of C are not touched */
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++)
            ck_assert(memcmp(&C[(size_t)i * ldc + j], &C0[(size_t)i * ldc + j], 4) == 0);
    free(A), free(B), free(C0), free(C);
}

static void check_all(gemm_fn f)
{
    static const int sizes[][3] = {{37, 53, 29}, {1, 1, 1}, {8, 32, 256}, {9, 33, 257},
                                   {100, 7, 300}, {3, 200, 5}, {130, 70, 520}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                check_one(f, ta, tb, sizes[s][0], sizes[s][1], sizes[s][2], 1.0f, 0.0f, 0);
                check_one(f, ta, tb, sizes[s][0], sizes[s][1], sizes[s][2], -0.5f, 1.5f, 3);
            }
}

START_TEST(test_sgemm_all_transposes)
{
    check_all(loom_cpu_sgemm);
}
END_TEST

START_TEST(test_fallback_all_transposes)
{
    check_all(loom_cpu_sgemm_fallback);
}
END_TEST

START_TEST(test_large_panels)
{
    /* crosses the fallback's NC (2048) and KC (256) blocking boundaries */
    check_one(loom_cpu_sgemm_fallback, 0, 1, 67, 2100, 600, 1.0f, 0.0f, 1);
    check_one(loom_cpu_sgemm_fallback, 1, 0, 2100, 40, 300, 1.0f, 1.0f, 0);
    check_one(loom_cpu_sgemm, 0, 0, 256, 256, 256, 1.0f, 0.0f, 0);
    /* above blas.c's split threshold (2^27 multiply-adds): one threaded library call */
    check_one(loom_cpu_sgemm, 1, 0, 600, 500, 520, 1.0f, 1.0f, 0);
}
END_TEST

START_TEST(test_empty_products)
{
    /* K = 0: C = beta C; alpha = 0: C = beta C; M or N = 0: nothing */
    float C[6] = {1, 2, 3, 4, 5, 6}, A[1] = {NAN}, B[1] = {NAN};
    loom_cpu_sgemm_fallback(0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, 2.0f, C, 3);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(C[i], 2.0f * (i + 1));
    loom_cpu_sgemm_fallback(0, 0, 0, 3, 1, 1.0f, A, 1, B, 3, 0.0f, C, 3);
    ck_assert_float_eq(C[0], 2.0f);
}
END_TEST

START_TEST(test_init_describes)
{
    char d1[400] = "", d2[400] = "";
    ck_assert_int_eq(loom_cpu_blas_init(0, d1, sizeof d1), 0);
    ck_assert_msg(strstr(d1, "threads=") != NULL, "description '%s' names no thread count", d1);
    ck_assert_int_eq(loom_cpu_blas_init(1, d2, sizeof d2), 0);
    ck_assert_msg(strstr(d2, "threads=1") != NULL, "re-init with 1 thread: '%s'", d2);
    /* idempotent: the library part of the description does not change */
    ck_assert_int_eq(strncmp(d1, d2, strlen(d1) - strlen(strstr(d1, "threads="))), 0);
    check_one(loom_cpu_sgemm, 1, 1, 37, 53, 29, 1.0f, 0.0f, 2);
}
END_TEST

START_TEST(test_init_without_openblas)
{
    /* Each test runs in a fresh forked process, so init here sees this setting. */
    const char *fork = getenv("CK_FORK");
    if (fork && strcmp(fork, "no") == 0)
        return;
    setenv("LOOM_OPENBLAS", "none", 1);
    char d[400];
    ck_assert_int_eq(loom_cpu_blas_init(2, d, sizeof d), 0);
    ck_assert_msg(strstr(d, "loom blocked sgemm") != NULL && strstr(d, "threads=2") != NULL,
                  "description '%s'", d);
    check_one(loom_cpu_sgemm, 0, 1, 37, 53, 29, 1.0f, 0.0f, 0);
}
END_TEST

START_TEST(test_pthread_openblas_split)
{
    /* A pthread OpenBLAS is kept on one thread and each product is split over loom's
     * OpenMP threads (blas.c): check that path where the library is installed. */
    const char *lib = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0";
    const char *fork = getenv("CK_FORK");
    if ((fork && strcmp(fork, "no") == 0) || access(lib, R_OK) != 0)
        return;
    setenv("LOOM_OPENBLAS", lib, 1);
    char d[400];
    ck_assert_int_eq(loom_cpu_blas_init(2, d, sizeof d), 0);
    ck_assert_msg(strstr(d, "split by loom") != NULL, "description '%s'", d);
    check_all(loom_cpu_sgemm);
    check_one(loom_cpu_sgemm, 0, 1, 300, 200, 100, 1.0f, 0.0f, 1); /* split by rows */
    check_one(loom_cpu_sgemm, 1, 0, 40, 900, 100, 1.0f, 1.0f, 2);  /* split by columns */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("blas");
    TCase *tc = tcase_create("gemm");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_sgemm_all_transposes);
    tcase_add_test(tc, test_fallback_all_transposes);
    tcase_add_test(tc, test_large_panels);
    tcase_add_test(tc, test_empty_products);
    tcase_add_test(tc, test_init_describes);
    tcase_add_test(tc, test_init_without_openblas);
    tcase_add_test(tc, test_pthread_openblas_split);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
