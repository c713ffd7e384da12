/* test_comm_faults.c — loom-comm-shm when things go wrong, across real processes: a peer
 * killed mid-run (on the world and in a group) becomes LOOM_ERR_TIMEOUT after the timeout
 * with a message naming it, the communicator refuses new work, no process and nothing in
 * /dev/shm is left; a rank that never starts fails start-up by name; mismatched calls
 * (send/recv sizes, alltoallv counts, different collectives) are named on the ranks
 * involved; config and argument refusals read exactly as documented. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_check.h"
#include "comm_harness.h"
#include "base/plugin_loader.h"
#include "plugin_test_util.h"
#include "base/status.h"

static th_env env;

static void run_ok(int world, const char *const *cfg, th_fn fn, void *arg, th_result *res)
{
    th_opts o = {.world = world, .timeout_ms = 10000, .cfg = cfg, .limit_s = 100};
    int ok = th_run(&env, &o, fn, arg, res);
    ck_assert_msg(ok, "world %d:\n%s", world, th_summary(res));
    ck_assert_msg(th_leftovers(res)[0] == '\0', "left in /dev/shm: %s", th_leftovers(res));
}

/* ---- a dead peer --------------------------------------------------------------------- */

static int dies(th_rank *t)
{
    int in_group = t->arg != NULL;
    void *comm = t->comm, *g = NULL;
    loom_comm_request *r;
    if (in_group) {
        if (t->ops->split(t->comm, t->rank % 2, t->rank, &g))
            return th_fail(t, "split: %s", loom_last_error());
        comm = g;
    }
    if (t->ops->barrier_start(comm, &r) || t->ops->wait(comm, r))
        return th_fail(t, "barrier: %s", loom_last_error());
    int victim = in_group ? 3 : 2;
    if (t->rank == victim)
        raise(SIGKILL);
    if (in_group && t->rank % 2 == 0) { /* the other group is not affected */
        t->ops->destroy(g);
        return 0;
    }
    float x[1000] = {0}, y[1000];
    double t0 = th_seconds();
    if (t->ops->allreduce_start(comm, x, y, 1000, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r))
        return th_fail(t, "start: %s", loom_last_error());
    loom_status st = t->ops->wait(comm, r);
    double dt = th_seconds() - t0;
    const char *want = in_group ? "shm allreduce: rank 1 (world rank 3) did not arrive within 2000 ms (dead or stuck?)"
                                : "shm allreduce: rank 2 did not arrive within 2000 ms (dead or stuck?)";
    int bad = 0;
    if (t->rank == 0)
        snprintf(t->err, t->cap, "%s", loom_last_error()); /* shown by the test, for the log */
    if (st != LOOM_ERR_TIMEOUT || strcmp(loom_last_error(), want) != 0)
        bad = th_fail(t, "wait gave %s '%s', want LOOM_ERR_TIMEOUT '%s'", loom_status_name(st),
                      loom_last_error(), want);
    else if (dt < 1.9 || dt > 6.0)
        bad = th_fail(t, "timed out after %.2f s, want about 2 s", dt);
    else if (t->ops->barrier_start(comm, &r) != LOOM_ERR_TIMEOUT)
        bad = th_fail(t, "a broken communicator accepted a new operation");
    t->ops->destroy(g);
    return bad;
}

START_TEST(dead_peer_times_out_naming_it)
{
    for (int in_group = 0; in_group < 2; in_group++) {
        th_opts o = {.world = 4, .timeout_ms = 2000, .limit_s = 30};
        th_result res;
        th_run(&env, &o, dies, in_group ? (void *)1 : NULL, &res);
        int victim = in_group ? 3 : 2;
        ck_assert_msg(!res.killed, "hung:\n%s", th_summary(&res));
        for (int r = 0; r < 4; r++) {
            if (r == victim)
                ck_assert_msg(res.signo[r] == SIGKILL, "rank %d should have died", r);
            else
                ck_assert_msg(res.exited[r] && res.code[r] == 0, "%s", th_summary(&res));
        }
        char prefix[40];
        snprintf(prefix, sizeof prefix, "/loom-%s-", res.job); /* what `loom launch` sweeps */
        ck_assert_msg(strncmp(res.segment, prefix, strlen(prefix)) == 0,
                      "segment name '%s' should start with '%s'", res.segment, prefix);
        ck_assert_msg(th_leftovers(&res)[0] == '\0', "left in /dev/shm: %s", th_leftovers(&res));
        if (!in_group)
            fprintf(stderr, "dead peer: %s\n", res.msg[0]);
    }
}
END_TEST

