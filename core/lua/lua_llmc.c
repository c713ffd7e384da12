/* lua_llmc.c — llm.c model files from Lua: core.llmc_config(path) -> {vocab, vocab_padded,
 * ctx, layers, heads, dim}, core.llmc_load(session, path), core.llmc_save(session, path).
 *
 * Shape defaults and recipe checks (loom.gpt{init = ...}) live in scripts/loom/init.lua.
 * Errors are raised without a position; the Lua library adds the recipe's file:line.
 * No C resource is held across a call that can raise.
 */
#include <lauxlib.h>
#include <lua.h>

#include "io/llmc_model.h"
#include "lua_loom.h"
#include "train/session.h"
#include "train/zero.h"
#include "base/status.h"

static loom_gpt *check_model(lua_State *L, int idx)
{
    return loom_session_model(loom_lua_check_session(L, idx));
}

static int raise_status(lua_State *L)
{
    lua_pushstring(L, loom_last_error());
    return lua_error(L);
}

static void set_int(lua_State *L, const char *k, int v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}

static int l_llmc_config(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    loom_gpt_config c;
    if (loom_llmc_read_config(path, &c) != LOOM_OK)
        return raise_status(L);
    lua_createtable(L, 0, 6);
    set_int(L, "vocab", c.vocab);
    set_int(L, "vocab_padded", c.vocab_padded);
    set_int(L, "ctx", c.ctx);
    set_int(L, "layers", c.layers);
    set_int(L, "heads", c.heads);
    set_int(L, "dim", c.dim);
    return 1;
}

/* ZeRO-3 keeps each rank's partition of the parameters; the model's buffer holds only
 * the units in use, so an llm.c file can be neither read into it nor written from it. */
static void refuse_zero3(lua_State *L, const char *what)
{
    if (loom_session_zero_stage(loom_lua_check_session(L, 1)) == 3)
        luaL_error(L, "llm.c weights are not %s under strategy zero=3 yet (the parameters live "
                   "in each rank's partition): use zero = 0, 1 or 2", what);
}

static int l_llmc_load(lua_State *L)
{
    refuse_zero3(L, "loaded");
    loom_gpt *m = check_model(L, 1);
    /* zero=1/2 with 16-bit weights: the buffer the file is read into committed whole (a
     * sparse device buffer), then the file's values into the master partition */
    struct loom_zero *z = loom_session_zero(loom_lua_check_session(L, 1));
    if (z && loom_zero_params_will_write(z) != LOOM_OK)
        return raise_status(L);
    if (loom_llmc_load(m, luaL_checkstring(L, 2)) != LOOM_OK)
        return raise_status(L); /* the hold stays until the next write or reader: harmless */
    if (z && loom_zero_params_written(z) != LOOM_OK)
        return raise_status(L);
    return 0;
}

/* zero=1/2 with 16-bit weights: the file holds the fp32 master, as without the partition
 * (the same bytes as LOOM_ZERO_MASTER=whole): gathered whole into the model's buffer for
 * the write (every rank calls this), its pages released again after. */
static int l_llmc_save(lua_State *L)
{
    refuse_zero3(L, "saved");
    struct loom_zero *z = loom_session_zero(loom_lua_check_session(L, 1));
    loom_gpt *m = check_model(L, 1);
    const char *path = luaL_checkstring(L, 2);
    if (z && loom_zero_master_gather(z) != LOOM_OK)
        return raise_status(L);
    loom_status st = loom_llmc_save(m, path);
    if (z)
        loom_zero_master_release(z);
    if (st != LOOM_OK)
        return raise_status(L);
    return 0;
}

void loom_lua_open_llmc(lua_State *L)
{
    static const luaL_Reg funcs[] = {{"llmc_config", l_llmc_config},
                                     {"llmc_load", l_llmc_load},
                                     {"llmc_save", l_llmc_save},
                                     {NULL, NULL}};
    luaL_setfuncs(L, funcs, 0);
}
