/* compress.h — lossy compression of the data-parallel gradient exchange, with error
 * feedback (strategy = { compress = { "onebit" | "topk", ... } }, docs/COMPRESS.md).
 *
 * What it does: replaces the dp all-reduce (and ZeRO-2/3's reduce-scatter) of a step's
 * gradient by an all-gather of each rank's compressed gradient; every rank decompresses
 * every rank's message and adds them in rank order, so all ranks get the same sum, the
 * same bits run after run. Error feedback (Seide et al. 2014; Karimireddy et al. 2019,
 * "EF-SGD"): each rank compresses v = g + e, where e is what compression dropped from its
 * earlier messages, and keeps e' = v - C(v) for the next step.
 *
 * Buckets: every parameter-table entry this rank holds (a pipeline stage skips the others)
 * cut into pieces of at most bucket_mb; the padding between entries is never sent.
 *   onebit: per bucket one fp32 scale s = mean |v| and one sign bit per element (1: v >= 0),
 *           decompressed as +s / -s (the scaled sign of EF-signSGD). Message bytes:
 *           sum over buckets of 4 + ceil(n/8).
 *   topk:   per bucket the k = ceil(ratio * n) elements of largest |v| (ties: lower index
 *           first), as k fp32 values and k uint32 indices; the rest count as zero. Message
 *           bytes: sum over buckets of 8 k.
 *   powersgd: rank-r PowerSGD (Vogels et al. 2019) per tensor of two or more dims, seen as
 *           a rows x cols matrix M (cols: its last dim): P = M Q with Q a random cols x r
 *           matrix drawn from the step number (the same on every rank; no warm start), P
 *           summed over ranks and orthonormalised (Gram-Schmidt, columns in order), then
 *           Q = M^T P summed over ranks, and every rank takes P Q^T; two all-gathers. A
 *           tensor where r (rows + cols) >= rows x cols (vectors, small matrices) is sent
 *           whole, fp32. Message bytes: sum of 4 r (rows + cols) + 4 n over the raw ones.
 * A bucket whose gradient holds an inf or nan is sent as nan (so the step's non-finite
 * check fires on every rank) and its residual is left as it was.
 * Canonical mode (cfg.leaves > 0; every method and 1-bit Adam, one rank or dp, any zero,
 * tp, pp incl. interleaved; not ep): what is compressed is each global micro-batch's own
 * gradient, a leaf of canonical mode's tree, with its own residual (leaf i's, whichever rank
 * runs it), so the messages do not depend on which micro-batches share a rank; the buckets
 * are the logical tensors' canonical chunks (compress_canon.c), the same elements in the
 * same order at every tp and pp. Each rank packs its leaves (loom_compress_leaf, or by
 * range for a pipeline chunk), the messages are all-gathered, and every rank decompresses
 * every leaf in the global micro-batch order (loom_compress_decode_leaf) for the caller's
 * tree, or, powersgd, sums its factors over the leaves in two rounds itself
 * (loom_compress_sum_leaves): dp, tp and pp give the same bits. The residual is then one
 * per leaf (leaves x the gradient buffer).
 * Expert parallelism (fast mode; session_ep.h): the compressor over dp takes the dense entries
 * only (an expert's gradient is never the dp group's to sum), and loom_compress_add_experts
 * gives it a second one over the expert-data-parallel group for this rank's expert entries,
 * sharing its residual (the buckets are disjoint): one exchange does both.
 * What it does not: ep in canonical mode; device memory (host loops: a device backend's session stages the
 * gradient through host memory around loom_compress_exchange, grad_sync.c, fast mode only).
 */
#ifndef LOOM_CORE_COMPRESS_H
#define LOOM_CORE_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "loom/plugin/comm.h"
#include "model/gpt.h"

typedef enum loom_compress_method {
    LOOM_COMPRESS_NONE = 0,
    LOOM_COMPRESS_ONEBIT,
    LOOM_COMPRESS_TOPK,
    LOOM_COMPRESS_POWERSGD,
} loom_compress_method;

typedef struct loom_compress_config {
    int method;          /* loom_compress_method */
    double ratio;        /* topk: the fraction of each bucket sent, (0, 1] */
    int64_t warmup;      /* the first `warmup` steps are exchanged uncompressed */
    double bucket_mb;    /* the largest bucket in MiB of fp32 (0: 4) */
    int rank;            /* powersgd: the rank r of each matrix's approximation */
    double momentum;     /* > 0: 1-bit Adam (compress_momentum.c): exchange the momentum
                          * with this beta1, not the gradient; 0: off */
    int leaves;          /* canonical mode: this rank's micro-batches a step (its leaves of
                          * the canonical tree, below); 0: fast mode */
    int skip_tied;       /* canonical mode: leave the tied "wte" out (a pipeline's last stage,
                          * whose copy is replaced by stage 0's after the exchange) */
    int experts;         /* under ep: 1 takes the expert entries only (loom_compress_add_experts
                          * sets it); 0 takes the rest (all of them without ep) */
} loom_compress_config;

typedef struct loom_compress loom_compress;

/* The method's name ("onebit", "topk") to its enum; -1 for another word. */
int loom_compress_method_of(const char *name);
const char *loom_compress_method_name(int method);

