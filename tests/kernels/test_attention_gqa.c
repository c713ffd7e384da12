/* test_attention_gqa.c — grouped-query attention: against multi-head attention over the
 * same q with each kv head repeated for its group (forward: out and att; backward: dq
 * equal, dk and dv the sums over the group's copies), backward against finite differences
 * of L = sum(out * R) in qkv, dqkv overwritten, decode's row = the forward's last row
 * bitwise, KVH = NH bitwise the plain kernels, and the same bits on one thread and two.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, T, C, NH, KVH;
    float *qkv, *out, *att, *R;
} ctx_t;

static size_t width(const ctx_t *c) { return (size_t)c->C + 2 * (size_t)c->KVH * (c->C / c->NH); }

static double loss(void *p)
{
    ctx_t *c = p;
    loom_cpu_attention_gqa_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH, c->KVH);
    return kt_dot(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void setup(ctx_t *c, int B, int T, int C, int NH, int KVH)
{
    *c = (ctx_t){B, T, C, NH, KVH, NULL, NULL, NULL, NULL};
    const size_t BT = (size_t)B * T;
    c->qkv = kt_alloc(BT * width(c)), c->out = kt_alloc(BT * C), c->R = kt_alloc(BT * C);
    c->att = kt_alloc((size_t)B * NH * T * T);
    kt_fill(c->qkv, BT * width(c), 1, -1.5f, 1.5f);
    kt_fill(c->R, BT * C, 2, -1, 1);
}

static void teardown(ctx_t *c)
{
    free(c->qkv), free(c->out), free(c->R), free(c->att);
}

/* The multi-head (B,T,3C) input with kv head h / group copied to head h. */
static float *expand(const ctx_t *c)
{
    const int hs = c->C / c->NH, group = c->NH / c->KVH, C = c->C;
    const size_t W = width(c), BT = (size_t)c->B * c->T, KC = (size_t)c->KVH * hs;
    float *m = kt_alloc(BT * 3 * C);
    for (size_t r = 0; r < BT; r++) {
        memcpy(m + r * 3 * C, c->qkv + r * W, C * sizeof(float));
        for (int h = 0; h < c->NH; h++) {
            memcpy(m + r * 3 * C + C + h * hs, c->qkv + r * W + C + (h / group) * hs,
                   hs * sizeof(float));
            memcpy(m + r * 3 * C + 2 * C + h * hs, c->qkv + r * W + C + KC + (h / group) * hs,
                   hs * sizeof(float));
        }
    }
    return m;
}

static void check_against_mha(int B, int T, int C, int NH, int KVH)
{
    ctx_t c;
    setup(&c, B, T, C, NH, KVH);
    loss(&c);
    const int hs = C / NH, group = NH / KVH;
    const size_t BT = (size_t)B * T, W = width(&c), KC = (size_t)KVH * hs, natt = (size_t)B * NH * T * T;
    float *mqkv = expand(&c), *mout = kt_alloc(BT * C), *matt = kt_alloc(natt);
    loom_cpu_attention_forward(mout, matt, mqkv, B, T, C, NH);
    double *want = calloc(BT * C > natt ? BT * C : natt, sizeof(double));
    for (size_t i = 0; i < BT * C; i++)
        want[i] = mout[i];
    kt_assert_close("out vs multi-head", c.out, want, BT * C, 1e-6);
    for (size_t i = 0; i < natt; i++)
        want[i] = matt[i];
    kt_assert_close("att vs multi-head", c.att, want, natt, 1e-6);
    /* backward: dq equal, dk/dv of kv head j = sum of the multi-head dk/dv of its group */
    float *scratch = kt_alloc(2 * natt), *mdqkv = kt_alloc(BT * 3 * C), *dqkv = kt_alloc(BT * W);
    loom_cpu_attention_backward(mdqkv, scratch, c.R, mqkv, matt, B, T, C, NH);
    kt_fill(dqkv, BT * W, 7, -100, 100); /* overwritten */
    loom_cpu_attention_gqa_backward(dqkv, scratch, c.R, c.qkv, c.att, B, T, C, NH, KVH);
    double *w2 = calloc(BT * W, sizeof(double));
    for (size_t r = 0; r < BT; r++) {
        for (int i = 0; i < C; i++)
            w2[r * W + i] = mdqkv[r * 3 * C + i];
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < hs; i++) {
                w2[r * W + C + (h / group) * hs + i] += mdqkv[r * 3 * C + C + h * hs + i];
                w2[r * W + C + KC + (h / group) * hs + i] += mdqkv[r * 3 * C + 2 * C + h * hs + i];
            }
    }
    kt_assert_close("dqkv vs multi-head", dqkv, w2, BT * W, 1e-5);
    kt_check_grad("dqkv", c.qkv, dqkv, BT * W, BT * W > 2000 ? 7 : 1, loss, &c, 1e-2f, 2e-3);
    free(mqkv), free(mout), free(matt), free(want), free(scratch), free(mdqkv), free(dqkv), free(w2);
    teardown(&c);
}

