/* pipeline.c — the pipeline engine (see pipeline.h).
 *
 * Invariants: a slot is one activation set of the model (gpt_stage.h); slot_of maps a
 * (micro-batch, chunk) to its slot from its first RECV_ACT or FWD until it is freed: when
 * it has its weight gradients (BWD, or BWD_WEIGHT after BWD_INPUT) and has sent its input
 * gradient (SEND_GRAD, unless it is virtual stage 0). A freed slot may still have sends
 * in flight from its buffers: they are waited before the next compute on that slot (its
 * FWD writes them), never earlier. A RECV's wait completes only that receive (sends finish
 * on their own, as in MPI): a send larger than the transport's buffer finishes once the
 * peer posts its receive, which it may do only after its own RECV returns.
 */
#include "pipeline.h"
#include "pipeline_check.h"
#include "pipeline_split.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin/comm.h"
#include "model/gpt_stage.h"
#include "schedule.h"
#include "trace.h"
#include "base/backend.h"
#include "base/clock.h"
#include "base/plugin_loader.h"
#include "base/status.h"

#define MAX_PENDING 4
#define MAX_GROUP 8 /* transfers in one run of a list: interleaved's 2 sends + 2 receives, the
                     * canonical wte halves beside them */

/* What a (micro-batch, chunk) has done of its backward: its slot is freed once it has its
 * weight gradients (BWD or W) and has sent its input gradient (or has none to send). */
enum { DONE_WEIGHTS = 1, DONE_SENT = 2, DONE_SPLIT = 4 /* B ran: the gradient is in grad_out */ };

typedef struct slot {
    int busy;                       /* holds a (micro-batch, chunk) */
    loom_comm_request *req[MAX_PENDING];
    int n_req;
} slot;

struct loom_pipeline {
    const loom_comm_ops *ops;       /* the pp group for host values: the loss, the norm */
    void *pp;
    const loom_comm_ops *dops;      /* the pp group for the model's buffers (activations, */
    void *dpp;                      /* their gradients, the wte halves): loom_host.device_group */
    const loom_backend *be;         /* the model's backend; device: its memory is not the host's */
    int device;
    /* The transport's sends wait for their receivers (LOOM_COMM_P2P_RENDEZVOUS: nccl), or
     * LOOM_PP_GROUPED=1: each run of consecutive transfers is collected here and posted as
     * one group (p2p_group_start) before the next compute or the end of the list, and
     * waited whole there: the simulator's rendezvous mode, checked at create. */
    int grouped;
    loom_p2p batch[MAX_GROUP];
    int n_batch;
    int stages, stage, microbatches, chunks, layers;
    int *first;                     /* [stages*chunks + 1]: virtual stage k holds [first[k], first[k+1]) */
    unsigned char *own;             /* [layers] */
    loom_sched_instr *list;
    size_t n;
    slot *slots;
    int n_slots;
    int *slot_of;                   /* [microbatches * chunks] */
    unsigned char *done;            /* [microbatches * chunks]: DONE_* of this step */
    int split;                      /* the list has BWD_INPUT / BWD_WEIGHT */
    float *tmp;                     /* the tied wte exchange */
    size_t tmp_n;
    int canonical;
    int tied_head;                  /* the LM head is wte (loom_pipeline_config.untied) */
    float **head;                   /* canonical, stage 0 and last: [n_slots] wte-sized buffers */
    loom_trace *trace;              /* not owned; NULL: off */
    double compute_ms, wall_ms;     /* the last step's F/B/W time and pipeline phase */
    double compute_cpu_ms;          /* the last step's F/B/W CPU time (loom_cpu_ms) */
    float *tied;                    /* canonical, chunks > 1: [microbatches] wte-sized halves */
    size_t at;                      /* the instruction the step is in (n: after the list) */
    size_t *last_w;                 /* [chunks]: the position of the chunk's last BWD or W */
};

/* --- the engine's own buffers of the model's values (the wte halves) ------------------
 * In the model's memory: the host's (memcpy and loops, as always), or a device backend's,
 * where every write goes through the backend's ops, ordered on its stream with the kernels
 * around it. */

static float *buf_alloc(loom_pipeline *pl, size_t n)
{
    if (!pl->device)
        return malloc(n * sizeof(float));
    return pl->be->ops->alloc(pl->be->self, n * sizeof(float));
}

static void buf_free(loom_pipeline *pl, float *p)
{
    if (p && pl->device)
        pl->be->ops->free(pl->be->self, p);
    else
        free(p);
}

static void buf_zero(loom_pipeline *pl, float *p, size_t n)
{
    if (pl->device)
        pl->be->ops->zero(pl->be->self, p, n * sizeof(float));
    else
        memset(p, 0, n * sizeof(float));
}

/* acc[i] += x[i]: one IEEE add each, the host loop's bits */
static void buf_add(loom_pipeline *pl, float *acc, const float *x, size_t n)
{
    if (pl->device) {
        pl->be->ops->accumulate(acc, x, n);
        return;
    }
    for (size_t j = 0; j < n; j++)
        acc[j] += x[j];
}

/* dst = src, bit for bit (loom_backend_copy_bits: a device has no device-to-device copy,
 * so -0 + x). A pipeline without a backend is host memory. */
static void buf_copy(loom_pipeline *pl, float *dst, const float *src, size_t n)
{
    if (pl->be) /* memcpy on host memory */
        loom_backend_copy_bits(pl->be, dst, src, n);
    else
        memcpy(dst, src, n * sizeof(float));
}

