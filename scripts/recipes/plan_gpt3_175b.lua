-- plan_gpt3_175b.lua — GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12288,
-- 96 heads, 2048 context, 3.2M-token batches = 1536 sequences) in bf16 with AdamW: a
-- recipe for `loom plan` (docs/PLAN.md), not for training here. The mesh is Megatron-LM's
-- published layout for it on 1024 GPUs (Narayanan et al. 2021, Table 1: tp 8, pp 8, dp 16,
-- interleaved, micro-batch 1).
local loom = require "loom"
loom.train {
  model = loom.gpt { vocab = 50257, ctx = 2048, layers = 96, heads = 96, dim = 12288 },
  data = loom.data.random { vocab = 50257 },
  optimizer = { "adamw", lr = 6e-5 }, precision = "bf16",
  batch = { micro = 1, seq = 2048, global = 1536 }, steps = 1,
  mesh = { dp = 16, tp = 8, pp = 8 }, microbatches = 96, schedule = "interleaved",
  strategy = { zero = 1 }, recompute = "selective",
}
