/* lua_loom.c — the `loom.core` Lua module: C resources and speed for the Lua library in
 * scripts/loom/. Shape, defaults and recipe validation live in Lua; this file only checks
 * what C must check itself.
 *
 * Userdata are created with a NULL handle and their metatable before the resource is
 * acquired (as liolib does), so an error never leaves a half-built object. Errors are
 * raised without a position ("plain"); the Lua library adds the recipe's file:line.
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "lua_limits.h"
#include "lua_loom.h"
#include "base/plugin_loader.h"
#include "train/compress.h"
#include "train/offload.h"
#include "train/session.h"
#include "base/status.h"

#define SESSION_MT LOOM_SESSION_MT

static int raise_plain(lua_State *L, const char *msg)
{
    lua_pushstring(L, msg);
    return lua_error(L);
}

static int raise_status(lua_State *L) { return raise_plain(L, loom_last_error()); }

static int kind_from_name(const char *s)
{
    for (int k = LOOM_KIND_COMM; k <= LOOM_KIND_BACKEND; k++)
        if (strcmp(loom_kind_name((loom_kind)k), s) == 0)
            return k;
    return 0;
}

/* --- plugins ------------------------------------------------------------------------ */

typedef struct scan_ctx { lua_State *L; int n; } scan_ctx;

static void scan_visit(void *vctx, const char *path, const loom_plugin *p, const char *refusal)
{
    scan_ctx *c = vctx;
    lua_State *L = c->L;
    lua_createtable(L, 0, 6);
    lua_pushstring(L, path);
    lua_setfield(L, -2, "path");
    if (p) {
        lua_pushstring(L, loom_kind_name(p->desc->kind));
        lua_setfield(L, -2, "kind");
        lua_pushstring(L, p->desc->name);
        lua_setfield(L, -2, "name");
        lua_pushstring(L, p->desc->version);
        lua_setfield(L, -2, "version");
        lua_pushstring(L, p->desc->summary);
        lua_setfield(L, -2, "summary");
    } else {
        lua_pushstring(L, refusal);
        lua_setfield(L, -2, "refused");
    }
    lua_rawseti(L, -2, ++c->n);
}

/* core.plugins() -> { {kind, name, version, path, summary} or {path, refused}, ... } */
static int l_plugins(lua_State *L)
{
    lua_newtable(L);
    scan_ctx c = {L, 0};
    loom_plugin_scan(scan_visit, &c);
    return 1;
}

static const loom_plugin *load_plugin(lua_State *L, const char *kind, const char *name)
{
    int k = kind_from_name(kind);
    if (!k)
        luaL_error(L, "unknown plugin kind '%s'", kind);
    const loom_plugin *p;
    if (loom_plugin_load((loom_kind)k, name, &p) != LOOM_OK)
        raise_status(L);
    return p;
}

