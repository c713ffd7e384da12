/* test_flight.c — the core's flight recorder in front of loom-comm-shm, across 4 forked
 * ranks (comm_harness):
 *  - a rank dying (LOOM_INJECT_DIE: exit, SIGKILL, SIGSEGV) at its 2nd operation of one
 *    kind (allreduce, reduce_scatter, allgather, broadcast, alltoall, alltoallv, barrier,
 *    send/recv): every other rank fails within 30 s, its error naming the dead rank, and
 *    leaves its dump (flight-rank<R>.txt);
 *  - a stuck rank (SIGSTOP): every other rank's error names it;
 *  - a cycle of receives (2 ranks, both alive, each receiving first): each names the
 *    other as never having reached its matching send, and where the other is instead;
 *  - debug_desync: one rank issuing a broadcast where the others issue an allreduce stops
 *    every rank at that collective, naming both ranks and both operations;
 *  - a malformed LOOM_INJECT_DIE is refused by name;
 *  - a device group (loom_flight_wrap_device) beside the host one, over a stand-in for
 *    NCCL that carries only its rank's "device" arena (any other pointer refused, as NCCL
 *    refuses host memory) through the host group's shm communicator: debug_desync's
 *    descriptors go over the host group and name a mismatched device collective; a rank
 *    dying in a device collective is named, with the device group; 40 opens and closes of
 *    the device group (more than the recorder's 32 slots) reuse its slot.
 *    What that stand-in is not: NCCL (no device, no stream, no NCCL timeout and abort).
 * `test_flight` runs a fixed sample of the die matrix (each kind once, modes and victims
 * rotating: 8 of the 96 cases); `test_flight --full` runs all 8 kinds x 3 modes x 4 ranks
 * (scripts/fault-matrix). Prints the figure: cases tried / handled.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "comm_harness.h"
#include "base/status.h"
#include "dist/flight.h"

enum { WORLD = 4, TIMEOUT_MS = 600, N = 64 };

static const char *const kinds[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                    "alltoall",  "alltoallv",      "barrier",   "send"};
enum { N_KINDS = sizeof kinds / sizeof kinds[0] };
static const char *const modes[] = {"exit", "kill", "segv"};

typedef struct plan {
    char spec[64];     /* LOOM_INJECT_DIE, or "" */
    int desync_rank;   /* this rank issues a broadcast for the 2nd allreduce; -1: none */
    char dir[256];
} plan;

/* One operation of kind k on the wrapped world. */
static loom_status one_op(const loom_comm_ops *o, void *c, int k, int rank, int desync)
{
    static float x[WORLD * N], y[WORLD * N];
    size_t counts[WORLD], displs[WORLD];
    for (int i = 0; i < WORLD; i++) {
        counts[i] = N;
        displs[i] = (size_t)i * N;
    }
    loom_comm_request *r = NULL, *r2 = NULL;
    loom_status st;
    const char *kind = kinds[k];
    if (desync)
        st = o->broadcast_start(c, x, N, LOOM_DTYPE_F32, 0, &r);
    else if (!strcmp(kind, "allreduce"))
        st = o->allreduce_start(c, x, y, N, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r);
    else if (!strcmp(kind, "reduce_scatter"))
        st = o->reduce_scatter_start(c, x, y, N, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r);
    else if (!strcmp(kind, "allgather"))
        st = o->allgather_start(c, x, y, N, LOOM_DTYPE_F32, &r);
    else if (!strcmp(kind, "broadcast"))
        st = o->broadcast_start(c, x, N, LOOM_DTYPE_F32, 0, &r);
    else if (!strcmp(kind, "alltoall"))
        st = o->alltoall_start(c, x, y, N, LOOM_DTYPE_F32, &r);
    else if (!strcmp(kind, "alltoallv"))
        st = o->alltoallv_start(c, x, counts, displs, y, counts, displs, LOOM_DTYPE_F32, &r);
    else if (!strcmp(kind, "barrier"))
        st = o->barrier_start(c, &r);
    else { /* a ring: send to the next rank, receive from the previous one */
        st = o->send_start(c, x, N, LOOM_DTYPE_F32, (rank + 1) % WORLD, &r);
        if (st == LOOM_OK)
            st = o->recv_start(c, y, N, LOOM_DTYPE_F32, (rank + WORLD - 1) % WORLD, &r2);
        if (st == LOOM_OK)
            st = o->wait(c, r2);
    }
    if (st == LOOM_OK)
        st = o->wait(c, r);
    return st;
}

