/* lua_sys.c — the few operating-system facts the Lua library needs to show a run:
 * core.isatty(fd), core.term_width(fd), core.peak_rss(), core.now(), core.mkdir_p(path),
 * core.catch_stop_signals(on), core.signal_name(signo).
 *
 * Plain Lua 5.4 has no monotonic clock (os.clock is CPU time, summed over threads), no
 * memory figure, no isatty, no terminal size and no mkdir; these are thin POSIX
 * wrappers, nothing more.
 * Failures that a caller can report (mkdir_p) return nil, message as io.open does.
 */
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lua_loom.h"
#include "base/clock.h"
#include "base/stop_signal.h"

/* core.isatty(fd) -> boolean: is fd (1 = stdout) a terminal? Decides in-place redraw. */
static int l_isatty(lua_State *L)
{
    lua_pushboolean(L, isatty((int)luaL_checkinteger(L, 1)) == 1);
    return 1;
}

/* core.term_width(fd) -> columns, or nil where fd is not a terminal or its size is not
 * known (ioctl TIOCGWINSZ; a pty that nobody sized reports 0). Fits the progress line. */
static int l_term_width(lua_State *L)
{
    struct winsize ws;
    if (ioctl((int)luaL_checkinteger(L, 1), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        lua_pushinteger(L, ws.ws_col);
    else
        lua_pushnil(L);
    return 1;
}

/* core.peak_rss() -> bytes: the process's peak resident set size (getrusage ru_maxrss,
 * which Linux gives in KiB and macOS in bytes). */
static int l_peak_rss(lua_State *L)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return luaL_error(L, "getrusage: %s", strerror(errno));
#ifdef __APPLE__
    lua_pushinteger(L, (lua_Integer)ru.ru_maxrss);
#else
    lua_pushinteger(L, (lua_Integer)ru.ru_maxrss * 1024);
#endif
    return 1;
}

/* core.now() -> seconds (double) on a monotonic clock: differences only, never dates. */
static int l_now(lua_State *L)
{
    lua_pushnumber(L, loom_now_s());
    return 1;
}

/* core.mkdir_p(path) -> true, or nil, "cannot create directory 'a/b': <reason>".
 * Creates every missing component (mode 0777 less umask); an existing directory is fine. */
static int l_mkdir_p(lua_State *L)
{
    size_t n;
    const char *path = luaL_checklstring(L, 1, &n);
    luaL_Buffer b;
    char *buf = luaL_buffinitsize(L, &b, n + 1);
    memcpy(buf, path, n + 1);
    /* Create each prefix ending before a '/', then the whole path. */
    for (size_t i = 1; i <= n; i++) {
        if (i < n && buf[i] != '/')
            continue;
        char saved = buf[i];
        buf[i] = '\0';
        int failed = mkdir(buf, 0777) != 0 && errno != EEXIST;
        struct stat st;
        if (!failed && stat(buf, &st) == 0 && !S_ISDIR(st.st_mode)) {
            failed = 1;
            errno = ENOTDIR;
        }
        if (failed) {
            lua_pushnil(L);
            lua_pushfstring(L, "cannot create directory '%s': %s", buf, strerror(errno));
            return 2;
        }
        buf[i] = saved;
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* core.catch_stop_signals(on): while on, SIGTERM, SIGINT and SIGUSR1 only set a flag that
 * the next step's exchange reads (s:step's result gets stop_signal); off restores their
 * default action (base/stop_signal.h). */
static int l_catch_stop_signals(lua_State *L)
{
    loom_stop_arm(lua_toboolean(L, 1));
    return 0;
}

/* core.signal_name(signo) -> "SIGTERM", ... */
static int l_signal_name(lua_State *L)
{
    lua_pushstring(L, loom_stop_signal_name((int)luaL_checkinteger(L, 1)));
    return 1;
}

static const luaL_Reg sys_funcs[] = {{"catch_stop_signals", l_catch_stop_signals},
                                     {"signal_name", l_signal_name},{"isatty", l_isatty},
                                     {"term_width", l_term_width},
                                     {"peak_rss", l_peak_rss},
                                     {"now", l_now},
                                     {"mkdir_p", l_mkdir_p},
                                     {NULL, NULL}};

void loom_lua_open_sys(lua_State *L) { luaL_setfuncs(L, sys_funcs, 0); }
