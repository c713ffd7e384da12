/* test_sched_contract.c — the contract every built sched plugin keeps (the kinds'
 * contract suite, test_plugin_contract.c, covers the descriptor; this covers the ops), run
 * against every loom-sched-*.so in the build tree's plugin dirs, so a new schedule is
 * checked the day it is built:
 *  - ops->size covers build; build is set; check, when present, answers 0 or 1, with a
 *    reason when 0, and refuses nonsense shapes (stages 0, stage out of range);
 *  - for every shape check() accepts (p in 1..5, m in 1..9, v in 1..3), build() succeeds,
 *    fits LOOM_SCHED_CAP, is pure (same list twice; a NULL buffer only counts), and all
 *    stages' lists together pass the validator and simulate without deadlock;
 *  - for a shape check() refuses, build() refuses too.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/plugin_loader.h"
#include "base/status.h"
#include "plugin_test_util.h"
#include "train/schedule.h"

enum { MAX_PLUGINS = 16 };
static const loom_plugin *scheds[MAX_PLUGINS];
static int n_sched;

static void take(const char *path, void *ctx)
{
    (void)ctx;
    const loom_plugin *p = NULL;
    if (loom_plugin_open(path, &p) == LOOM_OK && n_sched < MAX_PLUGINS)
        scheds[n_sched++] = p;
}

static void collect(void)
{
    test_each_built_plugin("loom-sched-", take, NULL);
}

static const loom_sched_ops *ops_of(int i) { return scheds[i]->desc->ops; }
static int has_check(const loom_sched_ops *o)
{
    return o->size >= offsetof(loom_sched_ops, check) + sizeof o->check && o->check != NULL;
}

START_TEST(the_built_in_schedules_are_here)
{
    const char *want[] = {"gpipe", "1f1b", "interleaved", "zb1"};
    for (int w = 0; w < 4; w++) {
        int found = 0;
        for (int i = 0; i < n_sched; i++)
            found |= strcmp(scheds[i]->desc->name, want[w]) == 0;
        ck_assert_msg(found, "no loom-sched-%s.so in the build tree", want[w]);
    }
}
END_TEST

START_TEST(ops_are_complete_and_refuse_nonsense)
{
    const loom_sched_ops *o = ops_of(_i);
    const char *name = scheds[_i]->desc->name;
    ck_assert_msg(o->size >= offsetof(loom_sched_ops, build) + sizeof o->build && o->build,
                  "%s: no build()", name);
    const loom_sched_shape bad[] = {{0, 0, 4, 1}, {2, 2, 4, 1}, {2, -1, 4, 1}, {2, 0, 0, 1},
                                    {2, 0, 4, 0}};
    for (int k = 0; k < 5; k++) {
        size_t n = 0;
        loom_sched_instr buf[64];
        ck_assert_msg(o->build(&bad[k], buf, 64, &n) == LOOM_ERR_INVALID,
                      "%s: build accepted nonsense shape %d", name, k);
        if (has_check(o)) {
            char why[256] = "";
            ck_assert_msg(o->check(&bad[k], why, sizeof why) == 0 && why[0],
                          "%s: check accepted nonsense shape %d, or gave no reason", name, k);
        }
    }
}
END_TEST

START_TEST(every_accepted_shape_builds_a_valid_pure_schedule)
{
    const loom_sched_ops *o = ops_of(_i);
    const char *name = scheds[_i]->desc->name;
    int served = 0;
    for (int p = 1; p <= 5; p++)
        for (int m = 1; m <= 9; m++)
            for (int v = 1; v <= 3; v++) {
                loom_sched_shape sh0 = {p, 0, m, v};
                char why[512] = "";
                int ok = has_check(o) ? o->check(&sh0, why, sizeof why) : 1;
                ck_assert_msg(ok == 0 || ok == 1, "%s: check returned %d", name, ok);
                if (!ok) {
                    ck_assert_msg(why[0] != '\0', "%s p=%d m=%d v=%d: refused without a reason",
                                  name, p, m, v);
                    size_t n;
                    loom_sched_instr buf[8];
                    ck_assert_msg(o->build(&sh0, buf, 8, &n) != LOOM_OK, "%s p=%d m=%d v=%d: "
                                  "check refused but build accepted", name, p, m, v);
                    continue;
                }
                for (int r = 0; r < p; r++) {
                    loom_sched_shape sh = {p, r, m, v};
                    size_t cap = LOOM_SCHED_CAP(&sh), n1 = 0, n2 = 0, n0 = 0;
                    loom_sched_instr *a = calloc(cap, sizeof *a), *b = calloc(cap, sizeof *b);
                    ck_assert_int_eq(o->build(&sh, a, cap, &n1), LOOM_OK);
                    ck_assert_int_eq(o->build(&sh, b, cap, &n2), LOOM_OK);
                    ck_assert_msg(n1 == n2 && memcmp(a, b, n1 * sizeof *a) == 0,
                                  "%s p=%d stage %d m=%d v=%d: two builds differ", name, p, r, m, v);
                    ck_assert_uint_le(n1, cap);
                    o->build(&sh, NULL, 0, &n0);
                    ck_assert_msg(n0 == n1, "%s: with no buffer, n = %zu, not %zu", name, n0, n1);
                    free(a);
                    free(b);
                }
                loom_schedule *s = NULL;
                ck_assert_msg(loom_schedule_from_plugin(scheds[_i]->desc, p, m, v, &s) == LOOM_OK,
                              "%s p=%d m=%d v=%d: %s", name, p, m, v, loom_last_error());
                loom_sched_sim *sim = NULL;
                ck_assert_msg(loom_schedule_simulate(s, NULL, &sim) == LOOM_OK,
                              "%s p=%d m=%d v=%d: %s", name, p, m, v, loom_last_error());
                loom_sched_sim_free(sim);
                loom_schedule_free(s);
                served++;
            }
    ck_assert_msg(served > 0, "%s accepts none of the shapes tried", name);
}
END_TEST

int main(void)
{
    unsetenv("LOOM_PLUGIN_PATH");
    collect();
    Suite *s = suite_create("sched_contract");
    TCase *tc = tcase_create("every sched plugin");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, the_built_in_schedules_are_here);
    tcase_add_loop_test(tc, ops_are_complete_and_refuse_nonsense, 0, n_sched);
    tcase_add_loop_test(tc, every_accepted_shape_builds_a_valid_pure_schedule, 0, n_sched);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
