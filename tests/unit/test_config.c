/* test_config.c — plugin config resolution: defaults parsed, unknown keys and wrong types
 * refused with messages that list what is accepted, required keys enforced. */
#include <check.h>
#include <string.h>

#include "base/config.h"

static const loom_config_key keys[] = {
    {"lr", LOOM_CFG_NUMBER, NULL, "learning rate"},
    {"betas", LOOM_CFG_NUMBERS, "{0.9, 0.999}", "moment decays"},
    {"steps", LOOM_CFG_INTEGER, "10", "an integer"},
    {"nesterov", LOOM_CFG_BOOLEAN, "false", "a flag"},
    {"decay", LOOM_CFG_STRING, "\"matrices\"", "which params decay"},
};
static const loom_plugin_desc desc = {LOOM_PLUGIN_ABI, sizeof(loom_plugin_desc), LOOM_KIND_OPTIM,
                                      "demo", "1", "test", keys, 5, NULL, NULL};

START_TEST(test_defaults)
{
    loom_plugin_config c;
    ck_assert_int_eq(loom_config_init(&c, &desc), LOOM_OK);
    ck_assert_int_eq(c.values[1].n_numbers, 2);
    ck_assert_double_eq(c.values[1].numbers[1], 0.999);
    ck_assert_double_eq(c.values[2].number, 10);
    ck_assert_double_eq(c.values[3].number, 0);
    ck_assert_str_eq(c.values[4].string, "matrices");
    /* lr is required */
    ck_assert_int_eq(loom_config_finish(&c), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(), "optim 'demo' needs key 'lr' (number: learning rate)");
    ck_assert_int_eq(loom_config_set_number(&c, "lr", 0.5), LOOM_OK);
    ck_assert_int_eq(loom_config_finish(&c), LOOM_OK);
    ck_assert_double_eq(loom_config_get(&c, "lr")->number, 0.5);
}
END_TEST

START_TEST(test_refusals)
{
    loom_plugin_config c;
    ck_assert_int_eq(loom_config_init(&c, &desc), LOOM_OK);
    ck_assert_int_eq(loom_config_set_number(&c, "lrr", 1), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(),
                     "optim 'demo' has no key 'lrr' (accepted: lr, betas, steps, nesterov, decay)");
    ck_assert_int_eq(loom_config_set_number(&c, "steps", 1.5), LOOM_ERR_INVALID);
    ck_assert_str_eq(loom_last_error(), "optim 'demo' key 'steps' must be a integer, got 1.5");
    ck_assert_int_eq(loom_config_set_string(&c, "lr", "fast"), LOOM_ERR_INVALID);
    ck_assert_int_eq(loom_config_set_boolean(&c, "decay", 1), LOOM_ERR_INVALID);
    double many[9] = {0};
    ck_assert_int_eq(loom_config_set_numbers(&c, "betas", many, 9), LOOM_ERR_INVALID);
    /* a single number is accepted where a list is expected */
    ck_assert_int_eq(loom_config_set_number(&c, "betas", 0.5), LOOM_OK);
    ck_assert_int_eq(c.values[1].n_numbers, 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_refusals);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
