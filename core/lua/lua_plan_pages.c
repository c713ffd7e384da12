/* lua_plan_pages.c — core.bench_refault{...} for `loom plan --calibrate`: what a page
 * handed back to the OS and touched again costs, per page, over touching a resident one.
 *
 * ZeRO 2 and 3 on host memory keep their memory low that way (zero_reduce.c, zero_params.c:
 * madvise(MADV_DONTNEED) on a reduced gradient bucket, on a parameter unit a pass is done
 * with), so every step faults those pages back in: the kernel maps and zeroes each one.
 * Two patterns, as the runs touch them:
 *   write:      the first touch writes (an all-gather copying a unit into its pages): one fault;
 *   accumulate: the first touch reads, then writes (a gradient added into the zeroed buffer:
 *               the read maps the shared zero page, the write faults again to copy it).
 * Each repeat is madvise + the touch, less the same touch on resident pages; the median of
 * repeats, in this process's CPU time (sys included: the faults' work) or wall time.
 */
#define _DEFAULT_SOURCE /* madvise, MAP_ANONYMOUS */
#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/clock.h"
#include "lua_loom.h"

static double clock_s(int cpu) { return cpu ? 1e-3 * loom_cpu_ms() : loom_now_s(); }

static void touch(float *buf, size_t n, int accumulate)
{
    if (accumulate) {
        for (size_t i = 0; i < n; i++)
            buf[i] += 1.0f;
    } else {
        for (size_t i = 0; i < n; i++)
            buf[i] = (float)i;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds per page of (madvise + touch) - touch over `reps` repeats. */
static double refault_s(float *buf, size_t bytes, size_t page, int accumulate, int cpu, double min_s)
{
    size_t n = bytes / sizeof(float);
    double t[101];
    int k = 0;
    touch(buf, n, accumulate); /* resident to start with */
    double start = loom_now_s();
    while (k < 101 && (k < 5 || loom_now_s() - start < min_s)) {
        double t0 = clock_s(cpu);
        touch(buf, n, accumulate);
        double t1 = clock_s(cpu);
        (void)madvise(buf, bytes, MADV_DONTNEED);
        touch(buf, n, accumulate);
        double t2 = clock_s(cpu);
        t[k++] = ((t2 - t1) - (t1 - t0)) / (double)(bytes / page);
    }
    qsort(t, (size_t)k, sizeof *t, cmp_double);
    return t[k / 2] > 0 ? t[k / 2] : 0;
}

/* core.bench_refault{bytes = 4 MiB, min_s = 0.03, cpu_clock = false}
 * -> {write_s =, accumulate_s =, page = bytes} (seconds per page) */
static int l_bench_refault(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_getfield(L, 1, "bytes");
    lua_Integer want = luaL_optinteger(L, -1, 4 << 20);
    lua_getfield(L, 1, "min_s");
    double min_s = luaL_optnumber(L, -1, 0.03);
    lua_getfield(L, 1, "cpu_clock");
    int cpu = lua_toboolean(L, -1);
    lua_pop(L, 3);
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    if (want < (lua_Integer)page || want > ((lua_Integer)1 << 30))
        return luaL_error(L, "bench_refault: bytes = %d out of range (a page to 1 GiB)", (int)want);
    size_t bytes = (size_t)want / page * page;
    float *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED)
        return luaL_error(L, "bench_refault: cannot map %d bytes", (int)bytes);
    double w = refault_s(buf, bytes, page, 0, cpu, min_s);
    double a = refault_s(buf, bytes, page, 1, cpu, min_s);
    munmap(buf, bytes);
    lua_createtable(L, 0, 3);
    lua_pushnumber(L, w);
    lua_setfield(L, -2, "write_s");
    lua_pushnumber(L, a);
    lua_setfield(L, -2, "accumulate_s");
    lua_pushinteger(L, (lua_Integer)page);
    lua_setfield(L, -2, "page");
    return 1;
}

void loom_lua_open_plan_pages(lua_State *L)
{
    lua_pushcfunction(L, l_bench_refault);
    lua_setfield(L, -2, "bench_refault");
}
