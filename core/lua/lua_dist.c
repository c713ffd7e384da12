/* lua_dist.c — core.init_dist{comm=, host_comm=, device_wait=, dp=, tp=, pp=, timeout_ms=,
 *                             flight_dir=, debug_desync=}:
 * build the mesh and its communicators for this rank (see dist.h; the flight recorder's
 * settings, flight.h). A run of one rank needs none of it. */
#include <lauxlib.h>
#include <lua.h>

#include "dist/dist.h"
#include "dist/flight.h"
#include "lua_loom.h"
#include "dist/ranks.h"
#include "base/status.h"

static int opt_int(lua_State *L, const char *key, int dflt)
{
    lua_getfield(L, 1, key);
    int v = lua_isnil(L, -1) ? dflt : (int)luaL_checkinteger(L, -1);
    lua_pop(L, 1);
    return v;
}

static int l_init_dist(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    const loom_ranks *r = loom_cli_ranks();
    int rank = r ? r->rank : 0, world = r ? r->world : 1;
    loom_mesh mesh;
    if (loom_mesh_make(rank, world, opt_int(L, "dp", 1), opt_int(L, "tp", 1), opt_int(L, "pp", 1),
                       &mesh) != LOOM_OK)
        goto fail;
    if (world > 1) {
        lua_getfield(L, 1, "comm");
        const char *comm = luaL_optstring(L, -1, "shm");
        lua_getfield(L, 1, "host_comm"); /* beside a device comm (nccl): dist.h */
        const char *host_comm = luaL_optstring(L, -1, NULL);
        lua_getfield(L, 1, "timeout_ms");
        int given_ms = lua_isinteger(L, -1) ? (int)lua_tointeger(L, -1) : 0;
        lua_pop(L, 1);
        loom_rendezvous *rv = NULL;
        if (loom_cli_rendezvous_open(given_ms, &rv) != LOOM_OK)
            goto fail;
        if (!rv)
            return luaL_error(L, "a %d-rank run has no rendezvous (start it with loom launch)", world);
        lua_getfield(L, 1, "flight_dir");
        const char *flight_dir = luaL_optstring(L, -1, NULL);
        lua_getfield(L, 1, "debug_desync");
        int debug_desync = lua_toboolean(L, -1);
        lua_getfield(L, 1, "device_wait"); /* beside a device comm (nccl): dist.h */
        loom_dist_set_device_wait(lua_isnil(L, -1) ? -1 : lua_toboolean(L, -1));
        lua_pop(L, 2);
        int timeout_ms = opt_int(L, "timeout_ms", 60000);
        lua_Integer p2p = opt_int(L, "p2p_bytes", 0); /* dist.h: sizes shm's mailbox */
        if (loom_flight_setup(rank, world, flight_dir, debug_desync, timeout_ms) != LOOM_OK ||
            loom_dist_init(comm, host_comm, loom_rendezvous_store(rv), rank, world, &mesh, timeout_ms,
                           p2p > 0 ? (size_t)p2p : 0) !=
                LOOM_OK)
            goto fail;
        lua_pop(L, 3);
    }
    lua_createtable(L, 0, 6);
    lua_pushinteger(L, mesh.dp_rank);
    lua_setfield(L, -2, "dp_rank");
    lua_pushinteger(L, mesh.tp_rank);
    lua_setfield(L, -2, "tp_rank");
    lua_pushinteger(L, mesh.pp_rank);
    lua_setfield(L, -2, "pp_rank");
    return 1;
fail:
    lua_pushstring(L, loom_last_error());
    return lua_error(L);
}

void loom_lua_open_dist(lua_State *L)
{
    lua_pushcfunction(L, l_init_dist);
    lua_setfield(L, -2, "init_dist");
}
