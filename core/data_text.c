/* data_text.c — byte-level text data (see data_text.h). */
#include "data_text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

struct loom_text_data {
    unsigned char *bytes;
    size_t size;
    size_t start[2], len[2], pos[2];
    char path[512];
};

loom_status loom_text_open(const char *path, double val_fraction, loom_text_data **out)
{
    *out = NULL;
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        LOOM_FAIL(LOOM_ERR_INVALID, "val_fraction=%g must be in [0, 1)", val_fraction);
    FILE *f = fopen(path, "rb");
    if (!f)
        LOOM_FAIL(LOOM_ERR_IO, "cannot open text data '%s': %s", path, strerror(errno));
    loom_text_data *d = calloc(1, sizeof *d);
    if (!d) {
        fclose(f);
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    }
    snprintf(d->path, sizeof d->path, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    d->bytes = n > 0 ? malloc((size_t)n) : NULL;
    if (n <= 0 || !d->bytes || fread(d->bytes, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        loom_text_close(d);
        LOOM_FAIL(LOOM_ERR_IO, "cannot read text data '%s' (%ld bytes)", path, n);
    }
    fclose(f);
    d->size = (size_t)n;
    size_t val = (size_t)((double)d->size * val_fraction);
    d->start[LOOM_SPLIT_TRAIN] = 0;
    d->len[LOOM_SPLIT_TRAIN] = d->size - val;
    d->start[LOOM_SPLIT_VAL] = d->size - val;
    d->len[LOOM_SPLIT_VAL] = val;
    *out = d;
    return LOOM_OK;
}

void loom_text_close(loom_text_data *d)
{
    if (!d)
        return;
    free(d->bytes);
    free(d);
}

size_t loom_text_size(const loom_text_data *d, loom_split split) { return d->len[split]; }
size_t loom_text_position(const loom_text_data *d, loom_split split) { return d->pos[split]; }

void loom_text_seek(loom_text_data *d, loom_split split, size_t position)
{
    d->pos[split] = d->len[split] ? position % d->len[split] : 0;
}

loom_status loom_text_next(loom_text_data *d, loom_split split, int *tokens, int *targets, int B,
                           int T)
{
    size_t need = (size_t)B * T + 1;
    if (d->len[split] < need)
        LOOM_FAIL(LOOM_ERR_INVALID, "%s split of '%s' has %zu tokens; a batch of %d x %d needs %zu",
                  split == LOOM_SPLIT_TRAIN ? "train" : "val", d->path, d->len[split], B, T, need);
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
