-- expect: missing_data.lua:6: data file 'no/such/file.txt' not found
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = loom.data.text { path = "no/such/file.txt" },
  optimizer = { "adamw", lr = 1e-3 }, batch = { micro = 2, seq = 16 }, steps = 2,
}
