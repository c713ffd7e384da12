-- expect: tp_heads.lua:6: mesh tp=3 does not divide heads=4 (tp may be 1, 2, 4)
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = loom.gpt { vocab = 256, ctx = 32, layers = 2, heads = 4, dim = 32 }, data = common.data(),
  optimizer = { "adamw", lr = 1e-3 }, batch = { micro = 2, seq = 16 }, steps = 2, mesh = { tp = 3 },
}
