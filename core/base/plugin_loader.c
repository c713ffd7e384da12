/* plugin_loader.c — finding, opening and checking plugins (the API in plugin_loader.h).
 *
 * What: builds the search path (LOOM_PLUGIN_PATH, install dir, build tree), finds
 * loom-<kind>-<name>.so files, dlopens them and checks every promise the ABI makes before
 * the core trusts a single pointer: entry symbol, ABI major, descriptor size, known kind,
 * kind/name against the file name, ops table present and large enough, config keys named
 * and typed. Accepted plugins are cached for the life of the process.
 * What not: no config resolution (the Lua side does that against desc->config_keys), no
 * probe() calls (usable-here is the caller's question), no fallback to another file when
 * the first one found is rejected — a silent fallback hides the broken file.
 * Invariants: the current directory is searched only when named explicitly (an empty
 * LOOM_PLUGIN_PATH element is skipped, never "."); an accepted plugin is never dlclose'd,
 * a rejected one always is; every refusal is ONE line
 *   plugin '<path>' rejected: <expected/found>; <what to do>
 * stored with loom_fail(LOOM_ERR_PLUGIN, ...). All shared state sits behind one mutex;
 * the scan callback runs without it, so a visitor may call loom_plugin_load.
 */
#include "plugin_loader.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/plugin/backend.h"
#include "loom/plugin/comm.h"
#include "loom/plugin/optim.h"
#include "loom/plugin/precision.h"
#include "loom/plugin/sched.h"
#include "loom/plugin/strategy.h"
#include "plugin_crash.h"
#include "status.h"

#ifndef LOOM_INSTALL_PLUGIN_DIR
#define LOOM_INSTALL_PLUGIN_DIR ""
#endif
#ifndef LOOM_BUILD_PLUGIN_DIRS
#define LOOM_BUILD_PLUGIN_DIRS ""
#endif

#define KIND_LIST "comm, strategy, optim, precision, sched, backend"
#define KIND_FIRST LOOM_KIND_COMM
#define KIND_LAST LOOM_KIND_BACKEND

/* Bytes up to and including member m: the smallest table that has m. */
#define END_OF(type, m) (offsetof(type, m) + sizeof(((type *)0)->m))

/* The smallest descriptor this loom can read: everything up to ops. */
static const size_t desc_min_size = END_OF(loom_plugin_desc, ops);

/* The smallest ops table the core can use, per kind: up to the last member ABI 1 shipped
 * with. Pinned by member name, not sizeof, so appending a member later (the tables grow
 * only at the end) keeps older plugins loadable; the core checks size before calling a
 * member past this point. */
static size_t ops_min_size(loom_kind kind)
{
    switch (kind) {
    case LOOM_KIND_COMM: return END_OF(loom_comm_ops, test);
    case LOOM_KIND_STRATEGY: return END_OF(loom_strategy_ops, after_step);
    case LOOM_KIND_OPTIM: return END_OF(loom_optim_ops, step);
    case LOOM_KIND_PRECISION: return END_OF(loom_precision_ops, set_state);
    case LOOM_KIND_SCHED: return END_OF(loom_sched_ops, build);
    case LOOM_KIND_BACKEND: return END_OF(loom_backend_ops, scale);
    }
    return 0;
}

/* ---- state behind the mutex ------------------------------------------------------ */

