/* checkpoint_load.c — validating a checkpoint completely and then restoring it into a
 * session (see checkpoint.h).
 *
 * What: read the manifest (its own checksum, format, version), compare what it records
 * with the session (model config, optimizer, precision state size, data kind), read every
 * safetensors file's header (checked against the manifest's header_xxh64), parse them
 * strictly, and plan, for every parameter and optimizer slot this rank holds, which stored pieces
 * (boxes of the logical tensor) fill its held slice: unknown tensors, other logical
 * shapes, pieces that overlap without being replicas, and gaps are refused. Only then
 * change anything: read the tiles (checkpoint.h, loom_ckpt_tiling) that hold the used
 * pieces' intersections with the held slices (a row split is contiguous rows; a column
 * split reads its columns of every row it spans, rounded out to whole tiles), adjacent
 * row pieces in one read, check each tile's XXH64 against the header's "loom.tiles", and
 * copy the intersections box by box. A file is mapped as a sparse anonymous region of its
 * size (MAP_NORESERVE) that only the read tiles touch, so a rank's memory is what it reads.
 * Checkpoints without header_xxh64 (older) are read whole and checked against the
 * file's xxh64.
 * Under ZeRO the optimizer state's tiles are those of this rank's partition pieces only
 * (flat ranges of the held slices, as boxes), and they are copied straight into the
 * partition (apply_plan_pieces): no whole-state buffer.
 * What not: no streaming into the session (the read tiles are held until the copy); no
 * communication; pieces are boxes of the logical tensor (ZeRO's slice files store their
 * flat ranges as boxes, checkpoint.h).
 * Invariants: on any failure the session and the data source are as they were; every
 * message names the file (and the field) it is about.
 */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checksum.h"
#include "io/json.h"
#include "model/gpt_stage.h"
#include "io/safetensors.h"
#include "base/backend.h"
#include "base/status.h"
#include "compress.h"
#include "compress_ckpt.h"
#include "zero_ckpt.h"
#include "offload.h"

#define MAX_MANIFEST ((size_t)64 << 20)
#define CHECKSUM_PREFIX "xxh64:"
#define PREFIX_LEN 6

loom_status loom_ckpt_read_file(const char *path, size_t max, unsigned char **bytes, size_t *size)
{
    *bytes = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return loom_fail(LOOM_ERR_IO, "cannot read checkpoint '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max) {
        close(fd);
        return loom_fail(LOOM_ERR_IO, "checkpoint '%s' is not a regular file of at most %zu bytes",
                         path, max);
    }
    size_t n = (size_t)sb.st_size, done = 0;
    unsigned char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return loom_fail(LOOM_ERR_NOMEM, "out of memory reading '%s' (%zu bytes)", path, n);
    }
    while (done < n) {
        ssize_t r = read(fd, buf + done, n - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            close(fd);
            free(buf);
            return loom_fail(LOOM_ERR_IO, "cannot read checkpoint '%s': %s", path,
                             e ? strerror(e) : "the file shrank while being read");
        }
        done += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *bytes = buf;
    *size = n;
    return LOOM_OK;
}

static loom_status bad(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static loom_status bad(const char *path, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return loom_fail(LOOM_ERR_CORRUPT, "checkpoint '%s': %s", path, msg);
}

/* A safetensors file's first 8 bytes: its header length, little-endian. */
static uint64_t header_len(const unsigned char *b)
{
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--)
        n = n << 8 | b[k];
    return n;
}

/* What the calling thread's latest load read (loom_ckpt_read_stats). */
static _Thread_local uint64_t stat_read, stat_total;

void loom_ckpt_read_stats(uint64_t *read, uint64_t *total)
{
    *read = stat_read;
    *total = stat_total;
}

static loom_status pread_all(int fd, const char *path, void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return loom_fail(LOOM_ERR_IO, "cannot read checkpoint '%s': %s", path,
                             r < 0 ? strerror(errno) : "the file shrank while being read");
        done += (size_t)r;
    }
    stat_read += n;
    return LOOM_OK;
}

/* The length word and header of an open safetensors file of `size` bytes: *out (malloc'd)
 * gets its first *hb = 8 + N bytes. */
static loom_status read_header(int fd, const char *path, uint64_t size, unsigned char **out,
                               uint64_t *hb)
{
    unsigned char len8[8];
    *out = NULL;
    if (size < 8)
        return bad(path, "the file is %" PRIu64 " bytes, too short for a safetensors header", size);
    LOOM_TRY(pread_all(fd, path, len8, 8, 0));
    uint64_t n = header_len(len8);
    if (n > LOOM_ST_MAX_HEADER || n > size - 8)
        return bad(path, "header length %" PRIu64 " is over 100 MB or runs past the end of the file "
                   "(%" PRIu64 " bytes)", n, size);
    unsigned char *h = malloc((size_t)n + 9);
    if (!h)
        return loom_fail(LOOM_ERR_NOMEM, "out of memory reading '%s'", path);
    memcpy(h, len8, 8);
    loom_status st = pread_all(fd, path, h + 8, (size_t)n, 8);
    if (st != LOOM_OK) {
        free(h);
        return st;
    }
    *out = h;
    *hb = 8 + n;
    return LOOM_OK;
}

static loom_status open_regular(const char *path, int *fd, uint64_t *size)
{
    struct stat sb;
    *fd = open(path, O_RDONLY);
    if (*fd < 0 || fstat(*fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int e = *fd < 0 ? errno : 0;
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        return loom_fail(LOOM_ERR_IO, "cannot read checkpoint '%s': %s", path,
                         e ? strerror(e) : "not a regular file");
    }
    *size = (uint64_t)sb.st_size;
    return LOOM_OK;
}

loom_status loom_ckpt_header_sum(const char *path, uint64_t *sum, uint64_t *header_bytes)
{
    int fd;
    uint64_t size = 0, hb = 0;
    unsigned char *h;
    LOOM_TRY(open_regular(path, &fd, &size));
    loom_status st = read_header(fd, path, size, &h, &hb);
    close(fd);
    if (st != LOOM_OK)
        return st;
    *sum = loom_xxh64(h, (size_t)hb);
    if (header_bytes)
        *header_bytes = hb;
    free(h);
    return LOOM_OK;
}

static loom_status verify_checksum(const char *path, char *text, size_t n, const loom_json *root)
{
    const loom_json *c = loom_json_get(root, "checksum");
    if (!c || c->type != LOOM_JSON_STRING || c->len != PREFIX_LEN + 16 ||
        c->end - c->begin != PREFIX_LEN + 18 || memcmp(c->text, CHECKSUM_PREFIX, PREFIX_LEN) != 0 ||
        strspn(c->text + PREFIX_LEN, "0123456789abcdef") != 16)
        return bad(path, "manifest has no checksum \"xxh64:<16 hex digits>\"");
    char recorded[17];
    char *digits = text + c->begin + 1 + PREFIX_LEN;
    memcpy(recorded, digits, 16);
    recorded[16] = '\0';
    memset(digits, '0', 16);
    uint64_t h = loom_xxh64(text, n);
    memcpy(digits, recorded, 16);
    char actual[17];
    snprintf(actual, sizeof actual, "%016" PRIx64, h);
    if (strcmp(actual, recorded) != 0)
        return bad(path, "manifest checksum is xxh64:%s but the text hashes to xxh64:%s (the "
                   "file was changed or damaged)", recorded, actual);
    return LOOM_OK;
}

loom_status loom_ckpt_manifest_open(const char *ckpt_dir, loom_json_doc **doc, char **text)
{
    char path[PATH_MAX];
    *doc = NULL;
    *text = NULL;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", ckpt_dir, LOOM_CKPT_MANIFEST_FILE) >= sizeof path)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint path '%s' is too long", ckpt_dir);
    unsigned char *bytes;
    size_t n;
    LOOM_TRY(loom_ckpt_read_file(path, MAX_MANIFEST, &bytes, &n));
    loom_json_error err;
    loom_status st = loom_json_parse((const char *)bytes, n, NULL, doc, &err);
    if (st != LOOM_OK) {
        free(bytes);
        return st == LOOM_ERR_NOMEM ? st : bad(path, "not valid JSON at byte %zu: %s", err.offset, err.msg);
    }
    const loom_json *root = loom_json_root(*doc), *f = loom_json_get(root, "format");
    int64_t version = 0;
    if (root->type != LOOM_JSON_OBJECT)
        st = bad(path, "the manifest is a JSON %s (an object expected)", loom_json_type_name(root->type));
    else if (!f || f->type != LOOM_JSON_STRING || strcmp(f->text, LOOM_CHECKPOINT_FORMAT) != 0)
        st = bad(path, "manifest format is %s%.40s%s (\"%s\" expected)", f && f->text ? "'" : "",
                 f && f->text ? f->text : "missing", f && f->text ? "'" : "", LOOM_CHECKPOINT_FORMAT);
    else if (!loom_json_int64(loom_json_get(root, "version"), &version) || version != LOOM_CHECKPOINT_VERSION)
        st = bad(path, "manifest version is not %d, the one this loom %s reads", LOOM_CHECKPOINT_VERSION,
                 LOOM_VERSION_STRING);
    else
        st = verify_checksum(path, (char *)bytes, n, root);
    if (st != LOOM_OK) {
        loom_json_free(*doc);
        *doc = NULL;
        free(bytes);
        return st;
    }
    *text = (char *)bytes;
    return LOOM_OK;
}

