/* test_llmc_model.c — llm.c model files (core/llmc_model.c).
 *
 * A v3 file saved from one random session and loaded into a differently seeded one gives
 * bitwise-identical parameters and logits. A v5 (bf16) file is written here, by the test's
 * own reading of llm.c's layout (grouped by type across layers), from a session's weights:
 * loading it must give exactly the bf16-rounded weights in every entry, which also checks
 * the block-to-entry mapping independently of loom's writer. Bad magic, version, size and
 * shape are refused with the exact messages. A pipeline stage (a model holding some
 * blocks) loads only its tensors from a whole model's file, bitwise, and knows which names
 * another stage holds (loom_gpt_held_elsewhere).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/llmc_model.h"
#include "model/gpt_stage.h"
#include "base/backend.h"
#include "base/plugin_loader.h"
#include "train/session.h"

static char dir[64];
static loom_plugin_config optim_cfg, precision_cfg;

static const loom_gpt_config tiny = {.vocab = 60, .vocab_padded = 64, .ctx = 8, .layers = 2,
                                     .heads = 2, .dim = 16};

static loom_session *make_session(const loom_gpt_config *mc, uint64_t seed)
{
    const loom_plugin *adamw, *fp32;
    ck_assert_msg(loom_plugin_load(LOOM_KIND_OPTIM, "adamw", &adamw) == LOOM_OK, "%s",
                  loom_last_error());
    ck_assert_msg(loom_plugin_load(LOOM_KIND_PRECISION, "fp32", &fp32) == LOOM_OK, "%s",
                  loom_last_error());
    ck_assert_int_eq(loom_config_init(&optim_cfg, adamw->desc), LOOM_OK);
    ck_assert_int_eq(loom_config_set_number(&optim_cfg, "lr", 1e-3), LOOM_OK);
    ck_assert_int_eq(loom_config_init(&precision_cfg, fp32->desc), LOOM_OK);
    loom_session_config cfg = {.model = *mc, .micro_batch = 2, .seq = mc->ctx, .accum = 1,
                               .seed = seed, .backend = "cpu", .threads = 1,
                               .optim = &optim_cfg, .precision = &precision_cfg};
    loom_session *s = NULL;
    ck_assert_msg(loom_session_create(&cfg, &s) == LOOM_OK, "%s", loom_last_error());
    return s;
}

static void path_of(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/loom-llmc-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* (B,T,Vp) logits for fixed tokens, copied out. */
static float *logits_of(loom_session *s, size_t *n)
{
    loom_gpt *m = loom_session_model(s);
    int tokens[16];
    for (int i = 0; i < 16; i++)
        tokens[i] = (i * 7 + 3) % tiny.vocab;
    ck_assert_int_eq(loom_gpt_forward(m, tokens, NULL, 2, 8, 0.0f, NULL), LOOM_OK);
    *n = (size_t)16 * tiny.vocab_padded;
    float *out = malloc(*n * sizeof(float));
    memcpy(out, loom_gpt_logits(m), *n * sizeof(float));
    return out;
}

