/* gpt_cost.c — FLOPs per token by part (gpt_cost.h). */
#include "gpt_cost.h"

/* Forward FLOPs per token of block l's MLP: dense (GPT-2 fc + proj, or llama's SwiGLU
 * gate, up and down) or MoE (top_k experts' MLPs and the router). */
static double mlp_fwd(const loom_gpt_config *cfg, int l)
{
    double C = cfg->dim;
    if (cfg->family == LOOM_FAMILY_LLAMA) {
        double F = cfg->ffn_dim > 0 ? cfg->ffn_dim : 4.0 * C;
        return 3.0 * 2.0 * C * F;
    }
    double dense = 2.0 * 2.0 * C * 4.0 * C;
    const loom_moe_config *moe = &cfg->moe;
    if (moe->experts > 0 && moe->every > 0 && (l + 1) % moe->every == 0)
        return moe->top_k * dense + 2.0 * C * moe->experts;
    return dense;
}

void loom_gpt_layer_costs(const loom_gpt_config *cfg, int seq, const unsigned char *recompute,
                          double *layer, double *embed, double *head)
{
    double C = cfg->dim, T = seq > 0 ? seq : cfg->ctx;
    double Vp = cfg->vocab_padded > 0 ? cfg->vocab_padded : (double)((cfg->vocab + 127) / 128 * 128);
    double attn_proj; /* q, k, v and the output projection */
    if (cfg->family == LOOM_FAMILY_LLAMA) {
        int kvh = cfg->kv_heads > 0 ? cfg->kv_heads : cfg->heads;
        double kvd = cfg->heads > 0 ? C * kvh / cfg->heads : C;
        attn_proj = 2.0 * (2.0 * C * C + 2.0 * C * kvd);
    } else {
        attn_proj = 2.0 * 4.0 * C * C;
    }
    double scores = 4.0 * T * C; /* QK^T and AV: 2 x T x C multiply-adds per token */
    for (int l = 0; l < cfg->layers; l++) {
        double fwd = attn_proj + scores + mlp_fwd(cfg, l);
        layer[l] = 3.0 * fwd + (recompute && recompute[l] ? fwd : 0.0);
    }
    *embed = 2.0 * C + 2.0 * C;    /* lookup + position add; their gradients' scatter-add */
    *head = 3.0 * 2.0 * C * Vp;    /* the logits GEMM, forward and backward */
}
