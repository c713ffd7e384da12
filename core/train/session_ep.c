/* session_ep.c — expert parallelism's groups, reduction and norm (session_ep.h). */
#include "session_ep.h"

#include "grad_sync.h"
#include "pipeline.h"
#include "base/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin/comm.h"
#include "base/clock.h"
#include "base/plugin_loader.h"
#include "base/status.h"

struct loom_ep {
    const struct loom_comm_ops *ops;
    void *ep, *edp;    /* split from the dp group */
    /* the same groups for the backend's memory: a device backend's (loom_host.device_group's
     * dp group split alike: nccl's, or dist_staged.c's copies through the host); with host
     * memory dops is NULL and ep, edp serve. The token rows, the experts' gradients and
     * canonical mode's block sums go over these; counts and norm slots over the host's. */
    const struct loom_comm_ops *dops;
    void *dep, *dedp;
    int device;        /* be keeps its buffers in device memory */
    int size, rank, edp_size;
    double *mine, *gathered;  /* the norm's expert slots: this rank's, the ep group's */
    double *order;            /* the norm's slots in ep=1's order (loom_ep_norm_order) */
    size_t n_mine;
    /* canonical mode: per source ep rank a tree over this step's micro-batches, then one
     * over the sources, then one over the edp group's blocks (session_ep.h) */
    loom_backend *be;
    int canonical;
    size_t nexp;
    loom_grad_tree **src, *over;  /* src[c * size + p]: chunk c's experts from source p */
    int chunks;               /* an interleaved stage's chunks (1 without them) */
    size_t *coff, *clen;      /* chunk c's run of the (ep, nexp) copies: [coff, +clen) */
    double *by_chunk;         /* the norm's slots chunk by chunk, and each chunk's count */
    size_t *chunk_slots;      /* (loom_ep_norm_chunks) */
    float *part, *edp_blocks;  /* (ep, nexp), (edp, nexp) */
};

loom_status loom_ep_create(int ep, loom_backend *be, loom_gpt_parallel *par, loom_ep **out)
{
    *out = NULL;
    const struct loom_comm_ops *ops;
    void *dp;
    int dp_size = 1;
    LOOM_TRY(loom_core_host()->group(LOOM_GROUP_DP, &ops, &dp, &dp_size));
    if (ep < 2)
        return LOOM_OK;
    if (!ops || dp_size % ep)
        LOOM_FAIL(LOOM_ERR_INVALID, "mesh ep=%d must divide dp=%d (experts are split over ep of "
                  "the dp ranks)", ep, dp_size);
    if (par->canonical && (ep & (ep - 1)))
        LOOM_FAIL(LOOM_ERR_INVALID, "mesh ep=%d in canonical mode: ep must be a power of two (an "
                  "ep group's micro-batches are summed as one subtree of the fixed tree); use "
                  "ep=2 or 4, or fast mode", ep);
    loom_ep *x = calloc(1, sizeof *x);
    if (!x)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    x->ops = ops;
    int r = ops->rank(dp);
    x->size = ep;
    x->rank = r % ep;
    x->edp_size = dp_size / ep;
    x->be = be;
    x->canonical = par->canonical;
    x->chunks = 1; /* canonical mode's trees: make_trees */
    x->device = loom_backend_device_memory(be);
    loom_status st = ops->split(dp, r / ep, r, &x->ep);
    if (st == LOOM_OK)
        st = ops->split(dp, r % ep, r, &x->edp);
    void *ddp = NULL;
    int dsize = 0;
    if (st == LOOM_OK && x->device) { /* the groups for the backend's memory, split alike */
        st = loom_core_host()->device_group(LOOM_GROUP_DP, &x->dops, &ddp, &dsize);
        if (st == LOOM_OK && (!x->dops || !ddp || dsize != dp_size))
            st = loom_fail(LOOM_ERR_INTERNAL, "ep=%d on a device backend: no device dp group of "
                           "%d ranks (loom_dist_device_open)", ep, dp_size);
        if (st == LOOM_OK)
            st = x->dops->split(ddp, r / ep, r, &x->dep);
        if (st == LOOM_OK)
            st = x->dops->split(ddp, r % ep, r, &x->dedp);
    }
    if (st != LOOM_OK) {
        loom_ep_destroy(x);
        return st;
    }
    par->ep = ep;
    par->ep_rank = x->rank;
    par->ep_ops = ops;
    par->ep_comm = x->ep;
    par->ep_dops = x->device ? x->dops : NULL;
    par->ep_dcomm = x->device ? x->dep : NULL;
    *out = x;
    return LOOM_OK;
}

