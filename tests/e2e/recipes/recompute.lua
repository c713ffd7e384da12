-- recompute.lua — train the small model as losses.lua does and print every step's loss
-- and gradient norm as hex floats (LOSS, NORM: runs compare bit for bit), its wall time
-- ("MS step ms") and at the end this rank's activation bytes ("ACTBYTES rank bytes"),
-- so a test can set recompute= on the command line and compare the modes.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local session = loom.train {
  model = common.model(), data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  lr = loom.lr.cosine { warmup = 3, total = 20, min = 0.1 },
  batch = { micro = 4, seq = 32 }, steps = 6, seed = 5, threads = 2,
  log = { every = 100 },
  on_step = function(r)
    print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
    print(string.format("NORM %d %a %.9g", r.step, r.grad_norm, r.grad_norm))
    print(string.format("MS %d %.3f", r.step, r.ms))
  end,
}
print(string.format("ACTBYTES %d %d", loom.rank, session:info().activation_bytes))
