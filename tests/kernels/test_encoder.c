/* test_encoder.c — token + position embedding: forward values, backward against finite
 * differences of L = sum(out * R), repeated tokens, accumulation (+=) of dwte/dwpe, and the
 * same bits on one thread and two (the scatter is split by columns, not rows).
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 5, C = 20, V = 7, MAXT = 6 };

typedef struct {
    int inp[B * T];
    float *wte, *wpe, *out, *R;
} ctx_t;

static double loss(void *p)
{
    ctx_t *c = p;
    loom_cpu_encoder_forward(c->out, c->inp, c->wte, c->wpe, B, T, C);
    return kt_dot(c->out, c->R, (size_t)B * T * C);
}

static void setup(ctx_t *c)
{
    for (int i = 0; i < B * T; i++)
        c->inp[i] = (i * 3) % V; /* tokens repeat across b and t */
    c->wte = kt_alloc((size_t)V * C), c->wpe = kt_alloc((size_t)MAXT * C);
    c->out = kt_alloc((size_t)B * T * C), c->R = kt_alloc((size_t)B * T * C);
    kt_fill(c->wte, (size_t)V * C, 1, -1, 1);
    kt_fill(c->wpe, (size_t)MAXT * C, 2, -1, 1);
    kt_fill(c->R, (size_t)B * T * C, 3, -1, 1);
}

static void teardown(ctx_t *c)
{
    free(c->wte), free(c->wpe), free(c->out), free(c->R);
}

START_TEST(test_forward)
{
    ctx_t c;
    setup(&c);
    loss(&c);
    for (int bt = 0; bt < B * T; bt++)
        for (int i = 0; i < C; i++)
            ck_assert_float_eq(c.out[bt * C + i],
                               c.wte[c.inp[bt] * C + i] + c.wpe[(bt % T) * C + i]);
    teardown(&c);
}
END_TEST

START_TEST(test_backward_fd_and_accumulate)
{
    ctx_t c;
    setup(&c);
    float *dwte = kt_alloc((size_t)V * C), *dwpe = kt_alloc((size_t)MAXT * C);
    loom_cpu_encoder_backward(dwte, dwpe, c.R, c.inp, B, T, C);
    kt_check_grad("dwte", c.wte, dwte, (size_t)V * C, 1, loss, &c, 1e-2f, 1e-3);
    kt_check_grad("dwpe", c.wpe, dwpe, (size_t)MAXT * C, 1, loss, &c, 1e-2f, 1e-3);
    kt_assert_all("dwpe beyond T", dwpe + T * C, (size_t)(MAXT - T) * C, 0.0f);
    float *once_te = kt_alloc((size_t)V * C), *once_pe = kt_alloc((size_t)MAXT * C);
    memcpy(once_te, dwte, sizeof(float) * V * C);
    memcpy(once_pe, dwpe, sizeof(float) * MAXT * C);
    loom_cpu_encoder_backward(dwte, dwpe, c.R, c.inp, B, T, C);
    kt_assert_scaled("dwte twice", dwte, once_te, 2.0f, (size_t)V * C, 1e-6);
    kt_assert_scaled("dwpe twice", dwpe, once_pe, 2.0f, (size_t)MAXT * C, 1e-6);
    free(dwte), free(dwpe), free(once_te), free(once_pe);
    teardown(&c);
}
END_TEST

/* A size that takes the parallel path: (4,64,160) with 50 tokens, many repeats. */
enum { PB = 4, PT = 64, PC = 160, PV = 50 };

static void backward_big(void *unused, float *out)
{
    static int inp[PB * PT];
    float *dout = kt_alloc((size_t)PB * PT * PC);
    for (int i = 0; i < PB * PT; i++)
        inp[i] = (i * 7) % PV;
    kt_fill(dout, (size_t)PB * PT * PC, 5, -1, 1);
    /* out = dwte (PV,PC) then dwpe (PT,PC), accumulated twice */
    loom_cpu_encoder_backward(out, out + PV * PC, dout, inp, PB, PT, PC);
    loom_cpu_encoder_backward(out, out + PV * PC, dout, inp, PB, PT, PC);
    free(dout);
}

START_TEST(test_thread_independent)
{
    kt_assert_thread_independent("dwte|dwpe", backward_big, NULL, (size_t)(PV + PT) * PC);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("encoder");
    TCase *tc = tcase_create("encoder");
    tcase_add_test(tc, test_forward);
    tcase_add_test(tc, test_backward_fd_and_accumulate);
    tcase_add_test(tc, test_thread_independent);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
