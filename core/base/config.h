/* config.h — resolving a plugin's config: the recipe's values checked against the keys
 * the plugin declares, defaults filled in, unknown keys and wrong types refused.
 *
 * Torch7's `config.x or default` turns a typo into a silent default; here an unknown key
 * is an error that lists what the plugin accepts.
 */
#ifndef LOOM_CORE_CONFIG_H
#define LOOM_CORE_CONFIG_H

#include "loom/plugin.h"

#define LOOM_CONFIG_MAX_KEYS 32
#define LOOM_CONFIG_MAX_STRING 256

typedef struct loom_plugin_config {
    const loom_plugin_desc *desc;
    loom_config_value values[LOOM_CONFIG_MAX_KEYS];
    char strings[LOOM_CONFIG_MAX_KEYS][LOOM_CONFIG_MAX_STRING];
    int is_set[LOOM_CONFIG_MAX_KEYS];
    int count;
} loom_plugin_config;

/* Start from the plugin's defaults. */
loom_status loom_config_init(loom_plugin_config *c, const loom_plugin_desc *d);
/* Index of key, or -1 with a message naming the plugin and the accepted keys. */
int loom_config_index(const loom_plugin_config *c, const char *key);
/* Set one value; refuses unknown keys and type mismatches (an integer key refuses 1.5). */
loom_status loom_config_set_number(loom_plugin_config *c, const char *key, double v);
loom_status loom_config_set_boolean(loom_plugin_config *c, const char *key, int v);
loom_status loom_config_set_string(loom_plugin_config *c, const char *key, const char *v);
loom_status loom_config_set_numbers(loom_plugin_config *c, const char *key, const double *v, int n);
/* Copy a resolved config (string values re-pointed into dst's own storage). */
void loom_config_copy(loom_plugin_config *dst, const loom_plugin_config *src);
/* Check that every required key was given. */
loom_status loom_config_finish(const loom_plugin_config *c);
/* The view a plugin's create() receives. */
loom_config loom_config_view(const loom_plugin_config *c);
/* Read back by name (for the core's own use of shared keys such as lr). */
const loom_config_value *loom_config_get(const loom_plugin_config *c, const char *key);
/* "lr, betas, eps" into buf. */
void loom_config_key_list(const loom_plugin_desc *d, char *buf, size_t len);
/* "number", "integer", ... */
const char *loom_cfg_type_name(loom_cfg_type t);

#endif
