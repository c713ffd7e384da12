/* test_gpt_split.c — the split backward (gpt_backward_split.c: B, then W) against the
 * fused backward of one pipeline chunk, here the whole model (blocks 0..L-1 with the
 * embedding and the head), two micro-batches in two activation slots.
 *
 *   fast:       F0 F1 B0 B1 W0 W1 gives the gradients of F0 BWD0 F1 BWD1 bit for bit; after
 *               both B's every weight matrix's gradient is still zero (W really deferred)
 *               and the chunk input's gradient is the fused one's; a negative control
 *               (only W0) differs, so the comparison can fail.
 *   canonical:  each micro-batch's gradient on its own (zeroed before its W, as the engine's
 *               hooks do): B writes no parameter gradient at all, and W gives the fused
 *               micro-batch gradient's bits, also with the LM head's half taken in B
 *               (head_dw, the tied wte of a pipeline's last stage) and added after.
 *   errors:     B on a model created without split_backward is refused with a message.
 * Each of fast and canonical runs on five models (the loop index, shapes[]): GPT-2, the
 * llama family (RMSNorm, SwiGLU, RoPE, 4 query heads over 2 kv heads, untied head) with
 * B's d(qkv) over SwiGLU's input (ffn_dim 64), in its own buffer (ffn_dim 24: q|k|v wider
 * than gate|up), and with selective recomputation (W reruns SwiGLU), and GPT-2 with MoE
 * blocks (moe.h: the router's and experts' B and W).
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "base/status.h"
#include "model/gpt.h"
#include "model/gpt_stage.h"

enum { B_ = 2, T_ = 16, L_ = 3 };

static loom_backend be;

static const struct shape {
    int llama, ffn_dim, recompute, moe;
} shapes[] = {{0, 0, 0, 0}, {1, 64, 0, 0}, {1, 24, 0, 0}, {1, 64, LOOM_RECOMPUTE_SELECTIVE, 0},
              {0, 0, 0, 1}};
static struct shape shape; /* the loop's */

static loom_gpt *make(int canonical, int split)
{
    if (!be.ops)
        ck_assert_msg(loom_backend_open("cpu", 0, &be) == LOOM_OK, "%s", loom_last_error());
    loom_gpt_config c = {.vocab = 67, .ctx = T_, .layers = L_, .heads = 4, .dim = 32};
    if (shape.llama) {
        c.family = LOOM_FAMILY_LLAMA;
        c.kv_heads = 2;
        c.ffn_dim = shape.ffn_dim;
    }
    if (shape.moe) /* every block's MLP 4 experts, top-2, capacity 1 (moe.h): some dropped */
        c.moe = (loom_moe_config){.experts = 4, .top_k = 2, .every = 1, .capacity_factor = 1.0,
                                  .aux_loss = 0.01, .z_loss = 0.001};
    loom_gpt_parallel par = {NULL, NULL, canonical, NULL, 2, split, shape.recompute, NULL};
    loom_gpt *m;
    ck_assert_msg(loom_gpt_create(&c, &be, B_, 11, &par, &m) == LOOM_OK, "%s", loom_last_error());
    return m;
}

static void batch(int mb, int *tok, int *tgt)
{
    unsigned s = 1234u + 77u * (unsigned)mb;
    for (int i = 0; i < B_ * T_; i++) {
        s = s * 1664525u + 1013904223u;
        tok[i] = (int)((s >> 8) % 67u);
        tgt[i] = (int)((s >> 16) % 67u);
    }
}

static void forward(loom_gpt *m, int mb)
{
    int tok[B_ * T_], tgt[B_ * T_];
    double loss = 0.0;
    batch(mb, tok, tgt);
    loom_gpt_stage_select(m, mb);
    ck_assert_msg(loom_gpt_stage_forward(m, 0, L_, tok, tgt, B_, T_, 1.0f / (B_ * T_), &loss) ==
                  LOOM_OK, "%s", loom_last_error());
}

static size_t total(loom_gpt *m) { return loom_gpt_params(m)->total; }
static const float *grads(loom_gpt *m) { return loom_gpt_grad_data(m); }

static int same(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

/* The LM head's entry (GPT-2's is wte). */
static const char *head_name(void) { return shape.llama ? "lm_head.weight" : "wte"; }

/* Is every matrix weight's gradient (h.*.weight of the linears, the head) zero? */
static int weight_grads_zero(loom_gpt *m)
{
    const loom_param_table *t = loom_gpt_params(m);
    for (int i = 0; i < t->count; i++) {
        const loom_param_entry *e = &t->entries[i];
        if (!strstr(e->name, "attn.") && !strstr(e->name, "mlp.") && strcmp(e->name, head_name()))
            continue;
        for (size_t j = 0; j < e->numel; j++)
            if (grads(m)[e->offset + j] != 0.0f)
                return 0;
    }
    return 1;
}

static int all_zero(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f)
            return 0;
    return 1;
}