/* files.<name> of the manifest: its recorded size and checksum. */
static loom_status file_record(const char *mpath, const loom_json *root, const char *name,
                               uint64_t *bytes, uint64_t *sum)
{
    const loom_json *r = loom_json_get(loom_json_get_type(root, "files", LOOM_JSON_OBJECT), name);
    const loom_json *c = loom_json_get_type(r, "xxh64", LOOM_JSON_STRING);
    char *end;
    if (!loom_json_uint64(loom_json_get(r, "bytes"), bytes) || !c || c->len != 16 ||
        strspn(c->text, "0123456789abcdef") != 16)
        return bad(mpath, "manifest files.%s needs {\"bytes\": <integer>, \"xxh64\": \"<16 hex "
                   "digits>\"}", name);
    *sum = strtoull(c->text, &end, 16);
    return LOOM_OK;
}

/* files.<name>.header_xxh64: 1 with *sum set, 0 when absent (a checkpoint from before
 * ranged loads: read whole), or a refusal. */
static loom_status header_record(const char *mpath, const loom_json *root, const char *name,
                                 int *has, uint64_t *sum)
{
    const loom_json *r = loom_json_get(loom_json_get_type(root, "files", LOOM_JSON_OBJECT), name);
    const loom_json *c = loom_json_get(r, "header_xxh64");
    *has = 0;
    if (!c)
        return LOOM_OK;
    if (c->type != LOOM_JSON_STRING || c->len != 16 || strspn(c->text, "0123456789abcdef") != 16)
        return bad(mpath, "manifest files.%s.header_xxh64 is not 16 hex digits", name);
    *sum = strtoull(c->text, NULL, 16);
    *has = 1;
    return LOOM_OK;
}

void loom_ckpt_file_name(char *out, size_t len, const char *kind, int part, int tp, int pp)
{
    if (tp <= 1 && pp <= 1)
        snprintf(out, len, "%s.safetensors", kind);
    else if (pp <= 1)
        snprintf(out, len, "%s.tp%d.safetensors", kind, part);
    else if (tp <= 1)
        snprintf(out, len, "%s.pp%d.safetensors", kind, part);
    else
        snprintf(out, len, "%s.pp%d.tp%d.safetensors", kind, part / tp, part % tp);
}

/* layout.tp and layout.pp of the manifest (1 when absent: checkpoints before tp / pp), and
 * with slice files (checkpoint.h) layout.dp and layout.slices. */
static loom_status read_layout(const char *mpath, const loom_json *root, loom_ckpt_layout *out)
{
    const loom_json *l = loom_json_get(root, "layout"), *p = loom_json_get(l, "pp");
    const loom_json *sl = loom_json_get(l, "slices");
    int64_t v = 1, w = 1, dp = 1;
    memset(out, 0, sizeof *out);
    out->tp = out->pp = out->dp = 1;
    if (!l)
        return LOOM_OK;
    if (l->type != LOOM_JSON_OBJECT || !loom_json_int64(loom_json_get(l, "tp"), &v) || v < 1 ||
        v > LOOM_CKPT_TP_MAX || (p && (!loom_json_int64(p, &w) || w < 1 || v * w > LOOM_CKPT_TP_MAX)))
        return bad(mpath, "manifest layout must be {\"tp\": <1 to %d>} or {\"tp\": T, \"pp\": P} "
                   "with T x P <= %d", LOOM_CKPT_TP_MAX, LOOM_CKPT_TP_MAX);
    out->tp = (int)v;
    out->pp = (int)w;
    if (!sl)
        return LOOM_OK;
    int ok = sl->type == LOOM_JSON_ARRAY && loom_json_int64(loom_json_get(l, "dp"), &dp) &&
             dp >= 1 && dp * v * w <= 65536;
    for (size_t i = 0; ok && i < sl->count; i++) {
        const loom_json *k = &sl->items[i];
        ok = k->type == LOOM_JSON_STRING && (!strcmp(k->text, "model") || !strcmp(k->text, "optim"));
        if (ok)
            out->sliced[strcmp(k->text, "model") ? 1 : 0] = 1;
    }
    if (!ok)
        return bad(mpath, "manifest layout.slices must be a list of \"model\" and \"optim\" with "
                   "layout.dp the dp ranks that wrote them (1 to %d files per kind)", 65536);
    out->dp = (int)dp;
    return LOOM_OK;
}

/* The kinds of tensor file a checkpoint has: model, optim, and with gradient compression
 * (a "compress" object in the manifest) residual. */
static int file_kinds(const loom_json *root)
{
    return loom_json_get_type(root, "compress", LOOM_JSON_OBJECT) ? 3 : 2;
}

/* The tensor files of a layout's first `kinds` kinds, in manifest order: how many, and
 * the j-th one's name. */
static int layout_files(const loom_ckpt_layout *l, int kinds)
{
    int n = 0;
    for (int k = 0; k < kinds; k++)
        n += loom_ckpt_kind_count(l, k);
    return n;
}

static void layout_file(const loom_ckpt_layout *l, int j, char *name, size_t len)
{
    int k = 0;
    while (j >= loom_ckpt_kind_count(l, k))
        j -= loom_ckpt_kind_count(l, k++);
    loom_ckpt_kind_name(name, len, l, k, j);
}

