-- tp_sample.lua — train the small model a few steps, evaluate, then sample; rank 0 prints
-- the validation loss ("VAL hexfloat decimal") and the sample's bytes as hex ("SAMPLE ..."), so runs
-- under different meshes can be compared.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local session, summary = loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-2 },
  batch = { micro = 4, seq = 32 }, steps = 6, seed = 5, threads = 1, log = { every = 100 },
  eval = { every = 6, batches = 2 },
}
local text = loom.sample { session = session, prompt = "ROMEO:\n", tokens = 45, temperature = 0.9,
  top_k = 20, seed = 3 }
if loom.rank == 0 then print(string.format("VAL %a %.9f", summary.val_loss, summary.val_loss)) end
if loom.rank == 0 then print("SAMPLE " .. text:gsub(".", function(c) return string.format("%02x", c:byte()) end)) end
