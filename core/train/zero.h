/* zero.h — ZeRO stages 1, 2 and 3 over the data-parallel group (Rajbhandari et al. 2020).
 *
 * Partitions: the flat buffer [0, total) is padded to P, a multiple of U*N (U = 16 floats,
 * the parameter table's alignment; N = dp ranks), and tiled by buckets: fixed offset ranges
 * of about bucket_mb, each a multiple of U*N long, plus a tail bucket of U*N elements that
 * holds the end of the buffer when total is not a multiple of U*N. Each bucket is cut into
 * N equal sub-blocks; rank r's partition is its sub-block of every bucket, P/N elements in
 * all, the same count on every rank whatever total is (the padding past total is nobody's
 * parameter). A parameter that straddles a sub-block boundary is split there: the optimizer
 * gets one segment per (parameter, sub-block) piece, with the parameter's decay rule.
 *
 * Stage 1: gradients are reduced as without ZeRO (the dp plugin's all-reduce; canonical
 * mode's fixed tree), each rank steps the optimizer over its partition only (AdamW m and v
 * exist for P/N elements), then every bucket's parameters are all-gathered in place.
 * Stage 2 (fast mode): during every micro-batch's backward, each bucket is reduce-scattered
 * as soon as backward has finished it (overlapped like dp's buckets); this rank keeps only
 * its partition's gradient (P/N floats, accumulated over micro-batches). The model's
 * backward still writes into its full-size gradient buffer: on host memory the pages of a
 * bucket are handed back to the OS (madvise MADV_DONTNEED) once its reduce-scatter has read
 * them, so that buffer is address space, resident only for the buckets backward has
 * written and not yet reduced; loom_zero_memory reports the measured resident peak.
 * Stages 2 and 3 under canonical mode run stage 1's reduction: the fixed tree sums whole
 * per-micro-batch gradients, so there is no gradient memory to save there; the bits are
 * the point of that mode.
 * Stage 3 (zero_params.c): the parameters are partitioned too; stage 2's gradient path;
 * buckets follow the model's units, gathered before use and released after.
 * The global gradient norm and the non-finite check span all partitions (stage 1: the
 * unchanged full-buffer norm; stage 2: partition sums exchanged over dp, then tp).
 * Under expert parallelism: the dense entries' state (and stage 2's gradients, stage 3's
 * parameters) is partitioned over dp, the experts' over their edp group, each packed; this
 * rank's partition is both (zero_ep.c; stage 2's reduce-scatters: zero_ep_reduce.c; stage
 * 3's gathers: zero_ep_params.c).
 */
#ifndef LOOM_CORE_ZERO_H
#define LOOM_CORE_ZERO_H

#include "loom/plugin/optim.h"
#include "model/gpt.h"

typedef struct loom_zero loom_zero;

/* Bytes this rank holds, by category (loom_zero_memory and the session's accounting). */
typedef struct loom_memory {
    size_t params;        /* persistent parameter storage (stage 3: the partition) */
    size_t params_offloaded; /* stage 3, offload params = true: the partition, held by the
                              * offload (offload.h: host pool or file) */
    size_t params_peak_resident; /* stage 3: measured resident peak of the model's
                                  * full-size parameter buffer (0: not measured) */
    size_t grads;         /* persistent gradient storage */
    size_t grads_peak_resident; /* stages 2 and 3: measured resident peak of the model's
                                 * transient full-size gradient buffer (0: not measured) */
    size_t optimizer;     /* optimizer state resident here (offload: its chunk buffers) */
    size_t optimizer_offloaded; /* optimizer state held off it (offload.h: host pool or file) */
    size_t master;        /* fp32 master weights (0: the parameters are fp32) */
    size_t activations;   /* activations and backward scratch */
    size_t comm;          /* communication buffers (staging, canonical-mode sums) */
    size_t widen;         /* 16-bit weights: the fp32 scratch a block's (or a slice of the
                           * head's) weights are widened into before use (gpt.h) */
    size_t saved;         /* of activations: what the kept blocks save for backward, in
                           * its storage (2 bytes a value with 16-bit activations; gpt.h) */
    size_t teacher_activations; /* an in-process teacher's activations (distillation; 0: none
                                 * here), not counted in activations */
    size_t teacher_params; /* its fp32 parameters on this rank (its tp slice, its teacher.pp
                            * stage's blocks; 0: no teacher here), not counted in params */
    size_t teacher_grads;  /* its gradient buffer: 0, the teacher is frozen (gpt.h: no
                            * gradients); kept so a layout that had one would show it */
    size_t distill;        /* distillation's own buffers here: the session's (the step's
                            * teacher rows under pp, teacher.tp's gathered rows, the terms'
                            * step rows), the student's terms' (loom_gpt_distill_bytes), a
                            * teacher.tp group's (loom_kd_group_bytes), a cache's rows */
} loom_memory;