int loom_ckpt_is_complete(const char *ckpt_dir)
{
    loom_json_doc *doc;
    char *text, path[PATH_MAX], name[64];
    loom_ckpt_layout l;
    if (loom_ckpt_manifest_open(ckpt_dir, &doc, &text) != LOOM_OK)
        return 0;
    int ok = read_layout(ckpt_dir, loom_json_root(doc), &l) == LOOM_OK;
    int n = ok ? layout_files(&l, file_kinds(loom_json_root(doc))) : 0;
    for (int j = 0; j < n && ok; j++) {
        uint64_t bytes, sum;
        struct stat sb;
        layout_file(&l, j, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", ckpt_dir, name);
        ok = file_record(path, loom_json_root(doc), name, &bytes, &sum) == LOOM_OK &&
             stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size == bytes;
    }
    loom_json_free(doc);
    free(text);
    return ok;
}

/* --- tensor files and the remap of stored pieces onto held slices -------------------- */

typedef struct tfile {
    char path[PATH_MAX];
    unsigned char *bytes;  /* the file's bytes; ranged: a sparse map, header + read tiles */
    size_t size;
    loom_st_file *f;
    /* ranged reads (mapped): the open file, where the data section starts, the header's
     * tile checksums, each entry's first tile (file order; [count] = all tiles) and which
     * tiles the plans need */
    int mapped, fd;
    uint64_t data_at;
    const char *sums;
    size_t *tile_base;
    unsigned char *need;
} tfile;

/* One stored tensor: a box (start, len) of the logical tensor `target` refers to. */
typedef struct piece {
    int target;     /* entry index * per + slot */
    int file;       /* index into the kind's files */
    int seq;        /* order in the file, for a stable sort */
    const loom_st_entry *te;
    int64_t start[LOOM_PARAM_MAX_DIMS], len[LOOM_PARAM_MAX_DIMS];
    int use;        /* copied: overlaps the held slice and is not a later replica */
} piece;

typedef struct plan {
    piece *p;
    int n;
} plan;

typedef struct tensor_set {
    int tp, pp, n_model, n_optim; /* tp x pp files of each kind, x dp for slice files */
    tfile *files;   /* model files 0..n_model-1, then optim files */
    plan model, optim;
} tensor_set;

/* A pipeline stage's loads skip the tensors another stage holds (NULL: skip none). */
typedef struct elsewhere {
    int (*fn)(const void *ctx, const char *name);
    const void *ctx;
} elsewhere;

static void tfile_free(tfile *tf)
{
    loom_safetensors_free(tf->f);
    if (tf->mapped)
        munmap(tf->bytes, tf->size ? tf->size : 1);
    else
        free(tf->bytes);
    if (tf->fd >= 0)
        close(tf->fd);
    free(tf->need);
    free(tf->tile_base);
}

static void tensors_free(tensor_set *ts)
{
    for (int i = 0; ts->files && i < ts->n_model + ts->n_optim; i++)
        tfile_free(&ts->files[i]);
    free(ts->files);
    free(ts->model.p);
    free(ts->optim.p);
    memset(ts, 0, sizeof *ts);
}

static loom_ckpt_tiling tiling(const loom_st_entry *te)
{
    return loom_ckpt_tiling_of(te->ndim, te->shape, te->dtype_size);
}

/* The header's loom.tiles: 16 hex digits per tile of every tensor, in file order. */
static loom_status read_tile_sums(tfile *tf)
{
    const char *sums = loom_safetensors_meta(tf->f, "loom.tiles");
    int n = loom_safetensors_count(tf->f);
    if (!sums)
        return bad(tf->path, "header __metadata__ has no loom.tiles (the tile checksums every "
                   "ranged load checks)");
    if (!(tf->tile_base = calloc((size_t)n + 1, sizeof *tf->tile_base)))
        return loom_fail(LOOM_ERR_NOMEM, "out of memory reading '%s'", tf->path);
    for (int i = 0; i < n; i++) {
        loom_ckpt_tiling g = tiling(loom_safetensors_entry(tf->f, i));
        tf->tile_base[i + 1] = tf->tile_base[i] + (size_t)(g.row_blocks * g.col_blocks);
    }
    size_t tiles = tf->tile_base[n];
    if (strlen(sums) != 16 * tiles || strspn(sums, "0123456789abcdef") != strlen(sums))
        return bad(tf->path, "header loom.tiles has %zu characters; its %zu tiles need 16 hex "
                   "digits each", strlen(sums), tiles);
    tf->sums = sums;
    return LOOM_OK;
}

/* Check tile k (row block bi, column block bj) of entry i. */
static loom_status check_tile(const tfile *tf, int i, uint64_t bi, uint64_t bj)
{
    const loom_st_entry *te = loom_safetensors_entry(tf->f, i);
    loom_ckpt_tiling g = tiling(te);
    size_t k = tf->tile_base[i] + (size_t)(bi * g.col_blocks + bj);
    uint64_t es = te->dtype_size, c0 = bj * g.cols, w = g.K - c0 < g.cols ? g.K - c0 : g.cols;
    const unsigned char *p = tf->bytes + tf->data_at + te->begin;
    loom_xxh64_state h;
    loom_xxh64_init(&h);
    for (uint64_t r = bi * g.rows; r < (bi + 1) * g.rows && r < g.R; r++)
        loom_xxh64_update(&h, p + (r * g.K + c0) * es, (size_t)(w * es));
    char want[17], have[17];
    memcpy(want, tf->sums + 16 * k, 16);
    want[16] = '\0';
    snprintf(have, sizeof have, "%016" PRIx64, loom_xxh64_digest(&h));
    if (strcmp(want, have) != 0)
        return bad(tf->path, "tensor '%s', rows %" PRIu64 " to %" PRIu64 " x columns %" PRIu64
                   " to %" PRIu64 " (tile %zu) hash to xxh64 %s but the header records %s (the "
                   "file was changed or damaged)", te->name, bi * g.rows,
                   (bi + 1) * g.rows < g.R ? (bi + 1) * g.rows : g.R, c0, c0 + w, k, have, want);
    return LOOM_OK;
}

/* Open a file of a checkpoint with header checksums: size and header checked, the header
 * parsed, nothing of the data section read yet. */
static loom_status open_ranged(const char *mpath, const char *name, uint64_t want_bytes,
                               uint64_t want_head, tfile *tf)
{
    uint64_t size = 0, hb = 0;
    unsigned char *h;
    LOOM_TRY(open_regular(tf->path, &tf->fd, &size));
    stat_total += size;
    if (size != want_bytes)
        return bad(tf->path, "the file is %" PRIu64 " bytes but the manifest records %" PRIu64, size,
                   want_bytes);
    LOOM_TRY(read_header(tf->fd, tf->path, size, &h, &hb));
    uint64_t sum = loom_xxh64(h, (size_t)hb);
    if (sum != want_head) {
        free(h);
        return bad(tf->path, "header checksum xxh64 %016" PRIx64 " but %s records %016" PRIx64
                   " for files.%s (the file was changed or damaged)", sum, mpath, want_head, name);
    }
    void *map = mmap(NULL, size ? (size_t)size : 1, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
        free(h);
        return loom_fail(LOOM_ERR_NOMEM, "cannot map %" PRIu64 " bytes for '%s': %s", size,
                         tf->path, strerror(errno));
    }
    tf->bytes = map;
    tf->size = (size_t)size;
    tf->mapped = 1;
    tf->data_at = hb;
    memcpy(tf->bytes, h, (size_t)hb);
    free(h);
    LOOM_TRY(loom_safetensors_parse("checkpoint", tf->path, tf->bytes, tf->size, &tf->f));
    LOOM_TRY(read_tile_sums(tf));
    if (!(tf->need = calloc(tf->tile_base[loom_safetensors_count(tf->f)] + 1, 1)))
        return loom_fail(LOOM_ERR_NOMEM, "out of memory reading '%s'", tf->path);
    return LOOM_OK;
}

static loom_status read_whole(const char *mpath, const loom_json *root, const char *name,
                              tfile *tf);

/* A tensor file: ranged (header now, tiles after the plan) when the manifest records its
 * header checksum, else whole. */
static loom_status read_tensors(const char *mpath, const loom_json *root, const char *name,
                                tfile *tf)
{
    uint64_t want_bytes, want_sum, want_head;
    int ranged;
    LOOM_TRY(file_record(mpath, root, name, &want_bytes, &want_sum));
    LOOM_TRY(header_record(mpath, root, name, &ranged, &want_head));
    if (ranged)
        return open_ranged(mpath, name, want_bytes, want_head, tf);
    return read_whole(mpath, root, name, tf);
}

/* All of a tensor file, checked against the manifest's size and xxh64, parsed. */
static loom_status read_whole(const char *mpath, const loom_json *root, const char *name,
                              tfile *tf)
{
    uint64_t want_bytes, want_sum;
    LOOM_TRY(file_record(mpath, root, name, &want_bytes, &want_sum));
    LOOM_TRY(loom_ckpt_read_file(tf->path, SIZE_MAX - 1, &tf->bytes, &tf->size));
    stat_read += tf->size;
    stat_total += tf->size;
    if (tf->size != want_bytes)
        return bad(tf->path, "the file is %zu bytes but the manifest records %" PRIu64, tf->size,
                   want_bytes);
    uint64_t h = loom_xxh64(tf->bytes, tf->size);
    if (h != want_sum)
        return bad(tf->path, "checksum xxh64 %016" PRIx64 " but the manifest records %016" PRIx64
                   " (the file was changed or damaged)", h, want_sum);
    return loom_safetensors_parse("checkpoint", tf->path, tf->bytes, tf->size, &tf->f);
}

static void format_dims(char *buf, size_t len, const int64_t *d, int n)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%" PRId64, i ? ", " : "", d[i]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

/* Stored tensor name -> (entry index, slot); -1 if it is not part of the table. */
static int target_of(const loom_param_table *t, const char *tname, uint32_t per, int is_optim,
                     const elsewhere *ew, int *slot)
{
    char base[LOOM_PARAM_NAME_MAX + 16];
    *slot = 0;
    if ((size_t)snprintf(base, sizeof base, "%s", tname) >= sizeof base)
        return -1;
    char *hash = strrchr(base, '#'); /* a slice file's box: "<name>#<first element>" */
    if (hash && hash[1] && strspn(hash + 1, "0123456789") == strlen(hash + 1))
        *hash = '\0';
    if (is_optim) {
        char *dot = strrchr(base, '.');
        if (!dot || strncmp(dot, ".state", 6) != 0 || !dot[6] || strspn(dot + 6, "0123456789") !=
            strlen(dot + 6) || strlen(dot + 6) > 9)
            return -1;
        unsigned long k = strtoul(dot + 6, NULL, 10);
        if (k >= per)
            return -1;
        *slot = (int)k;
        *dot = '\0';
    }
    for (int i = 0; i < t->count; i++)
        if (strcmp(t->entries[i].name, base) == 0)
            return i;
    return ew && ew->fn && ew->fn(ew->ctx, base) ? -2 : -1;
}

/* The piece's box from the tensor's shape and its __metadata__ layout, checked against the
 * entry's logical shape. */
static loom_status read_piece(const tfile *tf, const loom_st_entry *te, const loom_param_entry *e,
                              piece *pc)
{
    if (strcmp(te->dtype, "F32") != 0 && strcmp(te->dtype, "BF16") != 0)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': tensor '%s' is %s (F32 or BF16 "
                         "expected)", tf->path, te->name, te->dtype);
    const char *meta = loom_safetensors_meta(tf->f, te->name);
    loom_json_doc *doc = NULL;
    loom_status parsed = meta ? loom_json_parse(meta, strlen(meta), NULL, &doc, NULL) : LOOM_ERR_CORRUPT;
    if (parsed == LOOM_ERR_NOMEM) /* not the file's fault: say so (OOM injection found it) */
        return loom_fail(LOOM_ERR_NOMEM, "out of memory reading the layout of '%s' in '%s'",
                         te->name, tf->path);
    if (parsed != LOOM_OK) {
        loom_json_free(doc);
        return bad(tf->path, "__metadata__ has no valid layout {\"shape\", \"slice_start\"} for '%s'",
                   te->name);
    }
    const loom_json *shape = loom_json_get_type(loom_json_root(doc), "shape", LOOM_JSON_ARRAY);
    const loom_json *start = loom_json_get_type(loom_json_root(doc), "slice_start", LOOM_JSON_ARRAY);
    int64_t logical[LOOM_ST_MAX_DIMS];
    int ok = shape && start && shape->count == (size_t)te->ndim && start->count == (size_t)te->ndim &&
             te->ndim >= 1 && te->ndim <= LOOM_ST_MAX_DIMS;
    for (int d = 0; ok && d < te->ndim; d++) {
        int64_t b;
        ok = loom_json_int64(&shape->items[d], &logical[d]) && loom_json_int64(&start->items[d], &b) &&
             logical[d] >= 0 && b >= 0 && b <= logical[d] && te->shape[d] <= logical[d] - b;
        if (ok && d < LOOM_PARAM_MAX_DIMS) {
            pc->start[d] = b;
            pc->len[d] = te->shape[d];
        }
    }
    loom_json_free(doc);
    if (!ok)
        return bad(tf->path, "tensor '%s': __metadata__ layout %.200s is not {\"shape\": [..], "
                   "\"slice_start\": [..]} with one entry per dim and the stored slice inside the "
                   "shape", te->name, meta);
    int same = te->ndim == e->ndim;
    for (int d = 0; same && d < e->ndim; d++)
        same = logical[d] == e->shape[d];
    if (!same) {
        char have[128], want[128];
        format_dims(have, sizeof have, logical, te->ndim);
        format_dims(want, sizeof want, e->shape, e->ndim);
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': tensor '%s' has logical shape %s but "
                         "this run's model has %s", tf->path, te->name, have, want);
    }
    return LOOM_OK;
}