/* core.plugin_keys(kind, name) -> { {name=, type=, default=, help=}, ... } */
static int l_plugin_keys(lua_State *L)
{
    const loom_plugin *p = load_plugin(L, luaL_checkstring(L, 1), luaL_checkstring(L, 2));
    lua_createtable(L, (int)p->desc->n_config_keys, 0);
    for (uint32_t i = 0; i < p->desc->n_config_keys; i++) {
        const loom_config_key *k = &p->desc->config_keys[i];
        lua_createtable(L, 0, 4);
        lua_pushstring(L, k->name);
        lua_setfield(L, -2, "name");
        lua_pushstring(L, loom_cfg_type_name(k->type));
        lua_setfield(L, -2, "type");
        if (k->default_value) {
            lua_pushstring(L, k->default_value);
            lua_setfield(L, -2, "default");
        }
        lua_pushstring(L, k->help ? k->help : "");
        lua_setfield(L, -2, "help");
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* Resolve the plugin table at idx ({ "adamw", lr = 1e-3, ... } or { name = "adamw", ... })
 * into cfg. The plugin's own key table decides what is accepted. */
static void plugin_config_from_table(lua_State *L, int idx, const char *kind, loom_plugin_config *cfg)
{
    idx = lua_absindex(L, idx);
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_getfield(L, idx, "name");
    const char *name = lua_tostring(L, -1);
    if (!name)
        luaL_error(L, "%s table needs a name", kind);
    const loom_plugin *p = load_plugin(L, kind, name);
    lua_pop(L, 1);
    if (loom_config_init(cfg, p->desc) != LOOM_OK)
        raise_status(L);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        loom_status st = LOOM_OK;
        if (lua_type(L, -2) != LUA_TSTRING) {
            lua_pop(L, 1);
            continue;
        }
        const char *key = lua_tostring(L, -2);
        if (strcmp(key, "name") == 0) {
            lua_pop(L, 1);
            continue;
        }
        switch (lua_type(L, -1)) {
        case LUA_TNUMBER: st = loom_config_set_number(cfg, key, lua_tonumber(L, -1)); break;
        case LUA_TBOOLEAN: st = loom_config_set_boolean(cfg, key, lua_toboolean(L, -1)); break;
        case LUA_TSTRING: st = loom_config_set_string(cfg, key, lua_tostring(L, -1)); break;
        case LUA_TTABLE: {
            double v[LOOM_CFG_MAX_NUMBERS];
            int n = (int)lua_rawlen(L, -1);
            if (n > LOOM_CFG_MAX_NUMBERS)
                n = LOOM_CFG_MAX_NUMBERS + 1;
            for (int i = 0; i < n && i < LOOM_CFG_MAX_NUMBERS; i++) {
                lua_rawgeti(L, -1, i + 1);
                if (!lua_isnumber(L, -1))
                    luaL_error(L, "%s '%s' key '%s' must be a list of numbers", kind, name, key);
                v[i] = lua_tonumber(L, -1);
                lua_pop(L, 1);
            }
            st = loom_config_set_numbers(cfg, key, v, n);
            break;
        }
        default:
            st = loom_fail(LOOM_ERR_INVALID, "%s '%s' key '%s' cannot be a %s", kind, name, key,
                           luaL_typename(L, -1));
        }
        if (st != LOOM_OK)
            raise_status(L);
        lua_pop(L, 1);
    }
    if (loom_config_finish(cfg) != LOOM_OK)
        raise_status(L);
}

/* core.check_plugin(kind, table): resolve a plugin table without creating anything. */
static int l_check_plugin(lua_State *L)
{
    loom_plugin_config cfg;
    plugin_config_from_table(L, 2, luaL_checkstring(L, 1), &cfg);
    return 0;
}

/* --- sessions ----------------------------------------------------------------------- */

typedef struct session_box { loom_session *s; int vocab; } session_box;

static int int_field(lua_State *L, int idx, const char *key, int dflt)
{
    lua_getfield(L, idx, key);
    int v = lua_isnil(L, -1) ? dflt : (int)luaL_checkinteger(L, -1);
    lua_pop(L, 1);
    return v;
}

static double num_field(lua_State *L, int idx, const char *key, double dflt)
{
    lua_getfield(L, idx, key);
    double v = lua_isnil(L, -1) ? dflt : luaL_checknumber(L, -1);
    lua_pop(L, 1);
    return v;
}

/* A model table (loom.gpt{...} / loom.llama{...}, or a checkpoint manifest's model object:
 * the student's and the teacher's) -> its config; the table at m. 0, or raises a Lua error. */
static int gpt_config_from_table(lua_State *L, int m, loom_gpt_config *c)
{
    memset(c, 0, sizeof *c);
    c->vocab = int_field(L, m, "vocab", 0);
    c->vocab_padded = int_field(L, m, "vocab_padded", 0);
    c->ctx = int_field(L, m, "ctx", 0);
    c->layers = int_field(L, m, "layers", 0);
    c->heads = int_field(L, m, "heads", 0);
    c->dim = int_field(L, m, "dim", 0);
    lua_getfield(L, m, "moe"); /* loom.gpt{moe = {...}}, checked and defaulted in init.lua */
    if (lua_istable(L, -1)) {
        int e = lua_gettop(L);
        loom_moe_config *mo = &c->moe;
        mo->experts = int_field(L, e, "experts", 0);
        mo->top_k = int_field(L, e, "top_k", 0);
        mo->every = int_field(L, e, "every", 0);
        mo->capacity_factor = num_field(L, e, "capacity_factor", 0.0);
        mo->aux_loss = num_field(L, e, "aux_loss", 0.0);
        mo->z_loss = num_field(L, e, "z_loss", 0.0);
        mo->noise_std = num_field(L, e, "noise_std", 0.0);
        lua_getfield(L, e, "router");
        mo->noisy = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), "noisy_topk") == 0;
        lua_pop(L, 1);
        lua_getfield(L, e, "overlap");
        mo->overlap = lua_toboolean(L, -1);
        lua_getfield(L, e, "zero_prefetch");
        mo->zero_prefetch = lua_toboolean(L, -1);
        lua_pop(L, 2);
    }
    lua_pop(L, 1);
    lua_getfield(L, m, "family"); /* loom.llama{...}: "llama"; loom.gpt{...}: none */
    if (lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), "llama") == 0)
        c->family = LOOM_FAMILY_LLAMA;
    else if (!lua_isnil(L, -1))
        return luaL_error(L, "model family '%s' is not gpt2 or llama", luaL_tolstring(L, -1, NULL));
    lua_pop(L, 1);
    c->kv_heads = int_field(L, m, "kv_heads", 0);
    c->ffn_dim = int_field(L, m, "ffn_dim", 0);
    c->rope_theta = (float)num_field(L, m, "rope_theta", 0.0);
    c->norm_eps = (float)num_field(L, m, "norm_eps", 0.0);
    lua_getfield(L, m, "tie_embeddings");
    c->tie_embeddings = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return 0;
}

