/* test_matmul.c — the linear layer out = inp @ W^T + bias: forward against a double
 * reference (with and without bias), backward against finite differences of
 * L = sum(out * R) in inp, weight and bias, NULL dinp / dbias skipped, and the semantics:
 * dinp overwritten, dweight/dbias accumulated. A second, larger shape goes through the
 * GEMM library's blocked paths.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, T, C, OC;
    float *inp, *w, *bias, *out, *R;
} ctx_t;

static double loss(void *p)
{
    ctx_t *c = p;
    loom_cpu_matmul_forward(c->out, c->inp, c->w, c->bias, c->B, c->T, c->C, c->OC);
    return kt_dot(c->out, c->R, (size_t)c->B * c->T * c->OC);
}

static void setup(ctx_t *c, int B, int T, int C, int OC)
{
    *c = (ctx_t){B, T, C, OC, NULL, NULL, NULL, NULL, NULL};
    const size_t BT = (size_t)B * T;
    c->inp = kt_alloc(BT * C), c->w = kt_alloc((size_t)OC * C), c->bias = kt_alloc(OC);
    c->out = kt_alloc(BT * OC), c->R = kt_alloc(BT * OC);
    kt_fill(c->inp, BT * C, 1, -1, 1);
    kt_fill(c->w, (size_t)OC * C, 2, -1, 1);
    kt_fill(c->bias, OC, 3, -1, 1);
    kt_fill(c->R, BT * OC, 4, -1, 1);
}

static void teardown(ctx_t *c)
{
    free(c->inp), free(c->w), free(c->bias), free(c->out), free(c->R);
}

static void check_forward(ctx_t *c)
{
    const int BT = c->B * c->T;
    double *want = malloc(sizeof(double) * BT * c->OC);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        float *bias = c->bias;
        if (!with_bias)
            c->bias = NULL;
        loss(c);
        c->bias = bias;
        for (int r = 0; r < BT; r++)
            for (int o = 0; o < c->OC; o++) {
                double s = with_bias ? c->bias[o] : 0.0;
                for (int i = 0; i < c->C; i++)
                    s += (double)c->inp[r * c->C + i] * c->w[o * c->C + i];
                want[r * c->OC + o] = s;
            }
        kt_assert_close(with_bias ? "out" : "out (no bias)", c->out, want, (size_t)BT * c->OC,
                        1e-4);
    }
    free(want);
}

START_TEST(test_forward)
{
    ctx_t c;
    setup(&c, 2, 5, 8, 12);
    check_forward(&c);
    teardown(&c);
    setup(&c, 3, 37, 96, 200); /* odd sizes through the GEMM's blocked paths */
    check_forward(&c);
    teardown(&c);
}
END_TEST

START_TEST(test_backward)
{
    ctx_t c;
    setup(&c, 2, 5, 8, 12);
    const int n_in = 2 * 5 * 8, n_w = 12 * 8, OC = 12;
    float *dinp = kt_alloc(n_in), *dw = kt_alloc(n_w), *db = kt_alloc(OC);
    kt_fill(dinp, n_in, 9, -100, 100); /* overwritten */
    loom_cpu_matmul_backward(dinp, dw, db, c.R, c.inp, c.w, 2, 5, 8, OC);
    kt_check_grad("dinp", c.inp, dinp, n_in, 1, loss, &c, 1e-2f, 1e-3);
    kt_check_grad("dweight", c.w, dw, n_w, 1, loss, &c, 1e-2f, 1e-3);
    kt_check_grad("dbias", c.bias, db, OC, 1, loss, &c, 1e-2f, 1e-3);

    float *once_in = kt_alloc(n_in), *once_w = kt_alloc(n_w), *once_b = kt_alloc(OC);
    memcpy(once_in, dinp, sizeof(float) * n_in);
    memcpy(once_w, dw, sizeof(float) * n_w);
    memcpy(once_b, db, sizeof(float) * OC);
    loom_cpu_matmul_backward(dinp, dw, db, c.R, c.inp, c.w, 2, 5, 8, OC);
    kt_assert_scaled("dinp twice (overwrite)", dinp, once_in, 1.0f, n_in, 1e-6);
    kt_assert_scaled("dweight twice (accumulate)", dw, once_w, 2.0f, n_w, 1e-6);
    kt_assert_scaled("dbias twice (accumulate)", db, once_b, 2.0f, OC, 1e-6);

    /* NULL dinp and dbias: skipped, dweight still accumulates */
    loom_cpu_matmul_backward(NULL, dw, NULL, c.R, c.inp, c.w, 2, 5, 8, OC);
    kt_assert_scaled("dweight thrice", dw, once_w, 3.0f, n_w, 1e-6);
    kt_assert_scaled("dbias untouched", db, once_b, 2.0f, OC, 0.0);
    free(dinp), free(dw), free(db), free(once_in), free(once_w), free(once_b);
    teardown(&c);
}
END_TEST

START_TEST(test_backward_large)
{
    /* larger, odd shape: a sampled finite-difference check (the loss is linear in each
     * input, so a bigger step is exact up to rounding) */
    ctx_t c;
    setup(&c, 3, 37, 96, 200);
    const int BT = 3 * 37;
    float *dinp = kt_alloc((size_t)BT * 96), *dw = kt_alloc(200 * 96), *db = kt_alloc(200);
    loom_cpu_matmul_backward(dinp, dw, db, c.R, c.inp, c.w, 3, 37, 96, 200);
    kt_check_grad("dinp", c.inp, dinp, (size_t)BT * 96, 97, loss, &c, 0.25f, 2e-3);
    kt_check_grad("dweight", c.w, dw, 200 * 96, 101, loss, &c, 0.25f, 2e-3);
    kt_check_grad("dbias", c.bias, db, 200, 7, loss, &c, 0.25f, 2e-3);
    free(dinp), free(dw), free(db);
    teardown(&c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("matmul");
    TCase *tc = tcase_create("matmul");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_forward);
    tcase_add_test(tc, test_backward);
    tcase_add_test(tc, test_backward_large);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
