/* test_kv_cache.c — generation with the key/value cache (core/model/gpt_decode.c) against
 * the full recompute it replaces.
 *
 *   logits:  prefill a prompt, then decode token after token; every logits row must have
 *            the bits a full forward over the same tokens gives its last row (the backend's
 *            row-stable products, as sampling runs, for a fast and a canonical model, and
 *            the canonical GEMM; past attention's 64-row blocks, a width whose rows are not
 *            64-byte aligned; the llama family too). A negative control decodes a different token and expects
 *            other bits, so the comparison can fail.
 *   tokens:  loom_session_generate with and without the cache: the same tokens, with the
 *            window sliding past ctx, with top-k, and with the window shifting past ctx.
 *   speed:   500 tokens from a one-token prompt, one thread; the cached path must be at least 3x
 *            faster (measured on an idle 2-core machine: see docs/BENCHMARKS.md; 3x leaves
 *            room for a loaded one).
 *   errors:  decode refuses a position that is not the cached length, ctx, a bad token.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "base/clock.h"
#include "base/plugin_loader.h"
#include "model/gpt.h"
#include "train/session.h"

static loom_backend be;

static void open_backend(void)
{
    if (!be.ops)
        ck_assert_msg(loom_backend_open("cpu", 0, &be) == LOOM_OK, "%s", loom_last_error());
}

static void fill_tokens(int *t, int n, int V, unsigned seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int)((seed >> 8) % (unsigned)V);
    }
}

static int llama; /* 1: check_rows builds the llama family (kv_heads = heads / 2, RoPE) */

/* Decode N tokens after a P-token prompt; compare each logits row with a full forward. */
static void check_rows(int canonical, int mode, int dim, int heads, int ctx, int P, int N)
{
    open_backend();
    loom_gpt_config c = {.vocab = 67, .ctx = ctx, .layers = 2, .heads = heads, .dim = dim};
    if (llama) {
        c.family = LOOM_FAMILY_LLAMA;
        c.kv_heads = heads / 2;
        c.ffn_dim = 48;
    }
    loom_gpt_parallel par = {NULL, NULL, canonical, NULL, 0, 0, 0, NULL};
    loom_gpt *m;
    ck_assert_msg(loom_gpt_create(&c, &be, 1, 7, &par, &m) == LOOM_OK, "%s", loom_last_error());
    be.ops->set_deterministic(be.self, mode);
    int Vp = loom_gpt_get_config(m)->vocab_padded;
    int *tok = malloc((size_t)N * sizeof(int));
    float *cached = malloc((size_t)N * Vp * sizeof(float)), *full = malloc((size_t)Vp * sizeof(float));
    fill_tokens(tok, N, c.vocab, 99u + (unsigned)dim);
    ck_assert_int_eq(loom_gpt_forward(m, tok, NULL, 1, P, 0.0f, NULL), LOOM_OK);
    ck_assert_int_eq(loom_gpt_cached_rows(m), P);
    ck_assert_int_eq(loom_gpt_logits_row(m, (size_t)P - 1, cached + (size_t)(P - 1) * Vp), LOOM_OK);
    for (int t = P; t < N; t++) {
        ck_assert_msg(loom_gpt_decode(m, tok[t], t) == LOOM_OK, "%s", loom_last_error());
        ck_assert_int_eq(loom_gpt_logits_row(m, (size_t)t, cached + (size_t)t * Vp), LOOM_OK);
    }
    for (int t = P - 1; t < N; t++) {
        ck_assert_int_eq(loom_gpt_forward(m, tok, NULL, 1, t + 1, 0.0f, NULL), LOOM_OK);
        ck_assert_int_eq(loom_gpt_logits_row(m, (size_t)t, full), LOOM_OK);
        int differ = memcmp(full, cached + (size_t)t * Vp, (size_t)Vp * sizeof(float)) != 0;
        ck_assert_msg(!differ, "canonical=%d mode=%d dim=%d: logits row %d differ (cached %a, "
                      "full %a)", canonical, mode, dim, t, (double)cached[(size_t)t * Vp], (double)full[0]);
    }
    /* negative control: the row of another token at position N-1 has other bits */
    ck_assert_int_eq(loom_gpt_forward(m, tok, NULL, 1, N - 1, 0.0f, NULL), LOOM_OK);
    ck_assert_int_eq(loom_gpt_decode(m, (tok[N - 1] + 1) % c.vocab, N - 1), LOOM_OK);
    ck_assert_int_eq(loom_gpt_logits_row(m, (size_t)N - 1, full), LOOM_OK);
    ck_assert(memcmp(full, cached + (size_t)(N - 1) * Vp, (size_t)Vp * sizeof(float)) != 0);
    be.ops->set_deterministic(be.self, 0);
    free(tok);
    free(cached);
    free(full);
    loom_gpt_destroy(m);
}

