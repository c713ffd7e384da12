-- loom.cli — commands of the `loom` program that are easier to write in Lua.
local core = require "loom.core"
local cli = {}

-- `loom plugins --keys NAME`: the keys plugin NAME (or KIND/NAME) accepts in a recipe
-- table, with type, default and help.
local function plugin_keys(spec)
  local kind, name = spec:match("^([%w_]+)/([%w_%-]+)$")
  local found = {}
  for _, p in ipairs(core.plugins()) do
    if not p.refused and p.name == (name or spec) and (not kind or p.kind == kind) then
      found[#found + 1] = p
    end
  end
  if #found == 0 then
    local names = {}
    for _, p in ipairs(core.plugins()) do
      if not p.refused then names[#names + 1] = p.kind .. "/" .. p.name end
    end
    error(string.format("plugins: no plugin '%s' (found: %s)", spec, table.concat(names, ", ")), 0)
  end
  local seen = {}
  for _, p in ipairs(found) do
    local id = p.kind .. "/" .. p.name
    if not seen[id] then -- a shadowed copy later in the search path is not the one used
      seen[id] = true
      print(string.format("%s %s %s — %s", p.kind, p.name, p.version, p.summary))
      local keys = core.plugin_keys(p.kind, p.name)
      if #keys == 0 then
        print("  (no keys)")
      else
        print(string.format("  %-18s %-15s %-14s %s", "KEY", "TYPE", "DEFAULT", "HELP"))
      end
      for _, k in ipairs(keys) do
        print(string.format("  %-18s %-15s %-14s %s", k.name, k.type,
          k.default or "(required)", k.help))
      end
    end
  end
end

-- `loom plugins [--keys NAME]`: every plugin found, in search order, and every file refused.
function cli.plugins(args)
  args = args or {}
  if args[1] == "--keys" then
    if not args[2] or args[3] then error("plugins: usage: loom plugins --keys NAME (e.g. adamw or optim/adamw)", 0) end
    return plugin_keys(args[2])
  elseif args[1] then
    error("plugins: unknown argument '" .. args[1] .. "' (usage: loom plugins [--keys NAME])", 0)
  end
  local rows, refused = {}, {}
  for _, p in ipairs(core.plugins()) do
    if p.refused then refused[#refused + 1] = p else rows[#rows + 1] = p end
  end
  print(string.format("%-10s %-10s %-8s %s", "KIND", "NAME", "VERSION", "SUMMARY / PATH"))
  for _, p in ipairs(rows) do
    print(string.format("%-10s %-10s %-8s %s", p.kind, p.name, p.version, p.summary))
    print(string.format("%-30s %s", "", p.path))
  end
  for _, p in ipairs(refused) do
    print("loom: " .. p.refused)
  end
end

-- `loom CMD --help`: the command's usage, options and an example (loom.help).
function cli.help(args)
  require("loom.help").show(args[1])
end

-- `loom plot A.jsonl [B.jsonl ...] [-o OUT.svg] [--smooth N] [--log]`: plot runs' metrics
-- files (see loom.plot). The output defaults to the first input's name with .svg for .jsonl.
function cli.plot(args)
  local inputs, out, opts = {}, nil, {}
  local short = "(usage: loom plot METRICS.jsonl [MORE.jsonl ...] [-o OUT.svg] [--smooth N] [--log]; loom plot --help)"
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "-o" or a == "--output" then -- (-h/--help never reach here: cli.c shows loom.help's text)
      out = args[i + 1]
      if not out then error("plot: -o needs a file name (loom plot METRICS.jsonl -o loss.svg)", 0) end
      i = i + 1
    elseif a == "--smooth" then
      local v = args[i + 1]
      opts.smooth = math.tointeger(tonumber(v or ""))
      if not opts.smooth or opts.smooth < 1 then
        error("plot: --smooth needs a whole number of steps, 1 or more (got " .. (v and "'" .. v .. "'" or "nothing")
          .. "; --smooth 20 averages over 20 steps)", 0)
      end
      i = i + 1
    elseif a == "--log" then
      opts.log = true
    elseif a:sub(1, 1) == "-" then
      error("plot: unknown option '" .. a .. "' " .. short, 0)
    else
      inputs[#inputs + 1] = a
    end
    i = i + 1
  end
  if #inputs == 0 then error("plot: which metrics file? " .. short, 0) end
  out = out or (inputs[1]:gsub("%.jsonl$", "") .. ".svg")
  local runs = require("loom.plot").write(inputs, out, opts)
  local what = {}
  for k, m in ipairs(runs) do
    what[k] = string.format("%s%d steps, %d validation points", #runs > 1 and m.name .. ": " or "", #m.train, #m.val)
  end
  print(string.format("wrote %s (%s)", out, table.concat(what, "; ")))
end

-- `loom schedule NAME --pp P --micro M [--chunks V] [-o FILE.svg] [--costs FILE.json]`: a pipeline schedule's
-- stages as text rows (and an SVG), its simulated bubble beside the formula, and each
-- stage's peak micro-batches in flight (loom.schedule).
function cli.schedule(args)
  require("loom.schedule").main(args)
end

-- `loom plan RECIPE [key=value ...]`, `--world N ... --mem M`, `--calibrate`: memory and
-- step time before the run, a search over layouts (loom.plan_cli; docs/PLAN.md).
function cli.plan(args)
  require("loom.plan_cli").main(args)
end

-- The optimizer table a manifest's recorded recipe used ({"1": "adamw", lr = ...} in JSON).
local function recorded_optimizer(manifest)
  local opt = (manifest.config or {}).optimizer
  if type(opt) == "string" then return { name = opt } end
  local t = { name = manifest.optimizer.name }
  for k, v in pairs(type(opt) == "table" and opt or {}) do
    if k ~= "1" and k ~= "name" then t[k] = v end
  end
  t.lr = t.lr or 1.0
  return t
end

-- A session holding a checkpoint's weights, from its manifest's model and recorded
-- optimizer: CKPT is a checkpoint (step_*) or a checkpoint dir (its newest complete
-- checkpoint). -> session, manifest, the checkpoint's path. Errors start with "what: ".
local function open_checkpoint(ckpt, what)
  local f = io.open(ckpt .. "/manifest.json", "rb")
  if not f then
    local found, why = core.find_checkpoint(ckpt)
    if not found then error(what .. ": " .. why, 0) end
    ckpt = found
    f = assert(io.open(ckpt .. "/manifest.json", "rb"))
  end
  local text = f:read("a")
  f:close()
  local ok, manifest = pcall(require("loom.json").decode, text)
  if not ok or type(manifest.model) ~= "table" or not manifest.optimizer then
    error(what .. ": " .. ckpt .. "/manifest.json is not a loom checkpoint manifest", 0)
  end
  local session = core.session {
    model = manifest.model, micro = 1, seq = 1, accum = 1, seed = 0, grad_clip = 0,
    optimizer = recorded_optimizer(manifest), precision = { name = "fp32" },
  }
  session:load(ckpt)
  return session, manifest, ckpt
end

-- `loom export --llmc CKPT OUT.bin`: a checkpoint's weights as an llm.c model file
-- (version 3, fp32), so llm.c's tools and anything that reads its format can use them.
-- CKPT is a checkpoint (step_*) or a checkpoint dir (its newest complete checkpoint).
function cli.export(args)
  local usage = "usage: loom export --llmc CKPT OUT.bin"
  if args[1] ~= "--llmc" or not args[2] or not args[3] or args[4] then error(usage, 0) end
  local session, manifest, ckpt = open_checkpoint(args[2], "export")
  local out, m = args[3], manifest.model
  if m.family == "llama" then
    error("export: " .. ckpt .. " holds a loom.llama model; llm.c's format has GPT-2 blocks only: "
      .. "use loom ckpt export CKPT OUT.safetensors (Hugging Face Llama layout)", 0)
  end
  core.llmc_save(session, out)
  print(string.format("wrote %s (llm.c model v3: L=%d H=%d C=%d V=%d Vp=%d ctx=%d) from %s",
    out, m.layers, m.heads, m.dim, m.vocab, m.vocab_padded, m.ctx, ckpt))
end

cli.sample = function(args) return require("loom.cli_sample")(args, open_checkpoint) end

-- `loom ckpt info CKPT`, `loom ckpt export CKPT OUT.safetensors` (loom.ckpt)
cli.ckpt = function(args) return require("loom.ckpt")(args, open_checkpoint) end

-- "1K" -> 1024, "64M" -> 67108864
local function bytes_of(text)
  local n, unit = text:match("^(%d+)([KkMmGg]?)$")
  if not n then error("bench: '" .. text .. "' is not a size like 1K, 64M or 4096", 0) end
  return math.tointeger(n) * (({ k = 1 << 10, m = 1 << 20, g = 1 << 30 })[unit:lower()] or 1)
end

-- `loom bench comm [-n N] [--op OP] [--sizes MIN:MAX] [--iters K] [--comm NAME]`: runs N
-- ranks of this program (loom launch; mpirun for comm "mpi") over the communicator and
-- prints nccl-tests' table.
-- Everything `loom bench comm` is given is checked here, before any rank is started.
function cli.bench(args)
  local usage = "usage: loom bench comm [-n N] [--op allreduce|reduce_scatter|allgather|broadcast]"
    .. " [--sizes 1K:64M] [--iters K] [--comm shm]  (loom bench --help)"
  if args[1] ~= "comm" then
    error("bench: " .. (args[1] and ("unknown benchmark '" .. args[1] .. "'") or "which benchmark?")
      .. " (the one there is: comm)\n" .. usage, 0)
  end
  local n, op, sizes, iters, comm = 2, "allreduce", "1K:64M", "0", "shm"
  local ops = { allreduce = true, reduce_scatter = true, allgather = true, broadcast = true }
  local i = 2
  while i <= #args do
    local a, v = args[i], args[i + 1]
    if not ({ ["-n"] = 1, ["--op"] = 1, ["--sizes"] = 1, ["--iters"] = 1, ["--comm"] = 1 })[a] then
      error("bench: unknown option '" .. a .. "'\n" .. usage, 0)
    end
    if not v then error("bench: " .. a .. " needs a value\n" .. usage, 0) end
    if a == "-n" then
      n = math.tointeger(tonumber(v))
      if not n or n < 2 then error("bench: -n " .. v .. ": the number of ranks must be an integer >= 2", 0) end
    elseif a == "--op" then
      if not ops[v] then error("bench: --op " .. v .. " is not one of allreduce, reduce_scatter, allgather, broadcast", 0) end
      op = v
    elseif a == "--sizes" then sizes = v
    elseif a == "--iters" then
      if not math.tointeger(tonumber(v)) or tonumber(v) < 0 then
        error("bench: --iters " .. v .. " must be an integer >= 0 (0: chosen by size)", 0)
      end
      iters = v
    elseif a == "--comm" then
      local ok, err = pcall(core.check_plugin, "comm", { name = v })
      if not ok then error("bench: --comm " .. v .. ": " .. err, 0) end
      comm = v
    end
    i = i + 2
  end
  local lo, hi = sizes:match("^([^:]+):([^:]+)$")
  if not lo then lo, hi = sizes, sizes end
  if bytes_of(lo) < 4 or bytes_of(hi) < bytes_of(lo) then
    error(string.format("bench: --sizes %s must satisfy 4 <= MIN <= MAX bytes (e.g. 1K:64M)", sizes), 0)
  end
  local script = package.searchpath("loom.bench_comm", package.path)
  local launcher = require("loom.launcher").ranks(comm, n)
  local cmd = string.format("%s %q op=%s min=%d max=%d iters=%s comm=%s", launcher, script, op,
    bytes_of(lo), bytes_of(hi), iters, comm)
  local ok, how, code = os.execute(cmd)
  if not ok then error(string.format("bench: the ranks failed (%s %s)", how, code), 0) end
end

return cli