typedef struct entry {
    loom_plugin pub; /* what callers get a pointer to; lives until exit */
    void *handle;
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry **cache;
static size_t n_cache, cap_cache;

/* The search path is rebuilt when LOOM_PLUGIN_PATH changes. Older lists stay allocated
 * (chained through prev, so they remain reachable) because loom_plugin_search_dirs
 * promises its strings live until exit. */
typedef struct dir_list {
    struct dir_list *prev;
    char *env; /* the LOOM_PLUGIN_PATH value this list was built from; NULL if unset */
    const char **dirs;
    int n;
} dir_list;
static dir_list *search; /* the current list; NULL until first needed */
static const char **dirs; /* == search->dirs, for brevity below */
static int n_dirs;

/* ---- search path ----------------------------------------------------------------- */

static int dir_seen(const char **list, int n, const char *dir)
{
    char a[PATH_MAX], b[PATH_MAX];
    int ra = realpath(dir, a) != NULL;
    for (int i = 0; i < n; i++) {
        if (strcmp(list[i], dir) == 0)
            return 1;
        if (ra && realpath(list[i], b) != NULL && strcmp(a, b) == 0)
            return 1;
    }
    return 0;
}

/* Append each non-empty element of a colon-separated list, trailing slashes dropped. */
static void add_dirs(const char **list, int *n, int cap, const char *spec)
{
    const char *p = spec;
    while (p != NULL && *p != '\0') {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        while (len > 1 && p[len - 1] == '/')
            len--;
        if (len > 0 && *n < cap) { /* empty element: skipped, never "." */
            char *d = strndup(p, len);
            if (d != NULL && !dir_seen(list, *n, d))
                list[(*n)++] = d;
            else
                free(d);
        }
        p = colon ? colon + 1 : NULL;
    }
}

static int dirs_nomem; /* the first search list could not be allocated */

static void build_dirs_locked(void)
{
    const char *env = getenv("LOOM_PLUGIN_PATH");
    if (search != NULL && ((env == NULL && search->env == NULL) ||
                           (env != NULL && search->env != NULL && strcmp(env, search->env) == 0)))
        return;
    size_t cap = 2 + (env ? strlen(env) : 0) + strlen(LOOM_BUILD_PLUGIN_DIRS); /* >= count */
    dir_list *l = calloc(1, sizeof *l);
    const char **list = calloc(cap, sizeof *list);
    char *env_copy = env ? strdup(env) : NULL;
    if (l == NULL || list == NULL || (env != NULL && env_copy == NULL)) {
        dirs_nomem = search == NULL; /* no list at all: say why, not "no directories" */
        free(l); /* keep the old list: stale beats none */
        free(list);
        free(env_copy);
        return;
    }
    int n = 0;
    add_dirs(list, &n, (int)cap, env);
    add_dirs(list, &n, (int)cap, LOOM_INSTALL_PLUGIN_DIR);
    add_dirs(list, &n, (int)cap, LOOM_BUILD_PLUGIN_DIRS);
    *l = (dir_list){.prev = search, .env = env_copy, .dirs = list, .n = n};
    dirs_nomem = 0;
    search = l;
    dirs = list;
    n_dirs = n;
}

int loom_plugin_search_dirs(const char **out, int cap)
{
    pthread_mutex_lock(&lock);
    build_dirs_locked();
    for (int i = 0; i < n_dirs && i < cap; i++)
        out[i] = dirs[i];
    int n = n_dirs;
    pthread_mutex_unlock(&lock);
    return n;
}

/* ---- file names ------------------------------------------------------------------ */

static int kind_from_text(const char *s, size_t len, loom_kind *kind)
{
    for (int k = KIND_FIRST; k <= KIND_LAST; k++) {
        const char *kn = loom_kind_name((loom_kind)k);
        if (strlen(kn) == len && strncmp(s, kn, len) == 0) {
            *kind = (loom_kind)k;
            return 1;
        }
    }
    return 0;
}

/* Split ".../loom-<kind>-<name>.so" into kind and name. 0 when the name does not follow
 * the pattern or names an unknown kind. */
static int parse_file_name(const char *path, loom_kind *kind, char *name, size_t cap)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t len = strlen(base);
    if (strncmp(base, "loom-", 5) != 0 || len < 5 + 3 || strcmp(base + len - 3, ".so") != 0)
        return 0;
    const char *k = base + 5;
    const char *dash = strchr(k, '-');
    const char *end = base + len - 3;
    if (dash == NULL || dash >= end || !kind_from_text(k, (size_t)(dash - k), kind))
        return 0;
    size_t nlen = (size_t)(end - (dash + 1));
    if (nlen == 0 || nlen >= cap)
        return 0;
    memcpy(name, dash + 1, nlen);
    name[nlen] = '\0';
    return 1;
}

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---- opening and checking -------------------------------------------------------- */

