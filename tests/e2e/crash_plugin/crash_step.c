/* loom-optim-crashstep.so: an optimizer that loads cleanly and crashes in its first step
 * (a write through NULL), for tests/e2e/early.sh: the crash must name this plugin, not
 * loom. Everything before step is a plain SGD-shaped optimizer with no state. */
#include <stddef.h>

#include "loom/plugin.h"
#include "loom/plugin/optim.h"

static const loom_config_key keys[] = {
    {"lr", LOOM_CFG_NUMBER, NULL, "learning rate (accepted, never used)"},
};

static int instance;

static loom_status crash_create(const loom_host *host, const loom_config *cfg, void **self)
{
    (void)host;
    (void)cfg;
    *self = &instance;
    return LOOM_OK;
}

static void crash_destroy(void *self) { (void)self; }
static uint32_t crash_state_per_param(void *self) { (void)self; return 0; }

static void crash_decay_rule(void *self, float *weight_decay, int *decay_all)
{
    (void)self;
    *weight_decay = 0;
    *decay_all = 0;
}

static loom_status crash_step(void *self, const loom_optim_step_args *args)
{
    (void)self;
    volatile float *nowhere = NULL;
    *nowhere = args->lr;
    return LOOM_OK;
}

static const loom_optim_ops ops = {
    .size = sizeof(loom_optim_ops),
    .create = crash_create,
    .destroy = crash_destroy,
    .state_per_param = crash_state_per_param,
    .decay_rule = crash_decay_rule,
    .step = crash_step,
};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_OPTIM,
    .name = "crashstep",
    .version = "0.1.0",
    .summary = "test only: crashes in its first step",
    .config_keys = keys,
    .n_config_keys = 1,
    .ops = &ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
