/* loom-optim-crash.so: an entry that crashes (a write through NULL), for tests/e2e/early.sh:
 * the loader must name the plugin before the process dies. Kept out of tests/plugins/broken,
 * whose directory scans would die with it. */
#include <stddef.h>

#include "loom/plugin.h"

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void)
{
    volatile int *nowhere = NULL;
    *nowhere = 1;
    return NULL;
}
