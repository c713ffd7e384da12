/* test_crossentropy.c — the vocabulary-parallel cross-entropy passes (ce_row_max,
 * ce_row_sumexp, ce_target_logit, ce_finish), run as one rank runs them (col0 = 0,
 * Vl = Vp) and as 2 and 4 ranks would (column slices, statistics combined between passes).
 *
 * One slice: losses against a double reference, the gradient left in the logits against
 * finite differences of L = dloss * sum_i loss_i and against a double softmax, padded
 * columns V..Vp-1 zero (and never read: they hold 1e30 or NaN), ignored targets (outside
 * [0,V): loss 0, gradient row 0), dloss == 0 leaving the logits intact, huge logits without
 * overflow or subnormal gradients, and agreement (1e-6 relative) with the fused kernel
 * these passes replaced (kept here as fused_reference). Slices: with V not divisible by the
 * slice count, padding in the last slice(s) and one slice with no real column, losses and
 * gradients equal the one-slice ones within 1e-6 relative. ce_row_sumexp adds strictly in
 * column order, and its bits depend on neither the row's position nor the slice's width.
 * Results independent of the thread count.
 */
#include "cpu_common.h"
#include "cpu_kernels.h"
#include "kernel_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The passes over a (BT, Vp) matrix cut into nslices equal column slices (Vp % nslices
 * == 0), as nslices ranks would run them: max combined by max, sums and target logits
 * added in slice order. Gradients (dloss != 0) land back in logits. */
static void ce_sliced(float *logits, float *losses, const int *targets, float dloss, int BT,
                      int V, int Vp, int nslices)
{
    const int Vl = Vp / nslices;
    ck_assert_int_eq(Vl * nslices, Vp);
    float *m = kt_alloc(BT), *s = kt_alloc(BT), *t = kt_alloc(BT), *part = kt_alloc(BT);
    float **sl = malloc(sizeof(float *) * nslices);
    for (int r = 0; r < nslices; r++) {
        sl[r] = kt_alloc((size_t)BT * Vl);
        for (int i = 0; i < BT; i++)
            memcpy(sl[r] + (size_t)i * Vl, logits + (size_t)i * Vp + (size_t)r * Vl,
                   sizeof(float) * Vl);
    }
    for (int i = 0; i < BT; i++)
        m[i] = -INFINITY, s[i] = 0.0f, t[i] = 0.0f;
    for (int r = 0; r < nslices; r++) {
        loom_cpu_ce_row_max(part, sl[r], BT, Vl, r * Vl, V);
        for (int i = 0; i < BT; i++)
            m[i] = part[i] > m[i] ? part[i] : m[i];
    }
    for (int r = 0; r < nslices; r++) {
        loom_cpu_ce_row_sumexp(part, sl[r], m, BT, Vl, r * Vl, V, 0, Vl);
        for (int i = 0; i < BT; i++)
            s[i] += part[i];
        loom_cpu_ce_target_logit(part, sl[r], targets, BT, Vl, r * Vl);
        for (int i = 0; i < BT; i++)
            t[i] += part[i];
    }
    for (int r = 0; r < nslices; r++) {
        loom_cpu_ce_finish(sl[r], part, m, s, t, targets, dloss, BT, Vl, r * Vl, V);
        if (r == 0)
            memcpy(losses, part, sizeof(float) * BT);
        else /* every rank computes the same losses from the combined statistics */
            ck_assert_msg(memcmp(losses, part, sizeof(float) * BT) == 0,
                          "slice %d's losses differ from slice 0's", r);
        for (int i = 0; i < BT; i++)
            memcpy(logits + (size_t)i * Vp + (size_t)r * Vl, sl[r] + (size_t)i * Vl,
                   sizeof(float) * Vl);
        free(sl[r]);
    }
    free(sl), free(m), free(s), free(t), free(part);
}

/* The fused kernel the passes replaced (crossentropy.c before tensor parallelism), as the
 * reference the one-rank passes must agree with. */
