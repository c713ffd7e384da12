/* loom-optim-nulldesc.so: the entry returns NULL instead of a descriptor. */
#include "loom/plugin.h"

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void) { return NULL; }
