/* session.h — one training run on one rank: the model, its optimizer and precision
 * policy, and the step that ties them together.
 *
 * A step runs `accum` micro-batches of (B,T) per data-parallel rank through forward and
 * backward; the loss gradient is scaled once by 1/(global token count), so the result is
 * one global token-sum divided once, never a mean of means. Every rank reads every
 * micro-batch of the global batch from its data source (so all positions stay in step)
 * and computes its own contiguous block of them. Then it checks for
 * non-finite losses and gradients (every rank agreeing on the first: nonfinite.h), skips
 * or stops as cfg says, clips by global norm and calls the optimizer over one segment
 * per parameter entry. This is the imperative API under loom.train.
 */
#ifndef LOOM_CORE_SESSION_H
#define LOOM_CORE_SESSION_H

#include "base/config.h"
#include "model/gpt.h"
#include "nonfinite.h"
#include "zero.h"

/* Fills tokens and targets (B*T each, host memory) with the next micro-batch. */
typedef loom_status (*loom_batch_fn)(void *ctx, int *tokens, int *targets, int B, int T);

typedef struct loom_session_config {
    loom_gpt_config model;
    int micro_batch;           /* B */
    int seq;                   /* T */
    int accum;                 /* micro-batches per optimizer step */
    uint64_t seed;
    float grad_clip;           /* clip the global grad norm to this; 0: off */
    int stop_on_nonfinite;     /* on_nonfinite = "stop": a non-finite step fails the run
                                * (nothing applied); 0: "skip" the update on every rank */
    const char *backend;       /* "cpu" */
    int threads;               /* 0: all cores */
    const loom_plugin_config *optim;      /* resolved configs (see config.h) */
    const loom_plugin_config *precision;
    const loom_plugin_config *strategy;   /* the dp strategy when dp > 1, else NULL */
    const loom_plugin_config *tensor;     /* the tp strategy when tp > 1, else NULL */
    int canonical;                        /* deterministic = "canonical" (grad_sync.h) */
    /* Pipeline parallelism, used when the pp group has more than one rank (pipeline.h):
     * accum is then the micro-batches per step of each pipeline (schedule's microbatches). */
    const loom_plugin_desc *schedule;     /* the sched plugin, or NULL with schedule_lists */
    const struct loom_schedule *schedule_lists; /* every stage's list given ready (a Lua
                                           * schedule, schedule.h); read during create only */
    const char *schedule_name;            /* schedule_lists' name, for messages */
    int pp_chunks;                        /* virtual stages per rank; 0 = 1 */
    const int *pp_layers;                 /* blocks per (virtual) stage, or NULL: even */
    int n_pp_layers;
    /* Activation recomputation (loom_gpt_parallel.recompute): LOOM_RECOMPUTE_*, and with
     * LOOM_RECOMPUTE_LAYERS one flag per block (1: recomputed fully). */
    int recompute;
    const unsigned char *recompute_layers;
    /* ZeRO (zero.h): stage 0 (none), 1, 2 or 3 over the dp group; bucket MiB (0: 25). */
    int zero_stage;
    double zero_bucket_mb;
    /* Offload (offload.h): the optimizer state on the host or disk; mode 0: none. */
    int offload_mode;                     /* loom_offload_mode */
    const char *offload_path;             /* disk: a directory (copied) */
    double offload_chunk_mb;              /* 0: 64 */
    int offload_params;                   /* 1: zero=3's parameter partition offloaded too */
    /* Gradient compression over the dp group (compress.h): method 0 (none), onebit, topk. */
    int compress_method;                  /* loom_compress_method */
    double compress_ratio;                /* topk: fraction of each bucket sent */
    int64_t compress_warmup;              /* uncompressed steps first */
    double compress_bucket_mb;            /* 0: 4 */
    int compress_rank;                    /* powersgd: the rank r */
    int compress_momentum;                /* 1-bit Adam: exchange adamw's momentum, its
                                           * variance frozen after the warm-up */
    /* Distillation (model/gpt_distill.h): a frozen teacher run forward only, in this
     * process, on this rank's micro-batches; NULL: none. Its weights come from
     * teacher_init (an llm.c file) or teacher_checkpoint (a loom checkpoint directory). */
    const loom_gpt_config *teacher;
    const char *teacher_init, *teacher_checkpoint; /* read during create only */
    float kd_temperature, kd_alpha;
    /* hidden-state terms (gpt_distill.h): kd_layers[l] = the teacher block student block l
     * is compared with (-1: none; model.layers entries; model.kd_proj_* name the student's
     * projections), weighed by kd_hidden; NULL: none */
    const int *kd_layers;
    float kd_hidden;
    float kd_attention; /* > 0: the attention-probability term's gamma on the same pairs */
    const char *kd_cache; /* or the teacher's top-k logits from this file (kd_cache.h), read
                           * instead of a teacher model (teacher NULL) */
    int kd_teacher_tp;    /* teacher.tp: 0 or 1 replicated; mesh.tp: split over the tp group;
                           * with tp = 1 a divisor of dp: over groups of dp ranks (kd_group.h) */
    int kd_teacher_pp;    /* teacher.pp: 0 or 1 whole on the last stage; mesh.pp: its blocks
                           * split over the student's pipeline stages (session.c) */
    /* Expert parallelism (session_ep.h): a MoE model's experts split over ep of the dp
     * ranks; 0 or 1: none. */
    int ep;
} loom_session_config;

