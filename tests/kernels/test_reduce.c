/* test_reduce.c — sum_squares (double accumulation, same bits for any thread count, and
 * for a strided block the same bits wherever it sits: only values and shape count),
 * has_nonfinite (inf and nan anywhere, including the last element), and scale.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* A block of rows x cols inside wider rows (a parameter chunk as one tensor-parallel rank
 * holds it) gives the bits of the same values packed densely, at any offset. */
START_TEST(test_sum_squares_strided)
{
    const size_t shapes[][2] = {{3, 5}, {64, 48}, {7, 9000}, {384, 192}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const size_t rows = shapes[k][0], cols = shapes[k][1];
        for (size_t stride = cols; stride <= cols + 13; stride += 13) {
            for (size_t off = 0; off < 3; off++) {
                float *wide = kt_alloc(rows * stride + off), *dense = kt_alloc(rows * cols);
                kt_fill(wide, rows * stride + off, 7, -2, 2);
                double want = 0;
                for (size_t r = 0; r < rows; r++)
                    for (size_t j = 0; j < cols; j++) {
                        dense[r * cols + j] = wide[off + r * stride + j];
                        want += (double)dense[r * cols + j] * dense[r * cols + j];
                    }
                const double got = loom_cpu_sum_squares(wide + off, rows, cols, stride);
                const double packed = loom_cpu_sum_squares(dense, rows, cols, cols);
                ck_assert_msg(memcmp(&got, &packed, sizeof got) == 0,
                              "%zux%zu stride %zu off %zu: %.17g vs packed %.17g", rows, cols,
                              stride, off, got, packed);
                ck_assert(fabs(got - want) <= 1e-12 * fmax(1.0, want));
                free(wide), free(dense);
            }
        }
    }
}
END_TEST

START_TEST(test_sum_squares)
{
    const size_t sizes[] = {0, 1, 63, 1000, 300001};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const size_t n = sizes[k];
        float *x = kt_alloc(n);
        kt_fill(x, n, 1, -3, 3);
        double want = 0;
        for (size_t i = 0; i < n; i++)
            want += (double)x[i] * x[i];
        omp_set_num_threads(2);
        const double two = loom_cpu_sum_squares(x, 1, n, n);
        omp_set_num_threads(1);
        const double one = loom_cpu_sum_squares(x, 1, n, n);
        ck_assert_msg(fabs(two - want) <= 1e-12 * fmax(1.0, want), "n %zu: %.17g vs %.17g", n,
                      two, want);
        ck_assert_msg(memcmp(&one, &two, sizeof one) == 0,
                      "n %zu: 1 thread %.17g, 2 threads %.17g", n, one, two);
        free(x);
    }
    /* a sum a float accumulator would get wrong: 1e8 * 1 + many small */
    float y[4097];
    y[0] = 1e4f;
    for (int i = 1; i < 4097; i++)
        y[i] = 1e-4f;
    ck_assert(fabs(loom_cpu_sum_squares(y, 1, 4097, 4097) - (1e8 + 4096 * (double)1e-4f * 1e-4f)) < 1e-6);
}
END_TEST

START_TEST(test_has_nonfinite)
{
    const size_t n = 200003;
    float *x = kt_alloc(n);
    kt_fill(x, n, 2, -1e30f, 1e30f);
    ck_assert_int_eq(loom_cpu_has_nonfinite(x, n), 0);
    const size_t where[] = {0, 12345, n - 1};
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (size_t w = 0; w < 3; w++)
        for (size_t b = 0; b < 3; b++) {
            const float keep = x[where[w]];
            x[where[w]] = bad[b];
            ck_assert_msg(loom_cpu_has_nonfinite(x, n) == 1, "missed %g at %zu", bad[b], where[w]);
            ck_assert_int_eq(loom_cpu_has_nonfinite(x + where[w], 1), 1);
            x[where[w]] = keep;
        }
    ck_assert_int_eq(loom_cpu_has_nonfinite(x, 0), 0);
    free(x);
}
END_TEST

START_TEST(test_scale)
{
    const size_t n = 100001;
    float *x = kt_alloc(n), *ref = kt_alloc(n);
    kt_fill(x, n, 3, -2, 2);
    memcpy(ref, x, n * sizeof(float));
    loom_cpu_scale(x, 0.25f, n);
    kt_assert_scaled("x * 0.25", x, ref, 0.25f, n, 0.0);
    free(x), free(ref);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reduce");
    TCase *tc = tcase_create("reduce");
    tcase_add_test(tc, test_sum_squares);
    tcase_add_test(tc, test_sum_squares_strided);
    tcase_add_test(tc, test_has_nonfinite);
    tcase_add_test(tc, test_scale);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
