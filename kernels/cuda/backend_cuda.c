/* backend_cuda.c — the plugin loom-backend-cuda.so: the CUDA kernels behind the
 * loom_backend_ops table (include/loom/plugin/backend.h), fp32 with fp32 accumulation.
 *
 * create() picks the device (the `device` key, or LOCAL_RANK % devices: device_select.c)
 * and sets it before any other CUDA call; makes the compute stream (non-blocking), the
 * cuBLAS and cuBLASLt handles bound to it, and the device memory pool (pool.c: segments
 * from cudaMalloc, blocks cached and reused, so a step that frees and allocates the same
 * sizes never calls cudaMalloc). Every kernel, copy and memset goes on the compute stream;
 * the stream is handed to comm plugins as a void * (the ops table's `stream`), so their
 * communication stream can wait on it with events.
 *
 * The ops take no instance pointer, so the backend is one process-wide context (backend.h:
 * one instance per process). Errors: launches and cuBLAS calls cannot return a status
 * through the table's void ops, so the first failure is kept (sticky) and logged, with its
 * CUDA or cuBLAS string, at the next synchronize; copies to the host synchronize and
 * check. Memory returned by alloc is zeroed (a memset queued on the stream).
 */
#include "cuda_common.h"
#include "device_select.h"
#include "pool.h"
#include "vmm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "loom/plugin/backend.h"

loom_cuda_ctx loom_cuda;

typedef struct cuda_backend {
    const loom_host *host;
    loom_pool *pool;
    int device;
    void *workspace;
    size_t workspace_bytes;
    char desc[400];
} cuda_backend;

static cuda_backend *the; /* the one instance, for the ops that take no self */

void loom_cuda_note_error(const char *what, const char *detail)
{
    if (loom_cuda.sticky_error)
        return;
    loom_cuda.sticky_error = 1;
    snprintf(loom_cuda.error, sizeof loom_cuda.error, "%s: %s", what, detail);
}

void loom_cuda_check_launch(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        loom_cuda_note_error(what, cudaGetErrorString(e));
}

static int pool_reserve(void *ctx, size_t bytes, uintptr_t *base)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError(); /* clear it: out of memory is answered by NULL, not sticky */
        return -1;
    }
    *base = (uintptr_t)p;
    return 0;
}

static void pool_release(void *ctx, uintptr_t base, size_t bytes)
{
    cudaFree((void *)base);
}

static void *cuda_alloc(void *self, size_t bytes)
{
    cuda_backend *b = self;
    uintptr_t p = loom_pool_alloc(b->pool, bytes);
    if (p)
        cudaMemsetAsync((void *)p, 0, bytes ? bytes : 1, loom_cuda.stream);
    return (void *)p;
}

static void cuda_free(void *self, void *p)
{
    cuda_backend *b = self;
    /* Stream order makes reuse safe: work queued before the free runs before any kernel
     * that writes the block's next owner. */
    if (p && loom_pool_free(b->pool, (uintptr_t)p) != 0)
        loom_cuda_note_error("free", "a pointer this backend did not allocate");
}

void *loom_cuda_workspace(size_t bytes)
{
    cuda_backend *b = the;
    if (bytes <= b->workspace_bytes)
        return b->workspace;
    size_t want = b->workspace_bytes ? b->workspace_bytes : (size_t)1 << 20;
    while (want < bytes)
        want *= 2;
    if (b->workspace)
        loom_pool_free(b->pool, (uintptr_t)b->workspace);
    b->workspace = (void *)loom_pool_alloc(b->pool, want);
    b->workspace_bytes = b->workspace ? want : 0;
    if (!b->workspace)
        loom_cuda_note_error("workspace", "out of device memory");
    return b->workspace;
}

static void cuda_synchronize(void *self)
{
    cuda_backend *b = self;
    cudaError_t e = cudaStreamSynchronize(loom_cuda.stream);
    if (e != cudaSuccess)
        loom_cuda_note_error("synchronize", cudaGetErrorString(e));
    if (loom_cuda.sticky_error == 1) { /* logged once; the run's results are not to be trusted */
        b->host->log(LOOM_LOG_ERROR, "backend cuda: %s", loom_cuda.error);
        loom_cuda.sticky_error = 2;
    }
}

static void cuda_copy_to_device(void *self, void *dst, const void *src, size_t bytes)
{
    if (bytes && cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, loom_cuda.stream) !=
                     cudaSuccess)
        loom_cuda_check_launch("copy_to_device");
    /* the caller may free or rewrite src as soon as this returns */
    cuda_synchronize(self);
}

