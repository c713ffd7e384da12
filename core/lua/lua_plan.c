/* lua_plan.c — what `loom plan` (scripts/loom/plan*.lua) needs from C:
 *   core.footprint{...}: the bytes loom_gpt_create would allocate on one rank, from the
 *     model's own table and activation layout code (gpt.h: loom_gpt_footprint), so the
 *     planner and the session's start-up accounting cannot disagree;
 *   core.zero_padded(total, n): ZeRO's padded buffer (zero.h), whose n-th is a partition;
 *   core.bench_device{...}: the machine model's device half, measured through a backend's
 *     own kernels: matmul forward/backward time by shape, attention forward/backward time,
 *     and the memory bandwidth of `accumulate` (2 reads + 1 write per element).
 * What not: the time model, the search and the printing are Lua (plan.lua).
 * Times are the median of repeats (a shared machine's outliers move a mean, not a median).
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "base/clock.h"
#include "base/status.h"
#include "lua_loom.h"
#include "model/gpt.h"
#include "train/zero.h"

static int ifield(lua_State *L, int t, const char *k, int dflt)
{
    lua_getfield(L, t, k);
    int v = lua_isnil(L, -1) ? dflt : (int)luaL_checkinteger(L, -1);
    lua_pop(L, 1);
    return v;
}

static int bfield(lua_State *L, int t, const char *k)
{
    lua_getfield(L, t, k);
    int v = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* Set flags[i] = 1 for each 0-based index in the list t[k]; 0 if t[k] is nil. */
static int index_list(lua_State *L, int t, const char *k, unsigned char *flags, int n)
{
    lua_getfield(L, t, k);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return 0;
    }
    luaL_checktype(L, -1, LUA_TTABLE);
    memset(flags, 0, (size_t)n);
    for (lua_Integer i = 1, len = luaL_len(L, -1); i <= len; i++) {
        lua_geti(L, -1, i);
        lua_Integer l = luaL_checkinteger(L, -1);
        if (l < 0 || l >= n)
            luaL_error(L, "footprint: %s index %d is not a block 0..%d", k, (int)l, n - 1);
        flags[l] = 1;
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return 1;
}

static void set_int(lua_State *L, const char *k, size_t v)
{
    lua_pushinteger(L, (lua_Integer)v);
    lua_setfield(L, -2, k);
}

/* core.footprint{vocab=, vocab_padded=, ctx=, layers=, heads=, dim=, micro=, tp=1,
 *   sequence_parallel=false, canonical=false, recompute="none"|"full"|"selective",
 *   recompute_layers={blocks}, stage_layers={blocks held} (nil: all), slots=1,
 *   split_backward=false} -> {param_floats, activations, slot, shared, host} */
static int l_footprint(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    loom_gpt_config cfg = {ifield(L, 1, "vocab", 0), ifield(L, 1, "vocab_padded", 0),
                           ifield(L, 1, "ctx", 0), ifield(L, 1, "layers", 0),
                           ifield(L, 1, "heads", 0), ifield(L, 1, "dim", 0)};
    if (cfg.layers < 1 || cfg.layers > 4096)
        return luaL_error(L, "footprint: layers=%d must be in 1..4096", cfg.layers);
    unsigned char *stage = lua_newuserdatauv(L, 2 * (size_t)cfg.layers, 0); /* freed by GC */
    unsigned char *rc = stage + cfg.layers;
    loom_gpt_parallel par;
    memset(&par, 0, sizeof par);
    par.canonical = bfield(L, 1, "canonical");
    par.stage_layers = index_list(L, 1, "stage_layers", stage, cfg.layers) ? stage : NULL;
    par.slots = ifield(L, 1, "slots", 1);
    par.split_backward = bfield(L, 1, "split_backward");
    lua_getfield(L, 1, "recompute");
    const char *r = luaL_optstring(L, -1, "none");
    par.recompute = !strcmp(r, "full") ? LOOM_RECOMPUTE_FULL
                    : !strcmp(r, "selective") ? LOOM_RECOMPUTE_SELECTIVE
                    : !strcmp(r, "none") ? LOOM_RECOMPUTE_NONE : -1;
    lua_pop(L, 1);
    if (par.recompute < 0)
        return luaL_error(L, "footprint: recompute=\"%s\" is not none, full or selective (a list "
                          "of blocks goes in recompute_layers)", r);
    if (index_list(L, 1, "recompute_layers", rc, cfg.layers)) {
        par.recompute = LOOM_RECOMPUTE_LAYERS;
        par.recompute_layers = rc;
    }
    loom_gpt_footprint_bytes fp;
    if (loom_gpt_footprint(&cfg, ifield(L, 1, "micro", 0), &par, ifield(L, 1, "tp", 1),
                           bfield(L, 1, "sequence_parallel"), &fp) != LOOM_OK) {
        lua_pushstring(L, loom_last_error());
        return lua_error(L);
    }
    lua_createtable(L, 0, 5);
    set_int(L, "param_floats", fp.param_floats);
    set_int(L, "activations", fp.activations);
    set_int(L, "slot", fp.slot);
    set_int(L, "shared", fp.shared);
    set_int(L, "host", fp.host);
    return 1;
}