/* Does the flight verdict in msg list rank v among the ranks that left no dump? */
static int names_rank(const char *msg, int v)
{
    const char *p = strstr(msg, "flight recorder: rank");
    const char *end = p ? strstr(p, " left no dump") : NULL;
    if (!p || !end)
        return 0;
    p += strlen("flight recorder: rank");
    if (*p == 's')
        p++;
    while (p < end) {
        char *q;
        long r = strtol(p, &q, 10);
        if (q == p)
            return 0;
        if (r == v)
            return 1;
        p = q;
        while (p < end && (*p == ',' || *p == ' '))
            p++;
    }
    return 0;
}

/* The plan's injection and debug mode, then the recorder's setup; 0 after th_fail. */
static int arm(th_rank *t, const plan *pl)
{
    if (pl->spec[0])
        setenv("LOOM_INJECT_DIE", pl->spec, 1);
    else
        unsetenv("LOOM_INJECT_DIE");
    if (loom_flight_setup(t->rank, WORLD, pl->dir, pl->desync_rank >= 0, TIMEOUT_MS) != LOOM_OK)
        return !th_fail(t, "setup: %s", loom_last_error());
    return 1;
}

static int rank_fn(th_rank *t)
{
    plan *pl = t->arg;
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core); /* a SIGSEGV case leaves no core file */
    if (!arm(t, pl))
        return 1;
    int members[WORLD] = {0, 1, 2, 3};
    void *c = NULL;
    if (loom_flight_wrap(t->ops, t->comm, "world", members, WORLD, &c) != LOOM_OK)
        return th_fail(t, "wrap: %s", loom_last_error());
    t->comm = NULL; /* the wrapper owns it */
    const loom_comm_ops *o = loom_flight_ops();
    double t0 = th_seconds();
    loom_status st = LOOM_OK;
    for (int round = 0; round < 3 && st == LOOM_OK; round++)
        for (int k = 0; k < N_KINDS && st == LOOM_OK; k++)
            st = one_op(o, c, k, t->rank,
                        round == 1 && k == 0 && t->rank == pl->desync_rank);
    double dt = th_seconds() - t0;
    snprintf(t->err, t->cap, "%s", st == LOOM_OK ? "" : loom_last_error());
    o->destroy(c);
    if (st == LOOM_OK)
        return th_fail(t, "every operation succeeded; the injection did not fire");
    if (dt > 30)
        return th_fail(t, "out after %.1f s, more than 30 s: %s", dt, loom_last_error());
    return 0;
}

static int run_case(const th_env *env, plan *pl, int victim, int stuck, char *why, size_t cap)
{
    char tmpl[] = "/tmp/loom-flight-XXXXXX";
    if (!mkdtemp(tmpl)) {
        snprintf(why, cap, "mkdtemp failed");
        return 0;
    }
    snprintf(pl->dir, sizeof pl->dir, "%s", tmpl);
    th_opts o = {.world = WORLD, .timeout_ms = TIMEOUT_MS, .limit_s = stuck ? 2.5 : 30};
    th_result res;
    th_run(env, &o, rank_fn, pl, &res);
    int ok = 1;
    why[0] = '\0';
    for (int r = 0; r < WORLD && ok; r++) {
        if (r == victim) {
            if (!stuck && res.exited[r] && res.code[r] == 0)
                ok = 0, snprintf(why, cap, "rank %d should have died: %s", r, th_summary(&res));
            continue;
        }
        char dump[400];
        snprintf(dump, sizeof dump, "%s/flight-rank%d.txt", pl->dir, r);
        if (!res.exited[r] || res.code[r] != 0)
            ok = 0, snprintf(why, cap, "%s", th_summary(&res));
        else if (victim >= 0 && !names_rank(res.msg[r], victim))
            ok = 0, snprintf(why, cap, "rank %d's error does not name rank %d: %s", r, victim,
                             res.msg[r]);
        else if (victim >= 0 && access(dump, R_OK) != 0)
            ok = 0, snprintf(why, cap, "rank %d left no dump %s", r, dump);
    }
    if (ok && victim < 0)
        for (int r = 0; r < WORLD && ok; r++)
            if (!strstr(res.msg[r], "desync on group world: rank 0 issued allreduce #8 (256 bytes) "
                                    "but rank 2 issued broadcast #8 (256 bytes, root 0)"))
                ok = 0, snprintf(why, cap, "rank %d: %s", r, res.msg[r]);
    if (ok)
        snprintf(why, cap, "%.1500s", res.msg[victim == 0 ? 1 : 0]);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", pl->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", pl->dir);
    return ok;
}

