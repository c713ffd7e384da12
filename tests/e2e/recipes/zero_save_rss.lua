-- zero_save_rss.lua — offload_rss.lua's model (7.2 M parameters, ~55 MiB of AdamW state),
-- 2 steps, a checkpoint after the last: prints the process's peak resident set before the
-- save (the last step's) and after it, for measuring what a ZeRO save costs in memory
-- (docs/ZERO.md "Checkpoints"):
--   SAVERSS rank peak_before peak_after
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local steps, before = 2, 0
local session = loom.train {
  model = loom.gpt { vocab = 256, ctx = 16, layers = 4, heads = 4, dim = 384 },
  data = common.data(),
  optimizer = { "adamw", lr = 1e-3, weight_decay = 0.1 },
  batch = { micro = 1, seq = 16 }, steps = steps, seed = 5, threads = 1,
  log = { every = 100 },
  on_step = function(r) if r.step == steps then before = r.peak_rss end end,
}
print(string.format("SAVERSS %d %d %d", loom.rank or 0, before, session:info().peak_rss))
