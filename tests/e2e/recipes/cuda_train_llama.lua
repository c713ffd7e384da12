-- cuda_train_llama.lua — cuda_train.lua's run on a tiny loom.llama model (RMSNorm, SwiGLU,
-- RoPE, grouped-query attention: 4 query heads over 2 key/value heads), so that
-- tests/e2e/cuda_train.sh can compare a device backend's llama run with the CPU's.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train {
  model = loom.llama { vocab = 256, ctx = 16, layers = 1, heads = 4, kv_heads = 2, dim = 32,
                       ffn_dim = 64 },
  data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  lr = loom.lr.cosine { warmup = 2, total = 20, min = 0.1 },
  batch = { micro = 2, seq = 16 }, steps = 5, seed = 5, threads = 1, grad_clip = 1.0,
  log = { every = 100 },
  on_step = function(r)
    print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
    print(string.format("NORM %d %a %.9f", r.step, r.grad_norm, r.grad_norm))
  end,
}
