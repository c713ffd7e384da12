/* test_residual.c — out = a + b (overwrites, may alias an input) and acc += x (adds), over
 * sizes below and above the OpenMP threshold. The gradient of a + b is the identity, so
 * the finite-difference check is of accumulate's role: acc += x twice adds 2x. And the
 * backend's zero (loom_cpu_zero: threads over 1 MiB): every byte of an odd-sized buffer
 * zeroed, both sides of the threshold, none past its end.
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

static void check_zero(size_t bytes)
{
    unsigned char *p = malloc(bytes + 64);
    ck_assert_ptr_nonnull(p);
    memset(p, 0xA5, bytes + 64);
    loom_cpu_zero(p + 1, bytes); /* unaligned start, odd length */
    ck_assert_uint_eq(p[0], 0xA5);
    for (size_t i = 1; i <= bytes; i++)
        if (p[i] != 0)
            ck_abort_msg("zero of %zu bytes left byte %zu = %#x", bytes, i - 1, p[i]);
    for (size_t i = bytes + 1; i < bytes + 64; i++)
        ck_assert_uint_eq(p[i], 0xA5);
    free(p);
}

START_TEST(test_residual)
{
    check_size(1);
    check_size(37);
    check_size(100003);
    check_zero(7);
    check_zero(((size_t)1 << 20) - 1);
    check_zero(((size_t)3 << 20) + 4097); /* the threaded path, a partial last page */
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