static loom_status split_layers(loom_pipeline *pl, const loom_pipeline_config *cfg)
{
    int V = pl->stages * pl->chunks, L = cfg->layers;
    pl->first = calloc((size_t)V + 1, sizeof(int));
    if (!pl->first)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    if (cfg->split && cfg->n_split) {
        if (cfg->n_split != V)
            LOOM_FAIL(LOOM_ERR_INVALID, "pp_layers has %d entries; it needs one per stage%s (%d)",
                      cfg->n_split, pl->chunks > 1 ? " and chunk" : "", V);
        int sum = 0;
        for (int k = 0; k < V; k++) {
            if (cfg->split[k] < 1)
                LOOM_FAIL(LOOM_ERR_INVALID, "pp_layers[%d] = %d: every stage needs at least one "
                          "block", k + 1, cfg->split[k]);
            pl->first[k] = sum;
            sum += cfg->split[k];
        }
        if (sum != L)
            LOOM_FAIL(LOOM_ERR_INVALID, "pp_layers adds up to %d blocks; the model has layers=%d",
                      sum, L);
        pl->first[V] = L;
        return LOOM_OK;
    }
    if (L < V)
        LOOM_FAIL(LOOM_ERR_INVALID, "model layers=%d cannot fill pp=%d x chunks=%d = %d pipeline "
                  "stages of at least one block each", L, pl->stages, pl->chunks, V);
    int *counts = malloc((size_t)V * sizeof *counts);
    if (!counts)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    loom_status st = loom_pipeline_balance(L, V, cfg->layer_cost, cfg->first_cost, cfg->last_cost,
                                           counts);
    for (int k = 0, at = 0; st == LOOM_OK && k <= V; k++) {
        pl->first[k] = at;
        at += k < V ? counts[k] : 0;
    }
    free(counts);
    return st;
}

/* Lists given ready must be for this run's shape: one per rank of the pp group. */
static loom_status given_lists(const loom_pipeline *pl, const loom_pipeline_config *cfg)
{
    const loom_schedule *s = cfg->lists;
    if (s->stages != pl->stages || s->microbatches != pl->microbatches || s->chunks != pl->chunks)
        LOOM_FAIL(LOOM_ERR_INVALID, "schedule %s gives lists for %d stages, %d micro-batches, %d "
                  "chunks; this run has pp=%d, microbatches=%d, chunks=%d",
                  cfg->name ? cfg->name : "(Lua)", s->stages, s->microbatches, s->chunks,
                  pl->stages, pl->microbatches, pl->chunks);
    return LOOM_OK;
}

/* Grouped transfers (pipeline.c's struct): the lists must complete under the simulator's
 * rendezvous model. Canonical mode's wte halves between the last stage and stage 0 ride in
 * the groups of the gradients between the same two ranks only with 2 stages (one chunk);
 * with more, stage 0's group would wait on the last stage's, which the simulator does not
 * model: refused. */
static loom_status check_grouped(const loom_pipeline *pl, const loom_pipeline_config *cfg,
                                 const loom_schedule *use, const char *name)
{
    const char *why = (loom_comm_flags(pl->dops) & LOOM_COMM_P2P_RENDEZVOUS)
                          ? "a transport whose sends wait for their receivers (nccl)"
                          : "LOOM_PP_GROUPED=1";
    if (cfg->canonical && !cfg->untied && pl->chunks == 1 && pl->stages > 2)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "pipeline: canonical mode at pp=%d over %s is not built "
                  "(the tied wte's per-micro-batch halves from the last stage to stage 0 would "
                  "need groups the schedule's simulation does not check); use pp=2, fast mode, "
                  "or comm = \"shm\"", pl->stages, why);
    loom_sched_costs rc = {.fwd = 1, .bwd_input = 1, .bwd_weight = 1, .rendezvous = 1};
    loom_sched_sim *sim = NULL;
    loom_status st = loom_schedule_simulate(use, &rc, &sim);
    loom_sched_sim_free(sim);
    if (st != LOOM_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", loom_last_error());
        return loom_fail(st, "schedule %s with each run of transfers posted as one group (%s): "
                         "%s", name, why, msg);
    }
    return LOOM_OK;
}

loom_status loom_pipeline_create(const loom_pipeline_config *cfg, loom_pipeline **out)
{
    *out = NULL;
    loom_pipeline *pl = calloc(1, sizeof *pl);
    if (!pl)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    loom_status st = loom_core_host()->group(LOOM_GROUP_PP, &pl->ops, &pl->pp, &pl->stages);
    if (st == LOOM_OK && (!pl->ops || pl->stages < 2))
        st = loom_fail(LOOM_ERR_INVALID, "the pipeline engine needs a pp group of 2 or more ranks");
    pl->stage = st == LOOM_OK ? pl->ops->rank(pl->pp) : 0;
    int dsize = 0;
    if (st == LOOM_OK) /* the same group for the backend's memory (host memory: the same one) */
        st = loom_core_host()->device_group(LOOM_GROUP_PP, &pl->dops, &pl->dpp, &dsize);
    if (st == LOOM_OK && (!pl->dops || dsize != pl->stages))
        st = loom_fail(LOOM_ERR_INTERNAL, "pipeline: the pp group for the backend's memory has "
                       "%d ranks, the host one %d", dsize, pl->stages);
    pl->be = cfg->backend;
    pl->device = cfg->backend && loom_backend_device_memory(cfg->backend);
    pl->microbatches = cfg->microbatches;
    pl->chunks = cfg->chunks < 1 ? 1 : cfg->chunks;
    pl->layers = cfg->layers;
    if (st == LOOM_OK)
        st = split_layers(pl, cfg);
    loom_schedule *sch = NULL;
    loom_sched_sim *sim = NULL;
    if (st == LOOM_OK && cfg->lists)
        st = given_lists(pl, cfg);
    else if (st == LOOM_OK)
        st = loom_schedule_from_plugin(cfg->sched, pl->stages, pl->microbatches, pl->chunks, &sch);
    const loom_schedule *use = cfg->lists ? cfg->lists : sch; /* from here on the same checks */
    const char *name = cfg->lists ? (cfg->name ? cfg->name : "a Lua schedule") : cfg->sched->name;
    if (st == LOOM_OK)
        st = loom_schedule_simulate(use, NULL, &sim); /* validates, then refuses a deadlock */
    if (st == LOOM_OK)
        st = loom_pipeline_check_fifo(use, cfg->canonical && pl->chunks == 1);
    const char *force = getenv("LOOM_PP_GROUPED"); /* the grouped path on any transport (tests) */
    pl->grouped = (loom_comm_flags(pl->dops) & LOOM_COMM_P2P_RENDEZVOUS) ||
                  (force && !strcmp(force, "1"));
    if (st == LOOM_OK && pl->grouped)
        st = check_grouped(pl, cfg, use, name);
    for (size_t i = 0; st == LOOM_OK && i < use->n[pl->stage]; i++)
        pl->split |= use->list[pl->stage][i].op == LOOM_SCHED_BWD_INPUT;
    pl->canonical = cfg->canonical;
    pl->tied_head = !cfg->untied;
    if (st == LOOM_OK && pl->canonical)
        st = loom_pipeline_check_order(use, name);
    if (st == LOOM_OK) {
        pl->n = use->n[pl->stage];
        pl->list = malloc(pl->n * sizeof *pl->list);
        pl->n_slots = sim->peak_inflight[pl->stage] + 1;
        pl->slots = calloc((size_t)pl->n_slots, sizeof *pl->slots);
        pl->slot_of = malloc((size_t)pl->microbatches * pl->chunks * sizeof(int));
        pl->own = calloc((size_t)pl->layers, 1);
        pl->done = malloc((size_t)pl->microbatches * pl->chunks);
        pl->last_w = calloc((size_t)pl->chunks, sizeof *pl->last_w);
        if (!pl->list || !pl->slots || !pl->slot_of || !pl->own || !pl->done || !pl->last_w)
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
    }
    if (st == LOOM_OK) {
        memcpy(pl->list, use->list[pl->stage], pl->n * sizeof *pl->list);
        for (size_t i = 0; i < pl->n; i++)
            if (pl->list[i].op == LOOM_SCHED_BWD || pl->list[i].op == LOOM_SCHED_BWD_WEIGHT)
                pl->last_w[pl->list[i].chunk] = i;
        for (int c = 0; c < pl->chunks; c++) {
            int k = c * pl->stages + pl->stage;
            for (int l = pl->first[k]; l < pl->first[k + 1]; l++)
                pl->own[l] = 1;
        }
    }
    loom_sched_sim_free(sim);
    loom_schedule_free(sch);
    if (st != LOOM_OK) {
        loom_pipeline_destroy(pl);
        return st;
    }
    *out = pl;
    return LOOM_OK;
}