/* core.session{model={...}, micro=, seq=, accum=, seed=, grad_clip=, backend=, threads=,
 *              optimizer={name=...,...}, precision={name=...,...}} */
static int l_session(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    session_box *box = lua_newuserdatauv(L, sizeof *box, 0);
    box->s = NULL;
    luaL_setmetatable(L, SESSION_MT);

    loom_session_config cfg;
    memset(&cfg, 0, sizeof cfg);
    lua_getfield(L, 1, "model");
    luaL_checktype(L, -1, LUA_TTABLE);
    int m = lua_gettop(L);
    gpt_config_from_table(L, m, &cfg.model);
    lua_pop(L, 1);
    cfg.micro_batch = int_field(L, 1, "micro", 0);
    cfg.seq = int_field(L, 1, "seq", 0);
    cfg.accum = int_field(L, 1, "accum", 1);
    cfg.seed = (uint64_t)int_field(L, 1, "seed", 0);
    cfg.grad_clip = (float)num_field(L, 1, "grad_clip", 1.0);
    lua_getfield(L, 1, "on_nonfinite"); /* "skip" (default) or "stop", checked in Lua */
    cfg.stop_on_nonfinite = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), "stop") == 0;
    lua_pop(L, 1);
    cfg.threads = int_field(L, 1, "threads", 0);
    lua_getfield(L, 1, "backend");
    cfg.backend = lua_isnil(L, -1) ? "cpu" : luaL_checkstring(L, -1);
    /* kept on the stack while the session is created */

    /* Plain structs, no resource to leak if a Lua error is raised while they are filled;
     * static because they are large and only read during the plugins' create(). */
    static _Thread_local loom_plugin_config optim, precision, strategy, tensor;
    lua_getfield(L, 1, "optimizer");
    plugin_config_from_table(L, -1, "optim", &optim);
    lua_getfield(L, 1, "precision");
    plugin_config_from_table(L, -1, "precision", &precision);
    lua_pop(L, 2);
    cfg.optim = &optim;
    cfg.precision = &precision;
    lua_getfield(L, 1, "strategy"); /* { name = "dp", bucket_mb = ... } when dp > 1 */
    if (!lua_isnil(L, -1)) {
        plugin_config_from_table(L, -1, "strategy", &strategy);
        cfg.strategy = &strategy;
    }
    lua_pop(L, 1);
    lua_getfield(L, 1, "tensor"); /* { name = "tp", sequence_parallel = ... } when tp > 1 */
    if (!lua_isnil(L, -1)) {
        plugin_config_from_table(L, -1, "strategy", &tensor);
        cfg.tensor = &tensor;
    }
    lua_pop(L, 1);
    lua_getfield(L, 1, "canonical");
    cfg.canonical = lua_toboolean(L, -1);
    lua_pop(L, 1);
    /* pipeline (used when the mesh has pp > 1): schedule = "1f1b" (a plugin) or every
     * stage's list (a Lua schedule's, schedule_name = its name), chunks =, pp_layers = {} */
    cfg.pp_chunks = int_field(L, 1, "chunks", 1);
    int lists_at = 0; /* the lists' owner on the stack, removed after the create */
    lua_getfield(L, 1, "schedule");
    if (lua_istable(L, -1)) {
        cfg.schedule_lists = loom_lua_check_schedule(L, -1, cfg.accum, cfg.pp_chunks);
        lua_remove(L, -2); /* the table; its owner (a userdata) stays */
        lists_at = lua_gettop(L);
        lua_getfield(L, 1, "schedule_name"); /* the string stays alive in the table */
        cfg.schedule_name = lua_isnil(L, -1) ? NULL : luaL_checkstring(L, -1);
        lua_pop(L, 1);
    } else {
        if (!lua_isnil(L, -1)) {
            const loom_plugin *sp;
            if (loom_plugin_load(LOOM_KIND_SCHED, luaL_checkstring(L, -1), &sp) != LOOM_OK)
                return raise_status(L);
            cfg.schedule = sp->desc;
        }
        lua_pop(L, 1);
    }
    cfg.zero_stage = int_field(L, 1, "zero", 0); /* strategy = { zero = N } */
    cfg.ep = int_field(L, 1, "ep", 1);          /* mesh.ep: expert parallelism */
    cfg.zero_bucket_mb = num_field(L, 1, "zero_bucket_mb", 0.0);
    /* strategy = { offload = { optimizer = "host" | "disk", path =, chunk_mb = } } */
    lua_getfield(L, 1, "offload");
    if (!lua_isnil(L, -1)) {
        const char *mode = luaL_checkstring(L, -1);
        cfg.offload_mode = !strcmp(mode, "host") ? LOOM_OFFLOAD_HOST
                           : !strcmp(mode, "disk") ? LOOM_OFFLOAD_DISK : -1;
        if (cfg.offload_mode < 0)
            return luaL_error(L, "offload optimizer=\"%s\": \"host\" or \"disk\"", mode);
    }
    lua_pop(L, 1);
    lua_getfield(L, 1, "offload_path"); /* the string stays alive in the table at index 1 */
    cfg.offload_path = lua_isnil(L, -1) ? NULL : luaL_checkstring(L, -1);
    lua_pop(L, 1);
    cfg.offload_chunk_mb = num_field(L, 1, "offload_chunk_mb", 0.0);
    lua_getfield(L, 1, "offload_params"); /* zero=3's parameter partition offloaded too */
    cfg.offload_params = lua_toboolean(L, -1);
    lua_pop(L, 1);
    /* strategy = { compress = { "onebit" | "topk", ratio =, warmup =, bucket_mb = } } */
    lua_getfield(L, 1, "compress");
    if (!lua_isnil(L, -1)) {
        const char *method = luaL_checkstring(L, -1);
        cfg.compress_method = loom_compress_method_of(method);
        if (cfg.compress_method < 0)
            return luaL_error(L, "compress=\"%s\": \"onebit\", \"topk\" or \"powersgd\"", method);
    }
    lua_pop(L, 1);
    cfg.compress_ratio = num_field(L, 1, "compress_ratio", 0.01);
    cfg.compress_warmup = int_field(L, 1, "compress_warmup", 0);
    cfg.compress_bucket_mb = num_field(L, 1, "compress_bucket_mb", 0.0);
    cfg.compress_rank = int_field(L, 1, "compress_rank", 2);
    lua_getfield(L, 1, "compress_momentum");
    cfg.compress_momentum = lua_toboolean(L, -1);
    lua_pop(L, 1);
    /* teacher = { the model's keys, as model's }, teacher_init = path |
     * teacher_checkpoint = dir, kd_temperature =, kd_alpha = (checked in Lua) */
    static _Thread_local loom_gpt_config teacher;
    lua_getfield(L, 1, "teacher");
    if (!lua_isnil(L, -1)) {
        luaL_checktype(L, -1, LUA_TTABLE);
        int t = lua_gettop(L);
        gpt_config_from_table(L, t, &teacher); /* a llama or MoE teacher's keys too */
        cfg.teacher = &teacher;
    }
    lua_pop(L, 1);
    lua_getfield(L, 1, "teacher_init"); /* the strings stay alive in the table at index 1 */
    cfg.teacher_init = lua_isnil(L, -1) ? NULL : luaL_checkstring(L, -1);
    lua_getfield(L, 1, "teacher_checkpoint");
    cfg.teacher_checkpoint = lua_isnil(L, -1) ? NULL : luaL_checkstring(L, -1);
    lua_getfield(L, 1, "kd_cache");
    cfg.kd_cache = lua_isnil(L, -1) ? NULL : luaL_checkstring(L, -1);
    lua_pop(L, 3);
    cfg.kd_temperature = (float)num_field(L, 1, "kd_temperature", 1.0);
    cfg.kd_alpha = (float)num_field(L, 1, "kd_alpha", 0.5);
    cfg.kd_teacher_tp = int_field(L, 1, "kd_teacher_tp", 1);
    cfg.kd_teacher_pp = int_field(L, 1, "kd_teacher_pp", 1);
    /* kd_layers = { [student_block] = teacher_block } (checked in Lua): the student's
     * projections (teacher width) and the session's map */
    static _Thread_local int kd_map[64];
    lua_getfield(L, 1, "kd_layers");
    if (lua_istable(L, -1) && cfg.teacher && cfg.model.layers <= 64) {
        for (int l = 0; l < 64; l++)
            kd_map[l] = -1;
        for (int l = 0; l < cfg.model.layers; l++) {
            lua_geti(L, -1, l);
            if (lua_isinteger(L, -1)) {
                kd_map[l] = (int)lua_tointeger(L, -1);
                cfg.model.kd_proj_layers |= 1ull << l;
            }
            lua_pop(L, 1);
        }
        cfg.model.kd_proj_dim = cfg.teacher->dim;
        cfg.kd_layers = kd_map;
        cfg.kd_hidden = (float)num_field(L, 1, "kd_hidden", 1.0);
        cfg.kd_attention = (float)num_field(L, 1, "kd_attention", 0.0); /* 0: none */
    }
    lua_pop(L, 1);
    static _Thread_local int pp_layers[1024];
    lua_getfield(L, 1, "pp_layers");
    if (!lua_isnil(L, -1)) {
        luaL_checktype(L, -1, LUA_TTABLE);
        lua_Integer n = luaL_len(L, -1);
        if (n > 1024)
            return luaL_error(L, "pp_layers has %d entries (at most 1024)", (int)n);
        for (lua_Integer i = 1; i <= n; i++) {
            lua_geti(L, -1, i);
            pp_layers[i - 1] = (int)luaL_checkinteger(L, -1);
            lua_pop(L, 1);
        }
        cfg.pp_layers = pp_layers;
        cfg.n_pp_layers = (int)n;
    }
    lua_pop(L, 1);
    /* recompute = "none" | "full" | "selective" | { block indices } (checked in init.lua) */
    static _Thread_local unsigned char recompute_layers[1024];
    lua_getfield(L, 1, "recompute");
    if (lua_type(L, -1) == LUA_TSTRING) {
        const char *r = lua_tostring(L, -1);
        cfg.recompute = strcmp(r, "full") == 0        ? LOOM_RECOMPUTE_FULL
                        : strcmp(r, "selective") == 0 ? LOOM_RECOMPUTE_SELECTIVE
                        : strcmp(r, "none") == 0      ? LOOM_RECOMPUTE_NONE
                                                      : -1;
        if (cfg.recompute < 0)
            return luaL_error(L, "recompute=\"%s\" is not none, full, selective or a list of "
                              "blocks", r);
    } else if (lua_istable(L, -1)) {
        if (cfg.model.layers < 1 || cfg.model.layers > 1024)
            return luaL_error(L, "recompute by blocks needs 1..1024 model layers");
        memset(recompute_layers, 0, sizeof recompute_layers);
        for (lua_Integer i = 1, n = luaL_len(L, -1); i <= n; i++) {
            lua_geti(L, -1, i);
            lua_Integer l = luaL_checkinteger(L, -1);
            if (l < 0 || l >= cfg.model.layers)
                return luaL_error(L, "recompute block %d is not one of 0..%d", (int)l,
                                  cfg.model.layers - 1);
            recompute_layers[l] = 1;
            lua_pop(L, 1);
        }
        cfg.recompute = LOOM_RECOMPUTE_LAYERS;
        cfg.recompute_layers = recompute_layers;
    }
    lua_pop(L, 1);
    if (loom_session_create(&cfg, &box->s) != LOOM_OK)
        return raise_status(L);
    box->vocab = cfg.model.vocab;
    if (lists_at)
        lua_remove(L, lists_at); /* the engine copied its list */
    lua_pop(L, 1); /* backend */
    return 1;
}

