-- expect: betas_type.lua:6: optim 'adamw' key 'betas' must be a list of numbers, got "fast"
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-3, betas = "fast" },
  batch = { micro = 2, seq = 16 }, steps = 2,
}
