/* cli.c — the `loom` program: run a recipe, list plugins, plot a run's metrics.
 *
 *   loom run RECIPE [key=value ...]   run a Lua recipe; key=value overrides recipe fields
 *   loom launch -n N RECIPE [...]     run N local ranks of a recipe (launch.c)
 *   loom plugins [--keys NAME]        list every plugin found, and every file refused;
 *                                     or the keys plugin NAME accepts
 *   loom CMD --help                   a command's options and an example (loom.help)
 *   loom plot A.jsonl [B.jsonl ...] [-o SVG] [--smooth N] [--log]   plot runs' metrics
 *   loom export --llmc CKPT OUT.bin   write a checkpoint's weights as an llm.c model file
 *   loom sample CKPT --prompt TEXT [--tokens N ...]   generate text from a checkpoint
 *   loom bench comm [-n N] [--op OP] [--sizes 1K:64M] [--comm shm]   communicator bandwidth
 *   loom schedule NAME --pp P --micro M [--chunks V] [-o SVG]   a pipeline schedule simulated
 *   loom version
 *
 * The Lua library is found in LOOM_LUA_PATH (if set), else next to the sources when this
 * binary runs from its build tree, else in the install dir.
 */
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/launch.h"
#include "loom/loom.h"
#include "dist/dist.h"
#include "lua_limits.h"
#include "lua_loom.h"
#include "dist/ranks.h"

static const char *lua_library_dir(void)
{
    const char *env = getenv("LOOM_LUA_PATH");
    if (env && *env)
        return env;
    static char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        char build[PATH_MAX];
        if (realpath(LOOM_BUILD_DIR, build) && strcmp(exe, build) == 0)
            return LOOM_SOURCE_LUA_DIR;
    }
    return LOOM_INSTALL_LUA_DIR;
}

static int usage(FILE *out)
{
    fputs("usage: loom run RECIPE [key=value ...]   train/run a Lua recipe; key=value overrides\n"
          "                                         any recipe field (batch.micro=8, steps=20)\n"
          "       loom launch -n N RECIPE [key=value ...]  run N local ranks of a recipe\n"
          "       loom plugins [--keys NAME]        list the plugins found and where; a plugin's keys\n"
          "       loom plot METRICS.jsonl [MORE.jsonl ...] [-o SVG] [--smooth N] [--log]\n"
          "                                         plot runs' loss, grad norm, tokens/s and lr\n"
          "       loom plan RECIPE [key=value ...]  memory and step time per rank before the run;\n"
          "                                         --world N --mem 80GiB searches layouts\n"
          "       loom distill-cache RECIPE --out FILE [--k K] [key=value ...]\n"
          "                                         run the recipe's teacher over its training data\n"
          "                                         once; write top-k logits (teacher = { cache })\n"
          "       loom export --llmc CKPT OUT.bin   write a checkpoint's weights as an llm.c model\n"
          "       loom ckpt info CKPT | loom ckpt export CKPT OUT.safetensors\n"
          "                                         what a checkpoint holds (checksums verified);\n"
          "                                         its weights as one safetensors file\n"
          "       loom sample CKPT --prompt TEXT [--tokens N] [--temperature T] [--top-k K] [--seed S]\n"
          "                                         generate from a checkpoint (loom sample --help)\n"
          "       loom bench comm [-n N] [--op OP] [--sizes 1K:64M] [--comm shm]\n"
          "                                         communicator bandwidth, as nccl-tests prints it\n"
          "       loom schedule NAME --pp P --micro M [--chunks V] [-o SVG]\n"
          "                                         a pipeline schedule's timeline, bubble, memory\n"
          "       loom version\n"
          "loom CMD --help prints a command's options and an example.\n",
          out);
    return out == stderr ? 2 : 0;
}

