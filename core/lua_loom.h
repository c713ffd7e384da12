/* lua_loom.h — opening the loom.core Lua module. */
#ifndef LOOM_CORE_LUA_LOOM_H
#define LOOM_CORE_LUA_LOOM_H

#include <lua.h>

int luaopen_loom_core(lua_State *L);

#endif