/* Two ranks of a group "pp" that each receive from the other first: both time out,
 * both dump, and each verdict reads the other's ring. */
static int recv_first(th_rank *t)
{
    plan *pl = t->arg;
    unsetenv("LOOM_INJECT_DIE");
    /* the flight timeout sets the grace for the other's dump: long, as the ranks of a
     * loaded machine time out at different moments; it ends once the dump is there */
    if (loom_flight_setup(t->rank, 2, pl->dir, 0, 8000) != LOOM_OK)
        return th_fail(t, "setup: %s", loom_last_error());
    int members[2] = {0, 1};
    void *c = NULL;
    if (loom_flight_wrap(t->ops, t->comm, "pp", members, 2, &c) != LOOM_OK)
        return th_fail(t, "wrap: %s", loom_last_error());
    t->comm = NULL;
    const loom_comm_ops *o = loom_flight_ops();
    float x[N];
    loom_comm_request *r = NULL;
    loom_status st = o->recv_start(c, x, N, LOOM_DTYPE_F32, 1 - t->rank, &r);
    if (st == LOOM_OK)
        st = o->wait(c, r);
    snprintf(t->err, t->cap, "%s", st == LOOM_OK ? "" : loom_last_error());
    o->destroy(c);
    return st == LOOM_OK ? th_fail(t, "the recv completed: nobody sent") : 0;
}

static int run_recv_first(const th_env *env, char *why, size_t cap)
{
    plan pl = {.desync_rank = -1};
    char tmpl[] = "/tmp/loom-flight-XXXXXX";
    if (!mkdtemp(tmpl)) {
        snprintf(why, cap, "mkdtemp failed");
        return 0;
    }
    snprintf(pl.dir, sizeof pl.dir, "%s", tmpl);
    th_opts o = {.world = 2, .timeout_ms = TIMEOUT_MS, .limit_s = 30};
    th_result res;
    int ok = th_run(env, &o, recv_first, &pl, &res);
    if (!ok)
        snprintf(why, cap, "%s", th_summary(&res));
    for (int r = 0; r < 2 && ok; r++) {
        char want[200];
        snprintf(want, sizeof want, "flight recorder: rank %d never reached send #1 to rank %d "
                 "on pp: it is in recv #1 on pp; rank %d waited in its recv #1 from rank %d",
                 1 - r, r, r, 1 - r);
        if (!strstr(res.msg[r], want))
            ok = 0, snprintf(why, cap, "rank %d's error lacks '%s': %s", r, want, res.msg[r]);
    }
    if (ok)
        snprintf(why, cap, "%.1500s", res.msg[0]);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", pl.dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", pl.dir);
    return ok;
}

/* ---- a device group beside the host one ---------------------------------------------- */

static float arena[2 * WORLD * N]; /* this rank's "device memory" */
static const loom_comm_ops *sd_host_ops;
static void *sd_host;              /* the host group's shm communicator, which carries it */

static int on_device(const void *p)
{
    const char *c = p, *a = (const char *)arena;
    return p == NULL || (c >= a && c < a + sizeof arena);
}

#define DEVICE_ONLY(p)                                                                       \
    do {                                                                                     \
        if (!on_device(p))                                                                   \
            return loom_fail(LOOM_ERR_INVALID, "stand-in device comm: buffer %p is not "     \
                             "device memory", (const void *)(p));                            \
    } while (0)

static loom_status sd_allreduce(void *self, const void *s, void *r, size_t n, loom_dtype dt,
                                loom_reduce_op op, loom_comm_request **req)
{
    (void)self;
    DEVICE_ONLY(s);
    DEVICE_ONLY(r);
    return sd_host_ops->allreduce_start(sd_host, s, r, n, dt, op, req);
}

static loom_status sd_allgather(void *self, const void *s, void *r, size_t n, loom_dtype dt,
                                loom_comm_request **req)
{
    (void)self;
    DEVICE_ONLY(s);
    DEVICE_ONLY(r);
    return sd_host_ops->allgather_start(sd_host, s, r, n, dt, req);
}

