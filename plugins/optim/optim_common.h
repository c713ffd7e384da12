/* optim_common.h — checks every built-in optimizer makes on its config, shared as static
 * inline code (each plugin is its own .so and reaches the core only through loom_host).
 * What not: anything an out-of-tree plugin needs — that one uses the public headers only.
 */
#ifndef LOOM_PLUGINS_OPTIM_COMMON_H
#define LOOM_PLUGINS_OPTIM_COMMON_H

#include <math.h>
#include <string.h>

#include "loom/plugin.h"

/* The core fills every declared key in table order; anything else is a core bug, but a
 * plugin says so instead of reading past the array. */
static inline loom_status optim_check_config(const loom_host *host, const char *name,
                                             const loom_config *cfg, const loom_config_key *keys,
                                             int n_keys)
{
    if (cfg == NULL || cfg->count < n_keys || cfg->values == NULL)
        return host->fail(LOOM_ERR_INVALID, "%s: expected %d resolved config values, got %d", name,
                          n_keys, cfg ? cfg->count : 0);
    for (int i = 0; i < n_keys; i++)
        if (cfg->values[i].type != keys[i].type ||
            (keys[i].type == LOOM_CFG_STRING && cfg->values[i].string == NULL))
            return host->fail(LOOM_ERR_INVALID, "%s: config value %d should be key '%s'", name, i,
                              keys[i].name);
    return LOOM_OK;
}

/* lr > 0 (a base the schedule scales; checking it here catches typos), weight_decay >= 0,
 * decay "matrices" or "all" (*decay_all set). */
static inline loom_status optim_check_common(const loom_host *host, const char *name, double lr,
                                             double wd, const char *decay, int *decay_all)
{
    if (!(lr > 0) || !isfinite(lr))
        return host->fail(LOOM_ERR_INVALID, "%s: lr must be a finite number > 0, got %g", name, lr);
    if (!(wd >= 0) || !isfinite(wd))
        return host->fail(LOOM_ERR_INVALID, "%s: weight_decay must be a finite number >= 0, got %g",
                          name, wd);
    if (strcmp(decay, "matrices") != 0 && strcmp(decay, "all") != 0)
        return host->fail(LOOM_ERR_INVALID, "%s: decay must be \"matrices\" or \"all\", got \"%s\"",
                          name, decay);
    *decay_all = strcmp(decay, "all") == 0;
    return LOOM_OK;
}

#endif