START_TEST(test_v3_roundtrip_bitwise)
{
    char p[256];
    path_of(p, sizeof p, "model.bin");
    loom_session *a = make_session(&tiny, 1), *b = make_session(&tiny, 2);
    ck_assert_msg(loom_llmc_save(loom_session_model(a), p) == LOOM_OK, "%s", loom_last_error());
    loom_gpt_config c;
    ck_assert_int_eq(loom_llmc_read_config(p, &c), LOOM_OK);
    ck_assert_int_eq(memcmp(&c, &tiny, sizeof c), 0);

    size_t n;
    float *la = logits_of(a, &n), *lb = logits_of(b, &n);
    ck_assert_msg(memcmp(la, lb, n * sizeof(float)) != 0, "two seeds gave the same model");
    free(lb);
    ck_assert_msg(loom_llmc_load(loom_session_model(b), p) == LOOM_OK, "%s", loom_last_error());
    const loom_param_table *t = loom_gpt_params(loom_session_model(a));
    const float *pa = loom_gpt_param_data(loom_session_model(a));
    const float *pb = loom_gpt_param_data(loom_session_model(b));
    for (int i = 0; i < t->count; i++)
        ck_assert_msg(memcmp(pa + t->entries[i].offset, pb + t->entries[i].offset,
                             t->entries[i].numel * sizeof(float)) == 0,
                      "%s differs after the round trip", t->entries[i].name);
    lb = logits_of(b, &n);
    ck_assert_msg(memcmp(la, lb, n * sizeof(float)) == 0, "logits differ after the round trip");
    free(la);
    free(lb);
    /* the saved file is exactly header + params, no .tmp left behind */
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    ck_assert_int_ne(access(tmp, F_OK), 0);
    FILE *f = fopen(p, "rb");
    fseek(f, 0, SEEK_END);
    ck_assert_int_eq(ftell(f), 1024 + 4 * (long)loom_params_count(t));
    fclose(f);
    loom_session_destroy(a);
    loom_session_destroy(b);
}
END_TEST

static uint16_t bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* nearest, ties to even */
}

static float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Write m as llm.c lays it out: every tensor type for all layers, then the next type. */
static void write_llmc(loom_gpt *m, const char *path, int version, int32_t magic,
                       int32_t layers_in_header, long truncate_to)
{
    static const char *order[16] = {
        "wte", "wpe", "ln_1.weight", "ln_1.bias", "attn.qkv.weight", "attn.qkv.bias",
        "attn.proj.weight", "attn.proj.bias", "ln_2.weight", "ln_2.bias", "mlp.fc.weight",
        "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias", "ln_f.weight", "ln_f.bias"};
    const loom_gpt_config *c = loom_gpt_get_config(m);
    const loom_param_table *t = loom_gpt_params(m);
    const float *params = loom_gpt_param_data(m);
    FILE *f = fopen(path, "wb");
    int32_t h[256] = {magic, version, c->ctx, c->vocab, layers_in_header, c->heads, c->dim,
                      c->vocab_padded};
    fwrite(h, sizeof h, 1, f);
    for (int k = 0; k < 16; k++) {
        int per_layer = k >= 2 && k < 14;
        for (int l = 0; l < (per_layer ? c->layers : 1); l++) {
            char name[64];
            if (per_layer)
                snprintf(name, sizeof name, "h.%d.%s", l, order[k]);
            else
                snprintf(name, sizeof name, "%s", order[k]);
            const loom_param_entry *e = loom_params_find(t, name);
            ck_assert_ptr_nonnull(e);
            for (size_t i = 0; i < e->numel; i++) {
                float x = params[e->offset + i];
                if (version == 5) {
                    uint16_t b = bf16_round(x);
                    fwrite(&b, 2, 1, f);
                } else {
                    fwrite(&x, 4, 1, f);
                }
            }
        }
    }
    fclose(f);
    if (truncate_to >= 0)
        ck_assert_int_eq(truncate(path, truncate_to), 0);
}

START_TEST(test_v5_bf16_layout)
{
    char p[256];
    path_of(p, sizeof p, "model_bf16.bin");
    loom_session *a = make_session(&tiny, 3), *b = make_session(&tiny, 4);
    loom_gpt *ma = loom_session_model(a), *mb = loom_session_model(b);
    write_llmc(ma, p, 5, 20240326, tiny.layers, -1);
    ck_assert_msg(loom_llmc_load(mb, p) == LOOM_OK, "%s", loom_last_error());
    const loom_param_table *t = loom_gpt_params(ma);
    const float *pa = loom_gpt_param_data(ma), *pb = loom_gpt_param_data(mb);
    int rounded = 0;
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        for (size_t j = 0; j < e->numel; j++) {
            float want = bf16_value(bf16_round(pa[e->offset + j]));
            ck_assert_msg(memcmp(&pb[e->offset + j], &want, 4) == 0, "%s[%zu]: %.9g, want %.9g",
                          e->name, j, pb[e->offset + j], want);
            rounded += want != pa[e->offset + j];
        }
    }
    ck_assert_int_gt(rounded, 0); /* the random weights really were rounded */
    /* the test's own v3 writer and loom's loader agree too (exact copy) */
    write_llmc(ma, p, 3, 20240326, tiny.layers, -1);
    ck_assert_int_eq(loom_llmc_load(mb, p), LOOM_OK);
    ck_assert_int_eq(memcmp(pa, pb, t->total * sizeof(float)), 0);
    loom_session_destroy(a);
    loom_session_destroy(b);
}
END_TEST

