/* test_layernorm.c — LayerNorm: forward against a double-precision reference (including
 * the saved mean and rstd), backward against finite differences of L = sum(out * R) in
 * inp, weight and bias, the semantics (dinp overwritten, dweight/dbias accumulated), and
 * the same bits on one thread and two.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 5, C = 20, N = B * T * C }; /* C > 16 spans two column blocks */

typedef struct {
    float *inp, *w, *b, *out, *mean, *rstd, *R;
} ctx_t;

static double loss(void *p)
{
    ctx_t *c = p;
    loom_cpu_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, B, T, C);
    return kt_dot(c->out, c->R, N);
}

static void setup(ctx_t *c)
{
    c->inp = kt_alloc(N), c->out = kt_alloc(N), c->R = kt_alloc(N);
    c->w = kt_alloc(C), c->b = kt_alloc(C), c->mean = kt_alloc(B * T), c->rstd = kt_alloc(B * T);
    kt_fill(c->inp, N, 1, -2, 3); /* nonzero mean */
    kt_fill(c->w, C, 2, 0.5f, 1.5f);
    kt_fill(c->b, C, 3, -0.5f, 0.5f);
    kt_fill(c->R, N, 4, -1, 1);
}

static void teardown(ctx_t *c)
{
    free(c->inp), free(c->out), free(c->R), free(c->w), free(c->b), free(c->mean), free(c->rstd);
}

START_TEST(test_forward)
{
    ctx_t c;
    setup(&c);
    loss(&c);
    double want[N], wmean[B * T], wrstd[B * T];
    for (int r = 0; r < B * T; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++)
            m += c.inp[r * C + i];
        m /= C;
        for (int i = 0; i < C; i++)
            v += (c.inp[r * C + i] - m) * (c.inp[r * C + i] - m);
        v /= C;
        wmean[r] = m;
        wrstd[r] = 1.0 / sqrt(v + 1e-5);
        for (int i = 0; i < C; i++)
            want[r * C + i] = (c.inp[r * C + i] - m) * wrstd[r] * c.w[i] + c.b[i];
    }
    kt_assert_close("out", c.out, want, N, 1e-5);
    kt_assert_close("mean", c.mean, wmean, B * T, 1e-6);
    kt_assert_close("rstd", c.rstd, wrstd, B * T, 1e-5);
    teardown(&c);
}
END_TEST

START_TEST(test_backward)
{
    ctx_t c;
    setup(&c);
    loss(&c);
    float *dinp = kt_alloc(N), *dw = kt_alloc(C), *db = kt_alloc(C);
    kt_fill(dinp, N, 9, -100, 100); /* overwritten, so garbage must not matter */
    loom_cpu_layernorm_backward(dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, B, T, C);
    kt_check_grad("dinp", c.inp, dinp, N, 1, loss, &c, 1e-2f, 2e-3);
    kt_check_grad("dweight", c.w, dw, C, 1, loss, &c, 1e-2f, 2e-3);
    kt_check_grad("dbias", c.b, db, C, 1, loss, &c, 1e-2f, 2e-3);

    float once_inp[N], once_w[C], once_b[C];
    memcpy(once_inp, dinp, sizeof once_inp);
    memcpy(once_w, dw, sizeof once_w);
    memcpy(once_b, db, sizeof once_b);
    loss(&c); /* restore mean/rstd at the unperturbed input */
    loom_cpu_layernorm_backward(dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, B, T, C);
    kt_assert_scaled("dinp twice (overwrite)", dinp, once_inp, 1.0f, N, 1e-6);
    kt_assert_scaled("dweight twice (accumulate)", dw, once_w, 2.0f, C, 1e-6);
    kt_assert_scaled("dbias twice (accumulate)", db, once_b, 2.0f, C, 1e-6);
    free(dinp), free(dw), free(db);
    teardown(&c);
}
END_TEST

/* (4,64,160): above the parallel threshold; out = out | mean | rstd | dinp | dw | db. */
enum { PB = 4, PT = 64, PC = 160, PN = PB * PT * PC };

static void both_big(void *unused, float *o)
{
    float *inp = kt_alloc(PN), *w = kt_alloc(PC), *b = kt_alloc(PC), *dout = kt_alloc(PN);
    kt_fill(inp, PN, 1, -2, 3);
    kt_fill(w, PC, 2, 0.5f, 1.5f);
    kt_fill(b, PC, 3, -1, 1);
    kt_fill(dout, PN, 4, -1, 1);
    float *out = o, *mean = out + PN, *rstd = mean + PB * PT, *dinp = rstd + PB * PT;
    float *dw = dinp + PN, *db = dw + PC;
    loom_cpu_layernorm_forward(out, mean, rstd, inp, w, b, PB, PT, PC);
    loom_cpu_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, PB, PT, PC);
    free(inp), free(w), free(b), free(dout);
}

START_TEST(test_thread_independent)
{
    kt_assert_thread_independent("layernorm", both_big, NULL, 2 * PN + 2 * PB * PT + 2 * PC);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("layernorm");
    TCase *tc = tcase_create("layernorm");
    tcase_add_test(tc, test_forward);
    tcase_add_test(tc, test_backward);
    tcase_add_test(tc, test_thread_independent);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
