-- common.lua — the small model and data the end-to-end tests share.
local loom = require "loom"
local here = arg[0]:match("^(.*)/[^/]*$")
local function data() return loom.data.text { path = here .. "/../../../data/tinyshakespeare.txt", val_fraction = 0.1 } end
return {
  model = function() return loom.gpt { vocab = 256, ctx = 32, layers = 2, heads = 2, dim = 32 } end,
  data = data,
  -- losses.lua's run (zero_export.lua trains the same one, llama_losses.lua on a llama): every step's loss as a hex
  -- float (LOSS) and the gradient norm (NORM); batch shape and optimizer from key=value
  losses_run = function(model)
    return {
      model = model, data = data(),
      optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
      lr = loom.lr.cosine { warmup = 3, total = 20, min = 0.1 },
      batch = { micro = 4, seq = 32 }, steps = 20, seed = 5, threads = 2,
      log = { every = 100 },
      on_step = function(r)
        print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
        print(string.format("NORM %d %a", r.step, r.grad_norm))
      end,
    }
  end,
  -- cuda_train.lua's and cuda_train_llama.lua's run (tests/e2e/cuda_train.sh compares a device
  -- backend's with the CPU's): every step's loss (hex and decimal), gradient norm and bytes
  cuda_train_run = function(model)
    return {
      model = model, data = data(),
      optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
      lr = loom.lr.cosine { warmup = 2, total = 20, min = 0.1 },
      batch = { micro = 2, seq = 16 }, steps = 5, seed = 5, threads = 1, grad_clip = 1.0,
      log = { every = 100 },
      on_step = function(r)
        print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
        print(string.format("NORM %d %a %.9f", r.step, r.grad_norm, r.grad_norm))
        local m = r.memory -- the session's accounting by category (cuda_dp.sh checks ZeRO's)
        print(string.format("MEM %d %d %d %d %d %d %d %d %d", r.step, m.params, m.grads, m.optimizer,
          m.comm, m.grads_peak_resident, m.params_peak_resident, m.optimizer_offloaded or 0,
          m.master or 0))
        -- the activation bytes (cuda_train.sh: att sized by the attention's path)
        if r.step == 1 then print(string.format("ACT %d", m.activations)) end
        -- an in-process teacher's (cuda_distill.sh: the mapped blocks' probabilities kept)
        if r.step == 1 and m.teacher_activations > 0 then
          print(string.format("TACT %d", m.teacher_activations))
        end
        -- and its parameters and their gradient buffer (plan_teacher.sh: the plan's figures)
        if r.step == 1 and m.teacher_params > 0 then
          print(string.format("TMEM %d %d", m.teacher_params, m.teacher_grads))
        end
        if r.step == 1 and m.distill > 0 then print(string.format("KDBUF %d", m.distill)) end
      end,
    }
  end,
  -- the MoE recipes' on_step (moe.lua, moe_llama.lua): the loss as a hex float (LOSS), the
  -- expert load (MOE), after step 1 this rank's bytes (MEM rank params grads optimizer)
  moe_report = function(r)
    print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
    local m = r.moe
    local loads = {}
    for _, l in ipairs(m.load) do loads[#loads + 1] = table.concat(l, ",") end
    print(string.format("MOE %d %s dropped=%.6f aux=%a z=%a", r.step, table.concat(loads, ";"),
      m.dropped, m.aux, m.z))
    if r.step == 1 then
      print(string.format("MEM %d %d %d %d", loom.core.rank or 0, r.memory.params, r.memory.grads,
        r.memory.optimizer))
    end
  end,
}
