/* loom.h — the core's public vocabulary: status codes, dtypes, the error channel.
 *
 * Everything a plugin or an embedding program shares with the core and that is not
 * specific to one plugin kind lives here. It pulls in no CUDA, MPI, NCCL or Lua header
 * and compiles alone as C11 and as C++.
 *
 * Errors: a fallible function returns a loom_status; the human-readable detail is a
 * thread-local message read with loom_last_error() (as dlerror and NCCL do). The message
 * says what is wrong and what would be right.
 */
#ifndef LOOM_LOOM_H
#define LOOM_LOOM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0
#define LOOM_VERSION_STRING "0.1.0"

typedef enum loom_status {
    LOOM_OK = 0,
    LOOM_ERR_INVALID,     /* a caller passed something impossible (bad shape, bad key) */
    LOOM_ERR_NOMEM,       /* an allocation failed */
    LOOM_ERR_IO,          /* a file could not be read or written */
    LOOM_ERR_PLUGIN,      /* a plugin could not be found, loaded or was refused */
    LOOM_ERR_UNSUPPORTED, /* valid request this build or plugin cannot serve */
    LOOM_ERR_COMM,        /* a communication peer failed */
    LOOM_ERR_TIMEOUT,     /* a wait ran past its deadline */
    LOOM_ERR_CORRUPT,     /* a file's contents are malformed */
    LOOM_ERR_INTERNAL     /* an invariant broke: a bug in loom */
} loom_status;

typedef enum loom_dtype {
    LOOM_DTYPE_F32 = 0,
    LOOM_DTYPE_BF16,
    LOOM_DTYPE_F16,
    LOOM_DTYPE_I32,
    LOOM_DTYPE_U8,
    LOOM_DTYPE_U16
} loom_dtype;

/* The message recorded by the last failing loom call on this thread ("" if none). */
const char *loom_last_error(void);
/* A short constant name for a status ("LOOM_ERR_IO"). */
const char *loom_status_name(loom_status st);
/* Bytes per element of a dtype; 0 for an unknown value. */
size_t loom_dtype_size(loom_dtype dt);
/* "f32", "bf16", ...; "?" for an unknown value. */
const char *loom_dtype_name(loom_dtype dt);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_LOOM_H */
