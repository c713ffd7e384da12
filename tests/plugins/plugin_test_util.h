/* plugin_test_util.h — helpers shared by the plugin tests: find a built plugin in the
 * build tree, and resolve a plugin's config the way a recipe would (defaults from its key
 * table, overridden by "key=value" strings written as in a recipe).
 *
 * What not: not the core's config resolver (that is the Lua side's job); just enough of
 * the recipe grammar for defaults: 1e-3, true, "text", {0.9, 0.95}.
 */
#ifndef LOOM_TEST_PLUGIN_TEST_UTIL_H
#define LOOM_TEST_PLUGIN_TEST_UTIL_H

#include "loom/plugin.h"

enum { TCFG_MAX = 32, TCFG_STR = 128 };

typedef struct tcfg {
    loom_config cfg;
    loom_config_value vals[TCFG_MAX];
    char strs[TCFG_MAX][TCFG_STR];
    char err[256]; /* why tcfg_build failed */
} tcfg;

/* Parse one value written as a recipe writes it into *v (type v->type). 1 on success. */
int tcfg_parse_value(const char *text, loom_config_value *v, char *strbuf, size_t strcap);

/* Fill t from d's key table: each key's default, or the override "key=value" from the
 * NULL-terminated list. A required key (default NULL) with no override is an error unless
 * fill_required is set, which puts 1e-3 (numbers) there. 1 on success, else t->err. */
int tcfg_build(tcfg *t, const loom_plugin_desc *d, const char *const *overrides,
               int fill_required);

/* "<dir>/loom-<kind>-<name>.so" for the first build-tree plugin dir holding it, or NULL.
 * The string is static (one per call site is enough for the tests). */
const char *test_build_plugin_path(const char *kind, const char *name);

/* Split LOOM_TEST_BUILD_PLUGIN_DIRS; returns how many (fills at most cap). */
int test_build_plugin_dirs(char dirs[][1024], int cap);
/* Call visit(path, ctx) for every built plugin file whose name starts with prefix
 * ("loom-" for all, "loom-sched-" for one kind) and ends in ".so", in the build dirs'
 * order. Returns how many were visited. */
int test_each_built_plugin(const char *prefix, void (*visit)(const char *path, void *ctx),
                           void *ctx);

/* Copy a file (the tests put plugin copies in temporary dirs). 0 on success. */
int test_copy_file(const char *from, const char *to);

#endif
