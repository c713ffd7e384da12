/* bench_comm.c — communicator bandwidth, printed like nccl-tests: for each message size,
 * the element count, the time per operation (us, the slowest rank's average), algbw (size /
 * time) and busbw (the bandwidth each rank's links would need: allreduce algbw*2(n-1)/n;
 * reduce_scatter, allgather and alltoall algbw*(n-1)/n; broadcast algbw). Size is the
 * larger buffer, as in nccl-tests (allgather: the gathered output; reduce_scatter and
 * alltoall: the full input).
 *
 *   bench_comm [-n RANKS] [--op allreduce|reduce_scatter|allgather|broadcast|alltoall]
 *              [--dtype f32|bf16|f16|i32|u8] [--min BYTES] [--max BYTES] [--iters N]
 *              [--plugin NAME] [key=value ...]    (plugin config, e.g. chunk_bytes=262144)
 *
 * What not: not a test (no assertions; correctness is tests/comm), not `loom bench comm`
 * (which will wrap this). Ranks are forked on this machine through comm_harness.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_harness.h"
#include "base/status.h"

typedef struct bench {
    const char *op;
    loom_dtype dt;
    size_t min, max;
    int iters; /* 0: automatic */
} bench;

static size_t es_of(loom_dtype dt)
{
    return dt == LOOM_DTYPE_F32 || dt == LOOM_DTYPE_I32 ? 4 : dt == LOOM_DTYPE_U8 ? 1 : 2;
}

static loom_status start(th_rank *t, const bench *b, void *send, void *recv, size_t count,
                         loom_comm_request **r)
{
    const loom_comm_ops *o = t->ops;
    if (strcmp(b->op, "allreduce") == 0)
        return o->allreduce_start(t->comm, send, recv, count, b->dt, LOOM_REDUCE_SUM, r);
    if (strcmp(b->op, "reduce_scatter") == 0)
        return o->reduce_scatter_start(t->comm, send, recv, count, b->dt, LOOM_REDUCE_SUM, r);
    if (strcmp(b->op, "allgather") == 0)
        return o->allgather_start(t->comm, send, recv, count, b->dt, r);
    if (strcmp(b->op, "broadcast") == 0)
        return o->broadcast_start(t->comm, send, count, b->dt, 0, r);
    return o->alltoall_start(t->comm, send, recv, count, b->dt, r);
}

static int run_rank(th_rank *t)
{
    const bench *b = t->arg;
    const int n = t->world;
    const size_t es = es_of(b->dt);
    int blocked = strcmp(b->op, "allreduce") != 0 && strcmp(b->op, "broadcast") != 0;
    double busf = strcmp(b->op, "allreduce") == 0 ? 2.0 * (n - 1) / n
                : strcmp(b->op, "broadcast") == 0 ? 1.0 : (double)(n - 1) / n;
    unsigned char *send = malloc(b->max + 64), *recv = malloc(b->max + 64);
    if (send == NULL || recv == NULL)
        return th_fail(t, "out of memory for %zu-byte buffers", b->max);
    memset(send, 1, b->max + 64);
    memset(recv, 0, b->max + 64);
    if (t->rank == 0) {
        printf("# loom-comm-shm %s, %s, %d ranks\n", b->op,
               b->dt == LOOM_DTYPE_F32 ? "f32" : b->dt == LOOM_DTYPE_BF16 ? "bf16" : "other", n);
        printf("# %12s %12s %12s %10s %10s\n", "size(B)", "count", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)");
    }
    for (size_t size = b->min; size <= b->max; size *= 2) {
        size_t count = size / es / (blocked ? (size_t)n : 1);
        if (count == 0)
            continue;
        int iters = b->iters > 0 ? b->iters : (int)(((size_t)256 << 20) / size);
        iters = iters < 5 ? 5 : iters > 500 ? 500 : iters;
        loom_comm_request *r;
        double t0 = 0;
        for (int it = -2; it < iters; it++) { /* two warm-up rounds */
            if (it == 0) {
                if (t->ops->barrier_start(t->comm, &r) || t->ops->wait(t->comm, r))
                    return th_fail(t, "barrier: %s", loom_last_error());
                t0 = th_seconds();
            }
            if (start(t, b, send, recv, count, &r) || t->ops->wait(t->comm, r))
                return th_fail(t, "%s: %s", b->op, loom_last_error());
        }
        float mine = (float)((th_seconds() - t0) / iters), slowest = 0;
        if (t->ops->allreduce_start(t->comm, &mine, &slowest, 1, LOOM_DTYPE_F32, LOOM_REDUCE_MAX, &r) ||
            t->ops->wait(t->comm, r))
            return th_fail(t, "allreduce of times: %s", loom_last_error());
        if (t->rank == 0) {
            size_t bytes = count * es * (blocked ? (size_t)n : 1);
            double algbw = (double)bytes / slowest / 1e9;
            printf("  %12zu %12zu %12.1f %10.2f %10.2f\n", bytes, count * (blocked ? (size_t)n : 1),
                   slowest * 1e6, algbw, algbw * busf);
            fflush(stdout);
        }
    }
    free(send);
    free(recv);
    return 0;
}

