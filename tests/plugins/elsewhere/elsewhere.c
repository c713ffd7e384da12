/* loom-optim-elsewhere.so: a valid plugin that is in no search dir, so the tests can
 * show the loader finds it only where LOOM_PLUGIN_PATH says (never via the CWD). */
#include "../broken/fixture_ops.h"

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI, .size = sizeof(loom_plugin_desc), .kind = LOOM_KIND_OPTIM,
    .name = "elsewhere", .version = "0", .summary = "fixture: found only when named",
    .ops = &fixture_ops,
};
LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
