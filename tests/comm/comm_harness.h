/* comm_harness.h — run a comm plugin across N forked ranks on this machine, for the comm
 * tests and bench_comm.
 *
 * What: a rendezvous store over an anonymous MAP_SHARED mapping made before fork (a small
 * key/value table behind a process-shared robust mutex and a CLOCK_MONOTONIC condvar, so
 * get-with-timeout sleeps), a loader for the plugin through the core's loader, and
 * th_run(): fork `world` children, give each a communicator (or not, see no_create), run
 * a function, collect exit status and a message per rank through shared memory, and kill
 * and reap every child still alive at the time limit, so no process is left behind. Each
 * run gets its own LOOM_JOB_ID (as under `loom launch`), so leftovers are easy to find.
 * What not: not the real TCP rendezvous store (core), not a Check runner: the children
 * report with th_fail() and return; the parent asserts.
 * Invariants: call th_load() and th_store_new() before th_run() forks; a child never
 * returns into the caller (it _exits).
 */
#ifndef LOOM_TEST_COMM_HARNESS_H
#define LOOM_TEST_COMM_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

#include "loom/plugin/comm.h"

enum { TH_MAX_RANKS = 16, TH_MSG = 1024 };

typedef struct th_store th_store;
th_store *th_store_new(void);
void th_store_free(th_store *s);
loom_store th_store_api(th_store *s);
/* The value stored under key as a string ("" when absent); for checks in the parent. */
const char *th_store_peek(th_store *s, const char *key);

typedef struct th_env {
    const loom_plugin_desc *desc;
    const loom_comm_ops *ops;
    const char *path;
} th_env;
/* Load loom-comm-<name>.so through the core's loader; 0 and a message in err on failure. */
int th_load(th_env *env, const char *name, char *err, size_t cap);

/* What a rank function gets. err/cap: where th_fail writes. */
typedef struct th_rank {
    int rank, world;
    void *comm;              /* NULL when th_opts.no_create */
    const loom_comm_ops *ops;
    const th_env *env;
    const loom_store *store;
    const loom_config *cfg;
    int timeout_ms;
    void *arg;
    char *err;
    size_t cap;
} th_rank;
typedef int (*th_fn)(th_rank *t); /* 0 on success, else the exit code, after th_fail */

/* Record a failure message for this rank (printf-style) and return 1. */
int th_fail(th_rank *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef struct th_opts {
    int world;
    int timeout_ms;             /* the communicator's timeout */
    const char *const *cfg;     /* "key=value" overrides, NULL-terminated, or NULL */
    double limit_s;             /* kill everything after this long (0: 120 s) */
    int no_create;              /* the function creates (and destroys) its own comm */
} th_opts;

typedef struct th_result {
    int world;
    pid_t pids[TH_MAX_RANKS];
    int exited[TH_MAX_RANKS], code[TH_MAX_RANKS], signo[TH_MAX_RANKS];
    char msg[TH_MAX_RANKS][TH_MSG];
    double seconds; /* from the first fork to the last exit */
    int killed;     /* children still running at limit_s were SIGKILLed */
    char segment[96];   /* the store's "shm/segment" value, if any */
    char job[24];       /* LOOM_JOB_ID given to the children, as `loom launch` does */
} th_result;

/* Fork world ranks with a fresh store and run fn on each. Returns 1 when every rank
 * exited 0; otherwise 0 and a readable summary in res (th_summary). */
int th_run(const th_env *env, const th_opts *o, th_fn fn, void *arg, th_result *res);
/* One line per failed rank: "rank 2: exit 1: <message>" / "rank 2: killed by signal 9". */
const char *th_summary(const th_result *res);
/* Names in /dev/shm that start with "loom-<job>" or "loom-<child pid>-", or the segment
 * name of res; "" when none is left. */
const char *th_leftovers(const th_result *res);

/* Deterministic test data: a 64-bit mix of (a, b, c). Inline: comm_check's inputs and
 * references call it for every element of every rank (most of the sweep's time). */
static inline unsigned long long th_hash(unsigned long long a, unsigned long long b,
                                         unsigned long long c)
{
    unsigned long long x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xbf58476d1ce4e5b9ull ^
                           (c + 0x1234567ull) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 32);
}
double th_seconds(void);

#endif