typedef struct loom_zero_config {
    int stage;            /* 1, 2 or 3 */
    double bucket_mb;     /* bucket size in MiB */
    int canonical;
    int accum;            /* micro-batches per rank and step (stage 2 stages the later ones) */
    uint32_t state_slots; /* optimizer state floats per parameter */
    float weight_decay;
    int decay_all;
    int offloaded;        /* 1: the offload (offload.h) holds the state; none allocated here */
    struct loom_ep *ep;   /* expert parallelism (session_ep.h), or NULL: stage 1 partitions
                           * the dense entries over dp and the experts' over the edp group
                           * (the dp ranks holding the same experts; zero_ep.c) */
    int params_offloaded; /* stage 3: the offload holds the parameter partition too
                           * (loom_zero_attach_params); none allocated here */
    int master16;         /* the model computes on a 16-bit copy (gpt.h): stages 1 and 2
                           * partition the fp32 master too (zero_master.c) */
    int undrawn;          /* stage 3: the model was created undrawn (gpt.h
                           * loom_gpt_parallel.undrawn): each rank draws its partition of
                           * the initial values for `seed` (partitioned construction) */
    uint64_t seed;
    int whole_grads;      /* stages 2, 3 on a device: the model's gradient buffer allocated
                           * whole, not sparse (zero_sparse.c): gradient compression
                           * accumulates and exchanges all of it (loom_zero_take_reduced) */
} loom_zero_config;

/* P: `total` floats padded to a multiple of 16 x n (n dp ranks); every rank's partition is
 * P / n floats (the session's accounting and loom plan use this one formula). */
size_t loom_zero_padded(size_t total, int n);

/* Needs dp > 1 (the caller runs without ZeRO on one rank). Stage 3 installs the model's
 * parameter hook (gpt.h). */
loom_status loom_zero_create(const loom_zero_config *c, loom_gpt *m, loom_backend *be,
                             loom_zero **out);
void loom_zero_destroy(loom_zero *z);

/* The optimizer's segments over this rank's partition, and the state behind them. */
const loom_optim_segment *loom_zero_segments(const loom_zero *z, size_t *n);
float *loom_zero_state(loom_zero *z, size_t *floats);
/* On a device backend (zero_device.c) the segments point into the backend's memory and
 * loom_zero_state gives the state's host mirror (stage 3: loom_zero_read_part_params and
 * loom_zero_load_params_dst the parameter partition's): to_host copies the partition's
 * state (and parameters) into them, from_host back (no-ops on host memory); device: 1
 * there. */
void loom_zero_to_host(loom_zero *z);
void loom_zero_from_host(loom_zero *z);
/* Stage 3 on a sparse device buffer (zero_sparse.c): the session's host mirror of the model's
 * parameter buffer to (to_host = 1) or from it: the units whose range is committed copied,
 * the rest zeros on the host and left alone on the device (decommitted memory is never
 * touched; a unit is gathered whole before use). 0: not sparse, the caller copies it all. */
int loom_zero_params_mirror(loom_zero *z, float *host, int to_host);
int loom_zero_device(const loom_zero *z);
/* Each segment's state offset in the partition's state (floats), for the offload; the
 * state itself is NULL when the config said offloaded. */
const size_t *loom_zero_state_offsets(const loom_zero *z);
/* 1 when ZeRO reduces the gradients itself (stage 2 in fast mode). */
int loom_zero_reduces(const loom_zero *z);
/* Stage 2: the grad-sync reducer hooks (grad_sync.h). */
loom_status loom_zero_begin_micro(void *z, int a);
loom_status loom_zero_grads_ready(void *z, size_t offset, size_t n);
loom_status loom_zero_finish_micro(void *z);
/* Stages 2 and 3 when gradient compression (compress.h) replaced the step's
 * reduce-scatters: the model's buffer holds the whole reduced gradient on every rank;
 * copy this rank's partition out of it (a no-op below stage 2). */
loom_status loom_zero_take_reduced(loom_zero *z);
/* Under pp on a stage that holds the tied wte (table entry `entry`): stage 2 holds the
 * buckets below the wte's end out of the per-micro-batch reduction (they accumulate in
 * the full buffer until the wte halves are exchanged, then loom_zero_reduce_held reduces
 * them); skip = 1 (the last stage) leaves the wte out of loom_zero_norm. */
void loom_zero_tied(loom_zero *z, int entry, int skip);
/* Stage 2 (and 3) under pp: the reduce-scatters still in flight waited for (the last
 * backward's, unless they are done), then the held buckets reduced; every pp step calls it
 * before the norm, held buckets or not. */
loom_status loom_zero_reduce_held(loom_zero *z);
/* Under pp, fast mode (on = 1; host memory, no ep: otherwise each backward's end waits as
 * before): a backward's end (loom_zero_finish_micro) starts the buckets still to go and
 * leaves the last ones in flight over the instructions that write no gradient; they are
 * waited for at the next loom_zero_begin_micro, loom_zero_wait_reduces (before a B: in
 * fast mode it writes the layer norms' gradients) or loom_zero_reduce_held.
 * LOOM_ZERO_PP_WAIT=each (session.c) keeps on = 0: the A/B of the overlap, same bits. */