void loom_ep_destroy(loom_ep *x)
{
    if (!x)
        return;
    if (x->ep)
        x->ops->destroy(x->ep);
    if (x->edp)
        x->ops->destroy(x->edp);
    if (x->dep)
        x->dops->destroy(x->dep);
    if (x->dedp)
        x->dops->destroy(x->dedp);
    for (int p = 0; x->src && p < x->size * x->chunks; p++)
        loom_grad_tree_destroy(x->src[p]);
    free(x->coff);
    free(x->clen);
    free(x->by_chunk);
    free(x->chunk_slots);
    loom_grad_tree_destroy(x->over);
    free(x->src);
    if (x->device) { /* the backend's allocations (make_trees) */
        if (x->part)
            x->be->ops->free(x->be->self, x->part);
        if (x->edp_blocks)
            x->be->ops->free(x->be->self, x->edp_blocks);
    } else {
        free(x->part);
        free(x->edp_blocks);
    }
    free(x->mine);
    free(x->gathered);
    free(x->order);
    free(x);
}

void loom_ep_edp_group(const loom_ep *x, const struct loom_comm_ops **ops, void **group,
                       int *size)
{
    *ops = x->ops;
    *group = x->edp;
    *size = x->edp_size;
}

void loom_ep_edp_device_group(const loom_ep *x, const struct loom_comm_ops **ops, void **group,
                              int *size)
{
    *ops = x->device ? x->dops : x->ops;
    *group = x->device ? x->dedp : x->edp;
    *size = x->edp_size;
}

/* The first step: the trees and their buffers. Chunk c of pl (NULL: one chunk) holds the
 * experts of its blocks, a contiguous run of the copies (each block's run of local experts
 * lies in table order there, and a chunk's blocks follow each other). */
static loom_status make_trees(loom_ep *x, loom_gpt *m, const loom_pipeline *pl, size_t n)
{
    const loom_param_table *t = loom_gpt_params(m);
    x->nexp = n;
    x->chunks = pl ? loom_pipeline_chunks(pl) : 1;
    x->src = calloc((size_t)x->size * (size_t)x->chunks, sizeof *x->src);
    x->coff = calloc((size_t)x->chunks, sizeof *x->coff);
    x->clen = calloc((size_t)x->chunks, sizeof *x->clen);
    /* the trees' sums are where the backend keeps the gradients */
    size_t pb = (size_t)x->size * n * sizeof(float), eb = (size_t)x->edp_size * n * sizeof(float);
    x->part = x->device ? x->be->ops->alloc(x->be->self, pb) : malloc(pb);
    x->edp_blocks = x->device ? x->be->ops->alloc(x->be->self, eb) : malloc(eb);
    if (!x->src || !x->coff || !x->clen || !x->part || !x->edp_blocks)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for canonical mode's expert sums");
    size_t at = 0;
    for (int i = 0; i < t->count; i++) {
        if (!loom_gpt_is_expert_entry(m, i))
            continue;
        int c = pl ? loom_pipeline_entry_chunk(pl, &t->entries[i]) : 0;
        if (c < 0 || c >= x->chunks || (x->clen[c] && x->coff[c] + x->clen[c] != at))
            LOOM_FAIL(LOOM_ERR_INTERNAL, "ep: %s is not in its chunk's run of experts",
                      t->entries[i].name);
        if (!x->clen[c])
            x->coff[c] = at;
        x->clen[c] += t->entries[i].numel;
        at += t->entries[i].numel;
    }
    if (at != n)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ep: %zu expert floats in the table, %zu per source", at, n);
    for (int c = 0; c < x->chunks; c++)
        for (int p = 0; x->clen[c] && p < x->size; p++)
            LOOM_TRY(loom_grad_tree_create(x->be, x->clen[c], &x->src[c * x->size + p]));
    return loom_grad_tree_create(x->be, n, &x->over);
}

