/* session.c — the training step, evaluation and sampling for one rank (see session.h).
 *
 * Buffers: the CPU backend's memory is host memory, so the optimizer plugin updates the
 * parameter buffer in place (optim.h step). A device backend (CUDA) keeps parameters,
 * gradients, optimizer state and activations in its own memory: the plugin's step_backend
 * runs the update there, the norm and the finite check are backend ops, and what the host
 * must read or write (checkpoints, exports, hashes) goes through host mirrors filled and
 * written back by the backend's copies (loom_session_to_host / _from_host). With strategy
 * offload the state is the offload's (host pool or file) and the step runs on the host,
 * chunk by chunk through copies (offload_device.c). More than one rank there is data
 * parallelism (with or without ZeRO: zero_device.c), tensor and pipeline parallelism: the
 * gradient buckets and the model's messages go to the device groups
 * (loom_dist_device_open: nccl on the backend's stream, or the host communicator staged),
 * the losses and flags to the host groups; check_device refuses the rest with a message.
 */
#include "session.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin/comm.h"
#include "loom/plugin/optim.h"
#include "loom/plugin/precision.h"
#include "loom/plugin/strategy.h"
#include "compress.h"
#include "grad_norm.h"
#include "grad_sync.h"
#include "nonfinite.h"
#include "pipeline.h"
#include "offload.h"
#include "zero.h"
#include "trace.h"
#include "session_ep.h"
#include "base/plugin_loader.h"
#include "base/rng.h"
#include "base/status.h"
#include "base/clock.h"
#include "dist/dist.h"
#include "checkpoint.h"
#include "io/checksum.h"
#include "io/llmc_model.h"
#include "model/gpt_cost.h"
#include "model/gpt_distill.h"
#include "kd_cache.h"
#include "kd_group.h"
#include "model/gpt_stage.h"

struct loom_session {
    loom_session_config cfg;
    loom_plugin_config optim_cfg, precision_cfg, strategy_cfg, tensor_cfg; /* owned; cfg points
                                                                              * at them */
    const loom_strategy_ops *tensor; /* the tp strategy, NULL with tp = 1 */
    void *tensor_self;
    loom_grad_norm *norm;
    loom_nonfinite *nonfinite; /* the world's agreement on a non-finite step */
    loom_grad_sync *sync;
    loom_backend backend;
    loom_gpt *model;
    const loom_optim_ops *optim;
    void *optim_self;
    const loom_precision_ops *precision;
    void *precision_self;
    float *optim_state;
    uint32_t state_slots;
    loom_optim_segment *segments;
    int n_segments;
    int *tokens, *targets;   /* host staging for one micro-batch (all of a step's under pp) */
    loom_pipeline *pipe;     /* pp > 1, else NULL */
    loom_zero *zero;         /* strategy zero = 1, 2 or 3 with dp > 1, else NULL */
    int undrawn;             /* ZeRO-3's partitioned construction (partitioned_construction) */
    loom_offload *offload;   /* strategy offload: the state on the host or disk, else NULL */
    loom_compress *compress; /* strategy compress over dp, else NULL */
    loom_gpt *teacher;       /* distillation: the frozen teacher, else NULL */
    loom_kd_cache *kd_cache; /* distillation from loom distill-cache's file, else NULL */
    float *kd_step;          /* pp, last stage: the teacher's rows of the step's micro-batches */
    const loom_strategy_ops *teacher_tp; /* teacher.tp > 1: its own tp strategy over the */
    void *teacher_tp_self;               /* student's tp group, and its whole rows gathered */
    loom_plugin_config teacher_tp_cfg;   /* that strategy's config (the student's, or with
                                          * sequence parallelism off: teacher_layout) */
    float *kd_whole;                     /* (2 x B*T x teacher's Vp): scratch, then the rows */
    size_t kd_bytes;                     /* what the session allocated for distillation here:
                                          * kd_step, kd_whole, kd_dev_rows, kd_hstep, kd_astep */
    float *kd_dev_rows;                  /* a device backend: a cache's rows (B*T x vocab) there */
    loom_kd_group *kd_group;             /* teacher.tp across dp ranks (kd_group.h), else NULL */
    loom_pipeline *teacher_pipe;         /* teacher.pp = mesh.pp: its stages' pipeline, else NULL */
    int kd_map[64];          /* hidden-state terms: student block -> teacher block (-1: none) */
    const float *kd_h[64];   /* the teacher's block outputs they compare with, per student block */
    const float *kd_att[64]; /* and its attention probabilities (teacher.attention) */
    float *kd_hstep[64], *kd_astep[64]; /* pp, last stage: both over the step's micro-batches */
    int kd_hidden_on;
    float *host_logits;      /* sampling: one row of Vp */
    int64_t steps;
    int64_t step_no;         /* the training loop's number of the last step run */
    int master_weights;      /* the model reads a 16-bit compute copy of the fp32 parameters */
    loom_trace *trace;       /* log.trace: this rank's timeline, NULL: off */
    double limit_loss, limit_norm; /* the next step's update is skipped above these (a loss
                                    * spike, train.lua's detector); 0: no limit */
    loom_ep *ep;             /* mesh.ep > 1: the expert-parallel groups, else NULL */
    int device;              /* the backend's memory is not host memory (CUDA) */
    int device_groups;       /* this session holds dist's device groups (dist.h) */
    char description[512];   /* the backend's, with the device groups' */
    float *host_params;      /* device: host mirrors of the parameters and the optimizer */
    float *host_state;       /* state (loom_session_to_host), else NULL */
};

static loom_status make_plugin(const loom_plugin_config *pc, const void **ops, void **self)
{
    loom_config view = loom_config_view(pc);
    LOOM_TRY(loom_config_finish(pc));
    *ops = pc->desc->ops;
    /* Every ops table starts with size, then create(host, cfg, self). */
    const loom_optim_ops *generic = pc->desc->ops;
    return generic->create(loom_core_host(), &view, self);
}

static loom_status build_segments(loom_session *s)
{
    const loom_param_table *t = loom_gpt_params(s->model);
    float wd = 0.0f;
    int decay_all = 0;
    s->optim->decay_rule(s->optim_self, &wd, &decay_all);
    s->segments = calloc((size_t)t->count, sizeof *s->segments);
    if (!s->segments)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    float *params = loom_gpt_param_data(s->model), *grads = loom_gpt_grad_data(s->model);
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        loom_optim_segment *seg = &s->segments[i];
        seg->param = params + e->offset;
        seg->grad = grads + e->offset;
        seg->state = s->optim_state ? s->optim_state + (size_t)s->state_slots * e->offset : NULL;
        seg->n = e->numel;
        seg->weight_decay = (decay_all || e->is_matrix) ? wd : 0.0f;
    }
    s->n_segments = t->count;
    return LOOM_OK;
}

static loom_status canonical_parts(loom_session *s);

/* Offload (offload.h): the host pool or the file holds the state behind this rank's
 * segments (all of them, or its ZeRO partition); neither the session nor ZeRO allocated
 * it, so the segments' state pointers are NULL and the offsets say where each lies. */
static loom_status make_offload(loom_session *s, const loom_session_config *cfg)
{
    if (cfg->offload_mode == LOOM_OFFLOAD_NONE)
        return LOOM_OK;
    const loom_host *host = loom_core_host();
    const loom_comm_ops *comm = NULL;
    void *world = NULL;
    int size = 1;
    LOOM_TRY(host->group(LOOM_GROUP_WORLD, &comm, &world, &size));
    loom_offload_config oc = {(loom_offload_mode)cfg->offload_mode, cfg->offload_path,
                              cfg->offload_chunk_mb, comm ? comm->rank(world) : 0, NULL, 0,
                              NULL, NULL};
    if (s->device) { /* the parameters and gradients stay in its memory (offload_device.c) */
        oc.backend = s->backend.ops;
        oc.backend_self = s->backend.self;
    }
    if (s->zero) {
        size_t n, floats;
        const loom_optim_segment *segs = loom_zero_segments(s->zero, &n);
        loom_zero_state(s->zero, &floats);
        if (cfg->offload_params) { /* zero=3's parameter partition beside the state */
            oc.param_off = loom_zero_param_offsets(s->zero);
            oc.param_floats = loom_zero_part_floats(s->zero);
        }
        LOOM_TRY(loom_offload_create(&oc, segs, loom_zero_state_offsets(s->zero), n, floats,
                                     s->state_slots, &s->offload));
        return cfg->offload_params ? loom_zero_attach_params(s->zero, s->offload) : LOOM_OK;
    }
    const loom_param_table *t = loom_gpt_params(s->model);
    size_t *off = calloc((size_t)s->n_segments + 1, sizeof *off);
    if (!off)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->n_segments; i++)
        off[i] = (size_t)s->state_slots * t->entries[i].offset;
    loom_status st = loom_offload_create(&oc, s->segments, off, (size_t)s->n_segments,
                                         (size_t)s->state_slots * t->total, s->state_slots,
                                         &s->offload);
    free(off);
    return st;
}

/* ZeRO-3's partitioned construction (DeepSpeed's zero.Init): the model created undrawn,
 * each rank drawing only its partition (zero_params.c), so that no rank ever holds the
 * whole model; and the full-size gradient buffer left untouched until backward writes it
 * (*lazy_grads). Where ZeRO-3 runs on host memory over dp > 1 without ep (zero_ep.c and
 * the device path still take the partition from the whole model, drawn on every rank).
 * LOOM_ZERO_INIT=whole draws the whole model on every rank as before (the A/B: the same
 * bits; the gradient buffer stays untouched). */
static loom_status partitioned_construction(const loom_session *s, int *out, int *lazy_grads)
{
    *out = *lazy_grads = 0;
    const char *v = getenv("LOOM_ZERO_INIT");
    if (v && *v && strcmp(v, "whole") && strcmp(v, "partition"))
        LOOM_FAIL(LOOM_ERR_INVALID, "LOOM_ZERO_INIT is \"%s\": \"partition\" (the default: under "
                  "zero = 3 each rank draws only its partition) or \"whole\" (every rank draws "
                  "the whole model first)", v);
    const struct loom_comm_ops *ops;
    void *group;
    int dp = 1;
    if (s->cfg.zero_stage != 3 || s->device || s->cfg.ep > 1)
        return LOOM_OK;
    LOOM_TRY(loom_core_host()->group(LOOM_GROUP_DP, &ops, &group, &dp));
    *lazy_grads = dp >= 2;
    *out = dp >= 2 && !(v && !strcmp(v, "whole"));
    return LOOM_OK;
}

/* ZeRO over the dp group (zero.h); with one dp rank there is nothing to partition. */
static loom_status make_zero(loom_session *s)
{
    const loom_session_config *cfg = &s->cfg;
    if (cfg->zero_stage == 0 && !cfg->offload_params)
        return LOOM_OK;
    if (cfg->zero_stage < 0 || cfg->zero_stage > 3)
        LOOM_FAIL(LOOM_ERR_INVALID, "strategy zero=%d: the ZeRO stages are 0 (none), 1, 2 and 3",
                  cfg->zero_stage);
    const struct loom_comm_ops *ops;
    void *group;
    int dp = 1;
    LOOM_TRY(loom_core_host()->group(LOOM_GROUP_DP, &ops, &group, &dp));
    /* Under pp each stage's dp group partitions that stage's parameter table; stage 3's
     * units are the stage's (gpt_stage.h gathers them around each micro-batch's passes). */
    if (cfg->offload_params && (cfg->zero_stage != 3 || dp < 2 || !cfg->offload_mode))
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "strategy.offload.params = true offloads ZeRO stage 3's "
                  "parameter partition, so it needs strategy.zero = 3 over 2 or more dp ranks "
                  "and offload.optimizer = \"host\" or \"disk\" (here zero = %d, dp = %d, "
                  "optimizer %s)", cfg->zero_stage, dp,
                  loom_offload_mode_name((loom_offload_mode)cfg->offload_mode));
    if (dp < 2 || cfg->zero_stage == 0)
        return LOOM_OK;
    float wd = 0.0f;
    int decay_all = 0;
    s->optim->decay_rule(s->optim_self, &wd, &decay_all);
    loom_zero_config zc = {cfg->zero_stage, cfg->zero_bucket_mb > 0 ? cfg->zero_bucket_mb : 25.0,
                           cfg->canonical, cfg->accum, s->state_slots, wd, decay_all,
                           cfg->offload_mode != LOOM_OFFLOAD_NONE, s->ep, cfg->offload_params,
                           s->master_weights, s->undrawn, cfg->seed,
                           cfg->compress_method != LOOM_COMPRESS_NONE};
    LOOM_TRY(loom_zero_create(&zc, s->model, &s->backend, &s->zero));
    const loom_param_table *t = loom_gpt_params(s->model);
    int stage = s->pipe ? loom_pipeline_stage(s->pipe) : 0;
    for (int i = 0; s->pipe && loom_gpt_tied_head(s->model) && i < t->count; i++) /* the tied
                                                          * wte: first and last stage */
        if (!strcmp(t->entries[i].name, "wte"))
            loom_zero_tied(s->zero, i, stage == loom_pipeline_stages(s->pipe) - 1);
    /* under pp a backward's last buckets stay in flight past its end (zero.h);
     * LOOM_ZERO_PP_WAIT=each waits at every backward's end instead: the A/B */
    const char *wait = getenv("LOOM_ZERO_PP_WAIT");
    if (wait && *wait && strcmp(wait, "each") && strcmp(wait, "later"))
        LOOM_FAIL(LOOM_ERR_INVALID, "LOOM_ZERO_PP_WAIT is \"%s\": \"later\" (the default: a "
                  "backward's reduce-scatters waited for at the next backward or before the "
                  "step) or \"each\" (at every backward's end)", wait);
    loom_zero_pipelined(s->zero, s->pipe && !(wait && !strcmp(wait, "each")));
    return LOOM_OK;
}

