/* test_comm.c — loom-comm-shm across real processes (the fast suite): every op x dtype at
 * world sizes 1..8, on the world and on split groups, with the default and a tiny-chunk
 * configuration (which sends small messages through the chunked, pipelined paths);
 * 1 MiB + 3; bitwise reproducibility; completion in start order (collectives); sends and
 * receives larger than the mailbox streaming both ways; two overlapping groups
 * waited in opposite orders; split exclusion and nesting; and a timing bound for 8 ranks on
 * this machine's cores that only a sleeping (not spinning) wait meets. Failures (dead peers,
 * mismatched calls, refusals) are in test_comm_faults.c.
 * Ranks are forked by comm_harness; each reports through th_fail and the test asserts. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "comm_check.h"
#include "comm_harness.h"
#include "base/plugin_loader.h"
#include "plugin_test_util.h"
#include "base/status.h"

static th_env env;
static const char *const tiny[] = {"chunk_bytes=4096", "small_bytes=256", "mailbox_bytes=4096",
                                   NULL};

static void run_ok(int world, const char *const *cfg, th_fn fn, void *arg, th_result *res)
{
    th_opts o = {.world = world, .timeout_ms = 10000, .cfg = cfg, .limit_s = 100};
    int ok = th_run(&env, &o, fn, arg, res);
    ck_assert_msg(ok, "world %d:\n%s", world, th_summary(res));
    ck_assert_msg(th_leftovers(res)[0] == '\0', "left in /dev/shm: %s", th_leftovers(res));
}

/* ---- every op, every dtype ----------------------------------------------------------- */

static const size_t small_sizes[] = {0, 1, 7, 1000};
static const size_t tiny_sizes[] = {7, 5003};

static int all_ops(th_rank *t)
{
    const size_t *sizes = t->arg ? tiny_sizes : small_sizes;
    int n = t->arg ? 2 : 4;
    if (t->ops->rank(t->comm) != t->rank || t->ops->world(t->comm) != t->world)
        return th_fail(t, "rank/world %d/%d, want %d/%d", t->ops->rank(t->comm),
                       t->ops->world(t->comm), t->rank, t->world);
    return cc_run_all(t->ops, t->comm, sizes, n, 100u * (unsigned)t->world, "world", t->err, t->cap);
}

START_TEST(ops_on_the_world)
{
    th_result res;
    run_ok(_i, NULL, all_ops, NULL, &res);
    run_ok(_i, tiny, all_ops, (void *)1, &res);
}
END_TEST

/* Even and odd ranks, each group in reverse rank order (key = -rank). */
static int group_ops(th_rank *t)
{
    void *g = NULL;
    if (t->ops->split(t->comm, t->rank % 2, -t->rank, &g) != LOOM_OK)
        return th_fail(t, "split: %s", loom_last_error());
    int size = (t->world + 1 - t->rank % 2) / 2;        /* how many share my parity */
    int want_rank = (t->world - 1 - t->rank) / 2;       /* my place counted from the top */
    int bad = 0;
    if (t->ops->world(g) != size || t->ops->rank(g) != want_rank)
        bad = th_fail(t, "group rank/world %d/%d, want %d/%d", t->ops->rank(g),
                      t->ops->world(g), want_rank, size);
    if (!bad)
        bad = cc_run_all(t->ops, g, t->arg ? tiny_sizes : small_sizes, t->arg ? 2 : 4,
                         7u + (unsigned)(t->rank % 2), t->rank % 2 ? "odd group" : "even group",
                         t->err, t->cap);
    /* The world still works after (and alongside) its groups. */
    cc_case k = {CC_ALLREDUCE, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 1001, 5};
    if (!bad)
        bad = cc_run(t->ops, t->comm, &k, t->err, t->cap);
    t->ops->destroy(g);
    return bad;
}

START_TEST(ops_on_groups)
{
    th_result res;
    run_ok(_i, NULL, group_ops, NULL, &res);
    run_ok(_i, tiny, group_ops, (void *)1, &res);
}
END_TEST

/* ---- 1 MiB + 3 ----------------------------------------------------------------------- */

