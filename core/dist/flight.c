/* flight.c — the recording communicator, its ring and the die-at-an-operation injection
 * (see flight.h). The report on a failure is flight_report.c; the desync check is
 * flight_desync.c.
 */
#include "flight.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/status.h"

#define MAX_GROUPS 32

typedef struct fl_comm {
    const loom_comm_ops *inner;
    void *self;
    /* Where debug mode's descriptors are all-gathered: the plugin's communicator, or for a
     * device-memory one (nccl, which cannot carry host descriptors) the host group's plugin
     * communicator of the same members; NULL: not checked (a device group's split child). */
    const loom_comm_ops *check_ops;
    void *check_self;
    int slot;                    /* index in groups[] */
    uint64_t *send_seq, *recv_seq; /* per peer, comm size entries */
    int size;
} fl_comm;

/* A request: the plugin's, and where its entry is in the ring. */
struct loom_comm_request {
    loom_comm_request *inner;
    uint64_t id;
    int coll;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static flight_entry ring[LOOM_FLIGHT_ENTRIES];
static uint64_t started; /* operations ever started = the id of the newest */
static flight_group groups[MAX_GROUPS];
static int n_groups;
static int reported;
static flight_settings settings = {.rank = 0, .world = 1, .timeout_ms = 60000, .dir = "."};

/* LOOM_INJECT_DIE, parsed by setup. */
static struct {
    int armed;
    char op[24];
    long n, seen;
    int mode; /* 0 exit, SIGKILL, SIGSEGV, SIGSTOP */
} die;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

const flight_settings *loom_flight_settings(void) { return &settings; }

int loom_flight_groups(const flight_group **out, int cap)
{
    (void)cap;
    *out = groups;
    return n_groups;
}

int loom_flight_snapshot(flight_entry *out)
{
    pthread_mutex_lock(&lock);
    uint64_t n = started < LOOM_FLIGHT_ENTRIES ? started : LOOM_FLIGHT_ENTRIES;
    for (uint64_t i = 0; i < n; i++)
        out[i] = ring[(started - n + i) % LOOM_FLIGHT_ENTRIES];
    pthread_mutex_unlock(&lock);
    return (int)n;
}

/* ---- injection ------------------------------------------------------------------------ */

#define DIE_ENV "LOOM_INJECT_DIE"
#define DIE_FORM DIE_ENV " must be RANK:OP:N:MODE with OP one of allreduce, reduce_scatter, " \
    "allgather, broadcast, alltoall, alltoallv, send, recv, barrier, any; N >= 1; MODE one of " \
    "exit, kill, segv, stop (e.g. 2:allreduce:3:kill)"

static const char *const op_names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                       "alltoall", "alltoallv", "send", "recv", "barrier", "any"};

static loom_status parse_die(const char *spec)
{
    char buf[128], *field[5] = {0};
    if (strlen(spec) >= sizeof buf)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s is too long; " DIE_FORM, DIE_ENV);
    strcpy(buf, spec);
    int n = 0;
    for (char *p = buf, *tok; n < 5 && (tok = strsep(&p, ":")) != NULL;)
        field[n++] = tok;
    if (n != 4)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s=\"%s\" has %d fields; " DIE_FORM, DIE_ENV, spec, n);
    char *end;
    errno = 0;
    long rank = strtol(field[0], &end, 10);
    if (!field[0][0] || *end || errno || rank < 0 || rank >= settings.world)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s=\"%s\": RANK \"%s\" is not a rank of this run (0..%d); "
                  DIE_FORM, DIE_ENV, spec, field[0], settings.world - 1);
    int known = 0;
    for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++)
        known |= strcmp(field[1], op_names[i]) == 0;
    if (!known)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s=\"%s\": OP \"%s\" is unknown; " DIE_FORM, DIE_ENV, spec,
                  field[1]);
    long count = strtol(field[2], &end, 10);
    if (!field[2][0] || *end || errno || count < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s=\"%s\": N \"%s\" is not an integer >= 1; " DIE_FORM,
                  DIE_ENV, spec, field[2]);
    int mode = strcmp(field[3], "exit") == 0   ? 0
             : strcmp(field[3], "kill") == 0   ? SIGKILL
             : strcmp(field[3], "segv") == 0   ? SIGSEGV
             : strcmp(field[3], "stop") == 0   ? SIGSTOP
                                               : -1;
    if (mode < 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s=\"%s\": MODE \"%s\" is unknown; " DIE_FORM, DIE_ENV,
                  spec, field[3]);
    die.armed = rank == settings.rank;
    snprintf(die.op, sizeof die.op, "%s", field[1]);
    die.n = count;
    die.seen = 0;
    die.mode = mode;
    return LOOM_OK;
}