/* What the model and the core can do with the precision plugin's dtypes (gpt.h:
 * loom_gpt_set_precision): weights and activations in f32, bf16 or f16, gradients always
 * accumulated and reduced in fp32; 16-bit weights need the fp32 master copy. */
static loom_status check_precision(loom_session *s, const loom_session_config *cfg,
                                   const loom_precision_dtypes *dt)
{
    const char *name = s->precision_cfg.desc->name;
    if (dt->grad != LOOM_DTYPE_F32 && dt->grad != LOOM_DTYPE_BF16)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "precision '%s' asks for %s gradients; loom accumulates "
                  "gradients in fp32 and reduces them in f32 or bf16", name,
                  loom_dtype_name(dt->grad));
    if (dt->grad == LOOM_DTYPE_BF16) { /* reduce = "bf16": the dp strategy's bucket all-reduce */
        if (cfg->canonical)
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "precision '%s' with reduce = \"bf16\" in canonical "
                      "mode is not built yet: canonical mode sums gradients in a fixed fp32 tree; "
                      "use reduce = \"f32\"", name);
        if (cfg->zero_stage >= 2)
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "precision '%s' with reduce = \"bf16\" and zero=%d is "
                      "not built yet: ZeRO's reduce-scatter sends fp32; use zero=1 or reduce = "
                      "\"f32\"", name, cfg->zero_stage);
        if (cfg->compress_method != LOOM_COMPRESS_NONE)
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "precision '%s' with reduce = \"bf16\" and "
                      "strategy.compress is not built yet (compression sends its own encoding); "
                      "leave one of them out", name);
        if (s->cfg.strategy && loom_config_index(&s->strategy_cfg, "reduce") >= 0)
            LOOM_TRY(loom_config_set_string(&s->strategy_cfg, "reduce", "bf16"));
    }
    if (dt->param != LOOM_DTYPE_F32 && !dt->master_weights)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "precision '%s' keeps %s weights without an fp32 master "
                  "copy; the optimizer updates fp32 parameters only (master_weights = 1)", name,
                  loom_dtype_name(dt->param));
    return LOOM_OK;
}

/* teacher.tp across dp ranks: the terms of this rank's accumulation micro-batch a read the
 * teacher's block outputs and probabilities the group kept for it (kd_group.h). */
static void distill_group_terms(loom_session *s, int a)
{
    for (int l = 0; s->kd_hidden_on && l < loom_gpt_get_config(s->model)->layers; l++) {
        if (s->kd_map[l] < 0)
            continue;
        s->kd_h[l] = loom_kd_group_block_output(s->kd_group, l, a);
        if (s->kd_att[l])
            s->kd_att[l] = loom_kd_group_block_attention(s->kd_group, l, a);
    }
}

/* teacher.layers under ZeRO 1 or 2 with 16-bit weights: each rank holds only its partition
 * of the fp32 master, and the hidden term reads the projections distill.proj.* whole in
 * fp32 from the model's buffer, as one rank reads its master (gpt_distill_hidden.c). So
 * ZeRO keeps the buckets covering them gathered there (a no-op without master16). */
static loom_status keep_projections(loom_session *s)
{
    const loom_param_table *t = loom_gpt_params(s->model);
    size_t lo = t->total, hi = 0;
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        if (strncmp(e->name, "distill.proj.", 13))
            continue;
        lo = e->offset < lo ? e->offset : lo;
        hi = e->offset + e->numel > hi ? e->offset + e->numel : hi;
    }
    return loom_zero_keep_master(s->zero, lo, hi);
}

/* teacher.layers (gpt_distill.h's hidden-state terms; teacher.attention on the same pairs):
 * one rank, dp, zero, pp or tp (also with sequence parallelism), the teacher replicated or
 * split by tp or pp (its block outputs whole where they are read), any precision; the
 * map copied, the teacher's block outputs (and probabilities) bound (its activation
 * buffers, rewritten by each teacher forward) and the student's checks run now rather than
 * at step 1. */
static loom_status distill_hidden_open(loom_session *s, const loom_session_config *cfg)
{
    const loom_gpt_config *tc = loom_gpt_get_config(s->teacher), *mc = loom_gpt_get_config(s->model);
    if (mc->layers > 64 || mc->kd_proj_dim != tc->dim)
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.layers: the student's projections are %d wide, the "
                  "teacher is dim=%d (at most 64 student blocks)", mc->kd_proj_dim, tc->dim);
    for (int l = 0; cfg->kd_attention > 0.0f && l < mc->layers; l++) /* teacher.attention:
        * the mapped teacher blocks keep their probabilities where the others' att is the
        * fused kernels' state (LOOM_CUDA_ATTENTION=flash); before any pointer into its
        * activations is taken (the layout may change) */
        if (cfg->kd_layers[l] >= 0 && cfg->kd_layers[l] < tc->layers)
            LOOM_TRY(loom_gpt_keep_block_attention(s->teacher, cfg->kd_layers[l]));
    for (int l = 0; l < mc->layers; l++) {
        int t = s->kd_map[l] = cfg->kd_layers[l];
        if (t >= tc->layers)
            LOOM_FAIL(LOOM_ERR_INVALID, "teacher.layers[%d] = %d: the teacher has blocks 0 .. %d",
                      l, t, tc->layers - 1);
        s->kd_h[l] = t >= 0 ? loom_gpt_block_output(s->teacher, t) : NULL;
        if (t >= 0 && !s->kd_h[l])
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "teacher.layers: the teacher's block %d output is not "
                      "held whole here (another stage's: with teacher.pp map teacher blocks of its "
                      "last stage; or split by sequence parallelism)", t);
        size_t rows = (size_t)cfg->accum * cfg->micro_batch * cfg->seq;
        if (t >= 0 && (s->pipe || s->device)) { /* the step's rows, which distill_pipeline
            * fills; a device backend: the micro-batch's, copied to the host (host_terms) */
            if (!(s->kd_hstep[l] = malloc(rows * (size_t)tc->dim * sizeof(float))))
                LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the teacher's hidden rows of a step");
            s->kd_bytes += rows * (size_t)tc->dim * sizeof(float);
            s->kd_h[l] = s->kd_hstep[l];
        }
    }
    if (s->zero) /* zero 1/2 with 16-bit weights: the projections' fp32 master kept whole */
        LOOM_TRY(keep_projections(s));
    s->kd_hidden_on = 1;
    int att = cfg->kd_attention > 0.0f; /* teacher.attention: the same pairs' probabilities */
    if (s->kd_group) { /* teacher.tp across dp ranks: the group keeps each member's rows */
        LOOM_TRY(loom_kd_group_keep_terms(s->kd_group, mc->layers, s->kd_map, (size_t)tc->dim,
                                          att ? tc->heads : 0));
        if (!s->pipe) /* under pp the step's buffers (kd_hstep) stay bound */
            distill_group_terms(s, 0);
    }
    LOOM_TRY(loom_gpt_set_distill_hidden(s->model, s->kd_h, cfg->kd_hidden));
    if (!att)
        return LOOM_OK;
    if (tc->heads != mc->heads)
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.attention: the student has %d heads, the teacher %d",
                  mc->heads, tc->heads);
    int held = s->teacher_tp ? tc->heads / cfg->kd_teacher_tp : tc->heads; /* this rank's */
    for (int l = 0; l < mc->layers; l++) {
        s->kd_att[l] = s->kd_map[l] >= 0 ? loom_gpt_block_attention(s->teacher, s->kd_map[l]) : NULL;
        if (s->kd_map[l] >= 0 && !s->kd_att[l])
            LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "teacher.attention: the teacher's block %d does not keep "
                      "all its heads' probabilities here (recomputed or split over tp)", s->kd_map[l]);
        size_t A = (size_t)cfg->accum * cfg->micro_batch * held * cfg->seq * cfg->seq;
        if (s->kd_group) /* all heads, gathered over the group */
            s->kd_att[l] = loom_kd_group_block_attention(s->kd_group, l, 0);
        if (s->kd_map[l] >= 0 && (s->pipe || s->device)) { /* each micro-batch's (B,NH,T,T)
            * of the step; a device backend: the micro-batch's, copied to the host */
            if (!(s->kd_astep[l] = malloc(A * sizeof(float))))
                LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the teacher's probabilities of a step");
            s->kd_bytes += A * sizeof(float);
            s->kd_att[l] = s->kd_astep[l];
        }
    }
    LOOM_TRY(loom_gpt_set_distill_attention(s->model, s->kd_att, cfg->kd_attention));
    /* the term pairs each rank's heads with the same heads: a whole teacher's slice */
    return loom_gpt_set_distill_attention_whole(s->model, s->tensor && !s->teacher_tp);
}

/* A device backend's session: a tp strategy's (the student's, or teacher.tp's) canonical tree and scratch go through the
 * backend's ops (strategy.h's set_backend), its exchanges over the device groups. */
static loom_status bind_tensor_backend(loom_session *s, const loom_strategy_ops *t, void *self,
                                       const loom_plugin_config *cfg)
{
    if (t->size <= offsetof(loom_strategy_ops, set_backend) || !t->set_backend)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "strategy '%s' has no set_backend (plugin/strategy.h), "
                  "so its tensor-parallel regions cannot run in the device memory of backend %s; "
                  "use the tp strategy, or backend = \"cpu\"", cfg->desc->name,
                  s->backend.ops->describe(s->backend.self));
    return t->set_backend(self, s->backend.ops, s->backend.self);
}

/* teacher.tp (docs/DISTILL.md): the teacher split by tensor parallelism. Over the
 * student's tp group (teacher.tp = mesh.tp) by a second instance of its tp strategy: the
 * group's ranks run the same micro-batches, so the teacher's exchanges line up. With
 * mesh.tp = 1 over groups of teacher.tp dp ranks (kd_group.h), whose micro-batches
 * differ, so the step runs the teacher on all of them first. Its vocabulary-parallel rows
 * are gathered whole for the term either way. */
static loom_status teacher_layout(loom_session *s, const loom_session_config *cfg,
                                  loom_gpt_parallel *par)
{
    int n = cfg->kd_teacher_tp;
    if (n <= 1)
        return LOOM_OK; /* replicated */
    const struct loom_comm_ops *ops;
    void *group;
    int tp = 1;
    LOOM_TRY(loom_core_host()->group(LOOM_GROUP_TP, &ops, &group, &tp));
    if (tp > 1 && n != tp)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "teacher.tp = %d with mesh.tp = %d is not built yet: with "
                  "mesh.tp > 1 the teacher is split over the student's tp group (teacher.tp = "
                  "mesh.tp) or replicated (teacher.tp = 1)", n, tp);
    size_t rows = (size_t)cfg->micro_batch * cfg->seq, vp = (size_t)cfg->teacher->vocab_padded;
    if (tp == 1) { /* across dp ranks */
        /* teacher.pp: a group on every stage's dp ranks, the rows on the last stage's only */
        int head = !s->pipe || loom_pipeline_stage(s->pipe) == loom_pipeline_stages(s->pipe) - 1;
        LOOM_TRY(loom_kd_group_open(n, cfg->micro_batch, cfg->seq, cfg->accum, head ? vp : 0,
                                    cfg->canonical, &s->backend, &s->kd_group));
        par->tp_ops = loom_kd_group_strategy(s->kd_group, &par->tp_self);
        return LOOM_OK;
    }
    /* teacher.layers reads its block outputs whole: its rows are not split by sequence */
    loom_config_copy(&s->teacher_tp_cfg, &s->tensor_cfg);
    if (cfg->kd_layers && loom_config_index(&s->teacher_tp_cfg, "sequence_parallel") >= 0)
        LOOM_TRY(loom_config_set_boolean(&s->teacher_tp_cfg, "sequence_parallel", 0));
    LOOM_TRY(make_plugin(&s->teacher_tp_cfg, (const void **)&s->teacher_tp, &s->teacher_tp_self));
    par->tp_ops = s->teacher_tp;
    par->tp_self = s->teacher_tp_self;
    if (s->device) /* its exchanges over the device tp group, its rows gathered there */
        LOOM_TRY(bind_tensor_backend(s, s->teacher_tp, s->teacher_tp_self, &s->teacher_tp_cfg));
    s->kd_whole = s->device ? s->backend.ops->alloc(s->backend.self, 2 * rows * vp * sizeof(float))
                            : malloc(2 * rows * vp * sizeof(float));
    if (!s->kd_whole)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the split teacher's whole rows (%zu MiB)",
                  2 * rows * vp * sizeof(float) >> 20);
    s->kd_bytes += 2 * rows * vp * sizeof(float);
    return LOOM_OK;
}

