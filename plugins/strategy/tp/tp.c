/* tp.c — loom-strategy-tp: Megatron-LM tensor parallelism (Shoeybi et al. 2019) with
 * optional sequence parallelism (Korthikanti et al. 2022).
 *
 * What it does: partition() splits every parameter the model marks splittable along the
 * dim the model names (column-parallel output features, row-parallel input features,
 * vocabulary rows) into `parts` equal slices, one per rank of the tp group. At the
 * region boundaries the core calls, it moves activations:
 *                      forward enter (f)   forward leave (g)   backward leave    backward enter
 *   plain              identity            all-reduce          identity          all-reduce
 *   sequence parallel  all-gather          reduce-scatter      all-gather        reduce-scatter
 * Canonical mode replaces each SUM by an exchange of every rank's partial (all-gather, or
 * all-to-all of row blocks for the scatter) and a pairwise tree over ranks in rank order,
 * finishing the core's fixed tree of LOOM_CANONICAL_CHUNKS chunks: any parts that divides
 * the chunk count gives the same bits.
 * Overlap: backward_enter in fast mode returns with its all-reduce / reduce-scatter in
 * flight; the core computes the weight gradients, then calls region_wait.
 * Device memory: the region and tensor buffers are the backend's memory, so the group is
 * host->device_group's (nccl, or the host communicator staged through the backend's
 * copies; with a host-memory backend the very group() one). On a device backend the core
 * calls set_backend, and canonical mode's scratch and tree over ranks go through its ops
 * (alloc, accumulate, residual_forward) instead of the host's memory and loops.
 * What it does not: data parallelism (dp), sharded optimizer state (zero).
 * Invariants: one request in flight at most; every buffer is the core's except scratch.
 */
#include <stddef.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/plugin/comm.h"
#include "loom/plugin/strategy.h"

#define TRY(expr)                     \
    do {                              \
        loom_status try_st_ = (expr); \
        if (try_st_ != LOOM_OK)       \
            return try_st_;           \
    } while (0)

enum { K_SEQUENCE_PARALLEL, K_CANONICAL, N_KEYS };

static const loom_config_key keys[N_KEYS] = {
    [K_SEQUENCE_PARALLEL] = {"sequence_parallel", LOOM_CFG_BOOLEAN, "false",
                             "shard layernorms and residuals over the sequence; all-gather and "
                             "reduce-scatter replace the all-reduces (recipe: tp_sequence_parallel)"},
    [K_CANONICAL] = {"canonical", LOOM_CFG_BOOLEAN, "false",
                     "sum partials in a fixed tree over ranks (set from deterministic = "
                     "\"canonical\")"},
};

typedef struct tp {
    const loom_host *host;
    const loom_comm_ops *comm;
    void *group;
    int parts, index, sp, canonical;
    float *scratch;               /* canonical partials: the backend's memory where k is set */
    size_t scratch_n;
    loom_comm_request *pending;
    const loom_backend_ops *k;    /* set_backend: a device backend's ops, else NULL (host) */
    void *k_self;
} tp;

static loom_status tp_create(const loom_host *host, const loom_config *cfg, void **self)
{
    const struct loom_comm_ops *ops;
    void *group;
    int size;
    /* the buffers are the backend's memory: a device backend's go to its groups (see the
     * opening comment), never straight to a host communicator */
    loom_status st = host->size > offsetof(loom_host, device_group) && host->device_group
                         ? host->device_group(LOOM_GROUP_TP, &ops, &group, &size)
                         : host->group(LOOM_GROUP_TP, &ops, &group, &size);
    if (st != LOOM_OK)
        return st;
    int canonical = cfg->values[K_CANONICAL].number != 0;
    if (canonical && (size > LOOM_CANONICAL_CHUNKS || LOOM_CANONICAL_CHUNKS % size != 0))
        return host->fail(LOOM_ERR_INVALID, "tp: canonical mode needs tp to divide %d (got tp=%d; "
                          "use tp = 1, 2, 4 or 8)", LOOM_CANONICAL_CHUNKS, size);
    tp *t = host->alloc(sizeof *t);
    if (!t)
        return host->fail(LOOM_ERR_NOMEM, "tp: out of memory");
    memset(t, 0, sizeof *t);
    t->host = host;
    t->comm = ops;
    t->group = group;
    t->parts = size;
    t->index = ops ? ops->rank(group) : 0;
    t->sp = cfg->values[K_SEQUENCE_PARALLEL].number != 0;
    t->canonical = canonical;
    *self = t;
    return LOOM_OK;
}

