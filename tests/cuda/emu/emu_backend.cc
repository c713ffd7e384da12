// emu_backend.cc — loom-backend-cudaemu.so, a test-only plugin: the CUDA backend's kernels
// (kernels/cuda/*.cu, compiled as C++ over cuda_runtime.h here) and its GEMM glue
// (kernels/cuda/gemm.c, with the ordered GEMM for every product: no cuBLAS on the CPU)
// behind the backend ops table, over host memory. tests/cuda runs test_cuda_ops with it
// against the CPU backend (cuda_ops_emu), so the kernels' indexing, masking, reductions
// and contracts are checked on machines without a GPU. What it cannot check: anything
// CUDA itself does (cuBLAS/cuBLASLt, streams, the memory pool on a device, launch limits,
// warp timing); tests/cuda's cuda_ops does those on a GPU.
#include "cuda_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <iterator>
#include <map>
#include <vector>
#include <unistd.h>

#include "loom/plugin/backend.h"

extern "C" {
loom_cuda_ctx loom_cuda;
}

/* The guard (LOOM_CUDAEMU_GUARD=1): "device" memory is host memory here, so code that
 * reads or writes it directly, where a GPU would need a copy, would pass unnoticed. With
 * the guard every allocation is whole pages of one arena mapping, inaccessible except
 * while one of this table's ops runs: a direct host access is a segfault (the test fails)
 * instead. Freed blocks go back to the arena's free list with their pages handed back (they
 * read as zeros when reused) and stay PROT_NONE, open or not: a read after free is a
 * segfault too, as it was when each block was its own mapping and free unmapped it.
 * Opening and closing, two ways:
 *  - a protection key (x86-64 PKU, where the CPU and kernel have it: pkey_alloc succeeds):
 *    the blocks in use (and committed sparse granules) are PROT_READ|PROT_WRITE tagged
 *    with the key, and opening is the calling thread's PKRU allowing the key (pkey_set: one
 *    user-space instruction, no system call). The key is per thread: only a thread inside
 *    one of the ops may touch the memory (a host access from any other thread faults too,
 *    with SIGSEGV, si_code SEGV_PKUERR). Toggling the page tables of every block in use for
 *    every op was about a third of cuda_dp_emu's CPU time;
 *  - otherwise (or LOOM_CUDAEMU_GUARD=mprotect), mprotect: the arena kept PROT_NONE outside
 *    the ops, opened by one mprotect per run of blocks in use (one arena, so that is not an
 *    mprotect per allocation per op, which was about 40% of a guarded MoE run's time). */
static int guard_on, guard_depth; /* guard_depth: the mprotect way's, process-wide */
static int guard_key = -1;          /* the protection key, or -1: the mprotect way */
static thread_local int key_depth;  /* the key's: per thread, as the PKRU register is */
static std::map<void *, size_t> blocks;
static char *arena;
static size_t arena_top;                            /* bytes of the arena handed out so far */
static std::map<size_t, size_t> arena_free;         /* offset -> length, coalesced */
static const size_t ARENA_RESERVE = (size_t)1 << 38; /* address space only (MAP_NORESERVE) */

/* Pages just taken from the arena: tagged with the key and readable (the key guards
 * them), or, the mprotect way, readable if the guard is open now. */
static void open_taken(char *p, size_t len)
{
    if (guard_key >= 0)
        pkey_mprotect(p, len, PROT_READ | PROT_WRITE, guard_key);
    else if (guard_depth)
        mprotect(p, len, PROT_READ | PROT_WRITE);
}

static void *arena_take(size_t len)
{
    if (!arena) {
        void *a = mmap(NULL, ARENA_RESERVE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (a == MAP_FAILED)
            return NULL;
        arena = (char *)a;
    }
    for (auto f = arena_free.begin(); f != arena_free.end(); ++f) /* first fit */
        if (f->second >= len) {
            size_t off = f->first, rest = f->second - len;
            arena_free.erase(f);
            if (rest)
                arena_free[off + len] = rest;
            open_taken(arena + off, len); /* a free block is PROT_NONE */
            return arena + off;
        }
    if (arena_top + len > ARENA_RESERVE)
        return NULL;
    char *p = arena + arena_top;
    arena_top += len;
    open_taken(p, len); /* the pages past the old top are PROT_NONE */
    return p;
}

static void arena_give(char *p, size_t len)
{
    madvise(p, len, MADV_DONTNEED); /* zeros when taken again */
    mprotect(p, len, PROT_NONE);    /* whether the guard is open or not (protect_all) */
    size_t off = (size_t)(p - arena);
    auto next = arena_free.lower_bound(off);
    if (next != arena_free.end() && next->first == off + len) {
        len += next->second;
        next = arena_free.erase(next);
    }
    if (next != arena_free.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == off) {
            prev->second += len;
            return;
        }
    }
    arena_free[off] = len;
}