/* set_deterministic mode 2 (row-stable products), as sampling runs */
START_TEST(logits_fast)
{
    check_rows(0, 2, 36, 3, 160, 5, 150); /* rows of 36 floats: most rows not 64-byte aligned */
}
END_TEST

START_TEST(logits_canonical)
{
    check_rows(1, 2, 48, 4, 160, 70, 140); /* a prompt longer than one attention block */
}
END_TEST

/* mode 1 (canonical GEMM) is row-independent too: what a backend without mode 2 gives */
START_TEST(logits_canonical_gemm)
{
    check_rows(0, 1, 24, 2, 80, 3, 72);
}
END_TEST

/* the llama family: RoPE at the decoded position, grouped-query attention's decode */
START_TEST(logits_llama)
{
    llama = 1;
    check_rows(0, 2, 32, 4, 80, 3, 72);
    check_rows(1, 2, 32, 4, 80, 66, 70);
    llama = 0;
}
END_TEST

START_TEST(decode_errors)
{
    open_backend();
    loom_gpt_config c = {.vocab = 50, .ctx = 8, .layers = 1, .heads = 2, .dim = 16};
    loom_gpt *m;
    ck_assert_int_eq(loom_gpt_create(&c, &be, 2, 1, NULL, &m), LOOM_OK);
    int tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ck_assert_int_eq(loom_gpt_decode(m, 1, 1), LOOM_ERR_INVALID); /* nothing cached */
    ck_assert_int_eq(loom_gpt_forward(m, tok, NULL, 2, 4, 0.0f, NULL), LOOM_OK);
    ck_assert_int_eq(loom_gpt_cached_rows(m), 0); /* B = 2 keeps no cache */
    ck_assert_int_eq(loom_gpt_forward(m, tok, NULL, 1, 4, 0.0f, NULL), LOOM_OK);
    ck_assert_int_eq(loom_gpt_decode(m, 1, 3), LOOM_ERR_INVALID);
    ck_assert_int_eq(loom_gpt_decode(m, 50, 4), LOOM_ERR_INVALID);
    ck_assert(strstr(loom_last_error(), "vocabulary") != NULL);
    for (int t = 4; t < 8; t++)
        ck_assert_int_eq(loom_gpt_decode(m, tok[t], t), LOOM_OK);
    ck_assert_int_eq(loom_gpt_decode(m, 1, 8), LOOM_ERR_INVALID);
    ck_assert(strstr(loom_last_error(), "ctx") != NULL);
    loom_gpt_destroy(m);
}
END_TEST

static loom_plugin_config optim_cfg, precision_cfg;

static loom_session *make_session(int vocab, int ctx, int layers, int heads, int dim)
{
    const loom_plugin *sgd, *fp32;
    ck_assert_msg(loom_plugin_load(LOOM_KIND_OPTIM, "sgd", &sgd) == LOOM_OK, "%s",
                  loom_last_error());
    ck_assert_msg(loom_plugin_load(LOOM_KIND_PRECISION, "fp32", &fp32) == LOOM_OK, "%s",
                  loom_last_error());
    ck_assert_int_eq(loom_config_init(&optim_cfg, sgd->desc), LOOM_OK);
    ck_assert_int_eq(loom_config_set_number(&optim_cfg, "lr", 0.1), LOOM_OK);
    ck_assert_int_eq(loom_config_init(&precision_cfg, fp32->desc), LOOM_OK);
    loom_session_config cfg = {
        .model = {vocab, 0, ctx, layers, heads, dim}, .micro_batch = 1, .seq = 1, .accum = 1,
        .seed = 3, .backend = "cpu", .threads = 1, .optim = &optim_cfg, .precision = &precision_cfg};
    loom_session *s = NULL;
    ck_assert_msg(loom_session_create(&cfg, &s) == LOOM_OK, "%s", loom_last_error());
    return s;
}

