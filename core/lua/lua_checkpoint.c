/* lua_checkpoint.c — checkpoints from Lua: session:save, session:load,
 * core.find_checkpoint, core.list_checkpoints, core.verify_checkpoint and
 * session:export_safetensors (see
 * checkpoint.h for the format and its guarantees; `loom ckpt` uses the last two).
 *
 * What not: no policy (when to save, how many to keep, resume=auto) — that is the Lua
 * library's (scripts/loom/train.lua).
 * Invariants: options tables refuse unknown keys; the config string a load returns is
 * owned by a userdata with __gc until it is pushed, so a Lua error (even out of memory)
 * never leaks it.
 */
#include <dirent.h>
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/zero.h"
#include "lua_loom.h"
#include "base/status.h"

#define EXTRA_MT "loom.CheckpointExtra"

static int raise_status(lua_State *L)
{
    lua_pushstring(L, loom_last_error());
    return lua_error(L);
}

static void data_position(loom_data *d, loom_checkpoint_extra *x)
{
    snprintf(x->data_kind, sizeof x->data_kind, "%s", d->ops->kind);
    x->n_data_state = d->ops->get_state(d->self, x->data_state);
}

/* s:save(dir, {step=, config_json=, data=, keep=, protect=}) -> path of the new checkpoint.
 * step defaults to the optimizer steps taken; keep to 0 (keep all); protect: a step_* name
 * that retention keeps beside the newest `keep`. Collective in a
 * multi-rank run: every rank calls it with the same arguments (checkpoint.h). */
static int l_save(lua_State *L)
{
    loom_session *s = loom_lua_check_session(L, 1);
    const char *dir = luaL_checkstring(L, 2);
    loom_checkpoint_extra x;
    memset(&x, 0, sizeof x);
    x.step = loom_session_steps_taken(s);
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        lua_pushnil(L);
        while (lua_next(L, 3)) {
            const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
            if (strcmp(k, "step") && strcmp(k, "config_json") && strcmp(k, "data") && strcmp(k, "keep") &&
                strcmp(k, "protect"))
                return luaL_error(L, "save: unknown option '%s' (step, config_json, data, keep, "
                                     "protect)", k);
            lua_pop(L, 1);
        }
        lua_getfield(L, 3, "step");
        if (!lua_isnil(L, -1))
            x.step = luaL_checkinteger(L, -1);
        lua_getfield(L, 3, "keep");
        lua_Integer keep = luaL_optinteger(L, -1, 0);
        lua_getfield(L, 3, "config_json");
        x.config_json = lua_isnil(L, -1) ? NULL : luaL_checkstring(L, -1);
        lua_getfield(L, 3, "data");
        if (!lua_isnil(L, -1))
            data_position(loom_lua_check_data(L, -1), &x);
        if (x.step < 0 || keep < 0 || keep > INT_MAX)
            return luaL_error(L, "save: step=%I and keep=%I must be >= 0", (lua_Integer)x.step, keep);
        x.keep = (int)keep;
        lua_getfield(L, 3, "protect"); /* a step_* name retention must not delete */
        if (!lua_isnil(L, -1))
            snprintf(x.protect, sizeof x.protect, "%s", luaL_checkstring(L, -1));
        /* the config string stays referenced from the options table during the save */
    }
    char path[PATH_MAX];
    if (loom_checkpoint_save(s, dir, &x, path, sizeof path) != LOOM_OK)
        return raise_status(L);
    lua_pushstring(L, path);
    return 1;
}

static int extra_gc(lua_State *L)
{
    loom_checkpoint_extra_free(luaL_checkudata(L, 1, EXTRA_MT));
    return 0;
}

/* s:load(path [, data]) -> {step=, config_json=, data={kind=, w1, w2, ...}}. With data,
 * its reading position is restored too. Nothing changes if the checkpoint is refused. */