static int by_target(const void *a, const void *b)
{
    const piece *x = a, *y = b;
    if (x->target != y->target)
        return (x->target > y->target) - (x->target < y->target);
    if (x->file != y->file)
        return (x->file > y->file) - (x->file < y->file);
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static int same_box(const piece *a, const piece *b, int nd)
{
    for (int d = 0; d < nd; d++)
        if (a->start[d] != b->start[d] || a->len[d] != b->len[d])
            return 0;
    return 1;
}

/* Elements in the intersection of box (s1, l1) and box (s2, l2). */
static uint64_t overlap(const int64_t *s1, const int64_t *l1, const int64_t *s2, const int64_t *l2,
                        int nd)
{
    uint64_t v = 1;
    for (int d = 0; d < nd; d++) {
        int64_t lo = s1[d] > s2[d] ? s1[d] : s2[d];
        int64_t hi = s1[d] + l1[d] < s2[d] + l2[d] ? s1[d] + l1[d] : s2[d] + l2[d];
        if (hi <= lo)
            return 0;
        v *= (uint64_t)(hi - lo);
    }
    return v;
}

static void format_box(char *buf, size_t len, const int64_t *start, const int64_t *l, int nd)
{
    char a[96], b[96];
    format_dims(a, sizeof a, start, nd);
    format_dims(b, sizeof b, l, nd);
    snprintf(buf, len, "start %s len %s", a, b);
}

/* files[0..n) of one kind -> the pieces every target (entry x slot) is assembled from.
 * Refuses unknown tensors, other logical shapes, inconsistent overlaps and gaps. */
static loom_status make_plan(const tfile *files, int n, const loom_param_table *t, uint32_t per,
                             int is_optim, const elsewhere *ew, plan *pl)
{
    const char *what = is_optim ? "optimizer state" : "model";
    int total = 0;
    for (int j = 0; j < n; j++)
        total += loom_safetensors_count(files[j].f);
    pl->n = 0;
    if (!(pl->p = calloc((size_t)total + 1, sizeof *pl->p)))
        return loom_fail(LOOM_ERR_NOMEM, "out of memory reading checkpoint '%s'", files[0].path);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < loom_safetensors_count(files[j].f); i++) {
            const loom_st_entry *te = loom_safetensors_entry(files[j].f, i);
            int slot, ei = target_of(t, te->name, per, is_optim, ew, &slot);
            if (ei == -2)
                continue; /* another pipeline stage's */
            if (ei < 0 && strstr(te->name, "distill.proj."))
                continue; /* a distilled student's projection (gpt_distill.h): training-only,
                           * not read by a run without teacher.layers (an export, a teacher) */
            if (ei < 0)
                return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': tensor '%s' is not part of "
                                 "this run's %s", files[j].path, te->name, what);
            piece *pc = &pl->p[pl->n++];
            pc->target = ei * (int)per + slot;
            pc->file = j;
            pc->seq = i;
            pc->te = te;
            LOOM_TRY(read_piece(&files[j], te, &t->entries[ei], pc));
        }
    qsort(pl->p, (size_t)pl->n, sizeof *pl->p, by_target);
    char name[LOOM_PARAM_NAME_MAX + 16], b1[256], b2[256];
    int at = 0;
    for (int target = 0; target < t->count * (int)per; target++) {
        const loom_param_entry *e = &t->entries[target / (int)per];
        if (is_optim)
            snprintf(name, sizeof name, "%s.state%d", e->name, target % (int)per);
        else
            snprintf(name, sizeof name, "%s", e->name);
        int first = at;
        while (at < pl->n && pl->p[at].target == target)
            at++;
        if (first == at) {
            if (n == 1)
                return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': tensor '%s' is missing (this "
                                 "run's %s has it)", files[0].path, name, what);
            return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s' and the other %d files of its "
                             "layout: tensor '%s' is missing (this run's %s has it)", files[0].path,
                             n - 1, name, what);
        }
        uint64_t covered = 0;
        for (int i = first; i < at; i++) {
            piece *a = &pl->p[i];
            int replica = 0;
            for (int k = first; k < i && !replica; k++) {
                const piece *b = &pl->p[k];
                if (same_box(a, b, e->ndim))
                    replica = 1;
                else if (overlap(a->start, a->len, b->start, b->len, e->ndim)) {
                    format_box(b1, sizeof b1, b->start, b->len, e->ndim);
                    format_box(b2, sizeof b2, a->start, a->len, e->ndim);
                    return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': tensor '%s' (%s) overlaps "
                                     "its piece in '%s' (%s) without being the same slice: the "
                                     "stored pieces are inconsistent", files[a->file].path, name,
                                     b2, files[b->file].path, b1);
                }
            }
            uint64_t v = replica ? 0 : overlap(a->start, a->len, e->slice_start, e->slice_len, e->ndim);
            a->use = v > 0;
            covered += v;
        }
        if (covered != (uint64_t)e->numel) {
            format_box(b1, sizeof b1, e->slice_start, e->slice_len, e->ndim);
            format_dims(b2, sizeof b2, e->shape, e->ndim);
            return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s'%s: the stored pieces of tensor '%s' "
                             "cover %" PRIu64 " of the %zu elements this rank holds (%s of %s): a "
                             "piece is missing", files[0].path, n > 1 ? " and its other files" : "",
                             name, covered, e->numel, b1, b2);
        }
    }
    return LOOM_OK;
}

/* Everything is validated: the copies cannot fail. */
static void apply_plan(const plan *pl, const tfile *files, const loom_param_table *t, uint32_t per,
                       float *dst)
{
    for (int i = 0; i < pl->n; i++) {
        const piece *pc = &pl->p[i];
        if (!pc->use)
            continue;
        const loom_param_entry *e = &t->entries[pc->target / (int)per];
        int slot = pc->target % (int)per;
        const unsigned char *bytes = files[pc->file].bytes;
        uint64_t header = header_len(bytes);
        const unsigned char *src = bytes + 8 + header + pc->te->begin;
        float *out = dst + (size_t)per * e->offset + (size_t)slot * e->numel;
        loom_params_copy_box(out, e->slice_start, e->slice_len, src, strcmp(pc->te->dtype, "BF16") == 0,
                 pc->start, pc->len, e->ndim);
    }
}

/* ZeRO partition piece p of entry e (a flat range of its held slice) as the boxes of the
 * logical tensor that tile it in order (loom_ckpt_range_boxes, moved to the slice's start);
 * .at is where each begins in the piece. */
static int piece_boxes(const loom_param_entry *e, const loom_zero_piece *p, loom_ckpt_box *bx)
{
    uint64_t a = p->lo - e->offset;
    int nb = loom_ckpt_range_boxes(e->slice_len, e->ndim, a, a + p->n, bx);
    for (int q = 0; q < nb; q++)
        for (int d = 0; d < e->ndim; d++)
            bx[q].start[d] += e->slice_start[d];
    return nb;
}

