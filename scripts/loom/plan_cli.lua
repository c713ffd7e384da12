-- loom.plan_cli — the `loom plan` command, loom.plan{...} and the run's own check of the
-- plan (docs/PLAN.md):
--   loom plan RECIPE [key=value ...] [--machine NAME|FILE] [--devices-per-node G]
--   loom plan RECIPE --world N --devices-per-node G --mem 80GiB [--any-tp] [--any-pp] [--top K]
--   loom plan --calibrate [--out FILE] [-n RANKS] [--comm shm|mpi] [--cpu-clock] [--disk-dir DIR] [--repeats N]
--                         [--from PROFILE]
-- A recipe is read by running it with loom.train capturing its checked table (nothing is
-- allocated, no rank starts). With no --machine the calibrated profile is used
-- (plan_machine.default_path()), else the bundled "cpu-2core".
local core = require "loom.core"
local json = require "loom.json"
local plan = require "loom.plan"
local machine = require "loom.plan_machine"
local cli = {}

local function fail(fmt, ...) error("plan: " .. string.format(fmt, ...), 0) end

-- "80GiB", "80GB", "512MiB", "1e9" -> bytes.
function cli.bytes(text)
  local n, unit = tostring(text):match("^([%d%.eE+]+)%s*(%a*)$")
  local scale = ({ [""] = 1, B = 1, KiB = 1024, MiB = 1 << 20, GiB = 1 << 30, TiB = 1 << 40,
    KB = 1e3, MB = 1e6, GB = 1e9, TB = 1e12 })[unit or ""]
  if not n or not tonumber(n) or not scale then
    fail("--mem %s: give bytes with a unit, e.g. 80GiB, 80GB or 512MiB", tostring(text))
  end
  return tonumber(n) * scale
end

-- The recipe's checked loom.train table, the command line's key=value applied.
function cli.capture(path, overrides)
  local loom = require "loom"
  local f = io.open(path, "rb")
  if not f then fail("no recipe '%s'", path) end
  f:close()
  local saved_arg, saved_over = arg, rawget(core, "overrides")
  arg = { [0] = path }
  rawset(core, "overrides", overrides or {})
  local got, sentinel = nil, {}
  loom.capture = function(t) got = t; error(sentinel, 0) end
  local chunk, err = loadfile(path)
  local ok, e = true, nil
  if chunk then ok, e = pcall(chunk) else ok, e = false, err end
  loom.capture, arg = nil, saved_arg
  rawset(core, "overrides", saved_over)
  if not got then
    if ok then fail("%s did not call loom.train{...}: loom plan reads a loom.train recipe", path) end
    error(e, 0)
  end
  return got
end

-- The machine profile: a name or file, else the calibrated one, else the bundled cpu-2core.
function cli.machine(name)
  if name then return machine.load(name) end
  local m, path = machine.load(nil)
  if m then return m, path end
  local b, bpath = machine.load("cpu-2core")
  return b, bpath, true -- the bundled default: not a measurement of this machine
end

local function mib(b) return string.format("%.2f MiB", b / 1048576) end
local function human_bytes(b)
  if b >= 1 << 30 then return string.format("%.2f GiB", b / (1 << 30)) end
  return mib(b)
end
local function ms(s) return string.format("%.3f ms", s * 1e3) end