static float fused_row(float *x, int y, float dloss, int V, int Vp)
{
    float m = -INFINITY;
    for (int j = 0; j < V; j++)
        m = x[j] > m ? x[j] : m;
    const float xy = x[y];
    float s = 0.0f;
    if (dloss != 0.0f) {
        for (int j = 0; j < V; j++) {
            const float e = loom_cpu_expf(x[j] - m);
            x[j] = e;
            s += e;
        }
        const float k = dloss / s;
        for (int j = 0; j < V; j++)
            x[j] = loom_cpu_flush(x[j] * k);
        x[y] -= dloss;
        memset(x + V, 0, (size_t)(Vp - V) * sizeof(float));
    } else {
        for (int j = 0; j < V; j++)
            s += loom_cpu_expf(x[j] - m);
    }
    return logf(s) + (m - xy);
}

static void fused_reference(float *logits, float *losses, const int *targets, float dloss,
                            int BT, int V, int Vp)
{
    for (int i = 0; i < BT; i++) {
        float *x = logits + (size_t)i * Vp;
        const int y = targets[i];
        if (y >= 0 && y < V) {
            losses[i] = fused_row(x, y, dloss, V, Vp);
        } else {
            losses[i] = 0.0f;
            if (dloss != 0.0f)
                memset(x, 0, (size_t)Vp * sizeof(float));
        }
    }
}

/* |got - want| <= tol * |want| (+ a 1e-30 floor for flushed tiny entries), elementwise. */
static void assert_rel(const char *what, const float *got, const float *want, size_t n,
                       double tol)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabs((double)got[i] - want[i]) <= tol * fabs((double)want[i]) + 1e-30,
                      "%s[%zu]: got %.9g, want %.9g", what, i, got[i], want[i]);
}

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
    ce_sliced(c->work, c->losses, c->targets, 0.0f, BT, V, Vp, 1);
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
    ce_sliced(grad, c.losses, c.targets, c.dloss, BT, V, Vp, 1);
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
    /* against a double softmax: dloss * (p - onehot) */
    for (int i = 0; i < BT; i++) {
        const int y = c.targets[i];
        if (y < 0 || y >= V)
            continue;
        double m = -INFINITY, s = 0, want[V];
        for (int j = 0; j < V; j++)
            m = fmax(m, c.logits[i * Vp + j]);
        for (int j = 0; j < V; j++)
            s += exp(c.logits[i * Vp + j] - m);
        for (int j = 0; j < V; j++)
            want[j] = c.dloss * (exp(c.logits[i * Vp + j] - m) / s - (j == y));
        kt_assert_close("dlogits vs double", grad + i * Vp, want, V, 1e-6);
    }
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
    ce_sliced(logits, losses, &target, 1.0f, 1, V, Vp, 1);
    ck_assert_msg(fabs(losses[0] - (1.0 + log1p(exp(-1.0)))) < 1e-5, "loss %g", losses[0]);
    for (int j = 0; j < Vp; j++)
        ck_assert_msg(isfinite(logits[j]) && fpclassify(logits[j]) != FP_SUBNORMAL,
                      "gradient[%d] = %g", j, logits[j]);
}
END_TEST

/* 64 rows of V = 1000 padded to 1024, every 9th target ignored. */
enum { PBT = 64, PV = 1000, PVP = 1024 };

static void big_targets(int *targets, int n, int v)
{
    for (int i = 0; i < n; i++)
        targets[i] = i % 9 == 0 ? (i % 2 ? v + 3 : -1) : (i * 37) % v;
}

