/* lua_sched.c — pipeline schedules for Lua: core.sched_build(name, stages, microbatches,
 * chunks) gives a sched plugin's lists, core.sched_simulate(lists, shape [, costs])
 * validates and simulates any lists (a plugin's, or a Lua function's: scripts/loom/
 * schedule.lua), for `loom schedule` and for tests; loom_lua_check_schedule reads such lists
 * for the pipeline engine (core.session's schedule = lists).
 *
 * A list is a Lua array of instructions { op = "FWD", mb = 0, chunk = 0 } (chunk may be
 * left out: 0); lists[k] is stage k - 1's list. Positions in messages are 0-based, as
 * the C validator counts: "instruction 7" is list[8]. Unknown keys and ops are refused.
 * The C schedule and simulation live in a "loom.ScheduleBox" userdata made (with NULL
 * handles) before they are acquired, so a Lua error while reading the tables frees them.
 */
#include <lauxlib.h>
#include <lua.h>
#include <string.h>

#include "base/plugin_loader.h"
#include "base/status.h"
#include "lua_loom.h"
#include "train/schedule.h"

#define BOX_MT "loom.ScheduleBox"

typedef struct box { loom_schedule *s; loom_sched_sim *sim; } box;

static int box_gc(lua_State *L)
{
    box *b = luaL_checkudata(L, 1, BOX_MT);
    loom_sched_sim_free(b->sim);
    loom_schedule_free(b->s);
    b->sim = NULL;
    b->s = NULL;
    return 0;
}

static box *new_box(lua_State *L)
{
    box *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->s = NULL;
    b->sim = NULL;
    luaL_setmetatable(L, BOX_MT);
    return b;
}

static int raise_plain(lua_State *L, const char *msg)
{
    lua_pushstring(L, msg);
    return lua_error(L);
}

static int check_count(lua_State *L, int arg, const char *what)
{
    lua_Integer v = luaL_checkinteger(L, arg);
    if (v < 1 || v > 1 << 20)
        luaL_error(L, "%s must be a whole number >= 1, got %d", what, (int)v);
    return (int)v;
}

/* shape.key of the shape table at idx: a whole number >= 1 (dflt when absent and dflt > 0). */
static int shape_field(lua_State *L, int idx, const char *key, int dflt)
{
    int t = lua_getfield(L, idx, key), isnum;
    lua_Integer v = lua_tointegerx(L, -1, &isnum);
    lua_pop(L, 1);
    if (t == LUA_TNIL && dflt > 0)
        return dflt;
    if (!isnum || v < 1 || v > 1 << 20)
        luaL_error(L, "schedule shape: %s must be a whole number >= 1 (a shape is {stages = 4, "
                      "microbatches = 8, chunks = 1})", key);
    return (int)v;
}

const loom_schedule *loom_lua_plugin_schedule(lua_State *L, const char *name, int p, int m, int v)
{
    const loom_plugin *pl;
    if (loom_plugin_load(LOOM_KIND_SCHED, name, &pl) != LOOM_OK) {
        raise_plain(L, loom_last_error());
        return NULL; /* (not reached) */
    }
    box *b = new_box(L);
    if (loom_schedule_from_plugin(pl->desc, p, m, v, &b->s) != LOOM_OK)
        raise_plain(L, loom_last_error());
    return b->s;
}