/* teacher.pp = mesh.pp (docs/DISTILL.md): the teacher's blocks split over the student's
 * pipeline stages by a pipeline of its own on the same pp group (its blocks as even as its
 * depth allows, one micro-batch in flight). Before a step every stage runs its stage of
 * the teacher's forward over this dp rank's micro-batches (loom_pipeline_eval, as eval
 * does; with teacher.tp across dp ranks over its group's, kd_group.h), the last stage keeping the logits (distill_pipeline) and, with teacher.layers,
 * the outputs and probabilities of the teacher blocks it holds (others are refused); the
 * other stages' teacher parts are their blocks and activations only. */
static loom_status teacher_stages(loom_session *s, const loom_session_config *cfg,
                                  loom_gpt_parallel *par)
{
    int n = cfg->kd_teacher_pp, pp = s->pipe ? loom_pipeline_stages(s->pipe) : 1;
    if (n <= 1)
        return LOOM_OK; /* whole, on the last stage */
    if (n != pp)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "teacher.pp = %d with mesh.pp = %d is not built: the "
                  "teacher is split over the student's pipeline stages (teacher.pp = mesh.pp) or "
                  "held whole on its last stage (teacher.pp = 1)", n, pp);
    if (cfg->teacher->layers < n)
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.pp = %d: the teacher has %d blocks, fewer than "
                  "the stages", n, cfg->teacher->layers);
    const loom_plugin *gp;
    LOOM_TRY(loom_plugin_load(LOOM_KIND_SCHED, "gpipe", &gp)); /* its lists go unused */
    loom_pipeline_config pc = {gp->desc, 1, 1, cfg->teacher->layers, NULL, 0, cfg->canonical,
                               NULL, "teacher"};
    pc.untied = cfg->teacher->family == LOOM_FAMILY_LLAMA && !cfg->teacher->tie_embeddings;
    pc.backend = &s->backend; /* the model's memory, as the student's pipeline is told */
    LOOM_TRY(loom_pipeline_create(&pc, &s->teacher_pipe));
    par->stage_layers = loom_pipeline_stage_layers(s->teacher_pipe);
    par->slots = loom_pipeline_slots(s->teacher_pipe);
    return LOOM_OK;
}

/* The teacher's logits of its last forward as whole rows (R of them): its own buffer when
 * it is replicated, gathered over its tp group when split. */
static loom_status teacher_rows(loom_session *s, size_t R, const float **rows)
{
    if (!s->teacher_tp) {
        *rows = loom_gpt_logits(s->teacher);
        return LOOM_OK;
    }
    size_t vp = (size_t)loom_gpt_get_config(s->teacher)->vocab_padded;
    float *blocks = s->kd_whole, *whole = s->kd_whole + R * vp;
    *rows = whole;
    return loom_gpt_gather_logits(s->teacher, R, blocks, whole);
}

/* Distillation (gpt_distill.h): the teacher, replicated on every rank or split by tp
 * (teacher.tp: over the student's tp group or groups of dp ranks; under pp on the last
 * stage only, where the student's logits are), weights loaded. A student with tp > 1
 * distils from whole rows (gpt_distill.h). */
static loom_status make_teacher(loom_session *s, const loom_session_config *cfg)
{
    const loom_gpt_config *tc = cfg->teacher, *mc = loom_gpt_get_config(s->model);
    if (cfg->kd_cache && cfg->kd_teacher_tp > 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.tp = %d with teacher.cache: a cache runs no teacher "
                  "to split; leave teacher.tp out", cfg->kd_teacher_tp);
    if (cfg->kd_cache && cfg->kd_teacher_pp > 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.pp = %d with teacher.cache: a cache runs no teacher "
                  "to split; leave teacher.pp out", cfg->kd_teacher_pp);
    int last = !s->pipe || loom_pipeline_stage(s->pipe) == loom_pipeline_stages(s->pipe) - 1;
    if (!last && cfg->kd_teacher_pp <= 1)
        return LOOM_OK; /* no logits on this stage, and no part of the teacher */
    if (s->pipe && last) { /* the teacher's rows of all of a step's micro-batches (distill_pipeline) */
        size_t rows = (size_t)cfg->accum * cfg->micro_batch * cfg->seq;
        size_t stride = cfg->kd_cache ? (size_t)mc->vocab : (size_t)tc->vocab_padded;
        s->kd_step = s->device ? s->backend.ops->alloc(s->backend.self, rows * stride * sizeof(float))
                               : malloc(rows * stride * sizeof(float)); /* kd_rows reads it there */
        if (!s->kd_step)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the teacher's rows of a step (%zu MiB)",
                      rows * stride * sizeof(float) >> 20);
        s->kd_bytes += rows * stride * sizeof(float);
    }
    if (cfg->kd_cache && s->device && !(s->kd_dev_rows = s->backend.ops->alloc(s->backend.self,
            (size_t)cfg->micro_batch * cfg->seq * (size_t)mc->vocab * sizeof(float))))
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory on the device for a cache's teacher rows");
    if (s->kd_dev_rows)
        s->kd_bytes += (size_t)cfg->micro_batch * cfg->seq * (size_t)mc->vocab * sizeof(float);
    if (cfg->kd_cache) /* teacher = { cache = FILE }: its logits written before (kd_cache.h) */
        return loom_kd_cache_open(cfg->kd_cache, mc->vocab, cfg->micro_batch, cfg->seq,
                                  &s->kd_cache);
    if (tc->vocab != mc->vocab)
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher vocab=%d differs from the student's vocab=%d: "
                  "distillation compares their next-token distributions", tc->vocab, mc->vocab);
    if (tc->ctx < cfg->seq)
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher ctx=%d is shorter than batch.seq=%d", tc->ctx, cfg->seq);
    if (!cfg->teacher_init == !cfg->teacher_checkpoint)
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher needs its weights from one place: model = "
                  "loom.gpt{ init = \"teacher.bin\" } or checkpoint = \"DIR\"");
    loom_gpt_parallel par = {NULL, NULL, cfg->canonical, NULL, 0, 0, 0, NULL};
    /* frozen (gpt.h): no gradient buffer, forward-only activations; what outlives its
     * forward is the logits and, where the terms run, the mapped blocks' outputs (and with
     * teacher.attention their probabilities: distill_hidden_open) */
    unsigned char *keep = calloc((size_t)tc->layers, 1);
    if (!keep)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    par.frozen = 1;
    /* every caller runs it over the run's sequences (the step's, distill_pipeline's,
     * kd_group's, distill-cache's: batch.seq), never a longer one (gpt.h max_T) */
    par.max_T = cfg->seq;
    for (int l = 0; cfg->kd_layers && last && l < mc->layers; l++)
        if (cfg->kd_layers[l] >= 0 && cfg->kd_layers[l] < tc->layers)
            keep[cfg->kd_layers[l]] = 1;
    par.keep_outputs = keep;
    loom_status st = teacher_layout(s, cfg, &par);
    if (st == LOOM_OK)
        st = teacher_stages(s, cfg, &par);
    if (st == LOOM_OK)
        st = loom_gpt_create(tc, &s->backend, cfg->micro_batch, cfg->seed, &par, &s->teacher);
    free(keep);
    LOOM_TRY(st);
    if (cfg->kd_layers && last) /* the terms run where the student's head is */
        LOOM_TRY(distill_hidden_open(s, cfg));
    if (cfg->teacher_init)
        return loom_llmc_load(s->teacher, cfg->teacher_init);
    return loom_ckpt_load_model_params(cfg->teacher_checkpoint, s->teacher); /* teacher.pp: its stage's */
}

/* pp, last stage: micro-batch a's teacher block outputs and probabilities (teacher.layers,
 * teacher.attention) into the step's buffers the student's forwards read: the teacher's
 * own, or (teacher.tp across dp ranks) those the group kept for this rank. A device backend
 * (a = 0): the micro-batch's copied to the host, where the terms run (gpt_distill.h); the
 * group is host memory (teacher.tp is refused on a device). */
static void distill_pipeline_terms(loom_session *s, int a)
{
    const loom_gpt_config *tc = loom_gpt_get_config(s->teacher);
    int held = s->teacher_tp ? tc->heads / s->cfg.kd_teacher_tp : tc->heads; /* tp: some heads */
    size_t bt = (size_t)s->cfg.micro_batch * s->cfg.seq, A = bt * (size_t)held * s->cfg.seq;
    for (int l = 0; s->kd_hidden_on && l < loom_gpt_get_config(s->model)->layers; l++) {
        int t = s->kd_map[l];
        const loom_backend_ops *k = s->backend.ops; /* a device's memory: copies; else memcpy */
        if (t >= 0 && s->kd_hstep[l])
        {
            if (s->kd_group)
                memcpy(s->kd_hstep[l] + (size_t)a * bt * tc->dim,
                       loom_kd_group_block_output(s->kd_group, l, a), bt * (size_t)tc->dim * sizeof(float));
            else
                k->copy_to_host(s->backend.self, s->kd_hstep[l] + (size_t)a * bt * tc->dim,
                                loom_gpt_block_output(s->teacher, t), bt * (size_t)tc->dim * sizeof(float));
        }
        if (t >= 0 && s->kd_astep[l]) {
            if (s->kd_group)
                memcpy(s->kd_astep[l] + (size_t)a * A, loom_kd_group_block_attention(s->kd_group, l, a),
                       A * sizeof(float));
            else
                k->copy_to_host(s->backend.self, s->kd_astep[l] + (size_t)a * A,
                                loom_gpt_block_attention(s->teacher, t), A * sizeof(float));
        }
    }
}

/* teacher.pp with teacher.tp across dp ranks: the group's forward of one micro-batch is
 * this stage's part of the teacher's pipeline (kd_group.h). */
static loom_status teacher_pipe_forward(void *ctx, const int *tokens, int B, int T)
{
    loom_session *s = ctx;
    double none;
    return loom_pipeline_eval(s->teacher_pipe, s->teacher, tokens, NULL, B, T, &none);
}

/* pp, last stage: the teacher's rows of this dp rank's accum micro-batches of the step (a
 * teacher forward each, the rows a teacher split across dp ranks kept for it, or the
 * cache's records), which its forwards then distil from. */
static loom_status distill_pipeline(loom_session *s, int accum, int dp_rank)
{
    int B = s->cfg.micro_batch, T = s->cfg.seq, V = loom_gpt_get_config(s->model)->vocab;
    size_t bt = (size_t)B * T;
    size_t stride = s->teacher ? (size_t)loom_gpt_get_config(s->teacher)->vocab_padded : (size_t)V;
    for (int a = 0; a < accum; a++) {
        const float *rows;
        if (s->kd_group) { /* run before, on the group's micro-batches (kd_group.h) */
            if (!s->kd_step)
                continue; /* teacher.pp: a stage before the last ran its part there */
            rows = loom_kd_group_rows(s->kd_group, a);
            distill_pipeline_terms(s, a);
        } else if (s->teacher_pipe) { /* every stage its part of the teacher; the logits on the last */
            double none;
            LOOM_TRY(loom_pipeline_eval(s->teacher_pipe, s->teacher, s->tokens + (size_t)a * bt,
                                        NULL, B, T, &none));
            if (!s->kd_step)
                continue;
            LOOM_TRY(teacher_rows(s, bt, &rows));
            distill_pipeline_terms(s, a); /* teacher.layers: blocks on its last stage */
        } else if (s->teacher) {
            LOOM_TRY(loom_gpt_forward(s->teacher, s->tokens + (size_t)a * bt, NULL, B, T, 0.0f, NULL));
            LOOM_TRY(teacher_rows(s, bt, &rows));
            distill_pipeline_terms(s, a);
        } else {
            int64_t g = (s->step_no - 1) * accum * loom_grad_sync_dp_size(s->sync) +
                        (int64_t)dp_rank * accum + a;
            LOOM_TRY(loom_kd_cache_rows(s->kd_cache, g, s->tokens + (size_t)a * bt, &rows));
        }
        float *at = s->kd_step + (size_t)a * bt * stride; /* a device's memory there */
        if (s->device && !s->teacher) /* a cache's rows: host memory */
            s->backend.ops->copy_to_device(s->backend.self, at, rows, bt * stride * sizeof(float));
        else
            loom_backend_copy_bits(&s->backend, at, rows, bt * stride);
    }
    if (!s->kd_step)
        return LOOM_OK; /* a stage before the last: the student's head is not here */
    return loom_gpt_set_distill_step(s->model, s->targets, (size_t)accum * bt, s->kd_step, stride,
                                     s->cfg.kd_temperature, s->cfg.kd_alpha);
}

