/* test_crossentropy.c — the fused softmax + cross-entropy: losses against a double
 * reference, the gradient left in the logits against finite differences of
 * L = dloss * sum_i loss_i, padded columns V..Vp-1 zero (and never read), ignored targets
 * (outside [0,V): loss 0, gradient row 0), dloss == 0 leaving the logits intact, and huge
 * logits without overflow or subnormal gradients; results independent of the thread count.
 * BT = 6 rows of V = 7 real columns padded to Vp = 8.
 */
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BT = 6, V = 7, Vp = 8 };

typedef struct {
    float logits[BT * Vp], work[BT * Vp], losses[BT];
    int targets[BT];
    float dloss;
} ctx_t;

/* L = dloss * sum of the losses, from a copy (dloss 0: the logits stay as they are). */
static double loss(void *p)
{
    ctx_t *c = p;
    memcpy(c->work, c->logits, sizeof c->work);
    loom_cpu_crossentropy_forward_backward(c->work, c->losses, c->targets, 0.0f, BT, V, Vp);
    double s = 0;
    for (int i = 0; i < BT; i++)
        s += c->losses[i];
    return c->dloss * s;
}

static void setup(ctx_t *c)
{
    kt_fill(c->logits, BT * Vp, 1, -3, 3);
    for (int i = 0; i < BT; i++)
        c->logits[i * Vp + V] = 1e30f; /* padding: must never be read */
    const int t[BT] = {0, 6, 3, -1, 7, 2}; /* rows 3 and 4: ignored targets */
    memcpy(c->targets, t, sizeof t);
    c->dloss = 1.0f / 5.0f;
}

START_TEST(test_losses)
{
    ctx_t c;
    setup(&c);
    loss(&c);
    ck_assert_msg(memcmp(c.work, c.logits, sizeof c.work) == 0, "dloss 0 changed the logits");
    double want[BT];
    for (int i = 0; i < BT; i++) {
        const int y = c.targets[i];
        if (y < 0 || y >= V) {
            want[i] = 0.0;
            continue;
        }
        double m = -INFINITY, s = 0;
        for (int j = 0; j < V; j++)
            m = fmax(m, c.logits[i * Vp + j]);
        for (int j = 0; j < V; j++)
            s += exp(c.logits[i * Vp + j] - m);
        want[i] = log(s) + m - c.logits[i * Vp + y];
    }
    kt_assert_close("losses", c.losses, want, BT, 1e-6);
}
END_TEST

START_TEST(test_gradient)
{
    ctx_t c;
    setup(&c);
    float grad[BT * Vp], fwd_losses[BT];
    loss(&c);
    memcpy(fwd_losses, c.losses, sizeof fwd_losses);
    memcpy(grad, c.logits, sizeof grad);
    loom_cpu_crossentropy_forward_backward(grad, c.losses, c.targets, c.dloss, BT, V, Vp);
    kt_assert_scaled("losses with dloss != 0", c.losses, fwd_losses, 1.0f, BT, 0.0);
    for (int i = 0; i < BT; i++) { /* FD over the real columns only */
        char what[32];
        snprintf(what, sizeof what, "dlogits row %d", i);
        kt_check_grad(what, c.logits + i * Vp, grad + i * Vp, V, 1, loss, &c, 1e-2f, 1e-3);
        ck_assert_msg(grad[i * Vp + V] == 0.0f, "padded column of row %d is %g", i,
                      grad[i * Vp + V]);
    }
    kt_assert_all("ignored row 3", grad + 3 * Vp, Vp, 0.0f);
    kt_assert_all("ignored row 4", grad + 4 * Vp, Vp, 0.0f);
    /* a valid row's gradient sums to 0 (softmax sums to 1, minus the one-hot) */
    double s = 0;
    for (int j = 0; j < V; j++)
        s += grad[j];
    ck_assert_msg(fabs(s) < 1e-6, "gradient row sums to %g", s);
}
END_TEST

START_TEST(test_huge_logits)
{
    float logits[Vp] = {1000, -1000, 999, 0, 88, 89, -88, 5};
    float losses[1];
    int target = 2;
    loom_cpu_crossentropy_forward_backward(logits, losses, &target, 1.0f, 1, V, Vp);
    ck_assert_msg(fabs(losses[0] - (1.0 + log1p(exp(-1.0)))) < 1e-5, "loss %g", losses[0]);
    for (int j = 0; j < Vp; j++)
        ck_assert_msg(isfinite(logits[j]) && fpclassify(logits[j]) != FP_SUBNORMAL,
                      "gradient[%d] = %g", j, logits[j]);
}
END_TEST

/* 64 rows of V = 1000 padded to 1024, every 9th target ignored: losses | gradient. */
enum { PBT = 64, PV = 1000, PVP = 1024 };

static void big(void *unused, float *o)
{
    int targets[PBT];
    for (int i = 0; i < PBT; i++)
        targets[i] = i % 9 == 0 ? -1 : (i * 37) % PV;
    kt_fill(o + PBT, (size_t)PBT * PVP, 6, -8, 8);
    loom_cpu_crossentropy_forward_backward(o + PBT, o, targets, 0.5f, PBT, PV, PVP);
}

START_TEST(test_thread_independent)
{
    kt_assert_thread_independent("losses|dlogits", big, NULL, PBT + (size_t)PBT * PVP);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("crossentropy");
    TCase *tc = tcase_create("crossentropy");
    tcase_add_test(tc, test_losses);
    tcase_add_test(tc, test_gradient);
    tcase_add_test(tc, test_huge_logits);
    tcase_add_test(tc, test_thread_independent);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
