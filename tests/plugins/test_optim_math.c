/* test_optim_math.c — the built-in optimizers against hand-written double-precision
 * references of PyTorch's update rules, for three steps over a few values: AdamW
 * (decoupled decay, bias correction, eps), SGD plain / momentum / Nesterov (decay added to
 * the gradient). Each run has a decaying segment, a non-decaying one with gradients, and
 * a non-decaying one without (which must not move at all), and a grad_scale != 1. Also
 * the values create() refuses, with their exact messages. AdamW's freeze_variance = 2 (1-bit
 * Adam): step 3 leaves v bit for bit as step 2 left it and divides by step 2's bias
 * correction, against the same reference with v frozen.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin/optim.h"
#include "base/plugin_loader.h"
#include "plugin_test_util.h"
#include "base/status.h"

enum { NA = 5, NB = 3, NC = 2, STEPS = 3 };

/* Gradients per step for segments A (decays) and B (does not), before grad_scale. */
static const double grad_a[STEPS][NA] = {
    {0.5, -1.25, 2.0, 1e-3, 0.0},
    {-0.25, -1.0, 1.5, -2e-3, 0.75},
    {0.125, 0.5, -3.0, 1e-3, -0.5},
};
static const double grad_b[STEPS][NB] = {
    {1.0, -0.5, 0.25},
    {0.5, 0.5, -0.125},
    {-1.0, 0.25, 0.0625},
};
static const double p0_a[NA] = {0.5, -1.0, 2.0, 3e-3, -0.25};
static const double p0_b[NB] = {0.1, -0.2, 0.0};
static const double p0_c[NC] = {1.5, -2.5};
static const double GRAD_SCALE = 0.5, WD = 0.1;

static const loom_optim_ops *load_optim(const char *name, const loom_plugin_desc **desc)
{
    const char *path = test_build_plugin_path("optim", name);
    ck_assert_msg(path != NULL, "loom-optim-%s.so not built", name);
    const loom_plugin *p = NULL;
    ck_assert_msg(loom_plugin_open(path, &p) == LOOM_OK, "%s", loom_last_error());
    if (desc)
        *desc = p->desc;
    return p->desc->ops;
}

static void *create(const char *name, const char *const *overrides, loom_status want)
{
    const loom_plugin_desc *d;
    const loom_optim_ops *o = load_optim(name, &d);
    tcfg t;
    ck_assert_msg(tcfg_build(&t, d, overrides, 0), "%s", t.err);
    void *self = NULL;
    loom_status st = o->create(loom_core_host(), &t.cfg, &self);
    ck_assert_msg(st == want, "%s create: %s (%s)", name, loom_status_name(st), loom_last_error());
    return self;
}

static void assert_close(double got, double want, const char *what, int i, int step)
{
    ck_assert_msg(fabs(got - want) <= 1e-6 + 2e-6 * fabs(want),
                  "%s[%d] after step %d: got %.9g, want %.9g", what, i, step, got, want);
}

/* Three segments in float, laid out as the core would hand them over. */
typedef struct run {
    float pa[NA], pb[NB], pc[NC];
    float ga[NA], gb[NB], gc[NC];
    float sa[2 * NA], sb[2 * NB], sc[2 * NC]; /* up to 2 slots */
    loom_optim_segment seg[3];
} run;

static void run_init(run *r, int slots)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; i < NA; i++) r->pa[i] = (float)p0_a[i];
    for (int i = 0; i < NB; i++) r->pb[i] = (float)p0_b[i];
    for (int i = 0; i < NC; i++) r->pc[i] = (float)p0_c[i];
    r->seg[0] = (loom_optim_segment){r->pa, r->ga, slots ? r->sa : NULL, NA, (float)WD};
    r->seg[1] = (loom_optim_segment){r->pb, r->gb, slots ? r->sb : NULL, NB, 0};
    r->seg[2] = (loom_optim_segment){r->pc, r->gc, slots ? r->sc : NULL, NC, 0};
}