static void maybe_die(const char *op)
{
    if (!die.armed || (strcmp(die.op, "any") != 0 && strcmp(die.op, op) != 0))
        return;
    if (++die.seen != die.n)
        return;
    fprintf(stderr, "loom[%d]: %s: dying at %s #%ld (%s)\n", settings.rank, DIE_ENV, op,
            die.n, die.mode == 0 ? "exit 3" : die.mode == SIGKILL ? "SIGKILL"
                                : die.mode == SIGSEGV ? "SIGSEGV" : "SIGSTOP");
    if (die.mode == 0)
        _exit(3);
    if (die.mode == SIGSTOP) {
        die.armed = 0; /* continued (SIGCONT): carry on */
        raise(SIGSTOP);
        return;
    }
    signal(die.mode, SIG_DFL);
    raise(die.mode);
    _exit(128 + die.mode); /* not reached */
}

loom_status loom_flight_setup(int rank, int world, const char *dir, int debug_desync,
                              int timeout_ms)
{
    settings.rank = rank;
    settings.world = world;
    settings.timeout_ms = timeout_ms;
    const char *env_dir = getenv("LOOM_FLIGHT_DIR");
    const char *d = env_dir && env_dir[0] ? env_dir : dir && dir[0] ? dir : ".";
    if (strlen(d) >= sizeof settings.dir)
        LOOM_FAIL(LOOM_ERR_INVALID, "flight recorder directory '%.200s...' is too long", d);
    snprintf(settings.dir, sizeof settings.dir, "%s", d);
    const char *dd = getenv("LOOM_DEBUG_DESYNC");
    settings.debug_desync = debug_desync || (dd && dd[0] && strcmp(dd, "0") != 0);
    memset(&die, 0, sizeof die);
    for (int i = 0; i < n_groups; i++)
        free(groups[i].members);
    n_groups = 0; /* a new mesh (dist.c destroyed the old one's groups) */
    started = 0;
    memset(ring, 0, sizeof ring);
    reported = 0;
    const char *spec = getenv(DIE_ENV);
    if (spec && spec[0])
        LOOM_TRY(parse_die(spec));
    return LOOM_OK;
}

/* ---- recording ------------------------------------------------------------------------ */

static uint64_t record(fl_comm *c, const char *op, int coll, int peer, size_t bytes)
{
    pthread_mutex_lock(&lock);
    flight_group *g = &groups[c->slot];
    uint64_t seq = coll ? ++g->coll_started
                 : strcmp(op, "send") == 0 ? ++c->send_seq[peer] : ++c->recv_seq[peer];
    uint64_t id = ++started;
    ring[(id - 1) % LOOM_FLIGHT_ENTRIES] = (flight_entry){
        .id = id, .seq = seq, .op = op, .group = g->name, .peer = peer, .coll = coll,
        .state = FLIGHT_STARTED, .bytes = bytes, .t_start = now_s()};
    pthread_mutex_unlock(&lock);
    return id;
}

/* Mark entry id done (when still in the ring); returns a copy of it. */
static flight_entry finish(fl_comm *c, uint64_t id, int coll, loom_status st)
{
    pthread_mutex_lock(&lock);
    flight_entry *e = &ring[(id - 1) % LOOM_FLIGHT_ENTRIES];
    flight_entry copy = {0};
    if (e->id == id) {
        e->state = st == LOOM_OK ? FLIGHT_COMPLETED : FLIGHT_FAILED;
        e->t_end = now_s();
        copy = *e;
    }
    if (coll && st == LOOM_OK)
        groups[c->slot].coll_completed++;
    pthread_mutex_unlock(&lock);
    return copy;
}

