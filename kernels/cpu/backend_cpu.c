/* backend_cpu.c — the plugin loom-backend-cpu.so: the CPU kernels behind the
 * loom_backend_ops table (include/loom/plugin/backend.h).
 *
 * "Device" memory is host memory: alloc is 64-byte aligned and zeroed, copies are memcpy,
 * synchronize has nothing to wait for. create() reads the one config key (threads; 0 means
 * all cores, or OMP_NUM_THREADS where set), loads and checks the GEMM library
 * (loom_cpu_blas_init) and keeps its description for the start-up banner. The kernels are
 * the loom_cpu_* functions themselves: parameter gradients accumulate, input gradients
 * overwrite, as the ops table's contract says. set_deterministic switches the process-wide
 * canonical GEMM mode (blas.c: loom_cpu_set_deterministic), which also serves mode 2
 * (row-stable, for generation with a key/value cache).
 *
 * Only loom_plugin_entry is exported (-fvisibility=hidden on everything else, the kernel
 * library included). loom_plugin_entry returns the static descriptor and does nothing else.
 */
#include "cpu_kernels.h"
#include "loom/plugin/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cpu_backend {
    const loom_host *host;
    char desc[400];
} cpu_backend;

static loom_status cpu_create(const loom_host *host, const loom_config *cfg, void **self)
{
    *self = NULL;
    int threads = 0;
    if (cfg && cfg->count > 0 && cfg->values)
        threads = (int)cfg->values[0].number;
    if (threads < 0)
        return host->fail(LOOM_ERR_INVALID,
                          "backend cpu: threads = %d; use 0 (all cores) or a positive count",
                          threads);
    cpu_backend *b = calloc(1, sizeof *b);
    if (!b)
        return host->fail(LOOM_ERR_NOMEM, "backend cpu: out of memory");
    b->host = host;
    char blas[sizeof b->desc - 8];
    if (loom_cpu_isa_init(blas, sizeof blas) != 0) { /* LOOM_CPU_ISA refused */
        free(b);
        return host->fail(LOOM_ERR_INVALID, "backend cpu: %s", blas);
    }
    if (loom_cpu_blas_init(threads, blas, sizeof blas) != 0) {
        loom_status st = host->fail(LOOM_ERR_INTERNAL, "backend cpu: GEMM check failed: %s", blas);
        free(b);
        return st;
    }
    snprintf(b->desc, sizeof b->desc, "cpu: %s", blas);
    *self = b;
    return LOOM_OK;
}

static void cpu_destroy(void *self)
{
    free(self); /* OpenBLAS stays loaded: plugins and their libraries are never unloaded */
}

static const char *cpu_describe(void *self)
{
    return self ? ((cpu_backend *)self)->desc : "cpu";
}

static void *cpu_alloc(void *self, size_t bytes)
{
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0)
        return NULL;
    memset(p, 0, rounded ? rounded : 64);
    return p;
}

static void cpu_free(void *self, void *p)
{
    free(p);
}

