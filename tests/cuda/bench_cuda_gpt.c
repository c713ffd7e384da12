/* bench_cuda_gpt.c — GPT-2 124M (V 50257 padded to 50304, 12 layers, 12 heads, C 768) on the
 * CUDA backend, fp32: forward + backward of B x T tokens, timed after warm-up, as one JSON
 * line: tokens/s, ms per step, and MFU = tokens/s * (6N + 6LCT) / peak (the count;
 * N the parameters without the padding rows), against the H200's 989 TFLOP/s dense bf16
 * and 67 TFLOP/s fp32. No optimizer step: the optimizer plugins update host memory
 * (optim.h) and no device path exists yet, so this is the model's compute alone, and says
 * so in the output ("what"). Not a test: scripts/gpu-check runs it.
 *   bench_cuda_gpt [B [T [steps [backend]]]]      defaults 8 1024 10 cuda
 * Exit 77 where no GPU is visible.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/backend.h"
#include "bench_cuda_args.h"
#include "base/clock.h"
#include "base/status.h"
#include "model/gpt.h"

int main(int argc, char **argv)
{
    int B, T, steps;
    loom_backend be;
    const int rc = bench_cuda_args(argc, argv, 10, 1024, &B, &T, &steps, &be);
    if (rc)
        return rc;
    loom_gpt_config c = {.vocab = 50257, .vocab_padded = 50304, .ctx = 1024, .layers = 12,
                         .heads = 12, .dim = 768};
    loom_gpt *m = NULL;
    if (loom_gpt_create(&c, &be, B, 1, NULL, &m) != LOOM_OK) {
        fprintf(stderr, "model: %s\n", loom_last_error());
        return 1;
    }
    size_t R = (size_t)B * T;
    int *tok = malloc(R * sizeof(int)), *tgt = malloc(R * sizeof(int));
    for (size_t i = 0; i < R; i++) {
        tok[i] = (int)((i * 2654435761u) % 50257u);
        tgt[i] = (int)((i * 40503u + 7u) % 50257u);
    }
    double loss = 0, t0 = 0, first_loss = 0;
    for (int s = 0; s < steps + 2; s++) {
        if (s == 2) {
            be.ops->synchronize(be.self);
            t0 = loom_now_ms();
        }
        loom_gpt_zero_grad(m);
        if (loom_gpt_forward(m, tok, tgt, B, T, 1.0f / (float)R, &loss) != LOOM_OK ||
            loom_gpt_backward(m) != LOOM_OK) {
            fprintf(stderr, "step %d: %s\n", s, loom_last_error());
            return 1;
        }
        if (s == 0)
            first_loss = loss / (double)R;
    }
    be.ops->synchronize(be.self);
    double ms = (loom_now_ms() - t0) / steps;
    double N = (double)loom_gpt_num_params(m);
    double flops_tok = 6.0 * N + 6.0 * c.layers * c.dim * (double)T;
    double tps = (double)R / (ms / 1e3);
    printf("{\"impl\": \"loom\", \"what\": \"fwd+bwd fp32, no optimizer step\", \"backend\": \"%s\", "
           "\"B\": %d, \"T\": %d, \"params\": %.0f, \"ms_per_step\": %.3f, \"tokens_per_s\": %.1f, "
           "\"tflops\": %.2f, \"mfu_bf16_peak\": %.4f, \"mfu_fp32_peak\": %.4f, \"loss0\": %.4f}\n",
           be.ops->describe(be.self), B, T, N, ms, tps, tps * flops_tok / 1e12,
           tps * flops_tok / 989e12, tps * flops_tok / 67e12, first_loss);
    loom_gpt_destroy(m);
    loom_backend_close(&be);
    free(tok), free(tgt);
    return 0;
}