/* test() saw entry id done: say so in the ring (a send waited late shows as completed in a
 * dump, not as started); the counts change at its wait. */
static void mark_done(uint64_t id)
{
    pthread_mutex_lock(&lock);
    flight_entry *e = &ring[(id - 1) % LOOM_FLIGHT_ENTRIES];
    if (e->id == id && e->state == FLIGHT_STARTED) {
        e->state = FLIGHT_COMPLETED;
        e->t_end = now_s();
    }
    pthread_mutex_unlock(&lock);
}

/* The first failure of this process that is not a caller's mistake (a timeout, a dead
 * peer, a communicator broken by one) dumps the ring and names who is missing; it comes
 * from a wait, or from a start on a communicator an earlier failure broke. Returns st
 * with the verdict added to the error message. */
static loom_status report(fl_comm *c, const flight_entry *e, loom_status st)
{
    if (st == LOOM_OK || st == LOOM_ERR_INVALID)
        return st;
    pthread_mutex_lock(&lock);
    int first = !reported;
    reported = 1;
    pthread_mutex_unlock(&lock);
    if (!first)
        return st;
    char why[2048], verdict[2048] = "";
    snprintf(why, sizeof why, "%s", loom_last_error());
    loom_flight_report(&groups[c->slot], e->id ? e : NULL, why, verdict, sizeof verdict);
    return loom_fail(st, "%s%s%s", why, verdict[0] ? "; " : "", verdict);
}

/* Start op through the plugin: inject, check (debug mode), record, start. */
#define START(c, name, is_coll, peer, bytes, call)                                                \
    do {                                                                                       \
        maybe_die(name);                                                                       \
        if ((is_coll) && settings.debug_desync && c->check_ops)                                   \
            LOOM_TRY(loom_flight_check_desync(c->check_ops, c->check_self, &groups[c->slot],   \
                                              name, groups[c->slot].coll_started + 1, bytes,   \
                                              peer));                                          \
        loom_comm_request *w = malloc(sizeof *w);                                              \
        if (!w)                                                                                \
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory starting %s", name);                      \
        w->coll = (is_coll);                                                                      \
        w->id = record(c, name, is_coll, peer, bytes);                                            \
        loom_status st_ = (call);                                                              \
        if (st_ != LOOM_OK) {                                                                  \
            flight_entry e_ = finish(c, w->id, is_coll, st_);                                     \
            free(w);                                                                           \
            return report(c, &e_, st_);                                                        \
        }                                                                                      \
        *req = w;                                                                              \
        return LOOM_OK;                                                                        \
    } while (0)

static size_t dt_bytes(size_t count, loom_dtype dt) { return count * loom_dtype_size(dt); }

static loom_status fl_allreduce(void *self, const void *send, void *recv, size_t count,
                                loom_dtype dt, loom_reduce_op op, loom_comm_request **req)
{
    fl_comm *c = self;
    START(c, "allreduce", 1, -1, dt_bytes(count, dt),
          c->inner->allreduce_start(c->self, send, recv, count, dt, op, &w->inner));
}

static loom_status fl_reduce_scatter(void *self, const void *send, void *recv, size_t count,
                                     loom_dtype dt, loom_reduce_op op, loom_comm_request **req)
{
    fl_comm *c = self;
    START(c, "reduce_scatter", 1, -1, dt_bytes(count, dt),
          c->inner->reduce_scatter_start(c->self, send, recv, count, dt, op, &w->inner));
}

static loom_status fl_allgather(void *self, const void *send, void *recv, size_t count,
                                loom_dtype dt, loom_comm_request **req)
{
    fl_comm *c = self;
    START(c, "allgather", 1, -1, dt_bytes(count, dt),
          c->inner->allgather_start(c->self, send, recv, count, dt, &w->inner));
}

static loom_status fl_broadcast(void *self, void *buf, size_t count, loom_dtype dt, int root,
                                loom_comm_request **req)
{
    fl_comm *c = self;
    START(c, "broadcast", 1, root, dt_bytes(count, dt),
          c->inner->broadcast_start(c->self, buf, count, dt, root, &w->inner));
}

static loom_status fl_alltoall(void *self, const void *send, void *recv, size_t count,
                               loom_dtype dt, loom_comm_request **req)
{
    fl_comm *c = self;
    START(c, "alltoall", 1, -1, dt_bytes(count, dt),
          c->inner->alltoall_start(c->self, send, recv, count, dt, &w->inner));
}

static loom_status fl_alltoallv(void *self, const void *send, const size_t *send_counts,
                                const size_t *send_displs, void *recv, const size_t *recv_counts,
                                const size_t *recv_displs, loom_dtype dt, loom_comm_request **req)
{
    fl_comm *c = self;
    size_t total = 0;
    for (int i = 0; send_counts && i < c->size; i++)
        total += send_counts[i];
    START(c, "alltoallv", 1, -1, dt_bytes(total, dt),
          c->inner->alltoallv_start(c->self, send, send_counts, send_displs, recv, recv_counts,
                                    recv_displs, dt, &w->inner));
}

static loom_status check_peer(fl_comm *c, const char *op, int peer)
{
    if (peer < 0 || peer >= c->size)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s: peer %d is not a rank of this group (0..%d)", op, peer,
                  c->size - 1);
    return LOOM_OK;
}

