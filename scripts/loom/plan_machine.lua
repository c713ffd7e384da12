-- loom.plan_machine — the machine model loom plan costs a layout with (docs/PLAN.md):
-- per device, GEMM and attention time by size (forward and backward, as FLOP/s at
-- measured sizes, interpolated over log FLOPs) and memory bandwidth; per link (intra: the
-- ranks of one node, inter: across nodes), latency and bus bandwidth per collective kind.
--
-- Profiles are JSON: the bundled ones in scripts/loom/machines/ (spec-sheet figures with
-- their sources, and the efficiency each assumes, in the file), or one that
-- `loom plan --calibrate` measured on this machine (default path: machine.default_path()).
-- A profile's `disk` (read_Bps, write_Bps: an offload file's bytes per second, through the
-- page cache) prices strategy.offload = "disk"; a profile without one cannot plan it.
-- What not: calibration measures only the CPU backend and the shm communicator here; a
-- GPU profile's rates are the data sheet's peak times an assumed efficiency curve.
local core = require "loom.core"
local json = require "loom.json"
local machine = {}

local function dir_of(p) return p:match("^(.*)/[^/]*$") or "." end

function machine.bundled_dir()
  return dir_of(package.searchpath("loom.plan_machine", package.path)) .. "/machines"
end

-- Where --calibrate saves and a run's summary looks first: $LOOM_MACHINE, else
-- $XDG_CACHE_HOME/loom/machine.json, else ~/.cache/loom/machine.json.
function machine.default_path()
  local env = os.getenv("LOOM_MACHINE")
  if env and env ~= "" then return env end
  local cache = os.getenv("XDG_CACHE_HOME")
  if not cache or cache == "" then cache = (os.getenv("HOME") or ".") .. "/.cache" end
  return cache .. "/loom/machine.json"
end

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  local ok, v = pcall(json.decode, text)
  if not ok or type(v) ~= "table" then
    error(string.format("plan: machine profile %s is not valid JSON (%s)", path, tostring(v)), 0)
  end
  return v
end