static lua_State *new_state(void)
{
    lua_State *L = luaL_newstate();
    if (!L)
        return NULL;
    luaL_openlibs(L);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    lua_pushcfunction(L, luaopen_loom_core);
    lua_setfield(L, -2, "loom.core");
    lua_pop(L, 1);
    const char *dir = lua_library_dir();
    lua_getglobal(L, "package");
    lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;", dir, dir);
    lua_getfield(L, -2, "path");
    lua_concat(L, 2);
    lua_setfield(L, -2, "path");
    lua_pop(L, 1);
    /* Commands that start more ranks of this program need its path. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    lua_pushstring(L, n > 0 ? (exe[n] = '\0', exe) : "loom");
    lua_setglobal(L, "LOOM_EXE");
    return L;
}

/* Run a chunk already on the stack; print "loom: <message>" on error. An error object
 * { stop_signal = N, message = "..." } (loom.train after a stop signal's save) is a stop,
 * not a failure: its message, and the conventional status 128 + N. */
static int run_protected(lua_State *L, int nargs)
{
    if (lua_pcall(L, nargs, 0, 0) == LUA_OK)
        return 0;
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "stop_signal");
        lua_getfield(L, -2, "message");
        int sig = (int)lua_tointeger(L, -2);
        if (sig > 0 && sig < 64) {
            const char *m = lua_tostring(L, -1); /* nil on ranks other than 0 */
            if (m)
                fprintf(stderr, "loom: %s\n", m);
            return 128 + sig;
        }
        lua_pop(L, 2);
    }
    const char *msg = lua_tostring(L, -1), *cap = loom_lua_limits_memory_message();
    if (cap) /* the cap refused: whatever the failed allocation's message became, say why */
        fprintf(stderr, "loom: %s (%s)\n", cap, msg ? msg : "not enough memory");
    else
        fprintf(stderr, "loom: %s\n", msg ? msg : "(error object is not a string)");
    return 1;
}

/* __index of the loom.core table under `loom run`: core.overrides is the list (upvalue 1)
 * and reading it sets core.overrides_read. */
static int overrides_index(lua_State *L)
{
    const char *k = lua_tostring(L, 2);
    if (!k || strcmp(k, "overrides") != 0)
        return 0;
    lua_pushboolean(L, 1);
    lua_setfield(L, 1, "overrides_read"); /* a plain field: __index is not consulted */
    lua_pushvalue(L, lua_upvalueindex(1));
    return 1;
}

/* A recipe that never read the command line's overrides (loom.train, loom.options,
 * loom.overrides and any read of core.overrides do; a custom loop may do none) ran without them: say so once, on
 * rank 0, naming them, rather than let `stepz=10` pass without a word. */
static void warn_unread_overrides(lua_State *L, int n, char **kv)
{
    if (n < 1)
        return;
    lua_getglobal(L, "require");
    lua_pushstring(L, "loom.core");
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        lua_pop(L, 1);
        return;
    }
    lua_getfield(L, -1, "overrides_read");
    int read = lua_toboolean(L, -1);
    lua_getfield(L, -2, "rank");
    int rank = (int)lua_tointeger(L, -1);
    lua_pop(L, 3);
    if (read || rank != 0)
        return;
    fputs("loom: warning: the recipe never read the command line's overrides (", stderr);
    for (int i = 0; i < n; i++)
        fprintf(stderr, "%s%s", i ? " " : "", kv[i]);
    fputs("): it neither calls loom.train nor reads loom.options or loom.overrides\n", stderr);
}

/* OpenMP threads that wait for work spin by default (libgomp: 300,000 spins): fastest on an
 * idle machine and ruinous on a shared one, where a spinning thread holds the core another
 * process needs. Passive waits (a futex sleep at once) are the opposite: best beside a busy
 * process, but each of a small model's many parallel regions then pays a wake-up. A short
 * bounded spin (GOMP_SPINCOUNT=1000) lost at most ~14% to the best of the two in either
 * case on the 2-core EPYC, where each extreme lost 35% (passive, quiet) or 2x (default
 * spin, beside one busy process): docs/BENCHMARKS.md. So unless the user chose
 * (OMP_WAIT_POLICY or GOMP_SPINCOUNT), `loom run` spins briefly; `loom launch` asks its
 * ranks for passive waits, since there they share the cores with each other. Set before
 * the backend (and with it libgomp) is loaded, which reads it once. */
static void share_the_machine(void)
{
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"))
        setenv("GOMP_SPINCOUNT", "1000", 0);
}

/* The start-up rendezvous opens at the recipe's first collective and is bounded by the
 * recipe's comm_timeout; a comm_timeout=S on the command line (as `loom launch` passes it to
 * every rank) wins, by setting LOOM_RENDEZVOUS_TIMEOUT_MS unless that is set already. A value that is not a positive
 * number is left for the recipe check to refuse. */
