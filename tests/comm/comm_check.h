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

/* This rank's input element i as f32/bits — exposed for tests that build their own cases. */
void cc_fill(loom_dtype dt, unsigned salt, int rank, size_t first, size_t count, void *dst);

#endif
