/* lua_loom.h — the loom.core Lua module, assembled from one C file per part. */
#ifndef LOOM_CORE_LUA_LOOM_H
#define LOOM_CORE_LUA_LOOM_H

#include <lua.h>

#include "data.h"

int luaopen_loom_core(lua_State *L);

/* lua_data.c: register core.text_data, core.random_data and the "loom.Data" class into
 * the table on top of the stack. */
void loom_lua_open_data(lua_State *L);
/* The data source at idx (a "loom.Data"), raising a Lua error if it is not one. */
loom_data *loom_lua_check_data(lua_State *L, int idx);

#endif
