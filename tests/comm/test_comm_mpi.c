/* test_comm_mpi.c — loom-comm-mpi under mpirun: one process per rank (started by
 * `mpirun -np N test_comm_mpi [mode]`), checked with comm_check against references
 * computed here (sums in rank order, bitwise: the mpi plugin reduces in rank order too).
 *
 * Modes:
 *   full     every op x dtype (x sum/avg/max) at sizes 0, 1, 7, 1000 and 1 MiB+3 on the
 *            world (1 MiB+3 only at 1-3 ranks), then on even/odd groups (split, reverse key
 *            order) at 0, 1, 7, 1000 (and 1 MiB+3 when the world has 4 ranks: two groups of
 *            two; smaller worlds skip it to keep the suite near a minute on 2 cores), then
 *            on a group of one rank (split by rank) at 0, 1, 7, 1000.
 *   timeout  the last rank skips an allreduce: every other rank must get LOOM_ERR_TIMEOUT
 *            within the timeout; it prints "timeout-ok rank R" and destroys its
 *            communicator, which calls MPI_Abort (documented in mpi.c: a stuck MPI
 *            collective cannot be cancelled), so mpirun exits non-zero; mpi_timeout.sh
 *            checks the lines and that nothing hangs.
 *   bench [MIN MAX]  not a check: allreduce f32 sum through the plugin, MIN to MAX bytes
 *            (default 1 KiB to 64 MiB, doubling), printed
 *            like bench_mpi_allreduce (size, count, time us (rank 0's mean), algbw, busbw)
 *            to compare the plugin's rank-order reductions with MPI_Allreduce.
 * Rank and world come from Open MPI's OMPI_COMM_WORLD_RANK/SIZE (PMI_RANK/PMI_SIZE for
 * MPICH). Exit status 0 only when this rank's checks passed. Does not link MPI itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_check.h"
#include "comm_harness.h"
#include "base/plugin_loader.h"
#include "plugin_test_util.h"

static int env_int(const char *a, const char *b, int dflt)
{
    const char *s = getenv(a);
    if (s == NULL)
        s = getenv(b);
    return s ? atoi(s) : dflt;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "full";
    int rank = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", 0);
    int world = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", 1);
    char err[2048];
    th_env env;
    if (!th_load(&env, "mpi", err, sizeof err)) {
        fprintf(stderr, "rank %d: load: %s\n", rank, err);
        return 1;
    }
    loom_core_host_set_rank(rank, world);
    tcfg cfg;
    if (!tcfg_build(&cfg, env.desc, NULL, 0)) {
        fprintf(stderr, "rank %d: config: %s\n", rank, cfg.err);
        return 1;
    }
    const loom_comm_ops *o = env.ops;
    int timeout_ms = strcmp(mode, "timeout") == 0 ? 1500 : 60000;
    void *comm = NULL;
    if (o->create(loom_core_host(), &cfg.cfg, NULL, rank, world, timeout_ms, NULL, &comm)) {
        fprintf(stderr, "rank %d: create: %s\n", rank, loom_last_error());
        return 1;
    }
    double t0 = now_s();
    int bad = 0;
    if (strcmp(mode, "timeout") == 0) {
        float x[4] = {1, 2, 3, 4}, y[4];
        loom_comm_request *r = NULL;
        if (rank == world - 1) {
            sleep(20); /* the others abort the job long before this */
            o->destroy(comm);
            return 0;
        }
        loom_status st = o->allreduce_start(comm, x, y, 4, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r);
        if (st == LOOM_OK)
            st = o->wait(comm, r);
        double dt = now_s() - t0;
        if (st == LOOM_ERR_TIMEOUT && dt < 1.4 + 5.0 && dt >= 1.4 &&
            strstr(loom_last_error(), "did not complete within 1500 ms") != NULL) {
            printf("timeout-ok rank %d after %.2f s: %s\n", rank, dt, loom_last_error());
        } else {
            printf("timeout-bad rank %d after %.2f s: %s: %s\n", rank, dt,
                   loom_status_name(st), loom_last_error());
        }
        fflush(stdout);
        o->destroy(comm); /* MPI_Abort: the collective is stuck */
        return 1;
    }
    if (strcmp(mode, "bench") == 0) {
        size_t lo = argc > 3 ? strtoull(argv[2], NULL, 10) : 1024,
               hi = argc > 3 ? strtoull(argv[3], NULL, 10) : 64u << 20;
        lo = lo < 4 ? 4 : lo;
        float *a = calloc(hi / 4, 4), *b = calloc(hi / 4, 4);
        if (rank == 0)
            printf("# loom-comm-mpi allreduce, %d ranks, f32 sum, time = rank 0's mean\n", world);
        for (size_t bytes = lo; a && b && bytes <= hi && !bad; bytes *= 2) {
            int k = (int)(256.0 * (1 << 20) / (double)bytes);
            k = k < 5 ? 5 : k > 200 ? 200 : k;
            double ts = 0;
            for (int it = -3; it < k && !bad; it++) {
                if (it == 0)
                    ts = now_s();
                loom_comm_request *r = NULL;
                bad = o->allreduce_start(comm, a, b, bytes / 4, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r) ||
                      o->wait(comm, r);
            }
            double t = (now_s() - ts) / k, alg = (double)bytes / t / 1e9;
            if (rank == 0)
                printf("%12zu %12zu %10.1f %8.2f %8.2f\n", bytes, bytes / 4, t * 1e6, alg,
                       alg * 2.0 * (world - 1) / world);
        }
        free(a), free(b);
        if (bad)
            fprintf(stderr, "rank %d: bench: %s\n", rank, loom_last_error());
        o->destroy(comm);
        return bad;
    }
    static const size_t sizes[] = {0, 1, 7, 1000, (1u << 20) + 3};
    const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    /* 4 ranks on 2 cores make each 1 MiB+3 op slow (4 processes taking turns at every
     * round of the collective): at 4 the long messages go over the two groups of two
     * below; the world's own long messages are the 2- and 3-rank runs'. */
    bad = cc_run_all(o, comm, sizes, world == 4 ? n_sizes - 1 : n_sizes, 17u * (unsigned)world,
                     "world", err, sizeof err);
    double t1 = now_s();
    if (!bad && world > 1) {
        void *g = NULL;
        if (o->split(comm, rank % 2, -rank, &g)) {
            snprintf(err, sizeof err, "split: %s", loom_last_error());
            bad = 1;
        } else {
            bad = o->world(g) != (world + (rank % 2 ? 0 : 1)) / 2 ||
                  o->rank(g) != (o->world(g) - 1 - rank / 2);
            if (bad)
                snprintf(err, sizeof err, "split: rank %d of %d in the %s group, want rank %d "
                         "of %d", o->rank(g), o->world(g), rank % 2 ? "odd" : "even",
                         (world + (rank % 2 ? 0 : 1)) / 2 - 1 - rank / 2,
                         (world + (rank % 2 ? 0 : 1)) / 2);
            if (!bad)
                bad = cc_run_all(o, g, sizes, world == 4 ? n_sizes : n_sizes - 1, 5u + (unsigned)(rank % 2),
                                 rank % 2 ? "odd group" : "even group", err, sizeof err);
            o->destroy(g);
        }
        void *solo = NULL;
        if (!bad && o->split(comm, rank, 0, &solo)) {
            snprintf(err, sizeof err, "split (solo): %s", loom_last_error());
            bad = 1;
        } else if (!bad) {
            bad = cc_run_all(o, solo, sizes, 4, 9u, "group of one", err, sizeof err);
            o->destroy(solo);
        }
    }
    o->destroy(comm);
    if (bad)
        fprintf(stderr, "rank %d of %d: FAIL: %s\n", rank, world, err);
    else if (rank == 0)
        printf("world %d: ok (world %.1f s, groups %.1f s)\n", world, t1 - t0, now_s() - t1);
    return bad;
}
