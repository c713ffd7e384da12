/* lua_limits.c — memory cap, instruction budget and text-only chunks for recipes (see
 * lua_limits.h).
 *
 * What not: a sandbox. A recipe may still call os.execute or io.open; these bounds turn the
 * two common accidents (a loop that never ends, a table that grows without bound) into a
 * named error instead of a hang or the machine's OOM killer, and refuse precompiled chunks,
 * which skip the parser's checks and whose bytecode Lua does not verify.
 * Invariants: the allocator wraps the state's own (lua_getallocf), so every block is freed
 * by the function that made it; `used` starts from the state's count when installed.
 */
#include "lua_limits.h"

#include <errno.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cap {
    lua_Alloc inner;
    void *inner_ud;
    size_t used, limit;
    int refused;
} cap;

static cap memory;
static double budget, spent; /* instructions; budget 0: no limit */
static char memory_msg[256];

#define HOOK_EVERY 100000 /* instructions between hook calls */

static void *capped_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    cap *c = ud;
    size_t old = ptr ? osize : 0;
    if (nsize > old && c->used - old + nsize > c->limit) {
        c->refused = 1;
        return NULL; /* Lua raises its memory error; the message names the cap */
    }
    void *p = c->inner(c->inner_ud, ptr, osize, nsize);
    if (p || nsize == 0)
        c->used = c->used - old + nsize;
    return p;
}

static void count_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    spent += HOOK_EVERY;
    if (budget > 0 && spent > budget) {
        spent = 0; /* a handler that catches it gets a fresh budget, not an error per hook */
        char n[32], at[256] = ""; /* lua_pushfstring knows no %g precision */
        snprintf(n, sizeof n, "%.3g", budget);
        lua_Debug here; /* in a hook, level 0 is the function the count stopped in */
        if (lua_getstack(L, 0, &here) && lua_getinfo(L, "Sl", &here) && here.currentline > 0)
            snprintf(at, sizeof at, "%s:%d: ", here.short_src, here.currentline);
        lua_pushfstring(L, "%sthe recipe's Lua code ran %s instructions without a training step "
                        "(an endless loop?); LOOM_LUA_INSTRUCTIONS=N raises the limit, 0 lifts it",
                        at, n);
        lua_error(L);
    }
}

/* load, loadfile, dofile and require's file searcher, text chunks only */
static const char *text_only =
    "local load0, loadfile0, searchpath = load, loadfile, package.searchpath\n"
    "local function why(err, what) return (tostring(err):gsub('attempt to load a binary chunk %(mode is .t.%)',\n"
    "  (what or 'a chunk') .. ' is a precompiled (binary) Lua chunk: loom runs Lua from source only (give the .lua file)')) end\n"
    /* an env given as nil is not an env left out (load's _ENV would be nil): keep the count */
    "load = function(chunk, name, mode, ...) local f, e\n"
    "  if select('#', ...) > 0 then f, e = load0(chunk, name, 't', ...) else f, e = load0(chunk, name, 't') end\n"
    "  if not f then return nil, why(e, name and (\"'\" .. name .. \"'\")) end; return f end\n"
    "loadfile = function(file, mode, ...) local f, e\n"
    "  if select('#', ...) > 0 then f, e = loadfile0(file, 't', ...) else f, e = loadfile0(file, 't') end\n"
    "  if not f then return nil, why(e, file and (\"'\" .. file .. \"'\")) end; return f end\n"
    "dofile = function(file) local f, e = loadfile(file); if not f then error(e, 2) end; return f() end\n"
    "package.searchers[2] = function(name)\n"
    "  local path, err = searchpath(name, package.path)\n"
    "  if not path then return err end\n"
    "  local f, e = loadfile(path)\n"
    "  if not f then error(string.format(\"error loading module '%s' from file '%s':\\n\\t%s\", name, path, e), 2) end\n"
    "  return f, path\n"
    "end\n";

static int env_number(const char *name, double dflt, double *out)
{
    const char *s = getenv(name);
    if (!s || !*s) {
        *out = dflt;
        return 0;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || v < 0 || v != v) {
        fprintf(stderr, "loom: %s='%s' is not a number >= 0\n", name, s);
        return -1;
    }
    *out = v;
    return 0;
}

int loom_lua_limits_install(lua_State *L)
{
    double mb, instructions;
    if (env_number("LOOM_LUA_MEMORY_MB", 4096, &mb) || env_number("LOOM_LUA_INSTRUCTIONS", 2e9, &instructions))
        return -1;
    memory.inner = lua_getallocf(L, &memory.inner_ud);
    memory.used = (size_t)lua_gc(L, LUA_GCCOUNT) * 1024 + (size_t)lua_gc(L, LUA_GCCOUNTB);
    memory.limit = mb > 0 ? (size_t)(mb * 1024 * 1024) : (size_t)-1;
    memory.refused = 0;
    snprintf(memory_msg, sizeof memory_msg, "the recipe's Lua code needs more than %g MiB of memory "
             "(a table that grows without bound?); LOOM_LUA_MEMORY_MB=N raises the cap, 0 lifts it", mb);
    lua_setallocf(L, capped_alloc, &memory);
    budget = instructions;
    spent = 0;
    if (budget > 0)
        lua_sethook(L, count_hook, LUA_MASKCOUNT, HOOK_EVERY);
    if (luaL_dostring(L, text_only) != LUA_OK) {
        fprintf(stderr, "loom: %s\n", lua_tostring(L, -1));
        return -1;
    }
    return 0;
}

void loom_lua_limits_progress(void) { spent = 0; }

const char *loom_lua_limits_memory_message(void) { return memory.refused ? memory_msg : NULL; }
