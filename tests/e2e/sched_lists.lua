-- sched_lists.lua — `loom run sched_lists.lua` with LOOM_SCHED="name stages micro chunks"
-- in the environment: every stage's compute instructions, one per line, "stage op mb
-- chunk" in list order (pp_trace.sh checks a trace's compute spans against them).
local core = require "loom.core"
local name, p, m, v = (os.getenv("LOOM_SCHED") or ""):match("^(%S+) (%d+) (%d+) (%d+)$")
assert(name, "set LOOM_SCHED=\"name stages micro chunks\"")
local lists = core.sched_build(name, tonumber(p), tonumber(m), tonumber(v))
local compute = { FWD = true, BWD = true, BWD_INPUT = true, BWD_WEIGHT = true }
for k, list in ipairs(lists) do
  for _, i in ipairs(list) do
    if compute[i.op] then print(k - 1, i.op, i.mb, i.chunk or 0) end
  end
end
