/* wmma_emu.h (emulation) — CUDA's warp matrix API (mma.h's nvcuda::wmma) for tests/cuda/emu,
 * the 16x16x16 shape only, over the 16-bit types of widen16.cuh (loom_bf16, loom_f16: the
 * kernels' mma element types in the emulation) and float accumulators.
 *
 * On the device a fragment is spread over a warp's 32 lanes in an unspecified layout, and
 * each operation is the warp's, done once. Here the warp's first lane (linear thread index
 * a multiple of 32) holds the whole tile (num_elements = 256, row-major) and does every
 * operation, whole; the other lanes' calls do nothing. A kernel that indexes x[] only
 * uniformly (the same operation on every element) and reaches memory through
 * load_matrix_sync and store_matrix_sync gets the device's values. One that picks
 * elements by index is wrong on the device whatever this says, and one that reads a
 * fragment's x[] in lanes other than the first reads nothing here.
 *
 * The scheduler runs a block's threads one after another between barriers, and the first
 * lane runs before its warp's others: so whatever a load reads must have been written
 * before a barrier (on the device __syncwarp at least), which the kernels' __syncthreads
 * between phases provide. A load-add-store of one tile within a phase (O += P V) is then
 * done once, as on the device (had every lane done it, the sum would be added 32 times:
 * it was, in the first version of this shim).
 *
 * mma_sync: d[i][j] = c[i][j] + a[i][0] b[0][j] + ... + a[i][15] b[15][j], summed in that
 * order in fp32, one rounding per addition (the emulation is built without contraction).
 * The products of two 16-bit values are exact in fp32 (8 x 8 or 11 x 11 significant bits).
 * The tensor cores' internal order and rounding differ, so the device's bits are not these:
 * tests compare with tolerances.
 */
#ifndef LOOM_CUDA_EMU_WMMA_H
#define LOOM_CUDA_EMU_WMMA_H

#include "widen16.cuh"

#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment;

/* The 16-bit operands, widened as loaded (exact). */
template <typename Use, typename T, typename Layout> struct fragment<Use, 16, 16, 16, T, Layout> {
    enum { num_elements = 256 };
    float x[256];
};

template <> struct fragment<accumulator, 16, 16, 16, float, void> {
    enum { num_elements = 256 };
    float x[256];
};

/* The lane that does the warp's operation. */
static inline bool wmma_emu_lead()
{
    return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32 == 0;
}

static inline float wmma_emu_widen(const loom_bf16 &v) { return loom_widen(v); }
static inline float wmma_emu_widen(const loom_f16 &v) { return loom_widen(v); }

/* x[r][c] = p[r * ldm + c] (row_major) or p[c * ldm + r] (col_major). */
template <typename Use, typename T>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, row_major> &f, const T *p, unsigned ldm)
{
    if (!wmma_emu_lead())
        return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = wmma_emu_widen(p[(size_t)r * ldm + c]);
}
template <typename Use, typename T>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, col_major> &f, const T *p, unsigned ldm)
{
    if (!wmma_emu_lead())
        return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = wmma_emu_widen(p[(size_t)c * ldm + r]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t l)
{
    if (!wmma_emu_lead())
        return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t l)
{
    if (!wmma_emu_lead())
        return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            (l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) =
                f.x[r * 16 + c];
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v)
{
    if (!wmma_emu_lead())
        return;
    for (int i = 0; i < 256; i++)
        f.x[i] = v;
}

template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c)
{
    if (!wmma_emu_lead())
        return;
    float out[256];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = c.x[i * 16 + j];
            for (int k = 0; k < 16; k++)
                s += a.x[i * 16 + k] * b.x[k * 16 + j];
            out[i * 16 + j] = s;
        }
    for (int i = 0; i < 256; i++)
        d.x[i] = out[i];
}

} // namespace wmma
} // namespace nvcuda

#endif
