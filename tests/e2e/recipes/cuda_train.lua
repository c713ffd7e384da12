-- cuda_train.lua — a tiny model trained through a session on any backend (backend=...),
-- every step's loss (LOSS, hex and decimal), gradient norm (NORM) and bytes by category
-- (MEM step params grads optimizer comm grads_peak_resident params_peak_resident
-- optimizer_offloaded master) printed, so that
-- tests/e2e/cuda_train.sh can compare a device backend's run with the CPU's.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train(common.cuda_train_run(loom.gpt { vocab = 256, ctx = 16, layers = 1, heads = 2, dim = 32 }))