static loom_status sd_broadcast(void *self, void *buf, size_t n, loom_dtype dt, int root,
                                loom_comm_request **req)
{
    (void)self;
    DEVICE_ONLY(buf);
    return sd_host_ops->broadcast_start(sd_host, buf, n, dt, root, req);
}

static loom_status sd_wait(void *self, loom_comm_request *r)
{
    (void)self;
    return sd_host_ops->wait(sd_host, r);
}

static int sd_test(void *self, loom_comm_request *r)
{
    (void)self;
    return sd_host_ops->test(sd_host, r);
}

static int sd_rank(void *self) { (void)self; return sd_host_ops->rank(sd_host); }
static int sd_world(void *self) { (void)self; return sd_host_ops->world(sd_host); }
static void sd_destroy(void *self) { (void)self; } /* the host group owns sd_host */

static const loom_comm_ops standin_ops = {
    .size = sizeof(loom_comm_ops),
    .destroy = sd_destroy,
    .rank = sd_rank,
    .world = sd_world,
    .allreduce_start = sd_allreduce,
    .allgather_start = sd_allgather,
    .broadcast_start = sd_broadcast,
    .wait = sd_wait,
    .test = sd_test,
    .flags = LOOM_COMM_DEVICE_MEMORY,
};

/* Three rounds of (an allreduce on the device group, then one on the host group); rank
 * desync_rank broadcasts on the device group in round 1 instead. */
static int device_fn(th_rank *t)
{
    plan *pl = t->arg;
    if (!arm(t, pl))
        return 1;
    int members[WORLD] = {0, 1, 2, 3};
    void *host = NULL, *dev = NULL, *token = &sd_host;
    sd_host_ops = t->ops;
    sd_host = t->comm;
    if (loom_flight_wrap(t->ops, t->comm, "world", members, WORLD, &host) != LOOM_OK)
        return th_fail(t, "wrap: %s", loom_last_error());
    t->comm = NULL;
    const loom_comm_ops *o = loom_flight_ops();
    for (int i = 0; i < 40; i++) { /* a device session opened and closed again and again */
        if (loom_flight_wrap_device(&standin_ops, token, "nccl-world", members, WORLD, host,
                                    &dev) != LOOM_OK)
            return th_fail(t, "wrap_device #%d: %s", i + 1, loom_last_error());
        if (i < 39)
            o->destroy(dev);
    }
    static float hx[N], hy[N];
    float *dx = arena, *dy = arena + WORLD * N;
    loom_status st = LOOM_OK;
    for (int round = 0; round < 3 && st == LOOM_OK; round++) {
        loom_comm_request *r = NULL;
        if (round == 1 && t->rank == pl->desync_rank)
            st = o->broadcast_start(dev, dx, N, LOOM_DTYPE_F32, 0, &r);
        else
            st = o->allreduce_start(dev, dx, dy, N, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r);
        if (st == LOOM_OK)
            st = o->wait(dev, r);
        if (st == LOOM_OK)
            st = o->allreduce_start(host, hx, hy, N, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r);
        if (st == LOOM_OK)
            st = o->wait(host, r);
    }
    snprintf(t->err, t->cap, "%s", st == LOOM_OK ? "" : loom_last_error());
    o->destroy(dev);
    o->destroy(host);
    return st == LOOM_OK ? th_fail(t, "every operation succeeded; nothing was injected") : 0;
}

/* victim >= 0: that rank dies at its 3rd allreduce (round 1's on the device group);
 * else rank 2 desyncs there. */
