/* lua_ranks.c — the rank facts a recipe sees: core.rank, core.world, core.local_rank, and
 * core.check_same_config(text), the collective check that every rank resolved the same
 * configuration.
 *
 * What not: anything about communicators or the mesh (the lead wires those in C through
 * loom_cli_rendezvous()).
 * Invariants: the values are those loom_ranks_join found (0, 1, 0 when it was not called);
 * check_same_config is collective — with world > 1 every rank must call it, in the same order
 * relative to other collectives; with world == 1 it returns at once.
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>

#include "dist/ranks.h"
#include "dist/rendezvous.h"
#include "base/status.h"

/* core.check_same_config(text [, timeout_ms]) -> true. text: the canonical serialisation of the resolved
 * configuration (or any digest of it); its 64-bit FNV-1a hash is compared across ranks.
 * On a mismatch raises, on every rank:
 *   ranks 1, 3 run a different recipe than rank 0 (config hash 5f2a3b10… vs 91c04e7d…) */
#define RECIPE_KEY "recipe-text/rank0"

static int l_check_same_config(lua_State *L)
{
    size_t n;
    const char *text = luaL_checklstring(L, 1, &n);
    /* The first collective of a recipe: it opens the rendezvous, bounded by the recipe's
     * comm_timeout (the optional second argument, ms) unless the environment set one. */
    int timeout_ms = (int)luaL_optinteger(L, 2, 0);
    loom_rendezvous *r = NULL;
    if (loom_cli_rendezvous_open(timeout_ms, &r) != LOOM_OK)
        return luaL_error(L, "%s", loom_last_error());
    if (r && loom_rendezvous_rank(r) == 0) { /* for core.recipe_of_rank0 after a mismatch */
        const loom_store *st = loom_rendezvous_store(r);
        st->set(st->self, RECIPE_KEY, text, n < LOOM_RENDEZVOUS_MAX_VALUE ? n : LOOM_RENDEZVOUS_MAX_VALUE);
    }
    if (r && loom_rendezvous_check_same(r, "recipe", loom_rendezvous_hash(text, n), -1) != LOOM_OK)
        return luaL_error(L, "%s", loom_last_error());
    lua_pushboolean(L, 1);
    return 1;
}

/* core.recipe_of_rank0() -> the text rank 0 gave check_same_config (up to 1 MiB), or nil:
 * after a mismatch, to name the keys in which this rank's recipe differs. */
static int l_recipe_of_rank0(lua_State *L)
{
    loom_rendezvous *r = loom_cli_rendezvous();
    if (!r)
        return 0;
    const loom_store *st = loom_rendezvous_store(r);
    size_t len = LOOM_RENDEZVOUS_MAX_VALUE;
    char *buf = malloc(len);
    if (buf && st->get(st->self, RECIPE_KEY, buf, &len, 2000) == LOOM_OK)
        lua_pushlstring(L, buf, len);
    else
        lua_pushnil(L);
    free(buf);
    return 1;
}

void loom_lua_open_ranks(lua_State *L)
{
    const loom_ranks *r = loom_cli_ranks();
    lua_pushinteger(L, r->rank);
    lua_setfield(L, -2, "rank");
    lua_pushinteger(L, r->world);
    lua_setfield(L, -2, "world");
    lua_pushinteger(L, r->local_rank);
    lua_setfield(L, -2, "local_rank");
    lua_pushcfunction(L, l_check_same_config);
    lua_setfield(L, -2, "check_same_config");
    lua_pushcfunction(L, l_recipe_of_rank0);
    lua_setfield(L, -2, "recipe_of_rank0");
}
