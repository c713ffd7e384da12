-- plan_gpt3_13b.lua — GPT-3 13B (Brown et al. 2020, Table 2.1: 40 layers, d_model 5140 —
-- 5120 here so that 40 heads of 128 divide it —, 2048 context, 1M-token batches = 512
-- sequences) in bf16 with AdamW: a recipe for `loom plan` (docs/PLAN.md); it is far too
-- large to train on a CPU. The mesh is the seeds' answer for 2 nodes x 8 x 80 GB.
local loom = require "loom"
loom.train {
  model = loom.gpt { vocab = 50257, ctx = 2048, layers = 40, heads = 40, dim = 5120 },
  data = loom.data.random { vocab = 50257 },
  optimizer = { "adamw", lr = 1e-4 }, precision = "bf16",
  batch = { micro = 1, seq = 2048, global = 512 }, steps = 1,
  mesh = { dp = 1, tp = 8, pp = 2 }, microbatches = 512, schedule = "1f1b",
  strategy = { zero = 1 },
}
