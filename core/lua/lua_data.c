/* lua_data.c — data sources as Lua userdata ("loom.Data"): core.text_data,
 * core.random_data, core.shard_data (and core.glob_count, to resolve shard globs), and
 * methods size, vocab, state, set_state, rewind, close.
 * Created with a closed handle and their metatable before the source is opened. */
#include <glob.h>
#include <lauxlib.h>
#include <lua.h>
#include <string.h>

#include "io/data_shards.h"
#include "lua_loom.h"
#include "base/status.h"

#define DATA_MT "loom.Data"

static loom_data *new_box(lua_State *L)
{
    loom_data *d = lua_newuserdatauv(L, sizeof *d, 0);
    memset(d, 0, sizeof *d);
    luaL_setmetatable(L, DATA_MT);
    return d;
}

loom_data *loom_lua_check_data(lua_State *L, int idx)
{
    loom_data *d = luaL_checkudata(L, idx, DATA_MT);
    if (!d->ops)
        luaL_error(L, "data is closed");
    return d;
}

static loom_split check_split(lua_State *L, int idx)
{
    static const char *const names[] = {"train", "val", NULL};
    return (loom_split)luaL_checkoption(L, idx, "train", names);
}

static int raise_status(lua_State *L)
{
    lua_pushstring(L, loom_last_error());
    return lua_error(L);
}

/* core.text_data(path, val_fraction, shuffle, seed) */
static int l_text_data(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    double frac = luaL_optnumber(L, 2, 0.1);
    int shuffle = lua_toboolean(L, 3);
    uint64_t seed = (uint64_t)luaL_optinteger(L, 4, 0);
    loom_data *d = new_box(L);
    if (loom_data_open_text(path, frac, shuffle, seed, d) != LOOM_OK)
        return raise_status(L);
    return 1;
}

/* core.random_data(vocab, seed): synthetic uniform tokens, for benchmarks */
static int l_random_data(lua_State *L)
{
    lua_Integer vocab = luaL_checkinteger(L, 1);
    luaL_argcheck(L, vocab >= 2 && vocab <= (1 << 30), 1, "vocab must be in [2, 2^30]");
    uint64_t seed = (uint64_t)luaL_optinteger(L, 2, 0);
    loom_data *d = new_box(L);
    if (loom_data_open_random((int)vocab, seed, d) != LOOM_OK)
        return raise_status(L);
    return 1;
}

/* core.shard_data(train_glob, val_glob, shuffle, seed): llm.c token shards; val_glob may
 * be nil */
static int l_shard_data(lua_State *L)
{
    const char *train = luaL_checkstring(L, 1);
    const char *val = luaL_optstring(L, 2, NULL);
    int shuffle = lua_toboolean(L, 3);
    uint64_t seed = (uint64_t)luaL_optinteger(L, 4, 0);
    loom_data *d = new_box(L);
    if (loom_data_open_shards(train, val, shuffle, seed, d) != LOOM_OK)
        return raise_status(L);
    return 1;
}

/* core.glob_count(pattern) -> how many paths match (0 also when unreadable: the opener
 * then reports it with context) */
static int l_glob_count(lua_State *L)
{
    const char *pattern = luaL_checkstring(L, 1);
    glob_t g;
    size_t n = 0;
    if (glob(pattern, 0, NULL, &g) == 0)
        n = g.gl_pathc;
    globfree(&g); /* glob sets gl_pathv (NULL or allocated) on every return */
    lua_pushinteger(L, (lua_Integer)n);
    return 1;
}

static int l_size(lua_State *L)
{
    loom_data *d = loom_lua_check_data(L, 1);
    lua_pushinteger(L, (lua_Integer)d->ops->size(d->self, check_split(L, 2)));
    return 1;
}

static int l_vocab(lua_State *L)
{
    loom_data *d = loom_lua_check_data(L, 1);
    lua_pushinteger(L, d->ops->vocab(d->self));
    return 1;
}

/* d:state() -> { kind = "text", w1, w2, ... } (words as integers) */
static int l_state(lua_State *L)
{
    loom_data *d = loom_lua_check_data(L, 1);
    uint64_t w[LOOM_DATA_STATE_MAX];
    int n = d->ops->get_state(d->self, w);
    lua_createtable(L, n, 1);
    for (int i = 0; i < n; i++) {
        lua_pushinteger(L, (lua_Integer)w[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_pushstring(L, d->ops->kind);
    lua_setfield(L, -2, "kind");
    return 1;
}

static int l_set_state(lua_State *L)
{
    loom_data *d = loom_lua_check_data(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "kind");
    const char *kind = lua_tostring(L, -1);
    if (!kind || strcmp(kind, d->ops->kind) != 0)
        return luaL_error(L, "data position was saved from a '%s' source, this is '%s'",
                          kind ? kind : "?", d->ops->kind);
    lua_pop(L, 1);
    uint64_t w[LOOM_DATA_STATE_MAX];
    int n = (int)lua_rawlen(L, 2);
    if (n > LOOM_DATA_STATE_MAX)
        return luaL_error(L, "data position has %d words (at most %d)", n, LOOM_DATA_STATE_MAX);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 2, i + 1);
        w[i] = (uint64_t)luaL_checkinteger(L, -1);
        lua_pop(L, 1);
    }
    if (d->ops->set_state(d->self, w, n) != LOOM_OK)
        return raise_status(L);
    return 0;
}

static int l_rewind(lua_State *L)
{
    loom_data *d = loom_lua_check_data(L, 1);
    d->ops->rewind(d->self, check_split(L, 2));
    return 0;
}

static int l_close(lua_State *L)
{
    loom_data_close(luaL_checkudata(L, 1, DATA_MT));
    return 0;
}

static const luaL_Reg methods[] = {
    {"size", l_size},   {"vocab", l_vocab},   {"state", l_state}, {"set_state", l_set_state},
    {"rewind", l_rewind}, {"close", l_close}, {NULL, NULL}};

void loom_lua_open_data(lua_State *L)
{
    loom_lua_new_class(L, DATA_MT, methods, l_close);
    lua_pushcfunction(L, l_text_data);
    lua_setfield(L, -2, "text_data");
    lua_pushcfunction(L, l_random_data);
    lua_setfield(L, -2, "random_data");
    lua_pushcfunction(L, l_shard_data);
    lua_setfield(L, -2, "shard_data");
    lua_pushcfunction(L, l_glob_count);
    lua_setfield(L, -2, "glob_count");
}
