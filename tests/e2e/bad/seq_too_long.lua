-- expect: seq_too_long.lua:6: batch.seq=64 is longer than the model's ctx=32
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 2, seq = 64 }, steps = 2,
}
