/* flash_attention_tc.cu — flash_attention.cu's fused causal attention on the tensor cores,
 * for 16-bit q, k, v (bf16, fp16) with heads of 16, 32, 48 or 64 values: the products
 * through the WMMA API (nvcuda::wmma, 16x16x16 tiles, 16-bit operands, fp32 accumulators),
 * softmax and its statistics in fp32. Same contract as flash_attention.cu's 16-bit kernels
 * (backend.h attention_flash_forward / _backward: out, lse (B,NH,T) and, for backward,
 * dsum = dO . O in scratch, computed there before these run); flash_attention.cu sends
 * these shapes here (flash_tc_takes).
 *
 * Forward, per block 64 query rows (4 warps x 16), key tiles of 32 up to the block's last
 * query: S = Q K^T (wmma, Q's fragments held for the whole loop) into shared fp32; one
 * thread per row then masks (keys past the row), takes the tile's max, rescales its running
 * sum and its output row (both in shared memory: a fragment's element layout is unknown, so
 * no per-row operation touches a fragment), and writes P = exp(s - m) rounded to the 16-bit
 * dtype into shared, the running sum adding the rounded values (what P V multiplies); then
 * O += P V (wmma, O loaded from and stored back to shared). Each row's log-sum-exp as the
 * scalar kernels save it.
 *
 * Backward, FlashAttention-2's two passes (Dao 2023), both deterministic: every output tile
 * is one warp's chain of mma_sync calls in a fixed order (query tiles ascending for dK, dV;
 * key tiles ascending for dQ), no atomics, so the same inputs give the same bits every run.
 * The dk/dv pass: 64 keys a block, K and V fragments held, over query tiles of 32 from the
 * block's first key: S^T = K Q^T and dP^T = V dO^T (wmma) into shared, then
 * P = exp(scale s - lse), dS = P (dP - dsum) (fp32, masked), both rounded to the dtype,
 * dV += P^T dO and dK += dS^T Q (wmma, accumulators held in fragments: no rescale is needed).
 * The dq pass: 64 queries a block, Q and dO fragments held, key tiles up to the block's last
 * query, dQ += dS K. dO is rounded to the dtype once staged (FlashAttention-2's policy: every
 * product's operands 16-bit), as are P and dS: so the gradients carry 16-bit rounding of
 * those, which the scalar kernels (fp32 dO, P, dS) do not. dO is first scaled by a power of
 * two per sequence-head (tc_dout_scale), so that fp16 keeps small gradients' bits.
 *
 * Grouped-query attention (attention_flash_gqa_*: KVH kv heads, qkv rows C + 2 KVH hs wide):
 * the forward and dq blocks of q head h read kv head h / rep; a dk/dv block belongs to one kv
 * head and runs its rep query heads one after another (in order) through the same
 * accumulators, dO scaled by one power of two over those heads. With KVH = NH every index is
 * the multi-head one.
 *
 * Shared memory stays under the 48 KiB of a static allocation (at most 41 KiB, forward):
 * the score tiles double as the staging area of what is loaded into fragments once.
 * Row pitches are padded (16-bit rows by 8 values, fp32 rows by 4) against bank conflicts,
 * keeping every fragment's address 32-byte aligned as load/store_matrix_sync require.
 *
 * Never run on a GPU: checked in tests/cuda/emu, whose wmma_emu.h holds each fragment whole
 * in every thread (docs/CUDA.md).
 */
#include "flash_attention_tc.h"

#include <stdio.h>

#include "kernels.cuh"
#include "widen16.cuh"

#ifdef LOOM_CUDA_EMU
#include "wmma_emu.h"
template <typename E> struct tc_mma {
    typedef E type; /* the emulation's wmma takes widen16.cuh's types */
};
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
template <typename E> struct tc_mma;
template <> struct tc_mma<loom_bf16> {
    typedef __nv_bfloat16 type;
};
template <> struct tc_mma<loom_f16> {
    typedef __half type;
};
#endif

using namespace nvcuda;