/* Rank 2 never creates: rank 0 gives up naming it, rank 1 is told, nothing is left. */
static int never_starts(th_rank *t)
{
    if (t->rank == 2)
        return 0;
    void *c = NULL;
    loom_status st = t->ops->create(loom_core_host(), t->cfg, t->store, t->rank, t->world, 1500,
                                    NULL, &c);
    const char *want = t->rank == 0
        ? "shm create: rank 2 did not join within 1500 ms (not started, crashed, or given another store?)"
        : "shm create: rank 0 gave up start-up: another rank did not join in time";
    if (st != LOOM_ERR_TIMEOUT || c != NULL || strcmp(loom_last_error(), want) != 0)
        return th_fail(t, "create gave %s '%s', want '%s'", loom_status_name(st), loom_last_error(), want);
    return 0;
}

START_TEST(missing_rank_at_start_up)
{
    th_opts o = {.world = 3, .timeout_ms = 1500, .limit_s = 30, .no_create = 1};
    th_result res;
    ck_assert_msg(th_run(&env, &o, never_starts, NULL, &res), "%s", th_summary(&res));
    ck_assert_msg(th_leftovers(&res)[0] == '\0', "left in /dev/shm: %s", th_leftovers(&res));
}
END_TEST

/* ---- mismatched calls ------------------------------------------------------------------ */

static int mismatch(th_rank *t)
{
    float x[10] = {0}, y[12];
    loom_comm_request *r = NULL;
    loom_status st = LOOM_OK;
    /* p2p: rank 0 sends 10 floats to rank 1, which expects 12. Only that recv fails. */
    if (t->rank == 0)
        st = t->ops->send_start(t->comm, x, 10, LOOM_DTYPE_F32, 1, &r);
    else if (t->rank == 1)
        st = t->ops->recv_start(t->comm, y, 12, LOOM_DTYPE_F32, 0, &r);
    if (t->rank <= 1) {
        st = st ? st : t->ops->wait(t->comm, r);
        const char *want = "shm recv from rank 0: rank 0 sent 40 bytes of f32, this recv expects "
                           "48 bytes (12 x f32); a send and its recv must use the same count and dtype";
        if (t->rank == 0 && st != LOOM_OK)
            return th_fail(t, "send: %s", loom_last_error());
        if (t->rank == 1 && (st != LOOM_ERR_INVALID || strcmp(loom_last_error(), want) != 0))
            return th_fail(t, "recv gave %s '%s'", loom_status_name(st), loom_last_error());
    }
    /* alltoallv counts that do not match across ranks: every rank says so. */
    size_t sc[3] = {1, 1, 1}, d[3] = {0, 1, 2}, rc[3] = {1, 1, 1};
    if (t->rank == 2)
        sc[0] = 2;
    st = t->ops->alltoallv_start(t->comm, x, sc, d, y, rc, d, LOOM_DTYPE_F32, &r);
    st = st ? st : t->ops->wait(t->comm, r);
    if (st != LOOM_ERR_INVALID || !strstr(loom_last_error(), "rank 2 sends 2 elements to rank 0, which expects 1"))
        return th_fail(t, "alltoallv gave %s '%s'", loom_status_name(st), loom_last_error());
    return 0;
}

static int wrong_collective(th_rank *t)
{
    float x[10] = {0};
    loom_comm_request *r;
    loom_status st = t->rank == 1
        ? t->ops->broadcast_start(t->comm, x, 10, LOOM_DTYPE_F32, 0, &r)
        : t->ops->allreduce_start(t->comm, x, x, 10, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r);
    st = st ? st : t->ops->wait(t->comm, r);
    const char *want = t->rank == 1
        ? "shm broadcast: rank 0 called allreduce(count 10, f32, sum) as collective #0 where this rank called broadcast(count 10, f32, root 0) as #0"
        : "shm allreduce: rank 1 called broadcast(count 10, f32, root 0) as collective #0 where this rank called allreduce(count 10, f32, sum) as #0";
    if (st != LOOM_ERR_INVALID || strncmp(loom_last_error(), want, strlen(want)) != 0)
        return th_fail(t, "gave %s '%s', want '%s...'", loom_status_name(st), loom_last_error(), want);
    return 0;
}

START_TEST(mismatched_calls_are_named)
{
    th_result res;
    run_ok(3, NULL, mismatch, NULL, &res);
    run_ok(3, NULL, wrong_collective, NULL, &res);
}
END_TEST

