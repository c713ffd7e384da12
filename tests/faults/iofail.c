/* iofail.c — an LD_PRELOAD shim that fails (or dies at) the N-th I/O call touching a
 * directory, for the checkpoint crash-safety tests (tests/faults/ckpt_crash.sh).
 *
 * What: wraps open/open64/openat/fopen/fopen64/mkdir (kind "open"), write/fwrite/fflush
 * ("write"), fsync/fdatasync ("fsync"), rename/renameat/renameat2 ("rename"). A call
 * counts when its path is under LOOM_IOFAIL_DIR, or its fd/FILE was opened under it; other
 * I/O (the recipe, plugins, stdout) is never touched, and neither are opens for reading
 * (the load before a save): opens count when they write, create or open a directory.
 *   LOOM_IOFAIL="KIND:N:WHAT"  KIND open|write|fsync|rename|any, N >= 1, WHAT ENOSPC|EIO|kill:
 *                              the N-th counted call of KIND fails with that errno (the
 *                              call is not made) or the process SIGKILLs itself instead.
 *   LOOM_IOFAIL_RANK=R         only in the process whose RANK is R (default: every rank).
 *   LOOM_IOFAIL_COUNT=FILE     at exit, append "rank R open O write W fsync F rename M" (the
 *                              counted calls of this process), to size a sweep over N.
 * What not: not thread-aware beyond a counter under a mutex; reads count as "open" only
 * (the fault is in the saving, the reading is what the next load does).
 * Invariants: without LOOM_IOFAIL_DIR it forwards everything unchanged.
 */
/* open and open64 are both defined here: no redirection of one to the other. */
#undef _FILE_OFFSET_BITS
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { K_OPEN, K_WRITE, K_FSYNC, K_RENAME, K_ANY, N_KINDS };
static const char *const kind_names[] = {"open", "write", "fsync", "rename", "any"};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int ready, active;
static char dir[4096];
static size_t dir_len;
static int fail_kind = -1, fail_errno;
static long fail_n, counts[N_KINDS];
static unsigned char fd_tracked[65536];
static FILE *files[256];

static void setup(void)
{
    if (ready)
        return;
    ready = 1;
    const char *d = getenv("LOOM_IOFAIL_DIR");
    if (!d || !d[0])
        return;
    char real[4096];
    if (!realpath(d, real))
        snprintf(real, sizeof real, "%s", d);
    snprintf(dir, sizeof dir, "%s", real);
    dir_len = strlen(dir);
    const char *rank = getenv("LOOM_IOFAIL_RANK"), *me = getenv("RANK");
    if (rank && rank[0] && strcmp(rank, me ? me : "0") != 0)
        return;
    active = 1;
    const char *spec = getenv("LOOM_IOFAIL");
    char kind[16], what[16];
    if (spec && sscanf(spec, "%15[a-z]:%ld:%15s", kind, &fail_n, what) == 3) {
        for (int k = 0; k < N_KINDS; k++)
            if (!strcmp(kind, kind_names[k]))
                fail_kind = k;
        fail_errno = !strcmp(what, "ENOSPC") ? ENOSPC : !strcmp(what, "EIO") ? EIO
                   : !strcmp(what, "kill")   ? -1 : 0;
        if (fail_kind < 0 || !fail_errno || fail_n < 1) {
            fprintf(stderr, "iofail: LOOM_IOFAIL=\"%s\" must be KIND:N:WHAT (open|write|fsync|"
                    "rename|any, N >= 1, ENOSPC|EIO|kill)\n", spec);
            _exit(2);
        }
    }
}

/* Is path (absolute or relative to the cwd) under the directory? */
static int under(const char *path)
{
    if (!path)
        return 0;
    char abs[8192];
    if (path[0] == '/')
        snprintf(abs, sizeof abs, "%s", path);
    else {
        char cwd[4096];
        if (!getcwd(cwd, sizeof cwd))
            return 0;
        snprintf(abs, sizeof abs, "%s/%s", cwd, path);
    }
    return strncmp(abs, dir, dir_len) == 0 && (abs[dir_len] == '/' || abs[dir_len] == '\0');
}

/* Count one call of kind k; 1 if it must fail (errno set), dies in kill mode. */
static int hit(int k)
{
    pthread_mutex_lock(&lock);
    long n = ++counts[k];
    long any = ++counts[K_ANY];
    int fire = fail_kind == k ? n == fail_n : fail_kind == K_ANY ? any == fail_n : 0;
    pthread_mutex_unlock(&lock);
    if (!fire)
        return 0;
    fprintf(stderr, "iofail: %s call %ld fails (%s)\n", kind_names[fail_kind], fail_n,
            fail_errno < 0 ? "SIGKILL" : strerror(fail_errno));
    if (fail_errno < 0)
        raise(SIGKILL);
    errno = fail_errno;
    return 1;
}

static int counted_path(const char *p) { setup(); return active && under(p); }
static int counted_fd(int fd) { setup(); return active && fd >= 0 && fd < 65536 && fd_tracked[fd]; }
static int counted_file(FILE *f)
{
    setup();
    if (!active || !f)
        return 0;
    for (int i = 0; i < 256; i++)
        if (files[i] == f)
            return 1;
    return 0;
}
static void track_fd(int fd, int on)
{
    if (fd >= 0 && fd < 65536)
        fd_tracked[fd] = (unsigned char)on;
}
static void track_file(FILE *f)
{
    for (int i = 0; f && i < 256; i++)
        if (!files[i]) {
            files[i] = f;
            return;
        }
}

