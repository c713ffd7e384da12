-- cuda_train_llama.lua — cuda_train.lua's run on a tiny loom.llama model (RMSNorm, SwiGLU,
-- RoPE, grouped-query attention: 4 query heads over 2 key/value heads), so that
-- tests/e2e/cuda_train.sh can compare a device backend's llama run with the CPU's.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train(common.cuda_train_run(
  loom.llama { vocab = 256, ctx = 16, layers = 1, heads = 4, kv_heads = 2, dim = 32, ffn_dim = 64 }))