void loom_pipeline_destroy(loom_pipeline *pl)
{
    if (!pl)
        return;
    free(pl->first);
    free(pl->own);
    free(pl->list);
    free(pl->slots);
    free(pl->slot_of);
    free(pl->done);
    buf_free(pl, pl->tmp);
    for (int i = 0; pl->head && i < pl->n_slots; i++)
        buf_free(pl, pl->head[i]);
    free(pl->head);
    buf_free(pl, pl->tied);
    free(pl->last_w);
    free(pl);
}

const unsigned char *loom_pipeline_stage_layers(const loom_pipeline *pl) { return pl->own; }
int loom_pipeline_slots(const loom_pipeline *pl) { return pl->n_slots; }
int loom_pipeline_stage(const loom_pipeline *pl) { return pl->stage; }
int loom_pipeline_stages(const loom_pipeline *pl) { return pl->stages; }
void loom_pipeline_set_trace(loom_pipeline *pl, loom_trace *tr) { pl->trace = tr; }
double loom_pipeline_compute_cpu_ms(const loom_pipeline *pl) { return pl->compute_cpu_ms; }
void loom_pipeline_timing(const loom_pipeline *pl, double *compute_ms, double *wall_ms)
{
    *compute_ms = pl->compute_ms;
    *wall_ms = pl->wall_ms;
}
const int *loom_pipeline_split(const loom_pipeline *pl, int *n_virtual)
{
    *n_virtual = pl->stages * pl->chunks;
    return pl->first;
}
int loom_pipeline_split_backward(const loom_pipeline *pl) { return pl->split; }
int loom_pipeline_chunks(const loom_pipeline *pl) { return pl->chunks; }

/* The chunk that owns table entry e (see loom_pipeline_chunk_ranges). */
static int entry_chunk(const loom_pipeline *pl, const loom_param_entry *e)
{
    if (e->layer < 0)
        return pl->stage == 0 ? 0 : pl->chunks - 1;
    for (int c = 0; c < pl->chunks; c++) {
        int k = c * pl->stages + pl->stage;
        if (e->layer >= pl->first[k] && e->layer < pl->first[k + 1])
            return c;
    }
    return -1;
}

int loom_pipeline_entry_chunk(const loom_pipeline *pl, const loom_param_entry *e)
{
    return entry_chunk(pl, e);
}

/* The grad_sync part of entry e: its chunk, but canonical mode with chunks > 1 gives the
 * tied wte a part of its own on stage 0 (chunks: filled after the list, tied_exchange) and
 * none on the last stage (its copy is replaced by stage 0's after the step). */
static int entry_part(const loom_pipeline *pl, const loom_param_entry *e)
{
    if (pl->tied_head && pl->canonical && pl->chunks > 1 && !strcmp(e->name, "wte"))
        return pl->stage == 0 ? pl->chunks : -1;
    return entry_chunk(pl, e);
}

int loom_pipeline_chunk_ranges(const loom_pipeline *pl, const loom_param_table *t, int chunk,
                               size_t off[4], size_t n[4])
{
    int count = 0;
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        if (entry_part(pl, e) != chunk)
            continue;
        if (count && off[count - 1] + n[count - 1] == e->offset)
            n[count - 1] += e->numel; /* entries follow each other in the buffer */
        else if (count < 4) {
            off[count] = e->offset;
            n[count++] = e->numel;
        } else
            return -1;
    }
    return count;
}

/* --- the step ------------------------------------------------------------------------ */

static loom_status wait_slot(loom_pipeline *pl, slot *s)
{
    loom_status st = LOOM_OK;
    for (int i = 0; i < s->n_req; i++) {
        loom_status w = pl->dops->wait(pl->dpp, s->req[i]);
        if (st == LOOM_OK)
            st = w;
    }
    s->n_req = 0;
    return st;
}

