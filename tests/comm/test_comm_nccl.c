/* test_comm_nccl.c — loom-comm-nccl in one process, world size 1, on device buffers.
 *
 * With no CUDA device visible it prints "SKIP: no CUDA device visible (cudaGetDeviceCount
 * = 0)" and exits 77 (meson's skip), after checking that the plugin's probe says the same
 * and that create refuses with LOOM_ERR_UNSUPPORTED.
 * With a GPU: every op x dtype against host references (allreduce and reduce_scatter with
 * sum/avg/max, allgather, broadcast, alltoall, alltoallv with gaps, barrier), counts 0, 1,
 * odd and large; split; argument refusals (host buffers among them); and a wait timeout (the backend stream is held
 * by a host function, so the operation cannot finish) that must abort the communicator,
 * return LOOM_ERR_TIMEOUT and refuse later calls.
 * No fork (CUDA after fork() is undefined): Check runs in CK_NOFORK mode.
 * Multi-rank NCCL (ranks as processes on several GPUs) is not covered here.
 */
#include <check.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "loom/plugin/comm.h"
#include "base/plugin_loader.h"
#include "mem_store.h"
#include "plugin_test_util.h"
#include "base/status.h"

static const loom_plugin *plug;
static const loom_comm_ops *ops;
static tcfg cfg;

static void *make(int timeout_ms, void *stream)
{
    static mem_store ms;
    loom_store st = mem_store_open(&ms);
    void *c = NULL;
    loom_status s = ops->create(loom_core_host(), &cfg.cfg, &st, 0, 1, timeout_ms, stream, &c);
    ck_assert_msg(s == LOOM_OK, "create: %s", loom_last_error());
    ck_assert_int_eq(ops->rank(c), 0);
    ck_assert_int_eq(ops->world(c), 1);
    return c;
}

/* ---- host data and references ------------------------------------------------------- */

static const loom_dtype dtypes[] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16, LOOM_DTYPE_F16,
                                    LOOM_DTYPE_I32, LOOM_DTYPE_U8, LOOM_DTYPE_U16};
static const size_t sizes[] = {0, 1, 7, 1000, 262147};

static size_t es(loom_dtype dt)
{
    return dt == LOOM_DTYPE_F32 || dt == LOOM_DTYPE_I32 ? 4 : dt == LOOM_DTYPE_U8 ? 1 : 2;
}

/* Small whole numbers, exact in every dtype: -8..8 (0..16 for u8/u16). */
static void fill(void *p, loom_dtype dt, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        int v = (int)((i * 2654435761u + seed) % 17u) - 8;
        float f = (float)v;
        uint32_t b;
        memcpy(&b, &f, 4);
        switch (dt) {
        case LOOM_DTYPE_F32: ((float *)p)[i] = f; break;
        case LOOM_DTYPE_BF16: ((uint16_t *)p)[i] = (uint16_t)(b >> 16); break;
        case LOOM_DTYPE_F16: {
            uint16_t h = (uint16_t)((b >> 16) & 0x8000u);
            if (v != 0)
                h |= (uint16_t)((((b >> 23) & 0xff) - 127 + 15) << 10 | ((b >> 13) & 0x3ff));
            ((uint16_t *)p)[i] = h;
            break;
        }
        case LOOM_DTYPE_I32: ((int32_t *)p)[i] = v; break;
        case LOOM_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)(v + 8); break;
        case LOOM_DTYPE_U16: ((uint16_t *)p)[i] = (uint16_t)(v + 8); break;
        }
    }
}

/* The reference for one rank's contribution: sum, avg (/1) and max of a single value are the
 * value itself, so the bytes must match exactly. */
static void *dev(size_t bytes)
{
    void *p = NULL;
    ck_assert_int_eq(cudaMalloc(&p, bytes ? bytes : 1), cudaSuccess);
    ck_assert_int_eq(cudaMemset(p, 0xA5, bytes ? bytes : 1), cudaSuccess);
    return p;
}