/* Gradient compression over the dp group (compress.h): fast mode, dp >= 2; canonical
 * mode per micro-batch (a leaf each), one rank or dp (any zero: canonical ZeRO sums the
 * whole gradient in the tree, then takes its partition), with tp (each rank its canonical
 * chunks) and pp (each stage its tensors; interleaved: each chunk's buckets as its backward
 * ends, grad_sync's parts); ep in fast mode (the dense entries over dp, the experts over
 * their edp group: loom_compress_add_experts), not in canonical mode. */
static loom_status make_compress(loom_session *s)
{
    const loom_session_config *cfg = &s->cfg;
    const char *name = loom_compress_method_name(cfg->compress_method);
    if (cfg->canonical && cfg->ep > 1)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "strategy.compress = \"%s\" with deterministic = "
                  "\"canonical\" and mesh.ep > 1 is not built yet (the experts' gradients are "
                  "summed per source rank over the expert-data-parallel group, session_ep.h, and "
                  "their leaves would have to be packed on the expert's owner per global "
                  "micro-batch); use ep = 1, or fast mode", name);
    if (s->ep && cfg->compress_momentum)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "strategy.compress momentum = true (1-bit Adam) with mesh.ep "
                  "> 1 is not built yet (each expert's momentum share would be over the "
                  "expert-data-parallel group, not dp); use ep = 1, or compress without momentum");
    if (s->ep && s->zero && loom_zero_reduces(s->zero))
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "strategy.compress = \"%s\" with zero=%d and mesh.ep > 1 is "
                  "not built yet (ZeRO-%d's partitions under ep are reduce-scattered per group, "
                  "zero_ep.c, and would have to be taken out of the compressed whole); use zero = 1 "
                  "with ep and compression, or ep = 1", name, cfg->zero_stage, cfg->zero_stage);
    if (s->pipe && s->zero && loom_zero_reduces(s->zero))
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "strategy.compress with zero=%d and pp=%d is not built yet "
                  "(the pipeline's per-micro-batch reduce-scatters would have to give way); use "
                  "zero=1 with pp, or compress with pp = 1", cfg->zero_stage,
                  loom_pipeline_stages(s->pipe));
    /* a device backend: host-staged (grad_sync.c: exchange_staged, compress_input), fast
     * mode's one exchange of each rank's gradient over dp (beside tp: its shards; beside pp:
     * its stage's tensors), canonical mode's leaves (packed from a host copy, decoded on the
     * host, summed in the backend's tree; powersgd's factors summed in the backend's trees
     * through device copies, compress_powersgd_leaves.c), every method */
    const struct loom_comm_ops *ops;
    void *group;
    int dp = 1;
    LOOM_TRY(loom_core_host()->group(LOOM_GROUP_DP, &ops, &group, &dp));
    loom_compress_config cc = {cfg->compress_method, cfg->compress_ratio, cfg->compress_warmup,
                               cfg->compress_bucket_mb, cfg->compress_rank, 0.0,
                               cfg->canonical ? cfg->accum : 0, 0, 0};
    /* canonical pp: the last stage's copy of the tied wte is replaced by stage 0's (which
     * summed both halves per micro-batch, pipeline.c) after the exchange: not sent */
    int P = s->pipe ? loom_pipeline_stages(s->pipe) : 1;
    cc.skip_tied = cfg->canonical && P > 1 && loom_pipeline_stage(s->pipe) == P - 1 &&
                   loom_params_find(loom_gpt_params(s->model), "wte") != NULL;
    if (cfg->compress_momentum) /* 1-bit Adam: adamw's beta1 (loom_compress_momentum_prepare) */
        cc.momentum = loom_config_get(&s->optim_cfg, "betas")->numbers[0];
    LOOM_TRY(loom_compress_create(&cc, s->model, ops, group, dp, &s->compress));
    if (s->ep) { /* the dense entries over dp (above), the experts over their edp group */
        const struct loom_comm_ops *eops;
        void *edp;
        int edp_size;
        loom_ep_edp_group(s->ep, &eops, &edp, &edp_size);
        LOOM_TRY(loom_compress_add_experts(s->compress, s->model, eops, edp, edp_size));
    }
    if (!cfg->compress_momentum)
        return LOOM_OK;
    return loom_compress_set_momentum(s->compress, s->segments, s->n_segments,
                                      loom_gpt_grad_data(s->model), &s->backend);
}

/* A teacher in device memory (docs/DISTILL.md): the teacher (either family, MoE blocks
 * too) replicated, forward only, on the same backend; the logit term on the backend's
 * kd_rows op, the intermediate terms on the host over copies; one rank, mesh.dp, mesh.tp
 * (the logit term: gpt_distill_tp_device.c; the intermediate terms' gathers over the device
 * tp group), mesh.ep or mesh.pp (ZeRO, offload; a cache too). What still reads the model's buffers as host memory is named; NULL: none. */
static const char *device_teacher_refusal(const loom_session_config *cfg)
{
    if (!cfg->teacher && !cfg->kd_cache)
        return NULL;
    return cfg->kd_teacher_tp > 1 && !cfg->tensor && cfg->kd_layers
               ? "teacher.layers with teacher.tp across dp ranks (kd_group.c keeps the split "
                 "teacher's block outputs and probabilities in host memory; the logit term "
                 "alone trains there)"
         : NULL;
}

/* A device backend (its memory is not the host's): what trains there today is one rank,
 * dp (with or without ZeRO), tp and pp (their messages over the device groups), ep beside
 * any of them (session_ep.c's device groups; zero_ep*.c's partitions there), with the
 * optimizer's step_backend; the paths that still read the model's buffers as host memory
 * are refused by name. */
static loom_status check_device(loom_session *s, const loom_session_config *cfg, int pp)
{
    const char *be = s->backend.ops->describe(s->backend.self);
    const struct loom_comm_ops *wops;
    void *world;
    int size = 1;
    LOOM_TRY(loom_core_host()->group(LOOM_GROUP_WORLD, &wops, &world, &size));
    /* what still reads or writes host memory where the buffers are the device's */
    const char *what = device_teacher_refusal(cfg);
    if (what)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "backend %s: training in device memory with %s is not "
                  "built yet; it trains one rank, mesh.dp, mesh.tp and mesh.pp ranks, ZeRO or "
                  "offload, mesh.ep beside them, a teacher (not split by teacher.tp or "
                  "teacher.pp) with any of these (docs/DISTILL.md), or use backend = \"cpu\"", be, what);
    if (size > 1 && !s->device_groups)
        LOOM_FAIL(LOOM_ERR_INTERNAL, "backend %s with %d ranks has no device groups "
                  "(loom_dist_device_open)", be, size);
    const loom_optim_ops *o = s->optim;
    if (o->size <= offsetof(loom_optim_ops, step_backend) || !o->step_backend)
        LOOM_FAIL(LOOM_ERR_UNSUPPORTED, "optim '%s' has no step_backend (plugin/optim.h), so it "
                  "cannot update parameters in the device memory of backend %s; use adamw or "
                  "sgd, or backend = \"cpu\"", s->optim_cfg.desc->name, be);
    return LOOM_OK;
}