START_TEST(test_matches_fused)
{
    float *a = kt_alloc((size_t)PBT * PVP), *b = kt_alloc((size_t)PBT * PVP);
    float la[PBT], lb[PBT];
    int targets[PBT];
    big_targets(targets, PBT, PV);
    kt_fill(a, (size_t)PBT * PVP, 6, -8, 8);
    memcpy(b, a, sizeof(float) * PBT * PVP);
    ce_sliced(a, la, targets, 0.5f, PBT, PV, PVP, 1);
    fused_reference(b, lb, targets, 0.5f, PBT, PV, PVP);
    /* The fused kernel summed e^{x-m} in float: over 1000 terms its own relative error
     * reaches a few 1e-6 (the passes add in double and round once), hence 5e-6 for the
     * gradient (measured: 2.0e-6); the losses (log S + O(1)) agree to 1e-6. */
    assert_rel("losses vs fused", la, lb, PBT, 1e-6);
    assert_rel("dlogits vs fused", a, b, (size_t)PBT * PVP, 5e-6);
    /* and the passes against double precision: within 1e-6 relative (+1e-12 absolute for
     * entries near 0) */
    float *x = kt_alloc((size_t)PBT * PVP);
    kt_fill(x, (size_t)PBT * PVP, 6, -8, 8);
    for (int i = 0; i < PBT; i++) {
        const int y = targets[i];
        const float *xi = x + (size_t)i * PVP;
        if (y < 0 || y >= PV)
            continue;
        double m = -INFINITY, s = 0;
        for (int j = 0; j < PV; j++)
            m = fmax(m, xi[j]);
        for (int j = 0; j < PV; j++)
            s += exp((double)xi[j] - m);
        const double l = log(s) + m - xi[y];
        ck_assert_msg(fabs(la[i] - l) <= 1e-6 * fabs(l), "loss %d: %.9g vs double %.9g", i, la[i], l);
        for (int j = 0; j < PV; j++) {
            const double g = 0.5 * (exp((double)xi[j] - m) / s - (j == y));
            const float got = a[(size_t)i * PVP + j];
            ck_assert_msg(fabs(got - g) <= 1e-6 * fabs(g) + 1e-12, "dlogits[%d,%d]: %.9g vs double %.9g",
                          i, j, got, g);
        }
    }
    free(x);
    free(a), free(b);
}
END_TEST

/* nslices = 2 and 4 against 1 slice: V not a multiple of the slice count; padding (NaN, so
 * reading it would show) in the last slices, and one slice with no real column at all. */
static void check_split(int bt, int v, int vp, uint32_t seed)
{
    float *x = kt_alloc((size_t)bt * vp), *one = kt_alloc((size_t)bt * vp);
    float *split = kt_alloc((size_t)bt * vp), *l1 = kt_alloc(bt), *ls = kt_alloc(bt);
    int *targets = malloc(sizeof(int) * bt);
    big_targets(targets, bt, v);
    targets[bt - 1] = v - 1; /* the last real column, in the last slice that has any */
    kt_fill(x, (size_t)bt * vp, seed, -6, 6);
    for (int i = 0; i < bt; i++)
        for (int j = v; j < vp; j++)
            x[(size_t)i * vp + j] = NAN;
    memcpy(one, x, sizeof(float) * bt * vp);
    ce_sliced(one, l1, targets, 0.25f, bt, v, vp, 1);
    for (int ns = 2; ns <= 4; ns += 2) {
        ck_assert_msg(v % ns != 0 && (vp / ns) * (ns - 1) >= v,
                      "case %dx%d/%d: want V not divisible and an all-padding slice", v, vp, ns);
        memcpy(split, x, sizeof(float) * bt * vp);
        ce_sliced(split, ls, targets, 0.25f, bt, v, vp, ns);
        char what[64];
        snprintf(what, sizeof what, "losses, %d slices of %dx%d", ns, v, vp);
        assert_rel(what, ls, l1, bt, 1e-6);
        snprintf(what, sizeof what, "dlogits, %d slices of %dx%d", ns, v, vp);
        assert_rel(what, split, one, (size_t)bt * vp, 1e-6);
        for (int i = 0; i < bt; i++)
            for (int j = v; j < vp; j++)
                ck_assert_msg(split[(size_t)i * vp + j] == 0.0f, "padding [%d,%d] = %g", i, j,
                              split[(size_t)i * vp + j]);
    }
    free(x), free(one), free(split), free(l1), free(ls), free(targets);
}

START_TEST(test_vocab_split)
{
    check_split(6, 11, 24, 7);     /* slices of 12 / 6: 4 slices -> [12,18), [18,24) empty */
    check_split(37, 1001, 2048, 8); /* 4 slices of 512: the last holds no real column */
}
END_TEST

/* The documented order, bit for bit: sumexp over [c0,c1) is float(((0 + e_c0) + e_c0+1) +
 * ...) with the adds in double. Each e_j (float) is read back from the kernel itself as a
 * one-column sum (exact: a float converted to double and back). With terms spanning 2^-60
 * .. 1 the double rounding of each add matters, so another order would show. */
