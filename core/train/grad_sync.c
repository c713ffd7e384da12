/* grad_sync.c — see grad_sync.h. */
#include "grad_sync.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "compress.h"
#include "loom/plugin/comm.h"
#include "loom/plugin/strategy.h"
#include "base/backend.h"
#include "base/clock.h"
#include "base/plugin_loader.h"
#include "base/status.h"

#define MAX_LEVELS 40
#define MAX_PARTS 64    /* pipeline chunks on one rank */
#define PART_RANGES 4   /* ranges of the gradient buffer one part has */

/* A binary-counter pairwise sum over equal-sized float vectors (see grad_sync.h): of
 * [off, off + n) of the gradient buffer (the whole of it, or one part's range). */
typedef struct tree {
    size_t off, n;
    float *buf[MAX_LEVELS + 1]; /* pool */
    int free_list[MAX_LEVELS + 1], n_free;
    int stack_buf[MAX_LEVELS + 1], stack_level[MAX_LEVELS + 1], depth;
    double dstack[MAX_LEVELS + 1]; /* the same tree over scalars (losses) */
    int dlevel[MAX_LEVELS + 1], ddepth;
} tree;

struct loom_grad_sync {
    loom_gpt *model;
    loom_backend *be;
    int canonical, accum;
    size_t total;
    /* data parallel: comm/dp for host buffers (the losses), dcomm/ddp for the backend's
     * (canonical mode's gathered gradients): the same group unless the backend's memory is
     * a device's (loom_host.device_group) */
    const loom_comm_ops *comm, *dcomm;
    void *dp, *ddp;
    int dp_size, dp_rank;
    const loom_strategy_ops *strategy;
    void *strategy_self;
    float *gathered;     /* canonical: dp_size block sums */
    float *leaf;         /* canonical compression: one decompressed leaf (total floats) */
    double *loss_blocks; /* dp_size block loss sums */
    tree t;
    double local_loss;
    /* canonical, in parts (loom_grad_sync_add_range): part p's trees are ranges[first[p]..] */
    tree *ranges;
    int n_ranges, n_parts, part_first[MAX_PARTS + 1];
    loom_grad_reducer reducer; /* .ready NULL: none */
    loom_compress *compress;   /* the caller's; NULL: none */
    int compress_on;           /* this step's exchange is compressed */
    float *staged;             /* a device backend's compression: the gradient in host memory
                                * (the compressor's loops are the host's; total floats) */
    /* loom_grad_sync_final_hook: gradients handed to the strategy during the step's
     * backwards, and when its first reduction started (loom_now_ms; < 0: none yet) */
    size_t reported;
    double first_ms;
};

/* Note the time the strategy's first reduction of the step is under way. */
static void note_first(loom_grad_sync *gs)
{
    const loom_strategy_ops *o = gs->strategy;
    if (gs->first_ms < 0 && o->size > offsetof(loom_strategy_ops, pending) && o->pending &&
        o->pending(gs->strategy_self) > 0)
        gs->first_ms = loom_now_ms();
}

static loom_status strategy_hook(void *ctx, size_t offset, size_t n)
{
    loom_grad_sync *gs = ctx;
    LOOM_TRY(gs->strategy->grads_ready(gs->strategy_self, loom_gpt_grad_data(gs->model), offset, n));
    note_first(gs);
    return LOOM_OK;
}

/* loom_grad_sync_final_hook's: the same, counting what was handed over. */
static loom_status final_hook(void *ctx, size_t offset, size_t n)
{
    loom_grad_sync *gs = ctx;
    gs->reported += n;
    return strategy_hook(gs, offset, n);
}

static loom_status reducer_hook(void *ctx, size_t offset, size_t n)
{
    loom_grad_sync *gs = ctx;
    return gs->reducer.ready(gs->reducer.self, offset, n);
}

static int is_power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }

