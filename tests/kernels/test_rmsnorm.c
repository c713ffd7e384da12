/* test_rmsnorm.c — RMSNorm: forward against a double-precision reference (out and the saved
 * rstd), backward against finite differences of L = sum(out * R) in inp and weight, the
 * semantics (dinp overwritten, dweight accumulated), and the same bits on one thread and two.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { ROWS = 10, C = 20, N = ROWS * C }; /* C > 16 spans two column blocks */
#define EPS 1e-5f

typedef struct {
    float *inp, *w, *out, *rstd, *R;
} ctx_t;

static double loss(void *p)
{
    ctx_t *c = p;
    loom_cpu_rmsnorm_forward(c->out, c->rstd, c->inp, c->w, ROWS, C, EPS);
    return kt_dot(c->out, c->R, N);
}

static void setup(ctx_t *c)
{
    c->inp = kt_alloc(N), c->out = kt_alloc(N), c->R = kt_alloc(N);
    c->w = kt_alloc(C), c->rstd = kt_alloc(ROWS);
    kt_fill(c->inp, N, 1, -2, 3);
    kt_fill(c->w, C, 2, 0.5f, 1.5f);
    kt_fill(c->R, N, 4, -1, 1);
}

static void teardown(ctx_t *c)
{
    free(c->inp), free(c->out), free(c->R), free(c->w), free(c->rstd);
}

START_TEST(test_forward)
{
    ctx_t c;
    setup(&c);
    loss(&c);
    double want[N], wrstd[ROWS];
    for (int r = 0; r < ROWS; r++) {
        double s = 0;
        for (int i = 0; i < C; i++)
            s += (double)c.inp[r * C + i] * c.inp[r * C + i];
        wrstd[r] = 1.0 / sqrt(s / C + EPS);
        for (int i = 0; i < C; i++)
            want[r * C + i] = c.inp[r * C + i] * wrstd[r] * c.w[i];
    }
    kt_assert_close("out", c.out, want, N, 1e-5);
    kt_assert_close("rstd", c.rstd, wrstd, ROWS, 1e-5);
    teardown(&c);
}
END_TEST

START_TEST(test_backward)
{
    ctx_t c;
    setup(&c);
    loss(&c);
    float *dinp = kt_alloc(N), *dw = kt_alloc(C);
    kt_fill(dinp, N, 9, -100, 100); /* overwritten, so garbage must not matter */
    loom_cpu_rmsnorm_backward(dinp, dw, c.R, c.inp, c.w, c.rstd, ROWS, C);
    kt_check_grad("dinp", c.inp, dinp, N, 1, loss, &c, 1e-2f, 2e-3);
    kt_check_grad("dweight", c.w, dw, C, 1, loss, &c, 1e-2f, 2e-3);
    float once_inp[N], once_w[C];
    memcpy(once_inp, dinp, sizeof once_inp);
    memcpy(once_w, dw, sizeof once_w);
    loss(&c); /* rstd at the unperturbed input */
    loom_cpu_rmsnorm_backward(dinp, dw, c.R, c.inp, c.w, c.rstd, ROWS, C);
    kt_assert_scaled("dinp twice (overwrite)", dinp, once_inp, 1.0f, N, 1e-6);
    kt_assert_scaled("dweight twice (accumulate)", dw, once_w, 2.0f, C, 1e-6);
    /* dinp aliasing dout */
    float *d = kt_alloc(N);
    memcpy(d, c.R, N * sizeof(float));
    float *dw2 = kt_alloc(C);
    loom_cpu_rmsnorm_backward(d, dw2, d, c.inp, c.w, c.rstd, ROWS, C);
    kt_assert_scaled("dinp aliasing dout", d, once_inp, 1.0f, N, 0.0);
    free(dinp), free(dw), free(d), free(dw2);
    teardown(&c);
}
END_TEST

enum { PR = 256, PC = 160, PN = PR * PC }; /* above the parallel threshold */

static void both_big(void *unused, float *o)
{
    float *inp = kt_alloc(PN), *w = kt_alloc(PC), *dout = kt_alloc(PN);
    kt_fill(inp, PN, 1, -2, 3);
    kt_fill(w, PC, 2, 0.5f, 1.5f);
    kt_fill(dout, PN, 4, -1, 1);
    float *out = o, *rstd = out + PN, *dinp = rstd + PR, *dw = dinp + PN;
    loom_cpu_rmsnorm_forward(out, rstd, inp, w, PR, PC, EPS);
    loom_cpu_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, PR, PC);
    free(inp), free(w), free(dout);
}

START_TEST(test_thread_independent)
{
    kt_assert_thread_independent("rmsnorm", both_big, NULL, 2 * PN + PR + PC);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rmsnorm");
    TCase *tc = tcase_create("rmsnorm");
    tcase_add_test(tc, test_forward);
    tcase_add_test(tc, test_backward);
    tcase_add_test(tc, test_thread_independent);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