static int l_load(lua_State *L)
{
    loom_session *s = loom_lua_check_session(L, 1);
    const char *path = luaL_checkstring(L, 2);
    loom_data *data = lua_isnoneornil(L, 3) ? NULL : loom_lua_check_data(L, 3);
    loom_checkpoint_extra *x = lua_newuserdatauv(L, sizeof *x, 0);
    memset(x, 0, sizeof *x);
    luaL_setmetatable(L, EXTRA_MT);
    if (loom_checkpoint_load_data(s, path, data, x) != LOOM_OK)
        return raise_status(L);
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, x->step);
    lua_setfield(L, -2, "step");
    if (x->config_json) {
        lua_pushstring(L, x->config_json);
        lua_setfield(L, -2, "config_json");
    }
    if (x->data_kind[0]) {
        lua_createtable(L, x->n_data_state, 1);
        for (int i = 0; i < x->n_data_state; i++) {
            lua_pushinteger(L, (lua_Integer)x->data_state[i]);
            lua_rawseti(L, -2, i + 1);
        }
        lua_pushstring(L, x->data_kind);
        lua_setfield(L, -2, "kind");
        lua_setfield(L, -2, "data");
    }
    return 1; /* the userdata below is collected later and frees the config */
}

/* core.find_checkpoint(dir) -> path, or nil and why */
static int l_find(lua_State *L)
{
    char path[PATH_MAX];
    if (loom_checkpoint_find(luaL_checkstring(L, 1), path, sizeof path) != LOOM_OK) {
        lua_pushnil(L);
        lua_pushstring(L, loom_last_error());
        return 2;
    }
    lua_pushstring(L, path);
    return 1;
}

/* core.list_checkpoints(dir) -> { "step_00000020", "step_00000015", ... }: every
 * step_<digits> entry of dir, complete or not, by step number newest first, and as a second
 * result the name `latest` holds (nil when none); nil, why when dir cannot be read. What
 * to resume from is the caller's policy (train.lua: resume=auto). */
static int l_list(lua_State *L)
{
    const char *dir = luaL_checkstring(L, 1);
    DIR *d = opendir(dir);
    if (!d) {
        lua_pushnil(L);
        lua_pushfstring(L, "cannot read checkpoint directory '%s'", dir);
        return 2;
    }
    lua_newtable(L);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *p = e->d_name;
        if (strncmp(p, "step_", 5) != 0 || !p[5] || strspn(p + 5, "0123456789") != strlen(p + 5))
            continue;
        lua_pushstring(L, p);
        lua_rawseti(L, -2, ++n);
    }
    closedir(d);
    /* newest first: by the number (names are zero-padded, but a step past 8 digits is not) */
    luaL_dostring(L, "return function(t) table.sort(t, function(a, b) "
                     "return tonumber(a:sub(6)) > tonumber(b:sub(6)) end) end");
    lua_pushvalue(L, -2);
    lua_call(L, 1, 0);
    char path[PATH_MAX], name[64] = "";
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fgets(name, sizeof name, f))
            name[strcspn(name, "\r\n")] = '\0';
        fclose(f);
    }
    if (name[0])
        lua_pushstring(L, name);
    else
        lua_pushnil(L);
    return 2;
}

/* core.verify_checkpoint(ckpt) -> bytes checked; raises the first damage found. */
static int l_verify(lua_State *L)
{
    uint64_t bytes = 0;
    if (loom_ckpt_verify(luaL_checkstring(L, 1), &bytes) != LOOM_OK)
        return raise_status(L);
    lua_pushinteger(L, (lua_Integer)bytes);
    return 1;
}

/* s:export_safetensors(path, {key = "value", ...} [, {names = {...}, rows = {...}}]) -> bytes
 * written: every parameter of a session that holds whole tensors (tp = pp = 1), F32 under
 * its table name and logical shape, in table order, the strings as __metadata__. The
 * optional third table renames (names[loom name] = the file's name; every parameter must
 * have one) and keeps only the first rows[loom name] rows of a tensor (the vocabulary
 * without its padding rows: the data are row-major, so a prefix). */
