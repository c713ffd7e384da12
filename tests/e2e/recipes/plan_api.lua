-- plan_api.lua — loom.plan{...} from a recipe: one layout's table and a search's, printed for
-- tests/e2e/plan.sh (API optimizer-bytes has-time tokens; SEARCH rows dp tp pp of the top).
local loom = require "loom"
local p = loom.plan { model = loom.gpt { vocab = 256, ctx = 64, layers = 4, heads = 4, dim = 128 },
  data = loom.data.random { vocab = 256 }, optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 4, seq = 64 }, steps = 1, mesh = { dp = 2 }, strategy = { zero = 1 } }
print("API", p.memory[1].optimizer, p.time.step_s > 0, p.tokens_per_step)
local s = loom.plan { model = loom.gpt { vocab = 256, ctx = 64, layers = 4, heads = 4, dim = 128 },
  data = loom.data.random { vocab = 256 }, optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 4, seq = 64, global = 8 }, steps = 1, world = 2, mem = "1GiB" }
print("SEARCH", #s.ranked, s.ranked[1].layout.dp, s.ranked[1].layout.tp, s.ranked[1].layout.pp)
