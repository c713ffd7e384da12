/* data.h — data sources: where training and validation batches come from.
 *
 * A source has a train and a val split and hands out (B,T) batches of tokens with their
 * targets. Its reading position is a few opaque 64-bit words (get_state/set_state) so a
 * checkpoint can restore it exactly. Sources: text (data_text.c), synthetic tokens
 * (data.c) and llm.c token shards (data_shards.c).
 */
#ifndef LOOM_CORE_DATA_H
#define LOOM_CORE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "loom/loom.h"

typedef enum loom_split { LOOM_SPLIT_TRAIN = 0, LOOM_SPLIT_VAL = 1 } loom_split;

#define LOOM_DATA_STATE_MAX 16

typedef struct loom_data_ops {
    const char *kind;  /* "text", "random", ... */
    /* Next (B,T) batch of split into host arrays tokens and targets (B*T each). */
    loom_status (*next)(void *self, loom_split split, int *tokens, int *targets, int B, int T);
    /* Back to the start of a split (evaluation always reads the same val batches). */
    void (*rewind)(void *self, loom_split split);
    /* The reading position as at most LOOM_DATA_STATE_MAX words; returns the count. */
    int (*get_state)(void *self, uint64_t *state);
    loom_status (*set_state)(void *self, const uint64_t *state, int n);
    /* Tokens in a split (0: unbounded). */
    size_t (*size)(void *self, loom_split split);
    /* Tokens are in [0, vocab). */
    int (*vocab)(void *self);
    void (*close)(void *self);
} loom_data_ops;

typedef struct loom_data {
    const loom_data_ops *ops;
    void *self;
} loom_data;

/* shuffle: train sequences are windows at random offsets keyed by (seed, window index). */
loom_status loom_data_open_text(const char *path, double val_fraction, int shuffle, uint64_t seed,
                                loom_data *out);
loom_status loom_data_open_random(int vocab, uint64_t seed, loom_data *out);
void loom_data_close(loom_data *d);

/* A loom_batch_fn (session.h) over a source; ctx is a loom_data_cursor. */
typedef struct loom_data_cursor {
    loom_data *data;
    loom_split split;
} loom_data_cursor;
loom_status loom_data_batch(void *cursor, int *tokens, int *targets, int B, int T);

#endif
