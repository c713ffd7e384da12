/* flight_desync.c — debug mode's check that every rank of a group issues the same
 * collective (see flight.h): before each one, the ranks allgather a fixed-size descriptor
 * (op, bytes, sequence number, root) over the plugin's communicator and compare.
 *
 * What: the first rank whose descriptor differs from the lowest rank's is named with both
 * operations, on every rank, before the real collective starts (so no rank exchanges
 * buffers of a size the others did not agree to).
 * What not: point-to-point operations are not checked (their peers differ by design); a
 * rank that issues a send where the others issue a collective is found by the timeout and
 * the flight report instead. The check costs one small blocking allgather per collective,
 * so it is for debugging, not for every run.
 */
#include <stdio.h>
#include <string.h>

#include "flight.h"
#include "base/status.h"

typedef struct desc {
    char op[24];
    uint64_t seq, bytes;
    int64_t root;
} desc;

enum { MAX_CHECK = 1024 };

static void describe(const desc *d, char *out, size_t cap)
{
    if (d->root >= 0)
        snprintf(out, cap, "%.23s #%llu (%llu bytes, root %lld)", d->op,
                 (unsigned long long)d->seq, (unsigned long long)d->bytes, (long long)d->root);
    else
        snprintf(out, cap, "%.23s #%llu (%llu bytes)", d->op, (unsigned long long)d->seq,
                 (unsigned long long)d->bytes);
}

loom_status loom_flight_check_desync(const loom_comm_ops *inner, void *comm,
                                     const flight_group *g, const char *op, uint64_t seq,
                                     size_t bytes, int root)
{
    static desc all[MAX_CHECK];
    int n = inner->world(comm);
    if (n > MAX_CHECK)
        return LOOM_OK; /* beyond the check's table: not checked */
    desc mine;
    memset(&mine, 0, sizeof mine);
    snprintf(mine.op, sizeof mine.op, "%s", op);
    mine.seq = seq;
    mine.bytes = bytes;
    mine.root = root;
    loom_comm_request *r = NULL;
    LOOM_TRY(inner->allgather_start(comm, &mine, all, sizeof mine, LOOM_DTYPE_U8, &r));
    LOOM_TRY(inner->wait(comm, r));
    for (int q = 1; q < n; q++) {
        if (memcmp(&all[q], &all[0], sizeof all[0]) == 0)
            continue;
        char a[128], b[128];
        describe(&all[0], a, sizeof a);
        describe(&all[q], b, sizeof b);
        int r0 = g->n > 0 ? g->members[0] : 0, rq = g->n > q ? g->members[q] : q;
        return loom_fail(LOOM_ERR_INVALID, "desync on group %s: rank %d issued %s but rank %d "
                         "issued %s (debug_desync: the ranks called different collectives)",
                         g->name, r0, a, rq, b);
    }
    return LOOM_OK;
}