/* Sparse ranges (vm_reserve): one mapping each, PROT_NONE where a granule is not committed
 * (always, guard or not: a read of decommitted memory is a segfault), committed granules
 * as the guard's blocks are (read-write without the guard). */
struct sparse_range {
    size_t len, granule;
    std::vector<char> on; /* committed, per granule */
};
static std::map<void *, sparse_range> sparse;
static size_t emu_granule_bytes;

static void protect_sparse(void *base, const sparse_range &r, int prot)
{
    for (size_t g = 0; g < r.on.size(); g++)
        if (r.on[g])
            mprotect((char *)base + g * r.granule, r.granule, prot);
}

static void protect_all(int prot)
{
    size_t from = 0; /* the runs of blocks in use, between the free ones */
    for (auto &f : arena_free) {
        if (f.first > from)
            mprotect(arena + from, f.first - from, prot);
        from = f.first + f.second;
    }
    if (arena_top > from)
        mprotect(arena + from, arena_top - from, prot);
    for (auto &r : sparse)
        protect_sparse(r.first, r.second, prot);
}

struct guard_scope {
    guard_scope()
    {
        if (!guard_on)
            return;
        if (guard_key >= 0) {
            if (key_depth++ == 0)
                pkey_set(guard_key, 0);
        } else if (guard_depth++ == 0)
            protect_all(PROT_READ | PROT_WRITE);
    }
    ~guard_scope()
    {
        if (!guard_on)
            return;
        if (guard_key >= 0) {
            if (--key_depth == 0)
                pkey_set(guard_key, PKEY_DISABLE_ACCESS);
        } else if (--guard_depth == 0)
            protect_all(PROT_NONE);
    }
};

/* An op of the table with the guard opened around it. */
template <auto F> struct guarded;
template <typename R, typename... A, R (*F)(A...)> struct guarded<F> {
    static R call(A... a)
    {
        guard_scope g;
        return F(a...);
    }
};
#define G(f) guarded<f>::call

static void *workspace;
static size_t workspace_bytes;
static double parts[64];
static int flag;

extern "C" void *loom_cuda_workspace(size_t bytes)
{
    if (bytes > workspace_bytes) {
        free(workspace);
        workspace = calloc(1, bytes);
        workspace_bytes = workspace ? bytes : 0;
    }
    return workspace;
}

extern "C" void loom_cuda_note_error(const char *what, const char *detail)
{
    fprintf(stderr, "cuda emu: %s: %s\n", what, detail);
    loom_cuda.sticky_error = 1;
}

extern "C" void loom_cuda_check_launch(const char *what)
{
}

