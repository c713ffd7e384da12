-- loom.schedule — pipeline schedules from Lua, and `loom schedule`: every stage's list
-- from a sched plugin or a Lua file, validated and simulated by the core (core.sched_build,
-- core.sched_simulate; core/train/schedule.h), drawn as text rows or an SVG.
--
-- A schedule written in Lua is a file that returns a function(shape) -> list, called once
-- per stage with shape = {stages =, stage =, microbatches =, chunks =} (stage 0-based),
-- returning that stage's instructions in order, each { op = "FWD", mb = 0, chunk = 0 }
-- (chunk may be left out: 0). op is one of FWD, BWD (fused), BWD_INPUT, BWD_WEIGHT,
-- SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD; plugin/sched.h says what each means. Such a
-- list is validated exactly as a plugin's. A recipe's schedule = "FILE.lua" or
-- schedule = function(shape) ... end trains with such lists (loom.train: the engine runs
-- them instead of a plugin's build(), after the same checks).
local core = require "loom.core"
local schedule = {}

-- Whether a recipe's schedule is written in Lua (a function or a *.lua file), not a plugin.
function schedule.is_lua(s)
  return type(s) == "function" or (type(s) == "string" and s:match("%.lua$") ~= nil)
end

-- A Lua schedule's name for messages: the file, or where the function was written.
function schedule.label(s)
  if type(s) ~= "function" then return s end
  local info = debug.getinfo(s, "S")
  return string.format("function at %s:%d", info.short_src, info.linedefined)
end

-- Every stage's list (lists[k] is stage k-1's) for a plugin name, a *.lua file or a
-- function(shape) -> list.
function schedule.lists(name, shape)
  local p, m, v = shape.stages, shape.microbatches, shape.chunks or 1
  if not schedule.is_lua(name) then return core.sched_build(name, p, m, v) end
  local gen, label = name, schedule.label(name)
  if type(name) == "string" then
    local chunk, err = loadfile(name)
    if not chunk then error("schedule: " .. err, 0) end
    local ok
    ok, gen = pcall(chunk)
    if not ok then error(string.format("schedule: %s failed to load: %s", name, tostring(gen)), 0) end
    if type(gen) ~= "function" then
      error(string.format("schedule: %s returned a %s; a schedule file returns a function(shape) "
        .. "-> list of {op = \"FWD\", mb = 0, chunk = 0}", name, type(gen)), 0)
    end
  end
  local lists = {}
  for stage = 0, p - 1 do
    local ok, list = pcall(gen, { stages = p, stage = stage, microbatches = m, chunks = v })
    if not ok then
      error(string.format("schedule: %s failed for stage %d: %s", label, stage, tostring(list)), 0)
    end
    if type(list) ~= "table" then
      error(string.format("schedule: %s gave a %s for stage %d, not a list of instructions "
        .. "{op = \"FWD\", mb = 0, chunk = 0}", label, type(list), stage), 0)
    end
    lists[stage + 1] = list
  end
  return lists
end

-- Validate and simulate: {makespan, bubble, stages = {{busy, peak, spans = {{start, stop}}}}}.
-- costs: {fwd = 1, bwd_input = 1, bwd_weight = 1, latency = 0} by default.
function schedule.simulate(lists, shape, costs)
  return core.sched_simulate(lists, { stages = shape.stages, microbatches = shape.microbatches,
    chunks = shape.chunks or 1 }, costs)
end

-- The bubble formula a built-in schedule is known by, with equal costs: text, value and
-- a note (nil for a schedule that has none).
function schedule.formula(name, p, m, v)
  if name == "gpipe" or name == "1f1b" then
    return string.format("(p-1)/(m+p-1) = %d/%d", p - 1, m + p - 1), (p - 1) / (m + p - 1), ""
  elseif name == "interleaved" then
    return string.format("(p-1)/(v*m+p-1) = %d/%d", p - 1, v * m + p - 1), (p - 1) / (v * m + p - 1),
      " (Narayanan et al. 2021: bubble / ideal time = (1/v)(p-1)/m)"
  elseif name == "zb1" then
    return string.format("(p-1)(F+B-W)/(m(F+B+W)+(p-1)(F+B-W)) = %d/%d", p - 1, 3 * m + p - 1),
      (p - 1) / (3 * m + p - 1), " (Qi et al. 2024, for m >= p" .. (m < p
        and "; here m < p, too few W's to fill the cool-down)" or ")")
  end
