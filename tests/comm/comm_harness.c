/* comm_harness.c — see comm_harness.h. Test-only code. */
#include "comm_harness.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/plugin_loader.h"
#include "plugin_test_util.h"

/* ---- the store ----------------------------------------------------------------------- */

enum { KV_MAX = 64, KEY_MAX = 64, VAL_MAX = 256 };

struct th_store {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    struct {
        char key[KEY_MAX];
        char val[VAL_MAX];
        size_t len;
    } kv[KV_MAX];
};

th_store *th_store_new(void)
{
    th_store *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED)
        return NULL;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST); /* a rank may die holding it */
    pthread_mutex_init(&s->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    return s;
}

void th_store_free(th_store *s)
{
    if (s != NULL)
        munmap(s, sizeof *s);
}

static void lock(th_store *s)
{
    if (pthread_mutex_lock(&s->mu) == EOWNERDEAD)
        pthread_mutex_consistent(&s->mu);
}

static int find(th_store *s, const char *key)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->kv[i].key, key) == 0)
            return i;
    return -1;
}

static loom_status store_set(void *self, const char *key, const void *value, size_t len)
{
    th_store *s = self;
    if (strlen(key) >= KEY_MAX || len > VAL_MAX)
        return LOOM_ERR_INVALID;
    lock(s);
    int i = find(s, key);
    if (i < 0 && s->n < KV_MAX) {
        i = s->n++;
        snprintf(s->kv[i].key, KEY_MAX, "%s", key);
    }
    if (i >= 0) {
        memcpy(s->kv[i].val, value, len);
        s->kv[i].len = len;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return i >= 0 ? LOOM_OK : LOOM_ERR_NOMEM;
}

static loom_status store_get(void *self, const char *key, void *value, size_t *len, int timeout_ms)
{
    th_store *s = self;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    lock(s);
    int i;
    while ((i = find(s, key)) < 0)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT) {
            i = find(s, key);
            break;
        }
    loom_status st = LOOM_ERR_TIMEOUT;
    if (i >= 0) {
        st = s->kv[i].len <= *len ? LOOM_OK : LOOM_ERR_INVALID;
        if (st == LOOM_OK)
            memcpy(value, s->kv[i].val, s->kv[i].len);
        *len = s->kv[i].len;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

loom_store th_store_api(th_store *s)
{
    loom_store api = {.self = s, .set = store_set, .get = store_get};
    return api;
}

const char *th_store_peek(th_store *s, const char *key)
{
    static char out[VAL_MAX + 1];
    out[0] = '\0';
    lock(s);
    int i = find(s, key);
    if (i >= 0) {
        memcpy(out, s->kv[i].val, s->kv[i].len);
        out[s->kv[i].len] = '\0';
    }
    pthread_mutex_unlock(&s->mu);
    return out;
}

/* ---- loading ------------------------------------------------------------------------- */

int th_load(th_env *env, const char *name, char *err, size_t cap)
{
    const loom_plugin *p = NULL;
    if (loom_plugin_load(LOOM_KIND_COMM, name, &p) != LOOM_OK) {
        snprintf(err, cap, "%s", loom_last_error());
        return 0;
    }
    env->desc = p->desc;
    env->ops = p->desc->ops;
    env->path = p->path;
    return 1;
}

/* ---- running ranks ------------------------------------------------------------------- */

int th_fail(th_rank *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->err, t->cap, fmt, ap);
    va_end(ap);
    return 1;
}

double th_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int child_main(const th_env *env, const th_opts *o, th_fn fn, void *arg, int rank,
                      const loom_store *store, char *msg, const char *job)
{
    loom_core_host_set_rank(rank, o->world);
    setenv("LOOM_JOB_ID", job, 1);
    tcfg cfg;
    th_rank t = {.rank = rank, .world = o->world, .ops = env->ops, .env = env, .store = store,
                 .cfg = &cfg.cfg, .timeout_ms = o->timeout_ms, .arg = arg, .err = msg,
                 .cap = TH_MSG};
    if (!tcfg_build(&cfg, env->desc, o->cfg, 0))
        return th_fail(&t, "config: %s", cfg.err);
    if (!o->no_create &&
        env->ops->create(loom_core_host(), &cfg.cfg, store, rank, o->world, o->timeout_ms, NULL,
                         &t.comm) != LOOM_OK)
        return th_fail(&t, "create: %s", loom_last_error());
    int rc = fn(&t);
    env->ops->destroy(t.comm);
    return rc;
}

int th_run(const th_env *env, const th_opts *o, th_fn fn, void *arg, th_result *res)
{
    memset(res, 0, sizeof *res);
    res->world = o->world;
    if (o->world < 1 || o->world > TH_MAX_RANKS)
        return 0;
    th_store *store = th_store_new();
    char (*msgs)[TH_MSG] = mmap(NULL, sizeof res->msg, PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (store == NULL || msgs == MAP_FAILED) {
        snprintf(res->msg[0], TH_MSG, "harness: no shared memory for the store");
        th_store_free(store);
        return 0;
    }
    loom_store api = th_store_api(store);
    static unsigned runs;
    snprintf(res->job, sizeof res->job, "%08x%08x", (unsigned)getpid(),
             (unsigned)(th_hash((unsigned long long)(th_seconds() * 1e9), ++runs, 0) & 0xffffffffu));
    fflush(NULL); /* children must not flush the parent's buffers twice */
    double t0 = th_seconds();
    for (int r = 0; r < o->world; r++) {
        pid_t p = fork();
        if (p == 0)
            _exit(child_main(env, o, fn, arg, r, &api, msgs[r], res->job));
        res->pids[r] = p;
    }
    double limit = o->limit_s > 0 ? o->limit_s : 120.0;
    int left = o->world;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p == 0) {
            if (th_seconds() - t0 > limit) {
                for (int r = 0; r < o->world; r++)
                    if (res->pids[r] > 0 && !res->exited[r] && !res->signo[r])
                        kill(res->pids[r], SIGKILL);
                res->killed = 1;
                limit = 1e30;
            }
            struct timespec ts = {0, 2000000}; /* the parent only polls for exits */
            nanosleep(&ts, NULL);
            continue;
        }
        if (p < 0)
            break;
        for (int r = 0; r < o->world; r++)
            if (res->pids[r] == p) {
                if (WIFEXITED(st)) {
                    res->exited[r] = 1;
                    res->code[r] = WEXITSTATUS(st);
                } else if (WIFSIGNALED(st)) {
                    res->signo[r] = WTERMSIG(st);
                }
                left--;
            }
    }
    res->seconds = th_seconds() - t0;
    memcpy(res->msg, msgs, sizeof res->msg);
    snprintf(res->segment, sizeof res->segment, "%s", th_store_peek(store, "shm/segment"));
    munmap(msgs, sizeof res->msg);
    th_store_free(store);
    int ok = !res->killed;
    for (int r = 0; r < o->world; r++)
        ok &= res->exited[r] && res->code[r] == 0;
    return ok;
}

