-- zero_memory.lua — train a few steps and print this rank's bytes by category (the
-- session's accounting, docs/ZERO.md) after the last step, for tests/e2e/zero.sh to hold
-- against the ZeRO paper's formulas:
--   MEM rank params grads optimizer master activations comm grads_peak_resident
--       params_peak_resident
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local steps = 3
loom.train {
  model = common.model(), data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  batch = { micro = 2, seq = 32 }, steps = steps, seed = 5, threads = 1,
  log = { every = 100 },
  on_step = function(r)
    if r.step < steps then return end
    local m = r.memory
    print(string.format("MEM %d %d %d %d %d %d %d %d %d", loom.core.rank or 0,
      m.params, m.grads, m.optimizer, m.master, m.activations, m.comm, m.grads_peak_resident,
      m.params_peak_resident))
  end,
}
