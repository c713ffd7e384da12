/* scatter_sorted.cu — a row-parallel scatter-add with the CPU's bits: dst[key(i)] += s_i *
 * src[i] where rows sharing a destination add in increasing i, each onto the running value
 * (kernels/cpu/encoder.c's embedding backward, kernels/cpu/rows.c's scatter-add). Shared by
 * encoder.cu (the token-embedding backward) and rows.cu (the MoE scatter-add).
 *
 * The rows are first sorted stably by destination on the device: an LSD radix sort, 8 bits
 * a pass, each pass a counting sort over tiles of SORT_TILE rows — a tile's histogram and
 * each row's rank among the earlier rows of its tile with the same digit come from
 * comparisons in shared memory (no atomics, so nothing depends on thread timing), one
 * exclusive scan of the (digit, tile) counts in digit-major order gives every (digit, tile)
 * its first slot, and row i goes to slot + rank. Stable per pass, so stable overall: within
 * a destination the rows stay in increasing i. Then one thread per (destination, column)
 * — the first sorted position of each destination — walks that destination's rows in
 * order: s = __fadd_rn(s, __fmul_rn(scale, x)) from the destination's current value, the
 * CPU's two roundings (no contraction). A destination's rows are still summed by one
 * thread (the order is the contract), so one destination holding all rows is as slow as
 * the column walk; every other case spreads over destinations x columns.
 *
 * Scratch: the backend's workspace (pool), 5 n + 256 ceil(n / 256) ints. Short row lists
 * keep the column walk (both give the same bits; tests/cuda/test_cuda_ops.c checks it):
 * below SORTED_MIN_ROWS the sort's 8-14 launches should cost more than the walk's n steps
 * (a guess: never timed on a GPU). LOOM_CUDA_SCATTER=walk or =sort forces one path (the
 * tests and bench_cuda_scatter compare them).
 */
#include "kernels.cuh"

enum { SORT_TILE = 256, SORT_RADIX = 256, SCAN_THREADS = 1024, SORTED_MIN_ROWS = 64 };

/* key[i] = the destination, or `skip` (a row that adds nowhere: a token outside the
 * vocabulary slice); ord[i] = i. */
__global__ void sort_keys_kernel(int *key, int *ord, const int *idx, int offset, int limit,
                                 int skip, size_t n)
{
    GRID_STRIDE(i, n)
    {
        const int v = idx[i] - offset;
        key[i] = v >= 0 && v < limit ? v : skip;
        ord[i] = (int)i;
    }
}

/* One block per tile (SORT_TILE = SORT_RADIX threads): thread j counts digit j over the
 * tile (cnt[j * tiles + tile]) and finds its row's rank among the tile's earlier rows with
 * its digit. Rows past n carry the digit SORT_RADIX, counted nowhere. */
__global__ void digit_count_kernel(int *cnt, int *rank, const int *key, size_t n, int shift,
                                   size_t tiles)
{
    __shared__ int dig[SORT_TILE];
    const int j = threadIdx.x;
    const size_t tile = blockIdx.x, i = tile * SORT_TILE + j;
    dig[j] = i < n ? (key[i] >> shift) & (SORT_RADIX - 1) : SORT_RADIX;
    __syncthreads();
    const int d = dig[j];
    int before = 0, count = 0;
    for (int k = 0; k < SORT_TILE; k++) {
        before += k < j && dig[k] == d;
        count += dig[k] == j;
    }
    if (i < n)
        rank[i] = before;
    cnt[(size_t)j * tiles + tile] = count;
}

/* Exclusive prefix sum of x[0, m) in place, one block of SCAN_THREADS: each thread sums a
 * contiguous chunk, the chunk sums are scanned in shared memory, then each chunk rewritten.
 * Integers: the order does not change the result. */
__global__ void exclusive_scan_kernel(int *x, size_t m)
{
    __shared__ int part[SCAN_THREADS];
    const int t = threadIdx.x;
    const size_t per = (m + SCAN_THREADS - 1) / SCAN_THREADS;
    const size_t a = t * per < m ? t * per : m, b = a + per < m ? a + per : m;
    int s = 0;
    for (size_t k = a; k < b; k++)
        s += x[k];
    part[t] = s;
    __syncthreads();
    for (int o = 1; o < SCAN_THREADS; o <<= 1) { /* Hillis-Steele, inclusive */
        const int add = t >= o ? part[t - o] : 0;
        __syncthreads();
        part[t] += add;
        __syncthreads();
    }
    int run = part[t] - s; /* exclusive */
    for (size_t k = a; k < b; k++) {
        const int c = x[k];
        x[k] = run;
        run += c;
    }
}

