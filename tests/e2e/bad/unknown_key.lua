-- expect: unknown_key.lua:6: unknown key 'stepz' (accepted: backend, batch, checkpoint, comm, comm_timeout, data, debug_desync, deterministic, eval, grad_clip, log, lr, mesh, microbatches, model, name, on_nonfinite, on_step, optimizer, peak_flops, pp_chunks, pp_layers, precision, recompute, resume, sample, schedule, seed, steps, strategy, threads, tp_sequence_parallel)
package.path = arg[0]:match("^(.*)/bad/[^/]*$") .. "/recipes/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"

loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 2, seq = 16 }, steps = 2, stepz = 3,
}
