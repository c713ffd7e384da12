-- pp_sample.lua — train the small model a few steps (or resume it: resume=PATH with
-- steps at the checkpoint's step trains nothing), then sample; rank 0 prints the sample's
-- bytes as hex ("SAMPLE ...") and the XXH64 of every logits row drawn from ("HASH ..."),
-- so runs under different pipeline layouts, or loading one checkpoint, can be compared.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local session = loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-2 },
  batch = { micro = 4, seq = 32 }, steps = 4, seed = 5, threads = 1, log = { every = 100 },
}
local text, hash = loom.sample { session = session, prompt = "ROMEO:\n", tokens = 40,
  temperature = 0.9, top_k = 20, seed = 3, logits_hash = true }
if loom.rank == 0 then
  print("SAMPLE " .. text:gsub(".", function(c) return string.format("%02x", c:byte()) end))
  print("HASH " .. hash)
end
