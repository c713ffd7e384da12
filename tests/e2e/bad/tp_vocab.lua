-- expect: tp_vocab.lua:6: mesh tp=4 does not divide the padded vocabulary=258 (tp may be 1, 2)
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = loom.gpt { vocab = 256, vocab_padded = 258, ctx = 32, layers = 2, heads = 4, dim = 32 },
  data = common.data(), optimizer = { "adamw", lr = 1e-3 }, batch = { micro = 2, seq = 16 }, steps = 2,
  mesh = { tp = 4 },
}