static void cuda_copy_to_host(void *self, void *dst, const void *src, size_t bytes)
{
    if (bytes && cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, loom_cuda.stream) !=
                     cudaSuccess)
        loom_cuda_check_launch("copy_to_host");
    cuda_synchronize(self);
}

/* Pinned (page-locked) host memory: the copies to and from it run at the link's speed
 * without a staging copy through the driver's own pinned buffer. */
static void *cuda_host_alloc(void *self, size_t bytes)
{
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess)
        return NULL;
    memset(p, 0, bytes);
    return p;
}

static void cuda_host_free(void *self, void *p)
{
    if (p)
        cudaFreeHost(p);
}

static void cuda_zero(void *self, void *p, size_t bytes)
{
    if (bytes)
        cudaMemsetAsync(p, 0, bytes, loom_cuda.stream);
}

static void cuda_set_deterministic(void *self, int on)
{
    loom_cuda.deterministic = on;
}

static void *cuda_stream(void *self)
{
    return (void *)loom_cuda.stream;
}

static void cuda_destroy(void *self)
{
    cuda_backend *b = self;
    if (!b)
        return;
    if (loom_cuda.stream) {
        cudaStreamSynchronize(loom_cuda.stream);
        loom_cuda_profile_report(); /* its events are on the stream */
    }
    if (loom_cuda.blaslt)
        cublasLtDestroy((cublasLtHandle_t)loom_cuda.blaslt);
    if (loom_cuda.blas)
        cublasDestroy((cublasHandle_t)loom_cuda.blas);
    if (loom_cuda.h_flag)
        cudaFreeHost(loom_cuda.h_flag);
    if (loom_cuda.h_parts)
        cudaFreeHost(loom_cuda.h_parts);
    loom_pool_destroy(b->pool); /* the workspaces and d_flag with it */
    if (loom_cuda.stream)
        cudaStreamDestroy(loom_cuda.stream);
    memset(&loom_cuda, 0, sizeof loom_cuda);
    the = NULL;
    free(b);
}

static loom_status cuda_fail(cuda_backend *b, const loom_host *host, const char *what,
                             cudaError_t e)
{
    loom_status st = host->fail(LOOM_ERR_INTERNAL, "backend cuda: %s: %s", what,
                                cudaGetErrorString(e));
    cuda_destroy(b);
    return st;
}

enum { K_THREADS, K_DEVICE, K_LT_WORKSPACE_MB, N_KEYS };

