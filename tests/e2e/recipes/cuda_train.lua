-- cuda_train.lua — a tiny model trained through a session on any backend (backend=...),
-- every step's loss (LOSS, hex and decimal), gradient norm (NORM) and bytes by category
-- (MEM step params grads optimizer comm grads_peak_resident params_peak_resident) printed, so that
-- tests/e2e/cuda_train.sh can compare a device backend's run with the CPU's.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train {
  model = loom.gpt { vocab = 256, ctx = 16, layers = 1, heads = 2, dim = 32 }, data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  lr = loom.lr.cosine { warmup = 2, total = 20, min = 0.1 },
  batch = { micro = 2, seq = 16 }, steps = 5, seed = 5, threads = 1, grad_clip = 1.0,
  log = { every = 100 },
  on_step = function(r)
    print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
    print(string.format("NORM %d %a %.9f", r.step, r.grad_norm, r.grad_norm))
    local m = r.memory -- the session's accounting by category (cuda_dp.sh checks ZeRO's)
    print(string.format("MEM %d %d %d %d %d %d %d", r.step, m.params, m.grads, m.optimizer, m.comm,
      m.grads_peak_resident, m.params_peak_resident))
  end,
}
