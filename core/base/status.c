/* status.c — the thread-local error message and the names of statuses, dtypes, kinds. */
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin.h"

static _Thread_local char last_error[2048];

const char *loom_last_error(void) { return last_error; }

void loom_clear_error(void) { last_error[0] = '\0'; }

loom_status loom_failv(loom_status st, const char *fmt, va_list ap)
{
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    return st;
}

loom_status loom_fail(loom_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    loom_failv(st, fmt, ap);
    va_end(ap);
    return st;
}

void loom_assert_failed(const char *cond, const char *file, int line)
{
    fprintf(stderr, "loom: internal error: %s:%d: assertion '%s' failed (a bug in loom)\n", file,
            line, cond);
    abort();
}

const char *loom_status_name(loom_status st)
{
    static const char *const names[] = {
        "LOOM_OK", "LOOM_ERR_INVALID", "LOOM_ERR_NOMEM", "LOOM_ERR_IO", "LOOM_ERR_PLUGIN",
        "LOOM_ERR_UNSUPPORTED", "LOOM_ERR_COMM", "LOOM_ERR_TIMEOUT", "LOOM_ERR_CORRUPT",
        "LOOM_ERR_INTERNAL"};
    if ((unsigned)st < sizeof names / sizeof names[0])
        return names[st];
    return "LOOM_ERR_UNKNOWN";
}

size_t loom_dtype_size(loom_dtype dt)
{
    switch (dt) {
    case LOOM_DTYPE_F32: case LOOM_DTYPE_I32: return 4;
    case LOOM_DTYPE_BF16: case LOOM_DTYPE_F16: case LOOM_DTYPE_U16: return 2;
    case LOOM_DTYPE_U8: return 1;
    }
    return 0;
}

const char *loom_dtype_name(loom_dtype dt)
{
    switch (dt) {
    case LOOM_DTYPE_F32: return "f32";
    case LOOM_DTYPE_BF16: return "bf16";
    case LOOM_DTYPE_F16: return "f16";
    case LOOM_DTYPE_I32: return "i32";
    case LOOM_DTYPE_U8: return "u8";
    case LOOM_DTYPE_U16: return "u16";
    }
    return "?";
}

const char *loom_kind_name(loom_kind kind)
{
    switch (kind) {
    case LOOM_KIND_COMM: return "comm";
    case LOOM_KIND_STRATEGY: return "strategy";
    case LOOM_KIND_OPTIM: return "optim";
    case LOOM_KIND_PRECISION: return "precision";
    case LOOM_KIND_SCHED: return "sched";
    case LOOM_KIND_BACKEND: return "backend";
    }
    return NULL;
}