loom_status loom_session_create(const loom_session_config *cfg, loom_session **out)
{
    *out = NULL;
    if (cfg->micro_batch < 1 || cfg->seq < 1 || cfg->accum < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "batch micro=%d seq=%d accum=%d must all be positive",
                  cfg->micro_batch, cfg->seq, cfg->accum);
    if (cfg->seq > cfg->model.ctx)
        LOOM_FAIL(LOOM_ERR_INVALID, "batch seq=%d is longer than the model's ctx=%d", cfg->seq,
                  cfg->model.ctx);
    if (cfg->optim->desc->kind != LOOM_KIND_OPTIM || cfg->precision->desc->kind != LOOM_KIND_PRECISION)
        LOOM_FAIL(LOOM_ERR_INVALID, "session needs an optim and a precision plugin");
    loom_session *s = calloc(1, sizeof *s);
    if (!s)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    s->cfg = *cfg;
    loom_config_copy(&s->optim_cfg, cfg->optim);
    loom_config_copy(&s->precision_cfg, cfg->precision);
    s->cfg.optim = &s->optim_cfg;
    s->cfg.precision = &s->precision_cfg;
    if (cfg->strategy) {
        loom_config_copy(&s->strategy_cfg, cfg->strategy);
        s->cfg.strategy = &s->strategy_cfg;
    }
    s->cfg.backend = NULL; /* the caller's string; only needed while opening */
    loom_status st = loom_backend_open(cfg->backend ? cfg->backend : "cpu", cfg->threads, &s->backend);
    s->device = st == LOOM_OK && loom_backend_device_memory(&s->backend);
    if (s->device) { /* the groups for its memory, before any strategy asks for them */
        st = loom_dist_device_open(&s->backend);
        s->device_groups = st == LOOM_OK && loom_dist_device_kind() != NULL;
    } else if (st == LOOM_OK && loom_dist_device_comm() && loom_core_host()->world > 1) {
        st = loom_fail(LOOM_ERR_INVALID, "comm = \"%s\" carries device memory only, and backend "
                       "%s keeps its buffers in host memory: use comm = \"shm\" (or \"mpi\"), "
                       "or backend = \"cuda\"", loom_dist_device_comm(),
                       s->backend.ops->describe(s->backend.self));
    }
    loom_gpt_parallel par = {NULL, NULL, cfg->canonical, NULL, 0, 0, cfg->recompute,
                             cfg->recompute_layers};
    int pp = 1;
    if (st == LOOM_OK) {
        const struct loom_comm_ops *pops;
        void *pgroup;
        st = loom_core_host()->group(LOOM_GROUP_PP, &pops, &pgroup, &pp);
    }
    if (st == LOOM_OK && pp > 1) {
        if (!cfg->schedule_lists && (!cfg->schedule || cfg->schedule->kind != LOOM_KIND_SCHED))
            st = loom_fail(LOOM_ERR_INVALID, "pp=%d needs a sched plugin (schedule = \"1f1b\") "
                           "or a Lua schedule's lists", pp);
        else {
            loom_pipeline_config pc = {cfg->schedule, cfg->accum, cfg->pp_chunks, cfg->model.layers,
                                       cfg->pp_layers, cfg->n_pp_layers, cfg->canonical,
                                       cfg->schedule_lists, cfg->schedule_name};
            pc.untied = cfg->model.family == LOOM_FAMILY_LLAMA && !cfg->model.tie_embeddings;
            pc.backend = &s->backend;
            /* the default split weighs the blocks, the embedding and the head by FLOPs */
            double *cost = malloc((size_t)(cfg->model.layers > 0 ? cfg->model.layers : 1) * sizeof *cost);
            if (!cost)
                st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
            else {
                loom_gpt_layer_costs(&cfg->model, cfg->seq, cfg->recompute == LOOM_RECOMPUTE_LAYERS
                                     ? cfg->recompute_layers : NULL, cost, &pc.first_cost,
                                     &pc.last_cost);
                if (cfg->recompute == LOOM_RECOMPUTE_FULL) /* every block's forward again */
                    for (int l = 0; l < cfg->model.layers; l++)
                        cost[l] *= 4.0 / 3.0;
                pc.layer_cost = cost;
                st = loom_pipeline_create(&pc, &s->pipe);
                free(cost);
            }
        }
        if (st == LOOM_OK) {
            par.stage_layers = loom_pipeline_stage_layers(s->pipe);
            par.slots = loom_pipeline_slots(s->pipe);
            par.split_backward = loom_pipeline_split_backward(s->pipe);
        }
    }
    if (st == LOOM_OK && cfg->tensor) {
        loom_config_copy(&s->tensor_cfg, cfg->tensor);
        s->cfg.tensor = &s->tensor_cfg;
        st = loom_config_set_boolean(&s->tensor_cfg, "canonical", cfg->canonical);
        if (st == LOOM_OK)
            st = make_plugin(&s->tensor_cfg, (const void **)&s->tensor, &s->tensor_self);
        if (st == LOOM_OK && s->device) /* its buffers are the backend's (strategy.h) */
            st = bind_tensor_backend(s, s->tensor, s->tensor_self, &s->tensor_cfg);
        par.tp_ops = s->tensor;
        par.tp_self = s->tensor_self;
    }
    if (st == LOOM_OK)
        st = make_plugin(&s->precision_cfg, (const void **)&s->precision, &s->precision_self);
    loom_precision_dtypes dt = {LOOM_DTYPE_F32, LOOM_DTYPE_F32, LOOM_DTYPE_F32, 0};
    if (st == LOOM_OK) {
        s->precision->dtypes(s->precision_self, &dt);
        st = check_precision(s, cfg, &dt);
    }
    if (st == LOOM_OK && cfg->compress_momentum) /* 1-bit Adam: adamw's variance frozen */
        st = loom_compress_momentum_prepare(&s->optim_cfg, s->precision_cfg.desc->name,
                                            cfg->zero_stage, cfg->offload_mode, pp,
                                            cfg->grad_clip, cfg->compress_warmup);
    if (st == LOOM_OK)
        st = make_plugin(&s->optim_cfg, (const void **)&s->optim, &s->optim_self);
    if (st == LOOM_OK && s->device)
        st = check_device(s, cfg, pp);
    if (st == LOOM_OK && cfg->ep > 1) { /* session_ep.h */
        if (!cfg->model.moe.experts)
            st = loom_fail(LOOM_ERR_INVALID, "mesh ep=%d splits a mixture of experts, and this "
                           "model has none (loom.gpt{moe = {...}})", cfg->ep);
        else if (cfg->offload_mode)
            st = loom_fail(LOOM_ERR_UNSUPPORTED, "mesh ep=%d with offload does not compose yet "
                           "(ep runs with dp, zero=1, 2 or 3 and pp)", cfg->ep);
        else
            st = loom_ep_create(cfg->ep, &s->backend, &par, &s->ep);
    }
    if (st == LOOM_OK)
        st = partitioned_construction(s, &s->undrawn, &par.lazy_grads);
    par.undrawn = s->undrawn;
    if (st == LOOM_OK)
        st = loom_gpt_create(&cfg->model, &s->backend, cfg->micro_batch, cfg->seed, &par, &s->model);
    if (st == LOOM_OK) /* the compute copy of the weights and the activations' dtype */
        st = loom_gpt_set_precision(s->model, dt.param, dt.compute);
    s->master_weights = dt.param != LOOM_DTYPE_F32;
    if (st == LOOM_OK) {
        size_t total = loom_gpt_params(s->model)->total;
        const loom_gpt_config *mc = loom_gpt_get_config(s->model);
        s->state_slots = s->optim->state_per_param(s->optim_self);
        st = make_zero(s); /* ZeRO holds this rank's partition of the state instead */
        /* offload: the pool or the file holds it (make_offload), nothing here */
        int here = s->state_slots && !s->zero && cfg->offload_mode == LOOM_OFFLOAD_NONE;
        if (st == LOOM_OK && here)
            s->optim_state = s->device ? s->backend.ops->alloc(s->backend.self,
                                                               (size_t)s->state_slots * total * 4)
                                       : malloc((size_t)s->state_slots * total * sizeof(float));
        if (st == LOOM_OK && here && !s->device && s->optim_state) /* zeroed by touching every
            * page now: calloc's lazy zero pages made step 1's optimizer fault them in (+20 ms
            * on one pp stage, whose neighbour then waited into step 2: docs/PIPELINE.md) */
            memset(s->optim_state, 0, (size_t)s->state_slots * total * sizeof(float));
        if (st == LOOM_OK && s->device) { /* zeroed: a fresh state mirrors as zeros; offloaded,
                                           * the state is host memory already */
            s->host_params = malloc(total * sizeof(float));
            s->host_state = calloc((size_t)s->state_slots * (here ? total : 0) + 1, sizeof(float));
            if (!s->host_params || !s->host_state)
                st = loom_fail(LOOM_ERR_NOMEM, "out of memory for the host copy of the "
                               "parameters and optimizer state (%zu MiB)",
                               (size_t)(1 + s->state_slots) * total * sizeof(float) >> 20);
        }
        size_t bt = (size_t)cfg->micro_batch * cfg->seq * (s->pipe ? (size_t)cfg->accum + 1 : 1);
        /* tokens also stage a sampling window of up to ctx */
        s->tokens = malloc((bt > (size_t)mc->ctx ? bt : (size_t)mc->ctx) * sizeof(int));
        s->targets = malloc(bt * sizeof(int));
        s->host_logits = malloc((size_t)mc->vocab_padded * sizeof(float));
        if (st == LOOM_OK && ((here && !s->optim_state) || !s->tokens ||
                              !s->targets || !s->host_logits))
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory for optimizer state");
    }
    if (st == LOOM_OK)
        st = loom_grad_norm_create(&s->backend, loom_gpt_params(s->model), &s->norm);
    if (st == LOOM_OK && s->pipe && loom_gpt_tied_head(s->model) &&
        loom_pipeline_stage(s->pipe) == loom_pipeline_stages(s->pipe) - 1)
        loom_grad_norm_skip(s->norm, 0); /* the tied wte: stage 0 counts it, where one rank does */
    if (st == LOOM_OK)
        st = loom_nonfinite_create(loom_gpt_params(s->model), s->pipe ? loom_pipeline_stage(s->pipe) : 0,
                                   s->pipe ? loom_pipeline_stages(s->pipe) : 1, &s->nonfinite);
    if (st == LOOM_OK)
        st = build_segments(s);
    if (st == LOOM_OK)
        st = make_offload(s, cfg);
    s->cfg.offload_path = NULL; /* the caller's string; only needed while opening */
    loom_grad_reducer zero2 = {loom_zero_begin_micro, loom_zero_grads_ready, loom_zero_finish_micro,
                               s->zero};
    if (st == LOOM_OK)
        st = loom_grad_sync_create(s->model, &s->backend, cfg->canonical, cfg->accum, s->cfg.strategy,
                                   s->zero && loom_zero_reduces(s->zero) ? &zero2 : NULL, &s->sync);
    if (st == LOOM_OK && s->pipe && cfg->canonical)
        st = canonical_parts(s);
    if (st == LOOM_OK && cfg->compress_method)
        st = make_compress(s);
    if (st == LOOM_OK && (cfg->teacher || cfg->kd_cache))
        st = make_teacher(s, cfg);
    s->cfg.teacher = NULL; /* the caller's; only needed while opening */
    s->cfg.teacher_init = s->cfg.teacher_checkpoint = s->cfg.kd_cache = NULL;
    if (st != LOOM_OK) {
        loom_session_destroy(s);
        return st;
    }
    *out = s;
    return LOOM_OK;
}

void loom_session_destroy(loom_session *s)
{
    if (!s)
        return;
    loom_trace_close(s->trace);
    loom_grad_sync_destroy(s->sync);
    loom_compress_destroy(s->compress);
    loom_gpt_destroy(s->teacher);
    loom_pipeline_destroy(s->teacher_pipe);
    if (s->teacher_tp)
        s->teacher_tp->destroy(s->teacher_tp_self);
    loom_kd_group_close(s->kd_group);
    if (s->device && s->kd_whole)
        s->backend.ops->free(s->backend.self, s->kd_whole);
    else
        free(s->kd_whole);
    loom_kd_cache_close(s->kd_cache);
    if (s->kd_dev_rows)
        s->backend.ops->free(s->backend.self, s->kd_dev_rows);
    if (s->device && s->kd_step)
        s->backend.ops->free(s->backend.self, s->kd_step);
    else
        free(s->kd_step);
    for (int l = 0; l < 64; l++) {
        free(s->kd_hstep[l]);
        free(s->kd_astep[l]);
    }
    loom_zero_destroy(s->zero);
    loom_offload_destroy(s->offload);
    loom_gpt_destroy(s->model);
    loom_ep_destroy(s->ep);
    loom_pipeline_destroy(s->pipe);
    if (s->tensor)
        s->tensor->destroy(s->tensor_self);
    loom_grad_norm_destroy(s->norm);
    loom_nonfinite_destroy(s->nonfinite);
    if (s->optim)
        s->optim->destroy(s->optim_self);
    if (s->precision)
        s->precision->destroy(s->precision_self);
    if (s->device && s->optim_state)
        s->backend.ops->free(s->backend.self, s->optim_state);
    else
        free(s->optim_state);
    if (s->device_groups) /* nccl's events live on the backend's stream */
        loom_dist_device_close();
    loom_backend_close(&s->backend);
    free(s->host_params);
    free(s->host_state);
    free(s->segments);
    free(s->tokens);
    free(s->targets);
    free(s->host_logits);
    free(s);
}

loom_ep *loom_session_ep(loom_session *s) { return s->ep; }

/* Register each interleaved chunk's parameter ranges as a grad_sync part (canonical). */
static loom_status canonical_parts(loom_session *s)
{
    int chunks = loom_pipeline_chunks(s->pipe);
    for (int c = 0; chunks > 1 && c <= chunks; c++) { /* c = chunks: the tied wte, stage 0 */
        size_t off[4], n[4];
        int k = loom_pipeline_chunk_ranges(s->pipe, loom_gpt_params(s->model), c, off, n);
        if (k < 1 && c == chunks)
            break;
        if (k < 1)
            LOOM_FAIL(LOOM_ERR_INTERNAL, "pipeline chunk %d owns %s of the gradient buffer", c,
                      k ? "more than 4 ranges" : "no range");
        for (int i = 0; i < k; i++)
            LOOM_TRY(loom_grad_sync_add_range(s->sync, c, off[i], n[i]));
    }
    return LOOM_OK;
}

typedef struct micro_ctx {
    loom_grad_sync *sync;
    const double *loss;
    int chunks;
    loom_ep *ep;         /* canonical ep: each backward's per-source expert sums */
    loom_gpt *model;
    loom_pipeline *pipe;
} micro_ctx;

loom_status loom_session_trace(loom_session *s, const char *path, int rank, int64_t steps)
{
    loom_trace_close(s->trace);
    s->trace = NULL;
    loom_status st = loom_trace_open(path, rank, s->pipe ? loom_pipeline_stage(s->pipe) : -1,
                                     steps, &s->trace);
    /* the new trace, or NULL when it could not be opened: none keeps the closed one */
    if (s->pipe)
        loom_pipeline_set_trace(s->pipe, s->trace);
    if (s->zero && loom_zero_reduces(s->zero))
        loom_zero_set_trace(s->zero, s->trace);
    return st;
}

/* The loss sum (the last stage's) and the measured bubble of the pipeline phase, with one
 * sum over the pp group: v = {loss, compute[0..P), wall[0..P)}, each stage filling its
 * own places with the rest 0, so the sum hands every rank every stage's figures (x + 0
 * is x: the loss keeps its bits). bubble = 1 - sum(compute) / (P x max(wall)): the
 * simulator's 1 - compute / (stages x makespan), the makespan being the longest stage's
 * phase (from its first instruction to its last send completed). */
static loom_status pipeline_totals(loom_session *s, double *loss_sum, double *bubble)
{
    int P = loom_pipeline_stages(s->pipe), me = loom_pipeline_stage(s->pipe);
    double *v = calloc(1 + 2 * (size_t)P, sizeof(double));
    if (!v)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    v[0] = me == P - 1 ? *loss_sum : 0.0;
    loom_pipeline_timing(s->pipe, &v[1 + me], &v[1 + P + me]);
    loom_status st = loom_pipeline_sum(s->pipe, v, 1 + 2 * P);
    if (st == LOOM_OK) {
        double compute = 0.0, wall = 0.0;
        for (int q = 0; q < P; q++) {
            compute += v[1 + q];
            wall = v[1 + P + q] > wall ? v[1 + P + q] : wall;
        }
        *loss_sum = v[0];
        *bubble = wall > 0.0 ? 1.0 - compute / (P * wall) : NAN;
    }
    free(v);
    return st;
}

/* Canonical mode, one tree per micro-batch gradient; with interleaved chunks (disjoint
 * parameters, backwarded in turn) one per chunk's parameters: grad_sync's parts. */
static loom_status canonical_before(void *ctx, int mb, int chunk)
{
    micro_ctx *c = ctx;
    if (c->chunks > 1) /* chunk -1: the tied wte (pipeline.h) */
        return loom_grad_sync_begin_part(c->sync, mb, chunk < 0 ? c->chunks : chunk);
    return loom_grad_sync_begin_micro(c->sync, mb);
}

/* ZeRO-2 under pp, fast mode: each (micro-batch, chunk) backward reduced as it ends. */
typedef struct zero_ctx {
    loom_zero *z;
    int n;
} zero_ctx;

static loom_status zero_before(void *ctx, int mb, int chunk)
{
    zero_ctx *c = ctx;
    LOOM_TRY(loom_zero_begin_micro(c->z, c->n++));
    loom_zero_trace_label(c->z, mb, chunk);
    return LOOM_OK;
}

/* Before a B (zb1): in fast mode it adds the layer norms' gradients into the buffer the
 * previous W's buckets may still be reading (zero.h). */
