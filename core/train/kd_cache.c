/* kd_cache.c — the distill-cache file: writer (teacher forward, top k per token) and reader
 * (checks, then a dense teacher row per token). Format and invariants: kd_cache.h. */
#include "kd_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/backend.h"
#include "base/status.h"
#include "io/checksum.h"

static const char kd_magic[8] = {'L', 'O', 'O', 'M', 'K', 'D', 'C', '1'};
enum { KD_VERSION = 1, KD_TEXT = 256 };

static size_t record_bytes(const loom_kd_cache_shape *sh)
{
    return 16 + 8 * (size_t)sh->micro * (size_t)sh->seq * (size_t)sh->k;
}

/* ---- header --------------------------------------------------------------------------- */

static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void encode_header(const loom_kd_cache_shape *sh, unsigned char h[LOOM_KD_HEADER_BYTES])
{
    memset(h, 0, LOOM_KD_HEADER_BYTES);
    memcpy(h, kd_magic, 8);
    put32(h + 8, KD_VERSION);
    put32(h + 12, LOOM_KD_HEADER_BYTES);
    put32(h + 16, (uint32_t)sh->vocab);
    put32(h + 20, (uint32_t)sh->k);
    put32(h + 24, (uint32_t)sh->micro);
    put32(h + 28, (uint32_t)sh->seq);
    put64(h + 32, (uint64_t)sh->records);
    if (sh->source) /* the last byte of each text field stays NUL */
        strncpy((char *)h + 40, sh->source, KD_TEXT - 1);
    if (sh->teacher)
        strncpy((char *)h + 296, sh->teacher, KD_TEXT - 1);
    put64(h + 552, loom_xxh64(h, 552));
}

/* ---- writer --------------------------------------------------------------------------- */

/* a ranks before b: the larger logit, on ties the lower column */
static int ranks_before(const float *z, uint32_t a, uint32_t b)
{
    return z[a] > z[b] || (z[a] == z[b] && a < b);
}

/* Keep heap[0..n) a min-heap under ranks_before (the root ranks last). */
static void sift_down(const float *z, uint32_t *heap, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, last = i;
        if (l < n && ranks_before(z, heap[last], heap[l]))
            last = l;
        if (r < n && ranks_before(z, heap[last], heap[r]))
            last = r;
        if (last == i)
            return;
        uint32_t t = heap[i];
        heap[i] = heap[last];
        heap[last] = t;
        i = last;
    }
}

