-- param_bytes.lua — build the model under the mesh given on the command line and print
-- this rank's parameter buffer size, "PARAMBYTES rank bytes", and its activation buffers'
-- size, "ACTBYTES rank bytes".
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local session = loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 4, seq = 32 }, steps = 0, threads = 1, log = { every = 100 },
}
print(string.format("PARAMBYTES %d %d", loom.rank, session:info().param_bytes))
print(string.format("ACTBYTES %d %d", loom.rank, session:info().activation_bytes))