static loom_status cuda_create(const loom_host *host, const loom_config *cfg, void **self)
{
    *self = NULL;
    if (the)
        return host->fail(LOOM_ERR_INVALID, "backend cuda: one instance per process; this one "
                          "is already started");
    int requested = -1, ws_mb = 32;
    if (cfg && cfg->count >= N_KEYS && cfg->values) {
        requested = (int)cfg->values[K_DEVICE].number;
        ws_mb = (int)cfg->values[K_LT_WORKSPACE_MB].number;
    }
    const int flash = loom_cuda_attention_env();
    if (flash < 0)
        return host->fail(LOOM_ERR_INVALID, "backend cuda: LOOM_CUDA_ATTENTION=%s; use \"batched\" "
                          "(the default) or \"flash\"", getenv("LOOM_CUDA_ATTENTION"));
    if (loom_cuda_scatter_env() < 0)
        return host->fail(LOOM_ERR_INVALID, "backend cuda: LOOM_CUDA_SCATTER=%s; use \"walk\" "
                          "or \"sort\" (or leave it unset: by size)", getenv("LOOM_CUDA_SCATTER"));
    const int bf16_bwd = loom_cuda_bf16_bwd_env();
    if (bf16_bwd < 0)
        return host->fail(LOOM_ERR_INVALID, "backend cuda: LOOM_CUDA_BF16_BWD=%s; use 1 (the "
                          "default: bf16 backward products) or 0 (fp32 SGEMMs)",
                          getenv("LOOM_CUDA_BF16_BWD"));
    if (!loom_cuda_split_chunk_env())
        return host->fail(LOOM_ERR_INVALID, "backend cuda: LOOM_CUDA_SPLIT_CHUNK=%s; use a "
                          "positive integer (the most gradient elements split at once) or "
                          "leave it unset (2^26)", getenv("LOOM_CUDA_SPLIT_CHUNK"));
    if (ws_mb < 0 || ws_mb > 4096)
        return host->fail(LOOM_ERR_INVALID, "backend cuda: lt_workspace_mb = %d; use 0 to 4096",
                          ws_mb);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        n = 0;
    char why[200];
    int dev = loom_cuda_pick_device(requested, getenv("LOCAL_RANK"), n, why, sizeof why);
    if (dev < 0)
        return host->fail(n ? LOOM_ERR_INVALID : LOOM_ERR_UNSUPPORTED, "backend cuda: %s", why);
    cuda_backend *b = calloc(1, sizeof *b);
    if (!b)
        return host->fail(LOOM_ERR_NOMEM, "backend cuda: out of memory");
    b->host = host;
    b->device = dev;
    the = b;
    memset(&loom_cuda, 0, sizeof loom_cuda);
    loom_cuda.attention_flash = flash;
    loom_cuda.bf16_bwd = bf16_bwd;
    if ((e = cudaSetDevice(dev)) != cudaSuccess) /* before any other CUDA call */
        return cuda_fail(b, host, "cudaSetDevice", e);
    if ((e = cudaStreamCreateWithFlags(&loom_cuda.stream, cudaStreamNonBlocking)) != cudaSuccess)
        return cuda_fail(b, host, "cudaStreamCreate", e);
    char perr[300];
    if (loom_cuda_profile_setup(host, perr, sizeof perr) != 0) {
        cuda_destroy(b);
        return host->fail(LOOM_ERR_INVALID, "backend cuda: %s", perr);
    }
    cublasHandle_t h;
    cublasLtHandle_t lt;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        cuda_destroy(b);
        return host->fail(LOOM_ERR_INTERNAL, "backend cuda: cublasCreate failed");
    }
    loom_cuda.blas = h;
    cublasSetStream(h, loom_cuda.stream);
    cublasSetMathMode(h, CUBLAS_DEFAULT_MATH); /* fp32, no TF32 */
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
        cuda_destroy(b);
        return host->fail(LOOM_ERR_INTERNAL, "backend cuda: cublasLtCreate failed");
    }
    loom_cuda.blaslt = lt;
    b->pool = loom_pool_create(pool_reserve, pool_release, NULL);
    if (!b->pool) {
        cuda_destroy(b);
        return host->fail(LOOM_ERR_NOMEM, "backend cuda: out of memory");
    }
    loom_cuda.lt_workspace_bytes = (size_t)ws_mb << 20;
    if (ws_mb)
        loom_cuda.lt_workspace = (void *)loom_pool_alloc(b->pool, loom_cuda.lt_workspace_bytes);
    loom_cuda.d_flag = (int *)loom_pool_alloc(b->pool, sizeof(int));
    if ((ws_mb && !loom_cuda.lt_workspace) || !loom_cuda.d_flag) {
        cuda_destroy(b);
        return host->fail(LOOM_ERR_NOMEM, "backend cuda: no device memory for the workspace");
    }
    if ((e = cudaMallocHost((void **)&loom_cuda.h_flag, sizeof(int))) != cudaSuccess ||
        (e = cudaMallocHost((void **)&loom_cuda.h_parts, 64 * sizeof(double))) != cudaSuccess)
        return cuda_fail(b, host, "cudaMallocHost", e);
    struct cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess)
        return cuda_fail(b, host, "cudaGetDeviceProperties", e);
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    snprintf(b->desc, sizeof b->desc, "cuda: %.200s (sm_%d%d, %.0f GiB), device %d of %d, CUDA %d.%d, "
             "attention %s", prop.name, prop.major, prop.minor,
             (double)prop.totalGlobalMem / (1 << 30), dev, n, rt / 1000, rt % 1000 / 10,
             flash ? "flash (LOOM_CUDA_ATTENTION)" : "batched");
    *self = b;
    return LOOM_OK;
}

static const char *cuda_describe(void *self)
{
    return self ? ((cuda_backend *)self)->desc : "cuda";
}