enum {
    TC_ROWS = 64,           /* a block's rows: 4 warps x 16 */
    TC_THREADS = 128,
    TC_TILE = 32,           /* the other side's rows per step */
    TC_HS = 64,             /* the widest head */
    TC_LD16 = TC_HS + 8,    /* pitch of a 16-bit (rows, hs) tile */
    TC_LDS = TC_TILE + 4,   /* pitch of an fp32 (64, 32) score tile */
    TC_LDP = TC_TILE + 8,   /* pitch of a 16-bit (64, 32) probability tile */
    TC_LDO = TC_HS + 4      /* pitch of an fp32 (64, hs) output tile */
};

/* for (i < n) over a head's 16-column slices, n <= TC_HS / 16: unrolled to the widest head
 * so that fragment arrays are indexed by constants (registers, not local memory). */
#define TC_FOR_HEAD(i, n) _Pragma("unroll") for (int i = 0; i < TC_HS / 16; i++) if (i < (n))

/* KVH key/value heads (grouped-query attention; KVH = NH: multi-head), rep = NH / KVH query
 * heads to each, qkv rows W = C + 2 KVH hs wide: q (C), k, v (KVH hs each). */
struct tc_shape {
    int B, T, C, NH, KVH, rep, W, hs;
    float scale;
};

/* Where a head starts in a qkv row: q head h, k and v of kv head g. */
__device__ inline int tc_qcol(const tc_shape &s, int h) { return h * s.hs; }
__device__ inline int tc_kcol(const tc_shape &s, int g) { return s.C + g * s.hs; }
__device__ inline int tc_vcol(const tc_shape &s, int g) { return s.C + (s.KVH + g) * s.hs; }

template <typename E> using tc_a = wmma::fragment<wmma::matrix_a, 16, 16, 16, typename tc_mma<E>::type, wmma::row_major>;
template <typename E, typename L> using tc_b = wmma::fragment<wmma::matrix_b, 16, 16, 16, typename tc_mma<E>::type, L>;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> tc_acc;

__device__ inline uint16_t tc_round(float f, const loom_bf16 *) { return bf16_from_f32(f); }
__device__ inline uint16_t tc_round(float f, const loom_f16 *) { return f16_from_f32(f); }
__device__ inline float tc_widen(uint16_t u, const loom_bf16 *) { return bf16_to_f32(u); }
__device__ inline float tc_widen(uint16_t u, const loom_f16 *) { return f16_to_f32(u); }

/* A 16-bit shared tile as the wmma element type. */
template <typename E> __device__ inline const typename tc_mma<E>::type *tc_m(const uint16_t *p)
{
    return (const typename tc_mma<E>::type *)p;
}

/* The block's threads: dst[r * TC_LD16 + c] = the head at column col (tc_qcol, _kcol, _vcol)
 * of qkv row r0 + r, c < hs, as stored (zeros past T). */
template <typename E>
__device__ inline void tc_stage(uint16_t *dst, const E *qkv, const tc_shape &s, int b, int col,
                                int r0, int rows)
{
    for (int i = threadIdx.x; i < rows * s.hs; i += blockDim.x) {
        const int r = i / s.hs, c = i % s.hs, j = r0 + r;
        dst[r * TC_LD16 + c] =
            j < s.T ? qkv[((size_t)b * s.T + j) * s.W + (size_t)col + c].bits : (uint16_t)0;
    }
}

/* As tc_stage for dout (B,T,C) fp32 times sc (a power of two), rounded to E. */
template <typename E>
__device__ inline void tc_stage_dout(uint16_t *dst, const float *dout, float sc, const tc_shape &s,
                                     int b, int h, int r0, int rows)
{
    for (int i = threadIdx.x; i < rows * s.hs; i += blockDim.x) {
        const int r = i / s.hs, c = i % s.hs, j = r0 + r;
        dst[r * TC_LD16 + c] =
            j < s.T ? tc_round(sc * dout[((size_t)b * s.T + j) * s.C + (size_t)h * s.hs + c],
                               (const E *)0)
                    : (uint16_t)0;
    }
}