typedef struct loom_step_stats {
    int64_t step;          /* optimizer steps taken so far, this one included */
    double loss;           /* mean token loss of the step */
    double grad_norm;      /* global L2 norm before clipping */
    float lr;
    double ms;             /* wall time of the step */
    double comm_ms;        /* of which inside communication: tensor-parallel exchanges,
                            * the data-parallel gradient sync, the grad-norm exchange */
    double tokens;         /* tokens processed in the step */
    int skipped;           /* 1 if the update was skipped (non-finite gradients, or a spike) */
    int spike;             /* 1 if skipped for a loss spike (loom_session_limit_next_step) */
    float loss_scale;      /* the precision plugin's loss scale after this step (the next
                            * step's): 1 but under fp16's dynamic loss scaling */
    int inflight;          /* pipeline: this rank's peak micro-batches in flight (0 without) */
    loom_nonfinite_report nonfinite; /* where a non-finite loss or gradient was found */
    double bubble;         /* pipeline: the measured bubble of the step's pipeline phase,
                            * 1 - (every stage's F/B/W time) / (stages x the longest stage's
                            * phase), the same on every rank; NAN without a pipeline */
    double stage_cpu_ms;   /* pipeline: this rank's CPU ms in F/B/W this step; NAN without */
    double compress_bytes; /* compression: this rank's compressed message this step (what it
                            * sends into the all-gather; 0 in the warm-up) */
    double grad_bytes;     /* compression: the same elements' fp32 bytes (0 without) */
    double compress_expert_bytes; /* under ep: of compress_bytes, the experts' message over
                                   * the edp group (0 in the warm-up, or when edp = 1) */
    double grad_expert_bytes;     /* under ep: of grad_bytes, the experts' (0 without) */
} loom_step_stats;

typedef struct loom_session loom_session;

/* This rank's bytes by category (zero.h's loom_memory), as allocated now. */
void loom_session_memory(loom_session *s, loom_memory *out);
/* The ZeRO stage in effect (0: none, also on one dp rank). */
int loom_session_zero_stage(const loom_session *s);
/* The gradient compression in effect (compress.h), NULL: none. */
struct loom_compress *loom_session_compress(loom_session *s);
/* The distillation teacher model (NULL: none, or a cached teacher): loom distill-cache. */
loom_gpt *loom_session_teacher(loom_session *s);
/* strategy offload's state holder (offload.h), or NULL: checkpoints read and write it. */
struct loom_offload *loom_session_offload_state(loom_session *s);
/* The offload in effect: "none", "host" or "disk". */
const char *loom_session_offload(const loom_session *s);
/* The ZeRO partitions (NULL without ZeRO): checkpoints move them (zero_ckpt.h). */
struct loom_zero *loom_session_zero(loom_session *s);

loom_status loom_session_create(const loom_session_config *cfg, loom_session **out);
void loom_session_destroy(loom_session *s);

loom_status loom_session_step(loom_session *s, loom_batch_fn next, void *ctx, float lr,
                              loom_step_stats *out);
/* The step number the next step's reports and LOOM_INJECT_NONFINITE use (the training
 * loop's, which counts skipped steps too); without it, one more than the last step's. */
void loom_session_number_next_step(loom_session *s, int64_t step);
/* The next step only: skip its update (on every rank alike) when its loss is above loss_max
 * or its gradient norm above norm_max (0: no limit) — a loss spike's "skip". */
void loom_session_limit_next_step(loom_session *s, double loss_max, double norm_max);
/* XXH64 of this rank's parameters and optimizer state (under ZeRO: its partition of them;
 * 0 for no state), e.g. to show that a skipped step changed neither. */