static size_t parse_size(const char *s)
{
    char *e;
    double v = strtod(s, &e);
    if (*e == 'K' || *e == 'k') v *= 1024;
    else if (*e == 'M' || *e == 'm') v *= 1048576;
    else if (*e == 'G' || *e == 'g') v *= 1073741824.0;
    return (size_t)v;
}

int main(int argc, char **argv)
{
    bench b = {.op = "allreduce", .dt = LOOM_DTYPE_F32, .min = 1024, .max = 64u << 20};
    int world = 2;
    const char *plugin = "shm";
    const char *cfg[16] = {NULL};
    int ncfg = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(a, "-n") == 0) world = atoi(v), i++;
        else if (strcmp(a, "--op") == 0) b.op = v, i++;
        else if (strcmp(a, "--min") == 0) b.min = parse_size(v), i++;
        else if (strcmp(a, "--max") == 0) b.max = parse_size(v), i++;
        else if (strcmp(a, "--iters") == 0) b.iters = atoi(v), i++;
        else if (strcmp(a, "--plugin") == 0) plugin = v, i++;
        else if (strcmp(a, "--dtype") == 0) {
            static const char *const names[] = {"f32", "bf16", "f16", "i32", "u8"};
            int d = -1;
            for (int k = 0; k < 5; k++)
                if (strcmp(v, names[k]) == 0) d = k;
            if (d < 0) { fprintf(stderr, "bench_comm: unknown dtype '%s'\n", v); return 2; }
            b.dt = (loom_dtype)d;
            i++;
        } else if (strchr(a, '=') != NULL && ncfg < 15) cfg[ncfg++] = a;
        else {
            fprintf(stderr, "usage: bench_comm [-n RANKS] [--op allreduce|reduce_scatter|allgather|"
                    "broadcast|alltoall] [--dtype f32|bf16|f16|i32|u8] [--min BYTES] [--max BYTES] "
                    "[--iters N] [--plugin NAME] [key=value ...]\n");
            return 2;
        }
    }
    static const char *const ops[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "alltoall"};
    int known = 0;
    for (int k = 0; k < 5; k++)
        known |= strcmp(b.op, ops[k]) == 0;
    if (!known || world < 1 || world > TH_MAX_RANKS || b.min < 1 || b.min > b.max) {
        fprintf(stderr, "bench_comm: need a known --op, 1 <= -n <= %d and 1 <= --min <= --max\n",
                TH_MAX_RANKS);
        return 2;
    }
    th_env env;
    char err[1024];
    if (!th_load(&env, plugin, err, sizeof err)) {
        fprintf(stderr, "bench_comm: %s\n", err);
        return 1;
    }
    th_opts o = {.world = world, .timeout_ms = 60000, .cfg = cfg, .limit_s = 3600};
    th_result res;
    if (!th_run(&env, &o, run_rank, &b, &res)) {
        fprintf(stderr, "bench_comm: %s", th_summary(&res));
        return 1;
    }
    return 0;
}
