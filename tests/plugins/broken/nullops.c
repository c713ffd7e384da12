/* loom-optim-nullops.so: a descriptor without an ops table. */
#include "loom/plugin.h"

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI, .size = sizeof(loom_plugin_desc), .kind = LOOM_KIND_OPTIM,
    .name = "nullops", .version = "0", .summary = "fixture: NULL ops", .ops = NULL,
};
LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
