/* test_data_shards.c — llm.c token shards (core/data_shards.c).
 *
 * Unshuffled batches are compared with ref_*, a line-by-line transliteration of llm.c's
 * DataLoader (llmc/dataloader.h: load_shard_, reset, advance_, next_batch, load_batch) for
 * one process, reading with fseek/fread, across shard boundaries and the wrap to the first
 * shard. Bad headers must be refused with the exact messages. Shuffled reading must be
 * deterministic per seed, visit every sample of every shard once per epoch, and continue
 * exactly after get_state/set_state.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/data_shards.h"

static char dir[64];

static void path_of(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

/* Write a shard: header (magic, version, count) then ntok tokens tok(shard_id, i). */
static void write_shard_raw(const char *name, int32_t magic, int32_t version, int32_t count,
                            int ntok, int shard_id)
{
    char p[256];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    int32_t h[256] = {magic, version, count};
    fwrite(h, sizeof h, 1, f);
    for (int i = 0; i < ntok; i++) {
        uint16_t t = (uint16_t)(shard_id * 4096 + i); /* decodable: shard and position */
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
}

static void write_shard(const char *name, int ntok, int shard_id)
{
    write_shard_raw(name, 20240520, 1, ntok, ntok, shard_id);
}

/* --- llm.c's DataLoader, one process, unshuffled ------------------------------------- */
typedef struct ref_loader {
    char paths[8][256];
    int n;
    size_t B, T, shard_num_samples, current_shard_idx, current_sample_idx;
    FILE *tokens_file;
    uint16_t buffer[4096];
} ref_loader;

static void ref_load_shard(ref_loader *l, int shard_index)
{
    if (l->tokens_file)
        fclose(l->tokens_file);
    l->tokens_file = fopen(l->paths[shard_index], "rb");
    int header[256];
    ck_assert_int_eq(fread(header, sizeof(int), 256, l->tokens_file), 256);
    int64_t ntok = header[2];
    l->shard_num_samples = (ntok * sizeof(uint16_t) - sizeof(uint16_t)) /
                           (l->B * l->T * sizeof(uint16_t));
}

static void ref_reset(ref_loader *l)
{
    l->current_shard_idx = 0;
    l->current_sample_idx = 0;
    ref_load_shard(l, 0);
}

static void ref_advance(ref_loader *l)
{
    if (l->current_shard_idx == (size_t)l->n - 1) {
        ref_reset(l);
        return;
    }
    l->current_shard_idx = (l->current_shard_idx + 1) % (size_t)l->n;
    l->current_sample_idx = 0;
    ref_load_shard(l, (int)l->current_shard_idx);
}

static void ref_next_batch(ref_loader *l, int *inputs, int *targets)
{
    if (l->current_sample_idx >= l->shard_num_samples)
        ref_advance(l);
    size_t off = 1024 + l->current_sample_idx * l->B * l->T * sizeof(uint16_t);
    fseek(l->tokens_file, (long)off, SEEK_SET);
    ck_assert_uint_eq(fread(l->buffer, sizeof(uint16_t), l->B * l->T + 1, l->tokens_file),
                      l->B * l->T + 1);
    for (size_t i = 0; i < l->B * l->T; i++) {
        inputs[i] = l->buffer[i];
        targets[i] = l->buffer[i + 1];
    }
    l->current_sample_idx += 1;
}

/* ------------------------------------------------------------------------------------ */

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/loom-shards-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static void glob_of(char *out, size_t n, const char *pat) { path_of(out, n, pat); }

START_TEST(test_unshuffled_matches_llmc)
{
    /* sizes chosen so shards end mid-batch: 8-token batches, 50 = 6 batches + 2 left over,
     * 37 = 4 + 5, 64 = 7 + 8 (the +1 target token forbids an 8th) */
    write_shard("train_000002.bin", 64, 3);
    write_shard("train_000000.bin", 50, 1);
    write_shard("train_000001.bin", 37, 2);
    write_shard("val_000000.bin", 30, 9);
    char tg[256], vg[256];
    glob_of(tg, sizeof tg, "train_*.bin");
    glob_of(vg, sizeof vg, "val_*.bin");
    loom_data d;
    ck_assert_msg(loom_data_open_shards(tg, vg, 0, 0, &d) == LOOM_OK, "%s", loom_last_error());
    ck_assert_str_eq(d.ops->kind, "shards");
    ck_assert_uint_eq(d.ops->size(d.self, LOOM_SPLIT_TRAIN), 151);
    ck_assert_uint_eq(d.ops->size(d.self, LOOM_SPLIT_VAL), 30);
    ck_assert_int_eq(d.ops->vocab(d.self), 65536);

    ref_loader ref = {.n = 3, .B = 2, .T = 4};
    path_of(ref.paths[0], 256, "train_000000.bin");
    path_of(ref.paths[1], 256, "train_000001.bin");
    path_of(ref.paths[2], 256, "train_000002.bin");
    ref_reset(&ref);
    int a[8], at[8], b[8], bt[8];
    for (int step = 0; step < 2 * 17 + 3; step++) { /* 17 batches per pass: wraps twice */
        ck_assert_int_eq(d.ops->next(d.self, LOOM_SPLIT_TRAIN, a, at, 2, 4), LOOM_OK);
        ref_next_batch(&ref, b, bt);
        ck_assert_msg(memcmp(a, b, sizeof a) == 0 && memcmp(at, bt, sizeof at) == 0,
                      "step %d: batch differs from llm.c's loader (loom starts at %d, llm.c at %d)",
                      step, a[0], b[0]);
    }
    fclose(ref.tokens_file);

    /* val: its own glob, read in order; rewind starts it again */
    ck_assert_int_eq(d.ops->next(d.self, LOOM_SPLIT_VAL, a, at, 2, 4), LOOM_OK);
    ck_assert_int_eq(a[0], 9 * 4096);
    ck_assert_int_eq(at[7], 9 * 4096 + 8);
    ck_assert_int_eq(d.ops->next(d.self, LOOM_SPLIT_VAL, a, at, 2, 4), LOOM_OK);
    ck_assert_int_eq(a[0], 9 * 4096 + 8);
    d.ops->rewind(d.self, LOOM_SPLIT_VAL);
    ck_assert_int_eq(d.ops->next(d.self, LOOM_SPLIT_VAL, a, at, 2, 4), LOOM_OK);
    ck_assert_int_eq(a[0], 9 * 4096);

    /* resume: the position words restore the exact stream */
    uint64_t w[LOOM_DATA_STATE_MAX];
    int n = d.ops->get_state(d.self, w);
    loom_data e;
    ck_assert_int_eq(loom_data_open_shards(tg, vg, 0, 0, &e), LOOM_OK);
    ck_assert_int_eq(e.ops->set_state(e.self, w, n), LOOM_OK);
    for (int step = 0; step < 20; step++) {
        ck_assert_int_eq(d.ops->next(d.self, LOOM_SPLIT_TRAIN, a, at, 2, 4), LOOM_OK);
        ck_assert_int_eq(e.ops->next(e.self, LOOM_SPLIT_TRAIN, b, bt, 2, 4), LOOM_OK);
        ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
        ck_assert_int_eq(memcmp(at, bt, sizeof at), 0);
    }
    ck_assert_int_eq(d.ops->next(d.self, LOOM_SPLIT_VAL, a, at, 2, 4), LOOM_OK);
    ck_assert_int_eq(e.ops->next(e.self, LOOM_SPLIT_VAL, b, bt, 2, 4), LOOM_OK);
    ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    loom_data_close(&d);
    loom_data_close(&e);
}
END_TEST

static void expect_refusal(const char *train_glob, const char *val_glob, const char *want)
{
    loom_data d;
    ck_assert_int_ne(loom_data_open_shards(train_glob, val_glob, 0, 0, &d), LOOM_OK);
    ck_assert_str_eq(loom_last_error(), want);
    ck_assert_ptr_null(d.ops);
}

START_TEST(test_bad_headers)
{
    char p[256], want[512];
    write_shard("good.bin", 40, 0);
    char good[256];
    path_of(good, sizeof good, "good.bin");

    write_shard_raw("magic.bin", 20240326, 1, 40, 40, 0);
    path_of(p, sizeof p, "magic.bin");
    snprintf(want, sizeof want, "shard '%s' has magic 20240326 in header[0]; an llm.c token "
             "shard has 20240520", p);
    expect_refusal(p, NULL, want);

    write_shard_raw("version.bin", 20240520, 2, 40, 40, 0);
    path_of(p, sizeof p, "version.bin");
    snprintf(want, sizeof want, "shard '%s' has version 2 in header[1]; loom reads version 1", p);
    expect_refusal(good, p, want); /* the val split is checked as well */

    write_shard_raw("count.bin", 20240520, 1, 100, 90, 0);
    path_of(p, sizeof p, "count.bin");
    snprintf(want, sizeof want, "shard '%s' has token count 100 in header[2] (1224 bytes with "
             "the header), but the file is 1204 bytes", p);
    expect_refusal(p, NULL, want);

    write_shard_raw("zero.bin", 20240520, 1, 0, 0, 0);
    path_of(p, sizeof p, "zero.bin");
    snprintf(want, sizeof want, "shard '%s' has token count 0 in header[2]; a shard holds at "
             "least one token", p);
    expect_refusal(p, NULL, want);

    path_of(p, sizeof p, "short.bin");
    FILE *f = fopen(p, "wb");
    int32_t h[100] = {20240520, 1, 40};
    fwrite(h, sizeof h, 1, f);
    fclose(f);
    snprintf(want, sizeof want, "shard '%s' is 400 bytes, shorter than the 1024-byte header "
             "(256 int32)", p);
    expect_refusal(p, NULL, want);

    path_of(p, sizeof p, "nothing_*.bin");
    snprintf(want, sizeof want, "train shard glob '%s' matches no file", p);
    expect_refusal(p, NULL, want);
    snprintf(want, sizeof want, "val shard glob '%s' matches no file", p);
    expect_refusal(good, p, want);

    /* a shard smaller than one batch is refused at the first batch, naming it */
    loom_data d;
    ck_assert_int_eq(loom_data_open_shards(good, NULL, 0, 0, &d), LOOM_OK);
    int tok[64], tgt[64];
    ck_assert_int_ne(d.ops->next(d.self, LOOM_SPLIT_TRAIN, tok, tgt, 5, 8), LOOM_OK);
    snprintf(want, sizeof want, "shard '%s' holds 40 tokens; a batch of 5 x 8 needs 41 (every "
             "shard must hold one batch)", good);
    ck_assert_str_eq(loom_last_error(), want);
    ck_assert_int_ne(d.ops->next(d.self, LOOM_SPLIT_VAL, tok, tgt, 1, 8), LOOM_OK);
    ck_assert_str_eq(loom_last_error(), "these shards have no val split (give loom.data.shards "
                     "a val = GLOB)");
    loom_data_close(&d);
}
END_TEST

/* Read n train batches of (2,4) into out (8 ints each: the inputs). */
static void read_batches(loom_data *d, int n, int *out)
{
    int tgt[8];
    for (int i = 0; i < n; i++) {
        ck_assert_msg(d->ops->next(d->self, LOOM_SPLIT_TRAIN, out + 8 * i, tgt, 2, 4) == LOOM_OK,
                      "%s", loom_last_error());
        for (int k = 0; k < 8; k++) /* targets are the inputs shifted by one */
            ck_assert_int_eq(tgt[k], out[8 * i + k] + 1);
    }
}

START_TEST(test_shuffled)
{
    /* samples per shard: (ntok-1)/8 = 6, 4, 7, 3 -> 20 per epoch */
    write_shard("s_0.bin", 50, 0);
    write_shard("s_1.bin", 37, 1);
    write_shard("s_2.bin", 64, 2);
    write_shard("s_3.bin", 25, 3);
    char tg[256];
    glob_of(tg, sizeof tg, "s_*.bin");
    enum { EPOCH = 20, N = 3 * EPOCH + 5 };
    int x[N * 8], y[N * 8], z[N * 8];
    loom_data a, b, c;
    ck_assert_int_eq(loom_data_open_shards(tg, NULL, 1, 7, &a), LOOM_OK);
    ck_assert_int_eq(loom_data_open_shards(tg, NULL, 1, 7, &b), LOOM_OK);
    ck_assert_int_eq(loom_data_open_shards(tg, NULL, 1, 8, &c), LOOM_OK);
    read_batches(&a, N, x);
    read_batches(&b, N, y);
    read_batches(&c, N, z);
    ck_assert_msg(memcmp(x, y, sizeof x) == 0, "same seed, different batches");
    ck_assert_msg(memcmp(x, z, sizeof x) != 0, "seeds 7 and 8 gave the same order");

    /* each epoch visits every sample of every shard once, a shard's samples together, and
     * is not the unshuffled order */
    static const int samples[4] = {6, 4, 7, 3};
    int unshuffled[EPOCH], u = 0;
    for (int sh = 0; sh < 4; sh++)
        for (int k = 0; k < samples[sh]; k++)
            unshuffled[u++] = sh * 4096 + k * 8;
    for (int e = 0; e < 3; e++) {
        int seen[4][8] = {{0}}, left[4] = {0}, last = -1, same = 1;
        for (int i = 0; i < EPOCH; i++) {
            const int *batch = x + (e * EPOCH + i) * 8;
            int shard = batch[0] / 4096, pos = batch[0] % 4096;
            ck_assert_int_eq(pos % 8, 0);
            ck_assert_int_lt(pos / 8, samples[shard]);
            ck_assert_int_eq(seen[shard][pos / 8]++, 0);
            for (int k = 1; k < 8; k++)
                ck_assert_int_eq(batch[k], batch[0] + k);
            if (shard != last) {
                ck_assert_msg(!left[shard], "epoch %d came back to shard %d", e, shard);
                if (last >= 0)
                    left[last] = 1;
                last = shard;
            }
            same &= batch[0] == unshuffled[i];
        }
        ck_assert_msg(!same, "shuffle=true read epoch %d in file order", e);
    }

    /* resume mid-epoch (and mid-shard): the stream continues exactly */
    for (int stop = 0; stop < N - 1; stop += 7) {
        loom_data r, s;
        ck_assert_int_eq(loom_data_open_shards(tg, NULL, 1, 7, &r), LOOM_OK);
        read_batches(&r, stop, y);
        uint64_t w[LOOM_DATA_STATE_MAX];
        int n = r.ops->get_state(r.self, w);
        ck_assert_int_eq(loom_data_open_shards(tg, NULL, 1, 7, &s), LOOM_OK);
        ck_assert_int_eq(s.ops->set_state(s.self, w, n), LOOM_OK);
        read_batches(&s, N - stop, y + stop * 8);
        ck_assert_msg(memcmp(x, y, sizeof x) == 0, "resume after %d batches differs", stop);
        loom_data_close(&r);
        loom_data_close(&s);
    }

    /* a position from another seed, another shard set or of the wrong length is refused */
    uint64_t w[LOOM_DATA_STATE_MAX];
    int n = a.ops->get_state(a.self, w);
    ck_assert_int_ne(c.ops->set_state(c.self, w, n), LOOM_OK);
    ck_assert_str_eq(loom_last_error(), "shard data position was saved with shuffle=1 seed=7; "
                     "this source has shuffle=1 seed=8");
    ck_assert_int_ne(a.ops->set_state(a.self, w, n - 1), LOOM_OK);
    ck_assert_str_eq(loom_last_error(), "shard data position needs 8 words, got 7");
    loom_data other;
    char g2[256], want[512], first[256];
    glob_of(g2, sizeof g2, "s_[012].bin");
    ck_assert_int_eq(loom_data_open_shards(g2, NULL, 1, 7, &other), LOOM_OK);
    ck_assert_int_ne(other.ops->set_state(other.self, w, n), LOOM_OK);
    path_of(first, sizeof first, "s_0.bin");
    snprintf(want, sizeof want, "shard data position does not fit these shards (train '%s' and "
             "2 more): were they regenerated, or did the glob change?", first);
    ck_assert_str_eq(loom_last_error(), want);
    loom_data_close(&other);
    loom_data_close(&a);
    loom_data_close(&b);
    loom_data_close(&c);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("data_shards");
    TCase *tc = tcase_create("shards");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_unshuffled_matches_llmc);
    tcase_add_test(tc, test_bad_headers);
    tcase_add_test(tc, test_shuffled);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
