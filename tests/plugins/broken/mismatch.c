/* loom-optim-mismatch.so: the file name says optim 'mismatch', the descriptor says
 * precision 'fp32' — a renamed or copied .so. */
#include "fixture_ops.h"

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI, .size = sizeof(loom_plugin_desc), .kind = LOOM_KIND_PRECISION,
    .name = "fp32", .version = "0", .summary = "fixture: name mismatch", .ops = &fixture_ops,
};
LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