static void expect_refusal(loom_gpt *m, const char *path, const char *want)
{
    loom_gpt_config c;
    const loom_param_table *t = loom_gpt_params(m);
    float *before = malloc(t->total * sizeof(float));
    memcpy(before, loom_gpt_param_data(m), t->total * sizeof(float));
    ck_assert_int_ne(loom_llmc_load(m, path), LOOM_OK);
    ck_assert_str_eq(loom_last_error(), want);
    ck_assert_msg(memcmp(before, loom_gpt_param_data(m), t->total * sizeof(float)) == 0,
                  "a refused file changed the model");
    free(before);
    if (!strstr(want, "the session's model")) {
        ck_assert_int_ne(loom_llmc_read_config(path, &c), LOOM_OK);
        ck_assert_str_eq(loom_last_error(), want);
    }
}

START_TEST(test_refusals)
{
    char p[256], want[512];
    loom_session *a = make_session(&tiny, 5);
    loom_gpt *m = loom_session_model(a);

    path_of(p, sizeof p, "magic.bin");
    write_llmc(m, p, 3, 20240520, tiny.layers, -1);
    snprintf(want, sizeof want, "llm.c model '%s' has magic 20240520 in header[0]; an llm.c "
             "model file has 20240326", p);
    expect_refusal(m, p, want);

    path_of(p, sizeof p, "v4.bin");
    write_llmc(m, p, 4, 20240326, tiny.layers, -1);
    snprintf(want, sizeof want, "llm.c model '%s' has version 4; loom reads versions 3 (fp32) "
             "and 5 (bf16)", p);
    expect_refusal(m, p, want);

    /* 2 layers of (V=60 Vp=64 T=8 C=16): 64*16 + 8*16 + 2*(12*16*16 + 13*16) + 2*16 = 7744 */
    path_of(p, sizeof p, "truncated.bin");
    write_llmc(m, p, 3, 20240326, tiny.layers, 1024 + 4 * 7744 - 4);
    snprintf(want, sizeof want, "llm.c model '%s' is truncated: %d bytes, but its header "
             "(version 3, 7744 fp32 parameters) needs %d", p, 1024 + 4 * 7744 - 4, 1024 + 4 * 7744);
    expect_refusal(m, p, want);

    path_of(p, sizeof p, "truncated5.bin");
    write_llmc(m, p, 5, 20240326, tiny.layers, 1000);
    snprintf(want, sizeof want, "llm.c model '%s' is 1000 bytes, shorter than its 1024-byte "
             "header", p);
    expect_refusal(m, p, want);

    /* a well-formed file of another shape: the field is named */
    path_of(p, sizeof p, "wide.bin");
    loom_gpt_config wide = tiny;
    wide.dim = 32;
    loom_session *w = make_session(&wide, 6);
    ck_assert_int_eq(loom_llmc_save(loom_session_model(w), p), LOOM_OK);
    loom_session_destroy(w);
    snprintf(want, sizeof want, "llm.c model '%s' has dim=32; the session's model has dim=16", p);
    expect_refusal(m, p, want);

    path_of(p, sizeof p, "missing.bin");
    ck_assert_int_ne(loom_llmc_read_config(p, &(loom_gpt_config){0}), LOOM_OK);
    snprintf(want, sizeof want, "cannot open llm.c model '%s': No such file or directory", p);
    ck_assert_str_eq(loom_last_error(), want);
    loom_session_destroy(a);
}
END_TEST