static session_box *check_session(lua_State *L)
{
    session_box *b = luaL_checkudata(L, 1, SESSION_MT);
    if (!b->s)
        luaL_error(L, "session is closed");
    return b;
}

loom_session *loom_lua_check_session(lua_State *L, int idx)
{
    session_box *b = luaL_checkudata(L, idx, SESSION_MT);
    if (!b->s)
        luaL_error(L, "session is closed");
    return b->s;
}

static void set_num(lua_State *L, const char *k, double v)
{
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

/* s:step(data, lr [, step [, limits]]) -> {step, loss, grad_norm, lr, ms, comm_ms, tokens,
 * loss_scale, skipped,
 * inflight, bubble, stage_cpu_ms (under pp) [, nonfinite = {rank, stage, param | loss = true, message}]
 * [, stop_signal = signo: a stop signal reached some rank, stop after this step]
 * [, spike = true: the update skipped, loss or norm above limits]}; limits: { loss =, norm = }
 * for this step (a loss spike's skip, train.lua).
 * step: the loop's number for this step (reports and LOOM_INJECT_NONFINITE use it). */
static int l_session_step(lua_State *L)
{
    session_box *b = check_session(L);
    loom_data_cursor src = {loom_lua_check_data(L, 2), LOOM_SPLIT_TRAIN};
    float lr = (float)luaL_checknumber(L, 3);
    if (!lua_isnoneornil(L, 4))
        loom_session_number_next_step(b->s, (int64_t)luaL_checkinteger(L, 4));
    if (!lua_isnoneornil(L, 5)) { /* { loss = max, norm = max }: a spike's update is skipped */
        luaL_checktype(L, 5, LUA_TTABLE);
        lua_getfield(L, 5, "loss");
        lua_getfield(L, 5, "norm");
        loom_session_limit_next_step(b->s, luaL_optnumber(L, -2, 0), luaL_optnumber(L, -1, 0));
        lua_pop(L, 2);
    }
    loom_step_stats st;
    loom_lua_limits_progress(); /* the recipe's instruction budget runs between steps */
    if (loom_session_step(b->s, loom_data_batch, &src, lr, &st) != LOOM_OK)
        return raise_status(L);
    lua_createtable(L, 0, 8);
    lua_pushinteger(L, st.step);
    lua_setfield(L, -2, "step");
    set_num(L, "loss", st.loss);
    set_num(L, "grad_norm", st.grad_norm);
    set_num(L, "lr", st.lr);
    set_num(L, "ms", st.ms);
    set_num(L, "comm_ms", st.comm_ms);
    set_num(L, "tokens", st.tokens);
    set_num(L, "loss_scale", st.loss_scale);
    lua_pushboolean(L, st.skipped);
    lua_setfield(L, -2, "skipped");
    if (st.spike) {
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, "spike");
    }
    lua_pushinteger(L, st.inflight);
    lua_setfield(L, -2, "inflight");
    if (st.grad_bytes > 0) { /* compression: this rank's message and the fp32 equivalent */
        set_num(L, "compress_bytes", st.compress_bytes);
        set_num(L, "grad_bytes", st.grad_bytes);
        if (st.grad_expert_bytes > 0) { /* under ep: the experts' part over the edp group */
            set_num(L, "compress_expert_bytes", st.compress_expert_bytes);
            set_num(L, "grad_expert_bytes", st.grad_expert_bytes);
        }
    }
    if (st.nonfinite.found) {
        char what[160];
        loom_nonfinite_describe(&st.nonfinite, what, sizeof what);
        lua_createtable(L, 0, 5);
        lua_pushinteger(L, st.nonfinite.rank);
        lua_setfield(L, -2, "rank");
        lua_pushinteger(L, st.nonfinite.stage);
        lua_setfield(L, -2, "stage");
        if (st.nonfinite.loss) {
            lua_pushboolean(L, 1);
            lua_setfield(L, -2, "loss");
        } else {
            lua_pushstring(L, st.nonfinite.param);
            lua_setfield(L, -2, "param");
        }
        lua_pushstring(L, what);
        lua_setfield(L, -2, "message");
        lua_setfield(L, -2, "nonfinite");
    }
    if (st.bubble == st.bubble) /* under pp only */
        set_num(L, "bubble", st.bubble);
    if (st.stage_cpu_ms == st.stage_cpu_ms)
        set_num(L, "stage_cpu_ms", st.stage_cpu_ms);
    if (st.nonfinite.stop_signal) { /* the same on every rank: they all stop after this step */
        lua_pushinteger(L, st.nonfinite.stop_signal);
        lua_setfield(L, -2, "stop_signal");
    }
    /* moe = {load = {{tokens per expert} per MoE block}, dropped = fraction, aux =, z =}:
     * the step's routing over the dp group (session.h) */
    loom_moe_stats ms;
    double *load;
    if (loom_session_moe_stats(b->s, &ms, &load) != LOOM_OK)
        return raise_status(L);
    if (ms.layers) {
        lua_createtable(L, 0, 4);
        lua_createtable(L, ms.layers, 0);
        for (int l = 0; l < ms.layers; l++) {
            lua_createtable(L, ms.experts, 0);
            for (int e = 0; e < ms.experts; e++) {
                lua_pushinteger(L, (lua_Integer)load[(size_t)l * ms.experts + e]);
                lua_rawseti(L, -2, e + 1);
            }
            lua_rawseti(L, -2, l + 1);
        }
        lua_setfield(L, -2, "load");
        set_num(L, "dropped", ms.assigned > 0 ? ms.dropped / ms.assigned : 0.0);
        set_num(L, "aux", ms.aux);
        set_num(L, "z", ms.z);
        lua_setfield(L, -2, "moe");
        free(load);
    }
    return 1;
}