end

local letter = { FWD = "F", BWD = "B", BWD_INPUT = "B", BWD_WEIGHT = "W" }
local digits = "0123456789abcdefghijklmnopqrstuvwxyz"
local function base36(n) return n < 36 and digits:sub(n + 1, n + 1) or "+" end

-- Cell label of a compute instruction: kind letter, micro-batch (0-9a-z), and the chunk
-- when there are several.
local function label(instr, v)
  return letter[instr.op] .. base36(instr.mb) .. (v > 1 and base36(instr.chunk or 0) or "")
end

-- One row per stage, one cell per unit of time: text lines (a table).
function schedule.text(lists, sim, shape)
  local v = shape.chunks or 1
  local width = v > 1 and 3 or 2
  local idle = string.rep(".", width)
  local cols = math.ceil(sim.makespan - 1e-9)
  local rows = {}
  for k, list in ipairs(lists) do
    local cells = {}
    for t = 1, cols do cells[t] = idle end
    for i, instr in ipairs(list) do
      local span = sim.stages[k].spans[i]
      if letter[instr.op] and span[2] > span[1] then
        for t = math.floor(span[1] + 1e-9) + 1, math.ceil(span[2] - 1e-9) do cells[t] = label(instr, v) end
      end
    end
    rows[k] = string.format("stage %-3d %s", k - 1, table.concat(cells, " "))
  end
  return rows
end

local function esc(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }))
end

