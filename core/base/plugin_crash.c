/* plugin_crash.c — naming the plugin a crash happened in (the API in plugin_crash.h).
 *
 * What: once a plugin is accepted, its executable segments are noted; a SIGSEGV, SIGBUS,
 * SIGILL or SIGFPE anywhere later in the process looks at the faulting instruction and,
 * if that is not inside a plugin, at the stack above it (a plugin that passes a bad
 * pointer to memcpy faults inside libc). The first frame inside a plugin names it:
 *   loom: SIGSEGV inside plugin '<path>' (optim 'crash', at +0x1139); ...
 * A frame inside the core (this library or the loom executable) ends the walk first: that
 * crash is loom's own and is not blamed on a plugin. Either way the previous action runs
 * (re-raised), so exit statuses, core dumps and sanitizers see the signal as before.
 * What not: no recovery, no unwinding of loom's own state; SIGABRT is left alone (an
 * abort is a deliberate exit with its own message).
 * Invariants: the handler touches only memory prepared before it runs (the segment table,
 * fixed-size, filled under the loader's mutex) and calls write, sigaction, raise and
 * backtrace; backtrace is called once at install so its lazy loading of libgcc_s never
 * happens inside the handler.
 */
#include "plugin_crash.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

enum { MAX_SEGMENTS = 256, MAX_FRAMES = 64 };

typedef struct segment {
    uintptr_t lo, hi;     /* [lo, hi) executable bytes of one loaded object */
    uintptr_t base;       /* its load address, for the offset in the message */
    const char *label;    /* prepared "plugin '<path>' (<kind> '<name>'" text; NULL: core */
} segment;

static segment segments[MAX_SEGMENTS];
static volatile sig_atomic_t n_segments;

static const int watched[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
#define N_WATCHED (sizeof watched / sizeof watched[0])
static struct sigaction previous[N_WATCHED];
static int installed;

/* dl_iterate_phdr visitor: note the executable PT_LOAD segments of the object at base. */
typedef struct note_ctx {
    uintptr_t base;
    const char *label;
    int found;
} note_ctx;

static int note_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    note_ctx *c = arg;
    if ((uintptr_t)info->dlpi_addr != c->base)
        return 0;
    for (int i = 0; i < info->dlpi_phnum && n_segments < MAX_SEGMENTS; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        segment *s = &segments[n_segments];
        s->lo = c->base + ph->p_vaddr;
        s->hi = s->lo + ph->p_memsz;
        s->base = c->base;
        s->label = c->label;
        n_segments = n_segments + 1; /* published after the entry is whole */
    }
    c->found = 1;
    return 1;
}

/* The object that holds address addr, by its load address (0 when dladdr cannot tell). */
static uintptr_t base_of(const void *addr)
{
    Dl_info di;
    struct link_map *map = NULL;
    if (dladdr1(addr, &di, (void **)&map, RTLD_DL_LINKMAP) == 0 || map == NULL)
        return 0;
    return (uintptr_t)map->l_addr;
}

static const segment *segment_at(uintptr_t pc)
{
    for (sig_atomic_t i = 0; i < n_segments; i++)
        if (pc >= segments[i].lo && pc < segments[i].hi)
            return &segments[i];
    return NULL;
}

static uintptr_t faulting_pc(const void *uc_arg)
{
    const ucontext_t *uc = uc_arg;
    if (uc == NULL)
        return 0;
#if defined(__x86_64__)
    return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (uintptr_t)uc->uc_mcontext.pc;
#else
    return 0;
#endif
}

static void put(const char *s) { ssize_t w = write(2, s, strlen(s)); (void)w; }

/* Unsigned hex without printf (not async-signal-safe). */
static void put_hex(uintptr_t v)
{
    char buf[2 + 2 * sizeof v + 1], *p = buf + sizeof buf - 1;
    *p = '\0';
    do {
        *--p = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v && p > buf + 2);
    *--p = 'x';
    *--p = '0';
    put(p);
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    }
    return "a signal";
}

static void on_crash(int sig, siginfo_t *info, void *uc)
{
    (void)info;
    const segment *hit = segment_at(faulting_pc(uc));
    uintptr_t at = hit ? faulting_pc(uc) : 0;
    int indirect = 0;
    if (hit == NULL) {
        void *frames[MAX_FRAMES];
        int n = backtrace(frames, MAX_FRAMES);
        for (int i = 0; i < n && hit == NULL; i++) {
            const segment *s = segment_at((uintptr_t)frames[i]);
            if (s != NULL && s->label == NULL)
                break; /* the core's own frame first: loom's crash, not a plugin's */
            if (s != NULL) {
                hit = s;
                at = (uintptr_t)frames[i];
                indirect = 1;
            }
        }
    }
    if (hit != NULL && hit->label != NULL) {
        put("loom: ");
        put(signal_name(sig));
        put(" inside ");
        put(hit->label);
        put(indirect ? ", in a call it made, from +" : ", at +");
        put_hex(at - hit->base);
        put("): the plugin crashed, not loom; remove it from the search path or rebuild it "
            "with -g and run the job under gdb to see where\n");
    }
    for (size_t i = 0; i < N_WATCHED; i++)
        if (watched[i] == sig)
            sigaction(sig, &previous[i], NULL);
    raise(sig); /* the previous action, on return to the faulting instruction at the latest */
}

static void install(void)
{
    void *warm[1];
    (void)backtrace(warm, 1); /* loads the unwinder now, never inside the handler */
    note_ctx core = {base_of((const void *)install), NULL, 0};
    dl_iterate_phdr(note_object, &core);
    note_ctx exe = {base_of((const void *)dlsym(RTLD_DEFAULT, "main")), NULL, 0};
    if (exe.base != core.base && dlsym(RTLD_DEFAULT, "main") != NULL)
        dl_iterate_phdr(note_object, &exe);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_crash;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_NODEFER; /* the re-raise must not wait for the return */
    for (size_t i = 0; i < N_WATCHED; i++)
        sigaction(watched[i], &sa, &previous[i]);
    installed = 1;
}

void loom_plugin_crash_note(const void *symbol, const char *label)
{
    if (!installed)
        install();
    note_ctx c = {base_of(symbol), label, 0};
    if (c.base != 0 || symbol != NULL)
        dl_iterate_phdr(note_object, &c);
}