static loom_status fl_send(void *self, const void *buf, size_t count, loom_dtype dt, int peer,
                           loom_comm_request **req)
{
    fl_comm *c = self;
    LOOM_TRY(check_peer(c, "send", peer));
    START(c, "send", 0, peer, dt_bytes(count, dt),
          c->inner->send_start(c->self, buf, count, dt, peer, &w->inner));
}

static loom_status fl_recv(void *self, void *buf, size_t count, loom_dtype dt, int peer,
                           loom_comm_request **req)
{
    fl_comm *c = self;
    LOOM_TRY(check_peer(c, "recv", peer));
    START(c, "recv", 0, peer, dt_bytes(count, dt),
          c->inner->recv_start(c->self, buf, count, dt, peer, &w->inner));
}

static loom_status fl_barrier(void *self, loom_comm_request **req)
{
    fl_comm *c = self;
    START(c, "barrier", 1, -1, 0, c->inner->barrier_start(c->self, &w->inner));
}

static loom_status fl_wait(void *self, loom_comm_request *req)
{
    fl_comm *c = self;
    if (!req)
        return c->inner->wait(c->self, NULL);
    loom_status st = c->inner->wait(c->self, req->inner);
    flight_entry e = finish(c, req->id, req->coll, st);
    free(req);
    return report(c, &e, st);
}

static int fl_test(void *self, loom_comm_request *req)
{
    fl_comm *c = self;
    int done = c->inner->test(c->self, req->inner);
    if (done)
        mark_done(req->id);
    return done;
}

static int fl_rank(void *self) { return ((fl_comm *)self)->inner->rank(((fl_comm *)self)->self); }
static int fl_world(void *self) { return ((fl_comm *)self)->size; }

static void fl_destroy(void *self)
{
    fl_comm *c = self;
    if (!c)
        return;
    c->inner->destroy(c->self);
    pthread_mutex_lock(&lock);
    groups[c->slot].closed = 1; /* its slot may serve a later group (a reopened device group) */
    pthread_mutex_unlock(&lock);
    free(c->send_seq);
    free(c->recv_seq);
    free(c);
}

static loom_status fl_split(void *self, int color, int key, void **out)
{
    fl_comm *c = self;
    void *child = NULL;
    LOOM_TRY(c->inner->split(c->self, color, key, &child));
    LOOM_TRY(loom_flight_wrap(c->inner, child, "split", NULL, 0, out));
    if (c->check_ops != c->inner) { /* a device group's child has no host group beside it */
        ((fl_comm *)*out)->check_ops = NULL;
        ((fl_comm *)*out)->check_self = NULL;
    }
    return LOOM_OK;
}