static int l_export(lua_State *L)
{
    loom_session *s = loom_lua_check_session(L, 1);
    const char *path = luaL_checkstring(L, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    int opts = lua_istable(L, 4) ? 4 : 0;
    loom_gpt *m = loom_session_model(s);
    const loom_param_table *t = loom_gpt_params(m);
    struct loom_zero *z = loom_session_zero(s);
    if (z && loom_zero_stage(z) == 3) /* the model's fp32 buffer holds only gathered units */
        return luaL_error(L, "export_safetensors: under strategy zero=3 each rank keeps its "
                          "partition of the fp32 parameters; save a checkpoint and use loom ckpt "
                          "export on it");
    const float *data = loom_session_host_params(s); /* filled before the write, below */
    for (int i = 0; i < t->count; i++)
        for (int d = 0; d < t->entries[i].ndim; d++)
            if (t->entries[i].slice_len[d] != t->entries[i].shape[d])
                return luaL_error(L, "export_safetensors: '%s' is a slice; the session must hold "
                                  "whole tensors (tp = 1, pp = 1)", t->entries[i].name);
    int n_meta = 0;
    lua_pushnil(L);
    while (lua_next(L, 3)) {
        luaL_argcheck(L, lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TSTRING, 3,
                      "metadata keys and values must be strings");
        n_meta++;
        lua_pop(L, 1);
    }
    loom_st_tensor *ts = lua_newuserdatauv(L, sizeof *ts * (size_t)(t->count + 1), 0);
    loom_st_meta *meta = lua_newuserdatauv(L, sizeof *meta * (size_t)(n_meta + 1), 0);
    n_meta = 0;
    lua_pushnil(L);
    while (lua_next(L, 3)) { /* the strings stay alive in the table at 3 */
        meta[n_meta++] = (loom_st_meta){lua_tostring(L, -2), lua_tostring(L, -1)};
        lua_pop(L, 1);
    }
    int64_t *shapes = lua_newuserdatauv(L, sizeof(int64_t) * LOOM_PARAM_MAX_DIMS *
                                               (size_t)(t->count + 1), 0);
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        int64_t *shape = shapes + (size_t)i * LOOM_PARAM_MAX_DIMS;
        memcpy(shape, e->shape, sizeof(int64_t) * LOOM_PARAM_MAX_DIMS);
        const char *name = e->name;
        if (opts) { /* the strings stay alive in the options table */
            lua_getfield(L, opts, "names");
            if (lua_istable(L, -1)) {
                if (lua_getfield(L, -1, e->name) != LUA_TSTRING)
                    return luaL_error(L, "export_safetensors: no file name for '%s'", e->name);
                name = lua_tostring(L, -1);
                lua_pop(L, 1);
            }
            lua_pop(L, 1);
            lua_getfield(L, opts, "rows");
            if (lua_istable(L, -1)) {
                if (lua_getfield(L, -1, e->name) == LUA_TNUMBER) {
                    lua_Integer rows = lua_tointeger(L, -1);
                    if (rows < 1 || rows > shape[0])
                        return luaL_error(L, "export_safetensors: rows %d of '%s' outside "
                                          "[1, %d]", (int)rows, e->name, (int)shape[0]);
                    shape[0] = rows;
                }
                lua_pop(L, 1);
            }
            lua_pop(L, 1);
        }
        ts[i] = (loom_st_tensor){name, LOOM_DTYPE_F32, e->ndim, shape, data + e->offset};
    }
    uint64_t bytes, sum;
    /* zero=1/2 with 16-bit weights: the file is the fp32 master, as without the partition
     * (not the 16-bit compute copy, which would round it): gathered whole into the model's
     * buffer for the write (a collective: every rank calls this), its pages released after;
     * then a device backend's parameters copied into the host mirror the tensors point at */
    if (z && loom_zero_master_gather(z) != LOOM_OK)
        return raise_status(L);
    loom_session_to_host(s);
    loom_status st = loom_safetensors_write(path, ts, t->count, meta, n_meta, &bytes, &sum);
    if (z)
        loom_zero_master_release(z);
    if (st != LOOM_OK)
        return raise_status(L);
    lua_pushinteger(L, (lua_Integer)bytes);
    return 1;
}

void loom_lua_open_checkpoint(lua_State *L)
{
    luaL_newmetatable(L, EXTRA_MT);
    lua_pushcfunction(L, extra_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    /* add save and load to the session class (registered before this is called) */
    luaL_getmetatable(L, LOOM_SESSION_MT);
    lua_getfield(L, -1, "__index");
    lua_pushcfunction(L, l_save);
    lua_setfield(L, -2, "save");
    lua_pushcfunction(L, l_load);
    lua_setfield(L, -2, "load");
    lua_pushcfunction(L, l_export);
    lua_setfield(L, -2, "export_safetensors");
    lua_pop(L, 2);
    lua_pushcfunction(L, l_verify);
    lua_setfield(L, -2, "verify_checkpoint");
    lua_pushcfunction(L, l_find);
    lua_setfield(L, -2, "find_checkpoint");
    lua_pushcfunction(L, l_list);
    lua_setfield(L, -2, "list_checkpoints");
}
