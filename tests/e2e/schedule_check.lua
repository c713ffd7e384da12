-- schedule_check.lua — run by schedule.sh as `loom run schedule_check.lua`: the Lua side
-- of pipeline schedules (core.sched_build, core.sched_simulate, loom.schedule).
--  - gpipe written in Lua (schedules/gpipe.lua) gives the plugin's lists and the same
--    simulation, span for span, on the grid p in {2,3,4,8}, m in {1,2,4,8,16};
--  - every plugin's lists survive the trip through Lua tables (same bubble as simulated
--    straight from the plugin's lists, which the C test checks against the formulas);
--  - the three wrong schedules and malformed instructions are refused with their messages;
--  - per-instruction costs (costs.each) give, span for span, the simulation of the same
--    costs given per op, for every plugin on a grid; a dearer stage lengthens the makespan
--    by its own work; a list of the wrong length or a negative cost is refused.
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
-- costs.each: each instruction's own cost, here what its op costs (F 1.5, B 2, W 0.75)
local op_cost = { FWD = 1.5, BWD = 2.75, BWD_INPUT = 2, BWD_WEIGHT = 0.75 }
local function each_of(lists, scale)
  local each = {}
  for k, list in ipairs(lists) do
    each[k] = {}
    for i, instr in ipairs(list) do each[k][i] = (op_cost[instr.op] or 99) * (scale[k] or 1) end
  end
  return each
end
for _, name in ipairs { "gpipe", "1f1b", "interleaved", "zb1" } do
  for _, pm in ipairs { { 2, 4 }, { 4, 8 }, { 2, 16 } } do
    local p, m = pm[1], pm[2]
    local v = name == "interleaved" and 2 or 1
    local lists, shape = core.sched_build(name, p, m, v), { stages = p, microbatches = m, chunks = v }
    local by_op = core.sched_simulate(lists, shape, { fwd = 1.5, bwd_input = 2, bwd_weight = 0.75 })
    same_sim(core.sched_simulate(lists, shape, { each = each_of(lists, {}) }), by_op,
      string.format("%s p=%d m=%d: costs.each", name, p, m))
    if name == "gpipe" then -- stage 0 twice as dear: it alone sets the pace, m x 2 x (F + B)
      local slow = core.sched_simulate(lists, shape, { each = each_of(lists, { 2 }) })
      assert(slow.makespan > by_op.makespan and slow.stages[1].busy == 2 * by_op.stages[1].busy,
        string.format("gpipe p=%d m=%d: a dearer stage 0 gave makespan %g (was %g)", p, m,
          slow.makespan, by_op.makespan))
    end
  end
end
local g = core.sched_build("gpipe", 2, 2, 1)
local bad = each_of(g, {})
table.remove(bad[2])
refused(function() return core.sched_simulate(g, { stages = 2, microbatches = 2 }, { each = bad }) end,
  "schedule: costs.each[2] must list one cost per instruction of stage 1's list (8), got 7")
bad = each_of(g, {})
bad[1][1] = -1
refused(function() return core.sched_simulate(g, { stages = 2, microbatches = 2 }, { each = bad }) end,
  "schedule: stage 0 instruction 0 (FWD): its cost must be a finite number >= 0, got -1")
print("schedule_check: ok")