static int by_column(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The k top columns of row z (V wide) into idx, ascending. */
static void top_k(const float *z, int V, int k, uint32_t *idx)
{
    if (k == V) {
        for (int j = 0; j < V; j++)
            idx[j] = (uint32_t)j;
        return;
    }
    for (int j = 0; j < k; j++)
        idx[j] = (uint32_t)j;
    for (int i = k / 2 - 1; i >= 0; i--)
        sift_down(z, idx, k, i);
    for (int j = k; j < V; j++)
        if (ranks_before(z, (uint32_t)j, idx[0])) {
            idx[0] = (uint32_t)j;
            sift_down(z, idx, k, 0);
        }
    qsort(idx, (size_t)k, sizeof *idx, by_column);
}

/* Record g: the next micro-batch's teacher forward and its rows' top k. host: a device
 * backend's logits copied there first (R x vocab_padded), else NULL. */
static loom_status write_record(FILE *f, const char *path, const loom_kd_cache_shape *sh,
                                loom_gpt *teacher, loom_batch_fn next, void *ctx, int *tokens,
                                int *targets, unsigned char *rec, float *host, int64_t g)
{
    const size_t R = (size_t)sh->micro * (size_t)sh->seq, k = (size_t)sh->k;
    const size_t stride = (size_t)loom_gpt_get_config(teacher)->vocab_padded;
    float *val = (float *)(rec + 8);
    uint32_t *col = (uint32_t *)(rec + 8 + 4 * R * k);
    LOOM_TRY(next(ctx, tokens, targets, sh->micro, sh->seq));
    LOOM_TRY(loom_gpt_forward(teacher, tokens, NULL, sh->micro, sh->seq, 0.0f, NULL));
    const float *z = loom_gpt_logits(teacher);
    if (host) {
        loom_backend *be = loom_gpt_backend(teacher);
        be->ops->copy_to_host(be->self, host, z, R * stride * sizeof(float));
        z = host;
    }
    put64(rec, loom_xxh64(tokens, R * sizeof(int)));
    for (size_t r = 0; r < R; r++) {
        const float *row = z + r * stride;
        for (int j = 0; j < sh->vocab; j++)
            if (!isfinite(row[j]))
                LOOM_FAIL(LOOM_ERR_INVALID, "distill-cache: the teacher's logit %d of token %zu "
                          "in micro-batch %lld is %g, not finite", j, r, (long long)g, row[j]);
        top_k(row, sh->vocab, sh->k, col + r * k);
        for (size_t e = 0; e < k; e++)
            val[r * k + e] = row[col[r * k + e]];
    }
    size_t n = record_bytes(sh) - 8;
    put64(rec + n, loom_xxh64(rec, n));
    if (fwrite(rec, 1, n + 8, f) != n + 8)
        LOOM_FAIL(LOOM_ERR_IO, "distill-cache: writing '%s': %s", path, strerror(errno));
    return LOOM_OK;
}

static loom_status write_records(FILE *f, const char *path, const loom_kd_cache_shape *sh,
                                 loom_gpt *teacher, loom_batch_fn next, void *ctx,
                                 int *tokens, int *targets, unsigned char *rec)
{
    const size_t R = (size_t)sh->micro * (size_t)sh->seq;
    const size_t stride = (size_t)loom_gpt_get_config(teacher)->vocab_padded;
    float *host = NULL; /* a device backend's logits: copied to the host per record */
    if (loom_backend_device_memory(loom_gpt_backend(teacher)) &&
        !(host = malloc(R * stride * sizeof(float))))
        LOOM_FAIL(LOOM_ERR_NOMEM, "distill-cache: out of memory for the teacher's logits");
    loom_status st = LOOM_OK;
    for (int64_t g = 0; st == LOOM_OK && g < sh->records; g++)
        st = write_record(f, path, sh, teacher, next, ctx, tokens, targets, rec, host, g);
    free(host);
    return st;
}

loom_status loom_kd_cache_write(const char *path, const loom_kd_cache_shape *sh,
                                loom_gpt *teacher, loom_batch_fn next, void *ctx)
{
    const loom_gpt_config *tc = loom_gpt_get_config(teacher);
    if (sh->vocab != tc->vocab || sh->k < 1 || sh->k > sh->vocab || sh->micro < 1 ||
        sh->seq < 1 || sh->seq > loom_gpt_max_seq(teacher) || sh->records < 1)
        LOOM_FAIL(LOOM_ERR_INVALID, "distill-cache: k=%d must be in [1, vocab=%d] (the teacher's "
                  "vocab %d), batch %dx%d within the %d tokens the teacher was built for (its ctx %d), "
                  "records %lld >= 1", sh->k, sh->vocab, tc->vocab, sh->micro, sh->seq,
                  loom_gpt_max_seq(teacher), tc->ctx, (long long)sh->records);
    size_t R = (size_t)sh->micro * (size_t)sh->seq;
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        LOOM_FAIL(LOOM_ERR_INVALID, "distill-cache: the path '%s' is too long", path);
    int *tokens = malloc(2 * R * sizeof(int));
    unsigned char *rec = malloc(record_bytes(sh));
    FILE *f = fopen(tmp, "wb");
    loom_status st = LOOM_OK;
    if (!tokens || !rec)
        st = loom_fail(LOOM_ERR_NOMEM, "distill-cache: out of memory for a record (%zu bytes)",
                       record_bytes(sh));
    else if (!f)
        st = loom_fail(LOOM_ERR_IO, "distill-cache: cannot create '%s': %s", tmp, strerror(errno));
    if (st == LOOM_OK) {
        unsigned char h[LOOM_KD_HEADER_BYTES];
        encode_header(sh, h);
        if (fwrite(h, 1, sizeof h, f) != sizeof h)
            st = loom_fail(LOOM_ERR_IO, "distill-cache: writing '%s': %s", tmp, strerror(errno));
    }
    if (st == LOOM_OK)
        st = write_records(f, tmp, sh, teacher, next, ctx, tokens, tokens + R, rec);
    if (f && (fflush(f) != 0 || fsync(fileno(f)) != 0) && st == LOOM_OK)
        st = loom_fail(LOOM_ERR_IO, "distill-cache: writing '%s': %s", tmp, strerror(errno));
    if (f && fclose(f) != 0 && st == LOOM_OK)
        st = loom_fail(LOOM_ERR_IO, "distill-cache: closing '%s': %s", tmp, strerror(errno));
    if (st == LOOM_OK && rename(tmp, path) != 0)
        st = loom_fail(LOOM_ERR_IO, "distill-cache: renaming '%s' to '%s': %s", tmp, path,
                       strerror(errno));
    if (st != LOOM_OK && f)
        unlink(tmp);
    free(tokens);
    free(rec);
    return st;
}

/* ---- reader --------------------------------------------------------------------------- */

struct loom_kd_cache {
    int fd;
    char *path;
    loom_kd_cache_shape shape;
    char source[KD_TEXT], teacher[KD_TEXT];
    unsigned char *rec; /* one record as read */
    float *rows;        /* micro*seq dense rows of vocab */
};

size_t loom_kd_cache_bytes(const loom_kd_cache *c)
{
    return record_bytes(&c->shape) + (size_t)c->shape.micro * (size_t)c->shape.seq *
                                         (size_t)c->shape.vocab * sizeof(float);
}

void loom_kd_cache_close(loom_kd_cache *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    free(c->path);
    free(c->rec);
    free(c->rows);
    free(c);
}

/* The header's fields checked for form (a corrupt one can claim anything). */
static loom_status read_header(loom_kd_cache *c, const unsigned char *h, off_t size)
{
    const char *p = c->path;
    if (memcmp(h, kd_magic, 8) != 0)
        LOOM_FAIL(LOOM_ERR_CORRUPT, "teacher.cache '%s' is not a distill-cache file (no LOOMKDC1 "
                  "magic); write one with loom distill-cache", p);
    if (get32(h + 8) != KD_VERSION || get32(h + 12) != LOOM_KD_HEADER_BYTES)
        LOOM_FAIL(LOOM_ERR_CORRUPT, "teacher.cache '%s' is format version %u (header %u bytes); "
                  "this loom reads version %d (%d bytes)", p, get32(h + 8), get32(h + 12),
                  KD_VERSION, LOOM_KD_HEADER_BYTES);
    if (get64(h + 552) != loom_xxh64(h, 552))
        LOOM_FAIL(LOOM_ERR_CORRUPT, "teacher.cache '%s': the header's checksum does not match: "
                  "the file is corrupt", p);
    loom_kd_cache_shape *sh = &c->shape;
    sh->vocab = (int)get32(h + 16);
    sh->k = (int)get32(h + 20);
    sh->micro = (int)get32(h + 24);
    sh->seq = (int)get32(h + 28);
    sh->records = (int64_t)get64(h + 32);
    memcpy(c->source, h + 40, KD_TEXT);
    memcpy(c->teacher, h + 296, KD_TEXT);
    c->source[KD_TEXT - 1] = c->teacher[KD_TEXT - 1] = '\0';
    sh->source = c->source;
    sh->teacher = c->teacher;
    if (sh->vocab < 1 || sh->k < 1 || sh->k > sh->vocab || sh->micro < 1 || sh->seq < 1 ||
        sh->records < 1 || (double)record_bytes(sh) * (double)sh->records > 1e15)
        LOOM_FAIL(LOOM_ERR_CORRUPT, "teacher.cache '%s': impossible shape (vocab %d, k %d, batch "
                  "%dx%d, %lld records)", p, sh->vocab, sh->k, sh->micro, sh->seq,
                  (long long)sh->records);
    off_t want = (off_t)LOOM_KD_HEADER_BYTES + (off_t)record_bytes(sh) * (off_t)sh->records;
    if (size != want)
        LOOM_FAIL(LOOM_ERR_CORRUPT, "teacher.cache '%s' is %lld bytes; its header says %lld (%lld "
                  "records of %zu bytes): truncated or corrupt", p, (long long)size,
                  (long long)want, (long long)sh->records, record_bytes(sh));
    return LOOM_OK;
}

static loom_status check_fits(const loom_kd_cache *c, int vocab, int micro, int seq)
{
    const loom_kd_cache_shape *sh = &c->shape;
    if (sh->vocab != vocab)
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.cache '%s' holds logits over vocab=%d; this model's "
                  "vocab is %d (another tokenizer or model): write the cache for this one",
                  c->path, sh->vocab, vocab);
    if (sh->micro != micro || sh->seq != seq)
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.cache '%s' was written for batch.micro=%d, "
                  "batch.seq=%d; this run has batch.micro=%d, batch.seq=%d (its records are those "
                  "micro-batches): write it at this batch shape", c->path, sh->micro, sh->seq,
                  micro, seq);
    return LOOM_OK;
}

