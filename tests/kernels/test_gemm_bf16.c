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
 *     matmul_forward's bits.
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
                                    {64, 40, 600}};
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
    suite_add_tcase(s, tc);
    printf("gemm_bf16: %s\n", loom_cpu_gemm_bf16_available() ? "vdpbf16ps" : "unavailable");
    return kt_run(s);
}
