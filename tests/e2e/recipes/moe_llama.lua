-- moe_llama.lua — moe.lua's run on a small loom.llama model whose blocks' MLPs are 4 SwiGLU
-- experts, top-2 (Mixtral's layout; override model.moe.* with key=value); LOSS and MOE
-- lines as moe.lua prints them.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train {
  model = loom.llama { vocab = 256, ctx = 32, layers = 2, heads = 4, kv_heads = 2, dim = 32,
    ffn_dim = 64, moe = { experts = 4, top_k = 2, every = 1, capacity_factor = 1.25 } },
  data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  lr = loom.lr.cosine { warmup = 3, total = 20, min = 0.1 },
  batch = { micro = 4, seq = 32 }, steps = 20, seed = 5, threads = 2,
  log = { every = 100 },
  on_step = common.moe_report,
}