static loom_status emu_create(const loom_host *host, const loom_config *cfg, void **self)
{
    memset(&loom_cuda, 0, sizeof loom_cuda);
    loom_cuda.attention_flash = loom_cuda_attention_env();
    if (loom_cuda.attention_flash < 0)
        return host->fail(LOOM_ERR_INVALID, "backend cudaemu: LOOM_CUDA_ATTENTION=%s; use "
                          "\"batched\" (the default) or \"flash\"", getenv("LOOM_CUDA_ATTENTION"));
    if (loom_cuda_scatter_env() < 0)
        return host->fail(LOOM_ERR_INVALID, "backend cudaemu: LOOM_CUDA_SCATTER=%s; use "
                          "\"walk\" or \"sort\" (or leave it unset: by size)",
                          getenv("LOOM_CUDA_SCATTER"));
    loom_cuda.bf16_bwd = loom_cuda_bf16_bwd_env();
    if (loom_cuda.bf16_bwd < 0)
        return host->fail(LOOM_ERR_INVALID, "backend cudaemu: LOOM_CUDA_BF16_BWD=%s; use 1 (the "
                          "default: bf16 backward products) or 0 (fp32 SGEMMs)",
                          getenv("LOOM_CUDA_BF16_BWD"));
    if (!loom_cuda_split_chunk_env())
        return host->fail(LOOM_ERR_INVALID, "backend cudaemu: LOOM_CUDA_SPLIT_CHUNK=%s; use a "
                          "positive integer (the most gradient elements split at once) or "
                          "leave it unset (2^26)", getenv("LOOM_CUDA_SPLIT_CHUNK"));
    char perr[300];
    if (loom_cuda_profile_setup(host, perr, sizeof perr) != 0)
        return host->fail(LOOM_ERR_INVALID, "backend cudaemu: %s", perr);
    const char *guard = getenv("LOOM_CUDAEMU_GUARD");
    const int by_mprotect = guard && strcmp(guard, "mprotect") == 0;
    guard_on = guard && (atoi(guard) != 0 || by_mprotect);
    /* the key once a process, before the arena's first block (the blocks' tags are fixed
     * when taken); none: the mprotect way */
    static int key_tried;
    if (guard_on && !by_mprotect && !key_tried && !arena) {
        key_tried = 1;
        guard_key = pkey_alloc(0, PKEY_DISABLE_ACCESS);
    }
    loom_cuda.h_parts = parts;
    loom_cuda.d_flag = &flag;
    loom_cuda.h_flag = &flag;
    *self = &loom_cuda;
    return LOOM_OK;
}

static void emu_destroy(void *self)
{
    loom_cuda_profile_report();
    free(workspace);
    workspace = NULL;
    workspace_bytes = 0;
}

static const char *emu_describe(void *self)
{
    return loom_cuda.attention_flash
               ? "cudaemu: kernels/cuda's kernels on the CPU (test-only emulation), attention flash"
               : "cudaemu: kernels/cuda's kernels on the CPU (test-only emulation)";
}


/* LOOM_CUDAEMU_MAX_ALLOC: the most bytes one allocation may have (unset: no limit), so an
 * emulated device can run out of memory as a GPU does (scripts/gpu-check --dry-run's check
 * of its B probe): a larger alloc returns NULL, as the CUDA backend's pool does. */
static size_t emu_max_alloc(void)
{
    const char *v = getenv("LOOM_CUDAEMU_MAX_ALLOC");
    return v && *v ? (size_t)strtoull(v, NULL, 10) : (size_t)-1;
}

static void *emu_alloc(void *self, size_t bytes)
{
    if (bytes > emu_max_alloc())
        return NULL;
    if (!guard_on)
        return calloc(1, bytes ? bytes : 1);
    size_t len = ((bytes ? bytes : 1) + 4095) & ~(size_t)4095;
    void *p = arena_take(len); /* zeroed */
    if (!p)
        return NULL;
    blocks[p] = len;
    return p;
}

static void emu_free(void *self, void *p)
{
    if (!guard_on || !p) {
        free(p);
        return;
    }
    auto b = blocks.find(p);
    if (b == blocks.end()) {
        loom_cuda_note_error("free", "a pointer this backend did not allocate");
        return;
    }
    arena_give((char *)b->first, b->second);
    blocks.erase(b);
}

/* The granule: the page size, or LOOM_CUDAEMU_GRANULE bytes (a multiple of it; a GPU's is
 * typically 2 MiB), so that the tests' small models still span many granules. */
static size_t emu_granule(void *self)
{
    if (!emu_granule_bytes) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        const char *g = getenv("LOOM_CUDAEMU_GRANULE");
        size_t want = g ? (size_t)strtoull(g, NULL, 10) : page;
        emu_granule_bytes = want >= page && want % page == 0 ? want : page;
    }
    return emu_granule_bytes;
}

static void *emu_vm_reserve(void *self, size_t bytes)
{
    size_t gr = emu_granule(self), len = ((bytes ? bytes : 1) + gr - 1) / gr * gr;
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    sparse[p] = sparse_range{len, gr, std::vector<char>(len / gr, 0)};
    return p;
}

