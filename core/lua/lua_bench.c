/* lua_bench.c — core.comm_bench{op=, dtype=, min=, max=, iters=}: the engine of
 * `loom bench comm`, run on every rank of a launched job over the world communicator.
 * Returns, on every rank, rows {bytes, count, us, algbw, busbw} where us is the slowest
 * rank's mean time per operation, algbw = bytes / time and busbw what each rank's links
 * carry, as nccl-tests defines it: allreduce algbw*2(n-1)/n; reduce_scatter and allgather
 * algbw*(n-1)/n; broadcast algbw. bytes is the larger buffer (allgather: its output). */
#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "lua_loom.h"
#include "base/status.h"
#include "base/clock.h"

typedef enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST } bench_op;

static loom_status run_once(const loom_comm_ops *o, void *c, bench_op op, void *send, void *recv,
                            size_t count)
{
    loom_comm_request *r = NULL;
    loom_status st;
    switch (op) {
    case OP_ALLREDUCE:
        st = o->allreduce_start(c, send, recv, count, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r);
        break;
    case OP_REDUCE_SCATTER:
        st = o->reduce_scatter_start(c, send, recv, count, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r);
        break;
    case OP_ALLGATHER:
        st = o->allgather_start(c, send, recv, count, LOOM_DTYPE_F32, &r);
        break;
    default:
        st = o->broadcast_start(c, send, count, LOOM_DTYPE_F32, 0, &r);
    }
    if (st != LOOM_OK)
        return st;
    return o->wait(c, r);
}

static int l_comm_bench(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    static const char *const ops[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", NULL};
    lua_getfield(L, 1, "op");
    bench_op op = (bench_op)luaL_checkoption(L, -1, "allreduce", ops);
    lua_getfield(L, 1, "min");
    size_t min = (size_t)luaL_optinteger(L, -1, 1024);
    lua_getfield(L, 1, "max");
    size_t max = (size_t)luaL_optinteger(L, -1, 64 << 20);
    lua_getfield(L, 1, "iters");
    int iters_opt = (int)luaL_optinteger(L, -1, 0);
    lua_pop(L, 4);
    const loom_comm_ops *o;
    void *c = loom_dist_world(&o);
    if (!c)
        return luaL_error(L, "comm_bench needs a multi-rank run (loom bench comm -n N)");
    int n = o->world(c);
    if (min < 4 || max < min)
        return luaL_error(L, "bench sizes must satisfy 4 <= min <= max (got %I..%I)", (lua_Integer)min,
                          (lua_Integer)max);
    double busf = op == OP_ALLREDUCE ? 2.0 * (n - 1) / n : op == OP_BROADCAST ? 1.0 : (double)(n - 1) / n;
    unsigned char *send = malloc(max + 64), *recv = malloc(max + 64);
    if (!send || !recv) {
        free(send);
        free(recv);
        return luaL_error(L, "out of memory for %I-byte buffers", (lua_Integer)max);
    }
    memset(send, 0, max + 64);
    lua_newtable(L);
    int row = 0;
    loom_status st = LOOM_OK;
    for (size_t bytes = min; bytes <= max && st == LOOM_OK; bytes *= 2) {
        /* count per op: allreduce/broadcast count = bytes/4; the blocked ops move bytes in
         * their larger buffer, so count per rank = bytes/4/n */
        size_t count = bytes / 4;
        if (op == OP_REDUCE_SCATTER || op == OP_ALLGATHER)
            count = count / (size_t)n ? count / (size_t)n : 1;
        int iters = iters_opt ? iters_opt : bytes <= (1 << 20) ? 50 : bytes <= (16 << 20) ? 10 : 4;
        for (int w = 0; w < 2 && st == LOOM_OK; w++)
            st = run_once(o, c, op, send, recv, count);
        double t0 = loom_now_s();
        for (int i = 0; i < iters && st == LOOM_OK; i++)
            st = run_once(o, c, op, send, recv, count);
        float us = (float)((loom_now_s() - t0) / iters * 1e6), slowest = us;
        loom_comm_request *r = NULL;
        if (st == LOOM_OK)
            st = o->allreduce_start(c, &us, &slowest, 1, LOOM_DTYPE_F32, LOOM_REDUCE_MAX, &r);
        if (st == LOOM_OK)
            st = o->wait(c, r);
        double algbw = (double)bytes / (slowest * 1e-6) / 1e9;
        lua_createtable(L, 0, 5);
        lua_pushinteger(L, (lua_Integer)bytes);
        lua_setfield(L, -2, "bytes");
        lua_pushinteger(L, (lua_Integer)count);
        lua_setfield(L, -2, "count");
        lua_pushnumber(L, slowest);
        lua_setfield(L, -2, "us");
        lua_pushnumber(L, algbw);
        lua_setfield(L, -2, "algbw");
        lua_pushnumber(L, algbw * busf);
        lua_setfield(L, -2, "busbw");
        lua_rawseti(L, -2, ++row);
    }
    free(send);
    free(recv);
    if (st != LOOM_OK) {
        lua_pushstring(L, loom_last_error());
        return lua_error(L);
    }
    return 1;
}

void loom_lua_open_bench(lua_State *L)
{
    lua_pushcfunction(L, l_comm_bench);
    lua_setfield(L, -2, "comm_bench");
}