/* Under ZeRO: each used optimizer piece's intersection with this rank's partition pieces
 * only[0..n_only) straight into its partition state `part` (piece j's slot k at
 * per * only[j].pos + k * only[j].n, slot-major within the piece as zero.h keeps it): a flat
 * range of the held slice is the few boxes loom_ckpt_range_boxes tiles it with, each a
 * dense run of the range, so each is one box copy. No whole-state buffer. */
static void apply_plan_pieces(const plan *pl, const tfile *files, const loom_param_table *t,
                              uint32_t per, const loom_zero_piece *only, size_t n_only,
                              float *part)
{
    for (int i = 0; i < pl->n; i++) {
        const piece *pc = &pl->p[i];
        if (!pc->use)
            continue;
        int ei = pc->target / (int)per, slot = pc->target % (int)per;
        const loom_param_entry *e = &t->entries[ei];
        const unsigned char *bytes = files[pc->file].bytes;
        const unsigned char *src = bytes + 8 + header_len(bytes) + pc->te->begin;
        int bf16 = strcmp(pc->te->dtype, "BF16") == 0;
        for (size_t j = 0; j < n_only; j++) {
            if (only[j].entry != ei)
                continue;
            loom_ckpt_box bx[2 * LOOM_PARAM_MAX_DIMS];
            int nb = piece_boxes(e, &only[j], bx);
            float *out = part + (size_t)per * only[j].pos + (size_t)slot * only[j].n;
            for (int q = 0; q < nb; q++)
                loom_params_copy_box(out + bx[q].at, bx[q].start, bx[q].len, src, bf16,
                                     pc->start, pc->len, e->ndim);
        }
    }
}

/* Mark the tiles of pc's file that hold its intersection with the box (bs, bl) of the
 * logical tensor (nd dims): one run of the last dim per index of the others (a row
 * split's runs touch, a column split's are strided). */
static void mark_box(tfile *tf, const piece *pc, int nd, const int64_t *bs, const int64_t *bl)
{
    loom_ckpt_tiling g = tiling(pc->te);
    unsigned char *need = tf->need + tf->tile_base[pc->seq];
    int64_t lo[LOOM_PARAM_MAX_DIMS], hi[LOOM_PARAM_MAX_DIMS], idx[LOOM_PARAM_MAX_DIMS],
            str[LOOM_PARAM_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        lo[d] = pc->start[d] > bs[d] ? pc->start[d] : bs[d];
        hi[d] = pc->start[d] + pc->len[d] < bs[d] + bl[d] ? pc->start[d] + pc->len[d]
                                                          : bs[d] + bl[d];
        if (hi[d] <= lo[d])
            return;
        idx[d] = lo[d];
    }
    str[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--)
        str[d] = str[d + 1] * pc->len[d + 1];
    uint64_t run = (uint64_t)(hi[nd - 1] - lo[nd - 1]);
    for (;;) {
        int64_t off = 0;
        for (int d = 0; d < nd; d++)
            off += (idx[d] - pc->start[d]) * str[d];
        uint64_t row = (uint64_t)off / g.K, col = (uint64_t)off % g.K, bi = row / g.rows;
        for (uint64_t bj = col / g.cols; bj <= (col + run - 1) / g.cols; bj++)
            need[bi * g.col_blocks + bj] = 1;
        int d = nd - 2;
        while (d >= 0 && ++idx[d] == hi[d])
            idx[d] = lo[d], d--;
        if (d < 0)
            break;
    }
}

/* The tiles every used piece needs: its intersection with the held slice, or under ZeRO
 * (only != NULL) with this rank's partition pieces of the entry (flat ranges of the held
 * slice, as boxes: loom_ckpt_range_boxes), so a rank reads its partition's tiles only. */
static void mark_plan(const plan *pl, tfile *files, const loom_param_table *t, uint32_t per,
                      const loom_zero_piece *only, size_t n_only)
{
    for (int i = 0; i < pl->n; i++) {
        const piece *pc = &pl->p[i];
        int ei = pc->target / (int)per;
        const loom_param_entry *e = &t->entries[ei];
        if (!pc->use || !files[pc->file].mapped)
            continue;
        if (!only) {
            mark_box(&files[pc->file], pc, e->ndim, e->slice_start, e->slice_len);
            continue;
        }
        for (size_t j = 0; j < n_only; j++) {
            if (only[j].entry != ei)
                continue;
            loom_ckpt_box bx[2 * LOOM_PARAM_MAX_DIMS];
            int nb = piece_boxes(e, &only[j], bx);
            for (int q = 0; q < nb; q++)
                mark_box(&files[pc->file], pc, e->ndim, bx[q].start, bx[q].len);
        }
    }
}

/* Read the marked tiles of entry i, row by row (pieces adjacent in the file in one read),
 * then check each. */
static loom_status fetch_entry(tfile *tf, int i)
{
    const loom_st_entry *te = loom_safetensors_entry(tf->f, i);
    loom_ckpt_tiling g = tiling(te);
    const unsigned char *need = tf->need + tf->tile_base[i];
    size_t n = (size_t)(g.row_blocks * g.col_blocks), any = 0;
    for (size_t k = 0; k < n && !any; k++)
        any = need[k];
    if (!any)
        return LOOM_OK;
    uint64_t es = te->dtype_size, base = tf->data_at + te->begin, a = 0, b = 0; /* pending [a, b) */
    for (uint64_t r = 0; r < g.R; r++)
        for (uint64_t bj = 0; bj < g.col_blocks; bj++) {
            if (!need[(r / g.rows) * g.col_blocks + bj])
                continue;
            uint64_t c0 = bj * g.cols, w = g.K - c0 < g.cols ? g.K - c0 : g.cols;
            uint64_t x = base + (r * g.K + c0) * es, y = x + w * es;
            if (x != b) {
                if (b > a)
                    LOOM_TRY(pread_all(tf->fd, tf->path, tf->bytes + a, (size_t)(b - a), a));
                a = x;
            }
            b = y;
        }
    if (b > a)
        LOOM_TRY(pread_all(tf->fd, tf->path, tf->bytes + a, (size_t)(b - a), a));
    for (uint64_t bi = 0; bi < g.row_blocks; bi++)
        for (uint64_t bj = 0; bj < g.col_blocks; bj++)
            if (need[bi * g.col_blocks + bj])
                LOOM_TRY(check_tile(tf, i, bi, bj));
    return LOOM_OK;
}

static loom_status fetch_tiles(tfile *tf)
{
    for (int i = 0; i < loom_safetensors_count(tf->f); i++)
        LOOM_TRY(fetch_entry(tf, i));
    close(tf->fd);
    tf->fd = -1;
    return LOOM_OK;
}

/* Read and check every tensor file the manifest's layout names, plan both kinds, then read
 * the tiles the plans use. */
static loom_status tensors_open(const char *dir, const char *mpath, const loom_json *root,
                                const loom_param_table *t, uint32_t slots, const elsewhere *ew,
                                const loom_zero_piece *only, size_t n_only, int model_only,
                                tensor_set *ts)
{
    memset(ts, 0, sizeof *ts);
    loom_ckpt_layout l;
    LOOM_TRY(read_layout(mpath, root, &l));
    int nm = loom_ckpt_kind_count(&l, 0), no = loom_ckpt_kind_count(&l, 1);
    if (!(ts->files = calloc((size_t)(nm + no), sizeof *ts->files)))
        return loom_fail(LOOM_ERR_NOMEM, "out of memory reading checkpoint '%s'", dir);
    ts->tp = l.tp;
    ts->pp = l.pp;
    ts->n_model = nm;
    ts->n_optim = no;
    stat_read = stat_total = 0;
    for (int i = 0; i < nm + no; i++)
        ts->files[i].fd = -1;
    char name[64];
    /* no optimizer slots (sgd, or a frozen model's parameters only): no optim file read */
    for (int i = 0; i < (slots ? nm + no : nm); i++) {
        loom_ckpt_kind_name(name, sizeof name, &l, i < nm ? 0 : 1, i < nm ? i : i - nm);
        if ((size_t)snprintf(ts->files[i].path, sizeof ts->files[i].path, "%s/%s", dir, name) >=
            sizeof ts->files[i].path)
            return loom_fail(LOOM_ERR_INVALID, "checkpoint path '%s' is too long", dir);
        LOOM_TRY(read_tensors(mpath, root, name, &ts->files[i]));
    }
    LOOM_TRY(make_plan(ts->files, nm, t, 1, 0, ew, &ts->model));
    if (slots)
        LOOM_TRY(make_plan(ts->files + nm, no, t, slots, 1, ew, &ts->optim));
    mark_plan(&ts->model, ts->files, t, 1, model_only ? only : NULL, model_only ? n_only : 0);
    if (slots)
        mark_plan(&ts->optim, ts->files + nm, t, slots, only, n_only);
    for (int i = 0; i < nm + no; i++)
        if (ts->files[i].mapped)
            LOOM_TRY(fetch_tiles(&ts->files[i]));
    const char *env = getenv("LOOM_CKPT_STATS");
    if (env && strcmp(env, "1") == 0)
        fprintf(stderr, "checkpoint %s: read %" PRIu64 " of %" PRIu64 " bytes of its %d tensor "
                "files\n", dir, stat_read, stat_total, nm + no);
    return LOOM_OK;
}