static void release_scratch(tp *t)
{
    if (t->k)
        t->k->free(t->k_self, t->scratch);
    else
        t->host->free(t->scratch);
    t->scratch = NULL;
    t->scratch_n = 0;
}

static void tp_destroy(void *self)
{
    tp *t = self;
    if (!t)
        return;
    if (t->pending)
        t->comm->wait(t->group, t->pending);
    release_scratch(t);
    t->host->free(t);
}

static loom_status tp_set_backend(void *self, const loom_backend_ops *k, void *k_self)
{
    tp *t = self;
    release_scratch(t); /* from here on in the backend's memory */
    t->k = k;
    t->k_self = k_self;
    return LOOM_OK;
}

static float *scratch(tp *t, size_t n)
{
    if (n > t->scratch_n) {
        release_scratch(t);
        t->scratch = t->k ? t->k->alloc(t->k_self, n * sizeof(float))
                          : t->host->alloc(n * sizeof(float));
        t->scratch_n = t->scratch ? n : 0;
    }
    return t->scratch;
}

/* out = in where there is nothing to exchange (a group of one). The backend has no copy
 * within its memory, and such a group is never made on one (tp = 1 has no strategy). */
static loom_status copy_rows(tp *t, float *out, const float *in, size_t n)
{
    if (out == in)
        return LOOM_OK;
    if (t->k)
        return t->host->fail(LOOM_ERR_UNSUPPORTED, "tp: a tensor-parallel group of one rank "
                             "on a device backend (nothing to exchange): use mesh.tp = 1");
    memmove(out, in, n * sizeof(float));
    return LOOM_OK;
}

static loom_status tp_partition(void *self, const loom_param_info *p, loom_partition *out)
{
    tp *t = self;
    out->dim = t->parts > 1 ? p->split_dim : -1;
    out->parts = out->dim < 0 ? 1 : t->parts;
    out->index = out->dim < 0 ? 0 : t->index;
    if (out->dim >= 0 && p->shape[out->dim] % t->parts != 0)
        return t->host->fail(LOOM_ERR_INVALID, "tp: %s has %lld along dim %d, which tp=%d does not "
                             "divide", p->name, (long long)p->shape[out->dim], out->dim, t->parts);
    return LOOM_OK;
}

static loom_status tp_layout(void *self, loom_parallel_layout *out)
{
    tp *t = self;
    out->parts = t->parts;
    out->index = t->index;
    out->sequence_parallel = t->sp;
    return LOOM_OK;
}

/* Wait for a request just started (st: what starting it returned). Takes the address:
 * the request is written by the start call, which an argument list may evaluate later. */
static loom_status finish(tp *t, loom_status st, loom_comm_request *const *req)
{
    return st == LOOM_OK ? t->comm->wait(t->group, *req) : st;
}

/* parts blocks of n floats at s, summed pairwise in the tree over ranks into out. On a
 * device backend the same adds through its ops, the root's written straight into out
 * (residual_forward: a + b, the bits of a += b and a copy, which the backend has no op
 * for). parts > 1 (the group has a communicator). */
static void tree_sum(const tp *t, float *s, size_t n, float *out)
{
    for (int step = 1; step < t->parts; step *= 2)
        for (int i = 0; i + step < t->parts; i += 2 * step) {
            float *a = s + (size_t)i * n;
            const float *b = s + (size_t)(i + step) * n;
            if (!t->k)
                for (size_t j = 0; j < n; j++)
                    a[j] += b[j];
            else if (2 * step >= t->parts) /* the last level: i = 0, the root */
                t->k->residual_forward(out, a, b, n);
            else
                t->k->accumulate(a, b, n);
        }
    if (!t->k)
        memmove(out, s, n * sizeof(float));
}

/* All ranks' rows: all-gather of row blocks under sequence parallelism, else a copy. */
static loom_status gather_rows(tp *t, const loom_region_io *io)
{
    size_t n = io->rows * io->width;
    if (!t->comm || !t->sp)
        return copy_rows(t, io->out, io->in, n);
    loom_comm_request *req;
    return finish(t, t->comm->allgather_start(t->group, io->in, io->out, n / (size_t)t->parts,
                                              LOOM_DTYPE_F32, &req), &req);
}

/* Sum the partials: all-reduce, or reduce-scatter of row blocks under sequence
 * parallelism. async: leave it in flight for region_wait. */