/* s:trace(path, rank [, steps]): this rank's Chrome trace from the next step on (steps:
 * how many, 0 or nil = all; docs/METRICS.md). */
static int l_session_trace(lua_State *L)
{
    session_box *b = check_session(L);
    const char *path = luaL_checkstring(L, 2);
    int rank = (int)luaL_checkinteger(L, 3);
    lua_Integer steps = luaL_optinteger(L, 4, 0);
    if (loom_session_trace(b->s, path, rank, (int64_t)steps) != LOOM_OK)
        return raise_status(L);
    return 0;
}

/* s:eval(data, batches) -> mean val loss, always from the start of the val split. */
static int l_session_eval(lua_State *L)
{
    session_box *b = check_session(L);
    loom_data_cursor src = {loom_lua_check_data(L, 2), LOOM_SPLIT_VAL};
    int batches = (int)luaL_checkinteger(L, 3);
    src.data->ops->rewind(src.data->self, LOOM_SPLIT_VAL);
    double loss;
    if (loom_session_eval(b->s, loom_data_batch, &src, batches, &loss) != LOOM_OK)
        return raise_status(L);
    lua_pushnumber(L, loss);
    return 1;
}

/* The progress function of s:sample's options, called between tokens through lua_pcall
 * (no C resource is held: the token buffer is a userdata). An error in it stops sampling
 * with its message. */
