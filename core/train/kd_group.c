/* kd_group.c — a teacher split by tp across groups of dp ranks (kd_group.h). */
#include "kd_group.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "base/config.h"
#include "base/plugin_loader.h"
#include "base/status.h"
#include "loom/plugin/comm.h"
#include "model/gpt_distill.h"

struct loom_kd_group {
    loom_host host;                    /* the core's, but group(LOOM_GROUP_TP) is comm */
    loom_plugin_config tp_cfg;
    const loom_strategy_ops *tp;       /* the teacher's tp strategy over comm */
    void *tp_self;
    const struct loom_comm_ops *ops;
    void *comm;                        /* this rank's teacher group, split from dp */
    int n, index, dp, dp_rank, B, T, accum;
    size_t bt, vp;
    const loom_backend *be;            /* a device backend (rows, blocks its memory), or NULL */
    int *tokens, *targets;             /* (accum x dp, B*T) the step's micro-batches */
    float *rows;                       /* (accum, B*T x vp) this rank's rows */
    float *blocks, *spare;             /* (B*T x vp) each: gather scratch, others' rows */
    /* teacher.layers (loom_kd_group_keep_terms): per student block l, the teacher block it
     * maps to (-1: none) and this rank's accum micro-batches' of its outputs (B*T x Ct) and,
     * with the attention term, all heads' probabilities (B,NH,T,T); gather scratch */
    int L, map[64], attention;
    size_t ct, att;
    float *h[64], *p[64], *pblocks, *pspare;
};

/* The tp strategy asks its host for LOOM_GROUP_TP once, in create. group() takes no
 * context, so the group being created names itself in this thread-local for that call. */
static _Thread_local const loom_kd_group *creating;

static loom_status teacher_group(loom_group which, const struct loom_comm_ops **ops, void **comm,
                                 int *size)
{
    if (which != LOOM_GROUP_TP || !creating)
        return loom_core_host()->group(which, ops, comm, size);
    *ops = creating->ops;
    *comm = creating->comm;
    *size = creating->n;
    return LOOM_OK;
}

/* The same for the groups of the backend's memory, which the tp strategy asks for (tp.c:
 * its buffers are the backend's). On the CPU backend that is the host group; without this
 * the strategy got the core's own tp group (one rank with mesh.tp = 1) and the teacher was
 * silently whole on every rank, with the bits of the split one in canonical mode. */
static loom_status teacher_device_group(loom_group which, const struct loom_comm_ops **ops,
                                        void **comm, int *size)
{
    if (which != LOOM_GROUP_TP || !creating)
        return loom_core_host()->device_group(which, ops, comm, size);
    return teacher_group(which, ops, comm, size);
}

/* The tp strategy plugin on this group (sequence parallelism off: the teacher's rows stay
 * whole outside its parallel regions). */
static loom_status make_strategy(loom_kd_group *g, int canonical)
{
    const loom_plugin *p;
    LOOM_TRY(loom_plugin_load(LOOM_KIND_STRATEGY, "tp", &p));
    LOOM_TRY(loom_config_init(&g->tp_cfg, p->desc));
    LOOM_TRY(loom_config_set_boolean(&g->tp_cfg, "canonical", canonical));
    LOOM_TRY(loom_config_finish(&g->tp_cfg));
    loom_config view = loom_config_view(&g->tp_cfg);
    g->host = *loom_core_host();
    g->host.group = teacher_group;
    g->host.device_group = teacher_device_group;
    const loom_strategy_ops *ops = p->desc->ops;
    creating = g;
    loom_status st = ops->create(&g->host, &view, &g->tp_self);
    creating = NULL;
    LOOM_TRY(st);
    g->tp = ops;
    return LOOM_OK;
}

/* The rows' memory: the backend's on a device (kd_rows reads them there), else the host's. */
static void *rows_alloc(const loom_kd_group *g, size_t bytes)
{
    return g->be ? g->be->ops->alloc(g->be->self, bytes) : malloc(bytes);
}

static void rows_free(const loom_kd_group *g, void *p)
{
    if (p && g->be)
        g->be->ops->free(g->be->self, p);
    else
        free(p);
}