static void run_step(run *r, const loom_optim_ops *o, void *self, int t, float lr)
{
    for (int i = 0; i < NA; i++) r->ga[i] = (float)grad_a[t - 1][i];
    for (int i = 0; i < NB; i++) r->gb[i] = (float)grad_b[t - 1][i];
    loom_optim_step_args args = {r->seg, 3, lr, t, (float)GRAD_SCALE};
    ck_assert_msg(o->step(self, &args) == LOOM_OK, "%s", loom_last_error());
}

/* ---- AdamW ----------------------------------------------------------------------- */

/* torch.optim.AdamW's documented algorithm, in double. */
static void adamw_ref(double *p, double *m, double *v, const double *g, int n, double lr,
                      double b1, double b2, double eps, double wd, int t)
{
    for (int i = 0; i < n; i++) {
        double gi = GRAD_SCALE * g[i];
        p[i] *= 1 - lr * wd;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double mhat = m[i] / (1 - pow(b1, t)), vhat = v[i] / (1 - pow(b2, t));
        p[i] -= lr * mhat / (sqrt(vhat) + eps);
    }
}

START_TEST(adamw_matches_reference)
{
    const double lr = 0.05, b1 = 0.9, b2 = 0.95, eps = 1e-3; /* eps large enough to matter */
    const loom_optim_ops *o = load_optim("adamw", NULL);
    void *self = create("adamw", (const char *const[]){"lr=0.05", "betas={0.9, 0.95}",
                                                       "eps=1e-3", "weight_decay=0.1", NULL},
                        LOOM_OK);
    ck_assert_uint_eq(o->state_per_param(self), 2);
    run r;
    run_init(&r, 2);
    double pa[NA], pb[NB], ma[NA] = {0}, va[NA] = {0}, mb[NB] = {0}, vb[NB] = {0};
    memcpy(pa, p0_a, sizeof pa);
    memcpy(pb, p0_b, sizeof pb);
    for (int t = 1; t <= STEPS; t++) {
        run_step(&r, o, self, t, (float)lr);
        adamw_ref(pa, ma, va, grad_a[t - 1], NA, lr, b1, b2, eps, WD, t);
        adamw_ref(pb, mb, vb, grad_b[t - 1], NB, lr, b1, b2, eps, 0, t);
        for (int i = 0; i < NA; i++) {
            assert_close(r.pa[i], pa[i], "A.p", i, t);
            assert_close(r.sa[i], ma[i], "A.m (slot 0)", i, t);
            assert_close(r.sa[NA + i], va[i], "A.v (slot 1)", i, t);
        }
        for (int i = 0; i < NB; i++) {
            assert_close(r.pb[i], pb[i], "B.p", i, t);
            assert_close(r.sb[i], mb[i], "B.m (slot 0)", i, t);
            assert_close(r.sb[NB + i], vb[i], "B.v (slot 1)", i, t);
        }
        for (int i = 0; i < NC; i++) /* no gradient, no decay: bit-for-bit unchanged */
            ck_assert(r.pc[i] == (float)p0_c[i]);
    }
    o->destroy(self);
}
END_TEST

