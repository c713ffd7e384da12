/* lua_limits.h — the bounds a recipe's Lua code runs within under `loom run`: a memory cap
 * (a counting allocator, lua_setallocf), an instruction budget between training steps (a
 * count hook), and source-only chunks (load, loadfile, dofile and require take text only).
 *
 * The budget is reset by every training step (s:step), so a long run never meets it; an
 * infinite loop in the recipe or in on_step does, with the file:line it was at. The limits
 * come from LOOM_LUA_MEMORY_MB (default 4096) and LOOM_LUA_INSTRUCTIONS (default 2e9,
 * some 30 s of Lua; 0 turns it off), both named in the message that stops a run.
 */
#ifndef LOOM_CORE_LUA_LIMITS_H
#define LOOM_CORE_LUA_LIMITS_H

#include <lua.h>

/* Install the three on L (call right after the libraries are open). Returns 0, or -1 with
 * a message on stderr when an environment value is not a number. */
int loom_lua_limits_install(lua_State *L);

/* A training step ran: the instruction budget starts again. */
void loom_lua_limits_progress(void);

/* Did the memory cap refuse an allocation? Then the cap's message (else NULL): shown in
 * place of whatever message the failed allocation ended in. */
const char *loom_lua_limits_memory_message(void);

#endif