static int l_zero_padded(lua_State *L)
{
    lua_Integer total = luaL_checkinteger(L, 1), n = luaL_checkinteger(L, 2);
    luaL_argcheck(L, total >= 0 && n >= 1, 1, "total >= 0 and n >= 1");
    lua_pushinteger(L, (lua_Integer)loom_zero_padded((size_t)total, (int)n));
    return 1;
}

/* --- device measurements --------------------------------------------------------------- */

typedef struct bench_box { loom_backend be; float *buf[6]; } bench_box;

static void bench_release(bench_box *b)
{
    for (int i = 0; i < 6; i++)
        free(b->buf[i]);
    memset(b->buf, 0, sizeof b->buf);
    if (b->be.ops)
        loom_backend_close(&b->be);
    b->be.ops = NULL;
}

static int bench_gc(lua_State *L)
{
    bench_release(lua_touserdata(L, 1));
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef void (*bench_fn)(bench_box *b, const int *shape);

/* The median seconds of one call, repeated for at least min_s (3 to 201 repeats). */
static double time_it(bench_box *b, bench_fn fn, const int *shape, double min_s)
{
    double t[201];
    int n = 0;
    fn(b, shape); /* warm-up: pages, caches, thread pool */
    double start = loom_now_s();
    while (n < 201 && (n < 3 || loom_now_s() - start < min_s)) {
        double t0 = loom_now_s();
        fn(b, shape);
        b->be.ops->synchronize(b->be.self);
        t[n++] = loom_now_s() - t0;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[n / 2];
}

/* shape = {M, K, N}: out (M,N) = inp (M,K) weight (N,K)^T */
static void mm_fwd(bench_box *b, const int *s)
{
    b->be.ops->matmul_forward(b->buf[0], b->buf[1], b->buf[2], b->buf[3], 1, s[0], s[1], s[2]);
}
static void mm_bwd(bench_box *b, const int *s)
{
    b->be.ops->matmul_backward(b->buf[1], b->buf[4], b->buf[3], b->buf[0], b->buf[5], b->buf[2], 1,
                               s[0], s[1], s[2]);
}
/* shape = {B, T, C, NH}: buf1 qkv (B,T,3C), buf0 out, buf4 att, buf5 scratch */
static void att_fwd(bench_box *b, const int *s)
{
    b->be.ops->attention_forward(b->buf[0], b->buf[4], b->buf[1], s[0], s[1], s[2], s[3]);
}
static void att_bwd(bench_box *b, const int *s)
{
    b->be.ops->attention_backward(b->buf[2], b->buf[5], b->buf[0], b->buf[1], b->buf[4], s[0],
                                  s[1], s[2], s[3]);
}
static void bw_acc(bench_box *b, const int *s)
{
    b->be.ops->accumulate(b->buf[0], b->buf[1], (size_t)s[0]);
}

static int alloc_bufs(bench_box *b, size_t floats)
{
    for (int i = 0; i < 6; i++) {
        free(b->buf[i]);
        b->buf[i] = NULL;
    }
    for (int i = 0; i < 6; i++) {
        /* host memory: the CPU backend's; a device backend's bench would allocate there */
        if (!(b->buf[i] = calloc(floats ? floats : 1, sizeof(float))))
            return 0;
        for (size_t j = 0; j < floats; j += 997)
            b->buf[i][j] = 0.001f * (float)(j % 13);
    }
    return 1;
}

static void read_shape(lua_State *L, int idx, int *s, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        lua_geti(L, idx, i + 1);
        s[i] = (int)luaL_checkinteger(L, -1);
        lua_pop(L, 1);
        if (s[i] < 1 || s[i] > 1 << 20)
            luaL_error(L, "bench_device: %s shape entry %d = %d out of range", what, i + 1, s[i]);
    }
}

/* core.bench_device{backend="cpu", threads=0, min_s=0.05, gemm={{M,K,N},...},
 *   attention={{B,T,C,NH},...}, bandwidth_floats=N}
 * -> {gemm={{M,K,N, fwd_s=, bwd_s=}}, attention={{B,T,C,NH, fwd_s=, bwd_s=}}, bandwidth=B/s,
 *     describe=} */
static int l_bench_device(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_getfield(L, 1, "backend");
    const char *name = luaL_optstring(L, -1, "cpu");
    lua_getfield(L, 1, "min_s");
    double min_s = luaL_optnumber(L, -1, 0.05);
    lua_pop(L, 1);
    bench_box *b = lua_newuserdatauv(L, sizeof *b, 0);
    memset(b, 0, sizeof *b);
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, bench_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    /* the bounded OpenMP spin `loom run` asks for (cli.c: share_the_machine), so the
     * rates measured here are the rates a run gets; read once, when libgomp loads */
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"))
        setenv("GOMP_SPINCOUNT", "1000", 0);
    if (loom_backend_open(name, ifield(L, 1, "threads", 0), &b->be) != LOOM_OK) {
        lua_pushstring(L, loom_last_error());
        return lua_error(L);
    }
    lua_createtable(L, 0, 4);
    lua_pushstring(L, b->be.ops->describe(b->be.self));
    lua_setfield(L, -2, "describe");
    static const char *const kinds[] = {"gemm", "attention"};
    for (int k = 0; k < 2; k++) {
        lua_getfield(L, 1, kinds[k]);
        lua_newtable(L);
        for (lua_Integer i = 1; lua_istable(L, -2) && i <= luaL_len(L, -2); i++) {
            int s[4] = {1, 1, 1, 1};
            lua_geti(L, -2, i);
            read_shape(L, lua_gettop(L), s, k == 0 ? 3 : 4, kinds[k]);
            lua_pop(L, 1);
            size_t need = k == 0 ? (size_t)s[0] * s[1] + (size_t)s[1] * s[2] + (size_t)s[0] * s[2]
                                 : 2 * (size_t)s[0] * s[3] * s[1] * s[1] + 3 * (size_t)s[0] * s[1] * s[2];
            if (!alloc_bufs(b, need))
                return luaL_error(L, "bench_device: out of memory for %s shape %d", kinds[k], (int)i);
            double f = time_it(b, k == 0 ? mm_fwd : att_fwd, s, min_s);
            double w = time_it(b, k == 0 ? mm_bwd : att_bwd, s, min_s);
            lua_createtable(L, 4, 2);
            for (int j = 0; j < (k == 0 ? 3 : 4); j++) {
                lua_pushinteger(L, s[j]);
                lua_rawseti(L, -2, j + 1);
            }
            lua_pushnumber(L, f);
            lua_setfield(L, -2, "fwd_s");
            lua_pushnumber(L, w);
            lua_setfield(L, -2, "bwd_s");
            lua_rawseti(L, -2, i);
        }
        lua_setfield(L, -3, kinds[k]);
        lua_pop(L, 1);
    }
    int n = ifield(L, 1, "bandwidth_floats", 0);
    if (n > 0) {
        if (!alloc_bufs(b, (size_t)n))
            return luaL_error(L, "bench_device: out of memory for %d floats", n);
        double t = time_it(b, bw_acc, &n, min_s);
        lua_pushnumber(L, 3.0 * sizeof(float) * (double)n / t);
        lua_setfield(L, -2, "bandwidth");
    }
    bench_release(b);
    return 1;
}

void loom_lua_open_plan(lua_State *L)
{
    static const luaL_Reg funcs[] = {{"footprint", l_footprint},
                                     {"zero_padded", l_zero_padded},
                                     {"bench_device", l_bench_device},
                                     {NULL, NULL}};
    luaL_setfuncs(L, funcs, 0);
}
