/* loom-optim-smalldesc.so: a descriptor that claims to end after its prefix
 * (abi, size, kind). */
#include "fixture_ops.h"

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI, .size = 12, .kind = LOOM_KIND_OPTIM,
    .name = "smalldesc", .version = "0", .summary = "fixture: short descriptor",
    .ops = &fixture_ops,
};
LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