static int shift; /* generate's window mode */

static double generate(loom_session *s, int no_cache, int top_k, const int *prompt, int P, int N,
                       int *out)
{
    loom_sample_config c = {.temperature = 1.0f, .top_k = top_k, .seed = 5, .no_cache = no_cache,
                            .shift_window = shift};
    double t0 = loom_now_ms();
    ck_assert_msg(loom_session_generate(s, &c, prompt, P, N, out) == LOOM_OK, "%s",
                  loom_last_error());
    return loom_now_ms() - t0;
}

START_TEST(tokens_equal)
{
    loom_session *s = make_session(256, 64, 2, 4, 32);
    int prompt[10] = {72, 101, 108, 108, 111, 32, 119, 111, 114, 108};
    int a[110], b[110];
    for (int top_k = 0; top_k <= 20; top_k += 20) {
        generate(s, 0, top_k, prompt, 10, 100, a); /* slides past ctx = 64 */
        generate(s, 1, top_k, prompt, 10, 100, b);
        for (int i = 0; i < 110; i++)
            ck_assert_msg(a[i] == b[i], "top_k=%d: token %d is %d with the cache, %d without",
                          top_k, i, a[i], b[i]);
    }
    loom_session_destroy(s);
}
END_TEST

/* window shift past ctx: the cache restarts at the last ctx/2 tokens; the same tokens as
 * recomputing the shifted windows, and another sample than sliding */
START_TEST(tokens_equal_shift)
{
    loom_session *s = make_session(256, 64, 2, 4, 32);
    int prompt[70], a[270], b[270], slide[270];
    for (int i = 0; i < 70; i++)
        prompt[i] = (i * 37 + 5) % 256;
    for (int P = 10; P <= 70; P += 60) { /* a prompt inside ctx, and one longer than it */
        shift = 0;
        generate(s, 0, 0, prompt, P, 200, slide);
        shift = 1;
        generate(s, 0, 0, prompt, P, 200, a);
        generate(s, 1, 0, prompt, P, 200, b);
        shift = 0;
        for (int i = 0; i < P + 200; i++)
            ck_assert_msg(a[i] == b[i], "P=%d: token %d is %d with the cache, %d without", P, i,
                          a[i], b[i]);
        ck_assert(memcmp(a, slide, sizeof(int) * (size_t)(P + 200)) != 0);
    }
    loom_session_destroy(s);
}
END_TEST

START_TEST(speed)
{
    /* a small byte-level model (1 layer, dim 32, ctx 512) on one thread: OpenMP's
     * barriers on a loaded machine would time the scheduler, not the cache */
    loom_session *s = make_session(256, 512, 1, 2, 32);
    int prompt[1] = {10}, *a = malloc(501 * sizeof(int)), *b = malloc(501 * sizeof(int));
    generate(s, 0, 0, prompt, 1, 20, a); /* warm up: pack buffers, threads */
    double cached = generate(s, 0, 0, prompt, 1, 500, a);
    double full = generate(s, 1, 0, prompt, 1, 500, b);
    ck_assert(memcmp(a, b, 501 * sizeof(int)) == 0);
    printf("500 tokens: %.0f ms with the cache, %.0f ms without (%.1fx)\n", cached, full,
           full / cached);
    ck_assert_msg(full >= 3.0 * cached, "the cache is only %.1fx faster (%.0f vs %.0f ms)",
                  full / cached, cached, full);
    free(a);
    free(b);
    loom_session_destroy(s);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("kv_cache");
    TCase *tc = tcase_create("kv_cache");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, logits_fast);
    tcase_add_test(tc, logits_canonical);
    tcase_add_test(tc, logits_canonical_gemm);
    tcase_add_test(tc, logits_llama);
    tcase_add_test(tc, decode_errors);
    tcase_add_test(tc, tokens_equal);
    tcase_add_test(tc, tokens_equal_shift);
    tcase_add_test(tc, speed);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