/* The next definition of name (libc's), looked up once. */
#define REAL(name)                                                                 \
    static __typeof__(&name) real_##name;                                            \
    if (!real_##name)                                                                \
    real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

static int do_open(const char *sym, int dirfd, const char *path, int flags, mode_t mode)
{
    /* Opens for writing and of directories (fsync of a directory) are the save's. */
    int saving = (flags & (O_WRONLY | O_RDWR | O_CREAT)) || (flags & O_DIRECTORY);
    int counted = saving && (dirfd == AT_FDCWD || path[0] == '/') ? counted_path(path) : 0;
    if (counted && hit(K_OPEN))
        return -1;
    int fd;
    if (!strcmp(sym, "openat")) {
        REAL(openat);
        fd = real_openat(dirfd, path, flags, mode);
    } else if (!strcmp(sym, "open64")) {
        REAL(open64);
        fd = real_open64(path, flags, mode);
    } else {
        REAL(open);
        fd = real_open(path, flags, mode);
    }
    if (counted)
        track_fd(fd, 1);
    return fd;
}

static mode_t mode_arg(int flags, va_list ap)
{
    return (flags & O_CREAT) || (flags & __O_TMPFILE) == __O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    return do_open("open", AT_FDCWD, path, flags, m);
}

int open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    return do_open("open64", AT_FDCWD, path, flags, m);
}

int openat(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    return do_open("openat", dirfd, path, flags, m);
}

static FILE *do_fopen(const char *sym, const char *path, const char *mode)
{
    int counted = strpbrk(mode, "wa+") && counted_path(path); /* the save's, not reads */
    if (counted && hit(K_OPEN))
        return NULL;
    FILE *f;
    if (!strcmp(sym, "fopen64")) {
        REAL(fopen64);
        f = real_fopen64(path, mode);
    } else {
        REAL(fopen);
        f = real_fopen(path, mode);
    }
    if (counted && f) {
        track_file(f);
        track_fd(fileno(f), 1);
    }
    return f;
}

FILE *fopen(const char *path, const char *mode) { return do_fopen("fopen", path, mode); }
FILE *fopen64(const char *path, const char *mode) { return do_fopen("fopen64", path, mode); }

int mkdir(const char *path, mode_t mode)
{
    REAL(mkdir);
    if (counted_path(path) && hit(K_OPEN))
        return -1;
    return real_mkdir(path, mode);
}

ssize_t write(int fd, const void *buf, size_t n)
{
    REAL(write);
    if (counted_fd(fd) && hit(K_WRITE))
        return -1;
    return real_write(fd, buf, n);
}

size_t fwrite(const void *p, size_t size, size_t n, FILE *f)
{
    REAL(fwrite);
    if (counted_file(f) && hit(K_WRITE))
        return 0;
    return real_fwrite(p, size, n, f);
}

int fflush(FILE *f)
{
    REAL(fflush);
    if (counted_file(f) && hit(K_WRITE))
        return EOF;
    return real_fflush(f);
}

int fsync(int fd)
{
    REAL(fsync);
    if (counted_fd(fd) && hit(K_FSYNC))
        return -1;
    return real_fsync(fd);
}

int fdatasync(int fd)
{
    REAL(fdatasync);
    if (counted_fd(fd) && hit(K_FSYNC))
        return -1;
    return real_fdatasync(fd);
}

int close(int fd)
{
    REAL(close);
    if (fd >= 0 && fd < 65536)
        fd_tracked[fd] = 0;
    return real_close(fd);
}

int fclose(FILE *f)
{
    REAL(fclose);
    for (int i = 0; f && i < 256; i++)
        if (files[i] == f)
            files[i] = NULL;
    if (f)
        track_fd(fileno(f), 0);
    return real_fclose(f);
}

int rename(const char *a, const char *b)
{
    REAL(rename);
    if ((counted_path(a) || counted_path(b)) && hit(K_RENAME))
        return -1;
    return real_rename(a, b);
}

int renameat(int da, const char *a, int db, const char *b)
{
    REAL(renameat);
    if ((counted_path(a) || counted_path(b)) && hit(K_RENAME))
        return -1;
    return real_renameat(da, a, db, b);
}

int renameat2(int da, const char *a, int db, const char *b, unsigned flags)
{
    REAL(renameat2);
    if ((counted_path(a) || counted_path(b)) && hit(K_RENAME))
        return -1;
    return real_renameat2(da, a, db, b, flags);
}

__attribute__((destructor)) static void report(void)
{
    const char *out = getenv("LOOM_IOFAIL_COUNT");
    if (!active || !out || !out[0])
        return;
    REAL(fopen);
    FILE *f = real_fopen(out, "a");
    if (!f)
        return;
    const char *me = getenv("RANK");
    fprintf(f, "rank %s open %ld write %ld fsync %ld rename %ld any %ld\n", me ? me : "0",
            counts[K_OPEN], counts[K_WRITE], counts[K_FSYNC], counts[K_RENAME], counts[K_ANY]);
    fclose(f);
}