/* Canonical mode's per-slot copies of one micro-batch's LM-head half of the wte gradient. */
static loom_status head_buffer(loom_pipeline *pl, loom_gpt *m, int slot, float **buf, float **g,
                               size_t *n)
{
    const loom_param_entry *e = loom_params_find(loom_gpt_params(m), "wte");
    if (!e)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "pipeline: stage %d holds no wte", pl->stage);
    if (!pl->head && !(pl->head = calloc((size_t)pl->n_slots, sizeof *pl->head)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    if (!pl->head[slot] && !(pl->head[slot] = buf_alloc(pl, e->numel)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for canonical mode's wte gradient halves");
    *buf = pl->head[slot];
    *g = loom_gpt_grad_data(m) + e->offset;
    *n = e->numel;
    return LOOM_OK;
}

/* Canonical mode with chunks > 1: micro-batch mb's half of the tied wte gradient, kept
 * until the step's end (stage 0: the embedding's, the last stage: the LM head's). */
static loom_status tied_half(loom_pipeline *pl, size_t hn, int mb, float **out)
{
    if (!pl->tied && !(pl->tied = buf_alloc(pl, (size_t)pl->microbatches * hn)))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for canonical mode's %d wte gradient halves",
                  pl->microbatches);
    *out = pl->tied + (size_t)mb * hn;
    return LOOM_OK;
}

/* Canonical mode with chunks > 1, after the step's list: the last stage sends its head
 * halves in micro-batch order and stage 0 adds each to its embedding half (emb + head, one
 * rank's one add) and hands it to the hooks as the tied part (chunk -1). Done here, where
 * no other message is in flight between the two, because inside the list the halves would
 * have to fit between the interleaved activations and gradients of an untagged transport. */
static loom_status tied_exchange(loom_pipeline *pl, loom_gpt *m, const loom_pipeline_hooks *hooks)
{
    float *hb = NULL, *gw = NULL, *half = NULL;
    size_t hn;
    LOOM_TRY(head_buffer(pl, m, 0, &hb, &gw, &hn));
    for (int mb = 0; mb < pl->microbatches; mb++) {
        loom_comm_request *r = NULL;
        LOOM_TRY(tied_half(pl, hn, mb, &half));
        if (pl->stage != 0) {
            LOOM_TRY(pl->dops->send_start(pl->dpp, half, hn, LOOM_DTYPE_F32, 0, &r));
            LOOM_TRY(pl->dops->wait(pl->dpp, r)); /* stage 0 is receiving them in this order */
            continue;
        }
        LOOM_TRY(pl->dops->recv_start(pl->dpp, hb, hn, LOOM_DTYPE_F32, pl->stages - 1, &r));
        LOOM_TRY(pl->dops->wait(pl->dpp, r));
        if (hooks && hooks->before_bwd)
            LOOM_TRY(hooks->before_bwd(hooks->ctx, mb, -1));
        buf_copy(pl, gw, half, hn);
        buf_add(pl, gw, hb, hn);
        if (hooks && hooks->after_bwd)
            LOOM_TRY(hooks->after_bwd(hooks->ctx, mb, -1));
    }
    return LOOM_OK;
}

static loom_status acquire(loom_pipeline *pl, int key, int *out)
{
    for (int i = 0; i < pl->n_slots; i++)
        if (!pl->slots[i].busy) {
            pl->slots[i].busy = 1;
            pl->slot_of[key] = i;
            *out = i;
            return LOOM_OK;
        }
    LOOM_FAIL(LOOM_ERR_INTERNAL, "pipeline: more than %d micro-batches in flight on stage %d",
              pl->n_slots, pl->stage);
}

static loom_status held(loom_pipeline *pl, const loom_sched_instr *in, int *out)
{
    int s = pl->slot_of[in->microbatch * pl->chunks + in->chunk];
    if (s < 0)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "pipeline: %s of micro-batch %d chunk %d on stage %d has no "
                  "activations", loom_sched_op_name(in->op), in->microbatch, in->chunk, pl->stage);
    *out = s;
    return LOOM_OK;
}

static loom_status post(loom_pipeline *pl, slot *s, loom_comm_request *r)
{
    if (s->n_req == MAX_PENDING)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "pipeline: more than %d sends pending on one slot", MAX_PENDING);
    s->req[s->n_req++] = r;
    return LOOM_OK;
}

/* A transfer of the list: started now (a receive waited at once, a send posted on slot sl
 * and waited before its buffer is reused), or with grouped transfers collected for flush. */
static loom_status xfer(loom_pipeline *pl, int send, void *buf, size_t count, int peer, slot *sl)
{
    if (pl->grouped) {
        if (pl->n_batch == MAX_GROUP)
            LOOM_FAIL(LOOM_ERR_INTERNAL, "pipeline: more than %d transfers in one run of stage "
                      "%d's list", MAX_GROUP, pl->stage);
        pl->batch[pl->n_batch++] = (loom_p2p){send, buf, count, LOOM_DTYPE_F32, peer};
        return LOOM_OK;
    }
    loom_comm_request *r = NULL;
    if (!send) {
        LOOM_TRY(pl->dops->recv_start(pl->dpp, buf, count, LOOM_DTYPE_F32, peer, &r));
        return pl->dops->wait(pl->dpp, r);
    }
    LOOM_TRY(pl->dops->send_start(pl->dpp, buf, count, LOOM_DTYPE_F32, peer, &r));
    return post(pl, sl, r);
}

/* Post the collected transfers as one group and wait for all of them. A transport without
 * p2p_group_start (LOOM_PP_GROUPED=1 on shm) gets them started one by one, then waited. */
static loom_status flush(loom_pipeline *pl)
{
    int n = pl->n_batch;
    pl->n_batch = 0;
    if (!n)
        return LOOM_OK;
    loom_p2p_group_fn group = loom_comm_p2p_group(pl->dops);
    loom_comm_request *r[MAX_GROUP];
    int started = 0;
    loom_status st = LOOM_OK;
    if (group) {
        st = group(pl->dpp, pl->batch, n, &r[0]);
        started = st == LOOM_OK;
    } else
        for (; st == LOOM_OK && started < n; started++) {
            const loom_p2p *it = &pl->batch[started];
            st = it->send ? pl->dops->send_start(pl->dpp, it->buf, it->count, it->dt, it->peer,
                                                 &r[started])
                          : pl->dops->recv_start(pl->dpp, it->buf, it->count, it->dt, it->peer,
                                                 &r[started]);
            if (st != LOOM_OK)
                break;
        }
    for (int i = 0; i < started; i++) { /* every started one waited, the first failure kept */
        loom_status w = pl->dops->wait(pl->dpp, r[i]);
        if (st == LOOM_OK)
            st = w;
    }
    return st;
}