static void cpu_copy(void *self, void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

static void cpu_zero(void *self, void *p, size_t bytes)
{
    memset(p, 0, bytes);
}

static void cpu_synchronize(void *self)
{
}

/* Modes 1 (canonical) and 2 (row-stable, generation with a key/value cache) are one mode
 * here: gemm.c's order of operations already makes every element depend only on K and
 * the data (never on M, N, the blocking or the thread count), so a one-row product gives
 * the bits of that row in a larger one. */
static void cpu_set_deterministic(void *self, int on)
{
    (void)self;
    loom_cpu_set_deterministic(on != 0);
}

/* Host memory: no stream to hand a communicator. */
static void *cpu_stream(void *self)
{
    return NULL;
}

/* Mixed precision: bf16 or fp16 (the core asks only for those two). */
static void cpu_convert_from_f32(void *dst, const float *src, size_t n, loom_dtype dt)
{
    (dt == LOOM_DTYPE_F16 ? loom_cpu_f32_to_f16 : loom_cpu_f32_to_bf16)(dst, src, n);
}

static void cpu_convert_to_f32(float *dst, const void *src, size_t n, loom_dtype dt)
{
    (dt == LOOM_DTYPE_F16 ? loom_cpu_f16_to_f32_n : loom_cpu_bf16_to_f32_n)(dst, src, n);
}

static void cpu_round_to(float *dst, const float *src, size_t n, loom_dtype dt)
{
    (dt == LOOM_DTYPE_F16 ? loom_cpu_round_f16 : loom_cpu_round_bf16)(dst, src, n);
}

/* backend.h's 16-bit product: bf16 through gemm_bf16.c (fast mode, AVX512_BF16), fp16 as
 * matmul_forward (the CPU has no fp16 dot product loom uses). */
static void cpu_matmul_forward_dt(float *out, const float *inp, const float *weight,
                                  const float *bias, int B, int T, int C, int OC, loom_dtype dt)
{
    if (dt == LOOM_DTYPE_BF16)
        loom_cpu_matmul_forward_bf16(out, inp, weight, bias, B, T, C, OC);
    else
        loom_cpu_matmul_forward(out, inp, weight, bias, B, T, C, OC);
}

/* backend.h's gemm_w16: bf16 in fast mode where the CPU has AVX512_BF16 (gemm_bf16.c). */
static int cpu_gemm_w16(int M, int N, int K, const float *A, int lda, const void *W, int ldw,
                        float *C, int ldc, loom_dtype dt)
{
    if (dt != LOOM_DTYPE_BF16 || loom_cpu_deterministic())
        return -1;
    return loom_cpu_gemm_bf16(M, N, K, A, lda, W, ldw, C, ldc);
}

/* backend.h's matmul_backward_dt: bf16 in fast mode where the CPU has AVX512_BF16, when
 * LOOM_CPU_BF16DOT=all asks for it (gemm_bf16.c: not faster than sgemm here, so opt-in). */
static int cpu_matmul_backward_dt(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const void *weight, int weight_bits, int B,
                                  int T, int C, int OC, loom_dtype dt)
{
    if (dt != LOOM_DTYPE_BF16 || !loom_cpu_gemm_bf16_backward_wanted())
        return -1;
    return loom_cpu_matmul_backward_bf16(dinp, dweight, dbias, dout, inp, weight, weight_bits,
                                         B, T, C, OC);
}

static const loom_backend_ops cpu_ops = {
    .size = sizeof(loom_backend_ops),
    .create = cpu_create,
    .destroy = cpu_destroy,
    .describe = cpu_describe,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .zero = cpu_zero,
    .synchronize = cpu_synchronize,
    .embedding_forward = loom_cpu_embedding_forward,
    .embedding_backward = loom_cpu_embedding_backward,
    .position_forward = loom_cpu_position_forward,
    .position_backward = loom_cpu_position_backward,
    .gemm = loom_cpu_sgemm,
    .layernorm_forward = loom_cpu_layernorm_forward,
    .layernorm_backward = loom_cpu_layernorm_backward,
    .matmul_forward = loom_cpu_matmul_forward,
    .matmul_backward = loom_cpu_matmul_backward,
    .matmul_forward_dt = cpu_matmul_forward_dt,
    .gemm_w16 = cpu_gemm_w16,
    .attention_forward = loom_cpu_attention_forward,
    .attention_backward = loom_cpu_attention_backward,
    .gelu_forward = loom_cpu_gelu_forward,
    .gelu_backward = loom_cpu_gelu_backward,
    .residual_forward = loom_cpu_residual_forward,
    .accumulate = loom_cpu_accumulate,
    .ce_row_max = loom_cpu_ce_row_max,
    .ce_row_sumexp = loom_cpu_ce_row_sumexp,
    .ce_target_logit = loom_cpu_ce_target_logit,
    .ce_finish = loom_cpu_ce_finish,
    .bias_add = loom_cpu_bias_add,
    .bias_backward = loom_cpu_bias_backward,
    .sum_squares = loom_cpu_sum_squares,
    .has_nonfinite = loom_cpu_has_nonfinite,
    .scale = loom_cpu_scale,
    .set_deterministic = cpu_set_deterministic,
    .attention_decode = loom_cpu_attention_decode,
    .rows_gather = loom_cpu_rows_gather,
    .rows_scatter_add = loom_cpu_rows_scatter_add,
    .rows_dot = loom_cpu_rows_dot,
    .stream = cpu_stream,
    .rmsnorm_forward = loom_cpu_rmsnorm_forward,
    .rmsnorm_backward = loom_cpu_rmsnorm_backward,
    .swiglu_forward = loom_cpu_swiglu_forward,
    .swiglu_backward = loom_cpu_swiglu_backward,
    .rope_forward = loom_cpu_rope_forward,
    .rope_backward = loom_cpu_rope_backward,
    .attention_gqa_forward = loom_cpu_attention_gqa_forward,
    .attention_gqa_backward = loom_cpu_attention_gqa_backward,
    .attention_gqa_decode = loom_cpu_attention_gqa_decode,
    .convert_from_f32 = cpu_convert_from_f32,
    .convert_to_f32 = cpu_convert_to_f32,
    .round_to = cpu_round_to,
    .gemm_chunk_tree = loom_cpu_gemm_chunk_tree,
    .rep_chunk_tree = loom_cpu_rep_chunk_tree,
    .attention_backward_datt = loom_cpu_attention_backward_datt,
    .matmul_backward_dt = cpu_matmul_backward_dt,
};

static const loom_config_key cpu_keys[] = {
    {"threads", LOOM_CFG_INTEGER, "0", "compute threads (0: all cores)"},
};

static const loom_plugin_desc cpu_desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_BACKEND,
    .name = "cpu",
    .version = "0.1.0",
    .summary = "reference CPU kernels (C + OpenMP, OpenBLAS GEMM)",
    .config_keys = cpu_keys,
    .n_config_keys = sizeof cpu_keys / sizeof cpu_keys[0],
    .probe = NULL,
    .ops = &cpu_ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void)
{
    return &cpu_desc;
}
