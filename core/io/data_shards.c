/* data_shards.c — llm.c token shards (see data_shards.h for the format and reading order).
 *
 * Invariants: every file of a split passed the header check at open; a split's position
 * is (epoch, slot, pos) — slot is the index in the epoch's visiting order (the glob order
 * unless shuffled), pos is a token offset (unshuffled) or a sample index (shuffled); at
 * most one file per split is mapped, the one the last batch came from.
 */
#include "data_shards.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/rng.h"
#include "base/status.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llm.c shards are little-endian; this reader maps them as they are"
#endif

#define HEADER_BYTES ((int64_t)LOOM_SHARD_HEADER_INTS * 4)

typedef struct shard_file {
    char *path;
    int64_t ntok;
} shard_file;

typedef struct shard_split {
    shard_file *files;
    int n;
    uint64_t total;
    uint64_t epoch, slot, pos;  /* the reading position (see the invariants above) */
    uint64_t checked_bt;        /* B*T every file was checked to hold one batch of */
    int mapped;                 /* index of the mapped file, -1: none */
    void *map;
    size_t map_bytes;
} shard_split;

typedef struct shard_data {
    shard_split sp[2];
    int shuffle;
    uint64_t seed, fingerprint;
    /* shuffled train: the visiting order of this epoch's shards, and of one shard's
     * samples, cached by their keys */
    uint32_t *order;
    uint64_t order_epoch;
    int have_order;
    uint32_t *samples;
    size_t n_samples, samples_cap;
    uint64_t samples_epoch;
    int samples_file, have_samples;
} shard_data;

static const char *split_name(loom_split s) { return s == LOOM_SPLIT_TRAIN ? "train" : "val"; }

/* Check one file's header against its size; *ntok gets the token count. */
static loom_status check_shard(const char *path, int64_t *ntok)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        LOOM_FAIL(LOOM_ERR_IO, "cannot open shard '%s': %s", path, strerror(errno));
    struct stat st;
    int32_t h[LOOM_SHARD_HEADER_INTS];
    loom_status rc = LOOM_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = loom_fail(LOOM_ERR_IO, "shard '%s' is not a regular file", path);
    } else if ((int64_t)st.st_size < HEADER_BYTES ||
               pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
        rc = loom_fail(LOOM_ERR_CORRUPT, "shard '%s' is %lld bytes, shorter than the %lld-byte "
                       "header (256 int32)", path, (long long)st.st_size, (long long)HEADER_BYTES);
    } else if (h[0] != LOOM_SHARD_MAGIC) {
        rc = loom_fail(LOOM_ERR_CORRUPT, "shard '%s' has magic %d in header[0]; an llm.c token "
                       "shard has %d", path, h[0], LOOM_SHARD_MAGIC);
    } else if (h[1] != LOOM_SHARD_VERSION) {
        rc = loom_fail(LOOM_ERR_CORRUPT, "shard '%s' has version %d in header[1]; loom reads "
                       "version %d", path, h[1], LOOM_SHARD_VERSION);
    } else if (h[2] < 1) {
        rc = loom_fail(LOOM_ERR_CORRUPT, "shard '%s' has token count %d in header[2]; a shard "
                       "holds at least one token", path, h[2]);
    } else if ((int64_t)st.st_size != HEADER_BYTES + 2 * (int64_t)h[2]) {
        rc = loom_fail(LOOM_ERR_CORRUPT, "shard '%s' has token count %d in header[2] (%lld bytes "
                       "with the header), but the file is %lld bytes", path, h[2],
                       (long long)(HEADER_BYTES + 2 * (int64_t)h[2]), (long long)st.st_size);
    } else {
        *ntok = h[2];
    }
    close(fd);
    return rc;
}

static void close_split(shard_split *s)
{
    if (s->map)
        munmap(s->map, s->map_bytes);
    for (int i = 0; i < s->n; i++)
        free(s->files[i].path);
    free(s->files);
    memset(s, 0, sizeof *s);
    s->mapped = -1;
}