START_TEST(test_against_mha)
{
    check_against_mha(2, 5, 16, 4, 2);
    check_against_mha(2, 6, 16, 4, 1);
    check_against_mha(1, 70, 16, 4, 2); /* across the causal row blocks */
}
END_TEST

START_TEST(test_kvh_equals_nh_bitwise)
{
    ctx_t c;
    setup(&c, 2, 70, 16, 2, 2);
    const size_t BT = 140, natt = 2 * 2 * 70 * 70;
    float *out = kt_alloc(BT * 16), *att = kt_alloc(natt), *s = kt_alloc(2 * natt);
    float *d1 = kt_alloc(BT * 48), *d2 = kt_alloc(BT * 48);
    loss(&c);
    loom_cpu_attention_forward(out, att, c.qkv, 2, 70, 16, 2);
    ck_assert(memcmp(out, c.out, BT * 16 * sizeof(float)) == 0);
    ck_assert(memcmp(att, c.att, natt * sizeof(float)) == 0);
    loom_cpu_attention_backward(d1, s, c.R, c.qkv, att, 2, 70, 16, 2);
    loom_cpu_attention_gqa_backward(d2, s, c.R, c.qkv, att, 2, 70, 16, 2, 2);
    ck_assert(memcmp(d1, d2, BT * 48 * sizeof(float)) == 0);
    free(out), free(att), free(s), free(d1), free(d2);
    teardown(&c);
}
END_TEST

START_TEST(test_decode_row)
{
    loom_cpu_set_deterministic(1); /* generation's mode: row-stable products */
    ctx_t c;
    setup(&c, 1, 9, 16, 4, 2);
    loss(&c);
    float out[16], att[4 * 9];
    loom_cpu_attention_gqa_decode(out, att, 9, c.qkv, 8, 16, 4, 2);
    ck_assert_msg(memcmp(out, c.out + 8 * 16, sizeof out) == 0, "decoded row differs");
    for (int h = 0; h < 4; h++)
        ck_assert(memcmp(att + h * 9, c.att + ((size_t)h * 9 + 8) * 9, 9 * sizeof(float)) == 0);
    loom_cpu_set_deterministic(0);
    teardown(&c);
}
END_TEST

static void both_big(void *unused, float *o)
{
    ctx_t c;
    setup(&c, 2, 70, 32, 4, 2);
    const size_t BT = 140, natt = 2 * 4 * 70 * 70;
    float *scratch = kt_alloc(2 * natt);
    loss(&c);
    memcpy(o, c.out, BT * 32 * sizeof(float));
    loom_cpu_attention_gqa_backward(o + BT * 32, scratch, c.R, c.qkv, c.att, 2, 70, 32, 4, 2);
    free(scratch);
    teardown(&c);
}

START_TEST(test_thread_independent)
{
    kt_assert_thread_independent("out|dqkv", both_big, NULL, 140 * 32 + 140 * 64);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attention_gqa");
    TCase *tc = tcase_create("attention_gqa");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_against_mha);
    tcase_add_test(tc, test_kvh_equals_nh_bitwise);
    tcase_add_test(tc, test_decode_row);
    tcase_add_test(tc, test_thread_independent);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
