-- expect: unknown_optimizer.lua:6: no optim plugin 'adamx'
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamx", lr = 1e-3 },
  batch = { micro = 2, seq = 16 }, steps = 2,
}