static loom_status group_open(loom_kd_group *g, int canonical)
{
    size_t micro = (size_t)g->accum * g->dp * g->bt, rows = (size_t)g->accum * g->bt * g->vp;
    g->tokens = malloc(micro * sizeof(int));
    g->targets = malloc(micro * sizeof(int));
    g->rows = rows_alloc(g, rows * sizeof(float) + 1); /* + 1: vp = 0 allocates too */
    g->blocks = rows_alloc(g, 2 * g->bt * g->vp * sizeof(float) + 1);
    if (!g->tokens || !g->targets || !g->rows || !g->blocks)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the split teacher's rows (%zu MiB)",
                  (rows + 2 * g->bt * g->vp) * sizeof(float) >> 20);
    g->spare = g->blocks + g->bt * g->vp;
    /* collective over dp: color = the group, key = the place in it */
    LOOM_TRY(g->ops->split(g->comm, g->dp_rank / g->n, g->index, &g->comm));
    LOOM_TRY(make_strategy(g, canonical));
    if (!g->be) /* a device: the strategy's scratch and tree through the backend's ops */
        return LOOM_OK;
    if (g->tp->size <= offsetof(loom_strategy_ops, set_backend) || !g->tp->set_backend)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "the tp strategy has no set_backend: teacher.tp across "
                  "dp ranks cannot run in device memory");
    return g->tp->set_backend(g->tp_self, g->be->ops, g->be->self);
}

loom_status loom_kd_group_open(int n, int B, int T, int accum, size_t vp, int canonical,
                               const loom_backend *be, loom_kd_group **out)
{
    const struct loom_comm_ops *dops;
    void *dcomm;
    int dp = 1;
    *out = NULL;
    /* the group carries the teacher's rows: the dp group of the backend's memory (on the
     * CPU backend the host one) */
    LOOM_TRY(loom_core_host()->device_group(LOOM_GROUP_DP, &dops, &dcomm, &dp));
    if (n < 2 || !dops || dp % n != 0)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "teacher.tp = %d with mesh.dp = %d is not built: a teacher "
                  "split across dp ranks takes groups of teacher.tp of them, so teacher.tp must "
                  "divide mesh.dp (or equal mesh.tp, or be 1: replicated)", n, dp);
    loom_kd_group *g = calloc(1, sizeof *g);
    if (!g)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    g->n = n, g->dp = dp, g->ops = dops, g->comm = dcomm;
    g->be = be && loom_backend_device_memory(be) ? be : NULL;
    g->dp_rank = dops->rank(dcomm), g->index = g->dp_rank % n;
    g->B = B, g->T = T, g->accum = accum, g->bt = (size_t)B * T, g->vp = vp;
    loom_status st = group_open(g, canonical);
    if (g->comm == dcomm)
        g->comm = NULL; /* the split did not happen: not ours to destroy */
    if (st != LOOM_OK) {
        loom_kd_group_close(g);
        return st;
    }
    *out = g;
    return LOOM_OK;
}

size_t loom_kd_group_bytes(const loom_kd_group *g)
{
    size_t micro = (size_t)g->accum * g->dp * g->bt; /* tokens, targets, rows, blocks (group_open) */
    size_t b = 2 * micro * sizeof(int) + (size_t)g->accum * g->bt * g->vp * sizeof(float) + 1 +
               2 * g->bt * g->vp * sizeof(float) + 1;
    for (int l = 0; l < g->L; l++)
        if (g->map[l] >= 0) /* keep_terms: each mapped block's outputs (and probabilities) */
            b += (size_t)g->accum * g->bt * g->ct * sizeof(float) +
                 (g->attention ? (size_t)g->accum * g->att * sizeof(float) : 0);
    return b + (g->attention ? 2 * g->att * sizeof(float) : 0);
}

void loom_kd_group_close(loom_kd_group *g)
{
    if (!g)
        return;
    if (g->tp)
        g->tp->destroy(g->tp_self);
    if (g->comm)
        g->ops->destroy(g->comm);
    free(g->tokens);
    free(g->targets);
    rows_free(g, g->rows);
    rows_free(g, g->blocks);
    for (int l = 0; l < g->L; l++) {
        free(g->h[l]);
        free(g->p[l]);
    }
    free(g->pblocks);
    free(g);
}