/* Buckets over m's parameter table; comm/dp: the data-parallel group of dp_size ranks. */
loom_status loom_compress_create(const loom_compress_config *c, loom_gpt *m,
                                 const loom_comm_ops *comm, void *dp, int dp_size,
                                 loom_compress **out);
void loom_compress_destroy(loom_compress *c);

/* Under ep (fast mode): c (made over dp, so taking the dense entries) also compresses this
 * rank's expert entries over the edp group of edp_size ranks (comm/edp), with its own
 * buckets and messages and c's residual; c's exchange runs it after its own. edp_size < 2:
 * nothing (the experts are then summed nowhere, exactly). */
loom_status loom_compress_add_experts(loom_compress *c, loom_gpt *m, const loom_comm_ops *comm,
                                      void *edp, int edp_size);

/* 1 if the step numbered `step` (1-based) is past the warm-up. */
int loom_compress_active(const loom_compress *c, int64_t step);
/* The step about to be exchanged (powersgd seeds its random Q from it). */
void loom_compress_begin_step(loom_compress *c, int64_t step);
/* Collective over dp: grads (the model's flat buffer, this rank's local sum) becomes the
 * sum over ranks of the decompressed messages on every bucket; the residual is updated. */
loom_status loom_compress_exchange(loom_compress *c, float *grads);

/* 1-bit Adam (compress_momentum.c): the optimizer's first moment m of every bucket,
 * read from AdamW's state (slot 0 of each segment; segments over the gradient buffer
 * grad_base, as the session builds them). Needs cfg.momentum > 0, onebit or topk. */
struct loom_optim_segment;
struct loom_plugin_config;
/* Before the optimizer is made: what 1-bit Adam needs (adamw, fp32, no ZeRO, offload or
 * pp, no gradient clipping) checked, refused naming what is missing; adamw's freeze_variance set to warmup
 * (refused if set to another step). */
loom_status loom_compress_momentum_prepare(struct loom_plugin_config *optim,
                                           const char *precision, int zero, int offload, int pp,
                                           float grad_clip, int64_t warmup);
/* be: the state's backend; a device's: m is read through a host copy, refreshed by
 * loom_compress_momentum_pull (each compressed step, before packing: begin_step). */
struct loom_backend;
loom_status loom_compress_set_momentum(loom_compress *c, const struct loom_optim_segment *seg,
                                       int n_seg, const float *grad_base, struct loom_backend *be);
void loom_compress_momentum_pull(loom_compress *c);
int loom_compress_momentum_on(const loom_compress *c);

/* Canonical mode: pack this rank's micro-batch a (0 .. leaves - 1) from grads (its gradient
 * alone), updating its leaf's residual; after the last, gather every rank's (collective
 * over dp; one rank: nothing to send); then leaf j of the step (0 .. dp x leaves - 1, the
 * global micro-batch order) decompressed into out (the gradient buffer's layout, zero
 * outside the buckets). */
loom_status loom_compress_leaf(loom_compress *c, int a, float *grads);
/* The same for the buckets in [off, off + n) of the buffer only (a pipeline chunk's ranges:
 * under an interleaved schedule each chunk's backward of micro-batch a comes on its own). */
loom_status loom_compress_leaf_range(loom_compress *c, int a, float *grads, size_t off, size_t n);
loom_status loom_compress_gather_leaves(loom_compress *c);
void loom_compress_decode_leaf(const loom_compress *c, int j, float *out);
/* Canonical powersgd: its factors are summed over the leaves in two rounds, so it gathers
 * and sums the leaves itself (sums_leaves 1; sum_leaves: collective over dp, grads, host
 * memory, gets the decompressed sum; be: the trees' backend, device memory or not) instead
 * of decode_leaf per leaf. */
struct loom_backend;
int loom_compress_sums_leaves(const loom_compress *c);
loom_status loom_compress_sum_leaves(loom_compress *c, struct loom_backend *be, float *grads);
/* Canonical 1-bit Adam: after the leaves' tree, the summed momentum into the gradient AdamW
 * turns into it (nothing without momentum). */
void loom_compress_after_sum(loom_compress *c, float *grads);
/* Residual slots this rank holds: leaves in canonical mode, else 1; 1 in canonical mode. */
int loom_compress_residual_slots(const loom_compress *c);
int loom_compress_canonical(const loom_compress *c);

/* Bytes of one rank's message per step (what it sends into the all-gather; it receives
 * dp - 1 such messages; canonical mode: all its leaves'), and the fp32 bytes of the same
 * elements uncompressed. */
size_t loom_compress_message_bytes(const loom_compress *c);
size_t loom_compress_raw_bytes(const loom_compress *c);
/* Of those, the expert part's (loom_compress_add_experts; 0 without). */
size_t loom_compress_expert_message_bytes(const loom_compress *c);
size_t loom_compress_expert_raw_bytes(const loom_compress *c);
/* The residual, laid out as the gradient buffer (total floats; zero outside buckets);
 * canonical mode: its leaves' one after another (leaves x the buffer's floats). */
float *loom_compress_residual(loom_compress *c, size_t *floats);
/* Bytes compression holds (residual, message, gathered messages, scratch). */
size_t loom_compress_buffer_bytes(const loom_compress *c);
int loom_compress_method_in_use(const loom_compress *c);
int loom_compress_dp_size(const loom_compress *c);
int loom_compress_dp_rank(const loom_compress *c);

#endif
