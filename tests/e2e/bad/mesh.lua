-- expect: mesh.lua:6: mesh dp=1 x tp=2 x pp=1 = 2 ranks, but this run has 1 (start it with loom launch -n 2, or use a mesh of 1: tp=1 dp=1)
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 2, seq = 16 }, steps = 2, mesh = { tp = 2 },
}
