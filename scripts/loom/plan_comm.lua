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
-- clock=cpu: this rank's CPU seconds per operation instead of the slowest rank's wall time
-- (a loaded machine's waits for a core left out, as in a cpu-clock profile's device rates)
local function bench(op, bytes, iters)
  local c0 = core.cpu_now()
  local r = core.comm_bench { op = op, min = bytes, max = bytes, iters = iters }[1]
  if o.clock == "cpu" then -- comm_bench also runs 2 warm-ups and one max-reduce of the time
    local us = (core.cpu_now() - c0) / (iters + 3) * 1e6
    local busf = r.busbw / r.algbw
    r.us, r.algbw = us, r.bytes / (us * 1e-6) / 1e9
    r.busbw = r.algbw * busf
  end
  return r
end
for _, op in ipairs { "allreduce", "reduce_scatter", "allgather", "broadcast" } do
  local small = bench(op, 4096, 200)
  local large = bench(op, 4 << 20, 8)
  out[op == "broadcast" and "p2p" or op] = { latency_s = small.us * 1e-6, busbw = large.busbw * 1e9,
    measured = string.format("%d B: %.1f us; %d B: %.1f us (%.2f GB/s bus)", small.bytes, small.us,
      large.bytes, large.us, large.busbw) }
end
if (core.rank or 0) == 0 then
  local f = assert(io.open(o.out, "wb"))
  f:write(json.encode(out), "\n")
  f:close()
end