static void tensors_copy(const tensor_set *ts, const loom_param_table *t, uint32_t slots,
                         float *params, float *state)
{
    apply_plan(&ts->model, ts->files, t, 1, params);
    if (slots)
        apply_plan(&ts->optim, ts->files + ts->n_model, t, slots, state);
}

static loom_status load_tensors(const char *ckpt_dir, const loom_param_table *t, uint32_t slots,
                                float *params, float *state, const elsewhere *ew)
{
    char mpath[PATH_MAX], *text = NULL;
    loom_json_doc *doc = NULL;
    tensor_set ts;
    memset(&ts, 0, sizeof ts);
    if ((size_t)snprintf(mpath, sizeof mpath, "%s/%s", ckpt_dir, LOOM_CKPT_MANIFEST_FILE) >= sizeof mpath)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint path '%s' is too long", ckpt_dir);
    loom_status st = loom_ckpt_manifest_open(ckpt_dir, &doc, &text);
    if (st == LOOM_OK)
        st = tensors_open(ckpt_dir, mpath, loom_json_root(doc), t, slots, ew, NULL, 0, 0, &ts);
    if (st == LOOM_OK)
        tensors_copy(&ts, t, slots, params, state);
    tensors_free(&ts);
    loom_json_free(doc);
    free(text);
    return st;
}

loom_status loom_ckpt_load_tensors(const char *ckpt_dir, const loom_param_table *t, uint32_t slots,
                                   float *params, float *state)
{
    return load_tensors(ckpt_dir, t, slots, params, state, NULL);
}

static int held_elsewhere(const void *m, const char *name);

loom_status loom_ckpt_load_model_params(const char *ckpt_dir, loom_gpt *m)
{
    elsewhere ew = {held_elsewhere, m};
    loom_backend *be = loom_gpt_backend(m);
    if (!loom_backend_device_memory(be))
        return load_tensors(ckpt_dir, loom_gpt_params(m), 0, loom_gpt_param_data(m), NULL, &ew);
    /* a device backend (a distillation teacher there): read into a host copy of the
     * parameters (filled first, so what is held elsewhere keeps its values), then copied in */
    size_t bytes = loom_gpt_params(m)->total * sizeof(float);
    float *host = malloc(bytes ? bytes : 1);
    if (!host)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for the host copy of the parameters (%zu MiB)",
                  bytes >> 20);
    be->ops->copy_to_host(be->self, host, loom_gpt_param_data(m), bytes);
    loom_status st = load_tensors(ckpt_dir, loom_gpt_params(m), 0, host, NULL, &ew);
    if (st == LOOM_OK)
        be->ops->copy_to_device(be->self, loom_gpt_param_data(m), host, bytes);
    free(host);
    return st;
}

/* One tensor file, every byte: size, XXH64, header checksum, parse, tile checksums. */
static loom_status verify_file(const char *mpath, const loom_json *root, const char *name,
                               tfile *tf)
{
    uint64_t want_head;
    int has_head;
    LOOM_TRY(header_record(mpath, root, name, &has_head, &want_head));
    LOOM_TRY(read_whole(mpath, root, name, tf)); /* size, xxh64, parse */
    if (!has_head)
        return LOOM_OK;
    tf->data_at = 8 + header_len(tf->bytes);
    if (loom_xxh64(tf->bytes, (size_t)tf->data_at) != want_head)
        return bad(tf->path, "header checksum differs from the manifest's files.%s.header_xxh64 "
                   "(the file was changed or damaged)", name);
    LOOM_TRY(read_tile_sums(tf));
    for (int i = 0; i < loom_safetensors_count(tf->f); i++) {
        loom_ckpt_tiling g = tiling(loom_safetensors_entry(tf->f, i));
        for (uint64_t bi = 0; bi < g.row_blocks; bi++)
            for (uint64_t bj = 0; bj < g.col_blocks; bj++)
                LOOM_TRY(check_tile(tf, i, bi, bj));
    }
    return LOOM_OK;
}

loom_status loom_ckpt_verify(const char *ckpt_dir, uint64_t *bytes)
{
    char mpath[PATH_MAX], *text = NULL, name[64];
    loom_json_doc *doc = NULL;
    loom_ckpt_layout l;
    uint64_t total = 0;
    if ((size_t)snprintf(mpath, sizeof mpath, "%s/%s", ckpt_dir, LOOM_CKPT_MANIFEST_FILE) >= sizeof mpath)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint path '%s' is too long", ckpt_dir);
    loom_status st = loom_ckpt_manifest_open(ckpt_dir, &doc, &text);
    if (st == LOOM_OK)
        st = read_layout(mpath, loom_json_root(doc), &l);
    int n = st == LOOM_OK ? layout_files(&l, file_kinds(loom_json_root(doc))) : 0;
    for (int i = 0; st == LOOM_OK && i < n; i++) {
        tfile tf;
        memset(&tf, 0, sizeof tf);
        tf.fd = -1;
        layout_file(&l, i, name, sizeof name);
        if ((size_t)snprintf(tf.path, sizeof tf.path, "%s/%s", ckpt_dir, name) >= sizeof tf.path)
            st = loom_fail(LOOM_ERR_INVALID, "checkpoint path '%s' is too long", ckpt_dir);
        else
            st = verify_file(mpath, loom_json_root(doc), name, &tf);
        total += tf.size;
        loom_safetensors_free(tf.f);
        free(tf.bytes);
        free(tf.tile_base);
    }
    if (st == LOOM_OK && bytes)
        *bytes = total + strlen(text);
    loom_json_free(doc);
    free(text);
    return st;
}

/* --- one load ---------------------------------------------------------------------- */

typedef struct loaded {
    const char *dir;
    char mpath[PATH_MAX];
    loom_json_doc *doc;
    char *manifest;
    tensor_set ts;
    loom_checkpoint_extra x;
    char *config;
    loom_session_state state;
    loom_zero_piece *zero_pieces;
    float *zero_params;        /* ZeRO-3 with params offloaded: the partition, for the offload */
    size_t n_zero_pieces;
    float *residual;           /* compression: every dp rank's residual, slot-major per entry */
    float *offloaded;          /* offload: the state this rank steps, for the pool or file */
} loaded;

static void loaded_free(loaded *ld)
{
    loom_json_free(ld->doc);
    free(ld->manifest);
    tensors_free(&ld->ts);
    free(ld->config);
    free(ld->zero_pieces);
    free(ld->zero_params);
    free(ld->residual);
    free(ld->offloaded);
}

static loom_status check_int(const loaded *ld, const loom_json *obj, const char *group,
                             const char *key, int64_t want, const char *what)
{
    int64_t v;
    if (!loom_json_int64(loom_json_get(obj, key), &v))
        return bad(ld->mpath, "manifest has no integer %s.%s", group, key);
    if (v != want)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': manifest %s.%s=%" PRId64 " but this "
                         "run's %s has %s=%" PRId64, ld->mpath, group, key, v, what, key, want);
    return LOOM_OK;
}

static loom_status check_model_config(const loaded *ld, const loom_json *root, loom_session *s)
{
    const loom_gpt_config *c = loom_gpt_get_config(loom_session_model(s));
    const loom_json *m = loom_json_get_type(root, "model", LOOM_JSON_OBJECT);
    if (!m)
        return bad(ld->mpath, "manifest has no model object");
    LOOM_TRY(check_int(ld, m, "model", "vocab", c->vocab, "model"));
    LOOM_TRY(check_int(ld, m, "model", "vocab_padded", c->vocab_padded, "model"));
    LOOM_TRY(check_int(ld, m, "model", "ctx", c->ctx, "model"));
    LOOM_TRY(check_int(ld, m, "model", "layers", c->layers, "model"));
    LOOM_TRY(check_int(ld, m, "model", "heads", c->heads, "model"));
    const loom_json *fam = loom_json_get_type(m, "family", LOOM_JSON_STRING);
    int llama = fam && strcmp(fam->text, "llama") == 0;
    if (llama != (c->family == LOOM_FAMILY_LLAMA))
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s' holds a %s model, but this run's "
                         "model is %s", ld->mpath, llama ? "loom.llama" : "loom.gpt",
                         c->family == LOOM_FAMILY_LLAMA ? "loom.llama" : "loom.gpt");
    if (llama) {
        LOOM_TRY(check_int(ld, m, "model", "kv_heads", c->kv_heads, "model"));
        LOOM_TRY(check_int(ld, m, "model", "ffn_dim", c->ffn_dim, "model"));
    }
    return check_int(ld, m, "model", "dim", c->dim, "model");
}