static loom_status reject(void *handle, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Record a rejected file's one-line refusal, then close it. In that order: the
 * arguments may point into the plugin's own memory (its name, say). */
static loom_status reject(void *handle, const char *path, const char *fmt, ...)
{
    char why[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    loom_fail(LOOM_ERR_PLUGIN, "plugin '%s' rejected: %s", path, why);
    if (handle != NULL)
        dlclose(handle);
    return LOOM_ERR_PLUGIN;
}

static const char *str_or(const char *s, const char *fallback) { return s ? s : fallback; }

static loom_status check_desc(void *handle, const char *path, const loom_plugin_desc *d,
                              loom_kind file_kind, const char *file_name)
{
    if (d == NULL)
        return reject(handle, path, "loom_plugin_entry returned NULL, expected a descriptor; "
                                    "the plugin is broken, report it to its author");
    /* abi first: it sits at offset 0 in every ABI, and a mismatch means no other field
     * can be trusted to be where we look. */
    if (d->abi != LOOM_PLUGIN_ABI)
        return reject(handle, path,
                      "built for plugin ABI %u, this loom provides ABI %d; "
                      "rebuild it against this loom's headers", (unsigned)d->abi, LOOM_PLUGIN_ABI);
    if (d->size < desc_min_size)
        return reject(handle, path,
                      "descriptor is %u bytes, this loom needs at least %zu; "
                      "rebuild it against this loom's headers", (unsigned)d->size, desc_min_size);
    const char *kn = loom_kind_name(d->kind);
    if (kn == NULL)
        return reject(handle, path,
                      "descriptor says kind %d, expected one of " KIND_LIST "; "
                      "rebuild it against this loom's headers", (int)d->kind);
    if (d->kind != file_kind || d->name == NULL || strcmp(d->name, file_name) != 0)
        return reject(handle, path,
                      "file name says %s '%s' but the descriptor says %s '%s'; "
                      "rename the file or fix the descriptor",
                      loom_kind_name(file_kind), file_name, kn, str_or(d->name, "(null)"));
    if (d->ops == NULL)
        return reject(handle, path,
                      "descriptor has no ops table (ops is NULL), expected a loom_%s_ops; "
                      "fix the plugin's descriptor", kn);
    size_t ops_size = *(const size_t *)d->ops; /* every ops table starts with its size */
    if (ops_size < ops_min_size(d->kind))
        return reject(handle, path,
                      "loom_%s_ops is %zu bytes, this loom needs at least %zu; "
                      "rebuild it against this loom's headers", kn, ops_size,
                      ops_min_size(d->kind));
    if (d->n_config_keys > 0 && d->config_keys == NULL)
        return reject(handle, path,
                      "descriptor declares %u config keys but config_keys is NULL; "
                      "fix the plugin's descriptor", (unsigned)d->n_config_keys);
    for (uint32_t i = 0; i < d->n_config_keys; i++) {
        const loom_config_key *k = &d->config_keys[i];
        if (k->name == NULL || k->name[0] == '\0' || k->type < LOOM_CFG_NUMBER ||
            k->type > LOOM_CFG_NUMBERS)
            return reject(handle, path,
                          "config key %u is '%s' of type %d, expected a name and a "
                          "loom_cfg_type; fix the plugin's key table",
                          (unsigned)i, str_or(k->name, "(null)"), (int)k->type);
    }
    return LOOM_OK;
}

static entry *cache_find_path(const char *path)
{
    for (size_t i = 0; i < n_cache; i++)
        if (strcmp(cache[i]->pub.path, path) == 0)
            return cache[i];
    return NULL;
}

static entry *cache_find_handle(void *handle)
{
    for (size_t i = 0; i < n_cache; i++)
        if (cache[i]->handle == handle)
            return cache[i];
    return NULL;
}

static loom_status cache_add(void *handle, const char *path, const loom_plugin_desc *d,
                             const loom_plugin **out)
{
    if (n_cache == cap_cache) {
        size_t cap = cap_cache ? 2 * cap_cache : 16;
        entry **grown = realloc(cache, cap * sizeof *grown);
        if (grown == NULL)
            goto nomem;
        cache = grown;
        cap_cache = cap;
    }
    entry *e = malloc(sizeof *e);
    char *p = strdup(path);
    if (e == NULL || p == NULL) {
        free(e);
        free(p);
        goto nomem;
    }
    e->pub.desc = d;
    e->pub.path = p;
    e->handle = handle;
    cache[n_cache++] = e;
    *out = &e->pub;
    /* From now on a crash in its code names it (plugin_crash.c); the label lives until
     * exit, as the entry does. Without memory for it the plugin still loads, unnamed. */
    size_t need = strlen(p) + strlen(str_or(d->name, "?")) + 64;
    char *label = malloc(need);
    if (label != NULL) {
        snprintf(label, need, "plugin '%s' (%s '%s'", p, loom_kind_name(d->kind),
                 str_or(d->name, "?"));
        loom_plugin_crash_note(d, label);
    }
    return LOOM_OK;
nomem:
    dlclose(handle);
    return loom_fail(LOOM_ERR_NOMEM, "out of memory while loading plugin '%s'", path);
}

/* A plugin that crashes while it is loaded (its constructors in dlopen, or its entry) is
 * named before the process dies: while loading, SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT
 * write one prepared line and take their previous action (re-raised). Async-signal-safe:
 * write, sigaction, raise. The previous handlers come back after the load. */
static const int crash_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
#define N_CRASH (sizeof crash_signals / sizeof crash_signals[0])
static struct sigaction crash_saved[N_CRASH];
static char crash_line[PATH_MAX + 256];
static size_t crash_len;

static void on_load_crash(int sig)
{
    ssize_t w = write(2, crash_line, crash_len);
    (void)w;
    for (size_t i = 0; i < N_CRASH; i++)
        if (crash_signals[i] == sig)
            sigaction(sig, &crash_saved[i], NULL);
    raise(sig); /* the previous action, now that the handler returns to the faulting code */
}

static void guard_load(const char *path, int on)
{
    if (!on) {
        for (size_t i = 0; i < N_CRASH; i++)
            sigaction(crash_signals[i], &crash_saved[i], NULL);
        return;
    }
    int n = snprintf(crash_line, sizeof crash_line, "loom: plugin '%s' crashed while loading "
                     "(in its constructors or loom_plugin_entry, which must only return its "
                     "descriptor); remove it from the search path or rebuild it\n", path);
    crash_len = n > 0 && (size_t)n < sizeof crash_line ? (size_t)n : sizeof crash_line - 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_load_crash;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_NODEFER; /* the re-raise inside the handler must not wait for its end */
    for (size_t i = 0; i < N_CRASH; i++)
        sigaction(crash_signals[i], &sa, &crash_saved[i]);
}

static loom_status open_locked(const char *path, const loom_plugin **out)
{
    entry *hit = cache_find_path(path);
    if (hit != NULL) {
        *out = &hit->pub;
        return LOOM_OK;
    }
    loom_kind file_kind;
    char file_name[256];
    if (!parse_file_name(path, &file_kind, file_name, sizeof file_name)) {
        const char *base = strrchr(path, '/');
        return reject(NULL, path,
                      "file name '%s' does not follow loom-<kind>-<name>.so with kind one of "
                      KIND_LIST "; rename the file", base ? base + 1 : path);
    }

    /* A path without '/' would make dlopen search LD_LIBRARY_PATH and the system dirs;
     * the caller named a file, so open that file. */
    char dl_path[PATH_MAX];
    int len = snprintf(dl_path, sizeof dl_path, "%s%s", strchr(path, '/') ? "" : "./", path);
    if (len < 0 || (size_t)len >= sizeof dl_path)
        return reject(NULL, path, "path is longer than %d bytes; use a shorter path", PATH_MAX - 1);
    dlerror();
    guard_load(path, 1);
    void *handle = dlopen(dl_path, RTLD_NOW | RTLD_LOCAL);
    guard_load(path, 0);
    if (handle == NULL) {
        /* dlerror repeats the path as "<path>: why"; keep only the why. */
        const char *why = str_or(dlerror(), "unknown dlopen error");
        size_t dl = strlen(dl_path);
        if (strncmp(why, dl_path, dl) == 0 && strncmp(why + dl, ": ", 2) == 0)
            why += dl + 2;
        return reject(NULL, path,
                      "expected a loadable shared object, dlopen says: %s; check that it was "
                      "built for this machine and that the libraries it needs are installed",
                      why);
    }
    /* The same file under another name: dlopen hands back the same handle. */
    hit = cache_find_handle(handle);
    if (hit != NULL) {
        dlclose(handle); /* drop the extra reference; the cached one stays */
        *out = &hit->pub;
        return LOOM_OK;
    }
    void *sym = dlsym(handle, LOOM_PLUGIN_ENTRY_SYMBOL);
    if (sym == NULL)
        return reject(handle, path,
                      "no symbol '" LOOM_PLUGIN_ENTRY_SYMBOL "' (not a loom plugin, or built "
                      "without LOOM_PLUGIN_EXPORT)");
    loom_plugin_entry_fn entry_fn;
    memcpy(&entry_fn, &sym, sizeof entry_fn); /* object to function pointer, POSIX-sanctioned */
    guard_load(path, 1);
    const loom_plugin_desc *d = entry_fn();
    guard_load(path, 0);
    LOOM_TRY(check_desc(handle, path, d, file_kind, file_name));
    return cache_add(handle, path, d, out);
}

loom_status loom_plugin_open(const char *path, const loom_plugin **out)
{
    if (path == NULL || path[0] == '\0' || out == NULL)
        return loom_fail(LOOM_ERR_INVALID, "loom_plugin_open needs a file path and an out pointer");
    pthread_mutex_lock(&lock);
    loom_status st = open_locked(path, out);
    pthread_mutex_unlock(&lock);
    return st;
}

/* ---- load by kind and name ------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Names of every loom-<kind>-*.so in the search dirs, sorted, unique, ", "-joined. */
static void available_names(loom_kind kind, char *out, size_t cap)
{
    char *names[256];
    int n = 0;
    for (int i = 0; i < n_dirs; i++) {
        DIR *dir = opendir(dirs[i]);
        if (dir == NULL)
            continue;
        struct dirent *de;
        while ((de = readdir(dir)) != NULL && n < (int)(sizeof names / sizeof names[0])) {
            loom_kind k;
            char name[256];
            if (parse_file_name(de->d_name, &k, name, sizeof name) && k == kind)
                if ((names[n] = strdup(name)) != NULL)
                    n++;
        }
        closedir(dir);
    }
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (i == 0 || strcmp(names[i], names[i - 1]) != 0) {
            int w = snprintf(out + used, cap - used, "%s%s", used ? ", " : "", names[i]);
            if (w > 0 && (size_t)w < cap - used)
                used += (size_t)w;
        }
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    if (used == 0)
        snprintf(out, cap, "none");
}

static loom_status not_found_locked(loom_kind kind, const char *name)
{
    char searched[1024] = "", avail[512];
    size_t used = 0;
    for (int i = 0; i < n_dirs; i++) {
        int w = snprintf(searched + used, sizeof searched - used, "%s%s", i ? ", " : "", dirs[i]);
        if (w > 0 && (size_t)w < sizeof searched - used)
            used += (size_t)w;
    }
    if (dirs_nomem && n_dirs == 0)
        return loom_fail(LOOM_ERR_NOMEM, "out of memory building the plugin search path (for %s "
                         "plugin '%s')", loom_kind_name(kind), name);
    available_names(kind, avail, sizeof avail);
    return loom_fail(LOOM_ERR_PLUGIN, "no %s plugin '%s' (searched: %s); available: %s",
                     loom_kind_name(kind), name, n_dirs ? searched : "no directories", avail);
}

loom_status loom_plugin_load(loom_kind kind, const char *name, const loom_plugin **out)
{
    const char *kn = loom_kind_name(kind);
    if (kn == NULL)
        return loom_fail(LOOM_ERR_INVALID, "plugin kind %d is unknown; expected one of " KIND_LIST,
                         (int)kind);
    if (name == NULL || name[0] == '\0' || strchr(name, '/') != NULL || out == NULL)
        return loom_fail(LOOM_ERR_INVALID,
                         "%s plugin name '%s' is not a plain name; expected a word such as "
                         "'adamw' (the file loom-%s-<name>.so is found on the search path)",
                         kn, str_or(name, "(null)"), kn);
    pthread_mutex_lock(&lock);
    build_dirs_locked();
    loom_status st = LOOM_ERR_PLUGIN;
    int found = 0;
    for (int i = 0; i < n_dirs && !found; i++) {
        char path[PATH_MAX];
        int len = snprintf(path, sizeof path, "%s/loom-%s-%s.so", dirs[i], kn, name);
        if (len > 0 && (size_t)len < sizeof path && is_file(path)) {
            found = 1;
            st = open_locked(path, out); /* rejected: no fallback to a later dir */
        }
    }
    if (!found)
        st = not_found_locked(kind, name);
    pthread_mutex_unlock(&lock);
    return st;
}

/* ---- scan ------------------------------------------------------------------------ */

typedef struct seen {
    loom_kind kind;
    char name[256];
    char path[PATH_MAX];
} seen;

static void scan_dir(const char *dirpath, seen **firsts, size_t *n_firsts,
                     loom_plugin_visit_fn visit, void *ctx)
{
    DIR *dir = opendir(dirpath);
    if (dir == NULL)
        return;
    char **files = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        size_t len = strlen(de->d_name);
        if (strncmp(de->d_name, "loom-", 5) != 0 || len < 8 || strcmp(de->d_name + len - 3, ".so"))
            continue;
        if (n == cap) {
            char **grown = realloc(files, (cap = cap ? 2 * cap : 16) * sizeof *files);
            if (grown == NULL)
                break;
            files = grown;
        }
        if ((files[n] = strdup(de->d_name)) != NULL)
            n++;
    }
    closedir(dir);
    qsort(files, n, sizeof *files, cmp_str); /* readdir order is arbitrary; listings are not */

    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX], refusal[2 * PATH_MAX + 512]; /* two paths and words */
        snprintf(path, sizeof path, "%s/%s", dirpath, files[i]);
        free(files[i]);
        if (!is_file(path))
            continue;
        loom_kind kind;
        char name[256];
        const loom_plugin *p = NULL;
        if (parse_file_name(path, &kind, name, sizeof name)) {
            const seen *first = NULL;
            for (size_t j = 0; j < *n_firsts; j++)
                if ((*firsts)[j].kind == kind && strcmp((*firsts)[j].name, name) == 0)
                    first = &(*firsts)[j];
            if (first != NULL) {
                snprintf(refusal, sizeof refusal,
                         "plugin '%s' shadowed: %s '%s' is taken from '%s', which comes first "
                         "on the search path; remove one of them or reorder LOOM_PLUGIN_PATH",
                         path, loom_kind_name(kind), name, first->path);
                visit(ctx, path, NULL, refusal);
                continue;
            }
            seen *grown = realloc(*firsts, (*n_firsts + 1) * sizeof **firsts);
            if (grown != NULL) {
                *firsts = grown;
                seen *s = &grown[(*n_firsts)++];
                s->kind = kind;
                snprintf(s->name, sizeof s->name, "%s", name);
                snprintf(s->path, sizeof s->path, "%s", path);
            }
        }
        if (loom_plugin_open(path, &p) == LOOM_OK) {
            visit(ctx, path, p, NULL);
        } else {
            snprintf(refusal, sizeof refusal, "%s", loom_last_error());
            visit(ctx, path, NULL, refusal);
        }
    }
    free(files);
}

void loom_plugin_scan(loom_plugin_visit_fn visit, void *ctx)
{
    if (visit == NULL)
        return;
    /* Snapshot the list; its strings live until exit, so no lock is held while visiting. */
    pthread_mutex_lock(&lock);
    build_dirs_locked();
    const char **list = dirs;
    int n = n_dirs;
    pthread_mutex_unlock(&lock);

    seen *firsts = NULL;
    size_t n_firsts = 0;
    for (int i = 0; i < n; i++)
        scan_dir(list[i], &firsts, &n_firsts, visit, ctx);
    free(firsts);
}
