/* test_cuda_dist.c BACKEND COMM — dist's device groups (dist.h) in one process, world 1.
 *
 * loom_dist_init(COMM) then a device backend (BACKEND) and loom_dist_device_open:
 *  - the banner's kind names what carries device buffers ("nccl on the backend's stream,
 *    host buffers over shm" for COMM=nccl; "shm, staged through host memory" for a host
 *    COMM) and the host groups stay the host communicator's;
 *  - a second open is refused by name (one device session at a time); close, then open
 *    again works (nccl: a new communicator, a new store key);
 *  - an all-reduce and an all-gather of device buffers through the device world give the
 *    values back (world 1: the identity), read with the backend's copies (under
 *    LOOM_CUDAEMU_GUARD=1 for cudaemu, so a host read of device memory is a segfault);
 *  - nccl only: the device world runs on the backend's stream. With that stream held by a
 *    host function, a started all-reduce must not complete (test() = 0 after 100 ms) until
 *    it is released: the collective is ordered after the kernels that write its input.
 *    A comm given no stream (device = NULL) would have completed.
 *  - nccl only: its device groups go through the flight recorder (the device world's ops
 *    are the recorder's, its newest entry on group nccl-world);
 *  - device_wait and host_comm beside a host COMM are refused by name.
 * No GPU (BACKEND cuda or COMM nccl not usable): "SKIP: ..." and exit 77. No fork (CUDA).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef LOOM_TEST_CUDART
#include <cuda_runtime_api.h>
#endif

#include "base/backend.h"
#include "base/status.h"
#include "dist/dist.h"
#include "dist/flight.h"
#include "mem_store.h"

static int failures;

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                          \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, "\n");                                                        \
            failures++;                                                                   \
        }                                                                                 \
    } while (0)

static int skip(const char *why)
{
    printf("SKIP: %s\n", why);
    return 77;
}

static int unusable(const char *msg)
{
    return strstr(msg, "not usable here") || strstr(msg, "no CUDA device");
}

/* ---- the device world's collectives, world 1 ----------------------------------------- */

enum { N = 1 << 16 };

static void identity_checks(loom_backend *be)
{
    const loom_comm_ops *ops;
    void *w = loom_dist_device_world(&ops);
    CHECK(w && ops, "no device world after loom_dist_device_open");
    if (!w)
        return;
    CHECK(ops->world(w) == 1 && ops->rank(w) == 0, "device world %d, rank %d", ops->world(w),
          ops->rank(w));
    float *host = malloc(N * sizeof *host), *back = malloc(N * sizeof *back);
    for (int i = 0; i < N; i++)
        host[i] = (float)(i % 1000) * 0.25f - 7.0f;
    float *a = be->ops->alloc(be->self, N * sizeof(float));
    float *b = be->ops->alloc(be->self, N * sizeof(float));
    be->ops->copy_to_device(be->self, a, host, N * sizeof(float));
    loom_comm_request *r = NULL;
    loom_status st = ops->allreduce_start(w, a, b, N, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r);
    if (st == LOOM_OK)
        st = ops->wait(w, r);
    CHECK(st == LOOM_OK, "allreduce: %s", loom_last_error());
    be->ops->copy_to_host(be->self, back, b, N * sizeof(float));
    CHECK(memcmp(back, host, N * sizeof(float)) == 0, "allreduce over one rank changed values");
    be->ops->zero(be->self, b, N * sizeof(float));
    st = ops->allgather_start(w, a, b, N, LOOM_DTYPE_F32, &r);
    if (st == LOOM_OK)
        st = ops->wait(w, r);
    CHECK(st == LOOM_OK, "allgather: %s", loom_last_error());
    be->ops->copy_to_host(be->self, back, b, N * sizeof(float));
    CHECK(memcmp(back, host, N * sizeof(float)) == 0, "allgather over one rank changed values");
    be->ops->free(be->self, a);
    be->ops->free(be->self, b);
    free(host);
    free(back);
}

#ifdef LOOM_TEST_CUDART
static atomic_int release;

static void CUDART_CB hold(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 1000000};
    while (!atomic_load(&release))
        nanosleep(&ts, NULL);
}