static void rendezvous_timeout_from_args(int n, char **kv)
{
    if (getenv("LOOM_RENDEZVOUS_TIMEOUT_MS"))
        return;
    for (int i = 0; i < n; i++) {
        if (strncmp(kv[i], "comm_timeout=", 13) != 0)
            continue;
        char *end;
        double s = strtod(kv[i] + 13, &end);
        if (*end == '\0' && end != kv[i] + 13 && s > 0 && s < 1e6) {
            char ms[32];
            snprintf(ms, sizeof ms, "%.0f", s * 1000 < 1 ? 1 : s * 1000);
            setenv("LOOM_RENDEZVOUS_TIMEOUT_MS", ms, 1);
        }
    }
}

/* cache_out: `loom distill-cache` (scripts/loom/distill_cache.lua): loom.train writes the
 * teacher's top cache_k logits there instead of training; NULL: `loom run`. */
static int cmd_run(int argc, char **argv, const char *cache_out, const char *cache_k)
{
    if (argc < 1)
        return usage(stderr);
    share_the_machine();
    rendezvous_timeout_from_args(argc - 1, argv + 1);
    if (loom_ranks_join() != LOOM_OK) { /* rank/world from the environment */
        fprintf(stderr, "loom: %s\n", loom_last_error());
        return 1;
    }
    lua_State *L = new_state();
    if (!L) {
        fputs("loom: cannot create a Lua state (out of memory)\n", stderr);
        return 1;
    }
    if (loom_lua_limits_install(L) != 0) { /* memory cap, instruction budget, source only */
        lua_close(L);
        return 2;
    }
    /* require("loom.core").overrides = { {"batch.micro", "8"}, ... } */
    lua_getglobal(L, "require");
    lua_pushstring(L, "loom.core");
    lua_call(L, 1, 1);
    lua_createtable(L, argc - 1, 0);
    for (int i = 1; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (!eq || eq == argv[i]) {
            fprintf(stderr, "loom: '%s' is not a key=value override (e.g. steps=20, "
                            "batch.micro=8, optimizer.lr=1e-3)\n", argv[i]);
            lua_close(L);
            return 2;
        }
        lua_createtable(L, 2, 0);
        lua_pushlstring(L, argv[i], (size_t)(eq - argv[i]));
        lua_rawseti(L, -2, 1);
        lua_pushstring(L, eq + 1);
        lua_rawseti(L, -2, 2);
        lua_rawseti(L, -2, i);
    }
    /* core.overrides is served by core's __index, which also notes that it was read
     * (core.overrides_read), so a recipe that never looks can be warned about */
    lua_createtable(L, 0, 1);
    lua_insert(L, -2);
    lua_pushcclosure(L, overrides_index, 1);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
    loom_lua_open_ranks(L); /* core.rank, .world, .local_rank, .check_same_config */
    if (cache_out) { /* core.distill_cache = { out = FILE, k = "K" or nil } */
        lua_createtable(L, 0, 2);
        lua_pushstring(L, cache_out);
        lua_setfield(L, -2, "out");
        lua_pushstring(L, cache_k);
        lua_setfield(L, -2, "k");
        lua_setfield(L, -2, "distill_cache");
    }
    lua_pop(L, 1);
    /* arg table as the standalone interpreter makes it */
    lua_createtable(L, argc, 1);
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i);
    }
    lua_setglobal(L, "arg");
    int rc;
    if (luaL_loadfilex(L, argv[0], "t") != LUA_OK) { /* "t": source only */
        const char *msg = lua_tostring(L, -1);
        if (msg && strstr(msg, "attempt to load a binary chunk"))
            fprintf(stderr, "loom: recipe '%s' is a precompiled (binary) Lua chunk: loom runs "
                            "recipes from source only (binary chunks skip the parser's checks, and "
                            "Lua does not verify bytecode); give the .lua file\n", argv[0]);
        else
            fprintf(stderr, "loom: %s\n", msg);
        rc = 1;
    } else {
        rc = run_protected(L, 0);
    }
    if (rc == 0)
        warn_unread_overrides(L, argc - 1, argv + 1);
    /* Every rank of a job meets at least once, even in a recipe without collectives: a rank
     * that never came is named here (bounded by the environment's or the default timeout). */
    loom_rendezvous *met = NULL;
    if (rc == 0 && loom_cli_rendezvous_open(0, &met) != LOOM_OK) {
        fprintf(stderr, "loom: %s\n", loom_last_error());
        rc = 1;
    }
    int stopped = rc > 128; /* a stop signal's orderly end: every rank saved; leave cleanly */
    lua_close(L); /* sessions (and the strategies using the groups) are freed here */
    loom_dist_shutdown(); /* then the communicators: MPI wants MPI_Finalize on every rank */
    loom_ranks_leave(rc == 0 || stopped);
    return rc;
}