typedef struct sample_progress {
    lua_State *L;
    int fn; /* stack index of the function */
} sample_progress;

static loom_status call_progress(void *ctx, int done, int total)
{
    sample_progress *p = ctx;
    lua_pushvalue(p->L, p->fn);
    lua_pushinteger(p->L, done);
    lua_pushinteger(p->L, total);
    if (lua_pcall(p->L, 2, 0, 0) != LUA_OK) {
        loom_status st = loom_fail(LOOM_ERR_INVALID, "sample progress: %s",
                                   lua_tostring(p->L, -1) ? lua_tostring(p->L, -1) : "error");
        lua_pop(p->L, 1);
        return st;
    }
    return LOOM_OK;
}

/* s:sample(prompt, n, temperature, top_k, seed [, {cache = true, progress = fn(done, n),
 * shift_window = false, logits_hash = false}]) -> string (prompt a string) or token list
 * [, hash]. cache = false recomputes the whole window for every token
 * (loom_session_generate's reference path); shift_window: session.h;
 * logits_hash = true also returns the XXH64 of the logits rows drawn from, as a hex
 * string, so tests compare the two paths bit for bit. */
static int l_session_sample(lua_State *L)
{
    session_box *b = check_session(L);
    int as_text = lua_type(L, 2) == LUA_TSTRING;
    int n_new = (int)luaL_checkinteger(L, 3);
    loom_sample_config cfg = {.temperature = (float)luaL_optnumber(L, 4, 1.0),
                              .top_k = (int)luaL_optinteger(L, 5, 0),
                              .seed = (uint64_t)luaL_optinteger(L, 6, 0)};
    sample_progress prog = {L, 0};
    uint64_t hash = 0;
    if (!lua_isnoneornil(L, 7)) {
        luaL_checktype(L, 7, LUA_TTABLE);
        lua_getfield(L, 7, "cache");
        cfg.no_cache = !lua_isnil(L, -1) && !lua_toboolean(L, -1);
        lua_getfield(L, 7, "progress");
        if (!lua_isnil(L, -1)) {
            luaL_checktype(L, -1, LUA_TFUNCTION);
            prog.fn = lua_gettop(L);
            cfg.progress = call_progress;
            cfg.progress_ctx = &prog;
        }
        lua_getfield(L, 7, "shift_window");
        cfg.shift_window = lua_toboolean(L, -1);
        lua_getfield(L, 7, "logits_hash");
        if (lua_toboolean(L, -1))
            cfg.logits_hash = &hash;
    }
    size_t n_prompt;
    if (as_text) {
        luaL_checklstring(L, 2, &n_prompt);
        if (b->vocab != 256)
            luaL_error(L, "a text prompt needs a byte-level model (vocab 256); give token ids");
    } else {
        luaL_checktype(L, 2, LUA_TTABLE);
        n_prompt = lua_rawlen(L, 2);
    }
    if (n_new < 0 || n_prompt < 1)
        luaL_error(L, "sample needs a non-empty prompt and a token count >= 0");
    int *toks = lua_newuserdatauv(L, (n_prompt + (size_t)n_new) * sizeof(int), 0);
    const unsigned char *text = (const unsigned char *)lua_tostring(L, 2);
    for (size_t i = 0; i < n_prompt; i++) {
        if (as_text) {
            toks[i] = text[i];
        } else {
            lua_rawgeti(L, 2, (lua_Integer)i + 1);
            toks[i] = (int)luaL_checkinteger(L, -1);
            lua_pop(L, 1);
        }
    }
    if (loom_session_generate(b->s, &cfg, toks, (int)n_prompt, n_new, toks) != LOOM_OK)
        return raise_status(L);
    size_t total = n_prompt + (size_t)n_new;
    if (as_text) {
        luaL_Buffer buf;
        luaL_buffinit(L, &buf);
        for (size_t i = 0; i < total; i++)
            luaL_addchar(&buf, (char)toks[i]);
        luaL_pushresult(&buf);
    } else {
        lua_createtable(L, (int)total, 0);
        for (size_t i = 0; i < total; i++) {
            lua_pushinteger(L, toks[i]);
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
    }
    if (!cfg.logits_hash)
        return 1;
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
    lua_pushstring(L, hex);
    return 2;
}

/* This process's peak resident set (VmHWM in /proc/self/status; key "VmRSS:" for the
 * current one), bytes; 0 if unknown. */
static size_t rss_bytes(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key)) && sscanf(line + strlen(key), "%zu", &kb) == 1)
            break;
    fclose(f);
    return kb * 1024;
}

