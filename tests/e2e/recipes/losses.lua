-- losses.lua — train the small model and print every step's loss as a hex float, so a
-- test can compare runs bit for bit, and the gradient norm (NORM lines). Batch shape and optimizer come from key=value.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train {
  model = common.model(), data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  lr = loom.lr.cosine { warmup = 3, total = 20, min = 0.1 },
  batch = { micro = 4, seq = 32 }, steps = 20, seed = 5, threads = 2,
  log = { every = 100 },
  on_step = function(r)
    print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
    print(string.format("NORM %d %a", r.step, r.grad_norm))
  end,
}