static loom_status sum_rows(tp *t, const loom_region_io *io, int async)
{
    size_t n = io->rows * io->width, block = t->sp ? n / (size_t)t->parts : n;
    if (!t->comm)
        return copy_rows(t, io->out, io->in, n);
    loom_comm_request *req;
    loom_status st;
    if (t->canonical) {
        float *s = scratch(t, block * (size_t)t->parts);
        if (!s)
            return t->host->fail(LOOM_ERR_NOMEM, "tp: out of memory for canonical partials");
        st = t->sp ? t->comm->alltoall_start(t->group, io->in, s, block, LOOM_DTYPE_F32, &req)
                   : t->comm->allgather_start(t->group, io->in, s, block, LOOM_DTYPE_F32, &req);
        TRY(finish(t, st, &req));
        tree_sum(t, s, block, io->out);
        return LOOM_OK;
    }
    st = t->sp ? t->comm->reduce_scatter_start(t->group, io->in, io->out, block, LOOM_DTYPE_F32,
                                               LOOM_REDUCE_SUM, &req)
               : t->comm->allreduce_start(t->group, io->in, io->out, n, LOOM_DTYPE_F32,
                                          LOOM_REDUCE_SUM, &req);
    if (st != LOOM_OK || !async)
        return finish(t, st, &req);
    t->pending = req;
    return LOOM_OK;
}

static loom_status tp_forward_enter(void *self, loom_region r, int layer, const loom_region_io *io)
{
    (void)r, (void)layer;
    return gather_rows(self, io);
}

static loom_status tp_forward_leave(void *self, loom_region r, int layer, const loom_region_io *io)
{
    (void)r, (void)layer;
    return sum_rows(self, io, 0);
}

static loom_status tp_backward_leave(void *self, loom_region r, int layer, const loom_region_io *io)
{
    (void)r, (void)layer;
    return gather_rows(self, io);
}

static loom_status tp_backward_enter(void *self, loom_region r, int layer, const loom_region_io *io)
{
    (void)r, (void)layer;
    return sum_rows(self, io, 1);
}

static loom_status tp_region_wait(void *self)
{
    tp *t = self;
    loom_comm_request *req = t->pending;
    t->pending = NULL;
    return req ? t->comm->wait(t->group, req) : LOOM_OK;
}

static loom_status tp_tensor_allreduce(void *self, float *x, size_t n, loom_reduce_op op)
{
    tp *t = self;
    if (!t->comm || n == 0)
        return LOOM_OK;
    loom_comm_request *req;
    if (op == LOOM_REDUCE_SUM && t->canonical) {
        float *s = scratch(t, n * (size_t)t->parts);
        if (!s)
            return t->host->fail(LOOM_ERR_NOMEM, "tp: out of memory for canonical partials");
        TRY(finish(t, t->comm->allgather_start(t->group, x, s, n, LOOM_DTYPE_F32, &req), &req));
        tree_sum(t, s, n, x);
        return LOOM_OK;
    }
    return finish(t, t->comm->allreduce_start(t->group, x, x, n, LOOM_DTYPE_F32, op, &req), &req);
}

static loom_status tp_tensor_allgather(void *self, const float *in, float *out, size_t n)
{
    tp *t = self;
    if (!t->comm)
        return copy_rows(t, out, in, n);
    loom_comm_request *req;
    return finish(t, t->comm->allgather_start(t->group, in, out, n, LOOM_DTYPE_F32, &req), &req);
}

static const loom_strategy_ops ops = {
    .size = sizeof(loom_strategy_ops),
    .create = tp_create,
    .destroy = tp_destroy,
    .partition = tp_partition,
    .layout = tp_layout,
    .region_forward_enter = tp_forward_enter,
    .region_forward_leave = tp_forward_leave,
    .region_backward_leave = tp_backward_leave,
    .region_backward_enter = tp_backward_enter,
    .region_wait = tp_region_wait,
    .tensor_allreduce = tp_tensor_allreduce,
    .tensor_allgather = tp_tensor_allgather,
    .set_backend = tp_set_backend,
};

static const loom_plugin_desc desc = {
    LOOM_PLUGIN_ABI, sizeof(loom_plugin_desc), LOOM_KIND_STRATEGY, "tp", "0.1.0",
    "tensor parallel: Megatron column/row split, vocabulary-parallel loss, sequence parallel",
    keys, N_KEYS, NULL, &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