static const loom_backend_ops cuda_ops = {
    .size = sizeof(loom_backend_ops),
    .create = cuda_create,
    .destroy = cuda_destroy,
    .describe = cuda_describe,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy_to_device = cuda_copy_to_device,
    .copy_to_host = cuda_copy_to_host,
    .zero = cuda_zero,
    .synchronize = cuda_synchronize,
    .embedding_forward = loom_cuda_embedding_forward,
    .embedding_backward = loom_cuda_embedding_backward,
    .position_forward = loom_cuda_position_forward,
    .position_backward = loom_cuda_position_backward,
    .layernorm_forward = loom_cuda_layernorm_forward,
    .layernorm_backward = loom_cuda_layernorm_backward,
    .matmul_forward = loom_cuda_matmul_forward,
    .matmul_backward = loom_cuda_matmul_backward,
    .gemm = loom_cuda_sgemm,
    .attention_forward = loom_cuda_attention_forward,
    .attention_backward = loom_cuda_attention_backward,
    .gelu_forward = loom_cuda_gelu_forward,
    .gelu_backward = loom_cuda_gelu_backward,
    .residual_forward = loom_cuda_residual_forward,
    .accumulate = loom_cuda_accumulate,
    .ce_row_max = loom_cuda_ce_row_max,
    .ce_row_sumexp = loom_cuda_ce_row_sumexp,
    .ce_target_logit = loom_cuda_ce_target_logit,
    .ce_finish = loom_cuda_ce_finish,
    .bias_add = loom_cuda_bias_add,
    .bias_backward = loom_cuda_bias_backward,
    .sum_squares = loom_cuda_sum_squares,
    .has_nonfinite = loom_cuda_has_nonfinite,
    .scale = loom_cuda_scale,
    .set_deterministic = cuda_set_deterministic,
    .attention_decode = loom_cuda_attention_decode,
    .stream = cuda_stream,
    .rows_gather = loom_cuda_rows_gather,
    .rows_scatter_add = loom_cuda_rows_scatter_add,
    .rows_dot = loom_cuda_rows_dot,
    .rmsnorm_forward = loom_cuda_rmsnorm_forward,
    .rmsnorm_backward = loom_cuda_rmsnorm_backward,
    .swiglu_forward = loom_cuda_swiglu_forward,
    .swiglu_backward = loom_cuda_swiglu_backward,
    .rope_forward = loom_cuda_rope_forward,
    .rope_backward = loom_cuda_rope_backward,
    .attention_gqa_forward = loom_cuda_attention_gqa_forward,
    .attention_gqa_backward = loom_cuda_attention_gqa_backward,
    .attention_gqa_decode = loom_cuda_attention_gqa_decode,
    .convert_from_f32 = loom_cuda_convert_from_f32,
    .convert_to_f32 = loom_cuda_convert_to_f32,
    .round_to = loom_cuda_round_to,
    .adamw_update = loom_cuda_adamw_update,
    .sgd_update = loom_cuda_sgd_update,
    .matmul_forward_dt = loom_cuda_matmul_forward_dt,
    .gemm_w16 = loom_cuda_gemm_w16,
    .matmul_backward_dt = loom_cuda_matmul_backward_dt,
    .attention_flash_forward = loom_cuda_flash_attention_forward,
    .attention_flash_backward = loom_cuda_flash_attention_backward,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .kd_rows = loom_cuda_kd_rows,
    .attention_backward_datt = loom_cuda_attention_backward_datt,
    .vm_granule = loom_cuda_vm_granule,
    .vm_reserve = loom_cuda_vm_reserve,
    .vm_commit = loom_cuda_vm_commit,
    .vm_decommit = loom_cuda_vm_decommit,
    .vm_release = loom_cuda_vm_release,
    .attention_forward_dt = loom_cuda_attention_forward_dt,
    .attention_backward_dt = loom_cuda_attention_backward_dt,
    .attention_flash_gqa_forward = loom_cuda_flash_attention_gqa_forward,
    .attention_flash_gqa_backward = loom_cuda_flash_attention_gqa_backward,
    .attention_gqa_forward_dt = loom_cuda_attention_gqa_forward_dt,
    .attention_gqa_backward_dt = loom_cuda_attention_gqa_backward_dt,
    .attention_sizes = loom_cuda_attention_sizes,
    .attention_allow_fused = loom_cuda_attention_allow_fused,
};

static const loom_config_key cuda_keys[N_KEYS] = {
    [K_THREADS] = {"threads", LOOM_CFG_INTEGER, "0", "host threads (unused by the CUDA kernels)"},
    [K_DEVICE] = {"device", LOOM_CFG_INTEGER, "-1",
                  "GPU index; -1: LOCAL_RANK modulo the visible devices"},
    [K_LT_WORKSPACE_MB] = {"lt_workspace_mb", LOOM_CFG_INTEGER, "32",
                           "cuBLASLt workspace, MiB (0 to 4096)"},
};

/* Cheap and side-effect free apart from the driver's own start. */
static int cuda_probe(char *reason, size_t n)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(reason, n, "no CUDA device visible (%s); use backend = \"cpu\"",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 0;
    }
    return 1;
}

static const loom_plugin_desc cuda_desc = {
    .abi = LOOM_PLUGIN_ABI,
    .size = sizeof(loom_plugin_desc),
    .kind = LOOM_KIND_BACKEND,
    .name = "cuda",
    .version = "0.1.0",
    .summary = "CUDA kernels, fp32 (cuBLAS/cuBLASLt GEMM, device memory pool)",
    .config_keys = cuda_keys,
    .n_config_keys = N_KEYS,
    .probe = cuda_probe,
    .ops = &cuda_ops,
};

LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void)
{
    return &cuda_desc;
}