void loom_zero_pipelined(loom_zero *z, int on);
loom_status loom_zero_wait_reduces(loom_zero *z);
/* reduce_scatter spans on the trace's dp lane (trace.h; NULL: off), each from the first
 * bucket a backward started to the wait for its last; labelled with the micro-batch and
 * chunk given (begin_micro labels its own index, chunk 0; the pp engine's hook the
 * schedule's). */
struct loom_trace;
void loom_zero_set_trace(loom_zero *z, struct loom_trace *tr);
void loom_zero_trace_label(loom_zero *z, int mb, int chunk);
/* Stage 2: the global squared gradient norm and non-finite flag over all partitions. */
loom_status loom_zero_norm(loom_zero *z, double *norm_sq, int *nonfinite, double *comm_ms);
/* The last loom_zero_norm's first parameter-table entry whose gradient piece on this rank
 * holds an inf or nan, or -1 (what a non-finite report names: nonfinite.h). */
int loom_zero_first_nonfinite(const loom_zero *z);
/* The parameter-table entry of each of loom_zero_segments' segments. */
const int *loom_zero_segment_entries(const loom_zero *z);
/* After the optimizer step: every rank's updated partition into every rank's parameters
 * (stages 1 and 2; with master16, rounded to 16 bits into the model's compute copy and
 * all-gathered there: zero_master.c). */
loom_status loom_zero_gather_params(loom_zero *z, double *comm_ms);
/* 1 when this rank keeps only its partition of the fp32 parameters (stage 3, and stages 1
 * and 2 with master16): checkpoints write and read them as slices (zero_ckpt.h). */
int loom_zero_params_parted(const loom_zero *z);
/* Stages 1 and 2 with master16 (zero_master.c; no-ops otherwise): gather writes every
 * rank's fp32 master partition into the model's fp32 buffer, so it holds the whole master
 * as with LOOM_ZERO_MASTER=whole (a collective over dp: every rank calls it, as every rank
 * runs the recipe); release hands that buffer's pages back to the OS again. For a reader of
 * the whole fp32 master (llm.c save, export_safetensors), between the two. */
loom_status loom_zero_master_gather(loom_zero *z);
void loom_zero_master_release(loom_zero *z);
/* Stages 1 and 2 with master16 (a no-op otherwise): the elements [lo, hi) of the model's
 * fp32 buffer read whole by the passes on every rank (the distillation projections,
 * gpt_distill_hidden.c). The buckets covering them are all-gathered in fp32 now and after
 * every step and load (each rank's values from its partition: the bits of the master
 * whole) and their pages are kept; loom_zero_memory counts them with the master. A
 * collective over dp: every rank calls it with the same range. */
loom_status loom_zero_keep_master(loom_zero *z, size_t lo, size_t hi);
/* After a load wrote this rank's partition of the parameters: stage 1/2 with master16
 * all-gathers the compute copy from it (a collective over dp); stage 3 marks the units
 * stale. */
loom_status loom_zero_params_loaded(loom_zero *z);
/* After something wrote the model's whole fp32 buffer on every rank alike (an llm.c
 * file): stage 1/2 with master16 takes this rank's partition out of it, rounds the
 * compute copy from it and releases its pages again; a no-op otherwise. will_write, before
 * that write: on a sparse device buffer (zero_sparse.c) commits the whole of it. */
loom_status loom_zero_params_will_write(loom_zero *z);
loom_status loom_zero_params_written(loom_zero *z);
/* Stage 3 (zero_params.c; no-ops below it): before the optimizer step, complete the
 * gathers in flight (they read the partition the step rewrites); after it, mark every
 * unit stale; pin = 1 gathers every unit and keeps it (sampling's decode reads them all
 * without hooks), 0 releases them; the milliseconds the hooks spent communicating. */
loom_status loom_zero_settle(loom_zero *z);
void loom_zero_params_stale(loom_zero *z);
loom_status loom_zero_pin_params(loom_zero *z, int pin);
double loom_zero_take_comm_ms(loom_zero *z);
int loom_zero_stage(const loom_zero *z);
/* Stage 3 with params offloaded (zero_params_store.c): each segment's place in the
 * parameter partition (floats), and the partition's length, for the offload's create;
 * then attach moves this rank's partition of the model's initial values (every rank drew
 * them alike) into the offload and releases the model buffer's pages. From then on each
 * unit's gather reads its partition out of the offload into a staging buffer freed when
 * the gather completes, and the optimizer steps the parameters in the offload (a
 * checkpoint load writes it there: zero_ckpt.h). */
const size_t *loom_zero_param_offsets(const loom_zero *z);
size_t loom_zero_part_floats(const loom_zero *z);
struct loom_offload;
loom_status loom_zero_attach_params(loom_zero *z, struct loom_offload *o);
/* Stage 3: this rank's parameter partition for a save: the partition itself, or (params
 * offloaded) a copy read out of the offload into *owned, which the caller frees; NULL
 * below stage 3. */
loom_status loom_zero_read_part_params(loom_zero *z, const float **out, float **owned);
/* ZeRO's own buffers: grads (stage 2 partition), optimizer state, comm staging; and the
 * measured resident peak of the full gradient buffer (stage 2). */
void loom_zero_memory(const loom_zero *z, loom_memory *out);

#endif