-- The same picture as an SVG document (a string).
function schedule.svg(title, lists, sim, shape)
  local v = shape.chunks or 1
  local cw, rh, left, top = 22, 26, 70, 48
  local w = math.max(left + math.max(1, sim.makespan) * cw + 20, 820)
  local h = top + #lists * rh + 40
  local fill = { F = "#4e79a7", B = "#59a14f", W = "#f28e2b" }
  local out = { string.format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
    .. 'viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">', w, h, w, h),
    string.format('<rect width="%d" height="%d" fill="white"/>', w, h),
    string.format('<text x="%d" y="20" font-size="14">%s</text>', left, esc(title)),
    string.format('<text x="%d" y="36" fill="#555">bubble %.4f, makespan %g; F forward, B '
      .. 'backward (input gradient when split), W weight gradient; label: micro-batch%s</text>',
      left, sim.bubble, sim.makespan, v > 1 and ", chunk" or "") }
  for k, list in ipairs(lists) do
    local y = top + (k - 1) * rh
    out[#out + 1] = string.format('<text x="8" y="%d">stage %d</text>', y + rh / 2 + 4, k - 1)
    out[#out + 1] = string.format('<rect x="%d" y="%d" width="%g" height="%d" fill="#eee"/>',
      left, y + 2, sim.makespan * cw, rh - 4)
    for i, instr in ipairs(list) do
      local span, l = sim.stages[k].spans[i], letter[instr.op]
      if l and span[2] > span[1] then
        local x, wd = left + span[1] * cw, (span[2] - span[1]) * cw
        out[#out + 1] = string.format('<rect x="%g" y="%d" width="%g" height="%d" fill="%s" '
          .. 'stroke="white"><title>%s mb %d chunk %d: %g..%g</title></rect>', x, y + 2, wd,
          rh - 4, fill[l], instr.op, instr.mb, instr.chunk or 0, span[1], span[2])
        out[#out + 1] = string.format('<text x="%g" y="%d" fill="white" text-anchor="middle">%s</text>',
          x + wd / 2, y + rh / 2 + 4, esc(instr.mb .. (v > 1 and "." .. (instr.chunk or 0) or "")))
      end
    end
  end
  local y = top + #lists * rh + 16
  for t = 0, math.floor(sim.makespan), math.max(1, math.floor(sim.makespan / 20 + 0.5)) do
    out[#out + 1] = string.format('<text x="%g" y="%d" fill="#555" text-anchor="middle">%d</text>',
      left + t * cw, y, t)
  end
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n") .. "\n"
end

local usage = "usage: loom schedule NAME --pp P --micro M [--chunks V] [-o FILE.svg] [--costs FILE.json]  (loom schedule --help)"

-- --costs FILE.json: {"each": [[cost of each instruction of stage 0's list, ...], ...]}, a
-- number per instruction in list order (a transfer's is ignored): each F/B/W takes its
-- own time (scripts/pp_replay.py replays a traced run so).
local function read_costs(path)
  local f, err = io.open(path, "rb")
  if not f then error("schedule: --costs: cannot read " .. err, 0) end
  local text = f:read("a")
  f:close()
  local ok, t = pcall(require("loom.json").decode, text)
  if not ok or type(t) ~= "table" or type(t.each) ~= "table" then
    error(string.format("schedule: --costs %s: want a JSON object {\"each\": [[cost, ...], ...]} "
      .. "(one list per stage, one number per instruction)%s", path, ok and "" or ": " .. tostring(t)), 0)
  end
  return t
end

-- `loom schedule NAME --pp P --micro M [--chunks V] [-o FILE.svg] [--costs FILE.json]`
function schedule.main(args)
  local name, opts, out, costs_file = nil, {}, nil, nil
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--pp" or a == "--micro" or a == "--chunks" then
      local n = math.tointeger(tonumber(args[i + 1] or ""))
      if not n or n < 1 then
        error(string.format("schedule: %s needs a whole number >= 1 (got %s)\n%s", a,
          args[i + 1] and "'" .. args[i + 1] .. "'" or "nothing", usage), 0)
      end
      opts[a:sub(3)] = n
      i = i + 2
    elseif a == "--costs" then
      costs_file = args[i + 1]
      if not costs_file then error("schedule: --costs needs a JSON file (--costs costs.json)", 0) end
      i = i + 2
    elseif a == "-o" or a == "--output" then
      out = args[i + 1]
      if not out then error("schedule: -o needs a file name (-o 1f1b.svg)", 0) end
      i = i + 2
    elseif a:sub(1, 1) == "-" then
      error("schedule: unknown option '" .. a .. "'\n" .. usage, 0)
    elseif name then
      error("schedule: one schedule at a time (got '" .. name .. "' and '" .. a .. "')\n" .. usage, 0)
    else
      name, i = a, i + 1
    end
  end
  if not name then error("schedule: which schedule? (gpipe, 1f1b, interleaved, zb1 or a .lua file)\n" .. usage, 0) end
  if not opts.pp or not opts.micro then error("schedule: --pp and --micro are required\n" .. usage, 0) end
  local shape = { stages = opts.pp, microbatches = opts.micro,
    chunks = opts.chunks or (name == "interleaved" and 2 or 1) }
  local ok, lists = pcall(schedule.lists, name, shape)
  if not ok then error("schedule: " .. tostring(lists):gsub("^schedule: ", ""), 0) end
  local costs = costs_file and read_costs(costs_file) or nil
  local ok2, sim = pcall(schedule.simulate, lists, shape, costs)
  if not ok2 then error("schedule " .. name .. ": " .. tostring(sim), 0) end
  local p, m, v = shape.stages, shape.microbatches, shape.chunks
  local title = string.format("%s  pp=%d micro=%d chunks=%d", name, p, m, v)
  if costs then -- its own times: no unit cells to draw, and no formula to compare with
    print(title .. "  (each instruction's cost from " .. costs_file .. ", SEND/RECV take no time)")
    print(string.format("makespan %.6f", sim.makespan))
    print(string.format("bubble: simulated %.6f", sim.bubble))
    return
  end
  print(title .. "  (F = B = W = 1, fused BWD = 2, SEND/RECV take no time)")
  print("F forward, B backward (input gradient when split), W weight gradient, then the micro-batch"
    .. (v > 1 and " and the chunk" or "") .. "; '.' idle")
  for _, row in ipairs(schedule.text(lists, sim, shape)) do print(row) end
  print(string.format("makespan %g", sim.makespan))
  local ftext, fvalue, note = schedule.formula(name, p, m, v)
  print(string.format("bubble: simulated %.6f, formula %s", sim.bubble,
    ftext and string.format("%s = %.6f%s", ftext, fvalue, note) or "(none for this schedule)"))
  local peaks = {}
  for k, st in ipairs(sim.stages) do peaks[k] = string.format("stage %d: %d", k - 1, st.peak) end
  print("peak micro-batches in flight" .. (v > 1 and " (micro-batch, chunk pairs)" or "") .. ": "
    .. table.concat(peaks, ", "))
  if out then
    local f, err = io.open(out, "wb")
    if not f then error("schedule: cannot write " .. err, 0) end
    f:write(schedule.svg(title, lists, sim, shape))
    f:close()
    print("wrote " .. out)
  end
end

return schedule