void loom_session_state_hash(loom_session *s, uint64_t *params, uint64_t *optim);
/* Write this rank's timeline to path as a Chrome trace (trace.h) from the next step on,
 * for `steps` steps (0: all); rank names the process. Closed with the session. */
loom_status loom_session_trace(loom_session *s, const char *path, int rank, int64_t steps);
/* Mean token loss over `batches` micro-batches drawn from next. */
loom_status loom_session_eval(loom_session *s, loom_batch_fn next, void *ctx, int batches,
                              double *loss);
/* Generate n_new tokens after the prompt into out (n_prompt + n_new ints, prompt first).
 * temperature > 0; top_k <= 0 means the whole vocabulary. Keyed by seed: reproducible. */
loom_status loom_session_sample(loom_session *s, const int *prompt, int n_prompt, int n_new,
                                float temperature, int top_k, uint64_t seed, int *out);

/* Called after each generated token (done of total); a status other than LOOM_OK stops
 * the generation and is returned. */
typedef loom_status (*loom_sample_progress_fn)(void *ctx, int done, int total);
typedef struct loom_sample_config {
    float temperature;         /* > 0 */
    int top_k;                 /* <= 0: the whole vocabulary */
    uint64_t seed;
    int no_cache;              /* 1: recompute the whole window for every token (the
                                * reference the key/value cache is tested against) */
    loom_sample_progress_fn progress; /* NULL: none */
    void *progress_ctx;
    int shift_window;          /* 1: past ctx, the window restarts at the last ctx/2
                                * tokens and grows again (the cache keeps working: one
                                * ctx/2-row forward per ctx/2 tokens) instead of sliding by
                                * one (a full ctx-row forward per token); other samples */
    uint64_t *logits_hash;     /* if set: XXH64 of every logits row drawn from (V floats
                                * each, in order), so tests compare the paths bit for bit */
} loom_sample_config;
/* loom_session_sample with every knob. With the cache (gpt.h: loom_gpt_decode) each token
 * after the first costs one row's forward instead of the window's, and the tokens are
 * bitwise those of no_cache = 1 (both run the backend's row-stable products while the
 * window starts at position 0: set_deterministic mode 2). Under pipeline parallelism it
 * is collective over the pp group (every stage calls it with the same arguments): each
 * token is a forward through the stages (no cache), the last stage draws it and every
 * stage returns the same tokens (and hash), those of pp = 1. */
loom_status loom_session_generate(loom_session *s, const loom_sample_config *cfg,
                                  const int *prompt, int n_prompt, int n_new, int *out);

/* What a checkpoint holds beyond the parameter and optimizer-state buffers. */
typedef struct loom_session_state {
    int64_t steps;                /* optimizer updates taken */
    float precision_state[4];     /* the precision policy's loss-scale state */
    int n_precision_state;
} loom_session_state;

void loom_session_get_state(loom_session *s, loom_session_state *out);
loom_status loom_session_set_state(loom_session *s, const loom_session_state *st);
/* The resolved optimizer / precision plugin configs the session was made with. */
const loom_plugin_config *loom_session_optim_config(const loom_session *s);

loom_gpt *loom_session_model(loom_session *s);
/* The mixture-of-experts statistics of the training forwards since the last call
 * (loom_gpt_moe_stats), summed over the data-parallel group (collective: every dp rank
 * calls it); *load is out->load, to free. A dense model: layers = 0, *load NULL. */
loom_status loom_session_moe_stats(loom_session *s, loom_moe_stats *out, double **load);
const char *loom_session_backend_description(loom_session *s);
int64_t loom_session_steps_taken(const loom_session *s);
/* Pipeline stages of the run (1 without pipeline parallelism). */
int loom_session_pipeline_stages(const loom_session *s);
/* The pipeline's block split (loom_pipeline_split); NULL and *n_virtual = 0 without one. */
const int *loom_session_pipeline_split(const loom_session *s, int *n_virtual);
/* The optimizer state buffer (state_per_param * params total floats) and its slots, as
 * host memory: the session's own buffer on a host-memory backend; on a device backend its
 * host mirror, current after loom_session_to_host (NULL without state). */
float *loom_session_optim_state(loom_session *s, uint32_t *slots_per_param);
/* The parameters as host memory, as loom_session_optim_state: the model's buffer, or on a
 * device backend the host mirror. */
float *loom_session_host_params(loom_session *s);
/* Device backend: copy the parameters and optimizer state into the host mirrors
 * (before a checkpoint save, an export, a hash), and back after the mirrors were written
 * (a checkpoint load). Host-memory backends: nothing to do. */
void loom_session_to_host(loom_session *s);
void loom_session_from_host(loom_session *s);

#endif
