/* loom-optim-noentry.so: the entry exists but lacks LOOM_PLUGIN_EXPORT, so under
 * -fvisibility=hidden nothing is exported — the mistake a plugin author actually makes. */
#include "fixture_ops.h"

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI, .size = sizeof(loom_plugin_desc), .kind = LOOM_KIND_OPTIM,
    .name = "noentry", .version = "0", .summary = "fixture: no entry", .ops = &fixture_ops,
};
const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
