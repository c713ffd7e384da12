-- plan_comm.lua — one rank of `loom plan --calibrate`'s communicator measurement (started
-- by loom launch; see plan_machine.bench_comm): for each collective, the time of a small
-- and a large operation (core.comm_bench, the engine of `loom bench comm`), written by
-- rank 0 as JSON {kind = {latency_s =, busbw = (bytes/s)}}; p2p is a 2-rank broadcast
-- (one buffer from one rank to the other, what a pipeline's send/recv moves).
local core = require "loom.core"
local json = require "loom.json"
local o = {}
for _, kv in ipairs(core.overrides or {}) do o[kv[1]] = kv[2] end
core.init_dist { comm = o.comm or "shm", dp = core.world, timeout_ms = 60000 }
local out = {}
for _, op in ipairs { "allreduce", "reduce_scatter", "allgather", "broadcast" } do
  local small = core.comm_bench { op = op, min = 4096, max = 4096, iters = 200 }[1]
  local large = core.comm_bench { op = op, min = 4 << 20, max = 4 << 20, iters = 8 }[1]
  out[op == "broadcast" and "p2p" or op] = { latency_s = small.us * 1e-6, busbw = large.busbw * 1e9,
    measured = string.format("%d B: %.1f us; %d B: %.1f us (%.2f GB/s bus)", small.bytes, small.us,
      large.bytes, large.us, large.busbw) }
end
if (core.rank or 0) == 0 then
  local f = assert(io.open(o.out, "wb"))
  f:write(json.encode(out), "\n")
  f:close()
end