/* s:info() -> {params=, param_bytes=, activation_bytes=, vocab_padded=, backend=, steps=,
 *              stages=, pp_layers=, zero=, offload=, peak_rss=, rss=, memory={...}};
 * pp_layers (under pp only): the blocks of each virtual stage, the split in use;
 * offload is "none", "host" or "disk"; peak_rss and rss this process's VmHWM and VmRSS
 * in bytes.
 * params counts the whole model, param_bytes this rank's parameter buffer (its slices,
 * alignment included), activation_bytes its activation and backward scratch buffers. */
static int l_session_info(lua_State *L)
{
    session_box *b = check_session(L);
    loom_gpt *m = loom_session_model(b->s);
    lua_createtable(L, 0, 6);
    lua_pushinteger(L, (lua_Integer)loom_gpt_num_params(m));
    lua_setfield(L, -2, "params");
    lua_pushinteger(L, (lua_Integer)(loom_gpt_params(m)->total * sizeof(float)));
    lua_setfield(L, -2, "param_bytes");
    lua_pushinteger(L, (lua_Integer)loom_gpt_activation_bytes(m));
    lua_setfield(L, -2, "activation_bytes");
    lua_pushinteger(L, (lua_Integer)loom_gpt_get_config(m)->vocab_padded);
    lua_setfield(L, -2, "vocab_padded");
    lua_pushstring(L, loom_session_backend_description(b->s));
    lua_setfield(L, -2, "backend");
    lua_pushinteger(L, loom_session_steps_taken(b->s));
    lua_setfield(L, -2, "steps");
    lua_pushinteger(L, loom_session_pipeline_stages(b->s));
    lua_setfield(L, -2, "stages");
    int nv = 0;
    const int *first = loom_session_pipeline_split(b->s, &nv);
    if (first) { /* pp_layers = {blocks of virtual stage 0, 1, ...}: the split in use */
        lua_createtable(L, nv, 0);
        for (int k = 0; k < nv; k++) {
            lua_pushinteger(L, first[k + 1] - first[k]);
            lua_rawseti(L, -2, k + 1);
        }
        lua_setfield(L, -2, "pp_layers");
    }
    lua_pushinteger(L, loom_session_zero_stage(b->s));
    lua_setfield(L, -2, "zero");
    lua_pushstring(L, loom_session_offload(b->s));
    lua_setfield(L, -2, "offload");
    lua_pushinteger(L, (lua_Integer)rss_bytes("VmHWM:"));
    lua_setfield(L, -2, "peak_rss");
    lua_pushinteger(L, (lua_Integer)rss_bytes("VmRSS:"));
    lua_setfield(L, -2, "rss");
    /* memory = { params=, params_peak_resident=, grads=, grads_peak_resident=, optimizer=, master=, activations=,
     * comm=, widen=, saved=, teacher_activations=, teacher_params=, teacher_grads=,
     * distill= }: this rank's bytes by category (zero.h) */
    loom_memory mem;
    loom_session_memory(b->s, &mem);
    lua_createtable(L, 0, 16);
    const struct { const char *k; size_t v; } cats[] = {
        {"params", mem.params}, {"params_peak_resident", mem.params_peak_resident},
        {"grads", mem.grads}, {"grads_peak_resident", mem.grads_peak_resident},
        {"optimizer", mem.optimizer}, {"optimizer_offloaded", mem.optimizer_offloaded},
        {"params_offloaded", mem.params_offloaded},
        {"master", mem.master}, {"activations", mem.activations},
        {"comm", mem.comm}, {"widen", mem.widen}, {"saved", mem.saved},
        {"teacher_activations", mem.teacher_activations},
        {"teacher_params", mem.teacher_params}, {"teacher_grads", mem.teacher_grads},
        {"distill", mem.distill}};
    for (size_t i = 0; i < sizeof cats / sizeof cats[0]; i++) {
        lua_pushinteger(L, (lua_Integer)cats[i].v);
        lua_setfield(L, -2, cats[i].k);
    }
    lua_setfield(L, -2, "memory");
    return 1;
}