const char *th_summary(const th_result *res)
{
    static char out[TH_MAX_RANKS * (TH_MSG + 64)];
    size_t used = 0;
    out[0] = '\0';
    if (res->killed)
        used += (size_t)snprintf(out, sizeof out, "time limit: children were killed\n");
    for (int r = 0; r < res->world && used < sizeof out; r++) {
        if (res->exited[r] && res->code[r] == 0)
            continue;
        if (res->exited[r])
            used += (size_t)snprintf(out + used, sizeof out - used, "rank %d: exit %d: %s\n", r,
                                     res->code[r], res->msg[r]);
        else
            used += (size_t)snprintf(out + used, sizeof out - used,
                                     "rank %d: killed by signal %d: %s\n", r, res->signo[r],
                                     res->msg[r]);
    }
    return out;
}

const char *th_leftovers(const th_result *res)
{
    static char out[1024];
    out[0] = '\0';
    DIR *d = opendir("/dev/shm");
    if (d == NULL)
        return out;
    struct dirent *de;
    size_t used = 0;
    while ((de = readdir(d)) != NULL) {
        char job[40];
        snprintf(job, sizeof job, "loom-%s", res->job);
        int hit = (res->segment[0] != '\0' && strcmp(de->d_name, res->segment + 1) == 0) ||
                  (res->job[0] != '\0' && strncmp(de->d_name, job, strlen(job)) == 0);
        for (int r = 0; r < res->world && !hit; r++) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "loom-%d-", (int)res->pids[r]);
            hit = strncmp(de->d_name, prefix, strlen(prefix)) == 0;
        }
        if (hit && used + strlen(de->d_name) + 2 < sizeof out)
            used += (size_t)snprintf(out + used, sizeof out - used, "%s ", de->d_name);
    }
    closedir(d);
    return out;
}
