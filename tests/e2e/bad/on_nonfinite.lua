-- expect: on_nonfinite.lua:6: on_nonfinite=halt is not one of: skip, stop, rollback
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 2, seq = 16 }, steps = 2, on_nonfinite = "halt",
}
