-- losses_vocab.lua — losses.lua on random tokens of a vocabulary set by model.vocab (and
-- model.vocab_padded) on the command line, to test vocabularies that do not fill the
-- padded embedding evenly across tensor-parallel ranks.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local vocab = 256
for _, kv in ipairs(loom.overrides()) do
  if kv[1] == "model.vocab" then vocab = math.tointeger(tonumber(kv[2])) end
end
loom.train {
  model = loom.gpt { vocab = vocab, ctx = 32, layers = 2, heads = 4, dim = 32 },
  data = loom.data.random { vocab = vocab, seed = 2 },
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  batch = { micro = 4, seq = 32 }, steps = 8, seed = 5, threads = 1,
  log = { every = 100 },
  on_step = function(r) print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss)) end,
}