/* Chunk c's per-source expert gradients of the backward just run into its trees. */
static loom_status push_chunk(loom_ep *x, loom_gpt *m, const loom_pipeline *pl, int c)
{
    if (!x || !x->canonical)
        return LOOM_OK;
    size_t n;
    const float *g = loom_gpt_moe_source_grads(m, &n);
    if (!g)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ep: canonical mode without per-source expert gradients");
    if (!x->over)
        LOOM_TRY(make_trees(x, m, pl, n));
    if (c < 0 || c >= x->chunks || !x->clen[c])
        return LOOM_OK; /* the tied wte's part, or a chunk without MoE blocks */
    for (int p = 0; p < x->size; p++) /* source p's micro-batch a: its tree's element a */
        LOOM_TRY(loom_grad_tree_push(x->src[c * x->size + p], g + (size_t)p * n + x->coff[c]));
    return LOOM_OK;
}

loom_status loom_ep_end_micro(loom_ep *x, loom_gpt *m) { return push_chunk(x, m, NULL, 0); }

loom_status loom_ep_end_chunk(loom_ep *x, loom_gpt *m, const loom_pipeline *pl, int chunk)
{
    return push_chunk(x, m, pl, chunk);
}

/* dst = src, bit for bit, in the backend's memory (loom_backend_copy_bits). */
static void copy_floats(loom_ep *x, float *dst, const float *src, size_t n)
{
    loom_backend_copy_bits(x->be, dst, src, n);
}

/* Canonical mode: the experts' global gradient into the model's expert entries. The
 * step's micro-batches, by global index, are dp rank r's block of accum (r = g * ep + p
 * for ep group g): source p's tree holds one such complete block, the sources' in order
 * make ep group g's block of ep x accum (a complete subtree: ep and accum powers of two),
 * and the edp group's blocks in order finish the tree every layout builds. */
static loom_status canonical_reduce(loom_ep *x, loom_gpt *m, double *comm_ms)
{
    size_t n = x->nexp;
    if (!x->over)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ep: canonical reduce before any micro-batch");
    for (int p = 0; p < x->size; p++)
        for (int c = 0; c < x->chunks; c++)
            if (x->clen[c])
                loom_grad_tree_finish(x->src[c * x->size + p], x->part + (size_t)p * n + x->coff[c]);
    for (int p = 0; p < x->size; p++)
        LOOM_TRY(loom_grad_tree_push(x->over, x->part + (size_t)p * n));
    loom_grad_tree_finish(x->over, x->part); /* this ep group's block sum */
    if (x->edp_size > 1) {
        double t0 = loom_now_ms();
        loom_comm_request *r;
        const struct loom_comm_ops *o = x->device ? x->dops : x->ops;
        void *edp = x->device ? x->dedp : x->edp;
        LOOM_TRY(o->allgather_start(edp, x->part, x->edp_blocks, n, LOOM_DTYPE_F32, &r));
        LOOM_TRY(o->wait(edp, r));
        *comm_ms += loom_now_ms() - t0;
        for (int q = 0; q < x->edp_size; q++)
            LOOM_TRY(loom_grad_tree_push(x->over, x->edp_blocks + (size_t)q * n));
        loom_grad_tree_finish(x->over, x->part);
    }
    const loom_param_table *t = loom_gpt_params(m);
    float *g = loom_gpt_grad_data(m);
    size_t at = 0;
    for (int i = 0; i < t->count; i++) { /* the runs of expert entries, in table order */
        if (!loom_gpt_is_expert_entry(m, i))
            continue;
        copy_floats(x, g + t->entries[i].offset, x->part + at, t->entries[i].numel);
        at += t->entries[i].numel;
    }
    return LOOM_OK;
}