/* Move what the transport can of every pending send, without blocking: a transport that
 * progresses only inside its calls (shm) would otherwise leave a send started before a
 * compute untouched until the next wait, and the next stage idle behind it. Called after
 * each SEND starts and before each compute. */
static void progress_sends(loom_pipeline *pl)
{
    if (!pl->dops->test)
        return;
    for (int i = 0; i < pl->n_slots; i++)
        for (int j = 0; j < pl->slots[i].n_req; j++)
            pl->dops->test(pl->dpp, pl->slots[i].req[j]);
}

/* Mark what key has done; free its slot when it needs the activations no more. */
static void mark(loom_pipeline *pl, int key, int what)
{
    pl->done[key] |= (unsigned char)what;
    if ((pl->done[key] & (DONE_WEIGHTS | DONE_SENT)) == (DONE_WEIGHTS | DONE_SENT)) {
        pl->slots[pl->slot_of[key]].busy = 0;
        pl->slot_of[key] = -1;
    }
}

/* ZeRO-3: after compute instruction i, hint the first units of the next one that reads
 * parameters (FWD, BWD, BWD_INPUT; W reads none), so that their gathers run while this
 * rank waits for its next message (gpt_stage.h; no hook installed: nothing). */
static loom_status prefetch_next(loom_pipeline *pl, loom_gpt *m, size_t i)
{
    for (size_t j = i + 1; j < pl->n; j++) {
        const loom_sched_instr *in = &pl->list[j];
        int vs = in->chunk * pl->stages + pl->stage;
        if (in->op == LOOM_SCHED_FWD || in->op == LOOM_SCHED_BWD || in->op == LOOM_SCHED_BWD_INPUT)
            return loom_gpt_stage_prefetch(m, pl->first[vs], pl->first[vs + 1],
                                           in->op != LOOM_SCHED_FWD);
    }
    return LOOM_OK;
}