START_TEST(test_sumexp_in_order)
{
    enum { N = 1500 };
    float x[N], m = 0.0f, s, e;
    kt_fill(x, N, 11, -42, 0);
    x[700] = 0.0f;
    double want = 0.0;
    for (int j = 0; j < N; j++) {
        loom_cpu_ce_row_sumexp(&e, x, &m, 1, N, 0, N, j, j + 1);
        want += (double)e;
    }
    loom_cpu_ce_row_sumexp(&s, x, &m, 1, N, 0, N, 0, N);
    ck_assert_msg(s == (float)want, "sum %.9g, in-order double reference %.9g", s, (float)want);
}
END_TEST

/* A row's sum over [c0,c1) has the same bits alone (BT = 1) as inside a block of rows, and
 * when the slice is wider (Vl) than the columns summed. */
START_TEST(test_sumexp_shape_independent)
{
    enum { R = 21, W = 700 };
    float *x = kt_alloc((size_t)R * W), m[R], s[R], one, row[W];
    kt_fill(x, (size_t)R * W, 9, -5, 5);
    loom_cpu_ce_row_max(m, x, R, W, 0, W);
    loom_cpu_ce_row_sumexp(s, x, m, R, W, 0, W, 37, 650);
    for (int i = 0; i < R; i++) {
        loom_cpu_ce_row_sumexp(&one, x + (size_t)i * W, m + i, 1, W, 0, W, 37, 650);
        ck_assert_msg(memcmp(&one, &s[i], sizeof one) == 0, "row %d: %.9g alone, %.9g in block",
                      i, one, s[i]);
        memcpy(row, x + (size_t)i * W + 37, sizeof(float) * (650 - 37));
        loom_cpu_ce_row_sumexp(&one, row, m + i, 1, 650 - 37, 0, 650 - 37, 0, 650 - 37);
        ck_assert_msg(memcmp(&one, &s[i], sizeof one) == 0, "row %d: %.9g narrow, %.9g wide",
                      i, one, s[i]);
    }
    /* real columns only: [c0,c1) is clipped to V - col0 */
    loom_cpu_ce_row_sumexp(s, x, m, R, W, 0, 600, 37, 650);
    loom_cpu_ce_row_sumexp(&one, x, m, 1, W, 0, W, 37, 600);
    ck_assert_msg(memcmp(&one, &s[0], sizeof one) == 0, "clipping to V: %.9g vs %.9g", s[0], one);
    loom_cpu_ce_row_sumexp(s, x, m, R, W, 600, 600, 0, W);
    ck_assert_msg(s[0] == 0.0f, "all-padding slice sums to %g", s[0]);
    loom_cpu_ce_row_max(s, x, R, W, 600, 600);
    ck_assert_msg(s[0] == -INFINITY, "all-padding slice's max is %g", s[0]);
    free(x);
}
END_TEST

static void big(void *unused, float *o)
{
    int targets[PBT];
    big_targets(targets, PBT, PV);
    kt_fill(o + PBT, (size_t)PBT * PVP, 6, -8, 8);
    ce_sliced(o + PBT, o, targets, 0.5f, PBT, PV, PVP, 1);
}

static void big_split(void *unused, float *o)
{
    int targets[PBT];
    big_targets(targets, PBT, PV);
    kt_fill(o + PBT, (size_t)PBT * PVP, 6, -8, 8);
    ce_sliced(o + PBT, o, targets, 0.5f, PBT, PV, PVP, 2);
}

START_TEST(test_thread_independent)
{
    kt_assert_thread_independent("losses|dlogits", big, NULL, PBT + (size_t)PBT * PVP);
    kt_assert_thread_independent("losses|dlogits, 2 slices", big_split, NULL,
                                 PBT + (size_t)PBT * PVP);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("crossentropy");
    TCase *tc = tcase_create("crossentropy");
    tcase_add_test(tc, test_losses);
    tcase_add_test(tc, test_gradient);
    tcase_add_test(tc, test_huge_logits);
    tcase_add_test(tc, test_matches_fused);
    tcase_add_test(tc, test_vocab_split);
    tcase_add_test(tc, test_sumexp_in_order);
    tcase_add_test(tc, test_sumexp_shape_independent);
    tcase_add_test(tc, test_thread_independent);
    suite_add_tcase(s, tc);
    return kt_run(s);
}