local function layout_text(l)
  local parts = { string.format("dp=%d tp=%d pp=%d zero=%d micro=%d", l.dp, l.tp, l.pp, l.zero, l.micro) }
  if (l.ep or 1) > 1 then parts[1] = parts[1]:gsub(" zero=", string.format(" ep=%d zero=", l.ep)) end
  if l.pp > 1 then parts[#parts + 1] = string.format("%s%s x%d micro-batches", l.schedule,
    l.chunks > 1 and string.format(" (%d chunks)", l.chunks) or "", l.accum)
  elseif l.accum > 1 then parts[#parts + 1] = string.format("accum %d", l.accum) end
  local rc = type(l.recompute) == "table" and ("blocks {" .. table.concat(l.recompute, ",") .. "}") or l.recompute
  if rc ~= "none" then parts[#parts + 1] = "recompute " .. rc end
  if l.offload then parts[#parts + 1] = "offload " .. l.offload .. (l.offload_params and "+params" or "") end
  if l.sp then parts[#parts + 1] = "sp" end
  parts[#parts + 1] = l.precision
  return table.concat(parts, " ")
end
cli.layout_text = layout_text

-- The report of one layout's plan.
function cli.report(p, out)
  out = out or print
  out(string.format("layout: %s", layout_text(p.layout)))
  local n = #p.memory
  local head = { string.format("%-26s", "memory per rank") }
  for k = 1, n do head[#head + 1] = string.format("%14s", n > 1 and ("stage " .. (k - 1)) or "") end
  out(table.concat(head))
  local rows = {
    { "parameters", "params" }, { "gradients", "grads" }, { "optimizer state", "optimizer" },
    { "master weights", "master" }, { "activations", "activations" },
    { "communication buffers", "comm" }, { "workspace", "workspace" },
    { "zero transient", "transient" }, { "(optimizer offloaded)", "optimizer_offloaded" },
    { "(params offloaded)", "params_offloaded" }, { "teacher parameters", "teacher_params" },
    { "teacher gradient buffer", "teacher_grads" }, { "teacher activations", "teacher_activations" },
    { "distillation buffers", "distill" },
    { "total", "total" },
  }
  for _, row in ipairs(rows) do
    local any = false
    for k = 1, n do any = any or p.memory[k][row[2]] > 0 end
    if any or row[2] == "total" then
      local line = { string.format("  %-24s", row[1]) }
      for k = 1, n do line[#line + 1] = string.format("%14s", human_bytes(p.memory[k][row[2]])) end
      out(table.concat(line))
    end
  end
  out(string.format("  peak RSS predicted: %s (largest rank %s + runtime %s)", human_bytes(p.rss),
    human_bytes(p.peak_bytes), human_bytes(p.rss - p.peak_bytes - (p.layout.offload == "host" and p.memory[p.peak_stage].optimizer_offloaded + p.memory[p.peak_stage].params_offloaded or 0))))
  local t = p.time
  out(string.format("step time: %s", ms(t.step_s)))
  out(string.format("  %-24s %s", "compute", ms(t.compute_s)))
  if p.layout.pp > 1 then out(string.format("  %-24s %s (%.1f%% of the pipeline)", "pipeline bubble", ms(t.bubble_s), 100 * t.bubble)) end
  -- (inside compute: a distillation teacher's forward and its terms, docs/DISTILL.md)
  if (t.teacher_s or 0) > 0 then out(string.format("    %-22s %s", "of which teacher forward", ms(t.teacher_s))) end
  if (t.kd_terms_s or 0) > 0 then out(string.format("    %-22s %s", "of which distill terms", ms(t.kd_terms_s))) end
  for _, c in ipairs(t.comm) do
    out(string.format("  %-24s %s (%d per step)%s", c.kind .. " over " .. c.group, ms(c.s), c.count,
      c.group == "dp" and t.exposed_dp_s < c.s and " (overlapped with backward)" or ""))
  end
  out(string.format("  %-24s %s", "optimizer step", ms(t.optimizer_s)))
  if t.refault_s > 0 then out(string.format("  %-24s %s", "page faults (ZeRO)", ms(t.refault_s))) end
  if (t.disk_io_s or 0) > 0 then out(string.format("  %-24s %s", "offload file I/O", ms(t.disk_io_s))) end
  if (t.w16_refresh_s or 0) > 0 then out(string.format("  %-24s %s", "bf16 weight copy", ms(t.w16_refresh_s))) end
  if t.offload_s then out(string.format("  %-24s %s", "offload transfers", ms(t.offload_s))) end
  out(string.format("tokens/s: %.4g (%d tokens per step)%s", p.tokens_per_s, p.tokens_per_step,
    p.mfu and string.format(" | MFU %.1f%%", 100 * p.mfu) or " | MFU n/a (the profile has no peak FLOP/s)"))
  out("assumptions:")
  for _, a in ipairs(p.assumptions) do out("  - " .. a) end
end

local function parse(args)
  local o = { overrides = {} }
  local flags = { ["--machine"] = "machine", ["--world"] = "world", ["--devices-per-node"] = "per_node",
    ["--mem"] = "mem", ["--out"] = "out", ["-n"] = "ranks", ["--top"] = "top",
    ["--disk-dir"] = "disk_dir", ["--comm"] = "comm", ["--repeats"] = "repeats", ["--from"] = "from" }
  local i = 1
  while i <= #args do
    local a = args[i]
    if flags[a] then
      if not args[i + 1] then fail("%s needs a value (loom plan --help)", a) end
      o[flags[a]] = args[i + 1]
      i = i + 1
    elseif a == "--calibrate" then o.calibrate = true
    elseif a == "--cpu-clock" then o.cpu_clock = true
    elseif a == "--any-tp" then o.any_tp = true
    elseif a == "--any-pp" then o.any_pp = true
    elseif a == "--json" then o.json = true
    elseif a:sub(1, 1) == "-" then fail("unknown option '%s' (loom plan --help)", a)
    elseif a:find("=", 1, true) and o.recipe then
      local eq = a:find("=", 1, true)
      o.overrides[#o.overrides + 1] = { a:sub(1, eq - 1), a:sub(eq + 1) }
    elseif not o.recipe then o.recipe = a
    else fail("'%s' is not a key=value override", a) end
    i = i + 1
  end
  for _, k in ipairs { "world", "per_node", "ranks", "top", "repeats" } do
    if o[k] then
      local v = math.tointeger(tonumber(o[k]))
      if not v or v < 1 then fail("%s=%s must be a whole number >= 1", k, o[k]) end
      o[k] = v
    end
  end
  return o
end

local function search_report(res, out)
  out(string.format("search: %d ranks, %d per node, %s per device, %d sequences per step: %d layouts tried, %d fit%s",
    res.world, res.devices_per_node, human_bytes(res.mem), res.global_batch, res.tried, res.fit,
    res.refused > 0 and string.format(" (%d refused by their schedule's shape rules%s)", res.refused,
      res.teacher and " or the teacher's layout rules" or "") or ""))
  out(string.format("rules: tp inside a node %s; pipeline stages across nodes %s",
    res.rules.tp_in_node and "(on; --any-tp lifts it)" or "(lifted)",
    res.rules.pp_across_nodes and "(on; --any-pp lifts it)" or "(lifted)"))
  if #res.ranked == 0 then
    out("no layout fits: more devices, more memory per device, or a smaller micro-batch / model")
    return
  end
  out(string.format("%4s %12s %7s %11s %12s  %s", "rank", "tokens/s", "MFU", "step", "memory", "layout"))
  for i, p in ipairs(res.ranked) do
    out(string.format("%4d %12.4g %6s %11s %12s  %s", i, p.tokens_per_s,
      p.mfu and string.format("%.1f%%", 100 * p.mfu) or "n/a", ms(p.time.step_s), human_bytes(p.need_bytes),
      layout_text(p.layout)))
  end
end

function cli.main(args)
  local o = parse(args or {})
  if o.calibrate then
    if o.comm then
      local ok, err = pcall(core.check_plugin, "comm", { name = o.comm })
      if not ok then fail("--comm %s: %s", o.comm, err) end
    end
    -- (--repeats N: N calibrations, each figure their median: plan_machine.median)
    local profs = {}
    for _ = 1, o.repeats or 1 do
      profs[#profs + 1] = machine.calibrate { ranks = o.ranks or 2, cpu_clock = o.cpu_clock,
        disk_dir = o.disk_dir, comm = o.comm, from = o.from and machine.load(o.from) }
    end
    local prof = #profs > 1 and machine.median(profs) or profs[1]
    local path = machine.save(prof, o.out)
    local r1 = prof.device.rates["1"]
    print(string.format("calibrated: %d cores, GEMM %.3g-%.3g GFLOP/s forward (1 thread), bandwidth %.3g GB/s, "
      .. "allreduce latency %.1f us, bus %.3g GB/s, offload file in %s read %.3g / write %.3g GB/s (load average %.2f at the time)",
      prof.device.cores, r1.gemm_fwd[1][2] / 1e9, r1.gemm_fwd[#r1.gemm_fwd][2] / 1e9, r1.bandwidth / 1e9,
      prof.links.intra.allreduce.latency_s * 1e6, prof.links.intra.allreduce.busbw / 1e9, prof.disk.dir,
      prof.disk.read_Bps / 1e9, prof.disk.write_Bps / 1e9, prof.measured.load_average))
    print("saved " .. path)
    return
  end
  if not o.recipe then fail("which recipe? (usage: loom plan RECIPE [key=value ...]; loom plan --help)") end
  local t = cli.capture(o.recipe, o.overrides)
  local prof, path = cli.machine(o.machine)
  if o.world then
    if not o.mem then fail("--world needs --mem (the memory of one device, e.g. --mem 80GiB)") end
    local res = require("loom.plan_search").run(t, prof, { world = o.world, devices_per_node = o.per_node,
      mem = cli.bytes(o.mem), top = o.top, rules = { tp_in_node = not o.any_tp, pp_across_nodes = not o.any_pp } })
    print(string.format("loom plan: %s on %s (%s) — predicted, not measured", o.recipe, prof.name, path))
    search_report(res, print)
    return res
  end
  local p = plan.layout(t, prof, { devices_per_node = o.per_node })
  if o.json then print(json.encode(p)) return p end
  print(string.format("loom plan: %s on %s (%s) — predicted, not measured", o.recipe, prof.name, path))
  cli.report(p, print)
  return p
end

local function prof_cores(p) return p.cores end

-- After a run (loom.train calls this on every rank): this rank's predicted peak RSS and
-- step time beside the measured ones (VmHWM; the median step after the first), with the
-- relative errors; one line per rank on stderr, and one JSON line appended to
-- RUN_DIR/plan.jsonl when the run has a directory (log.jsonl's, else checkpoint.dir).
-- Never fails the run: a plan that cannot be made says why instead.
function cli.after_run(t, rank, measured, run_dir)
  -- on stderr, beside the warnings: a run's stdout stays what its recipe prints (tests and
  -- scripts compare it across runs; this line's measured figures differ every time)
  local function say(line) io.stderr:write(line, "\n") end
  local ok, p = pcall(function()
    local prof, path, bundled = cli.machine(nil)
    local res = plan.layout(t, prof)
    res.profile_path, res.cores, res.bundled = path, prof.device.cores, bundled
    return res
  end)
  if not ok then
    say(string.format("plan vs run (rank %d): no prediction (%s)", rank, tostring(p)))
    return
  end
  local mesh = t.mesh or {}
  local stage = rank // ((mesh.tp or 1) * (mesh.dp or 1)) + 1
  local rss, step = p.rss_stage[stage], p.time.step_s * 1e3
  local function err(pred, got) return got and got > 0 and (pred - got) / got or nil end
  local e_rss, e_step = err(rss, measured.peak_rss), err(step, measured.step_ms)
  say(string.format("plan vs run (rank %d, machine %s): peak RSS predicted %s measured %s (%s) | "
    .. "step predicted %.2f ms measured %s (%s)", rank, p.machine, mib(rss), mib(measured.peak_rss or 0),
    e_rss and string.format("%+.1f%%", 100 * e_rss) or "n/a", step,
    measured.step_ms and string.format("%.2f ms", measured.step_ms) or "n/a",
    e_step and string.format("%+.1f%%", 100 * e_step) or "n/a (one step)"))
  if p.bundled and rank == 0 then -- a newcomer's first runs: say why the step time is off
    say(string.format("plan vs run: machine %s is a bundled profile, not a measurement of this "
      .. "machine; `loom plan --calibrate` measures this one (about a minute), and later runs "
      .. "compare against it", p.machine))
  end
  local lf = io.open("/proc/loadavg")
  local load = lf and lf:read("n")
  if lf then lf:close() end
  local cores = (prof_cores(p) or 0)
  if load and cores > 0 and load > cores then
    say(string.format("plan vs run (rank %d): load average %.1f on %d cores: the measured step time includes "
      .. "waiting for a core (the plan's does not)", rank, load, cores))
  end
  if run_dir then
    local f = io.open(run_dir .. "/plan.jsonl", "ab")
    if f then
      f:write(json.encode { rank = rank, machine = p.machine, profile = p.profile_path,
        layout = layout_text(p.layout), predicted_peak_rss = rss, measured_peak_rss = measured.peak_rss,
        rss_error = e_rss, predicted_step_ms = step, measured_step_ms = measured.step_ms,
        step_error = e_step, memory = p.memory[stage] }, "\n")
      f:close()
    end
  end
  return p, e_rss, e_step
end

-- loom.plan{...}: the table (one layout; with world = N, the search's result).
function cli.api(t)
  if type(t) ~= "table" then error("loom.plan{...} takes a loom.train table", 2) end
  local r = {}
  for k, v in pairs(t) do r[k] = v end
  local name, world, per_node, mem = r.machine, r.world, r.devices_per_node, r.mem
  r.machine, r.world, r.devices_per_node, r.mem = nil, nil, nil, nil
  local prof = cli.machine(name)
  if world then
    return require("loom.plan_search").run(r, prof, { world = world, devices_per_node = per_node,
      mem = type(mem) == "number" and mem or cli.bytes(mem or "80GiB") })
  end
  return plan.layout(r, prof, { devices_per_node = per_node })
end

return cli
