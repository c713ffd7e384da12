-- pp_probe.lua — train the small model as losses.lua does and print, besides LOSS and NORM,
-- the validation loss at the end ("VAL hex decimal"), every step's peak of micro-batches
-- in flight on this rank ("PEAK step n", the pipeline engine's own count; 0 without a
-- pipeline), whether the step's update was skipped for non-finite gradients ("SKIP step
-- true/false") and this rank's parameter buffer size ("PARAMBYTES rank bytes").
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local session, summary = loom.train {
  model = common.model(), data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  lr = loom.lr.cosine { warmup = 3, total = 20, min = 0.1 },
  batch = { micro = 4, seq = 32 }, steps = 20, seed = 5, threads = 2,
  eval = { every = 1000, batches = 2 },
  log = { every = 100 },
  on_step = function(r)
    print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
    print(string.format("NORM %d %a %.9g", r.step, r.grad_norm, r.grad_norm))
    print(string.format("PEAK %d %d", r.step, r.inflight))
    print(string.format("SKIP %d %s", r.step, tostring(r.skipped)))
  end,
}
print(string.format("VAL %a %.9f", summary.val_loss, summary.val_loss))
print(string.format("PARAMBYTES %d %d", loom.rank, session:info().param_bytes))
