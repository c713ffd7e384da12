-- bench_comm.lua — one rank of `loom bench comm` (started by loom launch; see cli.bench).
-- Key=value arguments: op, min, max, iters, comm. Rank 0 prints the table.
local core = require "loom.core"
local o = {}
for _, kv in ipairs(core.overrides or {}) do o[kv[1]] = kv[2] end
local world = core.world or 1
if world < 2 then error("loom bench comm needs at least 2 ranks (-n 2)", 0) end
core.init_dist { comm = o.comm or "shm", dp = world, timeout_ms = 60000 }
local rows = core.comm_bench { op = o.op or "allreduce", min = math.tointeger(tonumber(o.min)),
  max = math.tointeger(tonumber(o.max)), iters = math.tointeger(tonumber(o.iters or "0")) }
if (core.rank or 0) == 0 then
  print(string.format("# loom bench comm: %s over '%s', %d ranks, f32, time = slowest rank's mean",
    o.op or "allreduce", o.comm or "shm", world))
  print(string.format("%12s %12s %10s %8s %8s", "size(B)", "count", "time(us)", "algbw", "busbw"))
  print(string.format("%12s %12s %10s %8s %8s", "", "(elements)", "", "(GB/s)", "(GB/s)"))
  for _, r in ipairs(rows) do
    print(string.format("%12d %12d %10.1f %8.2f %8.2f", r.bytes, r.count, r.us, r.algbw, r.busbw))
  end
end
