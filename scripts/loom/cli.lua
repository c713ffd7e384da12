-- loom.cli — commands of the `loom` program that are easier to write in Lua.
local core = require "loom.core"
local cli = {}

-- `loom plugins`: every plugin found, in search order, and every file refused.
function cli.plugins()
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

-- `loom plot METRICS.jsonl [-o OUT.svg]`: plot a run's metrics file (see loom.plot). The
-- output defaults to the input's name with .svg for .jsonl.
function cli.plot(args)
  local input, out
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "-o" or a == "--output" then
      out = args[i + 1]
      if not out then error("plot: -o needs a file name (loom plot METRICS.jsonl -o loss.svg)", 0) end
      i = i + 1
    elseif a:sub(1, 1) == "-" then
      error("plot: unknown option '" .. a .. "' (usage: loom plot METRICS.jsonl [-o OUT.svg])", 0)
    elseif input then
      error("plot: one metrics file at a time (got '" .. input .. "' and '" .. a .. "')", 0)
    else
      input = a
    end
    i = i + 1
  end
  if not input then error("plot: which metrics file? (usage: loom plot METRICS.jsonl [-o OUT.svg])", 0) end
  out = out or (input:gsub("%.jsonl$", "") .. ".svg")
  local m = require("loom.plot").write(input, out)
  print(string.format("wrote %s (%d steps, %d validation points)", out, #m.train, #m.val))
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
  core.llmc_save(session, out)
  print(string.format("wrote %s (llm.c model v3: L=%d H=%d C=%d V=%d Vp=%d ctx=%d) from %s",
    out, m.layers, m.heads, m.dim, m.vocab, m.vocab_padded, m.ctx, ckpt))
end

cli.sample = function(args) return require("loom.cli_sample")(args, open_checkpoint) end

-- "1K" -> 1024, "64M" -> 67108864
local function bytes_of(text)
  local n, unit = text:match("^(%d+)([KkMmGg]?)$")
  if not n then error("bench: '" .. text .. "' is not a size like 1K, 64M or 4096", 0) end
  return math.tointeger(n) * (({ k = 1 << 10, m = 1 << 20, g = 1 << 30 })[unit:lower()] or 1)
end

-- `loom bench comm [-n N] [--op OP] [--sizes MIN:MAX] [--iters K] [--comm NAME]`: runs N
-- ranks of this program (loom launch; mpirun for comm "mpi") over the communicator and
-- prints nccl-tests' table.
function cli.bench(args)
  local usage = "usage: loom bench comm [-n N] [--op allreduce|reduce_scatter|allgather|broadcast]"
    .. " [--sizes 1K:64M] [--iters K] [--comm shm]"
  if args[1] ~= "comm" then error(usage, 0) end
  local n, op, sizes, iters, comm = 2, "allreduce", "1K:64M", "0", "shm"
  local i = 2
  while i <= #args do
    local a, v = args[i], args[i + 1]
    if not v then error(usage, 0) end
    if a == "-n" then n = math.tointeger(tonumber(v))
    elseif a == "--op" then op = v
    elseif a == "--sizes" then sizes = v
    elseif a == "--iters" then iters = v
    elseif a == "--comm" then comm = v
    else error("bench: unknown option '" .. a .. "'\n" .. usage, 0) end
    i = i + 2
  end
  if not n or n < 2 then error("bench: -n must be at least 2", 0) end
  local lo, hi = sizes:match("^([^:]+):([^:]+)$")
  if not lo then lo, hi = sizes, sizes end
  local script = package.searchpath("loom.bench_comm", package.path)
  -- MPI's ranks must come from its own launcher; every other communicator uses loom launch.
  local launcher = comm == "mpi"
    and string.format("mpirun --allow-run-as-root --oversubscribe -np %d -x MASTER_PORT=%d %q run",
      n, 20000 + math.random(0, 19999), LOOM_EXE)
    or string.format("%q launch -n %d", LOOM_EXE, n)
  local cmd = string.format("%s %q op=%s min=%d max=%d iters=%s comm=%s", launcher, script, op,
    bytes_of(lo), bytes_of(hi), iters, comm)
  local ok, how, code = os.execute(cmd)
  if not ok then error(string.format("bench: the ranks failed (%s %s)", how, code), 0) end
end

return cli
