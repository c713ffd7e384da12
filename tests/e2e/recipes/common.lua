-- common.lua — the small model and data the end-to-end tests share.
local loom = require "loom"
local here = arg[0]:match("^(.*)/[^/]*$")
return {
  model = function() return loom.gpt { vocab = 256, ctx = 32, layers = 2, heads = 2, dim = 32 } end,
  data = function() return loom.data.text { path = here .. "/../../../data/tinyshakespeare.txt", val_fraction = 0.1 } end,
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