loom_status loom_kd_cache_open(const char *path, int vocab, int micro, int seq,
                               loom_kd_cache **out)
{
    *out = NULL;
    loom_kd_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        free(c);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory opening teacher.cache");
    }
    c->fd = open(path, O_RDONLY | O_CLOEXEC);
    unsigned char h[LOOM_KD_HEADER_BYTES];
    struct stat sb;
    loom_status st = LOOM_OK;
    if (c->fd < 0 || fstat(c->fd, &sb) != 0)
        st = loom_fail(LOOM_ERR_IO, "teacher.cache '%s': cannot open: %s (write it with loom "
                       "distill-cache)", path, strerror(errno));
    else if (pread(c->fd, h, sizeof h, 0) != (ssize_t)sizeof h)
        st = loom_fail(LOOM_ERR_CORRUPT, "teacher.cache '%s' is %lld bytes, shorter than the "
                       "%d-byte header: truncated or not a cache", path, (long long)sb.st_size,
                       LOOM_KD_HEADER_BYTES);
    else if ((st = read_header(c, h, sb.st_size)) == LOOM_OK &&
             (st = check_fits(c, vocab, micro, seq)) == LOOM_OK) {
        size_t R = (size_t)micro * (size_t)seq;
        c->rec = malloc(record_bytes(&c->shape));
        c->rows = malloc(R * (size_t)vocab * sizeof(float));
        if (!c->rec || !c->rows)
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory for teacher.cache rows (%zu MiB)",
                           R * (size_t)vocab * sizeof(float) >> 20);
    }
    if (st != LOOM_OK) {
        loom_kd_cache_close(c);
        return st;
    }
    *out = c;
    return LOOM_OK;
}