/* ---- refusals ------------------------------------------------------------------------- */

static void expect_create_refused(const char *const *cfg, void *device, int timeout_ms,
                                  const char *want)
{
    tcfg t;
    ck_assert_msg(tcfg_build(&t, env.desc, cfg, 0), "%s", t.err);
    th_store *s = th_store_new();
    loom_store api = th_store_api(s);
    void *c = (void *)1;
    loom_status st = env.ops->create(loom_core_host(), &t.cfg, &api, 0, 1, timeout_ms, device, &c);
    ck_assert_int_ne(st, LOOM_OK);
    ck_assert_ptr_null(c);
    ck_assert_str_eq(loom_last_error(), want);
    th_store_free(s);
}

START_TEST(config_refusals)
{
    const char *bad_chunk[] = {"chunk_bytes=1000", NULL};
    expect_create_refused(bad_chunk, NULL, 1000, "shm: chunk_bytes must be a multiple of 64 "
                          "between 4096 and 1073741824 (1 GiB), got 1000 (try 1048576)");
    const char *bad_small[] = {"chunk_bytes=8192", "small_bytes=9000", NULL};
    expect_create_refused(bad_small, NULL, 1000, "shm: small_bytes must be between 0 and "
                          "chunk_bytes=8192, got 9000");
    const char *bad_box[] = {"mailbox_bytes=16", NULL};
    expect_create_refused(bad_box, NULL, 1000, "shm: mailbox_bytes must be between 4096 and "
                          "1073741824 (1 GiB), got 16");
    expect_create_refused(NULL, (void *)8, 1000, "shm: host memory only, device must be NULL "
                          "(the nccl communicator handles device buffers)");
    expect_create_refused(NULL, NULL, 0, "shm: timeout_ms must be > 0, got 0");
}
END_TEST

static int arg_refusals(th_rank *t)
{
    const loom_comm_ops *o = t->ops;
    float x[4];
    static const char *const want[] = {
        "shm broadcast: root is not a rank of this communicator",
        "shm send: peer is not a rank of this communicator",
        "shm allreduce: unknown dtype 99",
        "shm allreduce: reduce op 7 is not sum (0), avg (1) or max (2)",
        "shm allgather: send and recv must not be NULL",
        "shm reduce_scatter: count 9223372036854775807 is too large",
    };
    for (int i = 0; i < 6; i++) {
        loom_comm_request *r = (loom_comm_request *)1;
        loom_status st;
        switch (i) {
        case 0: st = o->broadcast_start(t->comm, x, 4, LOOM_DTYPE_F32, 1, &r); break;
        case 1: st = o->send_start(t->comm, x, 4, LOOM_DTYPE_F32, -1, &r); break;
        case 2: st = o->allreduce_start(t->comm, x, x, 4, (loom_dtype)99, LOOM_REDUCE_SUM, &r); break;
        case 3: st = o->allreduce_start(t->comm, x, x, 4, LOOM_DTYPE_F32, (loom_reduce_op)7, &r); break;
        case 4: st = o->allgather_start(t->comm, NULL, x, 4, LOOM_DTYPE_F32, &r); break;
        default:
            st = o->reduce_scatter_start(t->comm, x, x, SIZE_MAX / 2, LOOM_DTYPE_F32,
                                         LOOM_REDUCE_SUM, &r);
            break;
        }
        if (st != LOOM_ERR_INVALID || strcmp(loom_last_error(), want[i]) != 0 || r != NULL)
            return th_fail(t, "case %d: %s '%s', want LOOM_ERR_INVALID '%s' and no request", i,
                           loom_status_name(st), loom_last_error(), want[i]);
    }
    return 0;
}

START_TEST(argument_refusals)
{
    th_result res;
    run_ok(1, NULL, arg_refusals, NULL, &res);
}
END_TEST

static Suite *comm_suite(void)
{
    Suite *s = suite_create("comm_shm_faults");
    TCase *tc = tcase_create("faults");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, dead_peer_times_out_naming_it);
    tcase_add_test(tc, missing_rank_at_start_up);
    tcase_add_test(tc, mismatched_calls_are_named);
    tcase_add_test(tc, config_refusals);
    tcase_add_test(tc, argument_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    unsetenv("LOOM_PLUGIN_PATH"); /* the build tree's plugin, not a developer's */
    char err[1024];
    if (!th_load(&env, "shm", err, sizeof err)) {
        fprintf(stderr, "cannot load the shm plugin: %s\n", err);
        return 1;
    }
    SRunner *sr = srunner_create(comm_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
