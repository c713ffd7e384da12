/* test_plugin_contract.c — the contract every built plugin keeps, run against every
 * loom-*.so in the build tree's plugin dirs (so a new plugin is covered the day it is
 * built): descriptor fields, config key table, and per kind (optim, precision) the ops
 * table's members, create/destroy behaviour and basic sanity of the answers.
 *
 * The plugin lists are built in main() before the runner forks, and each case is a loop
 * test over them, so a failure names the plugin.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin/optim.h"
#include "loom/plugin/precision.h"
#include "base/plugin_loader.h"
#include "plugin_test_util.h"
#include "base/status.h"

enum { MAX_PLUGINS = 64 };
static const loom_plugin *all[MAX_PLUGINS], *optims[MAX_PLUGINS], *precisions[MAX_PLUGINS];
static int n_all, n_optim, n_precision;
static char refused[4096]; /* built plugins the loader rejected: a contract failure */

static void take(const char *path, void *ctx)
{
    (void)ctx;
    const loom_plugin *p = NULL;
    if (loom_plugin_open(path, &p) != LOOM_OK) {
        size_t used = strlen(refused);
        snprintf(refused + used, sizeof refused - used, "%s\n", loom_last_error());
        return;
    }
    if (n_all < MAX_PLUGINS)
        all[n_all++] = p;
    if (p->desc->kind == LOOM_KIND_OPTIM && n_optim < MAX_PLUGINS)
        optims[n_optim++] = p;
    if (p->desc->kind == LOOM_KIND_PRECISION && n_precision < MAX_PLUGINS)
        precisions[n_precision++] = p;
}

static void collect(void)
{
    test_each_built_plugin("loom-", take, NULL);
}

static int has(const loom_plugin *const *list, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(list[i]->desc->name, name) == 0)
            return 1;
    return 0;
}

/* ---- every plugin ---------------------------------------------------------------- */

START_TEST(every_built_plugin_loads)
{
    ck_assert_msg(refused[0] == '\0', "built plugins refused by the loader:\n%s", refused);
    ck_assert(has(optims, n_optim, "sgd"));
    ck_assert(has(optims, n_optim, "adamw"));
    ck_assert(has(precisions, n_precision, "fp32"));
    ck_assert(has(precisions, n_precision, "bf16"));
    ck_assert(has(precisions, n_precision, "fp16"));
}
END_TEST

START_TEST(descriptor_is_sane)
{
    const loom_plugin_desc *d = all[_i]->desc;
    const char *path = all[_i]->path;
    ck_assert_uint_eq(d->abi, LOOM_PLUGIN_ABI);
    ck_assert_uint_eq(d->size, sizeof(loom_plugin_desc)); /* built with these headers */
    ck_assert_ptr_nonnull(loom_kind_name(d->kind));
    ck_assert_msg(d->name && d->name[0], "%s: empty name", path);
    ck_assert_msg(d->version && d->version[0], "%s: empty version", path);
    ck_assert_msg(d->summary && d->summary[0], "%s: empty summary", path);
    ck_assert_msg(strchr(d->summary, '\n') == NULL, "%s: summary must be one line", path);
    ck_assert_msg(strlen(d->summary) <= 100, "%s: summary longer than 100 characters", path);
    ck_assert_msg(strspn(d->name, "abcdefghijklmnopqrstuvwxyz0123456789_") == strlen(d->name),
                  "%s: name '%s' should be lower-case letters, digits, '_'", path, d->name);
    ck_assert_ptr_nonnull(d->ops);
    if (d->probe != NULL) {
        char reason[256] = "";
        int ok = d->probe(reason, sizeof reason);
        ck_assert_msg(ok == 0 || ok == 1, "%s: probe returned %d", path, ok);
        ck_assert_msg(ok == 1 || reason[0] != '\0', "%s: probe said no without a reason", path);
    }
}
END_TEST

START_TEST(config_keys_are_well_formed)
{
    const loom_plugin_desc *d = all[_i]->desc;
    for (uint32_t i = 0; i < d->n_config_keys; i++) {
        const loom_config_key *k = &d->config_keys[i];
        ck_assert_msg(k->name && k->name[0], "%s: key %u has no name", d->name, i);
        ck_assert_msg(k->help && k->help[0], "%s: key '%s' has no help", d->name, k->name);
        ck_assert_msg(k->type >= LOOM_CFG_NUMBER && k->type <= LOOM_CFG_NUMBERS,
                      "%s: key '%s' has type %d", d->name, k->name, (int)k->type);
        for (uint32_t j = 0; j < i; j++)
            ck_assert_msg(strcmp(d->config_keys[j].name, k->name) != 0,
                          "%s: key '%s' declared twice", d->name, k->name);
        if (k->default_value != NULL) { /* NULL: required */
            loom_config_value v = {.name = k->name, .type = k->type};
            char buf[TCFG_STR];
            ck_assert_msg(tcfg_parse_value(k->default_value, &v, buf, sizeof buf),
                          "%s: default '%s' of key '%s' does not read as its type",
                          d->name, k->default_value, k->name);
        }
    }
}
END_TEST

/* ---- optim ----------------------------------------------------------------------- */

static const loom_optim_ops *optim_ops(int i)
{
    return (const loom_optim_ops *)optims[i]->desc->ops;
}

START_TEST(optim_ops_complete)
{
    const loom_optim_ops *o = optim_ops(_i);
    ck_assert_uint_ge(o->size, sizeof(loom_optim_ops));
    ck_assert(o->create && o->destroy && o->state_per_param && o->decay_rule && o->step);
    o->destroy(NULL); /* must be a no-op */
}
END_TEST