loom_status loom_ep_reduce(loom_ep *x, loom_gpt *m, double *comm_ms)
{
    if (x && x->canonical)
        return canonical_reduce(x, m, comm_ms);
    if (!x || x->edp_size < 2)
        return LOOM_OK;
    const loom_param_table *t = loom_gpt_params(m);
    float *g = loom_gpt_grad_data(m);
    double t0 = loom_now_ms();
    for (int i = 0; i < t->count; i++) { /* one exchange per run of expert entries */
        if (!loom_gpt_is_expert_entry(m, i))
            continue;
        int j = i;
        while (j + 1 < t->count && loom_gpt_is_expert_entry(m, j + 1))
            j++;
        size_t off = t->entries[i].offset, n = t->entries[j].offset + t->entries[j].numel - off;
        loom_comm_request *r; /* the gradients: the backend's memory's group */
        const struct loom_comm_ops *o = x->device ? x->dops : x->ops;
        void *edp = x->device ? x->dedp : x->edp;
        LOOM_TRY(o->allreduce_start(edp, g + off, g + off, n, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, &r));
        LOOM_TRY(o->wait(edp, r));
        i = j;
    }
    *comm_ms += loom_now_ms() - t0;
    return LOOM_OK;
}

loom_status loom_ep_norm_order(loom_ep *x, loom_gpt *m, const double *slots, size_t n,
                               int *nonfinite, double *comm_ms, const double **order,
                               size_t *n_order)
{
    const loom_param_table *t = loom_gpt_params(m);
    size_t per = n / (size_t)t->count, k = 0;
    for (size_t j = 0; j < n; j++)
        k += (size_t)loom_gpt_is_expert_entry(m, (int)(j / per));
    if (!x->mine) { /* every ep rank holds as many expert slots */
        x->n_mine = k + 1;
        x->mine = malloc(x->n_mine * sizeof(double));
        x->gathered = malloc(x->n_mine * (size_t)x->size * sizeof(double));
        x->order = malloc((n - k + k * (size_t)x->size + 1) * sizeof(double));
        if (!x->mine || !x->gathered || !x->order)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    }
    k = 0;
    for (size_t j = 0; j < n; j++)
        if (loom_gpt_is_expert_entry(m, (int)(j / per)))
            x->mine[k++] = slots[j];
    x->mine[k] = *nonfinite ? 1.0 : 0.0;
    double t0 = loom_now_ms();
    loom_comm_request *r;
    LOOM_TRY(x->ops->allgather_start(x->ep, x->mine, x->gathered, x->n_mine * sizeof(double),
                                     LOOM_DTYPE_U8, &r));
    LOOM_TRY(x->ops->wait(x->ep, r));
    *comm_ms += loom_now_ms() - t0;
    /* ep=1's order: each run of local expert slots becomes every ep rank's run in rank
     * order (rank p holds experts p El ..) */
    size_t at = 0, run0 = 0; /* run0: the current run's first slot among this rank's */
    for (size_t j = 0; j < n;) {
        if (!loom_gpt_is_expert_entry(m, (int)(j / per))) {
            x->order[at++] = slots[j++];
            continue;
        }
        size_t len = 0;
        while (j + len < n && loom_gpt_is_expert_entry(m, (int)((j + len) / per)))
            len++;
        for (int p = 0; p < x->size; p++)
            for (size_t q = 0; q < len; q++)
                x->order[at++] = x->gathered[(size_t)p * x->n_mine + run0 + q];
        run0 += len;
        j += len;
    }
    for (int p = 0; p < x->size; p++)
        *nonfinite |= x->gathered[(size_t)p * x->n_mine + x->n_mine - 1] != 0.0;
    *order = x->order;
    *n_order = at;
    return LOOM_OK;
}