loom_status loom_grad_sync_create(loom_gpt *m, loom_backend *be, int canonical, int accum,
                                  const loom_plugin_config *strategy,
                                  const loom_grad_reducer *reducer, loom_grad_sync **out)
{
    *out = NULL;
    loom_grad_sync *gs = calloc(1, sizeof *gs);
    if (!gs)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    gs->model = m;
    gs->be = be;
    gs->canonical = canonical;
    gs->accum = accum;
    gs->total = loom_gpt_params(m)->total;
    gs->t.n = gs->total;
    gs->first_ms = -1.0;
    const loom_host *host = loom_core_host();
    const struct loom_comm_ops *ops = NULL;
    void *dp = NULL;
    loom_status st = host->group(LOOM_GROUP_DP, &ops, &dp, &gs->dp_size);
    gs->comm = ops;
    gs->dp = dp;
    int dsize = 1;
    if (st == LOOM_OK)
        st = host->device_group(LOOM_GROUP_DP, &gs->dcomm, &gs->ddp, &dsize);
    gs->dp_rank = gs->comm ? gs->comm->rank(dp) : 0;
    if (st == LOOM_OK && canonical && gs->dp_size > 1 && !is_power_of_two(accum))
        st = loom_fail(LOOM_ERR_INVALID,
                       "canonical mode with dp=%d needs a power-of-two number of micro-batches per "
                       "rank (batch.global / (micro x dp) = %d); choose batch.global accordingly",
                       gs->dp_size, accum);
    if (st == LOOM_OK && gs->comm) {
        gs->loss_blocks = calloc((size_t)gs->dp_size, sizeof(double));
        if (canonical)
            gs->gathered = be->ops->alloc(be->self, (size_t)gs->dp_size * gs->total * sizeof(float));
        if (!gs->loss_blocks || (canonical && !gs->gathered))
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory for the data-parallel buffers");
    }
    if (reducer && !canonical)
        gs->reducer = *reducer;
    if (st == LOOM_OK && gs->comm && !canonical && !gs->reducer.ready) {
        if (!strategy || strategy->desc->kind != LOOM_KIND_STRATEGY)
            st = loom_fail(LOOM_ERR_INVALID, "dp=%d needs the dp strategy plugin", gs->dp_size);
        else {
            gs->strategy = strategy->desc->ops;
            loom_config view = loom_config_view(strategy);
            st = gs->strategy->create(host, &view, &gs->strategy_self);
        }
    }
    if (st != LOOM_OK) {
        loom_grad_sync_destroy(gs);
        return st;
    }
    *out = gs;
    return LOOM_OK;
}

void loom_grad_sync_destroy(loom_grad_sync *gs)
{
    if (!gs)
        return;
    if (gs->strategy)
        gs->strategy->destroy(gs->strategy_self);
    for (int r = -1; r < gs->n_ranges; r++) {
        tree *t = r < 0 ? &gs->t : &gs->ranges[r];
        for (int i = 0; i <= MAX_LEVELS; i++)
            if (t->buf[i])
                gs->be->ops->free(gs->be->self, t->buf[i]);
    }
    free(gs->ranges);
    if (gs->leaf)
        gs->be->ops->free(gs->be->self, gs->leaf);
    if (gs->gathered)
        gs->be->ops->free(gs->be->self, gs->gathered);
    free(gs->loss_blocks);
    free(gs->staged);
    free(gs);
}

size_t loom_grad_sync_buffer_bytes(const loom_grad_sync *gs)
{
    size_t bytes = gs->gathered ? (size_t)gs->dp_size * gs->total * sizeof(float) : 0;
    for (int i = 0; i <= MAX_LEVELS; i++)
        bytes += gs->t.buf[i] ? gs->total * sizeof(float) : 0;
    return bytes + (gs->loss_blocks ? (size_t)gs->dp_size * sizeof(double) : 0);
}

int loom_grad_sync_dp_size(const loom_grad_sync *gs) { return gs->dp_size; }
int loom_grad_sync_dp_rank(const loom_grad_sync *gs) { return gs->dp_rank; }

/* --- the tree ------------------------------------------------------------------------ */

static void tree_reset(tree *t)
{
    t->depth = t->ddepth = 0;
    t->n_free = 0;
    for (int i = MAX_LEVELS; i >= 0; i--)
        t->free_list[t->n_free++] = i;
}

/* Push a copy of x[t->off, t->off + t->n) (x: a whole gradient buffer): equal levels
 * merge, older + newer. */
