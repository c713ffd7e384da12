-- expect: comm_nccl.lua:6: comm="nccl" needs sessions training on the CUDA backend with more than one rank, which is not built yet (backend = "cuda" trains one rank; use "shm" for ranks of one node or "mpi" across nodes)
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 2, seq = 16 }, steps = 2, comm = "nccl",
}