static loom_status check_optimizer(const loaded *ld, const loom_json *root, loom_session *s)
{
    uint32_t slots;
    loom_session_optim_state(s, &slots);
    const char *name = loom_session_optim_config(s)->desc->name;
    const loom_json *o = loom_json_get_type(root, "optimizer", LOOM_JSON_OBJECT);
    const loom_json *n = loom_json_get_type(o, "name", LOOM_JSON_STRING);
    if (!n)
        return bad(ld->mpath, "manifest has no optimizer.name string");
    if (strcmp(n->text, name) != 0)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': manifest optimizer.name='%.40s' but "
                         "this run's optimizer is '%s'", ld->mpath, n->text, name);
    return check_int(ld, o, "optimizer", "slots", slots, "optimizer");
}

/* step, steps_taken, precision state, data position, config. */
static loom_status read_state(loaded *ld, const loom_json *root, loom_session *s, const loom_data *data)
{
    if (!loom_json_int64(loom_json_get(root, "step"), &ld->x.step) || ld->x.step < 0 ||
        !loom_json_int64(loom_json_get(root, "steps_taken"), &ld->state.steps) || ld->state.steps < 0)
        return bad(ld->mpath, "manifest step and steps_taken must be integers >= 0");
    loom_session_state now;
    loom_session_get_state(s, &now);
    const loom_json *bits = loom_json_get_type(loom_json_get_type(root, "precision", LOOM_JSON_OBJECT),
                                               "state_bits", LOOM_JSON_ARRAY);
    if (!bits || bits->count > 4)
        return bad(ld->mpath, "manifest has no precision.state_bits list (at most 4 values)");
    if ((int)bits->count != now.n_precision_state)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': manifest precision state has %zu "
                         "values but this run's precision keeps %d", ld->mpath, bits->count,
                         now.n_precision_state);
    ld->state.n_precision_state = (int)bits->count;
    for (size_t i = 0; i < bits->count; i++) {
        uint64_t b;
        if (!loom_json_uint64(&bits->items[i], &b) || b > UINT32_MAX)
            return bad(ld->mpath, "manifest precision.state_bits[%zu] is not a 32-bit integer", i);
        uint32_t b32 = (uint32_t)b;
        memcpy(&ld->state.precision_state[i], &b32, sizeof b32);
    }
    const loom_json *d = loom_json_get(root, "data");
    if (!d || (d->type != LOOM_JSON_NULL && d->type != LOOM_JSON_OBJECT))
        return bad(ld->mpath, "manifest data must be null or {\"kind\": ..., \"state\": [...]}");
    if (d->type == LOOM_JSON_OBJECT) {
        const loom_json *k = loom_json_get_type(d, "kind", LOOM_JSON_STRING);
        const loom_json *w = loom_json_get_type(d, "state", LOOM_JSON_ARRAY);
        if (!k || !k->len || k->len >= LOOM_CHECKPOINT_KIND_MAX || strlen(k->text) != k->len || !w ||
            w->count > LOOM_DATA_STATE_MAX)
            return bad(ld->mpath, "manifest data needs a kind (1 to %d bytes) and at most %d state "
                       "words", LOOM_CHECKPOINT_KIND_MAX - 1, LOOM_DATA_STATE_MAX);
        memcpy(ld->x.data_kind, k->text, k->len + 1);
        ld->x.n_data_state = (int)w->count;
        for (size_t i = 0; i < w->count; i++)
            if (!loom_json_uint64(&w->items[i], &ld->x.data_state[i]))
                return bad(ld->mpath, "manifest data.state[%zu] is not a 64-bit integer >= 0", i);
    }
    if (data && !ld->x.data_kind[0])
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s' holds no data position; load it without "
                         "a data source", ld->mpath);
    if (data && strcmp(ld->x.data_kind, data->ops->kind) != 0)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': the data position is from a '%s' "
                         "source but this run reads '%s'", ld->mpath, ld->x.data_kind, data->ops->kind);
    const loom_json *c = loom_json_get(root, "config");
    if (!c || (c->type != LOOM_JSON_NULL && c->type != LOOM_JSON_OBJECT))
        return bad(ld->mpath, "manifest config must be null or an object");
    if (c->type == LOOM_JSON_OBJECT) {
        if (!(ld->config = malloc(c->end - c->begin + 1)))
            return loom_fail(LOOM_ERR_NOMEM, "out of memory");
        memcpy(ld->config, ld->manifest + c->begin, c->end - c->begin);
        ld->config[c->end - c->begin] = '\0';
    }
    return LOOM_OK;
}

static int held_elsewhere(const void *m, const char *name)
{
    return loom_gpt_held_elsewhere(m, name);
}

/* Gradient compression's residuals (checkpoint.h "residual*"): read when both the
 * checkpoint and this run compress; a checkpoint without them starts the residual at zero
 * (compression turned on at resume), one whose dp or method differs is refused. */
static loom_status read_residuals(loaded *ld, const loom_json *root, loom_session *s,
                                  const elsewhere *ew)
{
    loom_compress *c = loom_session_compress(s);
    const loom_json *cj = loom_json_get_type(root, "compress", LOOM_JSON_OBJECT);
    if (!c || !cj)
        return LOOM_OK;
    const loom_json *mj = loom_json_get_type(cj, "method", LOOM_JSON_STRING);
    const char *method = loom_compress_method_name(loom_compress_method_in_use(c));
    int64_t dp = 0;
    if (!mj || !loom_json_int64(loom_json_get(cj, "dp"), &dp) || dp < 2 || dp > 65536)
        return bad(ld->mpath, "manifest compress must be {\"method\": M, \"dp\": N >= 2}");
    size_t total, per = (size_t)loom_compress_residual_slots(c);
    loom_compress_residual(c, &total);
    total /= per; /* the floats of one slot: the gradient buffer's */
    /* canonical compression: one residual per global micro-batch, whatever dp ran it */
    const loom_json *lj = loom_json_get(cj, "leaves");
    int leaves = lj && lj->type == LOOM_JSON_BOOL && lj->boolean;
    int my_leaves = loom_compress_canonical(c);
    int my_dp = loom_compress_dp_size(c), my_slots = my_dp * (int)per;
    if (leaves != my_leaves)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s' holds the error-feedback residuals of "
                         "compress = \"%.20s\" in %s mode (%s); this run is in %s mode: resume in "
                         "the mode it was saved in", ld->mpath, mj->text, leaves ? "canonical" : "fast",
                         leaves ? "one per global micro-batch" : "one per dp rank",
                         my_leaves ? "canonical" : "fast");
    if (leaves && (dp != my_slots || strcmp(mj->text, method) != 0))
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s' holds canonical compress = \"%.20s\"'s "
                         "residuals of %lld micro-batches a step; this run compresses with \"%s\" "
                         "over %d (batch.global / batch.micro): resume with the same global batch "
                         "and method (any dp)", ld->mpath, mj->text, (long long)dp, method, my_slots);
    if (!leaves && (dp != my_dp || strcmp(mj->text, method) != 0))
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s' holds the error-feedback residuals of "
                         "compress = \"%.20s\" at dp=%lld; this run compresses with \"%s\" at "
                         "dp=%d, and the residuals are per dp rank: resume at dp=%lld with "
                         "\"%.20s\"", ld->mpath, mj->text, (long long)dp, method, my_dp,
                         (long long)dp, mj->text);
    /* under ep an expert's residual is of its edp group's messages, one per member: another
     * ep has other groups (and another count of them), so nothing to re-shard it into */
    int64_t saved_ep = 1;
    const loom_json *ej = loom_json_get(cj, "ep");
    if (ej && (!loom_json_int64(ej, &saved_ep) || saved_ep < 1 || saved_ep > 65536))
        return bad(ld->mpath, "manifest compress ep must be an integer >= 1");
    int my_ep = loom_gpt_expert_parallel(loom_session_model(s));
    if (saved_ep != my_ep)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s' holds the error-feedback residuals of "
                         "compress = \"%.20s\" at ep=%lld; this run compresses at ep=%d, and under "
                         "ep each expert's residual belongs to its expert-data-parallel group's "
                         "ranks (dp/ep of them): resume at mesh.ep=%lld, or without compress "
                         "(the residuals are then not read)", ld->mpath, mj->text,
                         (long long)saved_ep, my_ep, (long long)saved_ep);
    loom_ckpt_layout l;
    LOOM_TRY(read_layout(ld->mpath, root, &l));
    int tp = l.tp, pp = l.pp, parts = tp * pp, first = 0;
    if (pp > 1 && !leaves) /* fast mode: each stage reads only its own files (the tied wte
                            * is in two of them); canonical: disjoint, read as the model's */
        LOOM_TRY(loom_ckpt_residual_stage(ld->mpath, s, tp, pp, &first, &parts));
    const loom_param_table *t = loom_gpt_params(loom_session_model(s));
    tfile *files = calloc((size_t)parts, sizeof *files);
    plan pl = {NULL, 0};
    ld->residual = calloc((size_t)dp * total + 1, sizeof(float));
    loom_status st = files && ld->residual ? LOOM_OK
                                           : loom_fail(LOOM_ERR_NOMEM, "out of memory reading "
                                                       "checkpoint '%s'", ld->dir);
    for (int i = 0; files && i < parts; i++)
        files[i].fd = -1;
    char name[64];
    for (int i = 0; st == LOOM_OK && i < parts; i++) {
        loom_ckpt_file_name(name, sizeof name, "residual", first + i, tp, pp);
        if ((size_t)snprintf(files[i].path, sizeof files[i].path, "%s/%s", ld->dir, name) >=
            sizeof files[i].path)
            st = loom_fail(LOOM_ERR_INVALID, "checkpoint path '%s' is too long", ld->dir);
        else
            st = read_tensors(ld->mpath, root, name, &files[i]);
    }
    if (st == LOOM_OK)
        st = make_plan(files, parts, t, (uint32_t)dp, 1, ew, &pl);
    if (st == LOOM_OK)
        mark_plan(&pl, files, t, (uint32_t)dp, NULL, 0);
    for (int i = 0; st == LOOM_OK && i < parts; i++)
        if (files[i].mapped)
            st = fetch_tiles(&files[i]);
    if (st == LOOM_OK)
        apply_plan(&pl, files, t, (uint32_t)dp, ld->residual);
    for (int i = 0; files && i < parts; i++)
        tfile_free(&files[i]);
    free(files);
    free(pl.p);
    return st;
}

