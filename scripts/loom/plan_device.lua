-- plan_device.lua — one rank of `loom plan --calibrate --cpu-clock`'s shared-device
-- measurement (started by loom launch; see plan_machine.bench_device_shared): every rank
-- runs the device bench at once, one thread each, as a layout's ranks run their passes on
-- the node's cores together; rank 0 writes its rates as JSON to out=FILE. What it measures
-- beside the one-process rates: what ranks running at once cost each other (caches,
-- memory, a core's neighbour on the same physical core, the clock a busier package keeps),
-- which a process's CPU time does count.
local core = require "loom.core"
local json = require "loom.json"
local o = {}
for _, kv in ipairs(core.overrides or {}) do o[kv[1]] = kv[2] end
-- (init_dist returns once every rank is up: the benches start together)
core.init_dist { comm = "shm", dp = core.world, timeout_ms = 60000 }
local rates = require("loom.plan_machine").bench_device(1, tonumber(o.min_s), o.clock == "cpu")
if (core.rank or 0) == 0 then
  local f = assert(io.open(o.out, "wb"))
  f:write(json.encode(rates), "\n")
  f:close()
end
