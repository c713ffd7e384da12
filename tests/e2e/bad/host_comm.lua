-- expect: host_comm.lua:6: host_comm=tcp: no comm plugin 'tcp'
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 2, seq = 16 }, steps = 2, comm = "shm", host_comm = "tcp",
}