static loom_status run_list(loom_pipeline *pl, loom_gpt *m, const int *tokens,
                            const int *targets, int B, int T, float dloss, double *loss,
                            const loom_pipeline_hooks *hooks, int *peak)
{
    float *hb = NULL, *gw = NULL, *half = NULL;
    size_t hn = 0;
    int P = pl->stages, V = P * pl->chunks, L = pl->layers;
    int next = (pl->stage + 1) % P, prev = (pl->stage + P - 1) % P;
    /* count: this rank's rows of the residual stream (a tp rank's shard under sequence
     * parallelism, sent to the same tp rank of the next stage: its pp group) */
    size_t R = (size_t)B * T;
    size_t count = loom_gpt_stage_rows(m, B, T) * (size_t)loom_gpt_get_config(m)->dim;
    for (int i = 0; i < pl->microbatches * pl->chunks; i++)
        pl->slot_of[i] = -1;
    memset(pl->done, 0, (size_t)pl->microbatches * pl->chunks);
    for (int mb = 0; mb < pl->microbatches; mb++)
        loss[mb] = 0.0;
    int inflight = 0;
    *peak = 0;
    double t_run = loom_now_ms();
    pl->compute_ms = pl->compute_cpu_ms = 0.0;
    loom_trace_phase_begin(pl->trace, t_run);
    for (size_t i = 0; i < pl->n; i++) {
        const loom_sched_instr *in = &pl->list[i];
        pl->at = i;
        if (loom_trace_is_compute(in->op)) { /* grouped: the run of transfers before it */
            LOOM_TRY(flush(pl));
            progress_sends(pl);
        }
        loom_trace_cost_begin(pl->trace); /* its CPU, faults and preemptions, traced */
        double t0 = loom_now_ms(); /* the instruction's span: a RECV's includes its wait */
        double c0 = loom_trace_is_compute(in->op) ? loom_cpu_ms() : 0.0;
        int key = in->microbatch * pl->chunks + in->chunk, vs = in->chunk * P + pl->stage, s = -1;
        int lo = pl->first[vs], hi = pl->first[vs + 1];
        /* canonical: the tied wte's head half goes from the last virtual stage (the LM head)
         * to virtual stage 0 (the embedding), one per micro-batch */
        int head_in = pl->tied_head && pl->canonical && vs == 0;
        int head_out = pl->tied_head && pl->canonical && vs == V - 1;
        int keep = (head_in || head_out) && pl->chunks > 1; /* halves exchanged after the list */
        size_t off = (size_t)in->microbatch * R;
        int last = hooks && hooks->final_bwd && pl->last_w[in->chunk] == i &&
                   (in->op == LOOM_SCHED_BWD || in->op == LOOM_SCHED_BWD_WEIGHT);
        if (last)
            LOOM_TRY(hooks->final_bwd(hooks->ctx, in->chunk, 1));
        switch (in->op) {
        case LOOM_SCHED_RECV_ACT:
            LOOM_TRY(acquire(pl, key, &s));
            loom_gpt_stage_select(m, s);
            LOOM_TRY(xfer(pl, 0, loom_gpt_stage_input(m), count, prev, NULL));
            break;
        case LOOM_SCHED_FWD:
            if (pl->slot_of[key] < 0)
                LOOM_TRY(acquire(pl, key, &s));
            LOOM_TRY(held(pl, in, &s));
            LOOM_TRY(wait_slot(pl, &pl->slots[s])); /* the previous holder's sends */
            loom_gpt_stage_select(m, s);
            loom_gpt_set_moe_micro(m, in->microbatch); /* the noisy router's key (gpt.h) */
            LOOM_TRY(loom_gpt_stage_forward(m, lo, hi, tokens + off, hi == L ? targets + off : NULL,
                                            B, T, dloss, &loss[in->microbatch]));
            if (++inflight > *peak)
                *peak = inflight;
            break;
        case LOOM_SCHED_SEND_ACT:
            LOOM_TRY(held(pl, in, &s));
            loom_gpt_stage_select(m, s);
            LOOM_TRY(xfer(pl, 1, loom_gpt_stage_output(m, hi), count, next, &pl->slots[s]));
            break;
        case LOOM_SCHED_RECV_GRAD:
            LOOM_TRY(held(pl, in, &s));
            loom_gpt_stage_select(m, s);
            if (head_in && pl->chunks == 1) { /* stage 0: the LM head's half first (sent at the
                                               * last stage's BWD or B) */
                LOOM_TRY(head_buffer(pl, m, s, &hb, &gw, &hn));
                LOOM_TRY(xfer(pl, 0, hb, hn, P - 1, NULL));
            }
            LOOM_TRY(xfer(pl, 0, loom_gpt_stage_grad(m), count, next, NULL));
            break;
        case LOOM_SCHED_BWD:
            LOOM_TRY(held(pl, in, &s));
            loom_gpt_stage_select(m, s);
            if (hooks && hooks->before_bwd)
                LOOM_TRY(hooks->before_bwd(hooks->ctx, in->microbatch, in->chunk));
            if (keep) { /* this micro-batch's half on its own, kept for tied_exchange */
                LOOM_TRY(head_buffer(pl, m, s, &hb, &gw, &hn));
                LOOM_TRY(tied_half(pl, hn, in->microbatch, &half));
                buf_zero(pl, gw, hn);
            }
            LOOM_TRY(loom_gpt_stage_backward(m, lo, hi));
            if (keep) {
                buf_copy(pl, half, gw, hn);
            } else if (head_in || head_out) {
                LOOM_TRY(head_buffer(pl, m, s, &hb, &gw, &hn));
                if (head_in) { /* emb + head: one rank's one add */
                    buf_add(pl, gw, hb, hn);
                } else {
                    buf_copy(pl, hb, gw, hn);
                    LOOM_TRY(xfer(pl, 1, hb, hn, 0, &pl->slots[s]));
                }
            }
            if (hooks && hooks->after_bwd)
                LOOM_TRY(hooks->after_bwd(hooks->ctx, in->microbatch, in->chunk));
            inflight--;
            mark(pl, key, DONE_WEIGHTS | (vs == 0 ? DONE_SENT : 0)); /* vs 0: nothing to send */
            break;
        case LOOM_SCHED_BWD_INPUT: /* B: the input gradient; the slot keeps what W needs */
            LOOM_TRY(held(pl, in, &s));
            loom_gpt_stage_select(m, s);
            if (head_out) /* this micro-batch's head half, computed in B */
                LOOM_TRY(head_buffer(pl, m, s, &hb, &gw, &hn));
            if (keep)
                LOOM_TRY(tied_half(pl, hn, in->microbatch, &hb));
            if (hooks && hooks->before_input)
                LOOM_TRY(hooks->before_input(hooks->ctx, in->microbatch, in->chunk));
            LOOM_TRY(loom_gpt_stage_backward_input(m, lo, hi, head_out ? hb : NULL));
            if (head_out && !keep) { /* sent in B's order, as stage 0 receives them */
                LOOM_TRY(xfer(pl, 1, hb, hn, 0, &pl->slots[s]));
            }
            mark(pl, key, DONE_SPLIT | (vs == 0 ? DONE_SENT : 0));
            break;
        case LOOM_SCHED_BWD_WEIGHT: /* W: the weight gradients, from what B kept */
            LOOM_TRY(held(pl, in, &s));
            loom_gpt_stage_select(m, s);
            if (hooks && hooks->before_bwd)
                LOOM_TRY(hooks->before_bwd(hooks->ctx, in->microbatch, in->chunk));
            if (head_in && keep) {
                LOOM_TRY(head_buffer(pl, m, s, &hb, &gw, &hn));
                buf_zero(pl, gw, hn);
            }
            LOOM_TRY(loom_gpt_stage_backward_weight(m, lo, hi, head_out));
            if (head_in && keep) {
                LOOM_TRY(tied_half(pl, hn, in->microbatch, &half));
                buf_copy(pl, half, gw, hn);
            } else if (head_in) { /* emb + head: one rank's one add */
                LOOM_TRY(head_buffer(pl, m, s, &hb, &gw, &hn));
                buf_add(pl, gw, hb, hn);
            }
            if (hooks && hooks->after_bwd)
                LOOM_TRY(hooks->after_bwd(hooks->ctx, in->microbatch, in->chunk));
            inflight--;
            mark(pl, key, DONE_WEIGHTS);
            break;
        case LOOM_SCHED_SEND_GRAD:
            LOOM_TRY(held(pl, in, &s));
            loom_gpt_stage_select(m, s);
            LOOM_TRY(xfer(pl, 1, pl->done[key] & DONE_SPLIT ? loom_gpt_stage_grad_out(m)
                          : loom_gpt_stage_grad(m), count, prev, &pl->slots[s]));
            mark(pl, key, DONE_SENT);
            break;
        default:
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "pipeline: %s is not executed by this engine",
                      loom_sched_op_name(in->op));
        }
        (void)V;
        if (last)
            LOOM_TRY(hooks->final_bwd(hooks->ctx, in->chunk, 0));
        if (in->op == LOOM_SCHED_FWD || in->op == LOOM_SCHED_BWD || in->op == LOOM_SCHED_BWD_INPUT)
            LOOM_TRY(prefetch_next(pl, m, i));
        if (in->op == LOOM_SCHED_SEND_ACT || in->op == LOOM_SCHED_SEND_GRAD)
            progress_sends(pl);
        double t1 = loom_now_ms();
        if (loom_trace_is_compute(in->op)) {
            pl->compute_ms += t1 - t0;
            pl->compute_cpu_ms += loom_cpu_ms() - c0;
        }
        loom_trace_span(pl->trace, loom_trace_kind_of(in->op), t0, t1, in->microbatch, in->chunk);
    }
    double t_wait = loom_now_ms();
    pl->at = pl->n;
    LOOM_TRY(flush(pl));
    for (int i = 0; i < pl->n_slots; i++)
        LOOM_TRY(wait_slot(pl, &pl->slots[i]));
    double t_tied = loom_now_ms();
    loom_trace_span(pl->trace, LOOM_TRACE_SEND_WAIT, t_wait, t_tied, -1, -1);
    if (pl->tied_head && pl->canonical && pl->chunks > 1 &&
        (pl->stage == 0 || pl->stage == P - 1)) {
        LOOM_TRY(tied_exchange(pl, m, hooks));
        loom_trace_span(pl->trace, LOOM_TRACE_TIED_SYNC, t_tied, loom_now_ms(), -1, -1);
    }
    double t_end = loom_now_ms();
    loom_trace_phase_end(pl->trace, t_end);
    pl->wall_ms = t_end - t_run;
    return LOOM_OK;
}