START_TEST(optim_create_destroy_and_step)
{
    const loom_plugin_desc *d = optims[_i]->desc;
    const loom_optim_ops *o = optim_ops(_i);
    tcfg t;
    ck_assert_msg(tcfg_build(&t, d, NULL, 1), "%s: %s", d->name, t.err);
    void *self = NULL;
    ck_assert_msg(o->create(loom_core_host(), &t.cfg, &self) == LOOM_OK, "%s: %s", d->name,
                  loom_last_error());
    ck_assert_ptr_nonnull(self);
    uint32_t slots = o->state_per_param(self);
    ck_assert_uint_le(slots, 8);
    float wd = -1;
    int all_ = -1;
    o->decay_rule(self, &wd, &all_);
    ck_assert(wd >= 0 && (all_ == 0 || all_ == 1));

    /* Zero segments is a valid step; a small one stays finite and moves toward -grad. */
    loom_optim_step_args args = {.segments = NULL, .n_segments = 0, .lr = 1e-3f, .step = 1,
                                 .grad_scale = 1};
    ck_assert_int_eq(o->step(self, &args), LOOM_OK);
    float p[4] = {1, -1, 0.5f, 0}, g[4] = {0.5f, -0.5f, 1, 0}, st[4 * 8] = {0};
    loom_optim_segment seg = {p, g, st, 4, 0};
    args.segments = &seg;
    args.n_segments = 1;
    ck_assert_int_eq(o->step(self, &args), LOOM_OK);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(isfinite(p[i]), "%s: p[%d] = %g", d->name, i, p[i]);
    ck_assert(p[0] < 1 && p[1] > -1 && p[2] < 0.5f);
    o->destroy(self);
}
END_TEST

START_TEST(optim_create_failure_leaves_self)
{
    const loom_plugin_desc *d = optims[_i]->desc;
    if (d->n_config_keys == 0)
        return; /* nothing a config could get wrong */
    const loom_optim_ops *o = optim_ops(_i);
    loom_clear_error();
    loom_config empty = {0, NULL};
    void *self = (void *)0x1;
    ck_assert_int_ne(o->create(loom_core_host(), &empty, &self), LOOM_OK);
    ck_assert_ptr_eq(self, (void *)0x1);
    ck_assert_msg(loom_last_error()[0] != '\0', "%s: failed without a message", d->name);
}
END_TEST

/* ---- precision ------------------------------------------------------------------- */

static const loom_precision_ops *prec_ops(int i)
{
    return (const loom_precision_ops *)precisions[i]->desc->ops;
}

START_TEST(precision_ops_complete)
{
    const loom_precision_ops *o = prec_ops(_i);
    ck_assert_uint_ge(o->size, sizeof(loom_precision_ops));
    ck_assert(o->create && o->destroy && o->dtypes && o->loss_scale && o->update &&
              o->get_state && o->set_state);
    o->destroy(NULL);
}
END_TEST

START_TEST(precision_answers_are_sane)
{
    const loom_plugin_desc *d = precisions[_i]->desc;
    const loom_precision_ops *o = prec_ops(_i);
    tcfg t;
    ck_assert_msg(tcfg_build(&t, d, NULL, 1), "%s: %s", d->name, t.err);
    void *self = NULL;
    ck_assert_msg(o->create(loom_core_host(), &t.cfg, &self) == LOOM_OK, "%s: %s", d->name,
                  loom_last_error());
    loom_precision_dtypes dt;
    memset(&dt, 0xff, sizeof dt);
    o->dtypes(self, &dt);
    ck_assert(loom_dtype_size(dt.param) > 0 && loom_dtype_size(dt.compute) > 0 &&
              loom_dtype_size(dt.grad) > 0);
    ck_assert(dt.master_weights == 0 || dt.master_weights == 1);
    float scale = o->loss_scale(self);
    ck_assert(isfinite(scale) && scale > 0);
    ck_assert_int_eq(o->update(self, 1), 1); /* a non-finite step is always skipped */
    float state[4] = {0};
    int n = -1;
    o->get_state(self, state, &n);
    ck_assert(n >= 0 && n <= 4);
    o->set_state(self, state, n);
    ck_assert(o->loss_scale(self) > 0);
    o->destroy(self);
}
END_TEST

static Suite *contract_suite(void)
{
    Suite *s = suite_create("plugin_contract");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, every_built_plugin_loads);
    tcase_add_loop_test(tc, descriptor_is_sane, 0, n_all);
    tcase_add_loop_test(tc, config_keys_are_well_formed, 0, n_all);
    suite_add_tcase(s, tc);

    tc = tcase_create("optim");
    tcase_add_loop_test(tc, optim_ops_complete, 0, n_optim);
    tcase_add_loop_test(tc, optim_create_destroy_and_step, 0, n_optim);
    tcase_add_loop_test(tc, optim_create_failure_leaves_self, 0, n_optim);
    suite_add_tcase(s, tc);

    tc = tcase_create("precision");
    tcase_add_loop_test(tc, precision_ops_complete, 0, n_precision);
    tcase_add_loop_test(tc, precision_answers_are_sane, 0, n_precision);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    unsetenv("LOOM_PLUGIN_PATH");
    collect();
    printf("contract: %d plugins (%d optim, %d precision)\n", n_all, n_optim, n_precision);
    SRunner *sr = srunner_create(contract_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
