/* test_nccl_host.c — loom-comm-nccl's host-side logic without a GPU: plugins/comm/nccl/nccl.c
 * compiled into this test against the real CUDA and NCCL headers, with fake_nccl.c in place
 * of libcudart and libnccl (see fake_nccl.h for what the fake does and does not do).
 *
 * Checked: the device is set before any other CUDA or NCCL call (the LOCAL_RANK rule, the
 * `device` key, the backend's current device given its stream) and again on every entry;
 * each communicator publishes its NCCL id under its own store key, so a later create never
 * reads an earlier one's id; a failed ncclCommSplit (at once, or after polling the new
 * communicator) leaves the parent un-aborted and usable; completion events come from a pool
 * (200 operations create one); an enqueue NCCL leaves in progress returns from the start
 * without polling, and wait, test or the next start settle it; device_wait makes wait a
 * stream wait on the completion event with no host wait; bf16 reductions reach NCCL as
 * ncclBfloat16 where meson found it for C.
 * What not: NCCL and CUDA themselves (tests/comm/test_comm_nccl.c, on a GPU).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "base/plugin_loader.h"
#include "base/status.h"
#include "fake_nccl.h"
#include "loom/plugin.h"
#include "loom/plugin/comm.h"
#include "mem_store.h"
#include "plugin_test_util.h"

const loom_plugin_desc *loom_plugin_entry(void); /* nccl.c's, compiled in */

static const loom_comm_ops *ops;
static mem_store ms;
static loom_store store;

static void *make_on(const loom_store *st, const char *const *over, int rank, int world,
                     void *stream, loom_status want)
{
    tcfg cfg;
    ck_assert_msg(tcfg_build(&cfg, loom_plugin_entry(), over, 0), "%s", cfg.err);
    void *c = NULL;
    loom_status s = ops->create(loom_core_host(), &cfg.cfg, st, rank, world, 500, stream, &c);
    ck_assert_msg(s == want, "create gave %d (%s), expected %d", s, loom_last_error(), want);
    return c;
}

static void *make(const char *const *over, void *stream)
{
    store = mem_store_open(&ms);
    return make_on(&store, over, 0, 1, stream, LOOM_OK);
}

static float *dev_floats(size_t n)
{
    void *p = NULL;
    ck_assert(cudaMalloc(&p, n * sizeof(float)) == cudaSuccess);
    return p;
}

static void allreduce_ok(void *c, float *buf, size_t n)
{
    loom_comm_request *r = NULL;
    ck_assert_msg(ops->allreduce_start(c, buf, buf, n, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r) ==
                      LOOM_OK, "%s", loom_last_error());
    ck_assert_msg(ops->wait(c, r) == LOOM_OK, "%s", loom_last_error());
}

START_TEST(test_device_first)
{
    fake_reset(4);
    setenv("LOCAL_RANK", "6", 1);
    void *c = make(NULL, NULL);
    /* nothing but the probe of the device count before the choice: 6 % 4 = 2 */
    ck_assert_str_eq(fake.first_calls[0], "cudaGetDeviceCount");
    ck_assert_str_eq(fake.first_calls[1], "cudaSetDevice");
    ck_assert_int_eq(fake.current, 2);
    fake.current = 0; /* another thread, or the backend, made another device current */
    float *b = dev_floats(4);
    allreduce_ok(c, b, 4);
    ck_assert_int_eq(fake.enqueue_device, 2); /* set again on entry */
    ops->destroy(c);

    static const char *const dev1[] = {"device=1", NULL};
    fake_reset(4);
    c = make(dev1, NULL);
    ck_assert_int_eq(fake.current, 1);
    ops->destroy(c);

    /* given the backend's stream and no key: the device the backend made current */
    fake_reset(4);
    fake.current = 3;
    c = make(NULL, fake_stream());
    ck_assert_str_eq(fake.first_calls[1], "cudaGetDevice");
    ck_assert_str_eq(fake.first_calls[2], "cudaSetDevice");
    ck_assert_int_eq(fake.current, 3);
    ops->destroy(c);

    static const char *const bad[] = {"device=7", NULL};
    fake_reset(4);
    store = mem_store_open(&ms);
    make_on(&store, bad, 0, 1, NULL, LOOM_ERR_INVALID);
    ck_assert_int_eq(fake.inits, 0);
    unsetenv("LOCAL_RANK");
    cudaFree(b);
}
END_TEST

