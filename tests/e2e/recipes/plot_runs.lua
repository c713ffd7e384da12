-- plot_runs.lua — writes a metrics file through loom.metrics (quiet), without training, for
-- tests/e2e/plot.sh. key=value overrides: jsonl=PATH, steps=N (default 37), shift=X (added
-- to every loss, so two runs differ), resume=S (the run stops after step S + 5 and a resumed
-- run appends from S + 1: two "run" objects, steps S+1..S+5 written twice).
local loom = require "loom"
local metrics = require "loom.metrics"
local cfg = { steps = 37, shift = 0, resume = 0 }
for _, kv in ipairs(loom.overrides()) do cfg[kv[1]] = kv[1] == "jsonl" and kv[2] or tonumber(kv[2]) end
assert(cfg.jsonl, "plot_runs.lua: give jsonl=PATH")
local function run(from, to, start)
  local m <close> = metrics.new { steps = cfg.steps, start_step = start, jsonl = cfg.jsonl, quiet = true,
    params = 35000, layers = 2, dim = 32, seq = 32, device = "cpu: made-up steps" }
  for s = from, to do
    local loss = 5 * math.exp(-s / 12) + 2 + 0.2 * math.sin(s * 1.7) + cfg.shift
    m:step { step = s, loss = loss, lr = 1e-3 * math.min(1, s / 10), grad_norm = 1 + 0.5 * math.cos(s),
      ms = 10 + s % 3, tokens = 1000 }
    if s % 10 == 0 then m:eval(s, loss + 0.3) end
  end
end
if cfg.resume > 0 then
  run(1, math.min(cfg.steps, cfg.resume + 5), 0)
  run(cfg.resume + 1, cfg.steps, cfg.resume)
else
  run(1, cfg.steps, 0)
end
