/* pipeline_check.c — the engine's own checks of a validated schedule (pipeline_check.h). */
#include "pipeline_check.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

/* One message of a step, as one stage's list sends or receives it. */
typedef struct message {
    int peer, key; /* key: (kind, micro-batch, receiving virtual stage) */
    size_t at;     /* the instruction */
} message;

/* Stage a's messages in list order: sends (sending = 1) or receives. A message is an
 * activation, a gradient, or (canonical: head) the tied wte's head half, which the last
 * virtual stage sends after its backward (BWD or B) and virtual stage 0 receives just
 * before its RECV_GRAD. */
static size_t messages(const loom_schedule *s, int a, int sending, int head, message *out)
{
    int P = s->stages, V = P * s->chunks;
    size_t n = 0;
#define KEY(kind, mb, to) ((((mb) * V + (to)) * 3) + (kind))
    for (size_t i = 0; i < s->n[a]; i++) {
        loom_sched_instr in = s->list[a][i];
        int vs = in.chunk * P + a, mb = in.microbatch;
        int bwd = in.op == LOOM_SCHED_BWD || in.op == LOOM_SCHED_BWD_INPUT;
        if (sending) {
            if (in.op == LOOM_SCHED_SEND_ACT && vs + 1 < V)
                out[n++] = (message){(vs + 1) % P, KEY(0, mb, vs + 1), i};
            if (in.op == LOOM_SCHED_SEND_GRAD && vs > 0)
                out[n++] = (message){(vs - 1) % P, KEY(1, mb, vs - 1), i};
            if (head && bwd && vs == V - 1)
                out[n++] = (message){0, KEY(2, mb, 0), i};
        } else {
            if (head && in.op == LOOM_SCHED_RECV_GRAD && vs == 0)
                out[n++] = (message){P - 1, KEY(2, mb, 0), i};
            if (in.op == LOOM_SCHED_RECV_ACT && vs > 0)
                out[n++] = (message){(vs - 1) % P, KEY(0, mb, vs), i};
            if (in.op == LOOM_SCHED_RECV_GRAD && vs + 1 < V)
                out[n++] = (message){(vs + 1) % P, KEY(1, mb, vs), i};
        }
    }
#undef KEY
    return n;
}

/* The transport has no tags: what rank a sends rank b, in a's list order, must be what b
 * receives from a, in b's list order. */
loom_status loom_pipeline_check_fifo(const loom_schedule *s, int head)
{
    int P = s->stages;
    size_t cap = 0;
    for (int a = 0; a < P; a++)
        cap = s->n[a] > cap ? s->n[a] : cap;
    message *out = malloc((2 * cap + 1) * sizeof *out), *in = malloc((2 * cap + 1) * sizeof *in);
    loom_status st = out && in ? LOOM_OK : loom_fail(LOOM_ERR_NOMEM, "out of memory");
    for (int a = 0; st == LOOM_OK && a < P; a++) {
        size_t ns = messages(s, a, 1, head, out);
        for (int b = 0; st == LOOM_OK && b < P; b++) {
            if (a == b)
                continue;
            size_t nr = messages(s, b, 0, head, in), i = 0, j = 0;
            for (;;) {
                while (i < ns && out[i].peer != b)
                    i++;
                while (j < nr && in[j].peer != a)
                    j++;
                int ks = i < ns ? out[i].key : -1, kr = j < nr ? in[j].key : -1;
                if (ks != kr) {
                    st = loom_fail(LOOM_ERR_UNSUPPORTED, "schedule: stage %d sends stage %d its "
                                   "messages%s in another order than stage %d receives them "
                                   "(instructions %zu and %zu); send/recv between two ranks has "
                                   "no tags, so this engine needs them in the same order", a, b,
                                   head ? " (with canonical mode's tied wte halves)" : "", b,
                                   i < ns ? out[i].at : s->n[a], j < nr ? in[j].at : s->n[b]);
                    break;
                }
                if (ks < 0)
                    break;
                i++, j++;
            }
        }
    }
    free(out);
    free(in);
    return st;
}

loom_status loom_pipeline_check_order(const loom_schedule *s, const char *name)
{
    /* each chunk's micro-batch gradients join its trees in order (at each BWD or W), and
     * the tied wte's head halves travel in the order of the B's (or BWD's) */
    int *want = calloc(2 * (size_t)s->chunks, sizeof(int)); /* [chunk]: next B, next W */
    loom_status st = want ? LOOM_OK : loom_fail(LOOM_ERR_NOMEM, "out of memory");
    for (int r = 0; st == LOOM_OK && r < s->stages; r++) {
        memset(want, 0, 2 * (size_t)s->chunks * sizeof(int));
        for (size_t i = 0; st == LOOM_OK && i < s->n[r]; i++) {
            loom_sched_instr in = s->list[r][i];
            int b = in.op == LOOM_SCHED_BWD || in.op == LOOM_SCHED_BWD_INPUT;
            int w = in.op == LOOM_SCHED_BWD || in.op == LOOM_SCHED_BWD_WEIGHT;
            int *next = &want[2 * in.chunk + w];
            if ((b || w) && in.microbatch != *next)
                st = loom_fail(LOOM_ERR_UNSUPPORTED, "deterministic = \"canonical\": schedule "
                               "\"%s\" runs %s of micro-batch %d before micro-batch %d's on stage "
                               "%d chunk %d, and canonical mode sums micro-batch gradients in "
                               "micro-batch order (use \"1f1b\", \"gpipe\", \"interleaved\" or "
                               "\"zb1\")", name, loom_sched_op_name(in.op), in.microbatch, *next,
                               r, in.chunk);
            want[2 * in.chunk] += b;
            want[2 * in.chunk + 1] += w;
        }
    }
    free(want);
    return st;
}
