-- zero_init_rss.lua — a model of 2.7 M parameters (10.9 MB of fp32: 6 blocks, dim 192),
-- one step, for tests/e2e/zero.sh's check of ZeRO-3's partitioned construction: each rank
-- prints its peak resident set before the first step and the loss (a hex float):
--   INIT rank startup_peak_rss
--   LOSS step loss
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train {
  model = loom.gpt { vocab = 256, ctx = 16, layers = 6, heads = 4, dim = 192 },
  data = common.data(),
  optimizer = { "adamw", lr = 1e-3, weight_decay = 0.1 },
  batch = { micro = 1, seq = 16 }, steps = 1, seed = 5, threads = 1,
  log = { every = 100 },
  on_step = function(r)
    print(string.format("LOSS %d %a", r.step, r.loss))
    print(string.format("INIT %d %d", loom.core.rank or 0, r.startup_peak_rss))
  end,
}
