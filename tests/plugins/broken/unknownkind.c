/* loom-optim-unknownkind.so: a kind number this loom does not know. */
#include "fixture_ops.h"

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI, .size = sizeof(loom_plugin_desc), .kind = (loom_kind)42,
    .name = "unknownkind", .version = "0", .summary = "fixture: unknown kind",
    .ops = &fixture_ops,
};
LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
