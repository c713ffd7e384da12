-- moe.lua — the small model with mixture-of-experts blocks (4 experts, top-2, every block:
-- override model.moe.* with key=value); prints each step's loss as a hex float (LOSS
-- lines, for bitwise comparisons) and its expert load (MOE lines); after step 1 this
-- rank's bytes of parameters, gradients and optimizer state (MEM rank params grads
-- optimizer): common.moe_report.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train {
  model = loom.gpt { vocab = 256, ctx = 32, layers = 2, heads = 2, dim = 32,
    moe = { experts = 4, top_k = 2, every = 1, capacity_factor = 1.25 } },
  data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  lr = loom.lr.cosine { warmup = 3, total = 20, min = 0.1 },
  batch = { micro = 4, seq = 32 }, steps = 20, seed = 5, threads = 2,
  log = { every = 100 },
  on_step = common.moe_report,
}