static loom_status open_split(shard_split *s, const char *pattern, loom_split which)
{
    memset(s, 0, sizeof *s);
    s->mapped = -1;
    if (!pattern)
        return LOOM_OK;
    glob_t g;
    int rc = glob(pattern, GLOB_ERR, NULL, &g);
    if (rc != 0)
        globfree(&g); /* glob sets gl_pathv (NULL or allocated) on every return */
    if (rc == GLOB_NOMATCH)
        LOOM_FAIL(LOOM_ERR_IO, "%s shard glob '%s' matches no file", split_name(which), pattern);
    if (rc != 0) {
        LOOM_FAIL(rc == GLOB_NOSPACE ? LOOM_ERR_NOMEM : LOOM_ERR_IO,
                  "cannot expand %s shard glob '%s' (a directory in it is unreadable?)",
                  split_name(which), pattern);
    }
    loom_status st = LOOM_OK;
    s->files = calloc(g.gl_pathc, sizeof *s->files);
    if (!s->files)
        st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == LOOM_OK && i < g.gl_pathc; i++) {
        shard_file *f = &s->files[s->n];
        f->path = strdup(g.gl_pathv[i]);
        if (!f->path) {
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
            break;
        }
        s->n++;
        st = check_shard(f->path, &f->ntok);
        s->total += (uint64_t)f->ntok;
    }
    globfree(&g);
    return st;
}

/* Map file idx of s (unmapping the previous one). */
static loom_status map_file(shard_split *s, int idx)
{
    if (s->mapped == idx)
        return LOOM_OK;
    if (s->map)
        munmap(s->map, s->map_bytes);
    s->map = NULL;
    s->mapped = -1;
    const shard_file *f = &s->files[idx];
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        LOOM_FAIL(LOOM_ERR_IO, "cannot open shard '%s': %s", f->path, strerror(errno));
    struct stat st;
    size_t bytes = (size_t)(HEADER_BYTES + 2 * f->ntok);
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != bytes) {
        close(fd);
        LOOM_FAIL(LOOM_ERR_CORRUPT, "shard '%s' changed since it was opened (%zu bytes expected)",
                  f->path, bytes);
    }
    void *p = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        LOOM_FAIL(LOOM_ERR_IO, "cannot map shard '%s': %s", f->path, strerror(errno));
    s->map = p;
    s->map_bytes = bytes;
    s->mapped = idx;
    return LOOM_OK;
}