/* The step, and on a failure where in the list it happened: a transport's timeout names
 * the peer and the operation (and the flight recorder who is stuck), this the stage and
 * instruction. */
loom_status loom_pipeline_run(loom_pipeline *pl, loom_gpt *m, const int *tokens,
                              const int *targets, int B, int T, float dloss, double *loss,
                              const loom_pipeline_hooks *hooks, int *peak)
{
    pl->at = 0;
    loom_status st = run_list(pl, m, tokens, targets, B, T, dloss, loss, hooks, peak);
    if (st == LOOM_OK)
        return st;
    char why[2048];
    snprintf(why, sizeof why, "%s", loom_last_error());
    if (pl->at >= pl->n)
        return loom_fail(st, "pipeline stage %d, after its %zu instructions (the last sends and "
                         "tied halves): %s", pl->stage, pl->n, why);
    const loom_sched_instr *in = &pl->list[pl->at];
    return loom_fail(st, "pipeline stage %d, instruction %zu of %zu (%s micro-batch %d chunk %d): "
                     "%s", pl->stage, pl->at, pl->n, loom_sched_op_name(in->op), in->microbatch,
                     in->chunk, why);
}

loom_status loom_pipeline_tied_sync(loom_pipeline *pl, loom_gpt *m, double *comm_ms)
{
    if (!pl->tied_head || (pl->stage != 0 && pl->stage != pl->stages - 1))
        return LOOM_OK;
    const loom_param_entry *e = loom_params_find(loom_gpt_params(m), "wte");
    if (!e)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "pipeline: stage %d holds no wte", pl->stage);
    if (pl->tmp_n < e->numel) {
        buf_free(pl, pl->tmp);
        pl->tmp = buf_alloc(pl, e->numel);
        pl->tmp_n = pl->tmp ? e->numel : 0;
        if (!pl->tmp)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the tied wte gradient");
    }
    float *g = loom_gpt_grad_data(m) + e->offset;
    int peer = pl->stage == 0 ? pl->stages - 1 : 0;
    double t0 = loom_now_ms();
    if (pl->canonical) { /* stage 0 summed both halves per micro-batch: its copy is the one */
        loom_comm_request *q = NULL;
        if (pl->stage == 0)
            LOOM_TRY(pl->dops->send_start(pl->dpp, g, e->numel, LOOM_DTYPE_F32, peer, &q));
        else
            LOOM_TRY(pl->dops->recv_start(pl->dpp, g, e->numel, LOOM_DTYPE_F32, peer, &q));
        LOOM_TRY(pl->dops->wait(pl->dpp, q));
        *comm_ms += loom_now_ms() - t0;
        return LOOM_OK;
    }
    if (pl->grouped) { /* both ways at once: one group */
        LOOM_TRY(xfer(pl, 0, pl->tmp, e->numel, peer, NULL));
        LOOM_TRY(xfer(pl, 1, g, e->numel, peer, NULL));
        LOOM_TRY(flush(pl));
        *comm_ms += loom_now_ms() - t0;
        buf_add(pl, g, pl->tmp, e->numel);
        return LOOM_OK;
    }
    loom_comm_request *rr = NULL, *sr = NULL;
    LOOM_TRY(pl->dops->recv_start(pl->dpp, pl->tmp, e->numel, LOOM_DTYPE_F32, peer, &rr));
    LOOM_TRY(pl->dops->send_start(pl->dpp, g, e->numel, LOOM_DTYPE_F32, peer, &sr));
    loom_status st = pl->dops->wait(pl->dpp, rr), st2 = pl->dops->wait(pl->dpp, sr);
    LOOM_TRY(st);
    LOOM_TRY(st2);
    *comm_ms += loom_now_ms() - t0;
    /* a + b == b + a in IEEE arithmetic: both copies get the same bits */
    buf_add(pl, g, pl->tmp, e->numel);
    return LOOM_OK;
}

loom_status loom_pipeline_sum(loom_pipeline *pl, double *v, int n)
{
    double *all = malloc((size_t)pl->stages * (size_t)n * sizeof(double));
    if (!all)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    loom_comm_request *r = NULL;
    loom_status st = pl->ops->allgather_start(pl->pp, v, all, (size_t)n * sizeof(double),
                                              LOOM_DTYPE_U8, &r);
    if (st == LOOM_OK)
        st = pl->ops->wait(pl->pp, r);
    if (st == LOOM_OK)
        for (int j = 0; j < n; j++) {
            double x = 0.0;
            for (int s = 0; s < pl->stages; s++)
                x += all[(size_t)s * n + j];
            v[j] = x;
        }
    free(all);
    return st;
}

/* The gather and the sum of loom_pipeline_norm: this rank's slots `order` (n of them, chunk
 * by chunk) and mine = [n, nonfinite, each chunk's length] (head doubles); frees nothing. */
static loom_status norm_gather(loom_pipeline *pl, const double *order, size_t n, double *mine,
                               size_t head, double *norm_sq, int *nonfinite)
{
    int P = pl->stages, C = pl->chunks;
    double *sizes = malloc((size_t)P * head * sizeof(double));
    if (!sizes)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    loom_comm_request *r = NULL;
    loom_status st = pl->ops->allgather_start(pl->pp, mine, sizes, head * sizeof(double),
                                              LOOM_DTYPE_U8, &r);
    if (st == LOOM_OK)
        st = pl->ops->wait(pl->pp, r);
    size_t cap = 0;
    int bad = 0;
    for (int q = 0; st == LOOM_OK && q < P; q++) {
        if ((size_t)sizes[head * q] > cap)
            cap = (size_t)sizes[head * q];
        bad |= sizes[head * q + 1] != 0.0;
    }
    double *pad = NULL, *all = NULL;
    if (st == LOOM_OK) {
        pad = calloc(cap ? cap : 1, sizeof(double));
        all = malloc((size_t)P * (cap ? cap : 1) * sizeof(double));
        if (!pad || !all)
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
    }
    if (st == LOOM_OK) {
        memcpy(pad, order, n * sizeof(double));
        st = pl->ops->allgather_start(pl->pp, pad, all, cap * sizeof(double), LOOM_DTYPE_U8, &r);
        if (st == LOOM_OK)
            st = pl->ops->wait(pl->pp, r);
    }
    if (st == LOOM_OK) { /* one rank's order: the virtual stages' entries one after another */
        double sum = 0.0;
        for (int k = 0; k < P * C; k++) {
            int q = k % P, c = k / P;
            size_t from = 0;
            for (int d = 0; d < c; d++)
                from += (size_t)sizes[head * q + 2 + d];
            for (size_t j = 0; j < (size_t)sizes[head * q + 2 + c]; j++)
                sum += all[(size_t)q * cap + from + j];
        }
        *norm_sq = sum;
        *nonfinite = bad;
    }
    free(sizes);
    free(pad);
    free(all);
    return st;
}