/* Row i to its slot: its (digit, tile)'s first slot plus its rank in the tile. */
__global__ void digit_scatter_kernel(int *key_out, int *ord_out, const int *key,
                                     const int *ord, const int *cnt, const int *rank,
                                     size_t n, int shift, size_t tiles)
{
    GRID_STRIDE(i, n)
    {
        const int d = (key[i] >> shift) & (SORT_RADIX - 1);
        const size_t pos = (size_t)cnt[(size_t)d * tiles + i / SORT_TILE] + rank[i];
        key_out[pos] = key[i];
        ord_out[pos] = ord[i];
    }
}

/* One thread per (sorted position p, column c); only the first position of a destination
 * works: it adds that destination's rows, in increasing row index, onto dst's value. */
__global__ void sorted_sum_kernel(float *dst, const float *src, const float *scale,
                                  const int *key, const int *ord, int skip, size_t n, int C)
{
    GRID_STRIDE(g, n * (size_t)C)
    {
        const size_t p = g / C, c = g % C;
        const int k = key[p];
        if (k == skip || (p > 0 && key[p - 1] == k))
            continue;
        float *out = dst + (size_t)k * C + c;
        float s = *out;
        for (size_t q = p; q < n && key[q] == k; q++) {
            const size_t r = (size_t)ord[q];
            const float x = src[r * C + c];
            s = __fadd_rn(s, scale ? __fmul_rn(scale[r], x) : x);
        }
        *out = s;
    }
}

/* The column walk (the first kernels' way): one thread per column, the rows in i order. */
__global__ void walk_sum_kernel(float *dst, const float *src, const float *scale,
                                const int *idx, int offset, int limit, size_t n, int C)
{
    GRID_STRIDE(c, (size_t)C)
    {
        for (size_t i = 0; i < n; i++) {
            const int v = idx[i] - offset;
            if (v < 0 || v >= limit)
                continue;
            float *out = dst + (size_t)v * C + c;
            const float x = src[i * C + c];
            *out = __fadd_rn(*out, scale ? __fmul_rn(scale[i], x) : x);
        }
    }
}

/* 1: sort, 0: walk, for n rows (LOOM_CUDA_SCATTER overrides; create refused another value,
 * so one set later is an error here). */
static int use_sort(size_t n)
{
    const int e = loom_cuda_scatter_env();
    if (e < 0)
        loom_cuda_note_error("LOOM_CUDA_SCATTER", "must be 'walk' or 'sort' (or unset: by size)");
    return e == 2 || (e <= 0 && n >= SORTED_MIN_ROWS);
}

extern "C" void loom_cuda_scatter_add_rows(float *dst, const float *src, const int *idx,
                                           int offset, int limit, const float *scale, size_t n,
                                           int C)
{
    if (n == 0 || C <= 0 || limit <= 0)
        return;
    if (!use_sort(n) || n > (size_t)0x7fffffff) {
        LOOM_CUDA_LAUNCH("scatter_add (walk)", walk_sum_kernel, loom_cuda_blocks((size_t)C),
                         LOOM_CUDA_THREADS, 0, dst, src, scale, idx, offset, limit, n, C);
        return;
    }
    /* keys in [0, limit]: limit itself marks a row that adds nowhere */
    const int skip = limit;
    int bits = 0;
    while (bits < 31 && (skip >> bits) != 0)
        bits++;
    const size_t tiles = (n + SORT_TILE - 1) / SORT_TILE, m = (size_t)SORT_RADIX * tiles;
    int *key = (int *)loom_cuda_workspace((5 * n + m) * sizeof(int));
    if (!key)
        return; /* the sticky error says why */
    int *ord = key + n, *key2 = ord + n, *ord2 = key2 + n, *rank = ord2 + n, *cnt = rank + n;
    LOOM_CUDA_LAUNCH("scatter_add (keys)", sort_keys_kernel, loom_cuda_blocks(n),
                     LOOM_CUDA_THREADS, 0, key, ord, idx, offset, limit, skip, n);
    for (int shift = 0; shift < bits; shift += 8) {
        LOOM_CUDA_LAUNCH("scatter_add (count)", digit_count_kernel, (unsigned)tiles, SORT_TILE,
                         0, cnt, rank, key, n, shift, tiles);
        LOOM_CUDA_LAUNCH("scatter_add (scan)", exclusive_scan_kernel, 1, SCAN_THREADS, 0, cnt,
                         m);
        LOOM_CUDA_LAUNCH("scatter_add (place)", digit_scatter_kernel, loom_cuda_blocks(n),
                         LOOM_CUDA_THREADS, 0, key2, ord2, key, ord, cnt, rank, n, shift,
                         tiles);
        int *t = key;
        key = key2, key2 = t;
        t = ord, ord = ord2, ord2 = t;
    }
    LOOM_CUDA_LAUNCH("scatter_add (sum)", sorted_sum_kernel, loom_cuda_blocks(n * (size_t)C),
                     LOOM_CUDA_THREADS, 0, dst, src, scale, key, ord, skip, n, C);
}