/* The store keys under "nccl/id/", in the order set. */
static int id_keys(char keys[][64], int cap)
{
    int n = 0;
    for (int i = 0; i < ms.n && n < cap; i++)
        if (strncmp(ms.key[i], "nccl/id", 7) == 0)
            strcpy(keys[n++], ms.key[i]);
    return n;
}

START_TEST(test_id_key_per_communicator)
{
    fake_reset(1);
    store = mem_store_open(&ms);
    void *a = make_on(&store, NULL, 0, 1, NULL, LOOM_OK);
    void *b = make_on(&store, NULL, 0, 1, NULL, LOOM_OK);
    char keys[4][64];
    ck_assert_int_eq(id_keys(keys, 4), 2);
    ck_assert_str_ne(keys[0], keys[1]);
    ck_assert_int_eq(strncmp(keys[0], "nccl/id/", 8), 0);
    int i0 = -1, i1 = -1;
    for (int i = 0; i < ms.n; i++) {
        i0 = strcmp(ms.key[i], keys[0]) == 0 ? i : i0;
        i1 = strcmp(ms.key[i], keys[1]) == 0 ? i : i1;
    }
    ck_assert(memcmp(ms.val[i0], ms.val[i1], sizeof(ncclUniqueId)) != 0);
    /* A third communicator's rank 1 must wait for its own key, not read the stale ids the
     * first two left there (mem_store: an unset key times out at once). */
    int inits = fake.inits;
    make_on(&store, NULL, 1, 2, NULL, LOOM_ERR_TIMEOUT);
    ck_assert_int_eq(fake.inits, inits);
    ops->destroy(a);
    ops->destroy(b);
}
END_TEST

START_TEST(test_split_failure_keeps_parent)
{
    fake_reset(1);
    void *c = make(NULL, NULL);
    float *b = dev_floats(8);
    void *child = (void *)1;
    fake.split_fail = 1; /* ncclCommSplit returns an error */
    ck_assert_int_eq(ops->split(c, 0, 0, &child), LOOM_ERR_COMM);
    ck_assert_ptr_null(child);
    ck_assert_msg(strstr(loom_last_error(), "parent communicator is kept"), "%s",
                  loom_last_error());
    ck_assert_int_eq(fake.aborts, 0);
    allreduce_ok(c, b, 8);

    fake.split_fail = 2; /* in progress, then an error on the new communicator */
    ck_assert_int_eq(ops->split(c, 0, 0, &child), LOOM_ERR_COMM);
    ck_assert_ptr_null(child);
    ck_assert_int_eq(fake.aborts, 1); /* the child, not the parent */
    allreduce_ok(c, b, 8);

    fake.split_fail = 0;
    ck_assert_int_eq(ops->split(c, 0, 0, &child), LOOM_OK);
    ck_assert_int_eq(ops->world(child), 1);
    allreduce_ok(child, b, 8);
    ops->destroy(child);
    ops->destroy(c);
    cudaFree(b);
}
END_TEST

START_TEST(test_events_pooled)
{
    fake_reset(1);
    void *c = make(NULL, NULL);
    float *b = dev_floats(16);
    int before = fake.events_created;
    for (int i = 0; i < 200; i++)
        allreduce_ok(c, b, 16);
    ck_assert_int_eq(fake.events_created - before, 1);
    ops->destroy(c);
    ck_assert_int_eq(fake.events_created, fake.events_destroyed);
    cudaFree(b);
}
END_TEST

