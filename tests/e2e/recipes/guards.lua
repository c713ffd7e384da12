-- guards.lua — the small model, for tests/e2e/guards.sh: the lr is 1e-2 but LR_SPIKE_AT
-- (once, the first time that step runs) multiplies it by LR_SPIKE (default 300), and from
-- LR_DIVERGE_AT on it is 1e30 (a diverging run). Prints LOSS lines (hex) and SKIP lines.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local spike_at = tonumber(os.getenv("LR_SPIKE_AT") or "")
local factor = tonumber(os.getenv("LR_SPIKE") or "300")
local diverge_at = tonumber(os.getenv("LR_DIVERGE_AT") or "")
local fired = false
loom.train {
  model = common.model(), data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  lr = function(step)
    if diverge_at and step >= diverge_at then return 1e30 end
    if step == spike_at and not fired then fired = true; return 1e-2 * factor end
    return 1e-2
  end,
  batch = { micro = 4, seq = 32 }, steps = 30, seed = 5, threads = 1,
  log = { every = 100 },
  on_step = function(r)
    print(string.format("LOSS %d %a %.6f %.6f", r.step, r.loss, r.loss, r.grad_norm))
    if r.skipped then print("SKIP " .. r.step) end
  end,
}