const loom_strategy_ops *loom_kd_group_strategy(loom_kd_group *g, void **self)
{
    *self = g->tp_self;
    return g->tp;
}

loom_status loom_kd_group_keep_terms(loom_kd_group *g, int L, const int *map, size_t ct,
                                     int heads)
{
    if (L > 64)
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.layers: at most 64 student blocks");
    g->L = L, g->ct = ct, g->attention = heads > 0;
    g->att = heads > 0 ? g->bt * (size_t)heads * (size_t)g->T : 0; /* (B,NH,T,T) */
    for (int l = 0; l < L; l++) {
        if ((g->map[l] = map[l]) < 0)
            continue;
        g->h[l] = malloc((size_t)g->accum * g->bt * ct * sizeof(float));
        g->p[l] = heads > 0 ? malloc((size_t)g->accum * g->att * sizeof(float)) : NULL;
        if (!g->h[l] || (heads > 0 && !g->p[l]))
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the split teacher's block outputs");
    }
    if (heads > 0 && !(g->pblocks = malloc(2 * g->att * sizeof(float))))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the split teacher's probabilities");
    g->pspare = g->pblocks + g->att;
    return LOOM_OK;
}

/* After the teacher's forward on member j's micro-batch a: its block outputs (whole on
 * every member: the group's tp runs without sequence parallelism) kept by the owner, and
 * the probabilities gathered by every member, kept by the owner. */
static loom_status keep_terms(loom_kd_group *g, loom_gpt *teacher, int mine, int a)
{
    for (int l = 0; l < g->L; l++) {
        if (g->map[l] < 0)
            continue;
        if (mine)
            memcpy(g->h[l] + (size_t)a * g->bt * g->ct, loom_gpt_block_output(teacher, g->map[l]),
                   g->bt * g->ct * sizeof(float));
        if (g->attention)
            LOOM_TRY(loom_gpt_gather_block_attention(teacher, g->map[l], g->B, g->T, g->pblocks,
                                                     mine ? g->p[l] + (size_t)a * g->att
                                                          : g->pspare));
    }
    return LOOM_OK;
}

loom_status loom_kd_group_step(loom_kd_group *g, loom_gpt *teacher, loom_kd_forward_fn forward,
                               void *fctx, loom_batch_fn next, void *ctx)
{
    for (int i = 0; i < g->accum * g->dp; i++)
        LOOM_TRY(next(ctx, g->tokens + (size_t)i * g->bt, g->targets + (size_t)i * g->bt, g->B, g->T));
    int first = g->dp_rank - g->index; /* the group's first dp rank */
    for (int j = 0; j < g->n; j++)
        for (int a = 0; a < g->accum; a++) {
            const int *tok = g->tokens + (size_t)((first + j) * g->accum + a) * g->bt;
            if (forward)
                LOOM_TRY(forward(fctx, tok, g->B, g->T));
            else
                LOOM_TRY(loom_gpt_forward(teacher, tok, NULL, g->B, g->T, 0.0f, NULL));
            if (!g->vp)
                continue; /* a stage without the teacher's head: its part run, nothing kept */
            /* every member takes part in each gather; another member's rows are dropped */
            float *whole = j == g->index ? g->rows + (size_t)a * g->bt * g->vp : g->spare;
            LOOM_TRY(loom_gpt_gather_logits(teacher, g->bt, g->blocks, whole));
            LOOM_TRY(keep_terms(g, teacher, j == g->index, a));
        }
    return LOOM_OK;
}

const int *loom_kd_group_tokens(const loom_kd_group *g, int i) { return g->tokens + (size_t)i * g->bt; }
const int *loom_kd_group_targets(const loom_kd_group *g, int i) { return g->targets + (size_t)i * g->bt; }
const float *loom_kd_group_rows(const loom_kd_group *g, int a)
{
    return g->rows + (size_t)a * g->bt * g->vp;
}
const float *loom_kd_group_block_output(const loom_kd_group *g, int l, int a)
{
    return l < g->L && g->h[l] ? g->h[l] + (size_t)a * g->bt * g->ct : NULL;
}
const float *loom_kd_group_block_attention(const loom_kd_group *g, int l, int a)
{
    return l < g->L && g->p[l] ? g->p[l] + (size_t)a * g->att : NULL;
}