static loom_status tree_push(loom_grad_sync *gs, tree *t, const float *x)
{
    const loom_backend_ops *k = gs->be->ops;
    size_t bytes = t->n * sizeof(float);
    int b = t->free_list[--t->n_free];
    if (!t->buf[b] && !(t->buf[b] = k->alloc(gs->be->self, bytes)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for canonical-mode gradient sums");
    k->zero(gs->be->self, t->buf[b], bytes);
    k->accumulate(t->buf[b], x + t->off, t->n);
    int level = 0;
    while (t->depth > 0 && t->stack_level[t->depth - 1] == level) {
        int older = t->stack_buf[--t->depth];
        k->accumulate(t->buf[older], t->buf[b], t->n);
        t->free_list[t->n_free++] = b;
        b = older;
        level++;
    }
    t->stack_buf[t->depth] = b;
    t->stack_level[t->depth++] = level;
    return LOOM_OK;
}

/* Fold what is left, newest into older, and write the sum to out[t->off, t->off + t->n). */
static void tree_finish(loom_grad_sync *gs, tree *t, float *out)
{
    const loom_backend_ops *k = gs->be->ops;
    int r = t->stack_buf[t->depth - 1];
    for (int j = t->depth - 2; j >= 0; j--) {
        k->accumulate(t->buf[t->stack_buf[j]], t->buf[r], t->n);
        r = t->stack_buf[j];
    }
    k->zero(gs->be->self, out + t->off, t->n * sizeof(float));
    k->accumulate(out + t->off, t->buf[r], t->n);
    tree_reset(t);
}

static void dtree_push(tree *t, double x)
{
    int level = 0;
    while (t->ddepth > 0 && t->dlevel[t->ddepth - 1] == level) {
        x = t->dstack[--t->ddepth] + x;
        level++;
    }
    t->dstack[t->ddepth] = x;
    t->dlevel[t->ddepth++] = level;
}

static double dtree_finish(tree *t)
{
    double r = t->dstack[t->ddepth - 1];
    for (int j = t->ddepth - 2; j >= 0; j--)
        r = t->dstack[j] + r;
    t->ddepth = 0;
    return r;
}

/* --- the step ------------------------------------------------------------------------ */

void loom_grad_sync_set_compress(loom_grad_sync *gs, loom_compress *c, int on)
{
    gs->compress = c;
    gs->compress_on = c && on;
}

/* The gradient's floats [off, off + n) where the compressor's host loops read them: the
 * model's buffer itself, or on a device backend gs->staged (a host copy of the whole
 * buffer's layout, that range copied in); NULL when out of memory (the error set). */
static float *compress_input(loom_grad_sync *gs, size_t off, size_t n)
{
    float *grads = loom_gpt_grad_data(gs->model);
    if (!loom_backend_device_memory(gs->be))
        return grads;
    if (!gs->staged && !(gs->staged = malloc(gs->total ? gs->total * sizeof(float) : 1))) {
        loom_fail(LOOM_ERR_NOMEM, "out of memory for compression's host copy of the gradient "
                  "(%zu bytes)", gs->total * sizeof(float));
        return NULL;
    }
    gs->be->ops->copy_to_host(gs->be->self, gs->staged + off, grads + off, n * sizeof(float));
    return gs->staged;
}

loom_status loom_grad_sync_begin_micro(loom_grad_sync *gs, int a)
{
    if (a == 0) {
        tree_reset(&gs->t);
        gs->local_loss = 0.0;
        gs->reported = 0;
        gs->first_ms = -1.0;
    }
    if (gs->compress_on && gs->canonical) { /* each micro-batch packed on its own (end) */
        loom_gpt_zero_grad(gs->model);
        loom_gpt_set_grad_hook(gs->model, NULL, NULL);
        return LOOM_OK;
    }
    if (gs->compress_on) { /* accumulate locally; finish exchanges the compressed sum */
        if (a == 0)
            loom_gpt_zero_grad(gs->model);
        loom_gpt_set_grad_hook(gs->model, NULL, NULL);
        return LOOM_OK;
    }
    if (gs->reducer.ready) { /* every micro-batch reduced as backward runs */
        loom_gpt_set_grad_hook(gs->model, reducer_hook, gs);
        return gs->reducer.begin(gs->reducer.self, a);
    }
    if (gs->canonical || a == 0)
        loom_gpt_zero_grad(gs->model);
    /* Fast mode: the strategy reduces buckets during the last micro-batch's backward. */
    int hook = gs->strategy && a == gs->accum - 1;
    loom_gpt_set_grad_hook(gs->model, hook ? strategy_hook : NULL, gs);
    return LOOM_OK;
}

loom_status loom_grad_sync_end_micro(loom_grad_sync *gs, int a, double loss_sum)
{
    dtree_push(&gs->t, loss_sum);
    if (gs->compress_on && gs->canonical) { /* a leaf of the tree: its own message (compress.h) */
        float *g = compress_input(gs, 0, gs->total);
        return g ? loom_compress_leaf(gs->compress, a, g) : LOOM_ERR_NOMEM;
    }
    if (gs->compress_on)
        return LOOM_OK;
    if (gs->reducer.ready)
        return gs->reducer.end(gs->reducer.self);
    if (gs->canonical)
        return tree_push(gs, &gs->t, loom_gpt_grad_data(gs->model));
    return LOOM_OK;
}

loom_status loom_grad_sync_add_range(loom_grad_sync *gs, int part, size_t off, size_t n)
{
    if (!gs->canonical || (part != gs->n_parts && part != gs->n_parts - 1) || part < 0)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "grad_sync: ranges are for canonical mode, added part by part "
                  "in order (part %d after %d)", part, gs->n_parts);
    if (part >= MAX_PARTS || gs->n_ranges >= MAX_PARTS * PART_RANGES || off + n > gs->total)
        LOOM_FAIL(LOOM_ERR_INVALID, "grad_sync: range [%zu, %zu) of part %d does not fit (%d parts "
                  "at most, %zu gradients)", off, off + n, part, MAX_PARTS, gs->total);
    tree *r = realloc(gs->ranges, (size_t)(gs->n_ranges + 1) * sizeof *r);
    if (!r)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    gs->ranges = r;
    memset(&r[gs->n_ranges], 0, sizeof *r);
    r[gs->n_ranges].off = off;
    r[gs->n_ranges].n = n;
    if (part == gs->n_parts)
        gs->part_first[gs->n_parts++] = gs->n_ranges;
    gs->part_first[gs->n_parts] = ++gs->n_ranges;
    return LOOM_OK;
}

loom_status loom_grad_sync_begin_part(loom_grad_sync *gs, int a, int part)
{
    if (part < 0 || part >= gs->n_parts)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "grad_sync: no part %d (%d)", part, gs->n_parts);
    for (int i = gs->part_first[part]; i < gs->part_first[part + 1]; i++) {
        tree *t = &gs->ranges[i];
        if (a == 0)
            tree_reset(t);
        float *g = loom_gpt_grad_data(gs->model) + t->off;
        gs->be->ops->zero(gs->be->self, g, t->n * sizeof(float));
    }
    return LOOM_OK;
}

