// kernels_emu.cc — the backend's .cu files compiled as C++ for the CPU emulation (one
// translation unit; cuda_runtime.h here stands in for CUDA's).
#include "attention.cu"
#include "attention_dt.cu"
#include "convert.cu"
#include "crossentropy.cu"
#include "distill.cu"
#include "elementwise.cu"
#include "flash_attention.cu"
#include "flash_attention_tc.cu"
#include "encoder.cu"
/* the ordered GEMM's launchers renamed: gemm_emu.cc's stand in for them (the same bits
 * computed directly, or this kernel, or both compared) */
#define loom_cuda_sgemm_ordered loom_emu_kernel_sgemm_ordered
#define loom_cuda_gemm_ordered16 loom_emu_kernel_gemm_ordered16
#include "gemm_ordered.cu"
#undef loom_cuda_sgemm_ordered
#undef loom_cuda_gemm_ordered16
#include "layernorm.cu"
#include "llama.cu"
#include "optim.cu"
#include "reduce.cu"
#include "rows.cu"
#include "scatter_sorted.cu"
#include "split16.cu"