static sparse_range *find_sparse(void *base, size_t off, size_t len, const char *what)
{
    auto r = sparse.find(base);
    if (r == sparse.end() || off % r->second.granule || len % r->second.granule ||
        off + len > r->second.len) {
        loom_cuda_note_error(what, "not a granule-aligned piece of a vm_reserve range");
        return NULL;
    }
    return &r->second;
}

/* Committed memory reads as NaN (0xff bytes) until written: a GPU's is undefined, so a
 * caller that forgets to zero a gradient granule before accumulating into it shows. */
static int emu_vm_commit(void *self, void *base, size_t off, size_t len)
{
    sparse_range *r = find_sparse(base, off, len, "vm_commit");
    if (!r)
        return -1;
    char *p = (char *)base + off;
    if (guard_on && guard_key >= 0) { /* tagged: the key guards it */
        if (pkey_mprotect(p, len, PROT_READ | PROT_WRITE, guard_key) != 0)
            return -1;
        guard_scope g;
        memset(p, 0xff, len);
    } else {
        if (mprotect(p, len, PROT_READ | PROT_WRITE) != 0)
            return -1;
        memset(p, 0xff, len);
        if (guard_on && !guard_depth)
            mprotect(p, len, PROT_NONE);
    }
    for (size_t g = off / r->granule; g < (off + len) / r->granule; g++)
        r->on[g] = 1;
    return 0;
}

static void emu_vm_decommit(void *self, void *base, size_t off, size_t len)
{
    sparse_range *r = find_sparse(base, off, len, "vm_decommit");
    if (!r)
        return;
    char *p = (char *)base + off;
    madvise(p, len, MADV_DONTNEED); /* the pages back to the OS: the RSS drops */
    mprotect(p, len, PROT_NONE);
    for (size_t g = off / r->granule; g < (off + len) / r->granule; g++)
        r->on[g] = 0;
}

static void emu_vm_release(void *self, void *base)
{
    auto r = sparse.find(base);
    if (r == sparse.end()) {
        loom_cuda_note_error("vm_release", "a pointer vm_reserve did not return");
        return;
    }
    munmap(base, r->second.len);
    sparse.erase(r);
}

static void emu_copy(void *self, void *dst, const void *src, size_t bytes)
{
    guard_scope g;
    memcpy(dst, src, bytes);
}

/* Host memory for the offload's pool and buffers: plain calloc here (no pinning to do), so
 * the path through host_alloc runs; outside the guard's blocks, as a host buffer is. */
static void *emu_host_alloc(void *self, size_t bytes)
{
    return calloc(1, bytes ? bytes : 1);
}

static void emu_host_free(void *self, void *p)
{
    free(p);
}

static void emu_zero(void *self, void *p, size_t bytes)
{
    guard_scope g;
    memset(p, 0, bytes);
}

static void emu_sync(void *self)
{
}

static void emu_set_deterministic(void *self, int on)
{
    loom_cuda.deterministic = on;
}

/* Not a stream: a non-NULL handle marks this backend's memory as a device's
 * (loom_backend_device_memory), so a session takes the device paths (step_backend, the
 * host mirrors) that the CUDA backend takes. */
static char emu_stream_token;
static void *emu_stream(void *self)
{
    return &emu_stream_token;
}

