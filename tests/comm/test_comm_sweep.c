/* test_comm_sweep.c — the slow sweep of loom-comm-shm: every op x dtype (x sum/avg/max)
 * at 1 MiB + 3 elements on world sizes 1..8 and on their even/odd groups (reverse key
 * order), and allreduces of tens of MiB. Same checks as test_comm.c (comm_check: bitwise
 * against a reference summed in rank order), just bigger. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm_check.h"
#include "comm_harness.h"
#include "base/status.h"

static th_env env;
static const size_t mib3[] = {(1u << 20) + 3};

static void run_ok(int world, th_fn fn, void *arg)
{
    th_opts o = {.world = world, .timeout_ms = 30000, .limit_s = 900};
    th_result res;
    ck_assert_msg(th_run(&env, &o, fn, arg, &res), "world %d:\n%s", world, th_summary(&res));
    ck_assert_msg(th_leftovers(&res)[0] == '\0', "left in /dev/shm: %s", th_leftovers(&res));
    fprintf(stderr, "world %d: %.1f s\n", world, res.seconds);
}

static int world_sweep(th_rank *t)
{
    return cc_run_all(t->ops, t->comm, mib3, 1, 11u * (unsigned)t->world, "world", t->err, t->cap);
}

static int group_sweep(th_rank *t)
{
    void *g = NULL;
    if (t->ops->split(t->comm, t->rank % 2, -t->rank, &g))
        return th_fail(t, "split: %s", loom_last_error());
    int bad = cc_run_all(t->ops, g, mib3, 1, 3u + (unsigned)(t->rank % 2),
                         t->rank % 2 ? "odd group" : "even group", t->err, t->cap);
    t->ops->destroy(g);
    return bad;
}

static int tens_of_mib(th_rank *t)
{
    const cc_case cases[] = {
        {CC_ALLREDUCE, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, (40u << 20) / 4 + 5, 1},
        {CC_ALLREDUCE_INPLACE, LOOM_DTYPE_BF16, LOOM_REDUCE_AVG, (40u << 20) / 2 + 5, 2},
        {CC_REDUCE_SCATTER, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, (16u << 20) / 4 / (size_t)t->world + 1, 3},
        {CC_ALLGATHER, LOOM_DTYPE_F32, 0, (16u << 20) / 4 / (size_t)t->world + 1, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (cc_run(t->ops, t->comm, &cases[i], t->err, t->cap))
            return 1;
    return 0;
}

START_TEST(sweep_world) { run_ok(_i, world_sweep, NULL); }
END_TEST
START_TEST(sweep_groups) { run_ok(_i, group_sweep, NULL); }
END_TEST
START_TEST(large_messages) { run_ok((int[]){2, 4, 8}[_i], tens_of_mib, NULL); }
END_TEST

int main(void)
{
    unsetenv("LOOM_PLUGIN_PATH");
    char err[1024];
    if (!th_load(&env, "shm", err, sizeof err)) {
        fprintf(stderr, "cannot load the shm plugin: %s\n", err);
        return 1;
    }
    Suite *s = suite_create("comm_shm_sweep");
    TCase *tc = tcase_create("sweep");
    tcase_set_timeout(tc, 1200);
    tcase_add_loop_test(tc, sweep_world, 1, 9);
    tcase_add_loop_test(tc, sweep_groups, 2, 9);
    tcase_add_loop_test(tc, large_messages, 0, 3);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
