-- expect: tp_sequence.lua:6: tp_sequence_parallel splits batch.micro x batch.seq = 15 token rows over tp=2 ranks: they must divide (tp may be 1)
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 1, seq = 15 }, steps = 2, mesh = { tp = 2 }, tp_sequence_parallel = true,
}
