/* lua_plan_bring.c — core.bench_bring{...} for `loom plan --calibrate`: what ZeRO-3 with
 * offloaded parameters pays to bring one unit's partition in before its all-gather.
 *
 * zero_params_store.c / zero_params_read.c, per unit and gather: map a staging buffer of
 * the unit's partition (mmap, fresh pages), hand the read to the reader thread (a condition
 * variable), which copies the partition out of the host pool (memcpy) or the offload file
 * (pread, through the page cache), wait for it, and unmap the staging when the gather is
 * done. This does the same, in this process, with a reader thread of its own: the faults on
 * the fresh pages, the copy, the two hand-offs between threads and the unmap (whose TLB
 * shootdown reaches the CPU the reader last ran on) are all in what it times. Timed at two
 * sizes, it gives a cost per unit and per byte: t(bytes) = unit_s + bytes x byte_s. The
 * median of repeats, in this process's CPU time (both threads, sys included) or wall time.
 */
/* (pread, pwrite, mkstemp: the build defines _GNU_SOURCE) */
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/clock.h"
#include "lua_loom.h"

static double clock_s(int cpu) { return cpu ? 1e-3 * loom_cpu_ms() : loom_now_s(); }

typedef struct bring_bench {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, quit, failed;
    int fd;          /* >= 0: read from this file, else from pool */
    const char *pool;
    char *staging;
    size_t bytes;
} bring_bench;

static void *reader(void *arg)
{
    bring_bench *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->pending && !b->quit)
            pthread_cond_wait(&b->cv, &b->mu);
        if (!b->pending)
            break;
        pthread_mutex_unlock(&b->mu);
        int ok = 1;
        if (b->fd < 0)
            memcpy(b->staging, b->pool, b->bytes);
        else
            for (size_t done = 0; ok && done < b->bytes;) {
                ssize_t r = pread(b->fd, b->staging + done, b->bytes - done, (off_t)done);
                ok = r > 0 || (r < 0 && errno == EINTR);
                done += r > 0 ? (size_t)r : 0;
            }
        pthread_mutex_lock(&b->mu);
        b->failed |= !ok;
        b->pending = 0;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds of one unit's bring of `bytes`: map, read on the thread, wait, unmap. */
static double bring_s(bring_bench *b, size_t bytes, int cpu, double min_s)
{
    double t[101];
    int k = 0;
    double start = loom_now_s();
    for (int warm = 1; k < 101 && (k < 5 || loom_now_s() - start < min_s); warm = 0) {
        double t0 = clock_s(cpu);
        char *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED)
            return -1;
        pthread_mutex_lock(&b->mu);
        b->staging = map;
        b->bytes = bytes;
        b->pending = 1;
        pthread_cond_broadcast(&b->cv);
        while (b->pending)
            pthread_cond_wait(&b->cv, &b->mu);
        pthread_mutex_unlock(&b->mu);
        munmap(map, bytes);
        double dt = clock_s(cpu) - t0;
        if (!warm)
            t[k++] = dt;
    }
    qsort(t, (size_t)k, sizeof *t, cmp_double);
    return t[k / 2];
}

/* core.bench_bring{small = 64 KiB, large = 512 KiB, dir = nil (a file there: the disk
 * offload's pread; nil: the host pool's memcpy), min_s = 0.03, cpu_clock = false}
 * -> {unit_s =, byte_s =, small_s =, large_s =} */
static int l_bench_bring(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_getfield(L, 1, "small");
    lua_Integer small = luaL_optinteger(L, -1, 64 << 10);
    lua_getfield(L, 1, "large");
    lua_Integer large = luaL_optinteger(L, -1, 512 << 10);
    lua_getfield(L, 1, "dir");
    const char *dir = luaL_optstring(L, -1, NULL);
    lua_getfield(L, 1, "min_s");
    double min_s = luaL_optnumber(L, -1, 0.03);
    lua_getfield(L, 1, "cpu_clock");
    int cpu = lua_toboolean(L, -1);
    if (small < 4096 || large <= small || large > ((lua_Integer)1 << 30))
        return luaL_error(L, "bench_bring: small = %I, large = %I: want 4 KiB <= small < large "
                          "<= 1 GiB", small, large);
    bring_bench b;
    memset(&b, 0, sizeof b);
    b.fd = -1;
    char *pool = malloc((size_t)large);
    if (!pool)
        return luaL_error(L, "bench_bring: out of memory for %I bytes", large);
    memset(pool, 7, (size_t)large);
    b.pool = pool;
    if (dir) {
        char path[4096];
        if (snprintf(path, sizeof path, "%s/loom-bench-bring-XXXXXX", dir) >= (int)sizeof path) {
            free(pool);
            return luaL_error(L, "bench_bring: directory name too long: %s", dir);
        }
        b.fd = mkstemp(path);
        if (b.fd < 0) {
            free(pool);
            return luaL_error(L, "bench_bring: cannot create a file in %s: %s", dir, strerror(errno));
        }
        unlink(path); /* gone when closed */
        if (pwrite(b.fd, pool, (size_t)large, 0) != (ssize_t)large) {
            close(b.fd);
            free(pool);
            return luaL_error(L, "bench_bring: cannot write %I bytes in %s", large, dir);
        }
    }
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    pthread_t th;
    int started = pthread_create(&th, NULL, reader, &b) == 0;
    double ts = started ? bring_s(&b, (size_t)small, cpu, min_s) : -1;
    double tl = started && ts >= 0 ? bring_s(&b, (size_t)large, cpu, min_s) : -1;
    if (started) {
        pthread_mutex_lock(&b.mu);
        b.quit = 1;
        pthread_cond_broadcast(&b.cv);
        pthread_mutex_unlock(&b.mu);
        pthread_join(th, NULL);
    }
    pthread_mutex_destroy(&b.mu);
    pthread_cond_destroy(&b.cv);
    if (b.fd >= 0)
        close(b.fd);
    free(pool);
    if (!started || ts < 0 || tl < 0 || b.failed)
        return luaL_error(L, "bench_bring: %s", !started ? "cannot start the reader thread"
                          : b.failed ? "a read failed" : "cannot map the staging");
    double byte_s = (tl - ts) / (double)(large - small);
    byte_s = byte_s > 0 ? byte_s : 0;
    double unit_s = ts - byte_s * (double)small;
    lua_createtable(L, 0, 4);
    lua_pushnumber(L, unit_s > 0 ? unit_s : 0);
    lua_setfield(L, -2, "unit_s");
    lua_pushnumber(L, byte_s);
    lua_setfield(L, -2, "byte_s");
    lua_pushnumber(L, ts);
    lua_setfield(L, -2, "small_s");
    lua_pushnumber(L, tl);
    lua_setfield(L, -2, "large_s");
    return 1;
}

void loom_lua_open_plan_bring(lua_State *L)
{
    lua_pushcfunction(L, l_bench_bring);
    lua_setfield(L, -2, "bench_bring");
}
