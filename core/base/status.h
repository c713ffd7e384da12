/* status.h — recording errors: LOOM_FAIL / LOOM_TRY and the thread-local message behind
 * loom_last_error(). Private to the core; plugins report through loom_host.fail. */
#ifndef LOOM_CORE_STATUS_H
#define LOOM_CORE_STATUS_H

#include <stdarg.h>
#include "loom/loom.h"

/* Record "message" (no file:line) as this thread's last error and return st. */
loom_status loom_fail(loom_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
loom_status loom_failv(loom_status st, const char *fmt, va_list ap);
/* Clear the message (start of a new operation). */
void loom_clear_error(void);

/* Record "file:line: message" and return st from the enclosing function. The file:line
 * is the core source location; use it for internal failures. User-facing messages that
 * must read cleanly use loom_fail directly. */
#define LOOM_FAIL(st, ...) return loom_fail((st), __VA_ARGS__)

/* Propagate a failure: evaluate expr and return its status if not LOOM_OK. */
#define LOOM_TRY(expr)                         \
    do {                                       \
        loom_status loom_try_st_ = (expr);     \
        if (loom_try_st_ != LOOM_OK)           \
            return loom_try_st_;               \
    } while (0)

/* An invariant: a bug in loom if false. Never for input validation. */
#define LOOM_ASSERT(cond)                                                                   \
    do {                                                                                    \
        if (!(cond))                                                                        \
            loom_assert_failed(#cond, __FILE__, __LINE__);                                  \
    } while (0)
void loom_assert_failed(const char *cond, const char *file, int line) __attribute__((noreturn));

#endif