/* Fisher-Yates (Durstenfeld) over p[0..n), draw i keyed by (seed, stream, i). */
static void permute(uint32_t *p, size_t n, uint64_t seed, uint64_t stream)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint32_t)i;
    for (size_t i = n; i-- > 1;) {
        size_t j = (size_t)(loom_rng_uniform(seed, stream, i) * (double)(i + 1));
        if (j > i)
            j = i; /* the uniform is in (0, 1] */
        uint32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

/* Which file the train split's slot means in epoch e (shuffled: this epoch's order). */
static int train_file(shard_data *d)
{
    shard_split *s = &d->sp[LOOM_SPLIT_TRAIN];
    if (!d->shuffle)
        return (int)s->slot;
    if (!d->have_order || d->order_epoch != s->epoch) {
        permute(d->order, (size_t)s->n, d->seed,
                loom_rng_mix(loom_rng_stream("loom.shards.order") + s->epoch));
        d->order_epoch = s->epoch;
        d->have_order = 1;
    }
    return (int)d->order[s->slot];
}

static loom_status sample_order(shard_data *d, uint64_t epoch, int file, size_t n)
{
    if (d->have_samples && d->samples_epoch == epoch && d->samples_file == file &&
        d->n_samples == n)
        return LOOM_OK;
    if (n > d->samples_cap) {
        uint32_t *p = realloc(d->samples, n * sizeof *p);
        if (!p)
            LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory for %zu shard sample indices", n);
        d->samples = p;
        d->samples_cap = n;
    }
    uint64_t stream = loom_rng_mix(loom_rng_stream("loom.shards.samples") + epoch);
    permute(d->samples, n, d->seed, loom_rng_mix(stream + (uint64_t)file));
    d->samples_epoch = epoch;
    d->samples_file = file;
    d->n_samples = n;
    d->have_samples = 1;
    return LOOM_OK;
}

/* Every file must hold one batch, as llm.c's loader asserts at init. */
static loom_status check_batch_fits(shard_split *s, uint64_t bt, int B, int T)
{
    if (s->checked_bt == bt)
        return LOOM_OK;
    for (int i = 0; i < s->n; i++)
        if ((uint64_t)s->files[i].ntok < bt + 1)
            LOOM_FAIL(LOOM_ERR_INVALID, "shard '%s' holds %lld tokens; a batch of %d x %d needs "
                      "%llu (every shard must hold one batch)", s->files[i].path,
                      (long long)s->files[i].ntok, B, T, (unsigned long long)(bt + 1));
    s->checked_bt = bt;
    return LOOM_OK;
}

static void advance(shard_split *s)
{
    s->pos = 0;
    if (++s->slot == (uint64_t)s->n) {
        s->slot = 0;
        s->epoch++;
    }
}

static loom_status shards_next(void *self, loom_split split, int *tokens, int *targets, int B,
                               int T)
{
    shard_data *d = self;
    shard_split *s = &d->sp[split];
    if (s->n == 0)
        LOOM_FAIL(LOOM_ERR_INVALID, "these shards have no %s split (give loom.data.shards a "
                  "val = GLOB)", split_name(split));
    uint64_t bt = (uint64_t)B * (uint64_t)T;
    LOOM_TRY(check_batch_fits(s, bt, B, T));
    int shuffled = d->shuffle && split == LOOM_SPLIT_TRAIN;
    int f = split == LOOM_SPLIT_TRAIN ? train_file(d) : (int)s->slot;
    uint64_t start;
    if (!shuffled) {
        if (s->pos + bt + 1 > (uint64_t)s->files[f].ntok) {
            advance(s);
            f = split == LOOM_SPLIT_TRAIN ? train_file(d) : (int)s->slot;
        }
        start = s->pos;
        s->pos += bt;
    } else {
        /* llm.c: shard_num_samples = (ntok - 1) / (B*T), the -1 for the shifted target */
        if (s->pos >= (uint64_t)(s->files[f].ntok - 1) / bt) {
            advance(s);
            f = train_file(d);
        }
        LOOM_TRY(sample_order(d, s->epoch, f, (size_t)((uint64_t)(s->files[f].ntok - 1) / bt)));
        start = (uint64_t)d->samples[s->pos] * bt;
        s->pos++;
    }
    LOOM_TRY(map_file(s, f));
    const uint16_t *p = (const uint16_t *)((const char *)s->map + HEADER_BYTES) + start;
    for (uint64_t i = 0; i < bt; i++) {
        tokens[i] = p[i];
        targets[i] = p[i + 1];
    }
    return LOOM_OK;
}

static void shards_rewind(void *self, loom_split split)
{
    shard_split *s = &((shard_data *)self)->sp[split];
    s->epoch = s->slot = s->pos = 0;
}

enum { STATE_WORDS = 8 };

static int shards_get_state(void *self, uint64_t *w)
{
    shard_data *d = self;
    w[0] = d->sp[0].epoch;
    w[1] = d->sp[0].slot;
    w[2] = d->sp[0].pos;
    w[3] = d->sp[1].slot;
    w[4] = d->sp[1].pos;
    w[5] = (uint64_t)d->shuffle;
    w[6] = d->seed;
    w[7] = d->fingerprint; /* checked on restore: the same shards */
    return STATE_WORDS;
}

static loom_status shards_set_state(void *self, const uint64_t *w, int n)
{
    shard_data *d = self;
    if (n != STATE_WORDS)
        LOOM_FAIL(LOOM_ERR_CORRUPT, "shard data position needs %d words, got %d", STATE_WORDS, n);
    if (w[5] != (uint64_t)d->shuffle || w[6] != d->seed)
        LOOM_FAIL(LOOM_ERR_INVALID, "shard data position was saved with shuffle=%d seed=%llu; "
                  "this source has shuffle=%d seed=%llu", (int)w[5], (unsigned long long)w[6],
                  d->shuffle, (unsigned long long)d->seed);
    const shard_split *tr = &d->sp[0], *va = &d->sp[1];
    int ok = w[7] == d->fingerprint && w[1] < (uint64_t)tr->n &&
             (va->n ? w[3] < (uint64_t)va->n : w[3] == 0) &&
             (va->n == 0 || w[4] <= (uint64_t)va->files[w[3]].ntok);
    if (ok && !d->shuffle)
        ok = w[2] <= (uint64_t)tr->files[w[1]].ntok;
    if (!ok)
        LOOM_FAIL(LOOM_ERR_CORRUPT, "shard data position does not fit these shards (train '%s' "
                  "and %d more): were they regenerated, or did the glob change?",
                  tr->files[0].path, tr->n - 1);
    d->sp[0].epoch = w[0];
    d->sp[0].slot = w[1];
    d->sp[0].pos = w[2];
    d->sp[1].epoch = 0;
    d->sp[1].slot = w[3];
    d->sp[1].pos = w[4];
    return LOOM_OK;
}

static size_t shards_size(void *self, loom_split split)
{
    return (size_t)((shard_data *)self)->sp[split].total;
}

static int shards_vocab(void *self) { return 65536; }

static void shards_close(void *self)
{
    shard_data *d = self;
    if (!d)
        return;
    close_split(&d->sp[0]);
    close_split(&d->sp[1]);
    free(d->order);
    free(d->samples);
    free(d);
}

const loom_data_ops loom_data_shards_ops = {
    "shards", shards_next, shards_rewind, shards_get_state, shards_set_state,
    shards_size, shards_vocab, shards_close,
};

/* Token counts of both splits in order: a restore into different shards is refused. */
static uint64_t fingerprint(const shard_data *d)
{
    uint64_t h = loom_rng_stream("loom.shards");
    for (int k = 0; k < 2; k++) {
        h = loom_rng_mix(h + (uint64_t)d->sp[k].n);
        for (int i = 0; i < d->sp[k].n; i++)
            h = loom_rng_mix(h + (uint64_t)d->sp[k].files[i].ntok);
    }
    return h;
}

loom_status loom_data_open_shards(const char *train_glob, const char *val_glob, int shuffle,
                                  uint64_t seed, loom_data *out)
{
    memset(out, 0, sizeof *out);
    if (!train_glob || !*train_glob)
        LOOM_FAIL(LOOM_ERR_INVALID, "shard data needs a train glob (e.g. 'data/train_*.bin')");
    shard_data *d = calloc(1, sizeof *d);
    if (!d)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    d->sp[0].mapped = d->sp[1].mapped = -1;
    d->shuffle = shuffle != 0;
    d->seed = seed;
    loom_status st = open_split(&d->sp[LOOM_SPLIT_TRAIN], train_glob, LOOM_SPLIT_TRAIN);
    if (st == LOOM_OK)
        st = open_split(&d->sp[LOOM_SPLIT_VAL], val_glob, LOOM_SPLIT_VAL);
    if (st == LOOM_OK && d->shuffle) {
        d->order = malloc((size_t)d->sp[0].n * sizeof *d->order);
        if (!d->order)
            st = loom_fail(LOOM_ERR_NOMEM, "out of memory");
    }
    if (st != LOOM_OK) {
        shards_close(d);
        return st;
    }
    d->fingerprint = fingerprint(d);
    out->ops = &loom_data_shards_ops;
    out->self = d;
    return LOOM_OK;
}
