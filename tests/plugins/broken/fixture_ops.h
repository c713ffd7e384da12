/* fixture_ops.h — a do-nothing but complete optimizer ops table for the broken-plugin
 * fixtures, so each fixture breaks exactly one promise and nothing else. */
#ifndef LOOM_TEST_FIXTURE_OPS_H
#define LOOM_TEST_FIXTURE_OPS_H

#include "loom/plugin.h"
#include "loom/plugin/optim.h"

static loom_status fx_create(const loom_host *host, const loom_config *cfg, void **self)
{
    *self = NULL;
    return LOOM_OK;
}
static void fx_destroy(void *self) {}
static uint32_t fx_state_per_param(void *self) { return 0; }
static void fx_decay_rule(void *self, float *wd, int *all) { *wd = 0, *all = 0; }
static loom_status fx_step(void *self, const loom_optim_step_args *args) { return LOOM_OK; }

static const loom_optim_ops fixture_ops = {
    .size = sizeof(loom_optim_ops),
    .create = fx_create,
    .destroy = fx_destroy,
    .state_per_param = fx_state_per_param,
    .decay_rule = fx_decay_rule,
    .step = fx_step,
};

#endif
