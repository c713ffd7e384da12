-- plan_runtime.lua — `loom plan --calibrate`'s runtime probe, run by `loom run`: one step of
-- a small model; prints "RUNTIME <VmHWM> <bytes the plan predicts>" so that calibration
-- can take the difference (the Lua state, libraries, plugins, BLAS: what no layout changes)
-- as the profile's runtime_bytes.
local loom = require "loom"
local t = {
  model = loom.gpt { vocab = 256, ctx = 64, layers = 2, heads = 2, dim = 64 },
  data = loom.data.random { vocab = 256 },
  optimizer = { "adamw", lr = 1e-3 }, batch = { micro = 2, seq = 64 }, steps = 1, threads = 1,
  log = { every = 100 },
}
local plan = require "loom.plan"
local predicted = plan.layout(t, require("loom.plan_machine").load("cpu-2core")).peak_bytes
t.on_step = function(r) print(string.format("RUNTIME %d %d", r.peak_rss, predicted)) end
loom.train(t)