/* core.sched_build(name, stages, microbatches, chunks) -> lists */
static int l_sched_build(lua_State *L)
{
    const char *name = luaL_checkstring(L, 1);
    int p = check_count(L, 2, "stages"), m = check_count(L, 3, "microbatches"),
        v = check_count(L, 4, "chunks");
    const loom_schedule *s = loom_lua_plugin_schedule(L, name, p, m, v); /* (its box on the stack) */
    lua_createtable(L, p, 0);
    for (int r = 0; r < p; r++) {
        lua_createtable(L, (int)s->n[r], 0);
        for (size_t i = 0; i < s->n[r]; i++) {
            loom_sched_instr in = s->list[r][i];
            lua_createtable(L, 0, 3);
            lua_pushstring(L, loom_sched_op_name(in.op));
            lua_setfield(L, -2, "op");
            lua_pushinteger(L, in.microbatch);
            lua_setfield(L, -2, "mb");
            lua_pushinteger(L, in.chunk);
            lua_setfield(L, -2, "chunk");
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
        lua_rawseti(L, -2, r + 1);
    }
    return 1;
}

static int int_field(lua_State *L, int idx, const char *key, int dflt, int stage, lua_Integer i)
{
    int t = lua_getfield(L, idx, key);
    int isnum;
    lua_Integer v = lua_tointegerx(L, -1, &isnum);
    lua_pop(L, 1);
    if (t == LUA_TNIL && dflt >= 0)
        return dflt;
    if (!isnum || v < -(1 << 30) || v > 1 << 30)
        luaL_error(L, "stage %d, instruction %d: %s must be a whole number (an instruction is "
                      "{op = \"FWD\", mb = 0, chunk = 0})", stage, (int)i, key);
    return (int)v;
}

/* Read lists (at idx) into b->s. */
static void read_lists(lua_State *L, int idx, box *b)
{
    const loom_schedule *s = b->s;
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_Integer got = luaL_len(L, idx);
    if (got != s->stages)
        luaL_error(L, "schedule: %d stage lists for stages = %d", (int)got, s->stages);
    for (int r = 0; r < s->stages; r++) {
        if (lua_rawgeti(L, idx, r + 1) != LUA_TTABLE)
            luaL_error(L, "schedule: stage %d's list is a %s, not a table of instructions", r,
                       luaL_typename(L, -1));
        int list = lua_gettop(L);
        lua_Integer n = luaL_len(L, list);
        for (lua_Integer i = 0; i < n; i++) {
            if (lua_rawgeti(L, list, i + 1) != LUA_TTABLE)
                luaL_error(L, "stage %d, instruction %d: a %s, not {op = \"FWD\", mb = 0, "
                              "chunk = 0}", r, (int)i, luaL_typename(L, -1));
            int t = lua_gettop(L);
            lua_pushnil(L);
            while (lua_next(L, t)) {
                const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
                if (!k || (strcmp(k, "op") && strcmp(k, "mb") && strcmp(k, "chunk")))
                    luaL_error(L, "stage %d, instruction %d: unknown key '%s' (an instruction "
                                  "is {op = \"FWD\", mb = 0, chunk = 0})", r, (int)i,
                               k ? k : luaL_tolstring(L, -2, NULL));
                lua_pop(L, 1);
            }
            lua_getfield(L, t, "op");
            const char *opname = lua_tostring(L, -1);
            loom_sched_op op = loom_sched_op_from_name(opname);
            if (op == 0)
                luaL_error(L, "stage %d, instruction %d: op '%s' is not one of FWD, BWD, "
                              "BWD_INPUT, BWD_WEIGHT, SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD",
                           r, (int)i, opname ? opname : "(none)");
            lua_pop(L, 1);
            loom_sched_instr in = {op, int_field(L, t, "mb", -1, r, i),
                                   int_field(L, t, "chunk", 0, r, i)};
            if (loom_schedule_push(b->s, r, in) != LOOM_OK)
                raise_plain(L, loom_last_error());
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
}

const loom_schedule *loom_lua_check_schedule(lua_State *L, int idx, int microbatches, int chunks)
{
    idx = lua_absindex(L, idx);
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_Integer stages = luaL_len(L, idx);
    if (stages < 1 || stages > 1 << 20)
        luaL_error(L, "schedule: %d stage lists (one per pipeline stage, at least 1)", (int)stages);
    box *b = new_box(L);
    if (loom_schedule_new((int)stages, microbatches, chunks, &b->s) != LOOM_OK)
        raise_plain(L, loom_last_error());
    read_lists(L, idx, b);
    return b->s;
}

static double cost_field(lua_State *L, int idx, const char *key, double dflt)
{
    lua_getfield(L, idx, key);
    double v = lua_isnil(L, -1) ? dflt : luaL_checknumber(L, -1);
    lua_pop(L, 1);
    return v;
}

/* costs.each (the costs table at idx), if given: one list per stage of one number per
 * instruction of that stage's list (schedule.h's each), into a userdata left on the stack
 * (freed by the GC, also after an error). */
static const double *const *read_each(lua_State *L, int idx, const loom_schedule *s)
{
    lua_getfield(L, idx, "each");
    if (lua_isnil(L, -1))
        return NULL;
    luaL_checktype(L, -1, LUA_TTABLE);
    int t = lua_gettop(L);
    size_t total = 0;
    for (int r = 0; r < s->stages; r++)
        total += s->n[r];
    double **rows = lua_newuserdatauv(L, (size_t)s->stages * sizeof(double *) +
                                      (total ? total : 1) * sizeof(double), 0);
    double *at = (double *)(rows + s->stages);
    for (int r = 0; r < s->stages; r++) {
        lua_rawgeti(L, t, r + 1);
        if (!lua_istable(L, -1) || lua_rawlen(L, -1) != s->n[r])
            luaL_error(L, "schedule: costs.each[%d] must list one cost per instruction of stage "
                       "%d's list (%d), got %s", r + 1, r, (int)s->n[r], lua_istable(L, -1) ?
                       lua_pushfstring(L, "%d", (int)lua_rawlen(L, -1)) : luaL_typename(L, -1));
        rows[r] = at;
        for (size_t i = 0; i < s->n[r]; i++) {
            lua_rawgeti(L, -1, (lua_Integer)i + 1);
            at[i] = luaL_checknumber(L, -1);
            lua_pop(L, 1);
        }
        at += s->n[r];
        lua_pop(L, 1);
    }
    return (const double *const *)rows;
}

/* core.sched_simulate(lists, {stages=, microbatches=, chunks=}
 *                     [, {fwd=1, bwd_input=1, bwd_weight=1, latency=0, rendezvous=false,
 *                         each={ {cost of each instruction of stage 0}, ... }}])
 *   -> {makespan=, bubble=, stages = { {busy=, peak=, spans = { {start, stop}, ... }}, ...}}
 * Raises the validator's or simulator's message for a bad list. */
static int l_sched_simulate(lua_State *L)
{
    luaL_checktype(L, 2, LUA_TTABLE);
    int p = shape_field(L, 2, "stages", 0), m = shape_field(L, 2, "microbatches", 0),
        v = shape_field(L, 2, "chunks", 1);
    loom_sched_costs c = LOOM_SCHED_COSTS_UNIT;
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        c.fwd = cost_field(L, 3, "fwd", c.fwd);
        c.bwd_input = cost_field(L, 3, "bwd_input", c.bwd_input);
        c.bwd_weight = cost_field(L, 3, "bwd_weight", c.bwd_weight);
        c.latency = cost_field(L, 3, "latency", c.latency);
        lua_getfield(L, 3, "rendezvous");
        c.rendezvous = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    box *b = new_box(L);
    if (loom_schedule_new(p, m, v, &b->s) != LOOM_OK)
        return raise_plain(L, loom_last_error());
    read_lists(L, 1, b);
    if (!lua_isnoneornil(L, 3))
        c.each = read_each(L, 3, b->s);
    if (loom_schedule_simulate(b->s, &c, &b->sim) != LOOM_OK)
        return raise_plain(L, loom_last_error());
    const loom_sched_sim *sim = b->sim;
    lua_createtable(L, 0, 3);
    lua_pushnumber(L, sim->makespan);
    lua_setfield(L, -2, "makespan");
    lua_pushnumber(L, sim->bubble);
    lua_setfield(L, -2, "bubble");
    lua_createtable(L, p, 0);
    for (int r = 0; r < p; r++) {
        lua_createtable(L, 0, 3);
        lua_pushnumber(L, sim->busy[r]);
        lua_setfield(L, -2, "busy");
        lua_pushinteger(L, sim->peak_inflight[r]);
        lua_setfield(L, -2, "peak");
        lua_createtable(L, (int)b->s->n[r], 0);
        for (size_t i = 0; i < b->s->n[r]; i++) {
            lua_createtable(L, 2, 0);
            lua_pushnumber(L, sim->span[r][i].start);
            lua_rawseti(L, -2, 1);
            lua_pushnumber(L, sim->span[r][i].end);
            lua_rawseti(L, -2, 2);
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
        lua_setfield(L, -2, "spans");
        lua_rawseti(L, -2, r + 1);
    }
    lua_setfield(L, -2, "stages");
    return 1;
}

static const luaL_Reg box_methods[] = {{NULL, NULL}};
static const luaL_Reg funcs[] = {{"sched_build", l_sched_build},
                                 {"sched_simulate", l_sched_simulate},
                                 {NULL, NULL}};

void loom_lua_open_sched(lua_State *L)
{
    loom_lua_new_class(L, BOX_MT, box_methods, box_gc);
    luaL_setfuncs(L, funcs, 0);
}