static void expect(const void *d, const void *want, size_t bytes, const char *what,
                   loom_dtype dt, size_t n)
{
    unsigned char *got = malloc(bytes ? bytes : 1);
    ck_assert_int_eq(cudaMemcpy(got, d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad = bytes;
    for (size_t i = 0; i < bytes; i++)
        if (got[i] != ((const unsigned char *)want)[i]) {
            bad = i;
            break;
        }
    free(got);
    ck_assert_msg(bad == bytes, "%s dtype %d count %zu: first wrong byte at %zu", what, (int)dt,
                  n, bad);
}

static void run(void *c, loom_status st, loom_comm_request *r, const char *what)
{
    ck_assert_msg(st == LOOM_OK, "%s start: %s", what, loom_last_error());
    st = ops->wait(c, r);
    ck_assert_msg(st == LOOM_OK, "%s wait: %s", what, loom_last_error());
}

/* ---- cases -------------------------------------------------------------------------- */

START_TEST(reductions)
{
    void *c = make(20000, NULL);
    for (int d = 0; d < 5; d++) /* not u16: NCCL cannot reduce it */
        for (int k = 0; k < 5; k++)
            for (int op = LOOM_REDUCE_SUM; op <= LOOM_REDUCE_MAX; op++) {
                loom_dtype dt = dtypes[d];
                size_t n = sizes[k], b = n * es(dt);
                void *h = malloc(b + 1);
                fill(h, dt, n, (unsigned)(op * 31 + k));
                void *s = dev(b), *r = dev(b);
                ck_assert_int_eq(cudaMemcpy(s, h, b, cudaMemcpyHostToDevice), cudaSuccess);
                loom_comm_request *q = NULL;
                run(c, ops->allreduce_start(c, s, r, n, dt, op, &q), q, "allreduce");
                expect(r, h, b, "allreduce", dt, n);
                run(c, ops->allreduce_start(c, s, s, n, dt, op, &q), q, "allreduce in place");
                expect(s, h, b, "allreduce in place", dt, n);
                run(c, ops->reduce_scatter_start(c, s, r, n, dt, op, &q), q, "reduce_scatter");
                expect(r, h, b, "reduce_scatter", dt, n);
                cudaFree(s);
                cudaFree(r);
                free(h);
            }
    ops->destroy(c);
}
END_TEST

START_TEST(data_movement)
{
    cudaStream_t backend;
    ck_assert_int_eq(cudaStreamCreate(&backend), cudaSuccess);
    void *c = make(20000, _i ? (void *)backend : NULL); /* _i: with a backend stream */
    for (int d = 0; d < 6; d++)
        for (int k = 0; k < 5; k++) {
            loom_dtype dt = dtypes[d];
            size_t n = sizes[k], b = n * es(dt);
            void *h = malloc(2 * b + 1);
            fill(h, dt, n, (unsigned)k);
            void *s = dev(b), *r = dev(2 * b);
            ck_assert_int_eq(cudaMemcpy(s, h, b, cudaMemcpyHostToDevice), cudaSuccess);
            loom_comm_request *q = NULL;
            run(c, ops->allgather_start(c, s, r, n, dt, &q), q, "allgather");
            expect(r, h, b, "allgather", dt, n);
            run(c, ops->broadcast_start(c, s, n, dt, 0, &q), q, "broadcast");
            expect(s, h, b, "broadcast", dt, n);
            ck_assert_int_eq(cudaMemset(r, 0, b ? b : 1), cudaSuccess);
            run(c, ops->alltoall_start(c, s, r, n, dt, &q), q, "alltoall");
            expect(r, h, b, "alltoall", dt, n);
            /* alltoallv: send the first half, land it after a gap of 3 elements */
            size_t sc = n / 2, sd = 0, rc = n / 2, rd = 3;
            void *r2 = dev((rd + rc) * es(dt));
            run(c, ops->alltoallv_start(c, s, &sc, &sd, r2, &rc, &rd, dt, &q), q, "alltoallv");
            expect((char *)r2 + rd * es(dt), h, rc * es(dt), "alltoallv", dt, n);
            cudaFree(r2);
            cudaFree(s);
            cudaFree(r);
            free(h);
        }
    loom_comm_request *q = NULL;
    run(c, ops->barrier_start(c, &q), q, "barrier");
    ops->destroy(c);
    cudaStreamDestroy(backend);
}
END_TEST

START_TEST(backend_stream_orders_the_input)
{
    /* The backend writes the input on its stream; the op must see the write. */
    cudaStream_t backend;
    ck_assert_int_eq(cudaStreamCreate(&backend), cudaSuccess);
    void *c = make(20000, backend);
    size_t n = 1 << 22;
    float *h = malloc(n * 4);
    fill(h, LOOM_DTYPE_F32, n, 5);
    void *s = dev(n * 4), *r = dev(n * 4);
    ck_assert_int_eq(cudaMemcpyAsync(s, h, n * 4, cudaMemcpyHostToDevice, backend), cudaSuccess);
    loom_comm_request *q = NULL;
    run(c, ops->allreduce_start(c, s, r, n, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &q), q, "allreduce");
    expect(r, h, n * 4, "allreduce after a backend write", LOOM_DTYPE_F32, n);
    cudaFree(s);
    cudaFree(r);
    free(h);
    ops->destroy(c);
    cudaStreamDestroy(backend);
}
END_TEST

START_TEST(split_and_test)
{
    void *c = make(20000, NULL), *g = NULL;
    ck_assert_msg(ops->split(c, 3, 0, &g) == LOOM_OK, "split: %s", loom_last_error());
    ck_assert_int_eq(ops->rank(g), 0);
    ck_assert_int_eq(ops->world(g), 1);
    int32_t h[5] = {1, -2, 3, -4, 5};
    void *s = dev(sizeof h);
    ck_assert_int_eq(cudaMemcpy(s, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    loom_comm_request *q = NULL;
    ck_assert_int_eq(ops->allreduce_start(g, s, s, 5, LOOM_DTYPE_I32, LOOM_REDUCE_MAX, &q),
                     LOOM_OK);
    while (!ops->test(g, q)) {
    }
    ck_assert_int_eq(ops->wait(g, q), LOOM_OK);
    expect(s, h, sizeof h, "allreduce on a split group", LOOM_DTYPE_I32, 5);
    ops->destroy(g);
    cudaFree(s);
    ops->destroy(c);
    ops->destroy(NULL);
}
END_TEST

START_TEST(refusals)
{
    void *c = make(20000, NULL);
    void *s = dev(64);
    loom_comm_request *q = NULL;
    ck_assert_int_eq(ops->send_start(c, s, 4, LOOM_DTYPE_F32, 0, &q), LOOM_ERR_UNSUPPORTED);
    ck_assert_ptr_null(q);
    ck_assert_int_eq(ops->recv_start(c, s, 4, LOOM_DTYPE_F32, 1, &q), LOOM_ERR_INVALID);
    ck_assert_int_eq(ops->allreduce_start(c, s, s, 4, LOOM_DTYPE_U16, LOOM_REDUCE_SUM, &q),
                     LOOM_ERR_UNSUPPORTED);
    ck_assert_int_eq(ops->allreduce_start(c, s, s, 4, LOOM_DTYPE_F32, (loom_reduce_op)9, &q),
                     LOOM_ERR_INVALID);
    ck_assert_int_eq(ops->broadcast_start(c, s, 4, LOOM_DTYPE_F32, 1, &q), LOOM_ERR_INVALID);
    ck_assert_int_eq(ops->allgather_start(c, NULL, s, 4, LOOM_DTYPE_F32, &q), LOOM_ERR_INVALID);
    ck_assert_int_eq(ops->allreduce_start(c, s, s, 4, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, NULL),
                     LOOM_ERR_INVALID);
    float host_buf[4] = {0};
    ck_assert_int_eq(ops->allreduce_start(c, host_buf, host_buf, 4, LOOM_DTYPE_F32,
                                          LOOM_REDUCE_SUM, &q), LOOM_ERR_INVALID);
    ck_assert_msg(strstr(loom_last_error(), "not CUDA device memory"), "%s", loom_last_error());
    void *g = NULL;
    ck_assert_int_eq(ops->split(c, -1, 0, &g), LOOM_ERR_INVALID);
    /* still usable after refusals */
    ck_assert_int_eq(ops->barrier_start(c, &q), LOOM_OK);
    ck_assert_int_eq(ops->wait(c, q), LOOM_OK);
    cudaFree(s);
    ops->destroy(c);
}
END_TEST

static atomic_int release;

static void CUDART_CB hold(void *arg)
{
    (void)arg;
    while (!atomic_load(&release)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

START_TEST(wait_times_out_and_aborts)
{
    cudaStream_t backend;
    ck_assert_int_eq(cudaStreamCreate(&backend), cudaSuccess);
    void *c = make(300, backend);
    void *s = dev(4096), *r = dev(4096);
    atomic_store(&release, 0);
    ck_assert_int_eq(cudaLaunchHostFunc(backend, hold, NULL), cudaSuccess);
    loom_comm_request *q = NULL;
    ck_assert_int_eq(ops->allreduce_start(c, s, r, 1024, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &q),
                     LOOM_OK);
    ck_assert_int_eq(ops->test(c, q), 0);
    loom_status st = ops->wait(c, q);
    atomic_store(&release, 1);
    ck_assert_msg(st == LOOM_ERR_TIMEOUT, "wait gave %d: %s", (int)st, loom_last_error());
    ck_assert_msg(strstr(loom_last_error(), "timeout_ms=300") &&
                  strstr(loom_last_error(), "aborted"), "message: %s", loom_last_error());
    ck_assert_int_eq(ops->barrier_start(c, &q), LOOM_ERR_COMM);
    ck_assert_int_eq(cudaStreamSynchronize(backend), cudaSuccess);
    ops->destroy(c);
    cudaFree(s);
    cudaFree(r);
    cudaStreamDestroy(backend);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
}
END_TEST

int main(void)
{
    const char *path = test_build_plugin_path("comm", "nccl");
    if (path == NULL || loom_plugin_open(path, &plug) != LOOM_OK) {
        fprintf(stderr, "loom-comm-nccl.so not found or refused: %s\n",
                path ? loom_last_error() : "not in the build tree");
        return 1;
    }
    ops = plug->desc->ops;
    char reason[256] = "";
    int usable = plug->desc->probe(reason, sizeof reason);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess)
        ndev = 0;
    if (ndev == 0) {
        if (usable != 0 || strstr(reason, "no CUDA device visible") == NULL) {
            fprintf(stderr, "probe says %d '%s' with no device visible\n", usable, reason);
            return 1;
        }
        /* create must refuse cleanly too, naming the reason */
        if (tcfg_build(&cfg, plug->desc, NULL, 0)) {
            static mem_store ms;
            loom_store st = mem_store_open(&ms);
            void *c = (void *)1;
            loom_status s = ops->create(loom_core_host(), &cfg.cfg, &st, 0, 1, 1000, NULL, &c);
            if (s != LOOM_ERR_UNSUPPORTED || c != NULL ||
                strstr(loom_last_error(), "no CUDA device visible") == NULL) {
                fprintf(stderr, "create with no device gave %d: %s\n", (int)s,
                        loom_last_error());
                return 1;
            }
        }
        ops->destroy(NULL);
        printf("SKIP: no CUDA device visible (cudaGetDeviceCount = 0)\n");
        return 77;
    }
    if (usable != 1) {
        fprintf(stderr, "probe says no ('%s') with %d device(s) visible\n", reason, ndev);
        return 1;
    }
    if (!tcfg_build(&cfg, plug->desc, NULL, 0)) {
        fprintf(stderr, "config: %s\n", cfg.err);
        return 1;
    }
    Suite *s = suite_create("comm_nccl");
    TCase *tc = tcase_create("world1");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, reductions);
    tcase_add_loop_test(tc, data_movement, 0, 2);
    tcase_add_test(tc, backend_stream_orders_the_input);
    tcase_add_test(tc, split_and_test);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, wait_times_out_and_aborts); /* last: it aborts a communicator */
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
