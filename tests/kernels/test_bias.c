/* test_bias.c — bias_add and bias_backward exactly against naive loops (bias_backward:
 * each column summed in float from 0 over the rows in order, then added to dbias),
 * accumulation (called twice: dbias doubled), matmul_backward's dbias being the same bits,
 * and the same bits on 1 and 2 OpenMP threads.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <stdlib.h>
#include <string.h>

enum { ROWS = 300, COLS = 203 }; /* 60900 > LOOM_CPU_PAR_MIN: threads split the work */

START_TEST(test_bias_add)
{
    float *out = kt_alloc((size_t)ROWS * COLS), *want = kt_alloc((size_t)ROWS * COLS);
    float *bias = kt_alloc(COLS);
    kt_fill(out, (size_t)ROWS * COLS, 1, -2, 2);
    kt_fill(bias, COLS, 2, -1, 1);
    memcpy(want, out, sizeof(float) * ROWS * COLS);
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++)
            want[(size_t)r * COLS + c] += bias[c];
    loom_cpu_bias_add(out, bias, ROWS, COLS);
    ck_assert_msg(memcmp(out, want, sizeof(float) * ROWS * COLS) == 0, "bias_add differs");
    free(out), free(want), free(bias);
}
END_TEST

START_TEST(test_bias_backward)
{
    float *dout = kt_alloc((size_t)ROWS * COLS), *db = kt_alloc(COLS), *want = kt_alloc(COLS);
    kt_fill(dout, (size_t)ROWS * COLS, 3, -1, 1);
    kt_fill(db, COLS, 4, -1, 1);
    memcpy(want, db, sizeof(float) * COLS);
    for (int c = 0; c < COLS; c++) {
        float acc = 0.0f;
        for (int r = 0; r < ROWS; r++)
            acc += dout[(size_t)r * COLS + c];
        want[c] += acc;
    }
    loom_cpu_bias_backward(db, dout, ROWS, COLS);
    for (int c = 0; c < COLS; c++)
        ck_assert_msg(memcmp(&db[c], &want[c], sizeof(float)) == 0, "dbias[%d] %.9g, want %.9g",
                      c, db[c], want[c]);
    /* accumulates: from zero, twice = 2x once */
    float *z = kt_alloc(COLS), *once = kt_alloc(COLS);
    loom_cpu_bias_backward(once, dout, ROWS, COLS);
    loom_cpu_bias_backward(z, dout, ROWS, COLS);
    loom_cpu_bias_backward(z, dout, ROWS, COLS);
    kt_assert_scaled("dbias twice", z, once, 2.0f, COLS, 0.0);
    /* matmul_backward's dbias is the same code */
    float *mb = kt_alloc(COLS), *dw = kt_alloc((size_t)COLS * 4), *inp = kt_alloc((size_t)ROWS * 4);
    loom_cpu_matmul_backward(NULL, dw, mb, dout, inp, NULL, 1, ROWS, 4, COLS);
    ck_assert_msg(memcmp(mb, once, sizeof(float) * COLS) == 0, "matmul_backward's dbias differs");
    free(dout), free(db), free(want), free(z), free(once), free(mb), free(dw), free(inp);
}
END_TEST

static void backward(void *unused, float *o)
{
    float *dout = kt_alloc((size_t)ROWS * COLS);
    kt_fill(dout, (size_t)ROWS * COLS, 5, -1, 1);
    kt_fill(o, COLS, 6, -1, 1);
    loom_cpu_bias_backward(o, dout, ROWS, COLS);
    free(dout);
}

static void add(void *unused, float *o)
{
    float *bias = kt_alloc(COLS);
    kt_fill(bias, COLS, 7, -1, 1);
    kt_fill(o, (size_t)ROWS * COLS, 8, -1, 1);
    loom_cpu_bias_add(o, bias, ROWS, COLS);
    free(bias);
}

START_TEST(test_thread_independent)
{
    kt_assert_thread_independent("dbias", backward, NULL, COLS);
    kt_assert_thread_independent("bias_add", add, NULL, (size_t)ROWS * COLS);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bias");
    TCase *tc = tcase_create("bias");
    tcase_add_test(tc, test_bias_add);
    tcase_add_test(tc, test_bias_backward);
    tcase_add_test(tc, test_thread_independent);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
