/* loom-optim-wrongabi.so: built for the next ABI major; the loader must refuse it. */
#include "fixture_ops.h"

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI + 1, .size = sizeof(loom_plugin_desc), .kind = LOOM_KIND_OPTIM,
    .name = "wrongabi", .version = "0", .summary = "fixture: wrong ABI", .ops = &fixture_ops,
};
LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
