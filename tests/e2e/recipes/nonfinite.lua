-- nonfinite.lua — train the small model as losses.lua does and print, per step, the loss and
-- the gradient norm (LOSS, NORM: hex and decimal), whether the update was skipped (SKIP step true/false) and where a
-- non-finite value was found ("NONFINITE step rank stage param") and this rank's weights' and
-- optimizer state's hashes after the step ("HASH step params optim"), for tests/e2e/nonfinite.sh.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train {
  model = common.model(), data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  lr = loom.lr.cosine { warmup = 3, total = 20, min = 0.1 },
  batch = { micro = 4, seq = 32 }, steps = 5, seed = 5, threads = 1,
  log = { every = 100 },
  on_step = function(r, session)
    print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
    print(string.format("NORM %d %a %.9g", r.step, r.grad_norm, r.grad_norm))
    print(string.format("SKIP %d %s", r.step, tostring(r.skipped)))
    print(string.format("HASH %d %s %s", r.step, session:state_hash()))
    local nf = r.nonfinite
    if nf then
      print(string.format("NONFINITE %d %d %d %s", r.step, nf.rank, nf.stage, nf.loss and "loss" or nf.param))
    end
  end,
}
