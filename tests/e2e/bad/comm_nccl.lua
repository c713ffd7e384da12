-- expect: comm_nccl.lua:6: comm="nccl" needs a GPU backend that trains through a session, and sessions do not train on the CUDA backend yet (use "shm" for ranks of one node or "mpi" across nodes)
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 2, seq = 16 }, steps = 2, comm = "nccl",
}
