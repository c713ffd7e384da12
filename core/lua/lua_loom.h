/* lua_loom.h — the loom.core Lua module, assembled from one C file per part. */
#ifndef LOOM_CORE_LUA_LOOM_H
#define LOOM_CORE_LUA_LOOM_H

#include <lua.h>

#include "io/data.h"
#include "train/session.h"

#define LOOM_SESSION_MT "loom.Session"

int luaopen_loom_core(lua_State *L);

struct luaL_Reg;
/* Register a userdata class: metatable `name` with methods as __index and gc as both __gc
 * and __close (so a `<close>` variable frees the resource at once). */
void loom_lua_new_class(lua_State *L, const char *name, const struct luaL_Reg *methods,
                        lua_CFunction gc);

/* lua_data.c: register core.text_data, core.random_data and the "loom.Data" class into
 * the table on top of the stack. */
void loom_lua_open_data(lua_State *L);
/* The data source at idx (a "loom.Data"), raising a Lua error if it is not one. */
loom_data *loom_lua_check_data(lua_State *L, int idx);
/* The open session at idx (a "loom.Session"), raising a Lua error if not one or closed. */
loom_session *loom_lua_check_session(lua_State *L, int idx);
/* lua_checkpoint.c: session:save, session:load and core.find_checkpoint, into the table
 * on top of the stack; call after the session class exists. */
void loom_lua_open_checkpoint(lua_State *L);
/* lua_kd_cache.c: session:write_kd_cache (loom distill-cache); after the session class. */
void loom_lua_open_kd_cache(lua_State *L);
/* lua_llmc.c: core.llmc_config, core.llmc_load, core.llmc_save into the table on top. */
void loom_lua_open_llmc(lua_State *L);
/* lua_sys.c: register core.isatty, core.peak_rss, core.now, core.mkdir_p into the table on top. */
void loom_lua_open_sys(lua_State *L);

/* lua_dist.c: core.init_dist{comm, dp, tp, pp, timeout_ms} builds the mesh. */
void loom_lua_open_dist(lua_State *L);

/* lua_sched.c: core.sched_build, core.sched_simulate (pipeline schedules) into the table on top. */
void loom_lua_open_sched(lua_State *L);
/* lua_plan.c: core.footprint, core.zero_padded, core.bench_device (loom plan). */
void loom_lua_open_plan(lua_State *L);
/* lua_plan_pages.c: core.bench_refault (loom plan --calibrate), into the table on top. */
void loom_lua_open_plan_pages(lua_State *L);
/* lua_plan_disk.c: core.bench_disk (loom plan --calibrate), into the table on top. */
void loom_lua_open_plan_disk(lua_State *L);
/* lua_plan_bring.c: core.bench_bring (loom plan --calibrate), into the table on top. */
void loom_lua_open_plan_bring(lua_State *L);
/* The lists at idx (lists[k]: stage k - 1's, as core.sched_simulate takes them; stages =
 * their count) read into a schedule owned by a userdata pushed on the stack (keep it there
 * while the schedule is used). Only the form is checked here (ops, keys, numbers): a Lua
 * error names the stage and instruction; the validator's rules are schedule.h's. */
struct loom_schedule;
const struct loom_schedule *loom_lua_check_schedule(lua_State *L, int idx, int microbatches,
                                                    int chunks);
/* The sched plugin `name`'s lists for that shape (core.sched_build's, without the Lua
 * tables), in a schedule owned by a userdata pushed on the stack; a Lua error with the
 * plugin's reason where it refuses the shape. */
const struct loom_schedule *loom_lua_plugin_schedule(lua_State *L, const char *name, int stages,
                                                     int microbatches, int chunks);

/* lua_bench.c: core.comm_bench{op, min, max, iters} for `loom bench comm`. */
void loom_lua_open_bench(lua_State *L);

#endif
