/* comm_check.h — run one communicator operation on every rank of a communicator and check
 * this rank's result against a reference computed here, element by element, bit for bit.
 *
 * What: deterministic inputs (a hash of salt, rank, index) of every dtype, and an
 * independent reference for each op: sums in rank order 0..n-1 (so f32 must match
 * bitwise), bf16/f16 summed in f32 and rounded once, round-to-nearest-even (bf16 by
 * comparing the two neighbours in double, f16 by the compiler's _Float16 conversion), i32
 * wrapping, u8/u16 wrapping, avg truncating toward zero for integers.
 * What not: no timing, no process control (comm_harness does that). Runs inside a rank.
 * Invariants: every rank must call the same sequence of cc_run() (they are collectives);
 * a failure returns 1 with a message naming op, dtype, count and the first bad element.
 */
#ifndef LOOM_TEST_COMM_CHECK_H
#define LOOM_TEST_COMM_CHECK_H

#include <stddef.h>

#include "loom/plugin/comm.h"

typedef enum cc_op {
    CC_ALLREDUCE,
    CC_ALLREDUCE_INPLACE,
    CC_REDUCE_SCATTER,
    CC_ALLGATHER,
    CC_ALLGATHER_INPLACE,
    CC_BROADCAST,
    CC_ALLTOALL,
    CC_ALLTOALLV,
    CC_SENDRECV,
    CC_BARRIER,
    CC_N_OPS
} cc_op;

typedef struct cc_case {
    cc_op op;
    loom_dtype dt;
    loom_reduce_op red; /* reductions only */
    size_t count;
    unsigned salt;
} cc_case;

const char *cc_op_name(cc_op op);

/* Run k on (ops, comm); 0 if this rank's result is right, else 1 and a message in err. */
int cc_run(const loom_comm_ops *ops, void *comm, const cc_case *k, char *err, size_t cap);

/* Every op x every dtype (and sum/avg/max for reductions) x each of sizes. Returns 0 or 1
 * with the first failure in err; where tags the message (e.g. "group even"). */
int cc_run_all(const loom_comm_ops *ops, void *comm, const size_t *sizes, int n_sizes,
               unsigned salt, const char *where, char *err, size_t cap);

/* Memory every rank of a communicator sees at the same address (MAP_SHARED before the
 * fork), for the expected outputs that are the same on every rank (allreduce, allgather):
 * each rank computes 1/n of them into it, a barrier of the communicator under test, then
 * every rank checks its whole output against it, instead of every rank computing all of
 * it. Two halves, used in turn (seq counts the cases, the same on every rank), so one
 * barrier a case is enough. Ranks of one communicator share one cc_share's memory. */
typedef struct cc_share {
    void *mem;
    size_t bytes;
    unsigned seq;
} cc_share;

/* cc_run with a share (NULL: as cc_run). */
int cc_run_shared(const loom_comm_ops *ops, void *comm, const cc_case *k, cc_share *share,
                  char *err, size_t cap);

/* As cc_run_all with one size, for a plugin that moves the blocked ops (reduce_scatter,
 * alltoall, alltoallv: n blocks of count a rank) in rounds of chunk / n bytes a block, as
 * loom-comm-shm does (chunk = its chunk_bytes): those get 3 rounds + 3 elements a block
 * (four rounds, so a call reuses a staging slot, and a ragged last one) instead of size,
 * whose cost grows as n^2 x size while the rounds are all alike. share: NULL, or the
 * memory for the shared expected outputs (cases that do not fit compute their own). */
int cc_run_sweep(const loom_comm_ops *ops, void *comm, size_t size, size_t chunk, unsigned salt,
                 cc_share *share, const char *where, char *err, size_t cap);

/* This rank's input element i as f32/bits — exposed for tests that build their own cases. */
void cc_fill(loom_dtype dt, unsigned salt, int rank, size_t first, size_t count, void *dst);

#endif
