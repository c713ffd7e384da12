/* loom-optim-smallops.so: an ops table that stops after create and destroy, as if built
 * against headers older than the core's minimum. */
#include "loom/plugin.h"

static const struct {
    size_t size;
    void *create, *destroy;
} small_ops = {2 * sizeof(void *) + sizeof(size_t), NULL, NULL};

static const loom_plugin_desc desc = {
    .abi = LOOM_PLUGIN_ABI, .size = sizeof(loom_plugin_desc), .kind = LOOM_KIND_OPTIM,
    .name = "smallops", .version = "0", .summary = "fixture: short ops", .ops = &small_ops,
};
LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return &desc; }