static loom_status zero_before_input(void *ctx, int mb, int chunk)
{
    (void)mb, (void)chunk;
    return loom_zero_wait_reduces(((zero_ctx *)ctx)->z);
}

static loom_status zero_after(void *ctx, int mb, int chunk)
{
    (void)mb, (void)chunk;
    return loom_zero_finish_micro(((zero_ctx *)ctx)->z);
}

/* Fast mode under pp with the dp strategy: each chunk's last backward (or W) of the step
 * hands its finished ranges to the strategy as it goes (grad_sync.h, gpt_stage.h), so
 * their all-reduces start while the rest of the step's list runs. */
static loom_status overlap_final(void *ctx, int chunk, int on)
{
    (void)chunk;
    loom_grad_sync_final_hook(ctx, on);
    return LOOM_OK;
}

static loom_status canonical_after(void *ctx, int mb, int chunk)
{
    micro_ctx *c = ctx;
    if (c->chunks > 1) { /* the loss once per micro-batch, with its last chunk */
        LOOM_TRY(loom_grad_sync_end_part(c->sync, mb, chunk < 0 ? c->chunks : chunk,
                                         chunk == c->chunks - 1, c->loss[mb]));
        return loom_ep_end_chunk(c->ep, c->model, c->pipe, chunk); /* this chunk's experts */
    }
    LOOM_TRY(loom_grad_sync_end_micro(c->sync, mb, c->loss[mb]));
    return loom_ep_end_micro(c->ep, c->model); /* one chunk a stage under ep (make_session) */
}

loom_status loom_session_step(loom_session *s, loom_batch_fn next, void *ctx, float lr,
                              loom_step_stats *out)
{
    double t0 = loom_now_ms();
    loom_trace_step(s->trace, s->steps + 1);
    loom_gpt_refresh_params(s->model); /* the compute copy from the master: after the last
                                        * step, a checkpoint or llm.c load, anything */
    loom_gpt_take_comm_ms(s->model); /* drop what eval or sampling spent */
    const double *a2a;
    (void)loom_gpt_moe_take_spans(s->model, &a2a);
    if (s->zero)
        loom_zero_take_comm_ms(s->zero);
    const loom_backend_ops *k = s->backend.ops;
    int B = s->cfg.micro_batch, T = s->cfg.seq, accum = s->cfg.accum;
    int dp = loom_grad_sync_dp_size(s->sync), dp_rank = loom_grad_sync_dp_rank(s->sync);
    double tokens = (double)B * T * accum * dp;
    float scale = s->precision->loss_scale(s->precision_self);
    int peak = 0, loss_bad = 0; /* loss_bad: one of this rank's own losses is inf or nan */
    s->step_no++;
    int compressed = loom_compress_active(s->compress, s->step_no);
    loom_grad_sync_set_compress(s->sync, s->compress, compressed);
    if (compressed)
        loom_compress_begin_step(s->compress, s->step_no);
    if (s->pipe) {
        /* Every rank reads every micro-batch (positions stay in step); this dp rank's block
         * goes through the pipeline, then the losses join the tree in micro-batch order. */
        size_t bt = (size_t)B * T;
        if (s->kd_group) /* the group reads them and runs the split teacher (teacher.pp:
                          * every stage its part; else the last stage) */
            LOOM_TRY(loom_kd_group_step(s->kd_group, s->teacher,
                                        s->teacher_pipe ? teacher_pipe_forward : NULL, s, next, ctx));
        for (int i = 0; i < accum * dp; i++) {
            size_t at = (size_t)(i / accum == dp_rank ? i % accum : accum) * bt; /* accum: scratch */
            if (!s->kd_group) {
                LOOM_TRY(next(ctx, s->tokens + at, s->targets + at, B, T));
            } else if (at < (size_t)accum * bt) { /* this rank's, as the group read them */
                memcpy(s->tokens + at, loom_kd_group_tokens(s->kd_group, i), bt * sizeof(int));
                memcpy(s->targets + at, loom_kd_group_targets(s->kd_group, i), bt * sizeof(int));
            }
        }
        if (s->kd_step || s->teacher_pipe) /* the last stage distils: its teacher's rows of
                                             * the step first (teacher.pp: every stage runs) */
            LOOM_TRY(distill_pipeline(s, accum, dp_rank));
        double *mb_loss = calloc((size_t)accum, sizeof(double));
        if (!mb_loss)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
        /* canonical: each micro-batch's gradients on their own, into the tree in order */
        micro_ctx mc = {s->sync, mb_loss, loom_pipeline_chunks(s->pipe), s->ep, s->model, s->pipe};
        loom_pipeline_hooks hooks = {canonical_before, canonical_after, &mc, NULL, NULL};
        zero_ctx zc = {s->zero, 0};
        loom_pipeline_hooks zhooks = {zero_before, zero_after, &zc, NULL, zero_before_input};
        loom_pipeline_hooks ohooks = {NULL, NULL, s->sync, overlap_final, NULL};
        int canon = s->cfg.canonical, zero2 = s->zero && loom_zero_reduces(s->zero);
        /* the noisy router's key: this rank's first micro-batch's global index, the
         * pipeline adds each micro-batch's (gpt.h) */
        loom_gpt_set_moe_key(s->model, (uint64_t)(s->step_no - 1) * (uint64_t)(accum * dp) +
                                       (uint64_t)dp_rank * (uint64_t)accum);
        loom_status st = canon ? LOOM_OK : loom_grad_sync_begin_micro(s->sync, 0);
        int overlap = !canon && !zero2 && loom_grad_sync_can_overlap(s->sync) &&
                      loom_gpt_stage_reports_ready(s->model) && !s->ep; /* ep: all_ready's */
        if (!canon && !zero2) /* no range is final before its chunk's last backward */
            loom_grad_sync_final_hook(s->sync, 0);
        if (st == LOOM_OK)
            st = loom_pipeline_run(s->pipe, s->model, s->tokens, s->targets, B, T,
                                   (float)(scale / tokens), mb_loss,
                                   canon ? &hooks : zero2 ? &zhooks : overlap ? &ohooks : NULL,
                                   &peak);
        for (int a = 0; st == LOOM_OK && !canon && a < accum; a++)
            st = loom_grad_sync_end_micro(s->sync, a, mb_loss[a]);
        for (int a = 0; a < accum; a++)
            loss_bad |= !isfinite(mb_loss[a]);
        if (st == LOOM_OK)
            st = loom_grad_sync_all_ready(s->sync);
        free(mb_loss);
        LOOM_TRY(st);
    }
    if (s->kd_group && !s->pipe) /* the step's micro-batches read, the split teacher run */
        LOOM_TRY(loom_kd_group_step(s->kd_group, s->teacher, NULL, NULL, next, ctx));
    for (int i = 0; !s->pipe && i < accum * dp; i++) {
        if (s->kd_group) {
            memcpy(s->tokens, loom_kd_group_tokens(s->kd_group, i), (size_t)B * T * sizeof(int));
            memcpy(s->targets, loom_kd_group_targets(s->kd_group, i), (size_t)B * T * sizeof(int));
        } else {
            LOOM_TRY(next(ctx, s->tokens, s->targets, B, T));
        }
        if (i / accum != dp_rank)
            continue; /* another rank's micro-batch */
        int a = i % accum;
        double part = 0.0, tf = loom_now_ms();
        LOOM_TRY(loom_grad_sync_begin_micro(s->sync, a));
        if (s->kd_group) { /* the split teacher's rows, run before the loop */
            distill_group_terms(s, a);
            LOOM_TRY(loom_gpt_set_distill(s->model, loom_kd_group_rows(s->kd_group, a),
                                          (size_t)loom_gpt_get_config(s->teacher)->vocab_padded,
                                          s->cfg.kd_temperature, s->cfg.kd_alpha));
        } else if (s->teacher) { /* forward only, frozen: its logits for the student's loss */
            const float *rows;
            LOOM_TRY(loom_gpt_forward(s->teacher, s->tokens, NULL, B, T, 0.0f, NULL));
            LOOM_TRY(teacher_rows(s, (size_t)B * T, &rows));
            if (s->device)
                distill_pipeline_terms(s, 0); /* teacher.layers: its rows to the host */
            LOOM_TRY(loom_gpt_set_distill(s->model, rows,
                                          (size_t)loom_gpt_get_config(s->teacher)->vocab_padded,
                                          s->cfg.kd_temperature, s->cfg.kd_alpha));
        } else if (s->kd_cache) { /* the cached teacher's rows of the stream's micro-batch */
            const float *rows;
            LOOM_TRY(loom_kd_cache_rows(s->kd_cache, (s->step_no - 1) * accum * dp + i, s->tokens,
                                        &rows));
            if (s->kd_dev_rows) { /* a device backend: the rows where its kd_rows reads them */
                k->copy_to_device(s->backend.self, s->kd_dev_rows, rows, (size_t)B * T *
                                  (size_t)loom_gpt_get_config(s->model)->vocab * sizeof(float));
                rows = s->kd_dev_rows;
            }
            LOOM_TRY(loom_gpt_set_distill(s->model, rows, (size_t)loom_gpt_get_config(s->model)->vocab,
                                          s->cfg.kd_temperature, s->cfg.kd_alpha));
        }
        /* the noisy router's key: this micro-batch's global index (gpt.h) */
        loom_gpt_set_moe_key(s->model, (uint64_t)(s->step_no - 1) * (uint64_t)(accum * dp) + (uint64_t)i);
        LOOM_TRY(loom_gpt_forward(s->model, s->tokens, s->targets, B, T, (float)(scale / tokens),
                                  &part));
        double tb = loom_now_ms();
        loom_trace_span(s->trace, LOOM_TRACE_FORWARD, tf, tb, a, 0);
        LOOM_TRY(loom_gpt_backward(s->model));
        LOOM_TRY(loom_grad_sync_end_micro(s->sync, a, part));
        LOOM_TRY(loom_ep_end_micro(s->ep, s->model)); /* canonical: per-source expert sums */
        loss_bad |= !isfinite(part);
        loom_trace_span(s->trace, LOOM_TRACE_BACKWARD, tb, loom_now_ms(), a, 0);
    }
    double loss_sum = 0.0, t_sync = loom_now_ms();
    LOOM_TRY(loom_grad_sync_finish(s->sync, &loss_sum));
    if (compressed && s->zero) /* ZeRO-2/3: the partition out of the exchanged whole */
        LOOM_TRY(loom_zero_take_reduced(s->zero));
    double t_tied = loom_now_ms();
    loom_trace_span(s->trace, LOOM_TRACE_GRAD_SYNC, t_sync, t_tied, -1, -1);
    if (loom_grad_sync_can_overlap(s->sync)) { /* from the first bucket under way to the last done */
        double t_first = loom_grad_sync_first_ms(s->sync);
        loom_trace_span(s->trace, LOOM_TRACE_ALLREDUCE, t_first >= 0 ? t_first : t_sync, t_tied,
                        -1, -1);
    }
    double comm_ms = t_tied - t_sync + loom_gpt_take_comm_ms(s->model);
    /* ZeRO-2 reduce-scattered them already; compression exchanged them (make_compress) */
    if (!(s->zero && loom_zero_reduces(s->zero)) && !compressed)
        LOOM_TRY(loom_ep_reduce(s->ep, s->model, &comm_ms)); /* experts over their edp group */
    if (s->pipe) {
        LOOM_TRY(loom_pipeline_tied_sync(s->pipe, s->model, &comm_ms));
        loom_trace_span(s->trace, LOOM_TRACE_TIED_SYNC, t_tied, loom_now_ms(), -1, -1);
    }
    if (s->pipe && s->zero) /* ZeRO-2: the buckets held for the wte exchange */
        LOOM_TRY(loom_zero_reduce_held(s->zero));
    double norm_sq, bubble = NAN, t_norm = loom_now_ms();
    int nonfinite;
    int first_bad;
    if (s->zero && loom_zero_reduces(s->zero)) { /* the gradient lives in partitions */
        size_t n_seg;
        const loom_optim_segment *seg = loom_zero_segments(s->zero, &n_seg);
        LOOM_TRY(loom_nonfinite_inject_segments(s->nonfinite, s->step_no, seg, n_seg,
                                                loom_zero_segment_entries(s->zero), &s->backend));
        LOOM_TRY(loom_zero_norm(s->zero, &norm_sq, &nonfinite, &comm_ms));
        first_bad = loom_zero_first_nonfinite(s->zero);
    } else {
        loom_nonfinite_inject(s->nonfinite, s->step_no, loom_gpt_params(s->model),
                              loom_gpt_grad_data(s->model), &s->backend);
        LOOM_TRY(loom_grad_norm_compute(s->norm, loom_gpt_params(s->model),
                                        loom_gpt_grad_data(s->model), &norm_sq, &nonfinite, &comm_ms));
        first_bad = loom_grad_norm_first_nonfinite(s->norm);
        /* every ep rank's experts in the norm (session_ep.h; canonical under pp: below) */
        if (s->ep && !(s->pipe && s->cfg.canonical)) {
            size_t n_slots;
            const double *slots = loom_grad_norm_slots(s->norm, &n_slots);
            LOOM_TRY(loom_ep_norm(s->ep, s->model, slots, n_slots, &norm_sq, &nonfinite, &comm_ms));
        }
    }
    if (s->pipe) { /* the loss lives on the last stage, the norm's parts on every stage */
        size_t n_slots;
        const double *slots = loom_grad_norm_slots(s->norm, &n_slots);
        double t_pp = loom_now_ms();
        LOOM_TRY(pipeline_totals(s, &loss_sum, &bubble));
        /* fast mode: each stage's partition sums, or (ep) its sum with ep's part */
        if ((s->zero && loom_zero_reduces(s->zero)) || (s->ep && !s->cfg.canonical)) {
            double w[2] = {norm_sq, nonfinite ? 1.0 : 0.0};
            LOOM_TRY(loom_pipeline_sum(s->pipe, w, 2));
            norm_sq = w[0];
            nonfinite = w[1] != 0.0;
        } else if (s->ep) { /* canonical: every ep rank's experts in place, one rank's order */
            const double *order;
            size_t n_order;
            const size_t *per_chunk = NULL; /* interleaved: chunk by chunk */
            if (loom_pipeline_chunks(s->pipe) > 1)
                LOOM_TRY(loom_ep_norm_chunks(s->ep, s->model, s->pipe, slots, n_slots, &nonfinite,
                                             &comm_ms, &order, &n_order, &per_chunk));
            else
                LOOM_TRY(loom_ep_norm_order(s->ep, s->model, slots, n_slots, &nonfinite, &comm_ms,
                                            &order, &n_order));
            LOOM_TRY(loom_pipeline_norm_order(s->pipe, order, n_order, per_chunk, &norm_sq,
                                              &nonfinite));
        } else
            LOOM_TRY(loom_pipeline_norm(s->pipe, loom_gpt_params(s->model), slots, n_slots,
                                        &norm_sq, &nonfinite));
        comm_ms += loom_now_ms() - t_pp;
    }
    /* a loss spike (loom_session_limit_next_step): this step's loss or norm above the
     * limits the loop set; agreed below with the rest, so every rank skips alike */
    double loss_now = loss_sum / tokens, norm_now = sqrt(norm_sq) / scale;
    int spike = !nonfinite && ((s->limit_loss > 0 && loss_now > s->limit_loss) ||
                               (s->limit_norm > 0 && norm_now > s->limit_norm));
    s->limit_loss = s->limit_norm = 0; /* for one step only */
    /* every rank the same finding, so every rank skips (or stops) alike */
    loom_nonfinite_report found;
    LOOM_TRY(loom_nonfinite_agree(s->nonfinite, loom_gpt_params(s->model), first_bad, loss_bad,
                                  spike, &found, &comm_ms));
    nonfinite = found.found;
    spike = found.spike && !nonfinite;
    if (nonfinite && s->cfg.stop_on_nonfinite) {
        char what[160];
        loom_nonfinite_describe(&found, what, sizeof what);
        LOOM_FAIL(LOOM_ERR_INVALID, "step %lld: %s; the run stops (on_nonfinite = \"stop\"), "
                  "the step's update not applied; on_nonfinite = \"skip\" skips such steps",
                  (long long)s->step_no, what);
    }
    if (s->zero) { /* ZeRO-3: gathers in flight read the partition the step rewrites */
        LOOM_TRY(loom_zero_settle(s->zero));
        comm_ms += loom_zero_take_comm_ms(s->zero);
    }
    double t_opt = loom_now_ms();
    loom_trace_span(s->trace, LOOM_TRACE_NORM, t_norm, t_opt, -1, -1);
    int skip = s->precision->update(s->precision_self, nonfinite);
    const loom_precision_ops *po = s->precision;
    const char *stop = po->size > offsetof(loom_precision_ops, stop_reason) && po->stop_reason
                           ? po->stop_reason(s->precision_self) : NULL;
    if (stop) /* fp16: the loss scale cannot back off further */
        LOOM_FAIL(LOOM_ERR_INVALID, "step %lld: %s; the run stops, this step's update not "
                  "applied", (long long)s->step_no, stop);
    double norm = nonfinite ? NAN : sqrt(norm_sq) / scale;
    memset(out, 0, sizeof *out);
    out->nonfinite = found;
    if (!skip && !spike) {
        float grad_scale = 1.0f / scale;
        if (s->cfg.grad_clip > 0.0f && norm > s->cfg.grad_clip)
            grad_scale *= (float)(s->cfg.grad_clip / norm);
        loom_optim_step_args args = {s->segments, (size_t)s->n_segments, lr, s->steps + 1,
                                     grad_scale};
        if (s->zero) /* this rank's partition, then everyone's updated parameters */
            args.segments = loom_zero_segments(s->zero, &args.n_segments);
        if (s->offload) /* chunk by chunk over the host pool or the file */
            LOOM_TRY(loom_offload_step(s->offload, s->optim, s->optim_self, &args));
        else if (s->device) /* the update in device memory, queued on the backend's stream */
            LOOM_TRY(s->optim->step_backend(s->optim_self, &args, k, s->backend.self));
        else
            LOOM_TRY(s->optim->step(s->optim_self, &args));
        if (s->zero)
            LOOM_TRY(loom_zero_gather_params(s->zero, &comm_ms));
        s->steps++;
    }
    k->synchronize(s->backend.self);
    double t_done = loom_now_ms();
    loom_trace_span(s->trace, LOOM_TRACE_OPTIMIZER, t_opt, t_done, -1, -1);
    loom_trace_span(s->trace, LOOM_TRACE_STEP, t0, t_done, -1, -1);
    /* the step's calls into the MoE exchanges under ep (lane "ep") */
    for (size_t i = 0, n = loom_gpt_moe_take_spans(s->model, &a2a); i < n; i++)
        loom_trace_span(s->trace, LOOM_TRACE_EP_A2A, a2a[2 * i], a2a[2 * i + 1], -1, -1);
    LOOM_TRY(loom_trace_flush(s->trace));
    out->step = s->steps;
    out->loss = loss_sum / tokens;
    out->grad_norm = norm;
    out->lr = lr;
    out->tokens = tokens;
    out->skipped = skip || spike;
    out->spike = spike;
    out->loss_scale = s->precision->loss_scale(s->precision_self); /* for the next step */
    out->ms = loom_now_ms() - t0;
    out->comm_ms = comm_ms;
    out->inflight = peak;
    out->bubble = bubble;
    out->stage_cpu_ms = s->pipe ? loom_pipeline_compute_cpu_ms(s->pipe) : NAN;
    if (s->compress) {
        out->compress_bytes = compressed ? (double)loom_compress_message_bytes(s->compress) : 0.0;
        out->grad_bytes = (double)loom_compress_raw_bytes(s->compress);
        out->compress_expert_bytes =
            compressed ? (double)loom_compress_expert_message_bytes(s->compress) : 0.0;
        out->grad_expert_bytes = (double)loom_compress_expert_raw_bytes(s->compress);
    }
    return LOOM_OK;
}

