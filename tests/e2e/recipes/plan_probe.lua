-- plan_probe.lua — a few steps of a model sized by key=value (model.dim=, model.layers=,
-- mesh.*, strategy.*, recompute=, ...) for tests/e2e/plan.sh: loom.train's summary prints
-- the plan's prediction beside the measured peak RSS and step time ("plan vs run"), and the
-- MEM line gives the session's own accounting after the last step, the CPU line the median
-- CPU milliseconds of this process per step (steps 3..; the time a loaded machine's waits
-- for a core leave out), the FAULTS line its median minor page faults per step (a count:
-- what ZeRO 2/3's pages handed back and touched again cost, whatever the load).
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
-- PLAN_PROBE_STEPS (default 4): more steps where a layout's first ones are not its steady
-- state (tests/e2e/plan.sh: the disk offload's file)
local steps = math.tointeger(tonumber(os.getenv("PLAN_PROBE_STEPS") or "")) or 4
local cpu, last = {}, nil -- each step's CPU seconds (core.cpu_now), from the second step on
local flt, last_flt = {}, nil -- each step's minor page faults (/proc/self/stat's minflt)
local function minflt()
  local f = io.open("/proc/self/stat")
  if not f then return 0 end
  local rest = f:read("a"):match("%) (.*)")
  f:close()
  local i = 0
  for v in rest:gmatch("%S+") do i = i + 1; if i == 8 then return tonumber(v) end end
  return 0
end
loom.train {
  model = loom.gpt { vocab = 256, ctx = 64, layers = 4, heads = 4, dim = 128 },
  data = loom.data.random { vocab = 256, seed = 3 },
  optimizer = { "adamw", lr = 1e-3 },
  batch = { micro = 4, seq = 64 }, steps = steps, seed = 5, threads = 1,
  log = { every = 100 },
  on_step = function(r)
    local now, nf = loom.core.cpu_now(), minflt()
    if last and r.step > 1 then cpu[#cpu + 1] = now - last; flt[#flt + 1] = nf - last_flt end
    last, last_flt = now, nf
    if r.step < steps then return end
    table.sort(cpu)
    table.sort(flt)
    print(string.format("CPU %d %.3f", loom.core.rank or 0, 1e3 * cpu[(#cpu + 1) // 2]))
    print(string.format("FAULTS %d %d", loom.core.rank or 0, flt[(#flt + 1) // 2]))
    local m = r.memory
    print(string.format("MEM %d %d %d %d %d %d %d", loom.core.rank or 0, m.params, m.grads,
      m.optimizer, m.master, m.activations, m.comm))
  end,
}