/* adamw_ref with v frozen after step `freeze`: v and its bias correction stay at step freeze's */
static void adamw_ref_frozen(double *p, double *m, const double *v, const double *g, int n,
                             double lr, double b1, double b2, double eps, int t, int freeze)
{
    for (int i = 0; i < n; i++) {
        double gi = GRAD_SCALE * g[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        double mhat = m[i] / (1 - pow(b1, t)), vhat = v[i] / (1 - pow(b2, freeze));
        p[i] -= lr * mhat / (sqrt(vhat) + eps);
    }
}

START_TEST(adamw_frozen_variance)
{
    const double lr = 0.05, b1 = 0.9, b2 = 0.95, eps = 1e-3;
    const loom_optim_ops *o = load_optim("adamw", NULL);
    void *self = create("adamw", (const char *const[]){"lr=0.05", "betas={0.9, 0.95}",
                                                       "eps=1e-3", "weight_decay=0",
                                                       "freeze_variance=2", NULL}, LOOM_OK);
    run r;
    run_init(&r, 2);
    double pb[NB], mb[NB] = {0}, vb[NB] = {0};
    memcpy(pb, p0_b, sizeof pb);
    float v_at_2[NB];
    for (int t = 1; t <= STEPS; t++) {
        run_step(&r, o, self, t, (float)lr);
        if (t <= 2)
            adamw_ref(pb, mb, vb, grad_b[t - 1], NB, lr, b1, b2, eps, 0, t);
        else
            adamw_ref_frozen(pb, mb, vb, grad_b[t - 1], NB, lr, b1, b2, eps, t, 2);
        for (int i = 0; i < NB; i++) {
            assert_close(r.pb[i], pb[i], "B.p", i, t);
            assert_close(r.sb[i], mb[i], "B.m (slot 0)", i, t);
            if (t == 2)
                v_at_2[i] = r.sb[NB + i];
            if (t == 3)
                ck_assert_msg(memcmp(&r.sb[NB + i], &v_at_2[i], sizeof(float)) == 0,
                              "B.v[%d] moved after the freeze: %a, step 2 left %a", i,
                              r.sb[NB + i], v_at_2[i]);
        }
    }
    o->destroy(self);
}
END_TEST

START_TEST(adamw_decay_rule_and_defaults)
{
    const loom_optim_ops *o = load_optim("adamw", NULL);
    void *self = create("adamw", (const char *const[]){"lr=1e-3", NULL}, LOOM_OK);
    float wd;
    int all;
    o->decay_rule(self, &wd, &all);
    ck_assert_float_eq(wd, 0.01f);
    ck_assert_int_eq(all, 0);
    o->destroy(self);
    self = create("adamw", (const char *const[]){"lr=1e-3", "decay=\"all\"", "weight_decay=0.1",
                                                 NULL}, LOOM_OK);
    o->decay_rule(self, &wd, &all);
    ck_assert_float_eq(wd, 0.1f);
    ck_assert_int_eq(all, 1);
    loom_optim_step_args bad = {NULL, 0, 1e-3f, 0, 1};
    ck_assert_int_eq(o->step(self, &bad), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(), "adamw: step count must be >= 1 (1-based), got 0");
    o->destroy(self);
}
END_TEST

static void expect_refused(const char *name, const char *const *overrides, const char *msg)
{
    loom_clear_error();
    create(name, overrides, LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(), msg);
}

START_TEST(adamw_refuses_bad_values)
{
    expect_refused("adamw", (const char *const[]){"lr=0", NULL},
                   "adamw: lr must be a finite number > 0, got 0");
    expect_refused("adamw", (const char *const[]){"lr=1e-3", "betas={0.9, 0.99, 0.5}", NULL},
                   "adamw: betas must be two numbers {b1, b2}, got 3 numbers");
    expect_refused("adamw", (const char *const[]){"lr=1e-3", "betas={0.9, 1}", NULL},
                   "adamw: betas must each be in [0, 1), got {0.9, 1}");
    expect_refused("adamw", (const char *const[]){"lr=1e-3", "eps=0", NULL},
                   "adamw: eps must be a finite number > 0, got 0");
    expect_refused("adamw", (const char *const[]){"lr=1e-3", "weight_decay=-0.1", NULL},
                   "adamw: weight_decay must be a finite number >= 0, got -0.1");
    expect_refused("adamw", (const char *const[]){"lr=1e-3", "decay=\"biases\"", NULL},
                   "adamw: decay must be \"matrices\" or \"all\", got \"biases\"");
    expect_refused("adamw", (const char *const[]){"lr=1e-3", "freeze_variance=1.5", NULL},
                   "adamw: freeze_variance must be a whole number of steps >= 0 (0: never), got 1.5");
}
END_TEST

/* ---- SGD ------------------------------------------------------------------------- */

/* torch.optim.SGD's documented algorithm (dampening 0), in double. */
static void sgd_ref(double *p, double *b, const double *g, int n, double lr, double mu,
                    int nesterov, double wd)
{
    for (int i = 0; i < n; i++) {
        double gi = GRAD_SCALE * g[i] + wd * p[i];
        double d = gi;
        if (mu > 0) {
            b[i] = mu * b[i] + gi;
            d = nesterov ? gi + mu * b[i] : b[i];
        }
        p[i] -= lr * d;
    }
}

static void sgd_case(double mu, int nesterov)
{
    const double lr = 0.1;
    char mu_kv[64];
    snprintf(mu_kv, sizeof mu_kv, "momentum=%g", mu);
    const loom_optim_ops *o = load_optim("sgd", NULL);
    void *self = create("sgd", (const char *const[]){"lr=0.1", mu_kv, "weight_decay=0.1",
                                                     nesterov ? "nesterov=true" : NULL, NULL},
                        LOOM_OK);
    ck_assert_uint_eq(o->state_per_param(self), mu > 0 ? 1 : 0);
    run r;
    run_init(&r, mu > 0);
    double pa[NA], pb[NB], ba[NA] = {0}, bb[NB] = {0};
    memcpy(pa, p0_a, sizeof pa);
    memcpy(pb, p0_b, sizeof pb);
    for (int t = 1; t <= STEPS; t++) {
        run_step(&r, o, self, t, (float)lr);
        sgd_ref(pa, ba, grad_a[t - 1], NA, lr, mu, nesterov, WD);
        sgd_ref(pb, bb, grad_b[t - 1], NB, lr, mu, nesterov, 0);
        for (int i = 0; i < NA; i++) {
            assert_close(r.pa[i], pa[i], "A.p", i, t);
            if (mu > 0)
                assert_close(r.sa[i], ba[i], "A.buf", i, t);
        }
        for (int i = 0; i < NB; i++)
            assert_close(r.pb[i], pb[i], "B.p", i, t);
        for (int i = 0; i < NC; i++)
            ck_assert(r.pc[i] == (float)p0_c[i]);
    }
    o->destroy(self);
}

START_TEST(sgd_plain_matches_reference) { sgd_case(0, 0); }
END_TEST

START_TEST(sgd_momentum_matches_reference) { sgd_case(0.9, 0); }
END_TEST

START_TEST(sgd_nesterov_matches_reference) { sgd_case(0.9, 1); }
END_TEST

START_TEST(sgd_refuses_bad_values)
{
    expect_refused("sgd", (const char *const[]){"lr=-1", NULL},
                   "sgd: lr must be a finite number > 0, got -1");
    expect_refused("sgd", (const char *const[]){"lr=0.1", "momentum=1", NULL},
                   "sgd: momentum must be in [0, 1), got 1");
    expect_refused("sgd", (const char *const[]){"lr=0.1", "nesterov=true", NULL},
                   "sgd: nesterov = true needs momentum > 0, got momentum = 0");
    expect_refused("sgd", (const char *const[]){"lr=0.1", "decay=\"none\"", NULL},
                   "sgd: decay must be \"matrices\" or \"all\", got \"none\"");
    expect_refused("sgd", (const char *const[]){"lr=0.1", "weight_decay=-1", NULL},
                   "sgd: weight_decay must be a finite number >= 0, got -1");
}
END_TEST

START_TEST(sgd_decay_rule)
{
    const loom_optim_ops *o = load_optim("sgd", NULL);
    void *self = create("sgd", (const char *const[]){"lr=0.1", "weight_decay=5e-4",
                                                     "decay=\"all\"", NULL}, LOOM_OK);
    float wd;
    int all;
    o->decay_rule(self, &wd, &all);
    ck_assert_float_eq(wd, 5e-4f);
    ck_assert_int_eq(all, 1);
    o->destroy(self);
}
END_TEST

static Suite *math_suite(void)
{
    Suite *s = suite_create("optim_math");
    TCase *tc = tcase_create("adamw");
    tcase_add_test(tc, adamw_matches_reference);
    tcase_add_test(tc, adamw_frozen_variance);
    tcase_add_test(tc, adamw_decay_rule_and_defaults);
    tcase_add_test(tc, adamw_refuses_bad_values);
    suite_add_tcase(s, tc);
    tc = tcase_create("sgd");
    tcase_add_test(tc, sgd_plain_matches_reference);
    tcase_add_test(tc, sgd_momentum_matches_reference);
    tcase_add_test(tc, sgd_nesterov_matches_reference);
    tcase_add_test(tc, sgd_refuses_bad_values);
    tcase_add_test(tc, sgd_decay_rule);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    unsetenv("LOOM_PLUGIN_PATH");
    SRunner *sr = srunner_create(math_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
