-- zero_load_rss.lua — offload_rss.lua's model (7.2 M parameters, ~55 MiB of AdamW state)
-- for measuring what a ZeRO checkpoint load costs in memory (docs/ZERO.md "Checkpoints"):
-- CKPT_SAVE=DIR trains 2 steps and saves; CKPT_LOAD=PATH resumes from the save and trains
-- step 3; neither trains 3 steps from scratch. Prints the process's peak resident set
-- after the last step (after the load, when resumed; the save comes after it):
--   LOADRSS rank step peak_rss
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local save, load = os.getenv("CKPT_SAVE"), os.getenv("CKPT_LOAD")
local steps = save and 2 or 3
loom.train {
  model = loom.gpt { vocab = 256, ctx = 16, layers = 4, heads = 4, dim = 384 },
  data = common.data(),
  optimizer = { "adamw", lr = 1e-3, weight_decay = 0.1 },
  batch = { micro = 1, seq = 16 }, steps = steps, seed = 5, threads = 1,
  log = { every = 100 },
  checkpoint = save and { dir = save, every = 2 } or nil,
  resume = load,
  on_step = function(r)
    print(string.format("LOSS %d %a", r.step, r.loss))
    if r.step == steps then print(string.format("LOADRSS %d %d %d", loom.rank or 0, r.step, r.peak_rss)) end
  end,
}