loom_status loom_ep_norm_chunks(loom_ep *x, loom_gpt *m, const loom_pipeline *pl,
                                const double *slots, size_t n, int *nonfinite, double *comm_ms,
                                const double **order, size_t *n_order, const size_t **chunk_slots)
{
    const loom_param_table *t = loom_gpt_params(m);
    const double *o;
    size_t k, per = n / (size_t)t->count;
    LOOM_TRY(loom_ep_norm_order(x, m, slots, n, nonfinite, comm_ms, &o, &k));
    int C = loom_pipeline_chunks(pl);
    if (!x->by_chunk) {
        x->by_chunk = malloc((k ? k : 1) * sizeof(double));
        x->chunk_slots = malloc((size_t)C * sizeof(size_t));
        if (!x->by_chunk || !x->chunk_slots)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    }
    /* o is in table order, each dense entry's per slots and each run of expert entries'
     * slots x ep; the chunks' in turn, each keeping that order */
    size_t at = 0, pos = 0;
    for (int c = 0; c < C; c++) {
        x->chunk_slots[c] = 0;
        pos = 0;
        for (int i = 0; i < t->count; i++) {
            int j = i;
            while (loom_gpt_is_expert_entry(m, i) && j + 1 < t->count && loom_gpt_is_expert_entry(m, j + 1))
                j++;
            size_t w = (size_t)(j - i + 1) * per * (loom_gpt_is_expert_entry(m, i) ? (size_t)x->size : 1);
            if (loom_pipeline_entry_chunk(pl, &t->entries[i]) == c && at + w <= k) {
                memcpy(x->by_chunk + at, o + pos, w * sizeof(double));
                at += w;
                x->chunk_slots[c] += w;
            }
            pos += w;
            i = j;
        }
    }
    if (pos != k || at != k)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "ep: %zu of %zu norm slots placed in chunks (%zu walked)",
                  at, k, pos);
    *order = x->by_chunk;
    *n_order = k;
    *chunk_slots = x->chunk_slots;
    return LOOM_OK;
}

loom_status loom_ep_norm(loom_ep *x, loom_gpt *m, const double *slots, size_t n, double *norm_sq,
                         int *nonfinite, double *comm_ms)
{
    if (!x)
        return LOOM_OK;
    const double *order;
    size_t k;
    LOOM_TRY(loom_ep_norm_order(x, m, slots, n, nonfinite, comm_ms, &order, &k));
    double sum = 0.0; /* ep=1's sum, bit for bit */
    for (size_t j = 0; j < k; j++)
        sum += order[j];
    *norm_sq = sum;
    return LOOM_OK;
}

/* Append a copy of entry e (its name replaced by name when given) to ft. */
static loom_status copy_entry(loom_param_table *ft, const loom_param_entry *e, const char *name)
{
    LOOM_TRY(loom_params_add(ft, name ? name : e->name, e->ndim, e->shape, e->layer, e->init,
                             e->init_std));
    loom_param_entry *d = &ft->entries[ft->count - 1];
    size_t off = d->offset;
    char keep[LOOM_PARAM_NAME_MAX];
    memcpy(keep, d->name, sizeof keep);
    *d = *e;
    d->offset = off;
    memcpy(d->name, keep, sizeof keep);
    return LOOM_OK;
}

