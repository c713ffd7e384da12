/* 1f1b.c — loom-sched-1f1b: one-forward-one-backward with a flush (PipeDream-flush,
 * Narayanan et al. 2021), in the order of Megatron-LM's
 * forward_backward_pipelining_without_interleaving:
 *     warm-up   min(stages - stage - 1, m) forwards
 *     steady    m - warm-up times: forward of the next micro-batch, backward of the oldest
 *     cool-down the remaining warm-up backwards
 * Bubble with equal costs: (p-1)/(m+p-1), as GPipe, but stage s holds at most
 * min(stages - s, m) micro-batches' activations (stage 0: min(p, m)).
 * What not: no virtual stages (chunks must be 1; see interleaved), no split backward
 * (see zb1). Invariants: build() is pure; the only exported symbol is loom_plugin_entry.
 */
#include "../sched_common.h"

static int f1b1_check(const loom_sched_shape *s, char *reason, size_t len)
{
    return sched_check_one_chunk("1f1b", s, reason, len);
}

static loom_status f1b1_build(const loom_sched_shape *s, loom_sched_instr *out, size_t cap,
                              size_t *n)
{
    char why[256];
    if (!f1b1_check(s, why, sizeof why))
        return LOOM_ERR_INVALID;
    sched_writer w = sched_writer_new(s, out, cap);
    const int m = s->microbatches;
    int warmup = s->stages - s->stage - 1;
    if (warmup > m)
        warmup = m;
    for (int i = 0; i < warmup; i++)
        sched_fwd(&w, i, 0);
    for (int i = 0; i < m - warmup; i++) {
        sched_fwd(&w, warmup + i, 0);
        sched_bwd(&w, LOOM_SCHED_BWD, i, 0);
    }
    for (int i = m - warmup; i < m; i++)
        sched_bwd(&w, LOOM_SCHED_BWD, i, 0);
    return sched_finish(&w, n);
}

static const loom_sched_ops ops = {
    .size = sizeof(loom_sched_ops),
    .build = f1b1_build,
    .check = f1b1_check,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_SCHED,
    .name = "1f1b",
    .version = "0.1.0",
    .summary = "1F1B (PipeDream-flush, Megatron order): GPipe's bubble, at most p micro-batches in flight",
    .config_keys = NULL,
    .n_config_keys = 0,
    .probe = NULL,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