/* The device world waits on the backend's stream (see the opening comment). */
static void ordering_check(loom_backend *be)
{
    const loom_comm_ops *ops;
    void *w = loom_dist_device_world(&ops);
    cudaStream_t s = be->ops->stream(be->self);
    float *a = be->ops->alloc(be->self, 1024 * sizeof(float));
    float *b = be->ops->alloc(be->self, 1024 * sizeof(float));
    atomic_store(&release, 0);
    CHECK(cudaLaunchHostFunc(s, hold, NULL) == cudaSuccess, "cudaLaunchHostFunc");
    loom_comm_request *r = NULL;
    loom_status st = ops->allreduce_start(w, a, b, 1024, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r);
    CHECK(st == LOOM_OK, "allreduce_start: %s", loom_last_error());
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
    int done = st == LOOM_OK ? ops->test(w, r) : -1;
    atomic_store(&release, 1);
    CHECK(done == 0, "the all-reduce completed while the backend's stream was held: the device "
          "communicator is not ordered after the backend's kernels (test() = %d)", done);
    if (st == LOOM_OK)
        CHECK(ops->wait(w, r) == LOOM_OK, "wait after release: %s", loom_last_error());
    cudaStreamSynchronize(s);
    be->ops->free(be->self, a);
    be->ops->free(be->self, b);
    printf("nccl: an all-reduce started behind a held backend stream waited for it\n");
}
#endif

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: test_cuda_dist BACKEND COMM\n");
        return 2;
    }
    const char *backend = argv[1], *comm = argv[2];
    int nccl = strcmp(comm, "nccl") == 0;
    static mem_store ms;
    loom_store store = mem_store_open(&ms);
    loom_mesh mesh;
    if (loom_mesh_make(0, 1, 1, 1, 1, &mesh) != LOOM_OK)
        return 1;

    /* a host comm takes no host_comm beside it */
    CHECK(loom_dist_init("shm", "mpi", &store, 0, 1, &mesh, 2000, 0) == LOOM_ERR_INVALID &&
              strstr(loom_last_error(), "leave host_comm out"),
          "host_comm beside shm: %s", loom_last_error());
    /* nor device_wait: a host comm's waits always block the host */
    loom_dist_set_device_wait(1);
    CHECK(loom_dist_init("shm", NULL, &store, 0, 1, &mesh, 2000, 0) == LOOM_ERR_INVALID &&
              strstr(loom_last_error(), "leave device_wait out"),
          "device_wait beside shm: %s", loom_last_error());
    loom_dist_set_device_wait(-1);

    /* the backend first: CUDA after the comm's probe is fine either way; a missing GPU skips */
    loom_backend be;
    if (loom_backend_open(backend, 1, &be) != LOOM_OK) {
        char why[512];
        snprintf(why, sizeof why, "backend %s: %s", backend, loom_last_error());
        return unusable(loom_last_error()) ? skip(why) : (fprintf(stderr, "%s\n", why), 1);
    }
    if (loom_dist_init(comm, NULL, &store, 0, 1, &mesh, 5000, 0) != LOOM_OK) {
        char why[512];
        snprintf(why, sizeof why, "comm %s: %s", comm, loom_last_error());
        loom_backend_close(&be);
        return unusable(loom_last_error()) ? skip(why) : (fprintf(stderr, "%s\n", why), 1);
    }
    CHECK(loom_dist_device_kind() == NULL, "a device kind before any open");
    for (int round = 0; round < 2; round++) { /* open, use, close; then again */
        loom_status st = loom_dist_device_open(&be);
        CHECK(st == LOOM_OK, "loom_dist_device_open: %s", loom_last_error());
        if (st != LOOM_OK)
            break;
        const char *kind = loom_dist_device_kind();
        const char *want = nccl ? "nccl on the backend's stream, host buffers over shm"
                                : "staged through host memory";
        CHECK(kind && strstr(kind, want), "device kind \"%s\", want \"%s\"", kind ? kind : "(null)",
              want);
        if (round == 0) {
            printf("device groups: %s\n", kind ? kind : "(none)");
            CHECK(loom_dist_device_open(&be) == LOOM_ERR_UNSUPPORTED &&
                      strstr(loom_last_error(), "one device session at a time"),
                  "second open: %s", loom_last_error());
        }
        const loom_comm_ops *hops, *dops;
        void *hw = loom_dist_world(&hops), *dw = loom_dist_device_world(&dops);
        /* nccl's groups go through the flight recorder as the host ones do; staged: its own */
        CHECK(hops && dops && hw != dw && (nccl ? dops == loom_flight_ops() : hops != dops),
              "the device world's ops: not the flight recorder's (nccl) or the host's (staged)");
        identity_checks(&be);
        if (nccl) { /* the device world's last operation is in the ring, on its own group */
            static flight_entry ring[LOOM_FLIGHT_ENTRIES];
            int n = loom_flight_snapshot(ring);
            CHECK(n > 0 && strcmp(ring[n - 1].group, "nccl-world") == 0,
                  "the newest flight entry is on group %s, want nccl-world",
                  n > 0 ? ring[n - 1].group : "(none)");
        }
#ifdef LOOM_TEST_CUDART
        if (nccl && round == 0)
            ordering_check(&be);
#endif
        loom_dist_device_close();
        CHECK(loom_dist_device_kind() == NULL, "a device kind after close");
    }
    loom_dist_shutdown();
    loom_backend_close(&be);
    if (failures)
        return 1;
    printf("test_cuda_dist %s %s: all checks passed\n", backend, comm);
    return 0;
}