loom_status loom_grad_sync_end_part(loom_grad_sync *gs, int a, int part, int with_loss,
                                    double loss_sum)
{
    if (with_loss) {
        if (a == 0)
            gs->t.ddepth = 0;
        dtree_push(&gs->t, loss_sum);
    }
    for (int i = gs->part_first[part]; i < gs->part_first[part + 1]; i++) {
        tree *t = &gs->ranges[i];
        if (gs->compress_on) { /* canonical compression: this part's buckets of leaf a */
            float *g = compress_input(gs, t->off, t->n);
            if (!g)
                return LOOM_ERR_NOMEM;
            LOOM_TRY(loom_compress_leaf_range(gs->compress, a, g, t->off, t->n));
        } else
            LOOM_TRY(tree_push(gs, t, loom_gpt_grad_data(gs->model)));
    }
    return LOOM_OK;
}

int loom_grad_sync_can_overlap(const loom_grad_sync *gs)
{
    return !gs->canonical && gs->strategy && !gs->compress_on && !gs->reducer.ready;
}

void loom_grad_sync_final_hook(loom_grad_sync *gs, int on)
{
    loom_gpt_set_grad_hook(gs->model, on && loom_grad_sync_can_overlap(gs) ? final_hook : NULL, gs);
}

double loom_grad_sync_first_ms(const loom_grad_sync *gs) { return gs->first_ms; }

