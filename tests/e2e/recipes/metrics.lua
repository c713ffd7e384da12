-- metrics.lua — a short imperative run that drives loom.metrics directly, for
-- tests/e2e/metrics.sh. key=value overrides: jsonl=PATH, steps=N, every=N, peak_flops=X.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local metrics = require "loom.metrics"
local overrides = require "loom.overrides"
local common = require "common"

local cfg = { steps = 6, every = 2 }
overrides.apply(cfg, loom.overrides(), "metrics.lua: ")
local model = common.model()
local seq = 32
local s = loom.session { model = model, batch = { micro = 4, seq = seq },
  optimizer = { "adamw", lr = 1e-2 }, seed = 5, threads = 2 }
local data = loom.open_data(common.data())
local info = s:info()
local m <close> = metrics.new { steps = cfg.steps, every = cfg.every, jsonl = cfg.jsonl,
  params = info.params, layers = model.layers, dim = model.dim, seq = seq,
  peak_flops = cfg.peak_flops, device = info.backend }
for step = 1, cfg.steps do
  local r = s:step(data, 1e-2)
  r.step = step
  m:step(r)
  if step % 3 == 0 then m:eval(step, s:eval(data, 2)) end
end