static int big_ops(th_rank *t)
{
    const size_t big = (1u << 20) + 3;
    const cc_case cases[] = {
        {CC_ALLREDUCE, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, big, 1},
        {CC_ALLREDUCE_INPLACE, LOOM_DTYPE_BF16, LOOM_REDUCE_AVG, big, 2},
        {CC_ALLREDUCE, LOOM_DTYPE_F16, LOOM_REDUCE_MAX, big, 3},
        {CC_REDUCE_SCATTER, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, big / 4, 4},
        {CC_ALLGATHER, LOOM_DTYPE_BF16, 0, big / 4, 5},
        {CC_BROADCAST, LOOM_DTYPE_I32, 0, big, 6},
        {CC_ALLTOALL, LOOM_DTYPE_U8, 0, big / 4, 7},
        {CC_ALLTOALLV, LOOM_DTYPE_F32, 0, big / 4, 8},
        {CC_SENDRECV, LOOM_DTYPE_F32, 0, big, 9},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (cc_run(t->ops, t->comm, &cases[i], t->err, t->cap))
            return 1;
    return 0;
}

START_TEST(one_mib_plus_three)
{
    th_result res;
    run_ok(_i, NULL, big_ops, NULL, &res);
}
END_TEST

/* ---- reproducibility ----------------------------------------------------------------- */

static int twice(th_rank *t)
{
    const size_t n = 300007; /* several chunks, not divisible by any world size */
    float *in = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    uint32_t *all = malloc(2 * sizeof(uint32_t) * (size_t)t->world);
    cc_fill(LOOM_DTYPE_F32, 42, t->rank, 0, n, in);
    loom_comm_request *r;
    int bad = 0;
    for (int k = 0; k < 2 && !bad; k++) {
        float *out = k ? b : a;
        if (t->ops->allreduce_start(t->comm, in, out, n, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r) ||
            t->ops->wait(t->comm, r))
            bad = th_fail(t, "allreduce: %s", loom_last_error());
    }
    if (!bad && memcmp(a, b, n * 4) != 0)
        bad = th_fail(t, "the same allreduce twice gave different bits");
    /* Every rank holds the same bits: compare a checksum across ranks. */
    uint32_t h[2] = {2166136261u, 0};
    for (size_t i = 0; i < n * 4; i++)
        h[0] = (h[0] ^ ((unsigned char *)a)[i]) * 16777619u;
    if (!bad && (t->ops->allgather_start(t->comm, h, all, 2, LOOM_DTYPE_I32, &r) ||
                 t->ops->wait(t->comm, r)))
        bad = th_fail(t, "allgather: %s", loom_last_error());
    for (int q = 0; !bad && q < t->world; q++)
        if (all[2 * q] != h[0])
            bad = th_fail(t, "rank %d's allreduce result differs from rank %d's", q, t->rank);
    free(in), free(a), free(b), free(all);
    return bad;
}

START_TEST(allreduce_is_bitwise_reproducible)
{
    th_result res;
    run_ok(5, NULL, twice, NULL, &res);
    run_ok(5, tiny, twice, NULL, &res);
    run_ok(8, NULL, twice, NULL, &res);
}
END_TEST

/* ---- concurrent groups --------------------------------------------------------------- */

/* A = {same parity}, B = {same pair}: every rank is in one of each. Start an allreduce on
 * each, then even ranks wait A first and odd ranks B first (with test() polling on one):
 * waiting on one group must move the other, or this deadlocks. */
static int two_groups(th_rank *t)
{
    void *a = NULL, *b = NULL;
    if (t->ops->split(t->comm, t->rank % 2, t->rank, &a) || t->ops->split(t->comm, t->rank / 2, t->rank, &b))
        return th_fail(t, "split: %s", loom_last_error());
    const size_t n = 50001;
    float *x = malloc(n * 4), *ya = malloc(n * 4), *yb = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(t->rank + 1) + (float)(i % 5);
    loom_comm_request *ra, *rb;
    int bad = 0;
    if (t->ops->allreduce_start(a, x, ya, n, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &ra) ||
        t->ops->allreduce_start(b, x, yb, n, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &rb))
        return th_fail(t, "start: %s", loom_last_error());
    if (t->rank % 2 == 0) {
        bad = t->ops->wait(a, ra) || t->ops->wait(b, rb);
    } else {
        while (!t->ops->test(b, rb))
            usleep(200);
        bad = t->ops->wait(b, rb) || t->ops->wait(a, ra);
    }
    if (bad)
        return th_fail(t, "wait: %s", loom_last_error());
    float sa = 0, sb = 0; /* sums of (rank+1) over each group */
    for (int q = 0; q < t->world; q++) {
        if (q % 2 == t->rank % 2)
            sa += (float)(q + 1);
        if (q / 2 == t->rank / 2)
            sb += (float)(q + 1);
    }
    for (size_t i = 0; i < n && !bad; i++) {
        float k = (float)(i % 5);
        float wa = sa + k * (float)t->ops->world(a), wb = sb + k * (float)t->ops->world(b);
        if (ya[i] != wa || yb[i] != wb)
            bad = th_fail(t, "element %zu: %g/%g, want %g/%g", i, ya[i], yb[i], wa, wb);
    }
    t->ops->destroy(a);
    t->ops->destroy(b);
    free(x), free(ya), free(yb);
    return bad;
}

START_TEST(groups_progress_independently)
{
    th_result res;
    run_ok(4, tiny, two_groups, NULL, &res);
    run_ok(7, NULL, two_groups, NULL, &res);
}
END_TEST

/* ---- completion order ------------------------------------------------------------------ */

/* Three operations started on one communicator; waiting for the last completes all of them,
 * after which test() on the others says done at once and their results are right. */
static int in_order(th_rank *t)
{
    float x[3000], y[3000], g[3000 * 8];
    for (int i = 0; i < 3000; i++)
        x[i] = (float)(t->rank * 3 + i % 11);
    loom_comm_request *a, *b, *c;
    if (t->ops->allreduce_start(t->comm, x, y, 3000, LOOM_DTYPE_F32, LOOM_REDUCE_MAX, &a) ||
        t->ops->allgather_start(t->comm, x, g, 3000, LOOM_DTYPE_F32, &b) ||
        t->ops->barrier_start(t->comm, &c))
        return th_fail(t, "start: %s", loom_last_error());
    if (t->ops->wait(t->comm, c))
        return th_fail(t, "wait(barrier): %s", loom_last_error());
    if (!t->ops->test(t->comm, a) || !t->ops->test(t->comm, b))
        return th_fail(t, "the barrier finished before the operations started ahead of it");
    if (t->ops->wait(t->comm, b) || t->ops->wait(t->comm, a))
        return th_fail(t, "wait: %s", loom_last_error());
    for (int i = 0; i < 3000; i++) {
        float top = (float)((t->world - 1) * 3 + i % 11);
        if (y[i] != top)
            return th_fail(t, "max[%d] = %g, want %g", i, y[i], top);
        for (int q = 0; q < t->world; q++)
            if (g[q * 3000 + i] != (float)(q * 3 + i % 11))
                return th_fail(t, "gathered[%d][%d] wrong", q, i);
    }
    return 0;
}

START_TEST(requests_complete_in_start_order)
{
    th_result res;
    run_ok(6, tiny, in_order, NULL, &res);
}
END_TEST

/* ---- streams both ways --------------------------------------------------------------- */

/* Two ranks exchange a stream of messages the way the pipeline engine does (interleaved
 * pp=2): a send is started and waited late, the receive of the message before it is
 * waited at once, so each rank always has one send ahead of its receives. With messages
 * larger than the mailbox (the 16-byte header makes "as large" too) the send ahead cannot
 * finish until the peer posts its next receive, which it does only after its current one
 * returns: a receive must complete on its own, not behind earlier sends (it did behind,
 * and this deadlocked). t->arg: the message's element count. */
static int streams_both_ways(th_rank *t)
{
    const size_t n = (size_t)t->arg, count = 6;
    int peer = 1 - t->rank;
    float *out = malloc(count * n * 4), *in = malloc(count * n * 4);
    loom_comm_request *sent[6] = {0}, *r = NULL;
    int bad = !out || !in;
    for (size_t k = 0; k < count; k++)
        cc_fill(LOOM_DTYPE_F32, 60u + (unsigned)k, t->rank, 0, n, out + k * n);
    /* two sends ahead, then per message: the next send, then this receive waited at once */
    for (size_t k = 0; !bad && k < 2; k++)
        bad = t->ops->send_start(t->comm, out + k * n, n, LOOM_DTYPE_F32, peer, &sent[k]) != LOOM_OK;
    for (size_t k = 0; !bad && k < count; k++) {
        if (k + 2 < count)
            bad = t->ops->send_start(t->comm, out + (k + 2) * n, n, LOOM_DTYPE_F32, peer,
                                     &sent[k + 2]) != LOOM_OK;
        if (!bad)
            bad = t->ops->recv_start(t->comm, in + k * n, n, LOOM_DTYPE_F32, peer, &r) != LOOM_OK ||
                  t->ops->wait(t->comm, r) != LOOM_OK;
        if (!bad && k >= 2) /* the oldest send, two behind: late, as the engine waits it */
            bad = t->ops->wait(t->comm, sent[k - 2]) != LOOM_OK;
    }
    for (size_t k = count - 2; !bad && k < count; k++)
        bad = t->ops->wait(t->comm, sent[k]) != LOOM_OK;
    if (bad) {
        free(out), free(in);
        return th_fail(t, "stream of %zu messages of %zu floats: %s", count, n, loom_last_error());
    }
    float *want = malloc(n * 4);
    for (size_t k = 0; !bad && k < count; k++) {
        cc_fill(LOOM_DTYPE_F32, 60u + (unsigned)k, peer, 0, n, want);
        if (memcmp(want, in + k * n, n * 4) != 0)
            bad = th_fail(t, "message %zu from rank %d arrived wrong", k, peer);
    }
    free(out), free(in), free(want);
    return bad;
}

START_TEST(large_messages_stream_both_ways)
{
    th_result res;
    /* default mailbox (131072 B): messages of exactly that, the size that deadlocked pp;
     * the tiny one (4096 B): 5003 floats, several mailboxes a message */
    th_opts o = {.world = 2, .timeout_ms = 3000, .limit_s = 30};
    ck_assert_msg(th_run(&env, &o, streams_both_ways, (void *)(size_t)32768, &res), "%s",
                  th_summary(&res));
    o.cfg = tiny;
    ck_assert_msg(th_run(&env, &o, streams_both_ways, (void *)(size_t)5003, &res), "%s",
                  th_summary(&res));
    ck_assert_msg(th_leftovers(&res)[0] == '\0', "left in /dev/shm: %s", th_leftovers(&res));
}
END_TEST

/* ---- no spinning --------------------------------------------------------------------- */

static int many_small(th_rank *t)
{
    float x[16], y[16];
    for (int i = 0; i < 16; i++)
        x[i] = (float)(t->rank + i);
    for (int it = 0; it < 200; it++) {
        loom_comm_request *r;
        if (t->ops->allreduce_start(t->comm, x, y, 16, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r) ||
            t->ops->wait(t->comm, r))
            return th_fail(t, "allreduce %d: %s", it, loom_last_error());
        float want = (float)(t->world * (t->world - 1) / 2);
        if (y[0] != want)
            return th_fail(t, "allreduce %d: %g, want %g", it, y[0], want);
    }
    return 0;
}

static double children_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

START_TEST(eight_ranks_sleep_instead_of_spinning)
{
    th_result res;
    double cpu0 = children_cpu();
    run_ok(8, NULL, many_small, NULL, &res);
    double cpu = children_cpu() - cpu0;
    fprintf(stderr, "8 ranks x 200 allreduces of 16 floats: %.3f s wall, %.3f s cpu (%ld cores)\n",
            res.seconds, cpu, sysconf(_SC_NPROCESSORS_ONLN));
    /* Spinning waiters on 2 cores take tens of seconds (each rank burns its slice); a
     * sleeping implementation needs well under a second. Generous: a shared machine. */
    ck_assert_msg(res.seconds < 8.0, "took %.2f s", res.seconds);
    ck_assert_msg(cpu < 4.0, "the ranks burnt %.2f s of cpu: waits spin?", cpu);
}
END_TEST

/* ---- splits ----------------------------------------------------------------------------- */

static int excluded_and_nested(th_rank *t)
{
    void *g = NULL, *h = NULL;
    /* rank 0 joins nothing; the rest form one group ordered by key = rank. */
    if (t->ops->split(t->comm, t->rank == 0 ? -1 : 5, t->rank, &g))
        return th_fail(t, "split: %s", loom_last_error());
    if (t->rank == 0)
        return g == NULL ? 0 : th_fail(t, "color -1 gave a communicator");
    if (g == NULL || t->ops->rank(g) != t->rank - 1 || t->ops->world(g) != t->world - 1)
        return th_fail(t, "group rank/world wrong");
    /* A split of the split: singletons. */
    if (t->ops->split(g, t->rank, 0, &h) || t->ops->world(h) != 1 || t->ops->rank(h) != 0)
        return th_fail(t, "nested split: %s", loom_last_error());
    char err[512];
    cc_case k = {CC_ALLREDUCE, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 5000, 3};
    if (cc_run(t->ops, h, &k, err, sizeof err) || cc_run(t->ops, g, &k, err, sizeof err))
        return th_fail(t, "%s", err);
    t->ops->destroy(g); /* h outlives its parent */
    if (cc_run(t->ops, h, &k, err, sizeof err))
        return th_fail(t, "%s", err);
    t->ops->destroy(h);
    return 0;
}

START_TEST(split_exclusion_and_nesting)
{
    th_result res;
    run_ok(4, NULL, excluded_and_nested, NULL, &res);
}
END_TEST

static Suite *comm_suite(void)
{
    Suite *s = suite_create("comm_shm");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, ops_on_the_world, 1, 9);
    tcase_add_loop_test(tc, ops_on_groups, 2, 9);
    tcase_add_loop_test(tc, one_mib_plus_three, 3, 5);
    tcase_add_test(tc, allreduce_is_bitwise_reproducible);
    suite_add_tcase(s, tc);
    tc = tcase_create("behaviour");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, requests_complete_in_start_order);
    tcase_add_test(tc, groups_progress_independently);
    tcase_add_test(tc, large_messages_stream_both_ways);
    tcase_add_test(tc, split_exclusion_and_nesting);
    tcase_add_test(tc, eight_ranks_sleep_instead_of_spinning);
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
