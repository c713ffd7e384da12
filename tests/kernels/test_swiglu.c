/* test_swiglu.c — SwiGLU: forward against silu(g) * u in double (extremes finite),
 * backward against finite differences of L = sum(out * R) in both halves of the input,
 * dinp overwritten, and the same bits on one thread and two.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { ROWS = 6, F = 24, NI = ROWS * 2 * F, NO = ROWS * F };

typedef struct {
    float *in, *out, *R;
} ctx_t;

static double loss(void *p)
{
    ctx_t *c = p;
    loom_cpu_swiglu_forward(c->out, c->in, ROWS, F);
    return kt_dot(c->out, c->R, NO);
}

static void setup(ctx_t *c)
{
    c->in = kt_alloc(NI), c->out = kt_alloc(NO), c->R = kt_alloc(NO);
    kt_fill(c->in, NI, 1, -5, 5);
    kt_fill(c->R, NO, 2, -1, 1);
}

START_TEST(test_forward)
{
    ctx_t c;
    setup(&c);
    c.in[0] = -200.0f, c.in[1] = 200.0f, c.in[2] = 0.0f; /* gates at the extremes */
    loss(&c);
    double want[NO];
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < F; j++) {
            double g = c.in[r * 2 * F + j], u = c.in[r * 2 * F + F + j];
            want[r * F + j] = g / (1.0 + exp(-g)) * u;
        }
    kt_assert_close("out", c.out, want, NO, 2e-6);
    for (int i = 0; i < NO; i++)
        ck_assert_msg(isfinite(c.out[i]), "out[%d] = %g", i, c.out[i]);
    free(c.in), free(c.out), free(c.R);
}
END_TEST

START_TEST(test_backward)
{
    ctx_t c;
    setup(&c);
    float *d = kt_alloc(NI), *d2 = kt_alloc(NI);
    kt_fill(d, NI, 9, -100, 100); /* overwritten */
    loom_cpu_swiglu_backward(d, c.in, c.R, ROWS, F);
    loom_cpu_swiglu_backward(d2, c.in, c.R, ROWS, F);
    kt_assert_scaled("dinp, second call into a zeroed buffer", d2, d, 1.0f, NI, 0.0);
    kt_check_grad("dinp", c.in, d, NI, 1, loss, &c, 1e-2f, 2e-3);
    free(d), free(d2), free(c.in), free(c.out), free(c.R);
}
END_TEST

enum { PR = 64, PF = 512 };

static void both_big(void *unused, float *o)
{
    float *in = kt_alloc(PR * 2 * PF), *dout = kt_alloc(PR * PF);
    kt_fill(in, PR * 2 * PF, 1, -6, 6);
    kt_fill(dout, PR * PF, 2, -1, 1);
    loom_cpu_swiglu_forward(o, in, PR, PF);
    loom_cpu_swiglu_backward(o + PR * PF, in, dout, PR, PF);
    free(in), free(dout);
}

START_TEST(test_thread_independent)
{
    kt_assert_thread_independent("swiglu", both_big, NULL, 3 * PR * PF);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("swiglu");
    TCase *tc = tcase_create("swiglu");
    tcase_add_test(tc, test_forward);
    tcase_add_test(tc, test_backward);
    tcase_add_test(tc, test_thread_independent);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
