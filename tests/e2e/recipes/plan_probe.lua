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
-- the disk offload's I/O thread (offload_disk.c names it): its own CPU nanoseconds
-- (/proc/PID/task/TID/schedstat's first field), nil where the run has no such thread
local function io_thread_ns()
  local f = io.open("/proc/self/stat")
  local pid = f and f:read("a"):match("^(%d+)")
  if f then f:close() end
  local ls = pid and io.popen("ls /proc/" .. pid .. "/task")
  if not ls then return nil end
  local total
  for tid in ls:lines() do
    local c = io.open("/proc/" .. pid .. "/task/" .. tid .. "/comm")
    local name = c and c:read("l")
    if c then c:close() end
    if name == "loom-offload-io" then
      local s = io.open("/proc/" .. pid .. "/task/" .. tid .. "/schedstat")
      local ns = s and tonumber(s:read("a"):match("^(%d+)"))
      if s then s:close() end
      if ns then total = (total or 0) + ns end
    end
  end
  ls:close()
  return total
end
local io_first -- the I/O thread's ns at the end of step 2
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
    if r.step == 2 then io_first = io_thread_ns() end
    if r.step < steps then return end
    local io_last = io_first and io_thread_ns()
    if io_last then -- its mean CPU ms a step over steps 3..N (a total: no per-step median)
      print(string.format("IOCPU %d %.3f", loom.core.rank or 0, 1e-6 * (io_last - io_first) / (steps - 2)))
    end
    table.sort(cpu)
    table.sort(flt)
    print(string.format("CPU %d %.3f", loom.core.rank or 0, 1e3 * cpu[(#cpu + 1) // 2]))
    print(string.format("FAULTS %d %d", loom.core.rank or 0, flt[(#flt + 1) // 2]))
    local m = r.memory
    print(string.format("MEM %d %d %d %d %d %d %d", loom.core.rank or 0, m.params, m.grads,
      m.optimizer, m.master, m.activations, m.comm))
  end,
}