/* `loom distill-cache RECIPE --out FILE [--k K] [key=value ...]`: --out and --k taken out,
 * the rest run as `loom run` does. */
static int cmd_distill_cache(int argc, char **argv)
{
    const char *out = NULL, *k = NULL;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest)
        return 1;
    int n = 0, rc = 2;
    for (int i = 0; i < argc; i++) {
        int is_out = strcmp(argv[i], "--out") == 0, is_k = strcmp(argv[i], "--k") == 0;
        if ((is_out || is_k) && i + 1 >= argc) {
            fprintf(stderr, "loom: distill-cache: %s needs a value (loom distill-cache RECIPE "
                            "--out FILE [--k K])\n", argv[i]);
            goto done;
        }
        if (is_out || is_k)
            *(is_out ? &out : &k) = argv[++i];
        else
            rest[n++] = argv[i];
    }
    if (!out || n < 1) {
        fputs("loom: distill-cache: usage: loom distill-cache RECIPE --out FILE [--k K] "
              "[key=value ...]\n", stderr);
        goto done;
    }
    rc = cmd_run(n, rest, out, k);
done:
    free(rest);
    return rc;
}

/* Commands written in Lua: `loom NAME ARGS...` runs require('loom.cli')[NAME]({ARGS...});
 * the Lua side parses its arguments. */
static int cmd_lua(const char *name, int argc, char **argv)
{
    lua_State *L = new_state();
    if (!L)
        return 1;
    int rc = 1;
    if (luaL_loadstring(L, "local name, args = ...; return require('loom.cli')[name](args)") == LUA_OK) {
        lua_pushstring(L, name);
        lua_createtable(L, argc, 0);
        for (int i = 0; i < argc; i++) {
            lua_pushstring(L, argv[i]);
            lua_rawseti(L, -2, i + 1);
        }
        rc = run_protected(L, 2);
    }
    lua_close(L);
    return rc;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2)
        return usage(stderr);
    const char *cmd = argv[1];
    /* `loom CMD --help` (or -h anywhere among its arguments): the command's own help, for
     * every command, from one table (scripts/loom/help.lua). */
    static const char *const commands[] = {"run", "launch", "plugins", "plot", "export", "bench",
                                           "schedule", "sample", "ckpt", "plan", "version",
                                           "distill-cache", NULL};
    for (int c = 0; commands[c]; c++) {
        if (strcmp(cmd, commands[c]) != 0)
            continue;
        for (int i = 2; i < argc; i++)
            if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
                /* `loom ckpt info -h`: the subcommand's own help */
                char sub[32];
                int has_sub = strcmp(cmd, "ckpt") == 0 && argc > 2 &&
                              (strcmp(argv[2], "info") == 0 || strcmp(argv[2], "export") == 0);
                snprintf(sub, sizeof sub, "ckpt %s", has_sub ? argv[2] : "");
                char *name[] = {has_sub ? sub : (char *)commands[c]};
                return cmd_lua("help", 1, name);
            }
    }
    if (strcmp(cmd, "run") == 0)
        return cmd_run(argc - 2, argv + 2, NULL, NULL);
    if (strcmp(cmd, "distill-cache") == 0)
        return cmd_distill_cache(argc - 2, argv + 2);
    if (strcmp(cmd, "launch") == 0)
        return loom_launch_main(argc - 2, argv + 2);
    if (strcmp(cmd, "plugins") == 0)
        return cmd_lua("plugins", argc - 2, argv + 2);
    if (strcmp(cmd, "plot") == 0 || strcmp(cmd, "export") == 0 || strcmp(cmd, "bench") == 0 ||
        strcmp(cmd, "schedule") == 0 || strcmp(cmd, "sample") == 0 || strcmp(cmd, "ckpt") == 0 ||
        strcmp(cmd, "plan") == 0)
        return cmd_lua(cmd, argc - 2, argv + 2);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("loom %s\n", LOOM_VERSION_STRING);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0)
        return usage(stdout);
    fprintf(stderr, "loom: unknown command '%s'\n", cmd);
    return usage(stderr);
}