loom_status loom_grad_sync_all_ready(loom_grad_sync *gs)
{
    loom_gpt_set_grad_hook(gs->model, NULL, NULL);
    if (gs->reported) { /* the backwards handed over every range already (final_hook) */
        if (gs->reported != gs->total)
            LOOM_FAIL(LOOM_ERR_INTERNAL, "grad_sync: the backwards reported %zu of %zu gradients "
                      "as final", gs->reported, gs->total);
        return LOOM_OK;
    }
    if (!gs->strategy || gs->compress_on)
        return LOOM_OK;
    if (loom_gpt_expert_parallel(gs->model) < 2)
        return strategy_hook(gs, 0, gs->total);
    /* expert parallelism (under pp): the ranges between the runs of expert entries; the
     * experts are reduced over their own group after (session_ep.h) */
    const loom_param_table *t = loom_gpt_params(gs->model);
    size_t lo = 0;
    for (int i = 0; i < t->count; i++) {
        if (!loom_gpt_is_expert_entry(gs->model, i))
            continue;
        if (t->entries[i].offset > lo)
            LOOM_TRY(strategy_hook(gs, lo, t->entries[i].offset - lo));
        lo = t->entries[i].offset + t->entries[i].numel;
    }
    return lo < gs->total ? strategy_hook(gs, lo, gs->total - lo) : LOOM_OK;
}

/* An all-gather over the dp group, waited for (the tree that follows needs every block):
 * of host memory, or with device = 1 of the backend's. */
static loom_status allgather(loom_grad_sync *gs, const void *send, void *recv, size_t count,
                             loom_dtype dt, int device)
{
    const loom_comm_ops *c = device ? gs->dcomm : gs->comm;
    void *g = device ? gs->ddp : gs->dp;
    loom_comm_request *req = NULL;
    LOOM_TRY(c->allgather_start(g, send, recv, count, dt, &req));
    return c->wait(g, req);
}

/* Canonical compression (compress.h): every rank's leaf messages gathered, then every
 * leaf decompressed and pushed in global micro-batch order into one tree, the same on
 * every rank whatever dp is; the losses as below. */
static loom_status finish_leaves(loom_grad_sync *gs, double local, float *grads, double *loss_sum)
{
    const loom_backend_ops *k = gs->be->ops;
    loom_gpt_set_grad_hook(gs->model, NULL, NULL);
    if (!gs->leaf && !(gs->leaf = k->alloc(gs->be->self, gs->total * sizeof(float))))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for canonical compression's leaf");
    *loss_sum = local;
    if (gs->comm) {
        LOOM_TRY(allgather(gs, &local, gs->loss_blocks, sizeof local, LOOM_DTYPE_U8, 0));
        for (int r = 0; r < gs->dp_size; r++)
            dtree_push(&gs->t, gs->loss_blocks[r]);
        *loss_sum = dtree_finish(&gs->t);
    }
    if (loom_compress_sums_leaves(gs->compress)) { /* powersgd: two rounds, its own trees */
        /* its loops are the host's: on a device, the sum lands in gs->staged (allocated by
         * compress_input for the leaves) and is copied to the gradient buffer */
        int dev = loom_backend_device_memory(gs->be);
        if (dev && !gs->staged)
            LOOM_FAIL(LOOM_ERR_INTERNAL, "canonical powersgd on a device: no leaf was staged");
        LOOM_TRY(loom_compress_sum_leaves(gs->compress, gs->be, dev ? gs->staged : grads));
        if (dev)
            k->copy_to_device(gs->be->self, grads, gs->staged, gs->total * sizeof(float));
    } else {
        LOOM_TRY(loom_compress_gather_leaves(gs->compress));
        tree_reset(&gs->t);
        /* a device backend: each leaf decoded on the host (gs->staged, packed already),
         * copied to the backend's leaf for its tree */
        int dev = loom_backend_device_memory(gs->be);
        for (int j = 0; j < gs->accum * gs->dp_size; j++) {
            loom_compress_decode_leaf(gs->compress, j, dev ? gs->staged : gs->leaf);
            if (dev)
                k->copy_to_device(gs->be->self, gs->leaf, gs->staged, gs->total * sizeof(float));
            LOOM_TRY(tree_push(gs, &gs->t, gs->leaf));
        }
        tree_finish(gs, &gs->t, grads);
    }
    /* 1-bit Adam: the momentum's gradient (host loops: on a device, through gs->staged) */
    if (!loom_backend_device_memory(gs->be)) {
        loom_compress_after_sum(gs->compress, grads);
    } else if (loom_compress_momentum_on(gs->compress)) {
        k->copy_to_host(gs->be->self, gs->staged, grads, gs->total * sizeof(float));
        loom_compress_after_sum(gs->compress, gs->staged);
        k->copy_to_device(gs->be->self, grads, gs->staged, gs->total * sizeof(float));
    }
    return LOOM_OK;
}

