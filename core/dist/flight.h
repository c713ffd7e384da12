/* flight.h — the comm flight recorder: every collective and point-to-point operation of
 * this rank, whatever the comm plugin, in a ring of the last LOOM_FLIGHT_ENTRIES.
 *
 * What: loom_flight_wrap() puts a recording communicator in front of a plugin's one; the
 * mesh's groups (dist.c) are handed out wrapped, so every caller (core and plugins, through
 * loom_host.group) goes through it. Each *_start records (op, group, sequence number,
 * bytes, peer/root, start time) as "started"; a test() that says done, or wait(), marks
 * it "completed", a failed wait "failed".
 * Sequence numbers: collectives are numbered per communicator (#1 is its first), sends
 * and receives per communicator, peer and direction; the same operation has the same
 * number on every rank of a group that issued the same calls, and send #k from a to b is
 * the message b's recv #k from a receives.
 * On the first failed wait (a timeout, a dead peer), or a start the plugin refuses because
 * an earlier failure broke the communicator, the rank dumps its ring to a file
 * (flight-rank<R>.txt in the flight directory) and its tail to stderr, reads the dumps of
 * the other ranks that appear within a short grace period, and names the rank(s) that
 * never reached the operation this rank is stuck in: the same collective, or for a send
 * or recv the peer's matching recv or send (flight_report.c).
 * Debug mode (LOOM_DEBUG_DESYNC=1 or init_dist{debug_desync=true}): before each
 * collective the ranks of its group exchange (op, bytes, seq, root) and stop at the first
 * mismatch naming both ranks and both operations (flight_desync.c).
 * Fault injection (testing aid): LOOM_INJECT_DIE="RANK:OP:N:MODE" makes world rank RANK
 * die at its N-th OP (allreduce, reduce_scatter, allgather, broadcast, alltoall,
 * alltoallv, send, recv, barrier, or any), before starting it; MODE exit (_exit(3)),
 * kill (SIGKILL), segv (SIGSEGV) or stop (SIGSTOP: a stuck rank).
 * What not: no progress of its own, no extra communication outside debug mode; the
 * recorder costs a mutex and a few stores per operation.
 * Invariants: process-global (one mesh per run); entries are overwritten oldest first;
 * the wrapped communicator forwards every call unchanged to the plugin.
 */
#ifndef LOOM_CORE_FLIGHT_H
#define LOOM_CORE_FLIGHT_H

#include "loom/plugin/comm.h"

#define LOOM_FLIGHT_ENTRIES 4096

/* The recording ops table (the same for every wrapped communicator). */
const loom_comm_ops *loom_flight_ops(void);

/* Wrap plugin communicator comm (ops inner) as group `name`, whose members are the world
 * ranks members[0..n) in group order (n = 0: unknown). Takes ownership of comm: the
 * wrapper's destroy destroys it. */
loom_status loom_flight_wrap(const loom_comm_ops *inner, void *comm, const char *name,
                             const int *members, int n, void **out);

/* The same for a communicator that carries device memory only (nccl), beside host_group, a
 * group loom_flight_wrap made with the same members in the same order: the device group's
 * operations are recorded (and reported on a failed wait) like any other, and debug mode's
 * descriptors, host memory, are all-gathered over host_group's plugin communicator. A split
 * of the result is recorded but not desync-checked (no host group beside it). Refused (comm
 * destroyed) when host_group's size or rank differs. */
loom_status loom_flight_wrap_device(const loom_comm_ops *inner, void *comm, const char *name,
                                    const int *members, int n, void *host_group, void **out);

/* Settings from init_dist: the world rank and size, where dumps go (NULL: LOOM_FLIGHT_DIR,
 * else the current directory), debug mode (also on with LOOM_DEBUG_DESYNC=1), the comm
 * timeout (bounds how long a rank waits for the others' dumps). Parses LOOM_INJECT_DIE:
 * a malformed value is refused here, before any training. */
loom_status loom_flight_setup(int rank, int world, const char *dir, int debug_desync,
                              int timeout_ms);

/* ---- shared with flight_report.c / flight_desync.c ---------------------------------- */

enum { FLIGHT_STARTED = 0, FLIGHT_COMPLETED, FLIGHT_FAILED };

typedef struct flight_entry {
    uint64_t id;      /* 1 + the number of operations this rank started before it */
    uint64_t seq;     /* see the sequence numbers above */
    const char *op;   /* static string */
    const char *group;
    int peer;         /* p2p peer or broadcast root in group ranks, else -1 */
    int coll;         /* a collective (else send or recv) */
    int state;
    size_t bytes;
    double t_start, t_end; /* seconds on CLOCK_MONOTONIC; t_end 0 while started */
} flight_entry;

typedef struct flight_group {
    char name[16];
    int n, *members;  /* world ranks, n = 0 when unknown */
    int me;           /* this rank's index in the group */
    int closed;       /* destroyed: left out of dumps, its slot reused */
    uint64_t coll_started, coll_completed;
} flight_group;

/* Write the dump and the verdict for the failure `why` of operation `stuck` on group g;
 * returns a one-line verdict in out (for the error message). Called once per process. */
void loom_flight_report(const flight_group *g, const flight_entry *stuck, const char *why,
                        char *out, size_t cap);
/* Copy the ring, oldest first, into a caller buffer of LOOM_FLIGHT_ENTRIES; returns count. */
int loom_flight_snapshot(flight_entry *out);
/* The groups this rank has wrapped (for the dump's summary lines). */
int loom_flight_groups(const flight_group **out, int cap);
/* The collective descriptors of every rank of g agree, else a named LOOM_ERR_INVALID. */
loom_status loom_flight_check_desync(const loom_comm_ops *inner, void *comm,
                                     const flight_group *g, const char *op, uint64_t seq,
                                     size_t bytes, int root);

/* Settings, for the report. */
typedef struct flight_settings {
    int rank, world, debug_desync, timeout_ms;
    char dir[1024];
} flight_settings;
const flight_settings *loom_flight_settings(void);

#endif