static loom_status validate(loaded *ld, loom_session *s, const loom_data *data)
{
    LOOM_TRY(loom_ckpt_manifest_open(ld->dir, &ld->doc, &ld->manifest));
    const loom_json *root = loom_json_root(ld->doc);
    LOOM_TRY(check_model_config(ld, root, s));
    LOOM_TRY(check_optimizer(ld, root, s));
    LOOM_TRY(read_state(ld, root, s, data));
    uint32_t slots;
    loom_session_optim_state(s, &slots);
    const loom_gpt *m = loom_session_model(s);
    elsewhere ew = {held_elsewhere, m};
    loom_zero *z = loom_session_zero(s);
    if (z) /* ZeRO: only this rank's partition of the state is read (zero_ckpt.h) */
        LOOM_TRY(loom_zero_pieces(z, loom_zero_rank(z), &ld->zero_pieces, &ld->n_zero_pieces));
    /* ZeRO-3 (and the fp32 master of zero=1/2 with 16-bit weights): only its partition of
     * the parameters too, into the partition (copy_in) */
    int stage3 = z && loom_zero_params_parted(z);
    LOOM_TRY(tensors_open(ld->dir, ld->mpath, root, loom_gpt_params(m), slots, &ew,
                          ld->zero_pieces, ld->n_zero_pieces, stage3, &ld->ts));
    LOOM_TRY(read_residuals(ld, root, s, &ew));
    loom_offload *off = loom_session_offload_state(s);
    if (off && !(ld->offloaded = malloc(loom_offload_floats(off) * sizeof(float) + 1)))
        return loom_fail(LOOM_ERR_NOMEM, "checkpoint '%s': out of memory for a copy of the "
                         "offloaded optimizer state (%zu MiB)", ld->mpath,
                         loom_offload_floats(off) * sizeof(float) >> 20);
    /* offload params: a partition-sized copy to fill, written into the offload after */
    if (stage3 && !loom_zero_load_params_dst(z) &&
        !(ld->zero_params = calloc(loom_zero_part_floats(z) + 1, sizeof(float))))
        return loom_fail(LOOM_ERR_NOMEM, "checkpoint '%s': out of memory for a copy of the "
                         "offloaded parameter partition (%zu MiB)", ld->mpath,
                         loom_zero_part_floats(z) * sizeof(float) >> 20);
    return LOOM_OK; /* ZeRO: the state goes straight into the partition (copy_in) */
}

/* Everything is validated: the copies cannot fail. */
static void copy_in(const loaded *ld, loom_session *s)
{
    uint32_t slots;
    float *state = loom_session_optim_state(s, &slots);
    loom_gpt *m = loom_session_model(s);
    loom_zero *z = loom_session_zero(s);
    loom_session_to_host(s); /* device backend: into the host mirrors, then back (below) */
    if (ld->offloaded) /* offload: into its copy, written to the pool or file after */
        state = ld->offloaded;
    else if (z) /* ZeRO: this rank's partition of the state */
        state = loom_zero_state(z, &(size_t){0});
    const loom_param_table *t = loom_gpt_params(m);
    /* ZeRO: the state's pieces straight into the partition; stage 3's parameters too (into
     * the offload's copy when it holds them), the model's buffer left to the gathers;
     * below stage 3 the parameters as without ZeRO */
    int stage3 = z && loom_zero_params_parted(z);
    if (stage3) {
        float *part = ld->zero_params ? ld->zero_params : loom_zero_load_params_dst(z);
        apply_plan_pieces(&ld->ts.model, ld->ts.files, t, 1, ld->zero_pieces, ld->n_zero_pieces,
                          part);
        loom_zero_params_stale(z);
    } else {
        tensors_copy(&ld->ts, t, 0, loom_session_host_params(s), NULL);
    }
    if (slots && state) {
        if (z)
            apply_plan_pieces(&ld->ts.optim, ld->ts.files + ld->ts.n_model, t, slots,
                              ld->zero_pieces, ld->n_zero_pieces, state);
        else
            apply_plan(&ld->ts.optim, ld->ts.files + ld->ts.n_model, t, slots, state);
    }
    loom_session_from_host(s);
    loom_compress *c = loom_session_compress(s);
    if (c) { /* this dp rank's slots of the residuals (canonical: its micro-batches'), or
              * zero: none saved */
        size_t floats, per = (size_t)loom_compress_residual_slots(c);
        float *r = loom_compress_residual(c, &floats);
        size_t total = floats / per;
        size_t dp = (size_t)loom_compress_dp_size(c) * per;
        size_t me = (size_t)loom_compress_dp_rank(c) * per;
        memset(r, 0, floats * sizeof(float));
        for (size_t k = 0; k < per; k++)
            for (int i = 0; ld->residual && i < t->count; i++) {
                const loom_param_entry *e = &t->entries[i];
                memcpy(r + k * total + e->offset,
                       ld->residual + dp * e->offset + (me + k) * e->numel, e->numel * sizeof(float));
            }
    }
}

loom_status loom_checkpoint_load_data(loom_session *s, const char *ckpt_path, loom_data *data,
                                      loom_checkpoint_extra *out)
{
    loaded ld;
    memset(&ld, 0, sizeof ld);
    ld.dir = ckpt_path;
    if ((size_t)snprintf(ld.mpath, sizeof ld.mpath, "%s/%s", ckpt_path, LOOM_CKPT_MANIFEST_FILE) >=
        sizeof ld.mpath)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint path '%s' is too long", ckpt_path);
    loom_status st = validate(&ld, s, data);
    uint64_t old[LOOM_DATA_STATE_MAX];
    int n_old = 0;
    if (st == LOOM_OK && data) {
        n_old = data->ops->get_state(data->self, old);
        st = data->ops->set_state(data->self, ld.x.data_state, ld.x.n_data_state);
        if (st != LOOM_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", loom_last_error());
            st = loom_fail(st, "checkpoint '%s': data position refused: %s", ld.mpath, msg);
        }
    }
    if (st == LOOM_OK) {
        st = loom_session_set_state(s, &ld.state);
        if (st != LOOM_OK && data)
            data->ops->set_state(data->self, old, n_old);
    }
    if (st == LOOM_OK) {
        copy_in(&ld, s);
        if (ld.offloaded) /* an I/O failure here names the file; the weights are in already */
            st = loom_offload_write_state(loom_session_offload_state(s), ld.offloaded);
        if (st == LOOM_OK && ld.zero_params) /* offload params: the partition into it */
            st = loom_zero_store_part(loom_session_zero(s), ld.zero_params);
        if (st == LOOM_OK && loom_session_zero(s)) /* zero=1/2, 16-bit: the compute copy */
            st = loom_zero_params_loaded(loom_session_zero(s));
    }
    if (st == LOOM_OK) {
        if (out) {
            *out = ld.x;
            out->config_json = ld.config;
            ld.config = NULL;
        }
    }
    loaded_free(&ld);
    return st;
}

loom_status loom_checkpoint_load(loom_session *s, const char *ckpt_path, loom_checkpoint_extra *out)
{
    return loom_checkpoint_load_data(s, ckpt_path, NULL, out);
}

void loom_checkpoint_extra_free(loom_checkpoint_extra *e)
{
    if (!e)
        return;
    free((char *)e->config_json);
    e->config_json = NULL;
}
