/* plugin_loader.h — finding, opening and checking plugins.
 *
 * Search order: every directory of LOOM_PLUGIN_PATH (colon-separated), then the install
 * dir (LOOM_INSTALL_PLUGIN_DIR), then the build tree's plugin folders
 * (LOOM_BUILD_PLUGIN_DIRS, colon-separated, compiled in). Never the current directory
 * implicitly. A file is accepted only if it dlopens, exports loom_plugin_entry, returns a
 * descriptor with this loom's ABI, a known kind, a kind/name that match its file name
 * loom-<kind>-<name>.so, and an ops table. A refusal is one line:
 *   plugin '<path>' rejected: <what was expected>, <what was found>; <what to do>
 * Loaded plugins stay loaded for the life of the process (never dlclose'd).
 */
#ifndef LOOM_CORE_PLUGIN_LOADER_H
#define LOOM_CORE_PLUGIN_LOADER_H

#include "loom/plugin.h"

typedef struct loom_plugin {
    const loom_plugin_desc *desc;
    const char *path; /* the file it came from */
} loom_plugin;

/* Load plugin <kind>/<name> from the first search dir holding loom-<kind>-<name>.so.
 * Cached: a second call returns the same plugin. Not found: LOOM_ERR_PLUGIN with a message
 * listing the dirs searched and the names of that kind that do exist. */
loom_status loom_plugin_load(loom_kind kind, const char *name, const loom_plugin **out);

/* Open and check one file. */
loom_status loom_plugin_open(const char *path, const loom_plugin **out);

/* Visit every loom-*.so on the search path, in search order (a name found twice: the
 * first wins, later ones are reported as shadowed through refusal). p is NULL and refusal
 * says why when the file was rejected. */
typedef void (*loom_plugin_visit_fn)(void *ctx, const char *path, const loom_plugin *p,
                                     const char *refusal);
void loom_plugin_scan(loom_plugin_visit_fn visit, void *ctx);

/* The search directories, in order; returns how many (fills at most cap). The strings
 * live until the process ends. */
int loom_plugin_search_dirs(const char **dirs, int cap);

/* The services table handed to every plugin (core/host.c). */
const loom_host *loom_core_host(void);
/* Set the rank/world plugins see through loom_host (default 0/1). */
void loom_core_host_set_rank(int rank, int world);
/* Set the mesh groups plugins reach through loom_host.group (world, dp, tp, pp). */
void loom_core_host_set_groups(const struct loom_comm_ops *ops, void *const comms[4],
                               const int sizes[4]);
/* Set the groups loom_host.device_group gives for the backend's memory (the same sizes as
 * the mesh's) and that backend (loom_host.device_backend); ops NULL: none, device_group
 * gives group's and device_backend NULL. */
struct loom_backend_ops;
void loom_core_host_set_device_groups(const struct loom_comm_ops *ops, void *const comms[4],
                                      const struct loom_backend_ops *be, void *be_self);

#endif
