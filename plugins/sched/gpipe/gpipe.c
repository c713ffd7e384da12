/* gpipe.c — loom-sched-gpipe: GPipe (Huang et al. 2019): every micro-batch's forward,
 * then every backward, in micro-batch order (as PyTorch's ScheduleGPipe).
 *
 * Bubble with equal costs: (p-1)/(m+p-1) of the makespan; each stage holds all m
 * micro-batches' activations at its peak (what 1f1b avoids).
 * What not: no virtual stages (chunks must be 1), no split backward.
 * Invariants: build() is pure; the only exported symbol is loom_plugin_entry.
 */
#include "../sched_common.h"

static int gpipe_check(const loom_sched_shape *s, char *reason, size_t len)
{
    return sched_check_one_chunk("gpipe", s, reason, len);
}

static loom_status gpipe_build(const loom_sched_shape *s, loom_sched_instr *out, size_t cap,
                               size_t *n)
{
    char why[256];
    if (!gpipe_check(s, why, sizeof why))
        return LOOM_ERR_INVALID;
    sched_writer w = sched_writer_new(s, out, cap);
    for (int mb = 0; mb < s->microbatches; mb++)
        sched_fwd(&w, mb, 0);
    for (int mb = 0; mb < s->microbatches; mb++)
        sched_bwd(&w, LOOM_SCHED_BWD, mb, 0);
    return sched_finish(&w, n);
}

static const loom_sched_ops ops = {
    .size = sizeof(loom_sched_ops),
    .build = gpipe_build,
    .check = gpipe_check,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_SCHED,
    .name = "gpipe",
    .version = "0.1.0",
    .summary = "GPipe: all forwards, then all backwards (peak: every micro-batch in flight)",
    .config_keys = NULL,
    .n_config_keys = 0,
    .probe = NULL,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
