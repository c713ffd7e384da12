/* lua_kd_cache.c — session:write_kd_cache(data, opts), what `loom distill-cache` runs
 * (scripts/loom/distill_cache.lua): the session's teacher over `records` micro-batches of
 * the data's train split, written as train/kd_cache.h's file.
 * opts = { path =, k =, micro =, seq =, records =, source =, teacher = } (all required but
 * the two descriptions). What not: the policy (how many records, which k): the Lua side's.
 * Errors are raised without a position; the Lua library adds the recipe's file:line.
 */
#include <lauxlib.h>
#include <lua.h>

#include "base/status.h"
#include "lua_loom.h"
#include "train/kd_cache.h"

static int int_opt(lua_State *L, const char *key)
{
    lua_getfield(L, 3, key);
    lua_Integer v = luaL_checkinteger(L, -1);
    lua_pop(L, 1);
    if (v < 0 || v > (lua_Integer)1 << 40)
        return luaL_error(L, "write_kd_cache: %s=%d is out of range", key, (int)v);
    return (int)v;
}

static int l_write_kd_cache(lua_State *L)
{
    loom_session *s = loom_lua_check_session(L, 1);
    loom_data_cursor src = {loom_lua_check_data(L, 2), LOOM_SPLIT_TRAIN};
    luaL_checktype(L, 3, LUA_TTABLE);
    loom_gpt *teacher = loom_session_teacher(s);
    if (!teacher)
        return luaL_error(L, "distill-cache: the recipe's teacher has no model to run (teacher = "
                             "{ checkpoint = DIR } or { model = loom.gpt{ init = FILE } })");
    loom_kd_cache_shape sh = {0};
    sh.k = int_opt(L, "k");
    sh.micro = int_opt(L, "micro");
    sh.seq = int_opt(L, "seq");
    lua_getfield(L, 3, "records");
    sh.records = (int64_t)luaL_checkinteger(L, -1);
    lua_getfield(L, 3, "path"); /* the strings stay alive in the table at index 3 */
    const char *path = luaL_checkstring(L, -1);
    lua_getfield(L, 3, "source");
    sh.source = luaL_optstring(L, -1, "");
    lua_getfield(L, 3, "teacher");
    sh.teacher = luaL_optstring(L, -1, "");
    lua_pop(L, 4);
    sh.vocab = loom_gpt_get_config(teacher)->vocab;
    if (loom_kd_cache_write(path, &sh, teacher, loom_data_batch, &src) != LOOM_OK) {
        lua_pushstring(L, loom_last_error());
        return lua_error(L);
    }
    return 0;
}

void loom_lua_open_kd_cache(lua_State *L)
{
    luaL_getmetatable(L, LOOM_SESSION_MT);
    lua_getfield(L, -1, "__index");
    lua_pushcfunction(L, l_write_kd_cache);
    lua_setfield(L, -2, "write_kd_cache");
    lua_pop(L, 2);
}
