/* alloc_inject.c — out-of-memory injection for loom-oom, a test build of the loom program
 * linked with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=posix_memalign,
 * --wrap=strdup,--wrap=free (tests/faults/meson.build), so that every allocation loom's own
 * code makes (the core and the CLI; not libc's, Lua's or a plugin's) comes through here.
 *
 *   LOOM_INJECT_OOM=N      the N-th allocation (N >= 1) fails: NULL and errno ENOMEM.
 *   LOOM_INJECT_OOM=count  count only.
 * Either way, at exit one line on stderr:
 *   loom-oom: A allocations, L live at exit, failed: yes|no
 * L counts the blocks allocated here and not freed (by any caller) when the process
 * exits normally: a clean run's L is the baseline the test compares a failing run with.
 * What not: the production `loom` has none of this (no wrapping, no cost).
 * Invariants: single-threaded callers for the live set (the core allocates from the main
 * thread); the live set is an open-addressing table of pointers, allocated with the real
 * calloc on first use.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);
int __wrap_posix_memalign(void **p, size_t align, size_t n);
char *__wrap_strdup(const char *s);
void __wrap_free(void *p);

enum { LIVE_CAP = 1 << 20 };
static uintptr_t *live;
static long live_n, count, fail_at = -1;
static int ready, armed, failed;

static void at_exit(void)
{
    fprintf(stderr, "loom-oom: %ld allocations, %ld live at exit, failed: %s\n", count, live_n,
            failed ? "yes" : "no");
}

static void setup(void)
{
    if (ready)
        return;
    ready = 1;
    const char *v = getenv("LOOM_INJECT_OOM");
    if (!v || !v[0])
        return;
    armed = 1;
    if (strcmp(v, "count") != 0) {
        char *end;
        fail_at = strtol(v, &end, 10);
        if (*end || fail_at < 1) {
            fprintf(stderr, "loom-oom: LOOM_INJECT_OOM=\"%s\" must be N >= 1 or count\n", v);
            exit(2);
        }
    }
    live = __real_calloc(LIVE_CAP, sizeof *live);
    atexit(at_exit);
}

static size_t slot_of(uintptr_t p) { return (size_t)((p >> 4) * 0x9e3779b97f4a7c15ull) & (LIVE_CAP - 1); }

static void live_add(void *p)
{
    if (!p || !live)
        return;
    for (size_t i = slot_of((uintptr_t)p);; i = (i + 1) & (LIVE_CAP - 1))
        if (live[i] == 0 || live[i] == 1) {
            live[i] = (uintptr_t)p;
            live_n++;
            return;
        }
}

static void live_remove(void *p)
{
    if (!p || !live)
        return;
    for (size_t i = slot_of((uintptr_t)p); live[i] != 0; i = (i + 1) & (LIVE_CAP - 1))
        if (live[i] == (uintptr_t)p) {
            live[i] = 1; /* a tombstone: later entries of the probe chain stay reachable */
            live_n--;
            return;
        }
}

/* 1 if this allocation must fail. */
static int must_fail(void)
{
    setup();
    if (!armed)
        return 0;
    if (++count != fail_at)
        return 0;
    failed = 1;
    errno = ENOMEM;
    return 1;
}

void *__wrap_malloc(size_t n)
{
    if (must_fail())
        return NULL;
    void *p = __real_malloc(n);
    live_add(p);
    return p;
}

void *__wrap_calloc(size_t a, size_t b)
{
    if (must_fail())
        return NULL;
    void *p = __real_calloc(a, b);
    live_add(p);
    return p;
}

void *__wrap_realloc(void *p, size_t n)
{
    if (must_fail())
        return NULL; /* p stays valid, as realloc promises */
    void *q = __real_realloc(p, n);
    if (q) {
        live_remove(p);
        live_add(q);
    }
    return q;
}

int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
    if (must_fail())
        return ENOMEM;
    int rc = __real_posix_memalign(p, align, n);
    if (rc == 0)
        live_add(*p);
    return rc;
}

char *__wrap_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = __wrap_malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

void __wrap_free(void *p)
{
    live_remove(p);
    __real_free(p);
}