loom_status loom_pipeline_norm(loom_pipeline *pl, const loom_param_table *t, const double *slots,
                               size_t n, double *norm_sq, int *nonfinite)
{
    int C = pl->chunks, E = t->count;
    size_t per = E ? n / (size_t)E : 0, head = 2 + (size_t)C;
    /* this rank's slots chunk by chunk (each chunk's entries in table order), and the
     * lengths: [n, nonfinite, length of chunk 0, 1, ...] */
    double *mine = calloc(head, sizeof(double));
    double *order = malloc((n ? n : 1) * sizeof(double));
    if (!mine || !order) {
        free(mine), free(order);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    }
    size_t at = 0;
    for (int c = 0; c < C; c++)
        for (int i = 0; i < E; i++)
            if (entry_chunk(pl, &t->entries[i]) == c) {
                memcpy(order + at, slots + (size_t)i * per, per * sizeof(double));
                at += per;
                mine[2 + c] += (double)per;
            }
    mine[0] = (double)n;
    mine[1] = *nonfinite ? 1.0 : 0.0;
    loom_status st = at == n ? LOOM_OK : loom_fail(LOOM_ERR_INTERNAL, "pipeline: %zu of %zu norm "
                                                   "slots belong to no chunk", n - at, n);
    if (st == LOOM_OK)
        st = norm_gather(pl, order, n, mine, head, norm_sq, nonfinite);
    free(mine);
    free(order);
    return st;
}

loom_status loom_pipeline_norm_order(loom_pipeline *pl, const double *order, size_t n,
                                     const size_t *chunk_slots, double *norm_sq, int *nonfinite)
{
    if (pl->chunks != 1 && !chunk_slots)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "pipeline: a norm in one rank's order with %d chunks a "
                  "stage needs each chunk's count", pl->chunks);
    size_t head = 2 + (size_t)pl->chunks;
    double *mine = calloc(head, sizeof(double));
    if (!mine)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    mine[0] = (double)n;
    mine[1] = *nonfinite ? 1.0 : 0.0;
    for (int c = 0; c < pl->chunks; c++)
        mine[2 + c] = (double)(chunk_slots ? chunk_slots[c] : n);
    loom_status st = norm_gather(pl, order, n, mine, head, norm_sq, nonfinite);
    free(mine);
    return st;
}

loom_status loom_pipeline_eval(loom_pipeline *pl, loom_gpt *m, const int *tokens,
                               const int *targets, int B, int T, double *loss_sum)
{
    const loom_comm_ops *ops = pl->dops; /* the model's rows */
    int P = pl->stages, V = P * pl->chunks, L = pl->layers;
    int next = (pl->stage + 1) % P, prev = (pl->stage + P - 1) % P;
    size_t count = loom_gpt_stage_rows(m, B, T) * (size_t)loom_gpt_get_config(m)->dim;
    double sum = 0.0;
    LOOM_TRY(wait_slot(pl, &pl->slots[0]));
    loom_gpt_stage_select(m, 0);
    for (int c = 0; c < pl->chunks; c++) {
        int vs = c * P + pl->stage, lo = pl->first[vs], hi = pl->first[vs + 1];
        loom_comm_request *r = NULL;
        if (vs > 0) {
            LOOM_TRY(ops->recv_start(pl->dpp, loom_gpt_stage_input(m), count, LOOM_DTYPE_F32, prev, &r));
            LOOM_TRY(ops->wait(pl->dpp, r));
        }
        LOOM_TRY(loom_gpt_stage_forward(m, lo, hi, tokens, hi == L ? targets : NULL, B, T, 0.0f,
                                        &sum));
        if (vs + 1 < V) {
            LOOM_TRY(ops->send_start(pl->dpp, loom_gpt_stage_output(m, hi), count, LOOM_DTYPE_F32,
                                     next, &r));
            LOOM_TRY(ops->wait(pl->dpp, r)); /* the next stage is receiving it now */
        }
    }
    *loss_sum = sum;
    return loom_pipeline_sum(pl, loss_sum, 1); /* only the last stage's is not 0 */
}

loom_status loom_pipeline_decode(loom_pipeline *pl, loom_gpt *m, int token, int t)
{
    const loom_comm_ops *ops = pl->dops; /* the model's rows */
    int P = pl->stages, V = P * pl->chunks;
    int next = (pl->stage + 1) % P, prev = (pl->stage + P - 1) % P;
    size_t C = (size_t)loom_gpt_get_config(m)->dim, at = (size_t)t * C;
    LOOM_TRY(wait_slot(pl, &pl->slots[0]));
    loom_gpt_stage_select(m, 0); /* where loom_pipeline_eval's forward left the rows */
    for (int c = 0; c < pl->chunks; c++) {
        int vs = c * P + pl->stage, lo = pl->first[vs], hi = pl->first[vs + 1];
        loom_comm_request *r = NULL;
        if (vs > 0) { /* one row of the residual stream: C floats */
            LOOM_TRY(ops->recv_start(pl->dpp, loom_gpt_stage_input(m) + at, C, LOOM_DTYPE_F32,
                                     prev, &r));
            LOOM_TRY(ops->wait(pl->dpp, r));
        }
        LOOM_TRY(loom_gpt_stage_decode(m, lo, hi, token, t));
        if (vs + 1 < V) {
            LOOM_TRY(ops->send_start(pl->dpp, loom_gpt_stage_output(m, hi) + at, C, LOOM_DTYPE_F32,
                                     next, &r));
            LOOM_TRY(ops->wait(pl->dpp, r)); /* the next stage is receiving it now */
        }
    }
    return LOOM_OK;
}
