/* pipeline.h — the pipeline engine: one rank's stage of a pp > 1 run.
 *
 * Setup (loom_pipeline_create): the blocks are split into stages x chunks virtual stages
 * (as even as the layer count allows, earlier stages taking the extra blocks, or an
 * explicit split), every stage's instruction list is built by the sched plugin (or given
 * ready, as a Lua schedule's are: core/lua/lua_sched.c), validated and simulated (core/train/schedule.h: no missing transfer, no deadlock), and checked
 * against the transport: send/recv between two ranks has no tags, so the messages each
 * ordered pair exchanges must be received in the order they are sent. The simulator's
 * peak in flight sizes the activation slots (one set per (micro-batch, chunk) held from
 * its FWD until its weight gradients, BWD or BWD_WEIGHT, plus one).
 * The step (loom_pipeline_run) executes this rank's list: FWD/BWD on the chunk's blocks, or
 * the split backward (BWD_INPUT, then SEND_GRAD; BWD_WEIGHT later: gpt_stage.h),
 * activations and their gradients sent and received over the pp group (a SEND is started
 * and waited only before its buffer is reused or at the end of the step; a RECV is waited
 * at once), the per-micro-batch losses on the last stage.
 * After the data-parallel sync the tied wte's two gradient halves (embedding on stage 0,
 * LM head on the last) are exchanged whole and added, a + b on both: bitwise equal copies.
 * Canonical mode (every stage backwarding each chunk's micro-batches in order 0..m-1, as
 * the four plugins do; B's and W's alike): each micro-batch's gradients are summed in
 * grad_sync's tree over the global micro-batch index, as on one rank (with chunks > 1 a
 * tree per chunk's parameters, loom_pipeline_chunk_ranges); the last stage sends each
 * micro-batch's LM head half of the wte gradient to stage 0, which adds it to its embedding
 * half (head + emb, one rank's one add, gpt_internal.h) before the tree (with chunks > 1
 * after the list: tied_exchange), and after the step sends the finished wte gradient back;
 * the norm adds every chunk's sums in virtual-stage order, one rank's order. So pp = 1, 2,
 * 4, with dp, give the same bits.
 * Under sequence parallelism the activations and gradients that cross stages are each tp
 * rank's shard of the rows (loom_gpt_stage_rows), between the same tp ranks of two stages.
 * On a transport whose sends wait for their receivers (LOOM_COMM_P2P_RENDEZVOUS: nccl), or
 * with LOOM_PP_GROUPED=1, each run of consecutive transfers is posted as one group
 * (p2p_group_start) and waited before the next compute: the simulator's rendezvous mode,
 * which the lists are checked under at create.
 */
#ifndef LOOM_CORE_TRAIN_PIPELINE_H
#define LOOM_CORE_TRAIN_PIPELINE_H

#include "loom/plugin.h"
#include "base/backend.h"
#include "model/gpt.h"

typedef struct loom_pipeline_config {
    const loom_plugin_desc *sched; /* a sched plugin */
    int microbatches, chunks;      /* chunks: virtual stages per rank (1 without interleaving) */
    int layers;
    const int *split;              /* blocks per virtual stage (stages x chunks), or NULL */
    int n_split;
    int canonical;                 /* deterministic = "canonical" (see below) */
    /* Lists given ready (a Lua schedule): used instead of sched's build(), with the same
     * checks after it; shape must match (stages, microbatches, chunks). Not owned: only
     * read during create. name: the schedule's, for messages. */
    const struct loom_schedule *lists;
    const char *name;
    /* 1: the LM head is its own weight (loom.llama's default), not the tied wte: no wte
     * gradient halves cross from the last stage to the first. */
    int untied;
    /* The default split (no split given) balances these (pipeline_split.h): each block's
     * cost [layers] (NULL: equal), the embedding's on the first virtual stage and the LM
     * head and loss's on the last (gpt_cost.h gives FLOPs per token). Read during create. */
    const double *layer_cost;
    double first_cost, last_cost;
    /* The model's backend (not owned; outlives the pipeline), NULL: host memory. With a
     * device backend (loom_backend_device_memory) the engine's copies of the model's values
     * (the wte halves) are its allocations, written by its ops, and every message of the
     * model's buffers goes over the pp group loom_host.device_group gives (nccl, or the host
     * communicator staged through host memory: dist.h); the loss and norm sums stay on the
     * host group. */
    const loom_backend *backend;
} loom_pipeline_config;

/* Called around each BWD or W (the weight gradients) of (micro-batch, chunk) (canonical
 * mode: zero the gradients, then push them into the micro-batch tree, grad_sync.h; with
 * chunks > 1 only the chunk's parameters, loom_pipeline_chunk_ranges). NULL members:
 * nothing. */
typedef struct loom_pipeline_hooks {
    loom_status (*before_bwd)(void *ctx, int mb, int chunk);
    loom_status (*after_bwd)(void *ctx, int mb, int chunk);
    void *ctx;
    /* Fast mode's data-parallel overlap: on = 1 just before the chunk's last BWD or W of
     * the list (its parameters' gradients are final as it ends), on = 0 just after it. */
    loom_status (*final_bwd)(void *ctx, int chunk, int on);
    /* Just before each BWD_INPUT (B), which in fast mode adds the layer norms' gradients
     * into the buffer (ZeRO-2's reduce-scatters still in flight wait for it). */
    loom_status (*before_input)(void *ctx, int mb, int chunk);
} loom_pipeline_hooks;

typedef struct loom_pipeline loom_pipeline;

