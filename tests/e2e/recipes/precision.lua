-- precision.lua — train the small model as losses.lua does and print, per step, the loss
-- (LOSS: hex and decimal), the gradient norm (NORM, hex), the loss scale after the step and
-- whether it was skipped ("SCALE step scale skipped"), and this rank's weights' and optimizer
-- state's hashes ("HASH step params optim"); MEM once: this rank's params, master,
-- activation and saved-activation bytes (session:info().memory). For tests/e2e/precision.sh.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local printed
loom.train {
  model = common.model(), data = common.data(),
  optimizer = { "adamw", lr = 2e-3, weight_decay = 0.1 },
  lr = loom.lr.cosine { warmup = 10, total = 200, min = 0.1 },
  batch = { micro = 8, seq = 32 }, steps = 20, seed = 5, threads = 1,
  precision = "fp32",
  log = { every = 1000 },
  on_step = function(r, session)
    print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
    print(string.format("NORM %d %a", r.step, r.grad_norm))
    print(string.format("SCALE %d %g %s", r.step, r.loss_scale, tostring(r.skipped)))
    print(string.format("HASH %d %s %s", r.step, session:state_hash()))
    if not printed then
      local m = session:info().memory
      print(string.format("MEM %d %d %d %d", m.params, m.master, m.activations, m.saved))
      printed = true
    end
  end,
}