loom_status loom_kd_cache_rows(loom_kd_cache *c, int64_t g, const int *tokens,
                               const float **rows)
{
    const loom_kd_cache_shape *sh = &c->shape;
    if (g < 0 || g >= sh->records)
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.cache '%s' holds %lld micro-batches; this step needs "
                  "micro-batch %lld (0-based): write the cache with more steps", c->path,
                  (long long)sh->records, (long long)g);
    size_t n = record_bytes(sh), R = (size_t)sh->micro * (size_t)sh->seq, k = (size_t)sh->k;
    off_t at = (off_t)LOOM_KD_HEADER_BYTES + (off_t)n * (off_t)g;
    for (size_t done = 0; done < n;) {
        ssize_t got = pread(c->fd, c->rec + done, n - done, at + (off_t)done);
        if (got <= 0)
            LOOM_FAIL(LOOM_ERR_IO, "teacher.cache '%s': reading micro-batch %lld: %s", c->path,
                      (long long)g, got < 0 ? strerror(errno) : "end of file");
        done += (size_t)got;
    }
    if (get64(c->rec + n - 8) != loom_xxh64(c->rec, n - 8))
        LOOM_FAIL(LOOM_ERR_CORRUPT, "teacher.cache '%s': micro-batch %lld's checksum does not "
                  "match: the file is corrupt", c->path, (long long)g);
    if (get64(c->rec) != loom_xxh64(tokens, R * sizeof(int)))
        LOOM_FAIL(LOOM_ERR_INVALID, "teacher.cache '%s': micro-batch %lld's tokens differ from the "
                  "ones the cache was written from (data %s): other data, seed, shuffle or "
                  "tokenizer; write the cache from this recipe", c->path, (long long)g, c->source);
    const float *val = (const float *)(c->rec + 8);
    const uint32_t *col = (const uint32_t *)(c->rec + 8 + 4 * R * k);
    size_t V = (size_t)sh->vocab;
    for (size_t r = 0; r < R; r++) {
        float *row = c->rows + r * V;
        for (size_t j = 0; j < V; j++)
            row[j] = -INFINITY;
        for (size_t e = 0; e < k; e++) {
            uint32_t j = col[r * k + e];
            if (j >= V || (e > 0 && j <= col[r * k + e - 1]) || !isfinite(val[r * k + e]))
                LOOM_FAIL(LOOM_ERR_CORRUPT, "teacher.cache '%s': micro-batch %lld token %zu has "
                          "column %u (entry %zu; want ascending columns < %zu, finite logits)",
                          c->path, (long long)g, r, j, e, V);
            row[j] = val[r * k + e];
        }
    }
    *rows = c->rows;
    return LOOM_OK;
}

const loom_kd_cache_shape *loom_kd_cache_info(const loom_kd_cache *c) { return &c->shape; }
