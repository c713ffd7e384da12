/* plugin_crash.h — a crash inside a plugin's code names the plugin before the process dies.
 * The loader calls loom_plugin_crash_note for each plugin it accepts; the first call also
 * installs the handler (SIGSEGV, SIGBUS, SIGILL, SIGFPE; the previous action still runs). */
#ifndef LOOM_BASE_PLUGIN_CRASH_H
#define LOOM_BASE_PLUGIN_CRASH_H

/* symbol: any address inside the plugin (its descriptor); label: a text that lives until
 * exit, e.g. "plugin '/x/loom-optim-sgd.so' (optim 'sgd'" — the message closes the
 * parenthesis. Call under the loader's mutex. */
void loom_plugin_crash_note(const void *symbol, const char *label);

#endif