static int run_device_case(const th_env *env, int victim, char *why, size_t cap)
{
    plan pl = {.desync_rank = victim >= 0 ? -1 : 2};
    if (victim >= 0)
        snprintf(pl.spec, sizeof pl.spec, "%d:allreduce:3:exit", victim);
    char tmpl[] = "/tmp/loom-flight-XXXXXX";
    if (!mkdtemp(tmpl)) {
        snprintf(why, cap, "mkdtemp failed");
        return 0;
    }
    snprintf(pl.dir, sizeof pl.dir, "%s", tmpl);
    th_opts o = {.world = WORLD, .timeout_ms = TIMEOUT_MS, .limit_s = 30};
    th_result res;
    th_run(env, &o, device_fn, &pl, &res);
    int ok = 1;
    why[0] = '\0';
    for (int r = 0; r < WORLD && ok; r++) {
        if (r == victim)
            continue;
        const char *want = victim >= 0 ? "never completed allreduce #2 on nccl-world"
                                       : "desync on group nccl-world: rank 0 issued allreduce #2 "
                                         "(256 bytes) but rank 2 issued broadcast #2 (256 bytes, "
                                         "root 0)";
        if (!res.exited[r] || res.code[r] != 0)
            ok = 0, snprintf(why, cap, "%s", th_summary(&res));
        else if (!strstr(res.msg[r], want) || (victim >= 0 && !names_rank(res.msg[r], victim)))
            ok = 0, snprintf(why, cap, "rank %d's error lacks '%s' (or rank %d): %s", r, want,
                             victim, res.msg[r]);
    }
    if (ok)
        snprintf(why, cap, "%.1500s", res.msg[victim == 0 ? 1 : 0]);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", pl.dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", pl.dir);
    return ok;
}

int main(int argc, char **argv)
{
    int full = argc > 1 && strcmp(argv[1], "--full") == 0;
    th_env env;
    char err[512];
    if (!th_load(&env, "shm", err, sizeof err)) {
        fprintf(stderr, "load shm: %s\n", err);
        return 1;
    }
    int tried = 0, handled = 0;
    double t0 = th_seconds();
    for (int k = 0; k < N_KINDS; k++)
        for (int m = 0; m < 3; m++)
            for (int v = 0; v < WORLD; v++) {
                if (!full && (m != k % 3 || v != (k + k / 3) % WORLD))
                    continue;
                plan pl = {.desync_rank = -1};
                snprintf(pl.spec, sizeof pl.spec, "%d:%s:2:%s", v, kinds[k], modes[m]);
                char why[2048];
                tried++;
                int ok = run_case(&env, &pl, v, 0, why, sizeof why);
                handled += ok;
                printf("%s %s: %s\n", ok ? "ok" : "FAIL", pl.spec, why);
            }
    /* A stuck rank. */
    plan stop = {.desync_rank = -1};
    snprintf(stop.spec, sizeof stop.spec, "1:allgather:2:stop");
    char why[2048];
    tried++;
    int ok = run_case(&env, &stop, 1, 1, why, sizeof why);
    handled += ok;
    printf("%s %s (stuck rank): %s\n", ok ? "ok" : "FAIL", stop.spec, why);
    /* A cycle of receives, both ranks alive. */
    tried++;
    ok = run_recv_first(&env, why, sizeof why);
    handled += ok;
    printf("%s a cycle of receives (2 ranks, each receiving first): %s\n", ok ? "ok" : "FAIL", why);
    /* Desync, caught by the core's check. */
    plan ds = {.desync_rank = 2};
    tried++;
    ok = run_case(&env, &ds, -1, 0, why, sizeof why);
    handled += ok;
    printf("%s debug_desync (rank 2 broadcasts where the others allreduce): %s\n",
           ok ? "ok" : "FAIL", why);
    /* A device group beside the host one: desync over the host group, a dead rank named. */
    tried++;
    ok = run_device_case(&env, -1, why, sizeof why);
    handled += ok;
    printf("%s device group, debug_desync (rank 2 broadcasts where the others allreduce): %s\n",
           ok ? "ok" : "FAIL", why);
    tried++;
    ok = run_device_case(&env, 1, why, sizeof why);
    handled += ok;
    printf("%s device group, rank 1 dying in its allreduce: %s\n", ok ? "ok" : "FAIL", why);
    /* A malformed injection is refused by name. */
    setenv("LOOM_INJECT_DIE", "1:allreduce:0:kill", 1);
    tried++;
    if (loom_flight_setup(1, WORLD, "/tmp", 0, 1000) == LOOM_ERR_INVALID &&
        strstr(loom_last_error(), "N \"0\" is not an integer >= 1")) {
        handled++;
        printf("ok malformed LOOM_INJECT_DIE refused: %s\n", loom_last_error());
    } else
        printf("FAIL malformed LOOM_INJECT_DIE accepted: %s\n", loom_last_error());
    unsetenv("LOOM_INJECT_DIE");
    printf("flight recorder: %d/%d fault cases handled (%s die matrix) in %.1f s\n", handled,
           tried, full ? "full 8 kinds x 3 modes x 4 ranks" : "a fixed sample of the",
           th_seconds() - t0);
    return handled == tried ? 0 : 1;
}
