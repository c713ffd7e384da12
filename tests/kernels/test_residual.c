/* test_residual.c — out = a + b (overwrites, may alias an input) and acc += x (adds), over
 * sizes below and above the OpenMP threshold. The gradient of a + b is the identity, so
 * the finite-difference check is of accumulate's role: acc += x twice adds 2x.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <stdlib.h>
#include <string.h>

static void check_size(size_t n)
{
    float *a = kt_alloc(n), *b = kt_alloc(n), *out = kt_alloc(n), *acc = kt_alloc(n);
    kt_fill(a, n, 1, -1, 1);
    kt_fill(b, n, 2, -1, 1);
    kt_fill(out, n, 3, -100, 100); /* overwritten */
    loom_cpu_residual_forward(out, a, b, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_float_eq(out[i], a[i] + b[i]);
    memcpy(acc, a, n * sizeof(float));
    loom_cpu_accumulate(acc, b, n);
    loom_cpu_accumulate(acc, b, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_float_eq(acc[i], (a[i] + b[i]) + b[i]);
    loom_cpu_residual_forward(a, a, b, n); /* in place */
    kt_assert_scaled("a = a + b in place", a, out, 1.0f, n, 0.0);
    free(a), free(b), free(out), free(acc);
}

START_TEST(test_residual)
{
    check_size(1);
    check_size(37);
    check_size(100003);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("residual");
    TCase *tc = tcase_create("residual");
    tcase_add_test(tc, test_residual);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
