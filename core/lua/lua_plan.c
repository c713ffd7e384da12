/* lua_plan.c — what `loom plan` (scripts/loom/plan*.lua) needs from C:
 *   core.footprint{...}: the bytes loom_gpt_create would allocate on one rank, from the
 *     model's own table and activation layout code (gpt.h: loom_gpt_footprint), so the
 *     planner and the session's start-up accounting cannot disagree;
 *   core.zero_padded(total, n): ZeRO's padded buffer (zero.h), whose n-th is a partition;
 *   core.cpu_now(): this process's CPU seconds (a loaded machine's honest clock);
 *   core.pp_split{...}: the session's default block split over pipeline stages (weighed
 *     by FLOPs: gpt_cost.h, pipeline_split.h), so the planner plans the split that runs;
 *   core.bench_device{...}: the machine model's device half, measured through a backend's
 *     own kernels: matmul forward/backward time by shape, attention forward/backward time,
 *     and the memory bandwidth of `accumulate` (2 reads + 1 write per element); with
 *     bf16 = true the 16-bit path's forward product and conversions too.
 * What not: the time model, the search and the printing are Lua (plan.lua).
 * Times are the median of repeats (a shared machine's outliers move a mean, not a median).
 */
#include <lauxlib.h>
#include <lua.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/backend.h"
#include "base/clock.h"
#include "base/config.h"
#include "base/plugin_loader.h"
#include "loom/plugin/optim.h"
#include "base/status.h"
#include "lua_loom.h"
#include "model/gpt.h"
#include "model/gpt_cost.h"
#include "model/gpt_distill.h"
#include "train/pipeline_split.h"
#include "train/schedule.h"
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
 *   split_backward=false, precision="fp32"|"bf16"|"fp16", cuda_attention=nil|"batched"|"flash",
 *   flash_tc=true} -> {param_floats, activations, slot, shared, host, num_params, entries,
 *   compute_params, widen, att_fused}. cuda_attention: the run is on the CUDA backend with
 *   LOOM_CUDA_ATTENTION at that value (flash_tc false: LOOM_CUDA_FLASH_TC=0), att sized by
 *   its rule (loom/plugin/cuda_attention.h); nil: a backend without attention_sizes.
 *   Distillation: kd_proj_dim= (the teacher's width) and kd_proj_layers={student blocks}: a
 *   student's teacher.layers projections; keep_attention={blocks}: the blocks whose
 *   probabilities a term reads (loom_gpt_keep_block_attention: teacher.attention's pairs,
 *   in the student and in the teacher). frozen=true: a forward-only model (gpt.h's
 *   loom_gpt_parallel.frozen: no gradient buffer, the forward's activations only), with
 *   keep_outputs={blocks} the block outputs kept past its forward (teacher.layers' pairs). */
/* family, kv_heads, ffn_dim and moe = {experts, top_k, every, capacity_factor} of the
 * table at idx into cfg (what loom.gpt's checked model table holds). */
static void read_family_moe(lua_State *L, int idx, loom_gpt_config *cfg)
{
    lua_getfield(L, idx, "family");
    cfg->family = lua_isstring(L, -1) && !strcmp(lua_tostring(L, -1), "llama") ? LOOM_FAMILY_LLAMA
                                                                               : LOOM_FAMILY_GPT2;
    lua_pop(L, 1);
    cfg->kv_heads = ifield(L, idx, "kv_heads", 0);
    cfg->ffn_dim = ifield(L, idx, "ffn_dim", 0);
    cfg->tie_embeddings = bfield(L, idx, "tie_embeddings");
    lua_getfield(L, idx, "moe");
    if (lua_istable(L, -1)) {
        int t = lua_gettop(L);
        cfg->moe.experts = ifield(L, t, "experts", 0);
        cfg->moe.top_k = ifield(L, t, "top_k", 1);
        cfg->moe.every = ifield(L, t, "every", 1);
        lua_getfield(L, t, "capacity_factor");
        cfg->moe.capacity_factor = luaL_optnumber(L, -1, 1.25);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

static int l_footprint(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    loom_gpt_config cfg = {ifield(L, 1, "vocab", 0), ifield(L, 1, "vocab_padded", 0),
                           ifield(L, 1, "ctx", 0), ifield(L, 1, "layers", 0),
                           ifield(L, 1, "heads", 0), ifield(L, 1, "dim", 0)};
    if (cfg.layers < 1 || cfg.layers > 4096)
        return luaL_error(L, "footprint: layers=%d must be in 1..4096", cfg.layers);
    unsigned char *stage = lua_newuserdatauv(L, 5 * (size_t)cfg.layers, 0); /* freed by GC */
    unsigned char *rc = stage + cfg.layers, *keep = rc + cfg.layers, *proj = keep + cfg.layers;
    unsigned char *outs = proj + cfg.layers;
    loom_gpt_parallel par;
    memset(&par, 0, sizeof par);
    par.canonical = bfield(L, 1, "canonical");
    par.frozen = bfield(L, 1, "frozen"); /* a distillation teacher (gpt.h) */
    par.keep_outputs = index_list(L, 1, "keep_outputs", outs, cfg.layers) ? outs : NULL;
    par.max_T = ifield(L, 1, "max_T", 0); /* activations for sequences up to this (gpt.h; 0: ctx) */
    read_family_moe(L, 1, &cfg);
    /* teacher.layers' projections (lua_loom.c: kd_proj_dim = the teacher's width, one per
     * mapped student block), table entries after ln_f */
    cfg.kd_proj_dim = ifield(L, 1, "kd_proj_dim", 0);
    if (index_list(L, 1, "kd_proj_layers", proj, cfg.layers))
        for (int l = 0; l < cfg.layers && l < 64; l++)
            cfg.kd_proj_layers |= (unsigned long long)proj[l] << l;
    par.ep = ifield(L, 1, "ep", 1); /* ep rank 0's table: every ep rank holds E/ep experts */
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
    /* precision = "fp32" | "bf16" | "fp16": the plugins' weights and activations dtypes
     * (plugins/precision: both 16-bit, or both fp32) */
    lua_getfield(L, 1, "precision");
    const char *pr = luaL_optstring(L, -1, "fp32");
    loom_dtype dt = !strcmp(pr, "bf16") ? LOOM_DTYPE_BF16 : !strcmp(pr, "fp16") ? LOOM_DTYPE_F16
                    : !strcmp(pr, "fp32") ? LOOM_DTYPE_F32 : (loom_dtype)-1;
    lua_pop(L, 1);
    if (dt == (loom_dtype)-1)
        return luaL_error(L, "footprint: precision=\"%s\" is not fp32, bf16 or fp16", pr);
    lua_getfield(L, 1, "cuda_attention");
    const char *ca = luaL_optstring(L, -1, NULL);
    loom_cuda_attention_mode mode = {ca && !strcmp(ca, "flash"), 0, 1};
    lua_pop(L, 1);
    if (ca && strcmp(ca, "flash") && strcmp(ca, "batched"))
        return luaL_error(L, "footprint: cuda_attention=\"%s\" is not batched or flash "
                          "(LOOM_CUDA_ATTENTION's values)", ca);
    lua_getfield(L, 1, "flash_tc");
    mode.tc = lua_isnil(L, -1) || lua_toboolean(L, -1);
    lua_pop(L, 1);
    loom_gpt_footprint_bytes fp;
    if (loom_gpt_footprint(&cfg, ifield(L, 1, "micro", 0), &par, ifield(L, 1, "tp", 1),
                           bfield(L, 1, "sequence_parallel"), dt, dt, ca ? &mode : NULL,
                           index_list(L, 1, "keep_attention", keep, cfg.layers) ? keep : NULL,
                           &fp) != LOOM_OK) {
        lua_pushstring(L, loom_last_error());
        return lua_error(L);
    }
    lua_createtable(L, 0, 11);
    set_int(L, "param_floats", fp.param_floats);
    set_int(L, "activations", fp.activations);
    set_int(L, "slot", fp.slot);
    set_int(L, "shared", fp.shared);
    set_int(L, "host", fp.host);
    set_int(L, "num_params", fp.num_params);
    set_int(L, "entries", fp.entries);
    set_int(L, "compute_params", fp.compute_params);
    set_int(L, "widen", fp.widen);
    set_int(L, "att_floats", fp.att_floats);
    lua_pushboolean(L, fp.att_fused);
    lua_setfield(L, -2, "att_fused");
    return 1;
}

/* core.pp_split{layers=, stages=, chunks=1, vocab=, vocab_padded=, dim=, heads=, ctx=,
 *   seq=, family="gpt"|"llama", kv_heads=, ffn_dim=, moe={experts=, top_k=, every=},
 *   recompute="none"|"full"|"selective", recompute_layers={blocks}} -> {blocks per virtual
 *   stage}: what session.c's pipeline splits by default. */
static int l_pp_split(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    loom_gpt_config cfg = {ifield(L, 1, "vocab", 0), ifield(L, 1, "vocab_padded", 0),
                           ifield(L, 1, "ctx", 0), ifield(L, 1, "layers", 0),
                           ifield(L, 1, "heads", 0), ifield(L, 1, "dim", 0)};
    int V = ifield(L, 1, "stages", 1) * ifield(L, 1, "chunks", 1);
    if (cfg.layers < 1 || cfg.layers > 4096 || V < 1 || V > cfg.layers)
        return luaL_error(L, "pp_split: layers=%d must be in 1..4096 and at least stages x "
                          "chunks = %d", cfg.layers, V);
    read_family_moe(L, 1, &cfg);
    unsigned char *rc = lua_newuserdatauv(L, (size_t)cfg.layers, 0); /* freed by GC */
    double *cost = lua_newuserdatauv(L, (size_t)cfg.layers * sizeof(double), 0);
    int listed = index_list(L, 1, "recompute_layers", rc, cfg.layers);
    lua_getfield(L, 1, "recompute");
    int full = lua_isstring(L, -1) && !strcmp(lua_tostring(L, -1), "full");
    lua_pop(L, 1);
    double first, last;
    loom_gpt_layer_costs(&cfg, ifield(L, 1, "seq", 0), listed ? rc : NULL, cost, &first, &last);
    if (full) /* as session.c: every block's forward again */
        for (int l = 0; l < cfg.layers; l++)
            cost[l] *= 4.0 / 3.0;
    int *counts = lua_newuserdatauv(L, (size_t)V * sizeof(int), 0);
    if (loom_pipeline_balance(cfg.layers, V, cost, first, last, counts) != LOOM_OK) {
        lua_pushstring(L, loom_last_error());
        return lua_error(L);
    }
    lua_createtable(L, V, 0);
    for (int k = 0; k < V; k++) {
        lua_pushinteger(L, counts[k]);
        lua_rawseti(L, -2, k + 1);
    }
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

typedef struct bench_box {
    loom_backend be;
    float *buf[6];
    int cpu_clock;
    float *evict;    /* written between the repeats of a GEMM or attention timing (not timed) */
    size_t n_evict;  /* floats: larger than the caches a core has to itself */
} bench_box;

/* Seconds of this process's CPU time (all threads): what a step costs whatever else the
 * machine runs, where wall time also counts the waits for a core. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int l_cpu_now(lua_State *L)
{
    lua_pushnumber(L, cpu_now());
    return 1;
}

static void bench_release(bench_box *b)
{
    for (int i = 0; i < 6; i++)
        free(b->buf[i]);
    memset(b->buf, 0, sizeof b->buf);
    free(b->evict);
    b->evict = NULL;
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

/* The median seconds of one call, repeated for at least min_s (3 to 201 repeats). With
 * cold = 1 the operands are pushed out of the caches before each repeat: a model's pass
 * reads each layer's weights and activations once, after the other layers' have been
 * through the caches (measured: GEMMs in a training step ran 10-20% below the same shapes
 * timed hot, the more so the larger the model's weights). */
static double time_it_as(bench_box *b, bench_fn fn, const int *shape, double min_s, int cold)
{
    double t[201];
    int n = 0;
    fn(b, shape); /* warm-up: pages, caches, thread pool */
    double start = loom_now_s();
    while (n < 201 && (n < 3 || loom_now_s() - start < min_s)) {
        if (cold && b->evict)
            for (size_t i = 0; i < b->n_evict; i += 16)
                b->evict[i] += 1.0f;
        double t0 = b->cpu_clock ? cpu_now() : loom_now_s();
        fn(b, shape);
        b->be.ops->synchronize(b->be.self);
        t[n++] = (b->cpu_clock ? cpu_now() : loom_now_s()) - t0;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[n / 2];
}

static double time_it(bench_box *b, bench_fn fn, const int *shape, double min_s)
{
    return time_it_as(b, fn, shape, min_s, 0);
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

/* shape = {n}: element-wise kernels over n values (layernorm: rows of 256) */
static void gelu_fwd(bench_box *b, const int *s) { b->be.ops->gelu_forward(b->buf[0], b->buf[1], (size_t)s[0]); }
static void gelu_bwd(bench_box *b, const int *s)
{
    b->be.ops->gelu_backward(b->buf[2], b->buf[1], b->buf[0], (size_t)s[0]);
}
static void ln_fwd(bench_box *b, const int *s)
{
    b->be.ops->layernorm_forward(b->buf[0], b->buf[3], b->buf[4], b->buf[1], b->buf[5],
                                 b->buf[5] + 256, 1, s[0] / 256, 256);
}
static void ln_bwd(bench_box *b, const int *s)
{
    b->be.ops->layernorm_backward(b->buf[2], b->buf[5] + 512, b->buf[5] + 768, b->buf[0],
                                  b->buf[1], b->buf[5], b->buf[3], b->buf[4], 1, s[0] / 256, 256);
}

/* shape = {n}: the passes over the gradients a step makes besides the optimizer's
 * (grad_norm.c: the sum of squares and the non-finite check; zeroing for the next step) */
static void grad_pass(bench_box *b, const int *s)
{
    volatile double sink = b->be.ops->sum_squares(b->buf[0], 1, (size_t)s[0], (size_t)s[0]);
    sink += b->be.ops->has_nonfinite(b->buf[0], (size_t)s[0]);
    (void)sink;
    b->be.ops->zero(b->be.self, b->buf[1], (size_t)s[0] * sizeof(float));
}

/* shape = {n}: distillation's terms as the session runs them on the host (gpt_distill*.c):
 * the logit term over n/256 rows of 256 columns (two log-softmaxes, the KL, the gradient),
 * the hidden term over n/4096 rows of a 64 x 64 projection (its forward, d/dh and d/dW)
 * and the attention term over 64 heads of T = n/4096 query rows and keys; per element of
 * what plan.lua prices each by: R x V, R x C x Ct, B x NH x T x T. buf3 holds the rows'
 * double losses. */
static void kd_logit(bench_box *b, const int *s)
{
    loom_kd_rows(b->buf[0], 256, b->buf[1], 256, (size_t)s[0] / 256, 256, 1.0f, 0.5f,
                 (double *)b->buf[3], b->buf[2]);
}
static void kd_hidden(bench_box *b, const int *s)
{
    size_t R = (size_t)s[0] / 4096;
    loom_kd_hidden_rows(b->buf[0], b->buf[1], b->buf[4], R, 64, 64, 1.0f, 0.5f,
                        (double *)b->buf[3], b->buf[2], b->buf[5], b->buf[4] + 4096);
}
static void kd_attention(bench_box *b, const int *s)
{
    loom_kd_attention_rows(b->buf[0], b->buf[1], 1, 64, s[0] / 4096, 1.0f, 0.5f,
                           (double *)b->buf[3], b->buf[2]);
}

/* Seconds per element of one AdamW step (the optim plugin's own step over n values). */
static double time_adamw(bench_box *b, int n, double min_s)
{
    const loom_plugin *p;
    if (loom_plugin_load(LOOM_KIND_OPTIM, "adamw", &p) != LOOM_OK)
        return 0;
    loom_plugin_config pc;
    void *self = NULL;
    const loom_optim_ops *ops = p->desc->ops;
    if (loom_config_init(&pc, p->desc) != LOOM_OK || loom_config_set_number(&pc, "lr", 1e-3) != LOOM_OK ||
        loom_config_finish(&pc) != LOOM_OK)
        return 0;
    loom_config view = loom_config_view(&pc);
    if (ops->create(loom_core_host(), &view, &self) != LOOM_OK)
        return 0;
    loom_optim_segment seg = {b->buf[0], b->buf[1], b->buf[2], (size_t)n, 0.1f};
    double t[64];
    int k = 0;
    double start = loom_now_s();
    for (int64_t step = 1; k < 64 && (k < 3 || loom_now_s() - start < min_s); step++) {
        loom_optim_step_args a = {&seg, 1, 1e-3f, step, 1.0f};
        if (b->evict) /* cold: a step's AdamW reads state untouched since the last step */
            for (size_t i = 0; i < b->n_evict; i += 16)
                b->evict[i] += 1.0f;
        double t0 = b->cpu_clock ? cpu_now() : loom_now_s();
        ops->step(self, &a);
        t[k++] = (b->cpu_clock ? cpu_now() : loom_now_s()) - t0;
    }
    ops->destroy(self);
    qsort(t, (size_t)k, sizeof *t, cmp_double);
    return t[k / 2] / n;
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

/* bf16 (the precision plugin's compute path): the forward product as the model runs it,
 * matmul_forward_dt over operands that hold bf16 values (gpt_precision.c's promise), and
 * the conversions it makes around its kernels, per element (gpt_round's round_to on
 * every stored activation, convert_from_f32 / convert_to_f32 of the saved activations and
 * of the 16-bit weight copy) */
static void mm_fwd_bf16(bench_box *b, const int *s)
{
    b->be.ops->matmul_forward_dt(b->buf[0], b->buf[1], b->buf[2], b->buf[3], 1, s[0], s[1], s[2],
                                 LOOM_DTYPE_BF16);
}
static void round_bf16(bench_box *b, const int *s)
{
    b->be.ops->round_to(b->buf[0], b->buf[1], (size_t)s[0], LOOM_DTYPE_BF16);
}
static void narrow_bf16(bench_box *b, const int *s)
{
    b->be.ops->convert_from_f32(b->buf[0], b->buf[1], (size_t)s[0], LOOM_DTYPE_BF16);
}
static void widen_bf16(bench_box *b, const int *s)
{
    b->be.ops->convert_to_f32(b->buf[1], b->buf[0], (size_t)s[0], LOOM_DTYPE_BF16);
}

/* Whether the backend has the 16-bit ops (backend.h: each "may be absent: check size"). */
static int has_bf16_path(const loom_backend_ops *k)
{
    return k->size > offsetof(loom_backend_ops, matmul_forward_dt) && k->matmul_forward_dt &&
           k->round_to && k->convert_from_f32 && k->convert_to_f32;
}

/* The bf16 figures (bench_device's bf16 = true) into a table on the stack: gemm = {{M, K, N,
 * fwd_s}}, per_element = {round, narrow, widen} seconds; nil where the backend has none. */
static void bench_bf16(lua_State *L, bench_box *b, int gemm_idx, int e, double min_s)
{
    if (!has_bf16_path(b->be.ops)) {
        lua_pushnil(L);
        return;
    }
    lua_createtable(L, 0, 2);
    lua_newtable(L);
    for (lua_Integer i = 1; lua_istable(L, gemm_idx) && i <= luaL_len(L, gemm_idx); i++) {
        int s[3];
        lua_geti(L, gemm_idx, i);
        read_shape(L, lua_gettop(L), s, 3, "gemm");
        lua_pop(L, 1);
        size_t in = (size_t)s[0] * s[1], w = (size_t)s[1] * s[2];
        if (!alloc_bufs(b, in + w + (size_t)s[0] * s[2]))
            luaL_error(L, "bench_device: out of memory for bf16 gemm shape %d", (int)i);
        b->be.ops->round_to(b->buf[1], b->buf[1], in, LOOM_DTYPE_BF16);
        b->be.ops->round_to(b->buf[2], b->buf[2], w, LOOM_DTYPE_BF16);
        lua_createtable(L, 3, 1);
        for (int j = 0; j < 3; j++) {
            lua_pushinteger(L, s[j]);
            lua_rawseti(L, -2, j + 1);
        }
        lua_pushnumber(L, time_it_as(b, mm_fwd_bf16, s, min_s, 1));
        lua_setfield(L, -2, "fwd_s");
        lua_rawseti(L, -2, i);
    }
    lua_setfield(L, -2, "gemm");
    if (e > 0) {
        if (!alloc_bufs(b, 2 * (size_t)e + 1024))
            luaL_error(L, "bench_device: out of memory for %d floats", e);
        static const char *const names[] = {"round", "narrow", "widen"};
        bench_fn fns[] = {round_bf16, narrow_bf16, widen_bf16};
        lua_createtable(L, 0, 3);
        for (int i = 0; i < 3; i++) {
            /* round_to follows the kernel that wrote its values (hot); the saved activations
             * and the weight copy are narrowed and widened long after they were written */
            lua_pushnumber(L, time_it_as(b, fns[i], &e, min_s, i > 0) / e);
            lua_setfield(L, -2, names[i]);
        }
        lua_setfield(L, -2, "per_element");
    }
}

/* core.bench_device{backend="cpu", threads=0, min_s=0.05, cpu_clock=false (true: CPU time), gemm={{M,K,N},...},
 *   attention={{B,T,C,NH},...}, bandwidth_floats=N, elementwise=N, bf16=false,
 *   elementwise16=N (bf16's conversions' size; default elementwise)}
 * -> {gemm={{M,K,N, fwd_s=, bwd_s=}}, attention={{B,T,C,NH, fwd_s=, bwd_s=}}, bandwidth=B/s,
 *     per_element={...}, bf16={gemm={{M,K,N, fwd_s=}}, per_element={round=, narrow=, widen=}},
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
    b->cpu_clock = bfield(L, 1, "cpu_clock");
    b->n_evict = (size_t)ifield(L, 1, "evict_floats", 0);
    if (b->n_evict && !(b->evict = calloc(b->n_evict, sizeof(float))))
        return luaL_error(L, "bench_device: out of memory for %zu floats", b->n_evict);
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
            double f = time_it_as(b, k == 0 ? mm_fwd : att_fwd, s, min_s, 1);
            double w = time_it_as(b, k == 0 ? mm_bwd : att_bwd, s, min_s, 1);
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
    /* per-element seconds of the element-wise kernels whose cost is arithmetic, not bytes */
    int e = ifield(L, 1, "elementwise", 0) / 256 * 256;
    if (e > 0) {
        if (!alloc_bufs(b, 2 * (size_t)e + 1024))
            return luaL_error(L, "bench_device: out of memory for %d floats", e);
        static const char *const names[] = {"gelu_fwd", "gelu_bwd", "layernorm_fwd", "layernorm_bwd"};
        bench_fn fns[] = {gelu_fwd, gelu_bwd, ln_fwd, ln_bwd};
        lua_createtable(L, 0, 5);
        /* cold, as the GEMMs (plan_machine.lua sizes them beyond the caches: in a step
         * AdamW and the gradient passes stream the model's arrays, GELU's backward reads
         * what forward saved long before) */
        for (int i = 0; i < 4; i++) {
            lua_pushnumber(L, time_it_as(b, fns[i], &e, min_s, 1) / e);
            lua_setfield(L, -2, names[i]);
        }
        lua_pushnumber(L, time_it_as(b, grad_pass, &e, min_s, 1) / e);
        lua_setfield(L, -2, "grad_pass");
        /* distillation's terms (per element; plan.lua's teacher costs), each at a size
         * of a few ms a call (the logit term is some 40 ns an element: a calibration
         * times it for every thread count, so a quarter of min_s each, 3 calls at least):
         * the attention term at T = 64 at most (64 x T x T elements, inside the buffers) */
        int el = e < 1 << 16 ? e : 1 << 16, ea = e < 1 << 18 ? e : 1 << 18;
        ea = ea / 4096 * 4096;
        lua_pushnumber(L, time_it_as(b, kd_logit, &el, min_s / 4, 1) / el);
        lua_setfield(L, -2, "kd_logits");
        if (e >= 4096) {
            int eh = (e < 1 << 19 ? e : 1 << 19) / 4096 * 4096;
            lua_pushnumber(L, time_it_as(b, kd_hidden, &eh, min_s / 4, 1) / eh);
            lua_setfield(L, -2, "kd_hidden");
        }
        if (ea >= 4096) {
            int T = ea / 4096, n = 64 * T * T;
            lua_pushnumber(L, time_it_as(b, kd_attention, &ea, min_s / 4, 1) / n);
            lua_setfield(L, -2, "kd_attention");
        }
        double adam = time_adamw(b, e, min_s);
        if (adam > 0) {
            lua_pushnumber(L, adam);
            lua_setfield(L, -2, "adamw");
        }
        lua_setfield(L, -2, "per_element");
    }
    if (bfield(L, 1, "bf16")) {
        lua_getfield(L, 1, "gemm");
        int gi = lua_gettop(L);
        bench_bf16(L, b, gi, ifield(L, 1, "elementwise16", e) / 256 * 256, min_s);
        lua_remove(L, gi);
        lua_setfield(L, -2, "bf16");
    }
    bench_release(b);
    return 1;
}

/* --- schedules, simulated many times ----------------------------------------------------- */

typedef struct sched_ref { const loom_schedule *s; } sched_ref;

/* core.sched_prepare(lists, microbatches, chunks) -> a prepared schedule whose
 * :simulate{fwd=, bwd_input=, bwd_weight=, latency=} gives {makespan, bubble, busy = {},
 * peak = {}} without the per-instruction spans (the search simulates thousands).
 * core.sched_prepare(name, microbatches, chunks, stages): a sched plugin's lists for that
 * shape, built here (core.sched_build's, without the Lua tables between). The lists are
 * validated here, once (the validator's message raised), not at each simulate. */
static int l_sched_prepare(lua_State *L)
{
    int m = (int)luaL_checkinteger(L, 2), v = (int)luaL_optinteger(L, 3, 1);
    const loom_schedule *sch; /* (the owner pushed) */
    if (lua_type(L, 1) == LUA_TSTRING) {
        lua_Integer n[3] = {luaL_checkinteger(L, 4), m, v}; /* (core.sched_build's checks) */
        static const char *const what[3] = {"stages", "microbatches", "chunks"};
        for (int i = 0; i < 3; i++)
            if (n[i] < 1 || n[i] > 1 << 20)
                return luaL_error(L, "%s must be a whole number >= 1, got %d", what[i], (int)n[i]);
        sch = loom_lua_plugin_schedule(L, lua_tostring(L, 1), (int)n[0], m, v);
    } else {
        sch = loom_lua_check_schedule(L, 1, m, v);
    }
    int owner = lua_gettop(L);
    if (loom_schedule_validate(sch) != LOOM_OK) {
        lua_pushstring(L, loom_last_error());
        return lua_error(L);
    }
    sched_ref *r = lua_newuserdatauv(L, sizeof *r, 1);
    r->s = sch;
    luaL_setmetatable(L, "loom.PlanSchedule");
    lua_pushvalue(L, owner);
    lua_setiuservalue(L, -2, 1); /* the owner lives as long as this */
    return 1;
}

static double cost(lua_State *L, int t, const char *k)
{
    lua_getfield(L, t, k);
    double v = luaL_optnumber(L, -1, 0);
    lua_pop(L, 1);
    return v;
}

static int l_sched_run(lua_State *L)
{
    sched_ref *r = luaL_checkudata(L, 1, "loom.PlanSchedule");
    luaL_checktype(L, 2, LUA_TTABLE);
    loom_sched_costs c = {cost(L, 2, "fwd"), cost(L, 2, "bwd_input"), cost(L, 2, "bwd_weight"),
                          cost(L, 2, "latency"), 0, NULL};
    loom_sched_sim *sim;
    if (loom_schedule_simulate_valid(r->s, &c, &sim) != LOOM_OK) { /* (validated at prepare) */
        lua_pushstring(L, loom_last_error());
        return lua_error(L);
    }
    lua_createtable(L, 0, 4);
    lua_pushnumber(L, sim->makespan);
    lua_setfield(L, -2, "makespan");
    lua_pushnumber(L, sim->bubble);
    lua_setfield(L, -2, "bubble");
    lua_createtable(L, sim->stages, 0);
    lua_createtable(L, sim->stages, 0);
    for (int k = 0; k < sim->stages; k++) {
        lua_pushnumber(L, sim->busy[k]);
        lua_rawseti(L, -3, k + 1);
        lua_pushinteger(L, sim->peak_inflight[k]);
        lua_rawseti(L, -2, k + 1);
    }
    lua_setfield(L, -3, "peak");
    lua_setfield(L, -2, "busy");
    int split = 0;
    for (size_t i = 0; i < r->s->n[0]; i++)
        split |= r->s->list[0][i].op == LOOM_SCHED_BWD_INPUT;
    lua_pushboolean(L, split);
    lua_setfield(L, -2, "split");
    loom_sched_sim_free(sim);
    return 1;
}

void loom_lua_open_plan(lua_State *L)
{
    static const luaL_Reg funcs[] = {{"footprint", l_footprint},
                                     {"zero_padded", l_zero_padded},
                                     {"pp_split", l_pp_split},
                                     {"bench_device", l_bench_device},
                                     {"cpu_now", l_cpu_now},
                                     {"sched_prepare", l_sched_prepare},
                                     {NULL, NULL}};
    luaL_setfuncs(L, funcs, 0);
    loom_lua_open_plan_pages(L);
    loom_lua_open_plan_disk(L);
    loom_lua_open_plan_bring(L);
    static const luaL_Reg methods[] = {{"simulate", l_sched_run}, {NULL, NULL}};
    luaL_newmetatable(L, "loom.PlanSchedule");
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
}