loom_status loom_ep_gather_full(loom_ep *x, loom_gpt *m, const float *host_params,
                                const float *state, uint32_t slots, loom_param_table *ft,
                                float **params, float **full_state)
{
    const loom_param_table *t = loom_gpt_params(m);
    const loom_gpt_config *c = loom_gpt_get_config(m);
    int P = x->size, El = c->moe.experts / P;
    const char *const *kinds; /* each expert's entries, as the ep=1 table names them */
    int K = loom_gpt_moe_expert_kinds(m, &kinds);
    memset(ft, 0, sizeof *ft);
    *params = *full_state = NULL;
    /* the table: each block's run of local experts becomes all E experts, in global order */
    for (int i = 0; i < t->count; i++) {
        if (!loom_gpt_is_expert_entry(m, i)) {
            LOOM_TRY(copy_entry(ft, &t->entries[i], NULL));
            continue;
        }
        for (int e = 0; e < c->moe.experts; e++)
            for (int k = 0; k < K; k++) {
                char name[LOOM_PARAM_NAME_MAX];
                snprintf(name, sizeof name, "h.%d.moe.expert.%d.%s", t->entries[i].layer, e, kinds[k]);
                LOOM_TRY(copy_entry(ft, &t->entries[i + k], name));
            }
        i += K * El - 1;
    }
    size_t run = 0; /* the longest run of expert floats, for the exchange buffer */
    for (int i = 0; i < t->count; i++)
        if (loom_gpt_is_expert_entry(m, i) && (i == 0 || !loom_gpt_is_expert_entry(m, i - 1))) {
            int j = i + K * El - 1;
            size_t n = t->entries[j].offset + t->entries[j].numel - t->entries[i].offset;
            run = n > run ? n : run;
        }
    *params = calloc(ft->total, sizeof(float));
    *full_state = slots ? calloc((size_t)slots * ft->total, sizeof(float)) : NULL;
    size_t most = (run ? run : 1) * (slots > 1 ? slots : 1);
    float *send = malloc(most * sizeof(float)), *recv = malloc(most * (size_t)P * sizeof(float));
    loom_status st = *params && (!slots || *full_state) && send && recv ? LOOM_OK
                     : loom_fail(LOOM_ERR_NOMEM, "checkpoint under ep=%d: out of memory for the "
                                 "whole model (%zu MiB)", P, ft->total * (1 + slots) * 4 >> 20);
    /* pass 0: the parameters; pass 1: the optimizer state, entry-major with its slots inner
     * (entry i's at slots x offset): the same walk with every offset and size x slots */
    for (int pass = 0; st == LOOM_OK && pass < (slots ? 2 : 1); pass++) {
        size_t w = pass ? slots : 1;
        const float *src = pass ? state : host_params;
        float *dst = pass ? *full_state : *params;
        int f = 0; /* ft's entry matching t's entry i */
        for (int i = 0; st == LOOM_OK && i < t->count; i++) {
            const loom_param_entry *e = &t->entries[i];
            if (!loom_gpt_is_expert_entry(m, i)) {
                memcpy(dst + w * ft->entries[f++].offset, src + w * e->offset,
                       w * e->numel * sizeof(float));
                continue;
            }
            /* this block's local experts from every ep rank, rank p's at p * n */
            const loom_param_entry *last = &t->entries[i + K * El - 1];
            size_t n = w * (last->offset + last->numel - e->offset);
            memcpy(send, src + w * e->offset, n * sizeof(float));
            loom_comm_request *r;
            st = x->ops->allgather_start(x->ep, send, recv, n, LOOM_DTYPE_F32, &r);
            if (st == LOOM_OK)
                st = x->ops->wait(x->ep, r);
            for (int p = 0; st == LOOM_OK && p < P; p++)
                for (int q = 0; q < K * El; q++) { /* rank p's q-th: expert p El + q / K */
                    const loom_param_entry *le = &t->entries[i + q];
                    const loom_param_entry *fe = &ft->entries[f + K * (p * El) + q];
                    memcpy(dst + w * fe->offset, recv + (size_t)p * n + w * (le->offset - e->offset),
                           w * le->numel * sizeof(float));
                }
            f += K * c->moe.experts;
            i += K * El - 1;
        }
    }
    free(send);
    free(recv);
    if (st != LOOM_OK) {
        free(*params);
        free(*full_state);
        *params = *full_state = NULL;
        loom_params_free(ft);
    }
    return st;
}