/* Compression on a device backend is host-staged (docs/CUDA.md): the gradient copied to
 * host memory, compressed, exchanged and decompressed there by the compressor's host loops
 * (its residuals are host memory), and the sum copied back for the optimizer. */
static loom_status exchange_staged(loom_grad_sync *gs, float *grads)
{
    size_t bytes = gs->total * sizeof(float);
    if (!gs->staged && !(gs->staged = malloc(bytes ? bytes : 1)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for compression's host copy of the gradient "
                  "(%zu bytes)", bytes);
    const loom_backend_ops *k = gs->be->ops;
    k->copy_to_host(gs->be->self, gs->staged, grads, bytes);
    LOOM_TRY(loom_compress_exchange(gs->compress, gs->staged));
    k->copy_to_device(gs->be->self, grads, gs->staged, bytes);
    return LOOM_OK;
}

loom_status loom_grad_sync_finish(loom_grad_sync *gs, double *loss_sum)
{
    float *grads = loom_gpt_grad_data(gs->model);
    double local = dtree_finish(&gs->t);
    if (gs->canonical && gs->compress_on)
        return finish_leaves(gs, local, grads, loss_sum);
    for (int i = 0; gs->canonical && i < gs->n_ranges; i++)
        tree_finish(gs, &gs->ranges[i], grads);
    if (gs->canonical && gs->n_ranges)
        tree_reset(&gs->t); /* for the dp blocks below */
    else if (gs->canonical)
        tree_finish(gs, &gs->t, grads);
    loom_gpt_set_grad_hook(gs->model, NULL, NULL);
    if (!gs->comm) {
        *loss_sum = local;
        return LOOM_OK;
    }
    /* Losses: every rank's block sum, combined in the fixed tree (both modes). */
    LOOM_TRY(allgather(gs, &local, gs->loss_blocks, sizeof local, LOOM_DTYPE_U8, 0));
    for (int r = 0; r < gs->dp_size; r++)
        dtree_push(&gs->t, gs->loss_blocks[r]);
    *loss_sum = dtree_finish(&gs->t);
    if (gs->compress_on && loom_backend_device_memory(gs->be))
        return exchange_staged(gs, grads);
    if (gs->compress_on) /* instead of the all-reduce (or ZeRO's reduce-scatters) */
        return loom_compress_exchange(gs->compress, grads);
    if (gs->reducer.ready)
        return LOOM_OK; /* each backward's end completed its reductions */
    if (!gs->canonical)
        return gs->strategy->before_step(gs->strategy_self);
    LOOM_TRY(allgather(gs, grads, gs->gathered, gs->total, LOOM_DTYPE_F32, 1));
    for (int r = 0; r < gs->dp_size; r++)
        LOOM_TRY(tree_push(gs, &gs->t, gs->gathered + (size_t)r * gs->total));
    tree_finish(gs, &gs->t, grads);
    return LOOM_OK;
}

/* --- a stand-alone tree (grad_sync.h: loom_grad_tree) --------------------------------- */

struct loom_grad_tree {
    loom_grad_sync gs; /* only .be: what tree_push and tree_finish use */
    tree t;
};

loom_status loom_grad_tree_create(loom_backend *be, size_t n, loom_grad_tree **out)
{
    loom_grad_tree *x = calloc(1, sizeof *x);
    if (!(*out = x))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    x->gs.be = be;
    x->t.n = n;
    tree_reset(&x->t);
    return LOOM_OK;
}

loom_status loom_grad_tree_push(loom_grad_tree *x, const float *v)
{
    return tree_push(&x->gs, &x->t, v);
}

void loom_grad_tree_finish(loom_grad_tree *x, float *out) { tree_finish(&x->gs, &x->t, out); }

void loom_grad_tree_destroy(loom_grad_tree *x)
{
    if (!x)
        return;
    for (int i = 0; i <= MAX_LEVELS; i++)
        if (x->t.buf[i])
            x->gs.be->ops->free(x->gs.be->self, x->t.buf[i]);
    free(x);
}
