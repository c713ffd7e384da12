-- expect: tp_canonical.lua:6: deterministic="canonical" sums in 8 fixed chunks: batch.micro x batch.seq=12 must be a multiple of 8
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 1, seq = 12 }, steps = 2, deterministic = "canonical",
}
