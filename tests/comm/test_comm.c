/* test_comm.c — loom-comm-shm across real processes (the fast suite): every op x dtype at
 * world sizes 1..8, on the world and on split groups, with the default and a tiny-chunk
 * configuration (which sends small messages through the chunked, pipelined paths);
 * bitwise reproducibility; two overlapping groups waited in opposite orders; a peer killed
 * mid-run and one that never starts (timeouts naming the rank, nothing left in /dev/shm,
 * no process left); mismatched calls; config and argument refusals; and a timing bound
 * for 8 ranks on this machine's cores that only a sleeping (not spinning) wait meets.
 * Ranks are forked by comm_harness; each reports through th_fail and the test asserts. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "comm_check.h"
#include "comm_harness.h"
#include "plugin_loader.h"
#include "plugin_test_util.h"
#include "status.h"

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
        ck_assert_msg(res.segment[0] == '/' && strncmp(res.segment, "/loom-", 6) == 0,
                      "segment name '%s'", res.segment);
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
    tcase_add_test(tc, groups_progress_independently);
    tcase_add_test(tc, dead_peer_times_out_naming_it);
    tcase_add_test(tc, missing_rank_at_start_up);
    tcase_add_test(tc, eight_ranks_sleep_instead_of_spinning);
    tcase_add_test(tc, mismatched_calls_are_named);
    tcase_add_test(tc, split_exclusion_and_nesting);
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
