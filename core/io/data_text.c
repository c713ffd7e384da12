/* data_text.c — a text file as training data: bytes are tokens (vocab 256).
 *
 * The file is split once: the first (1 - val_fraction) of its bytes are the train split,
 * the rest the val split. Batches are read as llm.c's loader reads them: B*T+1
 * consecutive tokens from the current position, targets = inputs shifted by one, the
 * position advancing by B*T and wrapping to the start when the next batch would not fit.
 * Opened through loom_data_open_text (data.h); shuffled, each sequence is a window at an
 * offset keyed by (seed, window index).
 */
#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"

static const loom_data_ops text_ops;

typedef struct text_data {
    unsigned char *bytes;
    size_t size;
    size_t start[2], len[2], pos[2];
    int shuffle;        /* train batches from random windows instead of in order */
    uint64_t seed, drawn; /* windows drawn so far: the shuffled reading position */
    char path[512];
} text_data;

static void text_close(void *self)
{
    text_data *d = self;
    if (!d)
        return;
    free(d->bytes);
    free(d);
}

loom_status loom_data_open_text(const char *path, double val_fraction, int shuffle, uint64_t seed,
                                loom_data *out)
{
    memset(out, 0, sizeof *out);
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        LOOM_FAIL(LOOM_ERR_INVALID, "val_fraction=%g must be in [0, 1)", val_fraction);
    FILE *f = fopen(path, "rb");
    if (!f)
        LOOM_FAIL(LOOM_ERR_IO, "cannot open text data '%s': %s", path, strerror(errno));
    text_data *d = calloc(1, sizeof *d);
    if (!d) {
        fclose(f);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    }
    snprintf(d->path, sizeof d->path, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    d->bytes = n > 0 ? malloc((size_t)n) : NULL;
    if (n > 0 && !d->bytes) {
        fclose(f);
        text_close(d);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory reading text data '%s' (%ld bytes)", path, n);
    }
    if (n <= 0 || fread(d->bytes, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        text_close(d);
        LOOM_FAIL(LOOM_ERR_IO, "cannot read text data '%s' (%ld bytes)", path, n);
    }
    fclose(f);
    d->size = (size_t)n;
    d->shuffle = shuffle;
    d->seed = seed;
    size_t val = (size_t)((double)d->size * val_fraction);
    d->start[LOOM_SPLIT_TRAIN] = 0;
    d->len[LOOM_SPLIT_TRAIN] = d->size - val;
    d->start[LOOM_SPLIT_VAL] = d->size - val;
    d->len[LOOM_SPLIT_VAL] = val;
    out->ops = &text_ops;
    out->self = d;
    return LOOM_OK;
}

static loom_status text_next(void *self, loom_split split, int *tokens, int *targets, int B, int T)
{
    text_data *d = self;
    size_t need = (size_t)B * T + 1;
    if (d->len[split] < need)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s split of '%s' has %zu tokens; a batch of %d x %d needs %zu",
                  split == LOOM_SPLIT_TRAIN ? "train" : "val", d->path, d->len[split], B, T, need);
    if (d->shuffle && split == LOOM_SPLIT_TRAIN) {
        /* Each sequence is a window of T+1 bytes at an offset keyed by (seed, window
         * index): independent of B, so a run's data does not depend on how its global
         * batch is split into micro-batches or ranks. */
        uint64_t stream = loom_rng_stream("text-window");
        size_t span = d->len[split] - (size_t)T;
        for (int b = 0; b < B; b++) {
            size_t off = (size_t)(loom_rng_uniform(d->seed, stream, d->drawn++) * (double)span) % span;
            const unsigned char *w = d->bytes + d->start[split] + off;
            for (int t = 0; t < T; t++) {
                tokens[(size_t)b * T + t] = w[t];
                targets[(size_t)b * T + t] = w[t + 1];
            }
        }
        return LOOM_OK;
    }
    if (d->pos[split] + need > d->len[split])
        d->pos[split] = 0;
    const unsigned char *p = d->bytes + d->start[split] + d->pos[split];
    for (size_t i = 0; i + 1 < need; i++) {
        tokens[i] = p[i];
        targets[i] = p[i + 1];
    }
    d->pos[split] += need - 1;
    return LOOM_OK;
}

static void text_rewind(void *self, loom_split split) { ((text_data *)self)->pos[split] = 0; }

static int text_get_state(void *self, uint64_t *state)
{
    text_data *d = self;
    state[0] = d->pos[LOOM_SPLIT_TRAIN];
    state[1] = d->pos[LOOM_SPLIT_VAL];
    state[2] = d->size; /* checked on restore: the same file */
    state[3] = d->drawn;
    return 4;
}

static loom_status text_set_state(void *self, const uint64_t *state, int n)
{
    text_data *d = self;
    if (n != 4 || state[2] != d->size || state[0] > d->len[0] || state[1] > d->len[1])
        LOOM_FAIL(LOOM_ERR_CORRUPT, "text data position does not fit '%s' (%zu bytes): was it "
                  "saved from another file?", d->path, d->size);
    d->pos[LOOM_SPLIT_TRAIN] = state[0];
    d->pos[LOOM_SPLIT_VAL] = state[1];
    d->drawn = state[3];
    return LOOM_OK;
}

static size_t text_size(void *self, loom_split split) { return ((text_data *)self)->len[split]; }
static int text_vocab(void *self) { return 256; }

static const loom_data_ops text_ops = {
    "text", text_next, text_rewind, text_get_state, text_set_state, text_size, text_vocab, text_close,
};