/* The power of two that brings the largest |dO| of heads h0 .. h0+n-1 into [0.5, 1) (1 where
 * it is 0 or not finite), the same in every block of a pass (a max: no order). The dq pass
 * takes one head; the dk/dv pass the rep query heads of its kv head, whose sums share one
 * scale (with rep = 1 the same as dq's). Every gradient is
 * linear in dO (dS through dP and dsum = dO . O too), so scaling dO before its rounding and
 * the results back after (exact, powers of two) changes nothing but where dO's 16 bits
 * land: fp16 would flush a small gradient's values (below 6e-5, subnormal; below 6e-8,
 * zero) without it. */
__device__ inline float tc_dout_scale(const float *dout, const tc_shape &s, int b, int h0, int n)
{
    float m = 0.0f;
    const int w = n * s.hs;
    for (int i = threadIdx.x; i < s.T * w; i += blockDim.x)
        m = fmaxf(m, fabsf(dout[((size_t)b * s.T + i / w) * s.C + (size_t)h0 * s.hs + i % w]));
    m = loom_block_max(m);
    int e = 0;
    frexpf(m, &e);
    return m > 0.0f && m <= 3.4e38f ? ldexpf(1.0f, -e) : 1.0f;
}

/* dst[r][n*16..] (r: the warp's 16 rows, n over the tile's two 16-column halves) =
 * A (the warp's fragments, hs wide) B^T, B the 32 rows of bt (a 16-bit tile, pitch LD16). */
template <typename E>
__device__ inline void tc_rows_by_tile(float *dst, const tc_a<E> *a, const uint16_t *bt, int nk)
{
    for (int n = 0; n < TC_TILE / 16; n++) {
        tc_acc f;
        wmma::fill_fragment(f, 0.0f);
        TC_FOR_HEAD(kk, nk) {
            tc_b<E, wmma::col_major> kf;
            wmma::load_matrix_sync(kf, tc_m<E>(bt + n * 16 * TC_LD16 + kk * 16), TC_LD16);
            wmma::mma_sync(f, a[kk], kf, f);
        }
        wmma::store_matrix_sync(dst + n * 16, f, TC_LDS, wmma::mem_row_major);
    }
}

/* acc += P (the warp's 16 rows of a 16-bit (64, 32) tile, pitch LDP) X (32 rows, 16 columns
 * from column c*16 of a 16-bit tile, pitch LD16). */
template <typename E>
__device__ inline void tc_acc_tile(tc_acc &acc, const uint16_t *p, const uint16_t *x, int c)
{
    for (int n = 0; n < TC_TILE / 16; n++) {
        tc_a<E> pf;
        tc_b<E, wmma::row_major> xf;
        wmma::load_matrix_sync(pf, tc_m<E>(p + n * 16), TC_LDP);
        wmma::load_matrix_sync(xf, tc_m<E>(x + n * 16 * TC_LD16 + c * 16), TC_LD16);
        wmma::mma_sync(acc, pf, xf, acc);
    }
}

