/* test_attention.c — causal multi-head attention: forward against a double-precision
 * reference (out and the saved probabilities: rows sum to 1, upper triangle exactly 0),
 * causality (changing a later token leaves earlier outputs bitwise unchanged), backward
 * against finite differences of L = sum(out * R) in qkv, and dqkv overwritten (garbage in
 * the buffer does not matter, a second call gives the same), and the same bits on one
 * thread and two. Two shapes: a small one checked everywhere, and T = 70 > 64 so the
 * kernel's causal row blocks are crossed.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, T, C, NH;
    float *qkv, *out, *att, *R;
} ctx_t;

static double loss(void *p)
{
    ctx_t *c = p;
    loom_cpu_attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
    return kt_dot(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void setup(ctx_t *c, int B, int T, int C, int NH)
{
    *c = (ctx_t){B, T, C, NH, NULL, NULL, NULL, NULL};
    const size_t BT = (size_t)B * T;
    c->qkv = kt_alloc(BT * 3 * C), c->out = kt_alloc(BT * C), c->R = kt_alloc(BT * C);
    c->att = kt_alloc((size_t)B * NH * T * T);
    kt_fill(c->qkv, BT * 3 * C, 1, -1.5f, 1.5f);
    kt_fill(c->R, BT * C, 2, -1, 1);
}

static void teardown(ctx_t *c)
{
    free(c->qkv), free(c->out), free(c->R), free(c->att);
}

/* out and att against the textbook formula, in double. */
static void check_forward(ctx_t *c)
{
    const int B = c->B, T = c->T, C = c->C, NH = c->NH, hs = C / NH;
    loss(c);
    double *want = calloc((size_t)B * T * C, sizeof(double)), *p = calloc(T, sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = c->qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double m = -INFINITY, s = 0, rowsum = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = c->qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int i = 0; i < hs; i++)
                        d += (double)q[i] * k[i];
                    p[t2] = d / sqrt((double)hs);
                    m = fmax(m, p[t2]);
                }
                for (int t2 = 0; t2 <= t; t2++)
                    s += p[t2] = exp(p[t2] - m);
                const float *arow = c->att + (((size_t)b * NH + h) * T + t) * T;
                for (int t2 = 0; t2 < T; t2++) {
                    const double a = t2 <= t ? p[t2] / s : 0.0;
                    ck_assert_msg(fabs(arow[t2] - a) <= 1e-6, "att[%d,%d,%d,%d] = %g, want %g",
                                  b, h, t, t2, arow[t2], a);
                    if (t2 > t)
                        ck_assert_msg(arow[t2] == 0.0f, "att above the diagonal is %g", arow[t2]);
                    rowsum += arow[t2];
                    const float *v = c->qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++)
                        want[((size_t)b * T + t) * C + h * hs + i] += a * v[i];
                }
                ck_assert_msg(fabs(rowsum - 1.0) < 1e-5, "att row sums to %g", rowsum);
            }
    kt_assert_close("out", c->out, want, (size_t)B * T * C, 1e-5);
    free(want), free(p);
}

static void check_backward(ctx_t *c, size_t stride)
{
    const size_t n = (size_t)c->B * c->T * 3 * c->C, natt = (size_t)c->B * c->NH * c->T * c->T;
    float *dqkv = kt_alloc(n), *dqkv2 = kt_alloc(n), *scratch = kt_alloc(2 * natt);
    loss(c);
    kt_fill(dqkv, n, 7, -100, 100); /* overwritten: garbage must not matter */
    kt_fill(scratch, 2 * natt, 8, -100, 100);
    loom_cpu_attention_backward(dqkv, scratch, c->R, c->qkv, c->att, c->B, c->T, c->C, c->NH);
    loom_cpu_attention_backward(dqkv2, scratch, c->R, c->qkv, c->att, c->B, c->T, c->C, c->NH);
    kt_assert_scaled("dqkv, second call into a zeroed buffer", dqkv2, dqkv, 1.0f, n, 0.0);
    kt_check_grad("dqkv", c->qkv, dqkv, n, stride, loss, c, 1e-2f, 2e-3);
    free(dqkv), free(dqkv2), free(scratch);
}

START_TEST(test_forward)
{
    ctx_t c;
    setup(&c, 2, 5, 8, 2);
    check_forward(&c);
    teardown(&c);
    setup(&c, 1, 70, 16, 2);
    check_forward(&c);
    teardown(&c);
}
END_TEST

START_TEST(test_causal)
{
    ctx_t c;
    setup(&c, 2, 70, 16, 2);
    const size_t BT = 2 * 70, C = 16;
    loss(&c);
    float *before = kt_alloc(BT * C);
    memcpy(before, c.out, BT * C * sizeof(float));
    for (int t0 = 0; t0 < 70; t0 += 23) { /* change token t0 of batch 1: q, k and v */
        for (size_t i = 0; i < 3 * C; i++)
            c.qkv[(70 + t0) * 3 * C + i] += 0.75f;
        loss(&c);
        ck_assert_msg(memcmp(before, c.out, (70 + t0) * C * sizeof(float)) == 0,
                      "changing token %d changed an earlier output", t0);
        ck_assert_msg(memcmp(before + (70 + t0) * C, c.out + (70 + t0) * C, C * sizeof(float)) != 0,
                      "changing token %d did not change its own output", t0);
        memcpy(before, c.out, BT * C * sizeof(float));
    }
    free(before);
    teardown(&c);
}
END_TEST

START_TEST(test_backward_small)
{
    ctx_t c;
    setup(&c, 2, 5, 8, 2);
    check_backward(&c, 1);
    teardown(&c);
}
END_TEST

START_TEST(test_backward_blocks)
{
    ctx_t c;
    setup(&c, 1, 70, 16, 2);
    check_backward(&c, 5); /* every 5th of 3360 inputs, across all q/k/v columns */
    teardown(&c);
}
END_TEST

/* out | att | dqkv for (2,70,16,2 heads), above the parallel threshold. */
static void both_big(void *unused, float *o)
{
    ctx_t c;
    setup(&c, 2, 70, 16, 2);
    const size_t BT = 2 * 70, natt = 2 * 2 * 70 * 70;
    float *scratch = kt_alloc(2 * natt);
    loss(&c);
    memcpy(o, c.out, BT * 16 * sizeof(float));
    memcpy(o + BT * 16, c.att, natt * sizeof(float));
    loom_cpu_attention_backward(o + BT * 16 + natt, scratch, c.R, c.qkv, c.att, 2, 70, 16, 2);
    free(scratch);
    teardown(&c);
}

START_TEST(test_thread_independent)
{
    kt_assert_thread_independent("out|att|dqkv", both_big, NULL,
                                 2 * 70 * 16 + 2 * 2 * 70 * 70 + 2 * 70 * 48);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attention");
    TCase *tc = tcase_create("attention");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_forward);
    tcase_add_test(tc, test_causal);
    tcase_add_test(tc, test_backward_small);
    tcase_add_test(tc, test_backward_blocks);
    tcase_add_test(tc, test_thread_independent);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