static loom_backend_ops make_ops()
{
    loom_backend_ops o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.create = emu_create;
    o.destroy = emu_destroy;
    o.describe = emu_describe;
    o.alloc = emu_alloc;
    o.free = emu_free;
    o.copy_to_device = emu_copy;
    o.copy_to_host = emu_copy;
    o.zero = emu_zero;
    o.host_alloc = emu_host_alloc;
    o.host_free = emu_host_free;
    o.vm_granule = emu_granule;
    o.vm_reserve = emu_vm_reserve;
    o.vm_commit = emu_vm_commit;
    o.vm_decommit = emu_vm_decommit;
    o.vm_release = emu_vm_release;
    o.synchronize = emu_sync;
    o.embedding_forward = G(loom_cuda_embedding_forward);
    o.embedding_backward = G(loom_cuda_embedding_backward);
    o.position_forward = G(loom_cuda_position_forward);
    o.position_backward = G(loom_cuda_position_backward);
    o.layernorm_forward = G(loom_cuda_layernorm_forward);
    o.layernorm_backward = G(loom_cuda_layernorm_backward);
    o.matmul_forward = G(loom_cuda_matmul_forward);
    o.matmul_backward = G(loom_cuda_matmul_backward);
    o.gemm = G(loom_cuda_sgemm);
    o.attention_forward = G(loom_cuda_attention_forward);
    o.attention_backward = G(loom_cuda_attention_backward);
    o.gelu_forward = G(loom_cuda_gelu_forward);
    o.gelu_backward = G(loom_cuda_gelu_backward);
    o.residual_forward = G(loom_cuda_residual_forward);
    o.accumulate = G(loom_cuda_accumulate);
    o.ce_row_max = G(loom_cuda_ce_row_max);
    o.ce_row_sumexp = G(loom_cuda_ce_row_sumexp);
    o.ce_target_logit = G(loom_cuda_ce_target_logit);
    o.ce_finish = G(loom_cuda_ce_finish);
    o.bias_add = G(loom_cuda_bias_add);
    o.bias_backward = G(loom_cuda_bias_backward);
    o.sum_squares = G(loom_cuda_sum_squares);
    o.has_nonfinite = G(loom_cuda_has_nonfinite);
    o.scale = G(loom_cuda_scale);
    o.set_deterministic = emu_set_deterministic;
    o.attention_decode = G(loom_cuda_attention_decode);
    o.stream = emu_stream;
    o.rows_gather = G(loom_cuda_rows_gather);
    o.rows_scatter_add = G(loom_cuda_rows_scatter_add);
    o.rows_dot = G(loom_cuda_rows_dot);
    o.rmsnorm_forward = G(loom_cuda_rmsnorm_forward);
    o.rmsnorm_backward = G(loom_cuda_rmsnorm_backward);
    o.swiglu_forward = G(loom_cuda_swiglu_forward);
    o.swiglu_backward = G(loom_cuda_swiglu_backward);
    o.rope_forward = G(loom_cuda_rope_forward);
    o.rope_backward = G(loom_cuda_rope_backward);
    o.attention_gqa_forward = G(loom_cuda_attention_gqa_forward);
    o.attention_gqa_backward = G(loom_cuda_attention_gqa_backward);
    o.attention_gqa_decode = G(loom_cuda_attention_gqa_decode);
    o.convert_from_f32 = G(loom_cuda_convert_from_f32);
    o.convert_to_f32 = G(loom_cuda_convert_to_f32);
    o.round_to = G(loom_cuda_round_to);
    o.adamw_update = G(loom_cuda_adamw_update);
    o.sgd_update = G(loom_cuda_sgd_update);
    o.matmul_forward_dt = G(loom_cuda_matmul_forward_dt);
    o.gemm_w16 = G(loom_cuda_gemm_w16);
    o.matmul_backward_dt = G(loom_cuda_matmul_backward_dt);
    o.attention_flash_forward = G(loom_cuda_flash_attention_forward);
    o.attention_flash_backward = G(loom_cuda_flash_attention_backward);
    o.attention_forward_dt = G(loom_cuda_attention_forward_dt);
    o.attention_backward_dt = G(loom_cuda_attention_backward_dt);
    o.attention_flash_gqa_forward = G(loom_cuda_flash_attention_gqa_forward);
    o.attention_flash_gqa_backward = G(loom_cuda_flash_attention_gqa_backward);
    o.attention_gqa_forward_dt = G(loom_cuda_attention_gqa_forward_dt);
    o.attention_gqa_backward_dt = G(loom_cuda_attention_gqa_backward_dt);
    o.kd_rows = G(loom_cuda_kd_rows);
    o.attention_backward_datt = G(loom_cuda_attention_backward_datt);
    o.attention_sizes = loom_cuda_attention_sizes;
    o.attention_allow_fused = loom_cuda_attention_allow_fused;
    return o;
}

static const loom_backend_ops emu_ops = make_ops();

static const loom_plugin_desc emu_desc = {
    LOOM_PLUGIN_ABI, sizeof(loom_plugin_desc), LOOM_KIND_BACKEND, "cudaemu", "0.1.0",
    "test-only: the CUDA backend's kernels emulated on the CPU", NULL, 0, NULL, &emu_ops,
};

extern "C" LOOM_PLUGIN_EXPORT const loom_plugin_desc *loom_plugin_entry(void)
{
    return &emu_desc;
}
