// kernels_emu.cc — the backend's .cu files compiled as C++ for the CPU emulation (one
// translation unit; cuda_runtime.h here stands in for CUDA's).
#include "attention.cu"
#include "convert.cu"
#include "crossentropy.cu"
#include "elementwise.cu"
#include "flash_attention.cu"
#include "encoder.cu"
#include "gemm_ordered.cu"
#include "layernorm.cu"
#include "llama.cu"
#include "optim.cu"
#include "reduce.cu"
#include "rows.cu"
