/* interleaved.c — loom-sched-interleaved: Megatron-LM's interleaved 1F1B (Narayanan et
 * al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters", sec. 2.2),
 * in the order of forward_backward_pipelining_with_interleaving. Each rank holds `chunks`
 * virtual stages (rank r's chunk c is virtual stage c * stages + r), and micro-batches go
 * through the chunks in groups of `stages`:
 *     virtual micro-batch k (0 <= k < m * v) is micro-batch (k / (p v)) p + k % p of
 *     chunk (k % (p v)) / p going forward, chunk v - 1 - (k % (p v)) / p going backward;
 *     warm-up  (p - r - 1) * 2 + (v - 1) * p forwards (all of them when m == p),
 *     steady   forward k + warm-up, backward k,  cool-down the remaining backwards.
 * Transfers are placed as Megatron places them: after each step's computes, that step's
 * sends and the receives for the next step (send_forward_backward_recv_forward_backward),
 * not right around each compute as sched_common.h's helpers do. Both orders are safe with
 * asynchronous sends; this one is also safe where a send waits for its receiver and each
 * run of transfers is posted as one group (the simulator's rendezvous mode), which the
 * other deadlocks under, and it simulates to the same bubble.
 * Bubble with equal per-chunk costs: (p-1)/(v m + p - 1), the paper's (1/v)(p-1)/m of
 * ideal time; in exchange for v times the point-to-point traffic.
 * What not: m must be a multiple of p (Megatron's rule for this order), chunks >= 2 and
 * stages >= 2 (with one chunk, or one stage, use 1f1b). Invariants: build() is pure; the
 * only exported symbol is loom_plugin_entry.
 */
#include "../sched_common.h"

static int interleaved_check(const loom_sched_shape *s, char *reason, size_t len)
{
    if (!sched_check_common("interleaved", s, reason, len))
        return 0;
    if (s->chunks < 2) {
        snprintf(reason, len, "interleaved: chunks = %d, but interleaving needs chunks >= 2 "
                              "virtual stages per rank (with one, use the 1f1b schedule)",
                 s->chunks);
        return 0;
    }
    if (s->stages < 2) {
        snprintf(reason, len, "interleaved: stages = 1 has nothing to interleave with "
                              "(use stages >= 2, or the 1f1b schedule)");
        return 0;
    }
    int p = s->stages, m = s->microbatches;
    if (m % p != 0) {
        int lo = m / p * p, hi = lo + p;
        if (lo > 0)
            snprintf(reason, len,
                     "interleaved: microbatches = %d is not a multiple of stages = %d (Megatron's "
                     "interleaved order needs m %% p == 0); use %d or %d micro-batches, or the "
                     "1f1b schedule, which takes any count", m, p, lo, hi);
        else
            snprintf(reason, len,
                     "interleaved: microbatches = %d is not a multiple of stages = %d (Megatron's "
                     "interleaved order needs m %% p == 0); use %d or %d micro-batches, or the "
                     "1f1b schedule, which takes any count", m, p, hi, hi + p);
        return 0;
    }
    return 1;
}

typedef struct vmb { int mb, chunk; } vmb;

static vmb virtual_mb(const loom_sched_shape *s, int k, int forward)
{
    int p = s->stages, v = s->chunks, in_group = k % (p * v);
    int chunk = in_group / p;
    return (vmb){k / (p * v) * p + k % p, forward ? chunk : v - 1 - chunk};
}

/* The transfers, in Megatron's grouping: each step's sends and the receives for the next
 * step sit together after the step's computes (send_forward_backward_recv_forward_backward),
 * so a transport whose send waits for its receiver can post each run as one group. */
static void recv_act(sched_writer *w, vmb f)
{
    if (!sched_first(w, f.chunk))
        sched_put(w, LOOM_SCHED_RECV_ACT, f.mb, f.chunk);
}
static void recv_grad(sched_writer *w, vmb b)
{
    if (!sched_last(w, b.chunk))
        sched_put(w, LOOM_SCHED_RECV_GRAD, b.mb, b.chunk);
}
static void send_act(sched_writer *w, vmb f)
{
    if (!sched_last(w, f.chunk))
        sched_put(w, LOOM_SCHED_SEND_ACT, f.mb, f.chunk);
}
static void send_grad(sched_writer *w, vmb b)
{
    if (!sched_first(w, b.chunk))
        sched_put(w, LOOM_SCHED_SEND_GRAD, b.mb, b.chunk);
}

static loom_status interleaved_build(const loom_sched_shape *s, loom_sched_instr *out,
                                     size_t cap, size_t *n)
{
    char why[256];
    if (!interleaved_check(s, why, sizeof why))
        return LOOM_ERR_INVALID;
    sched_writer w = sched_writer_new(s, out, cap);
    const int p = s->stages, v = s->chunks, total = s->microbatches * v;
    int warmup = (p - s->stage - 1) * 2 + (v - 1) * p;
    if (s->microbatches == p || warmup > total)
        warmup = total;
    recv_act(&w, virtual_mb(s, 0, 1));
    for (int k = 0; k < warmup; k++) { /* forwards only */
        vmb f = virtual_mb(s, k, 1);
        sched_put(&w, LOOM_SCHED_FWD, f.mb, f.chunk);
        send_act(&w, f);
        if (k + 1 < total)
            recv_act(&w, virtual_mb(s, k + 1, 1));
        if (k == warmup - 1 && warmup < total)
            recv_grad(&w, virtual_mb(s, 0, 0)); /* the first backward's, with the last send */
    }
    for (int k = 0; k < total - warmup; k++) { /* one forward, one backward, then exchange */
        vmb f = virtual_mb(s, warmup + k, 1), b = virtual_mb(s, k, 0);
        sched_put(&w, LOOM_SCHED_FWD, f.mb, f.chunk);
        sched_put(&w, LOOM_SCHED_BWD, b.mb, b.chunk);
        send_act(&w, f);
        send_grad(&w, b);
        if (warmup + k + 1 < total)
            recv_act(&w, virtual_mb(s, warmup + k + 1, 1));
        recv_grad(&w, virtual_mb(s, k + 1, 0));
    }
    if (warmup == total)
        recv_grad(&w, virtual_mb(s, 0, 0));
    for (int k = total - warmup; k < total; k++) { /* backwards only */
        vmb b = virtual_mb(s, k, 0);
        sched_put(&w, LOOM_SCHED_BWD, b.mb, b.chunk);
        send_grad(&w, b);
        if (k + 1 < total)
            recv_grad(&w, virtual_mb(s, k + 1, 0));
    }
    return sched_finish(&w, n);
}

static const loom_sched_ops ops = {
    .size = sizeof(loom_sched_ops),
    .build = interleaved_build,
    .check = interleaved_check,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_SCHED,
    .name = "interleaved",
    .version = "0.1.0",
    .summary = "interleaved 1F1B (Megatron): chunks virtual stages per rank, bubble / chunks",
    .config_keys = NULL,
    .n_config_keys = 0,
    .probe = NULL,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
