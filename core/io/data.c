/* data.c — the synthetic source and what all sources share (see data.h). */
#include "data.h"

#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"

void loom_data_close(loom_data *d)
{
    if (d->ops && d->self)
        d->ops->close(d->self);
    memset(d, 0, sizeof *d);
}

loom_status loom_data_batch(void *cursor, int *tokens, int *targets, int B, int T)
{
    loom_data_cursor *c = cursor;
    return c->data->ops->next(c->data->self, c->split, tokens, targets, B, T);
}

/* random: uniform tokens keyed by (seed, split, index), for benchmarks and tests. */
typedef struct synthetic {
    int vocab;
    uint64_t seed, drawn[2];
} synthetic;

static loom_status random_next(void *self, loom_split split, int *tokens, int *targets, int B, int T)
{
    synthetic *r = self;
    uint64_t stream = loom_rng_stream(split == LOOM_SPLIT_TRAIN ? "train" : "val");
    for (size_t i = 0; i < (size_t)B * T; i++) {
        uint64_t k = r->drawn[split]++;
        tokens[i] = (int)(loom_rng_uniform(r->seed, stream, 2 * k) * r->vocab) % r->vocab;
        targets[i] = (int)(loom_rng_uniform(r->seed, stream, 2 * k + 1) * r->vocab) % r->vocab;
    }
    return LOOM_OK;
}

static void random_rewind(void *self, loom_split split) { ((synthetic *)self)->drawn[split] = 0; }

static int random_get_state(void *self, uint64_t *state)
{
    synthetic *r = self;
    state[0] = r->drawn[0];
    state[1] = r->drawn[1];
    return 2;
}

static loom_status random_set_state(void *self, const uint64_t *state, int n)
{
    if (n != 2)
        LOOM_FAIL(LOOM_ERR_CORRUPT, "random data position needs 2 words, got %d", n);
    synthetic *r = self;
    r->drawn[0] = state[0];
    r->drawn[1] = state[1];
    return LOOM_OK;
}

static size_t random_size(void *self, loom_split split) { return 0; }
static int random_vocab(void *self) { return ((synthetic *)self)->vocab; }
static void random_close(void *self) { free(self); }

static const loom_data_ops random_ops = {
    "random", random_next, random_rewind, random_get_state, random_set_state,
    random_size, random_vocab, random_close,
};

loom_status loom_data_open_random(int vocab, uint64_t seed, loom_data *out)
{
    memset(out, 0, sizeof *out);
    if (vocab < 2)
        LOOM_FAIL(LOOM_ERR_INVALID, "random data vocab=%d must be at least 2", vocab);
    synthetic *r = calloc(1, sizeof *r);
    if (!r)
        LOOM_FAIL(LOOM_ERR_NOMEM, "out of memory");
    r->vocab = vocab;
    r->seed = seed;
    out->ops = &random_ops;
    out->self = r;
    return LOOM_OK;
}