/* s:state_hash() -> params, optim: XXH64 (hex) of this rank's parameters and optimizer
 * state (under ZeRO its partition; optim "-" without state), e.g. to show that a skipped
 * step changed neither. */
static int l_session_state_hash(lua_State *L)
{
    session_box *b = check_session(L);
    uint64_t h[2];
    loom_session_state_hash(b->s, &h[0], &h[1]);
    for (int i = 0; i < 2; i++) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h[i]);
        lua_pushstring(L, i == 1 && h[1] == 0 ? "-" : hex);
    }
    return 2;
}

static int l_session_close(lua_State *L)
{
    session_box *b = luaL_checkudata(L, 1, SESSION_MT);
    loom_session_destroy(b->s);
    b->s = NULL;
    return 0;
}

static const luaL_Reg session_methods[] = {
    {"step", l_session_step},     {"eval", l_session_eval},   {"sample", l_session_sample},
    {"info", l_session_info},     {"close", l_session_close}, {"trace", l_session_trace},
    {"state_hash", l_session_state_hash},
    {NULL, NULL}};
static const luaL_Reg core_funcs[] = {{"plugins", l_plugins},
                                      {"plugin_keys", l_plugin_keys},
                                      {"check_plugin", l_check_plugin},
                                      {"session", l_session},
                                      {NULL, NULL}};

void loom_lua_new_class(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc)
{
    luaL_newmetatable(L, name);
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__close");
    lua_pop(L, 1);
}

int luaopen_loom_core(lua_State *L)
{
    loom_lua_new_class(L, SESSION_MT, session_methods, l_session_close);
    luaL_newlib(L, core_funcs);
    loom_lua_open_data(L);
    loom_lua_open_dist(L);
    loom_lua_open_bench(L);
    loom_lua_open_checkpoint(L);
    loom_lua_open_kd_cache(L);
    loom_lua_open_llmc(L);
    loom_lua_open_sys(L);
    loom_lua_open_sched(L);
    loom_lua_open_plan(L);
    lua_pushstring(L, LOOM_VERSION_STRING);
    lua_setfield(L, -2, "version");
    return 1;
}
