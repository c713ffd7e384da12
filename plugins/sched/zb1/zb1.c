/* zb1.c — loom-sched-zb1: ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism",
 * sec. 3.1). The backward is split into B (input gradient, on the critical path, sent on
 * at once) and W (weight gradient, needed only by the optimizer step). The order is
 * 1F1B's, with F and B as 1F1B places them, and stage s delays its W's by s: it runs the
 * W of micro-batch j after the B of micro-batch j + s (PyTorch's ZB schedules use the
 * same count), and the W's still owed after the last B fill the cool-down, where 1F1B's
 * later stages sit idle. Every stage then holds at most p micro-batches' activations
 * (stage s: p - s from 1F1B's warm-up plus s W's owed), the peak of 1F1B's stage 0.
 * Bubble with T_F = T_B = T_W: (p-1)(T_F + T_B - T_W) per stage, a third of 1F1B's
 * (p-1)(T_F + T_B + T_W); as a fraction of the makespan (p-1)/(3m + p - 1) once m >= p.
 * What not: no virtual stages (chunks must be 1; ZB-V is another schedule), no
 * optimizer-step post-validation (the paper's sec. 4, an engine matter).
 * Invariants: build() is pure; the only exported symbol is loom_plugin_entry.
 */
#include "../sched_common.h"

static int zb1_check(const loom_sched_shape *s, char *reason, size_t len)
{
    return sched_check_one_chunk("zb1", s, reason, len);
}

static loom_status zb1_build(const loom_sched_shape *s, loom_sched_instr *out, size_t cap,
                             size_t *n)
{
    char why[256];
    if (!zb1_check(s, why, sizeof why))
        return LOOM_ERR_INVALID;
    sched_writer w = sched_writer_new(s, out, cap);
    const int m = s->microbatches, delay = s->stage;
    int warmup = s->stages - s->stage - 1;
    if (warmup > m)
        warmup = m;
    int b_done = 0, w_done = 0;
    for (int i = 0; i < warmup; i++)
        sched_fwd(&w, i, 0);
    for (int i = 0; i < m; i++) {
        if (warmup + i < m)
            sched_fwd(&w, warmup + i, 0);
        sched_bwd(&w, LOOM_SCHED_BWD_INPUT, i, 0);
        b_done++;
        if (b_done - w_done > delay)
            sched_weight(&w, w_done++, 0);
    }
    while (w_done < m)
        sched_weight(&w, w_done++, 0);
    return sched_finish(&w, n);
}

static const loom_sched_ops ops = {
    .size = sizeof(loom_sched_ops),
    .build = zb1_build,
    .check = zb1_check,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_SCHED,
    .name = "zb1",
    .version = "0.1.0",
    .summary = "ZB-H1 (zero bubble, Qi et al. 2024): 1F1B's memory, split backward, ~1/3 the bubble",
    .config_keys = NULL,
    .n_config_keys = 0,
    .probe = NULL,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
