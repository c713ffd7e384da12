/* plugin.h — the plugin ABI: the descriptor every loom plugin exports, the config-key
 * table, and the loom_host services table the core hands to plugins.
 *
 * A plugin is a shared object named loom-<kind>-<name>.so that exports exactly one symbol,
 *     const loom_plugin_desc *loom_plugin_entry(void);
 * which returns a pointer to a static const descriptor and does nothing else: no
 * allocation, no device work, no environment reads. Listing plugins is therefore always
 * safe. Everything else in the .so is hidden (-fvisibility=hidden; LOOM_PLUGIN_EXPORT
 * marks the one entry).
 *
 * Invariants that never change within ABI major LOOM_PLUGIN_ABI:
 *  - the descriptor's prefix (abi, size, kind) never moves;
 *  - every ops table starts with its own size in bytes and only grows at the end; members
 *    past a plugin's size are treated as absent by the core;
 *  - an ABI mismatch is refused, never adapted.
 * The per-kind ops tables are in include/loom/plugin/<kind>.h.
 */
#ifndef LOOM_PLUGIN_H
#define LOOM_PLUGIN_H

#include "loom/loom.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_PLUGIN_ABI 2 /* 2: strategy region hooks carry in/out buffers (tensor parallelism) */

#if defined(_WIN32)
#define LOOM_PLUGIN_EXPORT __declspec(dllexport)
#else
#define LOOM_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

typedef enum loom_kind {
    LOOM_KIND_COMM = 1,   /* collectives and point-to-point (plugin/comm.h) */
    LOOM_KIND_STRATEGY,   /* parameter/gradient placement (plugin/strategy.h) */
    LOOM_KIND_OPTIM,      /* update rule over flat fp32 shards (plugin/optim.h) */
    LOOM_KIND_PRECISION,  /* dtypes, loss scaling, overflow skip (plugin/precision.h) */
    LOOM_KIND_SCHED,      /* pipeline schedule as instructions (plugin/sched.h) */
    LOOM_KIND_BACKEND     /* kernels for one device type (plugin/backend.h) */
} loom_kind;

/* "comm", "strategy", ...; NULL for an unknown kind. */
const char *loom_kind_name(loom_kind kind);

/* Types a config key may take. The core checks a recipe's values against them. */
typedef enum loom_cfg_type {
    LOOM_CFG_NUMBER = 1,  /* a real number */
    LOOM_CFG_INTEGER,     /* a whole number */
    LOOM_CFG_BOOLEAN,     /* true/false */
    LOOM_CFG_STRING,      /* text */
    LOOM_CFG_NUMBERS      /* a list of numbers, e.g. betas = {0.9, 0.95} */
} loom_cfg_type;

/* One key a plugin accepts in its recipe table. default_value is written as the recipe
 * would write it ("0.9", "true", "{0.9, 0.999}", "\"matrices\""); NULL means required. */
typedef struct loom_config_key {
    const char *name;
    loom_cfg_type type;
    const char *default_value;
    const char *help;
} loom_config_key;

#define LOOM_CFG_MAX_NUMBERS 8

/* One resolved value; the core fills every declared key (recipe value or default) in the
 * order of the plugin's key table, so a plugin reads values[i] for its key i. */
typedef struct loom_config_value {
    const char *name;
    loom_cfg_type type;
    double number;                         /* NUMBER, INTEGER, BOOLEAN (0/1) */
    const char *string;                    /* STRING; NULL otherwise */
    double numbers[LOOM_CFG_MAX_NUMBERS];  /* NUMBERS */
    int n_numbers;
} loom_config_value;

typedef struct loom_config {
    int count;
    const loom_config_value *values; /* owned by the core, valid during create() only */
} loom_config;

typedef enum loom_log_level {
    LOOM_LOG_ERROR = 0,
    LOOM_LOG_WARN,
    LOOM_LOG_INFO,
    LOOM_LOG_DEBUG
} loom_log_level;

/* The mesh's communicator groups (DESIGN.md: pp x dp x tp, tp innermost). */
typedef enum loom_group {
    LOOM_GROUP_WORLD = 0,
    LOOM_GROUP_DP,
    LOOM_GROUP_TP,
    LOOM_GROUP_PP
} loom_group;

struct loom_comm_ops; /* include/loom/plugin/comm.h */
struct loom_backend_ops; /* include/loom/plugin/backend.h */

/* Services the core offers plugins; the only way a plugin reaches the core, so a plugin
 * needs nothing but these headers. Append-only, like SQLite's extension API table. */
typedef struct loom_host {
    size_t size;
    int abi;
    /* Printf-style log line to stderr, prefixed by the core with "loom: " (and the rank
     * when the world has more than one). */
    void (*log)(loom_log_level level, const char *fmt, ...);
    /* Record an error message for loom_last_error() and return st, so a plugin writes
     * `return host->fail(LOOM_ERR_INVALID, "lr must be > 0, got %g", lr);`. */
    loom_status (*fail)(loom_status st, const char *fmt, ...);
    /* 64-byte-aligned, zeroed host memory; NULL on failure. free(NULL) is fine. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    /* This process's rank and the world size (0 and 1 for a single-rank run). */
    int rank;
    int world;
    /* The communicator of a mesh group: its ops table and instance, and the group's size.
     * A group of one rank gives *ops = NULL and *comm = NULL (nothing to communicate). */
    loom_status (*group)(loom_group g, const struct loom_comm_ops **ops, void **comm, int *size);
    /* The same group's communicator for buffers in the backend's memory (a gradient bucket):
     * with a device backend, the device communicator (nccl, on the backend's stream) or the
     * host one staged through the backend's copies (core/dist/dist.h); with a host-memory
     * backend the very communicator group() gives. Absent where size ends before it. */
    loom_status (*device_group)(loom_group g, const struct loom_comm_ops **ops, void **comm,
                                int *size);
    /* The device backend whose memory device_group()'s buffers are in, and its instance in
     * *self, for a plugin that must transform such a buffer before sending it (the dp
     * strategy's bf16 rounding: plugin/backend.h's convert ops); NULL where device_group()
     * is group() (a host-memory backend, or one rank). Absent where size ends before it. */
    const struct loom_backend_ops *(*device_backend)(void **self);
} loom_host;

/* The descriptor. Field order is ABI. */
typedef struct loom_plugin_desc {
    uint32_t abi;   /* LOOM_PLUGIN_ABI the plugin was built against */
    uint32_t size;  /* sizeof(loom_plugin_desc) as the plugin saw it */
    loom_kind kind;
    const char *name;     /* must match the file name loom-<kind>-<name>.so */
    const char *version;  /* the plugin's own version string */
    const char *summary;  /* one line for `loom plugins` */
    const loom_config_key *config_keys;
    uint32_t n_config_keys;
    /* Optional: is this plugin usable here? Returns 1, or 0 and writes why into reason
     * (e.g. "no CUDA device visible"). Must be cheap and side-effect free. */
    int (*probe)(char *reason, size_t reason_len);
    /* The kind's ops table (loom_optim_ops, ...), starting with its size. */
    const void *ops;
} loom_plugin_desc;

typedef const loom_plugin_desc *(*loom_plugin_entry_fn)(void);

#define LOOM_PLUGIN_ENTRY_SYMBOL "loom_plugin_entry"

#ifdef __cplusplus
}
#endif
#endif /* LOOM_PLUGIN_H */
