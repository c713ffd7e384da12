/* test_gelu.c — GELU (tanh form): forward against 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
 * in double, finite values at the extremes and no subnormals in the tail, backward against
 * finite differences of L = sum(out * R), dinp overwritten, dinp aliasing dout, and the
 * same bits on one thread and two.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { N = 200 };

typedef struct {
    float *x, *out, *R;
} ctx_t;

static double loss(void *p)
{
    ctx_t *c = p;
    loom_cpu_gelu_forward(c->out, c->x, N);
    return kt_dot(c->out, c->R, N);
}

static double gelu_ref(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

START_TEST(test_forward)
{
    float x[N], out[N];
    double want[N];
    kt_fill(x, N, 1, -6, 6);
    x[0] = 0.0f, x[1] = -30.0f, x[2] = 30.0f, x[3] = -1e4f, x[4] = 1e4f;
    for (int i = 0; i < N; i++)
        want[i] = gelu_ref(x[i]);
    loom_cpu_gelu_forward(out, x, N);
    kt_assert_close("gelu", out, want, N, 2e-6);
}
END_TEST

START_TEST(test_backward)
{
    ctx_t c = {kt_alloc(N), kt_alloc(N), kt_alloc(N)};
    kt_fill(c.x, N, 2, -5, 5);
    kt_fill(c.R, N, 3, -1, 1);
    float *dinp = kt_alloc(N), *again = kt_alloc(N);
    kt_fill(dinp, N, 4, -100, 100); /* overwritten */
    loom_cpu_gelu_backward(dinp, c.x, c.R, N);
    kt_check_grad("dinp", c.x, dinp, N, 1, loss, &c, 1e-2f, 1e-3);
    memcpy(again, c.R, N * sizeof(float));
    loom_cpu_gelu_backward(again, c.x, again, N); /* in place over dout */
    kt_assert_scaled("dinp aliasing dout", again, dinp, 1.0f, N, 0.0);
    /* the negative tail underflows to exactly 0, never to a subnormal (which would slow
     * the GEMM that reads it) */
    float tail[64], tout[64], tgrad[64], ones[64];
    for (int i = 0; i < 64; i++)
        tail[i] = -8.0f - 0.125f * i, ones[i] = 1.0f;
    loom_cpu_gelu_forward(tout, tail, 64);
    loom_cpu_gelu_backward(tgrad, tail, ones, 64);
    for (int i = 0; i < 64; i++) {
        ck_assert_msg(fpclassify(tout[i]) != FP_SUBNORMAL, "gelu(%g) = %g", tail[i], tout[i]);
        ck_assert_msg(fpclassify(tgrad[i]) != FP_SUBNORMAL, "gelu'(%g) = %g", tail[i], tgrad[i]);
    }
    /* far tails: gradient 0 and 1, never NaN */
    float xs[2] = {-1e4f, 1e4f}, d1[2] = {1, 1}, g[2];
    loom_cpu_gelu_backward(g, xs, d1, 2);
    ck_assert_float_eq(g[0], 0.0f);
    ck_assert_float_eq(g[1], 1.0f);
    free(c.x), free(c.out), free(c.R), free(dinp), free(again);
}
END_TEST

START_TEST(test_large_parallel)
{
    /* a size that takes the OpenMP path, against the same formula */
    const size_t n = 100003;
    float *x = kt_alloc(n), *out = kt_alloc(n);
    kt_fill(x, n, 5, -8, 8);
    loom_cpu_gelu_forward(out, x, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabs(out[i] - gelu_ref(x[i])) <= 2e-6 * fmax(1.0, fabs(gelu_ref(x[i]))),
                      "gelu(%g) = %g", x[i], out[i]);
    free(x), free(out);
}
END_TEST

static void both_big(void *unused, float *o)
{
    const size_t n = 100003;
    float *x = kt_alloc(n), *d = kt_alloc(n);
    kt_fill(x, n, 7, -6, 6);
    kt_fill(d, n, 8, -1, 1);
    loom_cpu_gelu_forward(o, x, n);
    loom_cpu_gelu_backward(o + n, x, d, n);
    free(x), free(d);
}

START_TEST(test_thread_independent)
{
    kt_assert_thread_independent("gelu|dgelu", both_big, NULL, 2 * 100003);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gelu");
    TCase *tc = tcase_create("gelu");
    tcase_add_test(tc, test_forward);
    tcase_add_test(tc, test_backward);
    tcase_add_test(tc, test_large_parallel);
    tcase_add_test(tc, test_thread_independent);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
