/* test_loss_scaler.c — loom-precision-fp16's dynamic loss scale (plugins/precision/fp16):
 * growth after growth_interval good steps, back-off on overflow (after `hysteresis`
 * overflows since the last growth), the floor at min_scale and the stop reason when an
 * overflow comes there, every overflow skipped, the 4-float state restoring the exact
 * trajectory, and bad keys refused with what would work; bf16 and fp32 keep a scale of 1.
 */
#include <check.h>
#include <math.h>
#include <string.h>

#include "loom/plugin/precision.h"
#include "plugin_test_util.h"
#include "base/plugin_loader.h"
#include "base/status.h"

static const loom_precision_ops *load(const char *name, const loom_plugin_desc **desc)
{
    const char *path = test_build_plugin_path("precision", name);
    ck_assert_msg(path != NULL, "loom-precision-%s.so not built", name);
    const loom_plugin *p = NULL;
    ck_assert_msg(loom_plugin_open(path, &p) == LOOM_OK, "%s", loom_last_error());
    *desc = p->desc;
    return p->desc->ops;
}

static void *create(const char *name, const char *const *overrides, loom_status want)
{
    const loom_plugin_desc *d;
    const loom_precision_ops *o = load(name, &d);
    tcfg t;
    ck_assert_msg(tcfg_build(&t, d, overrides, 0), "%s", t.err);
    void *self = NULL;
    loom_status st = o->create(loom_core_host(), &t.cfg, &self);
    ck_assert_msg(st == want, "%s create: %s (%s)", name, loom_status_name(st), loom_last_error());
    return self;
}

START_TEST(scale_follows_the_rules)
{
    const loom_plugin_desc *d;
    const loom_precision_ops *o = load("fp16", &d);
    const char *const keys[] = {"initial_scale=1024", "growth_interval=3", "hysteresis=2",
                                "min_scale=256", "growth_factor=2", "backoff_factor=0.5", NULL};
    void *f = create("fp16", keys, LOOM_OK);
    /* (found_nonfinite, skipped, scale after) */
    static const int seq[][3] = {
        {0, 0, 1024}, {0, 0, 1024}, {0, 0, 2048},  /* 3 good: grow */
        {1, 1, 2048},                              /* hysteresis 2: first overflow keeps it */
        {0, 0, 2048}, {1, 1, 1024},                /* second since growth: back off */
        {1, 1, 512},                               /* spent: every one backs off now */
        {0, 0, 512}, {0, 0, 512}, {0, 0, 1024},    /* grow, budget refilled */
        {1, 1, 1024}, {1, 1, 512}, {1, 1, 256},    /* down to the floor */
    };
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        int skip = o->update(f, seq[i][0]);
        ck_assert_msg(skip == seq[i][1], "step %zu: skip %d, want %d", i + 1, skip, seq[i][1]);
        ck_assert_msg(o->loss_scale(f) == (float)seq[i][2], "step %zu: scale %g, want %d", i + 1,
                      (double)o->loss_scale(f), seq[i][2]);
        ck_assert(o->stop_reason(f) == NULL);
    }
    /* the state now, into a fresh instance: the same future */
    float st[4];
    int n = 0;
    o->get_state(f, st, &n);
    ck_assert_int_eq(n, 4);
    void *g = create("fp16", keys, LOOM_OK);
    o->set_state(g, st, n);
    for (int i = 0; i < 4; i++) {
        int a = o->update(f, i == 3), b = o->update(g, i == 3);
        ck_assert(a == b && o->loss_scale(f) == o->loss_scale(g));
    }
    /* 3 good (grown to 512, budget refilled), an overflow the hysteresis absorbs; the next
     * backs off to the floor, and one more there stops the run */
    ck_assert_msg(o->loss_scale(f) == 512.0f, "scale %g", (double)o->loss_scale(f));
    ck_assert_int_eq(o->update(f, 1), 1);
    ck_assert_msg(o->loss_scale(f) == 256.0f, "scale %g", (double)o->loss_scale(f));
    ck_assert(o->stop_reason(f) == NULL);
    ck_assert_int_eq(o->update(f, 1), 1); /* an overflow at the floor: stop */
    const char *why = o->stop_reason(f);
    ck_assert_msg(why && strstr(why, "min_scale = 256") && strstr(why, "bf16"), "%s",
                  why ? why : "(none)");
    ck_assert(o->loss_scale(f) == 256.0f);
    ck_assert_int_eq(o->update(f, 0), 0); /* a good step clears it */
    ck_assert(o->stop_reason(f) == NULL);
    o->destroy(f);
    o->destroy(g);
}
END_TEST

START_TEST(defaults_and_other_plugins)
{
    void *f = create("fp16", NULL, LOOM_OK);
    const loom_plugin_desc *d;
    const loom_precision_ops *o = load("fp16", &d);
    ck_assert(o->loss_scale(f) == 65536.0f);
    ck_assert_int_eq(o->update(f, 1), 1);
    ck_assert(o->loss_scale(f) == 32768.0f); /* hysteresis 1: the first overflow backs off */
    loom_precision_dtypes dt;
    o->dtypes(f, &dt);
    ck_assert(dt.param == LOOM_DTYPE_F16 && dt.compute == LOOM_DTYPE_F16 &&
              dt.grad == LOOM_DTYPE_F32 && dt.master_weights == 1);
    o->destroy(f);
    const loom_precision_ops *b = load("bf16", &d);
    void *s = create("bf16", NULL, LOOM_OK);
    b->dtypes(s, &dt);
    ck_assert(dt.param == LOOM_DTYPE_BF16 && dt.compute == LOOM_DTYPE_BF16 &&
              dt.grad == LOOM_DTYPE_F32 && dt.master_weights == 1);
    ck_assert(b->loss_scale(s) == 1.0f && b->update(s, 1) == 1 && b->loss_scale(s) == 1.0f);
    ck_assert(b->update(s, 0) == 0);
    b->destroy(s);
}
END_TEST

START_TEST(bad_keys_refused)
{
    static const struct {
        const char *key, *says;
    } bad[] = {
        {"min_scale=0", "min_scale must be a finite number > 0"},
        {"initial_scale=0.5", "initial_scale must be finite and >= min_scale"},
        {"growth_factor=1", "growth_factor must be > 1"},
        {"backoff_factor=1", "backoff_factor must be in (0, 1)"},
        {"growth_interval=0", "growth_interval must be in [1, 2^24)"},
        {"hysteresis=0", "hysteresis must be in [1, 2^24)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *const k[] = {bad[i].key, NULL};
        create("fp16", k, LOOM_ERR_INVALID);
        ck_assert_msg(strstr(loom_last_error(), bad[i].says), "%s: %s", bad[i].key,
                      loom_last_error());
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("loss_scaler");
    TCase *tc = tcase_create("fp16");
    tcase_add_test(tc, scale_follows_the_rules);
    tcase_add_test(tc, defaults_and_other_plugins);
    tcase_add_test(tc, bad_keys_refused);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
