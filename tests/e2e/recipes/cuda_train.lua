-- cuda_train.lua — a tiny model trained through a session on any backend (backend=...),
-- every step's loss (LOSS, hex and decimal) and gradient norm (NORM) printed, and at step 1
-- the optimizer state's bytes by place (MEM), so that tests/e2e/cuda_train.sh can compare a
-- device backend's run with the CPU's.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train {
  model = loom.gpt { vocab = 256, ctx = 16, layers = 1, heads = 2, dim = 32 }, data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  lr = loom.lr.cosine { warmup = 2, total = 20, min = 0.1 },
  batch = { micro = 2, seq = 16 }, steps = 5, seed = 5, threads = 1, grad_clip = 1.0,
  log = { every = 100 },
  on_step = function(r)
    print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
    print(string.format("NORM %d %a %.9f", r.step, r.grad_norm, r.grad_norm))
    if r.step == 1 then -- the optimizer's bytes: on the backend, and held off it (offload)
      print(string.format("MEM optimizer %d offloaded %d", r.memory.optimizer,
        r.memory.optimizer_offloaded or 0))
    end
  end,
}
