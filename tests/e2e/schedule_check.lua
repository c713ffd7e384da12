-- schedule_check.lua — run by schedule.sh as `loom run schedule_check.lua`: the Lua side
-- of pipeline schedules (core.sched_build, core.sched_simulate, loom.schedule).
--  - gpipe written in Lua (schedules/gpipe.lua) gives the plugin's lists and the same
--    simulation, span for span, on the grid p in {2,3,4,8}, m in {1,2,4,8,16};
--  - every plugin's lists survive the trip through Lua tables (same bubble as simulated
--    straight from the plugin's lists, which the C test checks against the formulas);
--  - the three wrong schedules and malformed instructions are refused with their messages.
-- Prints "schedule_check: ok" at the end; any failure is a Lua error (non-zero exit).
local core = require "loom.core"
local schedule = require "loom.schedule"
local dir = debug.getinfo(1, "S").source:sub(2):gsub("[^/]*$", "") .. "schedules/"

local function same_sim(a, b, what)
  assert(a.makespan == b.makespan, what .. ": makespan " .. a.makespan .. " vs " .. b.makespan)
  assert(a.bubble == b.bubble, what .. ": bubble differs")
  for k, st in ipairs(a.stages) do
    local o = b.stages[k]
    assert(st.peak == o.peak and st.busy == o.busy, what .. ": stage " .. (k - 1) .. " differs")
    for i, sp in ipairs(st.spans) do
      assert(sp[1] == o.spans[i][1] and sp[2] == o.spans[i][2],
        string.format("%s: stage %d instruction %d at %g..%g vs %g..%g", what, k - 1, i - 1,
          sp[1], sp[2], o.spans[i][1], o.spans[i][2]))
    end
  end
end

local cases = 0
for _, p in ipairs { 2, 3, 4, 8 } do
  for _, m in ipairs { 1, 2, 4, 8, 16 } do
    local shape = { stages = p, microbatches = m, chunks = 1 }
    local what = string.format("gpipe.lua p=%d m=%d", p, m)
    local from_plugin = core.sched_build("gpipe", p, m, 1)
    local from_lua = schedule.lists(dir .. "gpipe.lua", shape)
    for k, list in ipairs(from_plugin) do
      assert(#list == #from_lua[k], what .. ": stage " .. (k - 1) .. " has another length")
      for i, instr in ipairs(list) do
        local o = from_lua[k][i]
        assert(instr.op == o.op and instr.mb == o.mb and instr.chunk == (o.chunk or 0),
          what .. ": stage " .. (k - 1) .. " instruction " .. (i - 1) .. " differs")
      end
    end
    same_sim(schedule.simulate(from_plugin, shape), schedule.simulate(from_lua, shape), what)
    assert(math.abs(schedule.simulate(from_lua, shape).bubble - (p - 1) / (m + p - 1)) < 1e-12, what)
    cases = cases + 1
  end
end
assert(cases == 20)

for _, name in ipairs { "1f1b", "zb1", "interleaved" } do
  local shape = { stages = 4, microbatches = 8, chunks = name == "interleaved" and 2 or 1 }
  local lists = core.sched_build(name, 4, 8, shape.chunks)
  local sim = schedule.simulate(lists, shape)
  local _, want = schedule.formula(name, 4, 8, shape.chunks)
  assert(math.abs(sim.bubble - want) < 1e-12, name .. ": bubble " .. sim.bubble .. " vs " .. want)
end

local function refused(f, want)
  local ok, err = pcall(f)
  assert(not ok, "accepted: expected " .. want)
  err = tostring(err):gsub("^[^:]+%.lua:%d+: ", "") -- the caller's position, where Lua adds one
  assert(err == want, "\n got: " .. tostring(err) .. "\nwant: " .. want)
end
local function file(name, p, m)
  return function()
    local shape = { stages = p, microbatches = m, chunks = 1 }
    return schedule.simulate(schedule.lists(dir .. name, shape), shape)
  end
end
refused(file("missing_bwd.lua", 3, 4), "stage 0, instruction 2 (FWD mb 1 chunk 0): micro-batch 1 "
  .. "chunk 0 is forwarded but never backwarded (no BWD or BWD_INPUT)")
refused(file("send_no_recv.lua", 3, 4), "stage 0, instruction 5 (SEND_ACT mb 2 chunk 0): stage 1 "
  .. "never receives it (it has no RECV_ACT mb 2 chunk 0)")
refused(file("deadlock.lua", 2, 2), "deadlock: stage 0 waits at instruction 2 (RECV_GRAD mb 0 "
  .. "chunk 0) and stage 1 at instruction 0 (RECV_ACT mb 1 chunk 0)")
local one = { stages = 1, microbatches = 1 }
refused(function() return core.sched_simulate({ { { op = "FWD", mb = 0, chunk = 0, stage = 1 } } }, one) end,
  "stage 0, instruction 0: unknown key 'stage' (an instruction is {op = \"FWD\", mb = 0, chunk = 0})")
refused(function() return core.sched_simulate({ { { op = "FORWARD", mb = 0 } } }, one) end,
  "stage 0, instruction 0: op 'FORWARD' is not one of FWD, BWD, BWD_INPUT, BWD_WEIGHT, SEND_ACT, "
  .. "RECV_ACT, SEND_GRAD, RECV_GRAD")
refused(function() return core.sched_simulate({ {}, {} }, one) end, "schedule: 2 stage lists for stages = 1")
refused(function() return core.sched_simulate({ {} }, { stages = 1, microbatches = 0 }) end,
  "schedule shape: microbatches must be a whole number >= 1 (a shape is {stages = 4, microbatches = 8, chunks = 1})")
refused(function() return core.sched_build("interleaved", 4, 6, 2) end, "interleaved: microbatches = 6 is "
  .. "not a multiple of stages = 4 (Megatron's interleaved order needs m % p == 0); use 4 or 8 "
  .. "micro-batches, or the 1f1b schedule, which takes any count")
-- costs reach the simulator: gpipe with a fused backward twice as dear as before
local sim = core.sched_simulate(core.sched_build("gpipe", 2, 2, 1), { stages = 2, microbatches = 2 },
  { fwd = 1, bwd_input = 2, bwd_weight = 2 })
assert(sim.makespan == 5 * (2 + 2 - 1), "costs: makespan " .. sim.makespan)
print("schedule_check: ok")
