/* loom-optim-badkey.so: a config key without a name. */
#include "fixture_ops.h"

static const loom_config_key keys[] = {
    {"lr", LOOM_CFG_NUMBER, NULL, "learning rate"},
    {NULL, LOOM_CFG_NUMBER, "0", "a key someone forgot to name"},
};
static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI, .size = sizeof(loom_plugin_desc), .kind = LOOM_KIND_OPTIM,
    .name = "badkey", .version = "0", .summary = "fixture: unnamed key",
    .config_keys = keys, .n_config_keys = 2, .ops = &fixture_ops,
};
LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