template <typename E>
__global__ void fa_tc_forward_kernel(float *out, float *lse, const E *qkv, tc_shape s)
{
    __shared__ __align__(32) float sc[TC_ROWS * TC_LDS]; /* scores; first Q's staging */
    __shared__ __align__(32) uint16_t ks[TC_TILE * TC_LD16], vs[TC_TILE * TC_LD16];
    __shared__ __align__(32) uint16_t ps[TC_ROWS * TC_LDP];
    __shared__ __align__(32) float os[TC_ROWS * TC_LDO];
    __shared__ float rm[TC_ROWS], rl[TC_ROWS];
    const int bh = blockIdx.y, b = bh / s.NH, h = bh % s.NH, g = h / s.rep;
    const int t0 = blockIdx.x * TC_ROWS, w = threadIdx.x / 32, nk = s.hs / 16;
    const int last = t0 + TC_ROWS - 1 < s.T - 1 ? t0 + TC_ROWS - 1 : s.T - 1;
    uint16_t *qs = (uint16_t *)sc;
    tc_stage(qs, qkv, s, b, tc_qcol(s, h), t0, TC_ROWS);
    for (int i = threadIdx.x; i < TC_ROWS * TC_LDO; i += blockDim.x)
        os[i] = 0.0f;
    for (int r = threadIdx.x; r < TC_ROWS; r += blockDim.x)
        rm[r] = -INFINITY, rl[r] = 0.0f;
    __syncthreads();
    tc_a<E> qf[TC_HS / 16];
    TC_FOR_HEAD(kk, nk)
        wmma::load_matrix_sync(qf[kk], tc_m<E>(qs + w * 16 * TC_LD16 + kk * 16), TC_LD16);
    for (int k0 = 0; k0 <= last; k0 += TC_TILE) {
        __syncthreads(); /* the previous tile's readers (and Q's staging) are done */
        tc_stage(ks, qkv, s, b, tc_kcol(s, g), k0, TC_TILE);
        tc_stage(vs, qkv, s, b, tc_vcol(s, g), k0, TC_TILE);
        __syncthreads();
        tc_rows_by_tile<E>(sc + w * 16 * TC_LDS, qf, ks, nk);
        __syncthreads();
        if (threadIdx.x < TC_ROWS) { /* the online softmax of row r over this tile */
            const int r = threadIdx.x, t = t0 + r;
            const float *sr = sc + r * TC_LDS;
            uint16_t *pr = ps + r * TC_LDP;
            const int n = t < s.T ? (t - k0 + 1 < TC_TILE ? t - k0 + 1 : TC_TILE) : 0;
            float mt = -INFINITY;
            for (int j = 0; j < n; j++)
                mt = fmaxf(mt, s.scale * sr[j]);
            const float m = rm[r], mn = fmaxf(m, mt);
            const float corr = mn == -INFINITY ? 1.0f : expf(m - mn); /* first: m = -inf, 0 */
            float l = rl[r] * corr;
            for (int j = 0; j < TC_TILE; j++) {
                const uint16_t p = tc_round(j < n ? expf(s.scale * sr[j] - mn) : 0.0f, (const E *)0);
                pr[j] = p;
                l += tc_widen(p, (const E *)0);
            }
            rm[r] = mn, rl[r] = l;
            for (int c = 0; c < s.hs; c++)
                os[r * TC_LDO + c] *= corr;
        }
        __syncthreads();
        TC_FOR_HEAD(c, nk) {
            tc_acc of;
            float *o = os + w * 16 * TC_LDO + c * 16;
            wmma::load_matrix_sync(of, o, TC_LDO, wmma::mem_row_major);
            tc_acc_tile<E>(of, ps + w * 16 * TC_LDP, vs, c);
            wmma::store_matrix_sync(o, of, TC_LDO, wmma::mem_row_major);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < TC_ROWS * s.hs; i += blockDim.x) {
        const int r = i / s.hs, c = i % s.hs, t = t0 + r;
        if (t < s.T)
            out[((size_t)b * s.T + t) * s.C + (size_t)h * s.hs + c] = os[r * TC_LDO + c] / rl[r];
    }
    for (int r = threadIdx.x; r < TC_ROWS; r += blockDim.x)
        if (t0 + r < s.T)
            lse[(size_t)bh * s.T + t0 + r] = rm[r] + logf(rl[r]);
}

/* dqkv rows r0.. at column col (tc_qcol: dq, _kcol: dk, _vcol: dv) = scale * (unscale * the
 * (64, hs) fp32 tile at st, pitch LDO), rows past T skipped; unscale undoes tc_dout_scale
 * (exact). */
__device__ inline void tc_write_grad(float *dqkv, const float *st, float scale, float unscale,
                                     const tc_shape &s, int b, int col, int r0)
{
    for (int i = threadIdx.x; i < TC_ROWS * s.hs; i += blockDim.x) {
        const int r = i / s.hs, c = i % s.hs, j = r0 + r;
        if (j < s.T)
            dqkv[((size_t)b * s.T + j) * s.W + (size_t)col + c] = scale * (unscale * st[r * TC_LDO + c]);
    }
}

/* dq pass: block = 64 queries; dq_t = scale sum_j dS_tj k_j over key tiles in order. */
template <typename E>
__global__ void fa_tc_dq_kernel(float *dqkv, const float *dout, const E *qkv, const float *lse,
                                const float *dsum, tc_shape s)
{
    __shared__ __align__(32) float work[2 * TC_ROWS * TC_LDS]; /* S, dP; staging first, dQ last */
    __shared__ __align__(32) uint16_t ks[TC_TILE * TC_LD16], vs[TC_TILE * TC_LD16];
    __shared__ __align__(32) uint16_t dss[TC_ROWS * TC_LDP];
    __shared__ float ls[TC_ROWS], dsm[TC_ROWS];
    const int bh = blockIdx.y, b = bh / s.NH, h = bh % s.NH, g = h / s.rep;
    const int t0 = blockIdx.x * TC_ROWS, w = threadIdx.x / 32, nk = s.hs / 16;
    const int last = t0 + TC_ROWS - 1 < s.T - 1 ? t0 + TC_ROWS - 1 : s.T - 1;
    float *sc = work, *dp = work + TC_ROWS * TC_LDS;
    uint16_t *qst = (uint16_t *)work, *gst = qst + TC_ROWS * TC_LD16;
    const float dsc = tc_dout_scale(dout, s, b, h, 1);
    tc_stage(qst, qkv, s, b, tc_qcol(s, h), t0, TC_ROWS);
    tc_stage_dout<E>(gst, dout, dsc, s, b, h, t0, TC_ROWS);
    for (int r = threadIdx.x; r < TC_ROWS; r += blockDim.x) {
        const int t = t0 + r;
        ls[r] = t < s.T ? lse[(size_t)bh * s.T + t] : 0.0f;
        dsm[r] = t < s.T ? dsc * dsum[(size_t)bh * s.T + t] : 0.0f;
    }
    __syncthreads();
    tc_a<E> qf[TC_HS / 16], gf[TC_HS / 16];
    tc_acc dqf[TC_HS / 16];
    TC_FOR_HEAD(kk, nk) {
        wmma::load_matrix_sync(qf[kk], tc_m<E>(qst + w * 16 * TC_LD16 + kk * 16), TC_LD16);
        wmma::load_matrix_sync(gf[kk], tc_m<E>(gst + w * 16 * TC_LD16 + kk * 16), TC_LD16);
        wmma::fill_fragment(dqf[kk], 0.0f);
    }
    for (int k0 = 0; k0 <= last; k0 += TC_TILE) {
        __syncthreads();
        tc_stage(ks, qkv, s, b, tc_kcol(s, g), k0, TC_TILE);
        tc_stage(vs, qkv, s, b, tc_vcol(s, g), k0, TC_TILE);
        __syncthreads();
        tc_rows_by_tile<E>(sc + w * 16 * TC_LDS, qf, ks, nk); /* S = Q K^T */
        tc_rows_by_tile<E>(dp + w * 16 * TC_LDS, gf, vs, nk); /* dP = dO V^T */
        __syncthreads();
        for (int i = threadIdx.x; i < TC_ROWS * TC_TILE; i += blockDim.x) {
            const int r = i / TC_TILE, q = i % TC_TILE, t = t0 + r, j = k0 + q;
            float ds = 0.0f;
            if (t < s.T && j <= t) {
                const float p = expf(s.scale * sc[r * TC_LDS + q] - ls[r]);
                ds = p * (dp[r * TC_LDS + q] - dsm[r]);
            }
            dss[r * TC_LDP + q] = tc_round(ds, (const E *)0);
        }
        __syncthreads();
        TC_FOR_HEAD(c, nk)
            tc_acc_tile<E>(dqf[c], dss + w * 16 * TC_LDP, ks, c);
    }
    __syncthreads();
    TC_FOR_HEAD(c, nk)
        wmma::store_matrix_sync(work + w * 16 * TC_LDO + c * 16, dqf[c], TC_LDO,
                                wmma::mem_row_major);
    __syncthreads();
    tc_write_grad(dqkv, work, s.scale, 1.0f / dsc, s, b, tc_qcol(s, h), t0);
}

/* dk/dv pass: block = 64 keys of kv head g; for each of its query heads h = g rep + r, r in
 * order, over query tiles i0 >= the block's first key, in order, dv_j += P_ij dO_i,
 * dk_j += dS_ij q_i (the rep heads' sums in one fragment chain: fixed bits, no atomics);
 * dk scaled at the end. */
template <typename E>
__global__ void fa_tc_dkv_kernel(float *dqkv, const float *dout, const E *qkv, const float *lse,
                                 const float *dsum, tc_shape s)
{
    __shared__ __align__(32) float work[2 * TC_ROWS * TC_LDS]; /* S^T, dP^T; staging; dK, dV */
    __shared__ __align__(32) uint16_t qs[TC_TILE * TC_LD16], gs[TC_TILE * TC_LD16];
    __shared__ __align__(32) uint16_t pt[TC_ROWS * TC_LDP], dst[TC_ROWS * TC_LDP];
    __shared__ float ls[TC_TILE], dsm[TC_TILE];
    const int bg = blockIdx.y, b = bg / s.KVH, g = bg % s.KVH, j0 = blockIdx.x * TC_ROWS;
    const int w = threadIdx.x / 32, nk = s.hs / 16;
    float *st = work, *dpt = work + TC_ROWS * TC_LDS;
    uint16_t *kst = (uint16_t *)work, *vst = kst + TC_ROWS * TC_LD16;
    const float dsc = tc_dout_scale(dout, s, b, g * s.rep, s.rep);
    tc_stage(kst, qkv, s, b, tc_kcol(s, g), j0, TC_ROWS);
    tc_stage(vst, qkv, s, b, tc_vcol(s, g), j0, TC_ROWS);
    __syncthreads();
    tc_a<E> kf[TC_HS / 16], vf[TC_HS / 16];
    tc_acc dkf[TC_HS / 16], dvf[TC_HS / 16];
    TC_FOR_HEAD(kk, nk) {
        wmma::load_matrix_sync(kf[kk], tc_m<E>(kst + w * 16 * TC_LD16 + kk * 16), TC_LD16);
        wmma::load_matrix_sync(vf[kk], tc_m<E>(vst + w * 16 * TC_LD16 + kk * 16), TC_LD16);
        wmma::fill_fragment(dkf[kk], 0.0f);
        wmma::fill_fragment(dvf[kk], 0.0f);
    }
    for (int h = g * s.rep; h < (g + 1) * s.rep; h++) {
        const size_t bh = (size_t)b * s.NH + h;
        for (int i0 = j0; i0 < s.T; i0 += TC_TILE) { /* queries before j0 see none of these keys */
            __syncthreads();
            tc_stage(qs, qkv, s, b, tc_qcol(s, h), i0, TC_TILE);
            tc_stage_dout<E>(gs, dout, dsc, s, b, h, i0, TC_TILE);
            for (int q = threadIdx.x; q < TC_TILE; q += blockDim.x) {
                const int i = i0 + q;
                ls[q] = i < s.T ? lse[bh * s.T + i] : 0.0f;
                dsm[q] = i < s.T ? dsc * dsum[bh * s.T + i] : 0.0f;
            }
            __syncthreads();
            tc_rows_by_tile<E>(st + w * 16 * TC_LDS, kf, qs, nk);  /* S^T = K Q^T */
            tc_rows_by_tile<E>(dpt + w * 16 * TC_LDS, vf, gs, nk); /* dP^T = V dO^T */
            __syncthreads();
            for (int i = threadIdx.x; i < TC_ROWS * TC_TILE; i += blockDim.x) {
                const int r = i / TC_TILE, q = i % TC_TILE, j = j0 + r, t = i0 + q;
                float p = 0.0f, ds = 0.0f;
                if (t < s.T && t >= j) {
                    p = expf(s.scale * st[r * TC_LDS + q] - ls[q]);
                    ds = p * (dpt[r * TC_LDS + q] - dsm[q]);
                }
                pt[r * TC_LDP + q] = tc_round(p, (const E *)0);
                dst[r * TC_LDP + q] = tc_round(ds, (const E *)0);
            }
            __syncthreads();
            TC_FOR_HEAD(c, nk) {
                tc_acc_tile<E>(dvf[c], pt + w * 16 * TC_LDP, gs, c);
                tc_acc_tile<E>(dkf[c], dst + w * 16 * TC_LDP, qs, c);
            }
        }
    }
    for (int part = 1; part <= 2; part++) {
        __syncthreads();
        TC_FOR_HEAD(c, nk)
            wmma::store_matrix_sync(work + w * 16 * TC_LDO + c * 16, part == 1 ? dkf[c] : dvf[c],
                                    TC_LDO, wmma::mem_row_major);
        __syncthreads();
        tc_write_grad(dqkv, work, part == 1 ? s.scale : 1.0f, 1.0f / dsc, s, b,
                      part == 1 ? tc_kcol(s, g) : tc_vcol(s, g), j0);
    }
}

static_assert((int)TC_HS == (int)LOOM_CUDA_FLASH_TC_MAX_HS, "loom/plugin/cuda_attention.h's widest head");

int loom_cuda_flash_tc_takes(int C, int NH, loom_dtype dt)
{
    const loom_cuda_attention_mode mo = loom_cuda_attention_mode_now();
    return loom_cuda_attention_tc(&mo, C, NH, dt);
}

static tc_shape tc_shape_of(int B, int T, int C, int NH, int KVH)
{
    const int hs = C / NH;
    return tc_shape{B, T, C, NH, KVH, NH / KVH, C + 2 * KVH * hs, hs, 1.0f / sqrtf((float)hs)};
}

void loom_cuda_flash_tc_forward(float *out, float *lse, const void *qkv, int B, int T, int C,
                                int NH, int KVH, loom_dtype dt)
{
    const tc_shape s = tc_shape_of(B, T, C, NH, KVH);
    dim3 grid((unsigned)((T + TC_ROWS - 1) / TC_ROWS), (unsigned)(B * NH));
    if (dt == LOOM_DTYPE_BF16)
        LOOM_CUDA_LAUNCH("attention_flash_forward (tensor cores)", fa_tc_forward_kernel<loom_bf16>,
                         grid, TC_THREADS, 0, out, lse, (const loom_bf16 *)qkv, s);
    else
        LOOM_CUDA_LAUNCH("attention_flash_forward (tensor cores)", fa_tc_forward_kernel<loom_f16>,
                         grid, TC_THREADS, 0, out, lse, (const loom_f16 *)qkv, s);
}

template <typename E>
static void tc_backward(float *dqkv, const float *dout, const E *qkv, const float *lse,
                        const float *dsum, const tc_shape &s)
{
    const unsigned tiles = (unsigned)((s.T + TC_ROWS - 1) / TC_ROWS);
    LOOM_CUDA_LAUNCH("attention_flash_backward (tensor cores: dq)", fa_tc_dq_kernel<E>,
                     dim3(tiles, (unsigned)(s.B * s.NH)), TC_THREADS, 0, dqkv, dout, qkv, lse,
                     dsum, s);
    LOOM_CUDA_LAUNCH("attention_flash_backward (tensor cores: dk, dv)", fa_tc_dkv_kernel<E>,
                     dim3(tiles, (unsigned)(s.B * s.KVH)), TC_THREADS, 0, dqkv, dout, qkv, lse,
                     dsum, s);
}

void loom_cuda_flash_tc_backward(float *dqkv, const float *dout, const void *qkv,
                                 const float *lse, const float *dsum, int B, int T, int C, int NH,
                                 int KVH, loom_dtype dt)
{
    const tc_shape s = tc_shape_of(B, T, C, NH, KVH);
    if (dt == LOOM_DTYPE_BF16)
        tc_backward(dqkv, dout, (const loom_bf16 *)qkv, lse, dsum, s);
    else
        tc_backward(dqkv, dout, (const loom_f16 *)qkv, lse, dsum, s);
}