START_TEST(fast)
{
    shape = shapes[_i];
    loom_gpt *f = make(0, 0), *s = make(0, 1);
    size_t n = total(f), rows = (size_t)B_ * T_ * 32;
    ck_assert_uint_eq(n, total(s));
    float *din = malloc(rows * sizeof(float));
    loom_gpt_zero_grad(f);
    for (int mb = 0; mb < 2; mb++) {
        forward(f, mb);
        ck_assert_int_eq(loom_gpt_stage_backward(f, 0, L_), LOOM_OK);
        if (mb == 1) /* the fused backward leaves the embedding's input gradient in grad() */
            memcpy(din, loom_gpt_stage_grad(f), rows * sizeof(float));
    }
    loom_gpt_zero_grad(s);
    forward(s, 0);
    forward(s, 1);
    for (int mb = 0; mb < 2; mb++) {
        loom_gpt_stage_select(s, mb);
        ck_assert_msg(loom_gpt_stage_backward_input(s, 0, L_, NULL) == LOOM_OK, "%s",
                      loom_last_error());
    }
    ck_assert_msg(weight_grads_zero(s), "B computed a weight gradient");
    ck_assert_msg(!all_zero(grads(s), n), "B computed no layer-norm gradient in fast mode");
    ck_assert_msg(same(din, loom_gpt_stage_grad_out(s), rows), "B's input gradient differs");
    loom_gpt_stage_select(s, 0);
    ck_assert_int_eq(loom_gpt_stage_backward_weight(s, 0, L_, 0), LOOM_OK);
    ck_assert_msg(!same(grads(f), grads(s), n), "negative control: one W of two matched");
    loom_gpt_stage_select(s, 1);
    ck_assert_int_eq(loom_gpt_stage_backward_weight(s, 0, L_, 0), LOOM_OK);
    ck_assert_msg(same(grads(f), grads(s), n), "B then W differs from the fused backward");
    free(din);
    loom_gpt_destroy(f);
    loom_gpt_destroy(s);
}
END_TEST

START_TEST(canonical)
{
    shape = shapes[_i];
    loom_gpt *f = make(1, 0), *s = make(1, 1);
    size_t n = total(f);
    const loom_param_entry *wte = loom_params_find(loom_gpt_params(s), head_name());
    ck_assert_ptr_nonnull(wte);
    float *want[2], *head = malloc(wte->numel * sizeof(float));
    for (int mb = 0; mb < 2; mb++) { /* one micro-batch's gradient on its own, fused */
        loom_gpt_zero_grad(f);
        forward(f, mb);
        ck_assert_int_eq(loom_gpt_stage_backward(f, 0, L_), LOOM_OK);
        want[mb] = malloc(n * sizeof(float));
        memcpy(want[mb], grads(f), n * sizeof(float));
    }
    for (int with_head = 0; with_head < 2; with_head++) {
        loom_gpt_zero_grad(s);
        forward(s, 0);
        forward(s, 1);
        loom_gpt_stage_select(s, 0);
        ck_assert_int_eq(loom_gpt_stage_backward_input(s, 0, L_, NULL), LOOM_OK);
        loom_gpt_stage_select(s, 1);
        ck_assert_int_eq(loom_gpt_stage_backward_input(s, 0, L_, with_head ? head : NULL), LOOM_OK);
        ck_assert_msg(all_zero(grads(s), n), "canonical B wrote a parameter gradient");
        for (int mb = 0; mb < 2; mb++) {
            loom_gpt_zero_grad(s);
            loom_gpt_stage_select(s, mb);
            int h = with_head && mb == 1;
            ck_assert_int_eq(loom_gpt_stage_backward_weight(s, 0, L_, h), LOOM_OK);
            float *g = loom_gpt_grad_data(s) + wte->offset;
            for (size_t j = 0; h && j < wte->numel; j++) /* the head's half, added after */
                g[j] += head[j];
            ck_assert_msg(same(want[mb], grads(s), n), "canonical micro-batch %d (head in B: %d) "
                          "differs from the fused backward", mb, h);
        }
    }
    ck_assert_msg(!same(want[0], want[1], n), "negative control: two micro-batches alike");
    free(want[0]);
    free(want[1]);
    free(head);
    loom_gpt_destroy(f);
    loom_gpt_destroy(s);
    be.ops->set_deterministic(be.self, 0);
}
END_TEST

START_TEST(refused)
{
    shape = shapes[0];
    loom_gpt *f = make(0, 0);
    forward(f, 0);
    ck_assert_int_eq(loom_gpt_stage_backward_input(f, 0, L_, NULL), LOOM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(loom_last_error(), "split_backward"));
    ck_assert_int_eq(loom_gpt_stage_backward_weight(f, 0, L_, 0), LOOM_ERR_INVALID);
    loom_gpt_destroy(f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gpt_split");
    TCase *tc = tcase_create("core");
    int n = (int)(sizeof shapes / sizeof shapes[0]);
    tcase_add_loop_test(tc, fast, 0, n);
    tcase_add_loop_test(tc, canonical, 0, n);
    tcase_add_test(tc, refused);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