loom_status loom_session_eval(loom_session *s, loom_batch_fn next, void *ctx, int batches,
                              double *loss)
{
    int B = s->cfg.micro_batch, T = s->cfg.seq;
    double sum = 0.0;
    loom_gpt_refresh_params(s->model);
    for (int i = 0; i < batches; i++) {
        double part = 0.0;
        LOOM_TRY(next(ctx, s->tokens, s->targets, B, T));
        if (s->pipe)
            LOOM_TRY(loom_pipeline_eval(s->pipe, s->model, s->tokens, s->targets, B, T, &part));
        else
            LOOM_TRY(loom_gpt_forward(s->model, s->tokens, s->targets, B, T, 0.0f, &part));
        sum += part;
    }
    *loss = sum / ((double)batches * B * T);
    return LOOM_OK;
}

/* Draw one token from logits[0..V) at temperature, restricted to the top_k largest. */
static int draw_token(float *logits, int V, float temperature, int top_k, double u)
{
    float max = -INFINITY;
    for (int i = 0; i < V; i++)
        max = logits[i] > max ? logits[i] : max;
    float kth = -INFINITY;
    if (top_k > 0 && top_k < V) {
        /* The k-th largest distinct finite value (ties admit a few more than k; fewer than k
         * distinct finite values: no limit), as repeated selection of the maximum below the
         * previous one finds it, in one pass: the k largest distinct values so far, kept
         * sorted (descending) in top[0..n), a value entering only above the smallest. */
        float stack_top[64];
        float *top = top_k <= 64 ? stack_top : malloc(sizeof(float) * (size_t)top_k);
        if (top) {
            int n = 0;
            for (int i = 0; i < V; i++) {
                const float x = logits[i];
                if (!isfinite(x) || (n == top_k && !(x > top[n - 1])))
                    continue;
                int j = n; /* x's place: after every value above it */
                while (j > 0 && top[j - 1] < x)
                    j--;
                if (j > 0 && top[j - 1] == x)
                    continue; /* already held */
                if (n < top_k)
                    n++;
                memmove(top + j + 1, top + j, sizeof(float) * (size_t)(n - 1 - j));
                top[j] = x;
            }
            kth = n == top_k ? top[n - 1] : -INFINITY;
            if (top != stack_top)
                free(top);
        } else {
            float prev = INFINITY; /* no memory: k passes of O(V) */
            for (int j = 0; j < top_k; j++) {
                float best = -INFINITY;
                for (int i = 0; i < V; i++)
                    if (logits[i] < prev && logits[i] > best)
                        best = logits[i];
                prev = best;
            }
            kth = prev;
        }
    }
    double total = 0.0;
    for (int i = 0; i < V; i++) {
        double p = logits[i] >= kth ? exp((logits[i] - max) / temperature) : 0.0;
        logits[i] = (float)p;
        total += p;
    }
    double r = u * total, acc = 0.0;
    for (int i = 0; i < V; i++) {
        acc += logits[i];
        if (logits[i] > 0.0f && r <= acc)
            return i;
    }
    for (int i = V - 1; i >= 0; i--)
        if (logits[i] > 0.0f)
            return i;
    return 0;
}

/* Under pipeline parallelism: the last stage's bytes to every stage (its pp group). */
static loom_status from_last_stage(void *buf, size_t n)
{
    const struct loom_comm_ops *ops;
    void *pp;
    int size;
    LOOM_TRY(loom_core_host()->group(LOOM_GROUP_PP, &ops, &pp, &size));
    loom_comm_request *r = NULL;
    LOOM_TRY(ops->broadcast_start(pp, buf, n, LOOM_DTYPE_U8, size - 1, &r));
    return ops->wait(pp, r);
}

/* The generation loop (session.h). The first token's logits come from a forward over the
 * prompt's window; with the cache every later one from loom_gpt_decode (under pp
 * loom_pipeline_decode) of the token just drawn, until the sequence outgrows ctx: then the window slides, every position moves,
 * and each token is a full forward over the last ctx tokens (as without the cache).
 * While the window starts at 0 — the rows a decode reuses — the backend's products are
 * row-stable (set_deterministic mode 2: a row's bits do not depend on how many rows a
 * product has; a fast GEMM picks kernels by shape), so the one-row decode gives the full
 * forward's bits. Once it slides both paths run the same full forwards on the usual GEMM.
 * The mode depends only on the position, not on no_cache or the layout (sequence
 * parallelism, which cannot decode, too), so every path does the same arithmetic and
 * canonical mode's samples stay equal across tp layouts (tests/e2e/tp.sh). Training's
 * setting is restored at the end. */
