-- expect: bad_optimizer_value.lua:6: adamw: lr must be a finite number > 0, got -1
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = -1 },
  batch = { micro = 2, seq = 16 }, steps = 2,
}
