/* lua_plan_disk.c — core.bench_disk{...} for `loom plan --calibrate`: what moving the
 * optimizer state (and ZeRO-3's parameters) through an offload file costs, per byte.
 *
 * offload_disk.c keeps the state in a file under strategy.offload.path and moves it with
 * pread/pwrite in pieces of at most chunk_mb: every step reads each chunk in and writes it
 * back (its I/O thread), and with params = true each ZeRO-3 gather reads its unit's
 * partition out of the same file (zero_params_store.c). Nothing is synced: a state that
 * fits the page cache is a copy between the process and the kernel's pages, which is what
 * this measures (a file of `bytes`, written then read back in `chunk` pieces, repeated for
 * at least min_s; the median pass). A state larger than the page cache would read at the
 * device's speed, which this does not measure (said in the plan's assumptions).
 * In this process's CPU time (sys included: the copies are the kernel's work, on the I/O
 * thread's clock in a run) or wall time.
 */
/* (mkstemp, pread, pwrite: the build defines _GNU_SOURCE) */
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "lua_loom.h"

static double clock_s(int cpu) { return cpu ? 1e-3 * loom_cpu_ms() : loom_now_s(); }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* All of `bytes` from/to the file in `chunk` pieces; 0 on a failed or short call. */
static int pass(int fd, char *buf, size_t bytes, size_t chunk, int write)
{
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? bytes - off : chunk;
        size_t done = 0;
        while (done < n) {
            ssize_t r = write ? pwrite(fd, buf + off + done, n - done, (off_t)(off + done))
                              : pread(fd, buf + off + done, n - done, (off_t)(off + done));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return 0;
            done += (size_t)r;
        }
    }
    return 1;
}

/* core.bench_disk{dir = ".", bytes = 16 MiB, chunk = 1 MiB, min_s = 0.03, cpu_clock = false}
 * -> {read_Bps =, write_Bps =, call_s =, bytes =, dir =} (bytes per second through the page
 * cache; call_s: each pread or pwrite's own seconds beyond its bytes) */
static int l_bench_disk(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_getfield(L, 1, "dir");
    const char *dir = luaL_optstring(L, -1, ".");
    lua_getfield(L, 1, "bytes");
    lua_Integer want = luaL_optinteger(L, -1, 16 << 20);
    lua_getfield(L, 1, "chunk");
    lua_Integer chunk = luaL_optinteger(L, -1, 1 << 20);
    lua_getfield(L, 1, "min_s");
    double min_s = luaL_optnumber(L, -1, 0.03);
    lua_getfield(L, 1, "cpu_clock");
    int cpu = lua_toboolean(L, -1);
    if (want < 4096 || want > ((lua_Integer)1 << 32) || chunk < 4096 || chunk > want)
        return luaL_error(L, "bench_disk: bytes = %I and chunk = %I: want 4 KiB <= chunk <= "
                          "bytes <= 4 GiB", want, chunk);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/loom-bench-disk-XXXXXX", dir) >= (int)sizeof path)
        return luaL_error(L, "bench_disk: directory name too long: %s", dir);
    int fd = mkstemp(path);
    if (fd < 0)
        return luaL_error(L, "bench_disk: cannot create a file in %s: %s (give a writable "
                          "directory: the offload's path)", dir, strerror(errno));
    unlink(path); /* gone when closed, whatever happens below */
    size_t bytes = (size_t)want;
    char *buf = malloc(bytes);
    if (!buf) {
        close(fd);
        return luaL_error(L, "bench_disk: out of memory for %I bytes", want);
    }
    for (size_t i = 0; i < bytes; i++)
        buf[i] = (char)(i * 131u);
    /* the process's buffer is cold in a run (the step's compute went through the caches
     * since the last I/O), so 32 MiB are written between the repeats, outside the timing
     * (at load 11, CPU clock: hot 16.5 / 7.1 GB/s read / write, cold 11.6 / 6.1) */
    size_t n_evict = (32u << 20) / sizeof(float);
    float *evict = calloc(n_evict, sizeof(float));
    double tw[65], tr[65];
    int k = 0, ok = evict && pass(fd, buf, bytes, (size_t)chunk, 1) && pass(fd, buf, bytes, (size_t)chunk, 0);
    double start = loom_now_s();
    while (ok && k < 65 && (k < 3 || loom_now_s() - start < min_s)) {
        for (size_t i = 0; i < n_evict; i += 16)
            evict[i] += 1.0f;
        double t0 = clock_s(cpu);
        ok = pass(fd, buf, bytes, (size_t)chunk, 1);
        double t1 = clock_s(cpu);
        for (size_t i = 0; i < n_evict; i += 16)
            evict[i] += 1.0f;
        double t2 = clock_s(cpu);
        ok = ok && pass(fd, buf, bytes, (size_t)chunk, 0);
        double t3 = clock_s(cpu);
        tw[k] = t1 - t0;
        tr[k++] = t3 - t2;
    }
    /* each call's own cost (the syscall, the page cache lookup, the file's timestamps):
     * 4096 calls of 64 bytes each way, whose bytes cost next to nothing (median of 9);
     * a run makes one per table entry's piece and slot, many of them small (biases, norms) */
    double tc[9];
    const size_t calls = 4096, tiny = 64;
    for (int j = 0; ok && j < 9; j++) {
        double t0 = clock_s(cpu);
        ok = pass(fd, buf, calls * tiny, tiny, 1) && pass(fd, buf, calls * tiny, tiny, 0);
        tc[j] = clock_s(cpu) - t0;
    }
    qsort(tc, 9, sizeof *tc, cmp_double);
    free(evict);
    int err = errno;
    free(buf);
    close(fd);
    if (!ok)
        return luaL_error(L, "bench_disk: reading or writing %I bytes in %s failed: %s", want, dir,
                          strerror(err));
    qsort(tw, (size_t)k, sizeof *tw, cmp_double);
    qsort(tr, (size_t)k, sizeof *tr, cmp_double);
    /* (a median of 0: the clock's resolution; a rate as if one tick) */
    double res = cpu ? 1e-6 : 1e-9;
    double rd = tr[k / 2] > res ? tr[k / 2] : res, wr = tw[k / 2] > res ? tw[k / 2] : res;
    double per_call = tc[4] / (double)(2 * calls);
    lua_createtable(L, 0, 5);
    lua_pushnumber(L, per_call > 0 ? per_call : 0);
    lua_setfield(L, -2, "call_s");
    lua_pushnumber(L, (double)bytes / rd);
    lua_setfield(L, -2, "read_Bps");
    lua_pushnumber(L, (double)bytes / wr);
    lua_setfield(L, -2, "write_Bps");
    lua_pushinteger(L, want);
    lua_setfield(L, -2, "bytes");
    lua_pushstring(L, dir);
    lua_setfield(L, -2, "dir");
    return 1;
}

void loom_lua_open_plan_disk(lua_State *L)
{
    lua_pushcfunction(L, l_bench_disk);
    lua_setfield(L, -2, "bench_disk");
}