static loom_status generate(loom_session *s, const loom_sample_config *c, const int *prompt,
                            int n_prompt, int n_new, int *out)
{
    const loom_gpt_config *mc = loom_gpt_get_config(s->model);
    const loom_backend_ops *k = s->backend.ops;
    /* Under pp each stage keeps its own layers' cache and one row moves between stages per
     * token (loom_pipeline_decode); the stages decide together, since each could decode
     * on its own or not (a stage's recompute mode, its blocks' kind). The last stage
     * draws; the token goes to every stage. */
    int last = !s->pipe || loom_pipeline_stage(s->pipe) == loom_pipeline_stages(s->pipe) - 1;
    int cache = loom_gpt_can_decode(s->model) && !c->no_cache, mode = -1;
    if (s->pipe) {
        double cannot = cache ? 0.0 : 1.0;
        LOOM_TRY(loom_pipeline_sum(s->pipe, &cannot, 1));
        cache = cannot == 0.0;
    }
    memmove(out, prompt, (size_t)n_prompt * sizeof(int));
    uint64_t stream = loom_rng_stream("sample");
    loom_xxh64_state hash;
    loom_xxh64_init(&hash);
    /* shift_window: the window [start, len) restarts at the last ctx/2 tokens when full */
    int start = n_prompt > mc->ctx ? n_prompt - (c->shift_window ? mc->ctx / 2 : mc->ctx) : 0;
    for (int i = 0; i < n_new; i++) {
        int len = n_prompt + i, restarted = 0;
        if (c->shift_window && len - start > mc->ctx) {
            start = len - (mc->ctx + 1) / 2;
            restarted = 1;
        }
        int T = c->shift_window ? len - start : len < mc->ctx ? len : mc->ctx;
        int want = c->shift_window || len <= mc->ctx ? 2 : s->cfg.canonical;
        if (want != mode && k->set_deterministic)
            k->set_deterministic(s->backend.self, mode = want);
        if (cache && i > 0 && !restarted && T <= mc->ctx &&
            (c->shift_window || len <= mc->ctx) && loom_gpt_cached_rows(s->model) == T - 1) {
            if (s->pipe)
                LOOM_TRY(loom_pipeline_decode(s->pipe, s->model, out[len - 1], T - 1));
            else
                LOOM_TRY(loom_gpt_decode(s->model, out[len - 1], T - 1));
        } else {
            /* Sequence parallelism shards rows by tp: pad the window at its end (causal
             * attention: later tokens cannot change the row we read). */
            int mult = loom_gpt_row_multiple(s->model), Tp = (T + mult - 1) / mult * mult;
            if (Tp > mc->ctx)
                LOOM_FAIL(LOOM_ERR_INVALID, "sampling window %d rounds up to %d > ctx=%d under "
                          "sequence parallelism", T, Tp, mc->ctx);
            memcpy(s->tokens, out + len - T, (size_t)T * sizeof(int));
            for (int j = T; j < Tp; j++)
                s->tokens[j] = 0;
            double no_loss;
            if (s->pipe) /* no targets: logits on the last stage, no loss */
                LOOM_TRY(loom_pipeline_eval(s->pipe, s->model, s->tokens, NULL, 1, Tp, &no_loss));
            else
                LOOM_TRY(loom_gpt_forward(s->model, s->tokens, NULL, 1, Tp, 0.0f, NULL));
        }
        if (last) {
            LOOM_TRY(loom_gpt_logits_row(s->model, (size_t)(T - 1), s->host_logits));
            if (c->logits_hash)
                loom_xxh64_update(&hash, s->host_logits, (size_t)mc->vocab * sizeof(float));
            out[len] = draw_token(s->host_logits, mc->vocab, c->temperature, c->top_k,
                                  loom_rng_uniform(c->seed, stream, (uint64_t)i));
        }
        if (s->pipe)
            LOOM_TRY(from_last_stage(&out[len], sizeof out[len]));
        if (c->progress)
            LOOM_TRY(c->progress(c->progress_ctx, i + 1, n_new));
    }
    if (c->logits_hash) {
        uint64_t h = loom_xxh64_digest(&hash);
        if (s->pipe)
            LOOM_TRY(from_last_stage(&h, sizeof h));
        *c->logits_hash = h;
    }
    return LOOM_OK;
}

loom_status loom_session_generate(loom_session *s, const loom_sample_config *c, const int *prompt,
                                  int n_prompt, int n_new, int *out)
{
    if (n_prompt < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "sampling needs a prompt of at least one token");
    if (n_new < 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "sampling needs a token count >= 0, got %d", n_new);
    if (!(c->temperature > 0.0f))
        LOOM_FAIL(LOOM_ERR_INVALID, "temperature must be > 0, got %g", c->temperature);
    const loom_backend_ops *k = s->backend.ops;
    /* ZeRO-3: decoding reads every unit without hooks: all gathered for the whole run */
    loom_status st = s->zero ? loom_zero_pin_params(s->zero, 1) : LOOM_OK;
    loom_gpt_refresh_all_params(s->model); /* every unit in place: the whole compute copy */
    if (st == LOOM_OK)
        st = generate(s, c, prompt, n_prompt, n_new, out);
    if (s->zero) {
        loom_status u = loom_zero_pin_params(s->zero, 0);
        if (st == LOOM_OK)
            st = u;
    }
    if (k->set_deterministic)
        k->set_deterministic(s->backend.self, s->cfg.canonical);
    return st;
}

loom_status loom_session_sample(loom_session *s, const int *prompt, int n_prompt, int n_new,
                                float temperature, int top_k, uint64_t seed, int *out)
{
    loom_sample_config c = {.temperature = temperature, .top_k = top_k, .seed = seed};
    return loom_session_generate(s, &c, prompt, n_prompt, n_new, out);
}

void loom_session_number_next_step(loom_session *s, int64_t step) { s->step_no = step - 1; }

void loom_session_limit_next_step(loom_session *s, double loss_max, double norm_max)
{
    s->limit_loss = loss_max > 0 ? loss_max : 0;
    s->limit_norm = norm_max > 0 ? norm_max : 0;
}

void loom_session_get_state(loom_session *s, loom_session_state *out)
{
    memset(out, 0, sizeof *out);
    out->steps = s->steps;
    if (s->precision->get_state)
        s->precision->get_state(s->precision_self, out->precision_state, &out->n_precision_state);
}

loom_status loom_session_set_state(loom_session *s, const loom_session_state *st)
{
    if (st->steps < 0)
        LOOM_FAIL(LOOM_ERR_CORRUPT, "checkpoint step count %lld is negative", (long long)st->steps);
    if (st->n_precision_state < 0 || st->n_precision_state > 4)
        LOOM_FAIL(LOOM_ERR_CORRUPT, "precision state has %d values (0 to 4 expected)",
                  st->n_precision_state);
    s->steps = st->steps;
    s->step_no = st->steps; /* the loop renumbers when it has skipped steps */
    if (s->precision->set_state)
        s->precision->set_state(s->precision_self, st->precision_state, st->n_precision_state);
    return LOOM_OK;
}

const loom_plugin_config *loom_session_optim_config(const loom_session *s) { return s->cfg.optim; }

loom_gpt *loom_session_model(loom_session *s) { return s->model; }
int64_t loom_session_steps_taken(const loom_session *s) { return s->steps; }
int loom_session_pipeline_stages(const loom_session *s)
{
    return s->pipe ? loom_pipeline_stages(s->pipe) : 1;
}

const int *loom_session_pipeline_split(const loom_session *s, int *n_virtual)
{
    *n_virtual = 0;
    return s->pipe ? loom_pipeline_split(s->pipe, n_virtual) : NULL;
}

const char *loom_session_backend_description(loom_session *s)
{
    const char *be = s->backend.ops->describe(s->backend.self);
    if (!s->device_groups)
        return be;
    snprintf(s->description, sizeof s->description, "%s | device buffers over %s", be,
             loom_dist_device_kind());
    return s->description;
}

loom_offload *loom_session_offload_state(loom_session *s) { return s->offload; }

const char *loom_session_offload(const loom_session *s)
{
    return loom_offload_mode_name(s->offload ? s->cfg.offload_mode : LOOM_OFFLOAD_NONE);
}

loom_compress *loom_session_compress(loom_session *s) { return s->compress; }
loom_gpt *loom_session_teacher(loom_session *s) { return s->teacher; }
int loom_session_zero_stage(const loom_session *s) { return s->zero ? loom_zero_stage(s->zero) : 0; }
loom_zero *loom_session_zero(loom_session *s) { return s->zero; }

void loom_session_memory(loom_session *s, loom_memory *out)
{
    size_t total = loom_gpt_params(s->model)->total * sizeof(float);
    memset(out, 0, sizeof *out);
    if (s->zero)
        loom_zero_memory(s->zero, out);
    if (!out->params && !out->params_offloaded) /* offloaded: none kept here */
        out->params = total;
    if (!s->zero || !loom_zero_reduces(s->zero))
        out->grads = total;
    if (!s->zero)
        out->optimizer = (size_t)s->state_slots * total;
    if (s->offload)
        loom_offload_memory(s->offload, &out->optimizer, &out->optimizer_offloaded);
    /* 16-bit weights: params is the compute copy the passes read (2 bytes a parameter),
     * widen the fp32 scratch they read it through, master the fp32 parameters beside it;
     * fp32 parameters are their own master copy */
    if (s->master_weights) {
        out->master = out->params;
        out->params = loom_gpt_compute_param_bytes(s->model);
        out->widen = loom_gpt_widen_bytes(s->model);
    }
    out->activations = loom_gpt_activation_bytes(s->model);
    out->saved = loom_gpt_saved_activation_bytes(s->model);
    out->teacher_activations = s->teacher ? loom_gpt_activation_bytes(s->teacher) : 0;
    /* the teacher is built by loom_gpt_create as any model: fp32 parameters and a gradient
     * buffer of their size (backend memory, zeroed: resident), never made 16-bit */
    out->teacher_params = s->teacher ? loom_gpt_params(s->teacher)->total * sizeof(float) : 0;
    out->teacher_grads = s->teacher && loom_gpt_grad_data(s->teacher) ? out->teacher_params : 0;
    out->distill = s->kd_bytes + loom_gpt_distill_bytes(s->model) +
                   (s->kd_group ? loom_kd_group_bytes(s->kd_group) : 0) +
                   (s->kd_cache ? loom_kd_cache_bytes(s->kd_cache) : 0);
    out->comm += loom_grad_sync_buffer_bytes(s->sync);
    if (s->compress) /* the residual and the messages */
        out->comm += loom_compress_buffer_bytes(s->compress);
}

void loom_session_state_hash(loom_session *s, uint64_t *params, uint64_t *optim)
{
    *optim = 0;
    if (s->zero) { /* this rank's partition: its pieces of the parameters, its state */
        size_t n, floats;
        const loom_optim_segment *seg = loom_zero_segments(s->zero, &n);
        loom_xxh64_state h;
        loom_xxh64_init(&h);
        loom_session_to_host(s); /* device: the state's mirror (below) */
        for (size_t i = 0; i < n; i++)
            if (s->device) { /* each piece copied out of the backend's memory */
                float *piece = malloc(seg[i].n * sizeof(float) + 1);
                if (!piece)
                    continue; /* a hash without the piece: it will not match */
                s->backend.ops->copy_to_host(s->backend.self, piece, seg[i].param,
                                             seg[i].n * sizeof(float));
                loom_xxh64_update(&h, piece, seg[i].n * sizeof(float));
                free(piece);
            } else {
                loom_xxh64_update(&h, seg[i].param, seg[i].n * sizeof(float));
            }
        *params = loom_xxh64_digest(&h);
        float *state = loom_zero_state(s->zero, &floats);
        if (state)
            *optim = loom_xxh64(state, floats * sizeof(float));
        return;
    }
    loom_session_to_host(s);
    *params = loom_xxh64(loom_session_host_params(s), loom_gpt_params(s->model)->total * sizeof(float));
    uint32_t slots;
    const float *state = loom_session_optim_state(s, &slots);
    if (state && slots)
        *optim = loom_xxh64(state, (size_t)slots * loom_gpt_params(s->model)->total * sizeof(float));
}

float *loom_session_optim_state(loom_session *s, uint32_t *slots_per_param)
{
    *slots_per_param = s->state_slots;
    return s->device ? (s->optim_state ? s->host_state : NULL) : s->optim_state;
}

float *loom_session_host_params(loom_session *s)
{
    return s->device ? s->host_params : loom_gpt_param_data(s->model);
}

void loom_session_to_host(loom_session *s)
{
    if (!s->device)
        return;
    const loom_backend_ops *k = s->backend.ops;
    size_t total = loom_gpt_params(s->model)->total;
    if (!loom_zero_params_mirror(s->zero, s->host_params, 1)) /* sparse stage 3: its units */
        k->copy_to_host(s->backend.self, s->host_params, loom_gpt_param_data(s->model),
                        total * sizeof(float));
    loom_zero_to_host(s->zero); /* its partition of the state (zero.h) */
    if (s->optim_state)
        k->copy_to_host(s->backend.self, s->host_state, s->optim_state,
                        (size_t)s->state_slots * total * sizeof(float));
}

void loom_session_from_host(loom_session *s)
{
    if (!s->device)
        return;
    const loom_backend_ops *k = s->backend.ops;
    size_t total = loom_gpt_params(s->model)->total;
    if (!loom_zero_params_mirror(s->zero, s->host_params, 0))
        k->copy_to_device(s->backend.self, loom_gpt_param_data(s->model), s->host_params,
                          total * sizeof(float));
    loom_zero_from_host(s->zero);
    if (s->optim_state)
        k->copy_to_device(s->backend.self, s->optim_state, s->host_state,
                          (size_t)s->state_slots * total * sizeof(float));
}