-- The names of the bundled profiles.
function machine.list()
  local names = {}
  local p = io.popen(string.format("ls %q 2>/dev/null", machine.bundled_dir()))
  for line in p:lines() do
    local n = line:match("^(.-)%.json$")
    if n then names[#names + 1] = n end
  end
  p:close()
  return names
end

-- A profile by bundled name or file path; nil name: the calibrated one, else nil.
function machine.load(name)
  if not name then
    local v = read(machine.default_path())
    return v, v and machine.default_path()
  end
  local path = name:match("%.json$") and name or (machine.bundled_dir() .. "/" .. name .. ".json")
  local v = read(path)
  if not v then
    error(string.format("plan: no machine profile '%s' (bundled: %s; or a JSON file; or run "
      .. "loom plan --calibrate)", name, table.concat(machine.list(), ", ")), 0)
  end
  return v, path
end

-- Shapes the device bench measures: GEMMs (M, K, N) from 2^21 to ~2^32 FLOPs, and
-- attention (B, T, C, NH). Small enough that a calibration takes seconds on 2 cores.
local gemm_shapes = {
  { 64, 32, 96 }, { 128, 32, 128 }, { 128, 64, 192 }, { 256, 64, 256 }, { 256, 128, 384 },
  { 512, 128, 512 }, { 512, 256, 768 }, { 1024, 256, 1024 }, { 1024, 512, 1536 },
}
local attention_shapes = { { 2, 32, 32, 2 }, { 4, 64, 64, 4 }, { 4, 128, 128, 4 }, { 8, 128, 256, 8 } }

local function points(rows, flops_of, key)
  local pts = {}
  for _, r in ipairs(rows) do
    local f = flops_of(r, key == "bwd_s")
    pts[#pts + 1] = { f, f / r[key] }
  end
  table.sort(pts, function(a, b) return a[1] < b[1] end)
  return pts
end

local function gemm_flops(r, bwd) return 2 * r[1] * r[2] * r[3] * (bwd and 2 or 1) end
local function att_flops(r, bwd) return 4 * r[1] * r[2] * r[2] * (r[3]) * (bwd and 2 or 1) end

-- Device rates for `threads` compute threads (the backend's own kernels).
function machine.bench_device(threads, min_s, cpu_clock)
  local b = core.bench_device { backend = "cpu", threads = threads, min_s = min_s or 0.03, cpu_clock = cpu_clock,
    gemm = gemm_shapes, attention = attention_shapes, bandwidth_floats = 8 << 20,
    -- the element-wise kernels, AdamW and the gradient passes over 8 MiB arrays: in a step
    -- they stream arrays that the rest of the step has pushed out of the caches (the
    -- model's gradients and optimizer state, the activations forward saved). Timed at
    -- 1 MiB (cache-resident) they ran at half the cost they have in a step: perf on the
    -- one-rank probe (Xeon, load 6) put AdamW at 1.43 ns an element (1 MiB bench 0.72, 8
    -- MiB 1.35), the norm and non-finite passes at 1.35 (0.48, 1.35-1.5), GELU backward
    -- at 1.7 (0.75, 1.3): the plan's 10-12% under on one-rank rows
    elementwise = 2 << 20, elementwise16 = 1 << 18, -- (bf16's round_to follows its writer: hot)
    evict_floats = 4 << 20, bf16 = true } -- (16 MiB written between GEMM repeats: cold operands, as in a step)
  -- bf16's compute path (plan.lua's bf16 terms): its forward products (matmul_forward_dt)
  -- and the conversions per element; absent where the backend has none
  local bf16 = b.bf16 and { gemm_fwd = points(b.bf16.gemm, gemm_flops, "fwd_s"), per_element = b.bf16.per_element }
  return {
    bf16 = bf16,
    gemm_fwd = points(b.gemm, gemm_flops, "fwd_s"), gemm_bwd = points(b.gemm, gemm_flops, "bwd_s"),
    attention_fwd = points(b.attention, att_flops, "fwd_s"),
    attention_bwd = points(b.attention, att_flops, "bwd_s"),
    bandwidth = b.bandwidth, per_element = b.per_element, source = "measured: core.bench_device, " .. b.describe,
    page_fault = core.bench_refault { bytes = 4 << 20, min_s = min_s or 0.03, cpu_clock = cpu_clock },
    -- ZeRO-3's offloaded parameters brought in from the host pool, unit by unit (its own
    -- noisy small-size figure: the longer minimum)
    bring = core.bench_bring { min_s = math.max(0.1, min_s or 0), cpu_clock = cpu_clock },
  }
end

-- Run the plan script `module` (loom.plan_device, loom.plan_comm) on `n` local ranks of
-- `comm` under loom launch with `args` ("key=value ..."), and read the table it writes to a
-- temporary file; `what` names it in the error when it fails.
local function ranks_bench(what, module, n, comm, args)
  local out = os.tmpname()
  local script = package.searchpath(module, package.path)
  local cmd = string.format("%s %q out=%s %s >/dev/null", require("loom.launcher").ranks(comm, n),
    script, out, args)
  local ok = os.execute(cmd)
  local v = ok and read(out)
  os.remove(out)
  if not v then error("plan --calibrate: the " .. what .. " failed (" .. cmd .. ")", 0) end
  return v
end

-- The same device rates measured in `n` processes at once, one thread each (plan_device.lua
-- under loom launch): what each of a layout's ranks gets while the others run beside it.
function machine.bench_device_shared(n, min_s, cpu_clock)
  return ranks_bench("shared-device benchmark", "loom.plan_device", n, "shm", string.format(
    "clock=%s%s", cpu_clock and "cpu" or "wall", min_s and (" min_s=" .. min_s) or ""))
end

-- Collective latency and bus bandwidth over `n` local ranks of `comm` (loom bench comm's
-- engine, run by loom launch): latency = the smallest size's time, busbw the largest's.
function machine.bench_comm(n, comm, cpu_clock)
  return ranks_bench("communicator benchmark", "loom.plan_comm", n, comm, string.format(
    "comm=%s clock=%s", comm, cpu_clock and "cpu" or "wall"))
end

-- The links' figures calibrate keeps: bench_comm over opts.ranks (2) ranks of opts.comm
-- (shm), and the bytes a rank's communicator stages (shm.h: SLOTS x chunk_bytes).
local function measure_links(opts, cpu_clock)
  local comm = machine.bench_comm(opts.ranks or 2, opts.comm or "shm", cpu_clock)
  comm.staging_bytes_per_rank = (opts.comm or "shm") == "shm" and 3 * 1048576 or 0
  return comm
end

-- Measure this machine; returns the profile (the caller saves it). opts.from: a profile of
-- this machine whose figures are kept but the collectives' (links), measured again over
-- opts.comm (`loom plan --calibrate --comm mpi --from machine.json`: seconds, not a minute).
function machine.calibrate(opts)
  opts = opts or {}
  if opts.from then
    local base = opts.from
    if not (base.device and base.device.rates and base.links and base.disk and base.measured) then
      error("plan --calibrate --from: not a calibrated profile (loom plan --calibrate makes one)", 0)
    end
    -- (on the profile's own clock)
    local comm = measure_links(opts, base.clock == "cpu")
    local p = machine.median { base } -- (a copy)
    p.measured.calibrations = nil
    p.links = { intra = comm, inter = comm }
    p.measured.comm, p.measured.ranks = opts.comm or "shm", opts.ranks or 2
    p.measured.links_date = os.date("!%Y-%m-%d %H:%M UTC")
    return p
  end
  local cores = tonumber(io.popen("nproc"):read("l")) or 1
  local rates = {}
  local counts = { 1 }
  if cores > 1 then counts[2] = cores end
  if opts.cpu_clock then counts = { 1 } end -- CPU time is per process: one thread's rates
  for _, n in ipairs(counts) do rates[tostring(n)] = machine.bench_device(n, opts.min_s, opts.cpu_clock) end
  -- on a CPU clock, also each rank's rates while `cores` ranks run at once (plan.lua uses
  -- them for layouts of two or more ranks on the node)
  local shared = nil
  if opts.cpu_clock and cores > 1 then shared = { ["1"] = machine.bench_device_shared(cores, opts.min_s, true) } end
  local comm = measure_links(opts, opts.cpu_clock)
  -- the process's own bytes: VmHWM of a small run less what the plan predicts for it
  local probe = package.searchpath("loom.plan_runtime", package.path)
  local p = io.popen(string.format("LOOM_MACHINE=/nonexistent %q run %q 2>&1", LOOM_EXE, probe))
  local text = p:read("a")
  p:close()
  local hwm, pred = text:match("RUNTIME (%d+) (%d+)")
  if not hwm then error("plan --calibrate: the runtime probe failed:\n" .. text, 0) end
  opts.runtime_bytes = tonumber(hwm) - tonumber(pred)
  -- the offload file's reads and writes (core.bench_disk: pread/pwrite through the page
  -- cache in the directory a disk offload would use; TMPDIR else /tmp unless --disk-dir)
  local disk_dir = opts.disk_dir or os.getenv("TMPDIR") or "/tmp"
  if disk_dir == "" then disk_dir = "/tmp" end
  local disk = core.bench_disk { dir = disk_dir, cpu_clock = opts.cpu_clock, min_s = opts.min_s }
  -- and at the sizes a step moves (the state and parameters of a stage, read and written
  -- once): the rate depends on them (this Xeon, load 5, interleaved: 6.7 MB at 9.4-14.3 /
  -- 8.3-12.1 GB/s read / write, 16 MiB at 6.1-6.7 / 5.1-5.3 in the same minute), so
  -- plan.lua interpolates over log bytes (disk.sizes, ascending; the ends held beyond)
  disk.sizes = {}
  for _, mib in ipairs { 2, 4, 8, 16, 64 } do
    local d = mib == 16 and disk or core.bench_disk { dir = disk_dir, bytes = mib << 20,
      cpu_clock = opts.cpu_clock, min_s = opts.min_s }
    disk.sizes[#disk.sizes + 1] = { bytes = mib << 20, read_Bps = d.read_Bps, write_Bps = d.write_Bps }
  end
  -- (and ZeRO-3's parameters read from such a file, unit by unit, by a reader thread)
  disk.bring = core.bench_bring { dir = disk_dir, cpu_clock = opts.cpu_clock, min_s = math.max(0.1, opts.min_s or 0) }
  disk.source = "measured: core.bench_disk, 2-64 MiB in 1 MiB pieces through the page cache, at the state's size"
  local lf = io.open("/proc/loadavg")
  local load = lf and lf:read("n") or -1
  if lf then lf:close() end
  return {
    name = "calibrated", devices_per_node = cores, clock = opts.cpu_clock and "cpu" or "wall",
    measured = { date = os.date("!%Y-%m-%d %H:%M UTC"), load_average = load, cores = cores,
      comm = opts.comm or "shm", ranks = opts.ranks or 2 },
    device = { name = "cpu (" .. cores .. " cores)", cores = cores, rates = rates, rates_shared = shared },
    links = { intra = comm, inter = comm },
    runtime_bytes = opts.runtime_bytes or 0,
    disk = disk,
    overlap_dp = false,
  }
end

-- The median of several profiles, figure by figure (every number at the same place in
-- each: the same shapes, sizes and keys, as calibrate measures them; the rest from the
-- first). `loom plan --calibrate --repeats N`: one calibration's figures move between
-- calibrations (the shared-node rates most: co-running processes' phases), a median of N
-- moves less; each figure is still a measurement.
local function median_of(values)
  table.sort(values)
  local n = #values
  return n % 2 == 1 and values[(n + 1) // 2] or (values[n // 2] + values[n // 2 + 1]) / 2
end

function machine.median(profiles)
  local function merge(first, path)
    if type(first) == "number" then
      local vals = {}
      for _, p in ipairs(profiles) do
        local v = p
        for _, k in ipairs(path) do v = type(v) == "table" and v[k] or nil end
        if type(v) == "number" then vals[#vals + 1] = v end
      end
      return median_of(vals)
    elseif type(first) ~= "table" then return first end
    local out = {}
    for k, v in pairs(first) do
      path[#path + 1] = k
      out[k] = merge(v, path)
      path[#path] = nil
    end
    return out
  end
  local m = merge(profiles[1], {})
  m.measured.calibrations = #profiles
  return m
end

function machine.save(profile, path)
  path = path or machine.default_path()
  core.mkdir_p(dir_of(path))
  local f, err = io.open(path, "wb")
  if not f then error("plan --calibrate: cannot write " .. path .. ": " .. tostring(err), 0) end
  f:write(json.encode(profile), "\n")
  f:close()
  return path
end

return machine