/* Needs the pp group (loom_core_host()->group) of more than one rank. */
loom_status loom_pipeline_create(const loom_pipeline_config *cfg, loom_pipeline **out);
void loom_pipeline_destroy(loom_pipeline *pl);

/* For loom_gpt_parallel: the blocks this rank holds ([layers]) and the activation sets. */
const unsigned char *loom_pipeline_stage_layers(const loom_pipeline *pl);
int loom_pipeline_slots(const loom_pipeline *pl);
int loom_pipeline_stage(const loom_pipeline *pl);
int loom_pipeline_stages(const loom_pipeline *pl);
/* Spans of every instruction of a step go to tr (trace.h; not owned, NULL: off). */
struct loom_trace;
void loom_pipeline_set_trace(loom_pipeline *pl, struct loom_trace *tr);
/* The last loom_pipeline_run's time in compute (FWD, BWD, BWD_INPUT, BWD_WEIGHT) and its
 * wall time (first instruction to the last send completed), in ms: the measured bubble's
 * parts (session.c). */
void loom_pipeline_timing(const loom_pipeline *pl, double *compute_ms, double *wall_ms);
/* The same compute's CPU time in ms (this process, loom_cpu_ms): a stage's cost on a
 * loaded machine, where its wall time includes waiting for a core. */
double loom_pipeline_compute_cpu_ms(const loom_pipeline *pl);
/* The block split: virtual stage k (chunk c of rank r is k = c * stages + r) holds blocks
 * [first[k], first[k+1]); *n_virtual = stages * chunks. */
const int *loom_pipeline_split(const loom_pipeline *pl, int *n_virtual);
int loom_pipeline_chunks(const loom_pipeline *pl);
/* The ranges of this rank's parameter table (t: the model's) that chunk `chunk` owns, as
 * [off[i], off[i] + n[i]) of the gradient buffer, at most 4; returns how many. A block's
 * entries go with the chunk holding the block; wte, wpe and ln_f (no block) with the chunk
 * holding the embedding (virtual stage 0) on stage 0, the head (the last) elsewhere.
 * Canonical mode with chunks > 1: wte is part `chunks` on stage 0 (the hooks get it with
 * chunk -1, for each micro-batch after the list) and in no part on the last stage. */
int loom_pipeline_chunk_ranges(const loom_pipeline *pl, const loom_param_table *t, int chunk,
                               size_t off[4], size_t n[4]);
/* 1 if this rank's list splits its backward (B, then W: loom_gpt_parallel.split_backward). */
int loom_pipeline_split_backward(const loom_pipeline *pl);

/* One step's forward and backward over `microbatches` micro-batches: tokens and targets
 * hold them one after another (B*T each, host). loss[mb] gets each micro-batch's loss sum
 * on the last stage, 0 elsewhere. *peak: the most (micro-batch, chunk) activation sets
 * held at once during the step (the engine's own count). */
loom_status loom_pipeline_run(loom_pipeline *pl, loom_gpt *m, const int *tokens,
                              const int *targets, int B, int T, float dloss, double *loss,
                              const loom_pipeline_hooks *hooks, int *peak);
/* Add the other copy's wte gradient (stage 0 and the last stage; others return at once). */
loom_status loom_pipeline_tied_sync(loom_pipeline *pl, loom_gpt *m, double *comm_ms);
/* v[0..n) summed over the stages in stage order (every rank gets the same bits). */
loom_status loom_pipeline_sum(loom_pipeline *pl, double *v, int n);
/* The gradient norm's square over all stages: every stage's chunk sums (grad_norm.h, in
 * the order of t's entries) gathered and added in virtual-stage order (each chunk's
 * entries as loom_pipeline_chunk_ranges assigns them), one rank's order; *nonfinite ORed. */
loom_status loom_pipeline_norm(loom_pipeline *pl, const loom_param_table *t, const double *slots,
                               size_t n, double *norm_sq, int *nonfinite);
/* The same with this stage's slots already in one rank's order (n of them, chunk by
 * chunk, chunk_slots[c] in chunk c; NULL with one chunk a stage): expert parallelism's,
 * every ep rank's experts in place (session_ep.h). */
loom_status loom_pipeline_norm_order(loom_pipeline *pl, const double *order, size_t n,
                                     const size_t *chunk_slots, double *norm_sq, int *nonfinite);
/* The chunk of this stage that holds entry e (the norm's: the embeddings with the first
 * virtual stage, ln_f and a tied copy with the last), -1 if none. */
int loom_pipeline_entry_chunk(const loom_pipeline *pl, const loom_param_entry *e);
/* The loss sum of one batch through every stage's forward (no gradients); the same on
 * every rank of the pp group. targets NULL: the forward alone (sampling: the last stage
 * keeps the logits in slot 0), sum 0. */
loom_status loom_pipeline_eval(loom_pipeline *pl, loom_gpt *m, const int *tokens,
                               const int *targets, int B, int T, double *loss_sum);
/* Sampling with a key/value cache: row t of token's sequence through every stage, each
 * stage's blocks reading the keys and values their own layers kept (gpt_stage.h,
 * loom_gpt_stage_decode), one row (dim floats) sent between stages; the logits row on the
 * last stage. Needs a loom_pipeline_eval with B = 1 and no targets over rows 0..t-1 first
 * (or the decodes of them): the cache lives in slot 0. Collective over the pp group. */
loom_status loom_pipeline_decode(loom_pipeline *pl, loom_gpt *m, int token, int t);

#endif