/* Three blocks cut into stages {0}, {1}, {2}: each stage's load of a whole model's file
 * gives exactly the whole model's bits in every entry it holds. */
START_TEST(test_pipeline_stages_load_their_part)
{
    const loom_gpt_config three = {.vocab = 60, .vocab_padded = 64, .ctx = 8, .layers = 3,
                                   .heads = 2, .dim = 16};
    char p[256], want[512];
    path_of(p, sizeof p, "model.bin");
    loom_session *a = make_session(&three, 1);
    ck_assert_msg(loom_llmc_save(loom_session_model(a), p) == LOOM_OK, "%s", loom_last_error());
    const loom_param_table *ta = loom_gpt_params(loom_session_model(a));
    const float *pa = loom_gpt_param_data(loom_session_model(a));
    loom_backend be;
    ck_assert_msg(loom_backend_open("cpu", 1, &be) == LOOM_OK, "%s", loom_last_error());
    for (int stage = 0; stage < 3; stage++) {
        unsigned char own[3] = {0, 0, 0};
        own[stage] = 1;
        loom_gpt_parallel par = {.stage_layers = own};
        loom_gpt *m = NULL;
        ck_assert_msg(loom_gpt_create(&three, &be, 2, 2, &par, &m) == LOOM_OK, "%s", loom_last_error());
        ck_assert_msg(loom_llmc_load(m, p) == LOOM_OK, "stage %d: %s", stage, loom_last_error());
        const loom_param_table *t = loom_gpt_params(m);
        const float *pm = loom_gpt_param_data(m);
        ck_assert_int_lt(t->count, ta->count);
        for (int i = 0; i < t->count; i++) {
            const loom_param_entry *e = &t->entries[i], *w = loom_params_find(ta, e->name);
            ck_assert_ptr_nonnull(w);
            ck_assert_msg(memcmp(pm + e->offset, pa + w->offset, e->numel * sizeof(float)) == 0,
                          "stage %d: %s differs from the whole model's", stage, e->name);
        }
        /* what another stage holds, and names no stage has */
        ck_assert_int_eq(loom_gpt_held_elsewhere(m, "wte"), stage == 1);
        ck_assert_int_eq(loom_gpt_held_elsewhere(m, "wpe"), stage != 0);
        ck_assert_int_eq(loom_gpt_held_elsewhere(m, "ln_f.bias"), stage != 2);
        ck_assert_int_eq(loom_gpt_held_elsewhere(m, "h.1.attn.qkv.weight"), stage != 1);
        ck_assert_int_eq(loom_gpt_held_elsewhere(m, "h.0.mlp.fc.bias"), stage != 0);
        ck_assert_int_eq(loom_gpt_held_elsewhere(m, "h.3.ln_1.weight"), 0);
        ck_assert_int_eq(loom_gpt_held_elsewhere(m, "h.0.ln_3.weight"), 0);
        ck_assert_int_eq(loom_gpt_held_elsewhere(m, "h.-1.ln_1.weight"), 0);
        ck_assert_int_eq(loom_gpt_held_elsewhere(m, "h.0"), 0);
        ck_assert_int_eq(loom_gpt_held_elsewhere(m, "lm_head"), 0);
        /* a stage cannot write the whole model's file */
        path_of(want, sizeof want, "stage.bin");
        ck_assert_int_eq(loom_llmc_save(m, want), LOOM_ERR_UNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(loom_last_error(), "from a pipeline stage"));
        loom_gpt_destroy(m);
    }
    /* the whole model holds everything: nothing is elsewhere */
    ck_assert_int_eq(loom_gpt_held_elsewhere(loom_session_model(a), "wte"), 0);
    ck_assert_int_eq(loom_gpt_held_elsewhere(loom_session_model(a), "h.9.ln_1.weight"), 0);
    loom_backend_close(&be);
    loom_session_destroy(a);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("llmc_model");
    TCase *tc = tcase_create("llmc");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_v3_roundtrip_bitwise);
    tcase_add_test(tc, test_v5_bf16_layout);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_pipeline_stages_load_their_part);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
