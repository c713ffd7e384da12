-- progress_lines.lua — drives loom.metrics with made-up steps whose numbers are as wide as
-- a real run's get (six-digit steps, seconds per step, millions of tokens/s, comm shares,
-- GiB of memory is what the process has), for tests/e2e/progress_line.sh. No training.
-- key=value overrides: peak=1 gives a peak FLOP/s (so an MFU column), devices=N.
local loom = require "loom"
local metrics = require "loom.metrics"
local cfg = { peak = 0, devices = 1 }
for _, kv in ipairs(loom.overrides()) do cfg[kv[1]] = math.tointeger(tonumber(kv[2])) end
local m <close> = metrics.new { steps = 100000, every = 3, params = 124000000, layers = 12,
  dim = 768, seq = 1024, peak_flops = cfg.peak == 1 and 989e12 or nil, devices = cfg.devices,
  device = "cpu: test" }
local cases = {
  { step = 1, loss = 10.98765, lr = 6e-7, grad_norm = 15.5, ms = 2345.6, tokens = 524288 },
  { step = 2, loss = 9.5, lr = 1.2e-6, grad_norm = 1234.5678, ms = 12.3, tokens = 524288, comm_ms = 3.1 },
  { step = 3, loss = 7.25, lr = 6e-4, grad_norm = 0.75, ms = 0.4, tokens = 524288, skipped = true },
  { step = 99998, loss = 3.1, lr = 6e-5, grad_norm = 0.3, ms = 400, tokens = 524288, comm_ms = 100 },
  { step = 99999, loss = 3.0, lr = 6e-5, grad_norm = 0.3, ms = 400, tokens = 524288, tokens_per_s = 0 / 0 },
  { step = 100000, loss = 2.9, lr = 6e-5, grad_norm = 0.3, ms = 400, tokens = 524288 },
}
for _, r in ipairs(cases) do m:step(r) end