START_TEST(test_lazy_settle)
{
    fake_reset(1);
    void *c = make(NULL, NULL);
    float *b = dev_floats(4);
    loom_comm_request *r = NULL, *r2 = NULL;
    fake.inprogress_polls = 3;
    int polls = fake.async_polls;
    ck_assert(ops->allreduce_start(c, b, b, 4, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r) == LOOM_OK);
    ck_assert_int_eq(fake.async_polls, polls); /* the start did not poll (nor sleep) */
    ck_assert_int_eq(ops->test(c, r), 0);      /* one look, still in progress */
    ck_assert_int_eq(fake.async_polls, polls + 1);
    ck_assert_msg(ops->wait(c, r) == LOOM_OK, "%s", loom_last_error());

    /* the next start settles the one before it */
    fake.inprogress_polls = 2;
    ck_assert(ops->allreduce_start(c, b, b, 4, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r) == LOOM_OK);
    ck_assert(ops->allreduce_start(c, b, b, 4, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r2) == LOOM_OK);
    ck_assert_int_eq(ops->test(c, r), 1); /* settled and recorded by the second start */
    ck_assert(ops->wait(c, r) == LOOM_OK);
    ck_assert(ops->wait(c, r2) == LOOM_OK);
    ops->destroy(c);
    cudaFree(b);
}
END_TEST

START_TEST(test_device_wait)
{
    static const char *const on[] = {"device_wait=true", NULL};
    fake_reset(1);
    fake.user_stream = fake_stream();
    void *c = make(on, fake.user_stream);
    float *b = dev_floats(4);
    allreduce_ok(c, b, 4);
    ck_assert_int_eq(fake.waits_on_user, 1); /* the backend's stream waits on the event */
    ck_assert_int_eq(fake.event_queries, 0); /* and the host did not */
    ops->destroy(c);

    fake_reset(1); /* default: the host waits, the backend's stream never does */
    fake.user_stream = fake_stream();
    c = make(NULL, fake.user_stream);
    allreduce_ok(c, b, 4);
    ck_assert_int_eq(fake.waits_on_user, 0);
    ck_assert_int_ge(fake.event_queries, 1);
    /* a completion that never comes: the timeout aborts and says so */
    fake.event_never_done = 1;
    loom_comm_request *r = NULL;
    ck_assert(ops->allreduce_start(c, b, b, 4, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r) == LOOM_OK);
    ck_assert_int_eq(ops->wait(c, r), LOOM_ERR_TIMEOUT);
    ck_assert_int_eq(fake.aborts, 1);
    ops->destroy(c);
    cudaFree(b);
}
END_TEST

START_TEST(test_bf16)
{
    fake_reset(1);
    void *c = make(NULL, NULL);
    float *b = dev_floats(4);
    loom_comm_request *r = NULL;
    loom_status s = ops->allreduce_start(c, b, b, 8, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, &r);
#ifdef LOOM_NCCL_HAVE_BF16
    ck_assert_msg(s == LOOM_OK, "%s", loom_last_error());
    ck_assert_int_eq(fake.last_dtype, (int)ncclBfloat16);
    ck_assert(ops->wait(c, r) == LOOM_OK);
#else
    ck_assert_int_eq(s, LOOM_ERR_UNSUPPORTED);
#endif
    ops->destroy(c);
    cudaFree(b);
}
END_TEST

int main(void)
{
    ops = loom_plugin_entry()->ops;
    Suite *s = suite_create("nccl_host");
    TCase *tc = tcase_create("host");
    tcase_add_test(tc, test_device_first);
    tcase_add_test(tc, test_id_key_per_communicator);
    tcase_add_test(tc, test_split_failure_keeps_parent);
    tcase_add_test(tc, test_events_pooled);
    tcase_add_test(tc, test_lazy_settle);
    tcase_add_test(tc, test_device_wait);
    tcase_add_test(tc, test_bf16);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