static const loom_comm_ops flight_ops = {
    .size = sizeof(loom_comm_ops),
    .create = NULL, /* wrapped communicators come from loom_flight_wrap */
    .destroy = fl_destroy,
    .rank = fl_rank,
    .world = fl_world,
    .split = fl_split,
    .allreduce_start = fl_allreduce,
    .reduce_scatter_start = fl_reduce_scatter,
    .allgather_start = fl_allgather,
    .broadcast_start = fl_broadcast,
    .alltoall_start = fl_alltoall,
    .alltoallv_start = fl_alltoallv,
    .send_start = fl_send,
    .recv_start = fl_recv,
    .barrier_start = fl_barrier,
    .wait = fl_wait,
    .test = fl_test,
};

const loom_comm_ops *loom_flight_ops(void) { return &flight_ops; }

loom_status loom_flight_wrap(const loom_comm_ops *inner, void *comm, const char *name,
                             const int *members, int n, void **out)
{
    *out = NULL;
    fl_comm *c = calloc(1, sizeof *c);
    int size = inner->world(comm);
    if (c) {
        c->send_seq = calloc((size_t)size, sizeof *c->send_seq);
        c->recv_seq = calloc((size_t)size, sizeof *c->recv_seq);
    }
    int *mem = n > 0 ? malloc((size_t)n * sizeof *mem) : NULL;
    pthread_mutex_lock(&lock);
    /* A closed group's slot first (the one of the same name, so a reopened group keeps its
     * place in the dumps), else a new one. */
    int slot = -1;
    for (int i = 0; i < n_groups; i++)
        if (groups[i].closed && (slot < 0 || strcmp(groups[i].name, name) == 0))
            slot = i;
    if (slot < 0 && n_groups < MAX_GROUPS)
        slot = n_groups++;
    if (slot >= 0 && groups[slot].closed) {
        free(groups[slot].members);
        memset(&groups[slot], 0, sizeof groups[slot]);
    }
    pthread_mutex_unlock(&lock);
    if (!c || !c->send_seq || !c->recv_seq || (n > 0 && !mem) || slot < 0) {
        if (c) {
            free(c->send_seq);
            free(c->recv_seq);
        }
        free(c);
        free(mem);
        inner->destroy(comm);
        return slot < 0 ? loom_fail(LOOM_ERR_INVALID, "flight recorder: more than %d groups",
                                    MAX_GROUPS)
                        : loom_fail(LOOM_ERR_NOMEM, "out of memory wrapping group %s", name);
    }
    c->inner = inner;
    c->self = comm;
    c->check_ops = inner;
    c->check_self = comm;
    c->size = size;
    c->slot = slot;
    flight_group *g = &groups[slot];
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", name);
    g->n = n;
    g->members = mem;
    g->me = inner->rank(comm);
    for (int i = 0; i < n; i++)
        mem[i] = members[i];
    *out = c;
    return LOOM_OK;
}

loom_status loom_flight_wrap_device(const loom_comm_ops *inner, void *comm, const char *name,
                                    const int *members, int n, void *host_group, void **out)
{
    fl_comm *h = host_group;
    int rank = inner->rank(comm), size = inner->world(comm);
    int hr = h ? h->inner->rank(h->self) : -1, hs = h ? h->size : 0;
    if (hr != rank || hs != size) {
        inner->destroy(comm);
        *out = NULL;
        return loom_fail(LOOM_ERR_INVALID, "flight recorder: device group %s (rank %d of %d) "
                         "needs a host group of the same members beside it (got rank %d of %d)",
                         name, rank, size, hr, hs);
    }
    LOOM_TRY(loom_flight_wrap(inner, comm, name, members, n, out));
    fl_comm *c = *out;
    c->check_ops = h->inner;
    c->check_self = h->self;
    return LOOM_OK;
}
