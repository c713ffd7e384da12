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

-- `loom export --llmc CKPT OUT.bin`: a checkpoint's weights as an llm.c model file
-- (version 3, fp32), so llm.c's tools and anything that reads its format can use them.
-- CKPT is a checkpoint (step_*) or a checkpoint dir (its newest complete checkpoint).
function cli.export(args)
  local usage = "usage: loom export --llmc CKPT OUT.bin"
  if args[1] ~= "--llmc" or not args[2] or not args[3] or args[4] then error(usage, 0) end
  local ckpt, out = args[2], args[3]
  local f = io.open(ckpt .. "/manifest.json", "rb")
  if not f then
    local found, why = core.find_checkpoint(ckpt)
    if not found then error("export: " .. why, 0) end
    ckpt = found
    f = assert(io.open(ckpt .. "/manifest.json", "rb"))
  end
  local text = f:read("a")
  f:close()
  local ok, manifest = pcall(require("loom.json").decode, text)
  if not ok or type(manifest.model) ~= "table" or not manifest.optimizer then
    error("export: " .. ckpt .. "/manifest.json is not a loom checkpoint manifest", 0)
  end
  local m = manifest.model
  local session = core.session {
    model = m, micro = 1, seq = 1, accum = 1, seed = 0, grad_clip = 0,
    optimizer = recorded_optimizer(manifest), precision = { name = "fp32" },
  }
  session:load(ckpt)
  core.llmc_save(session, out)
  print(string.format("wrote %s (llm.c model v3: L=%d H=%d C=%d V=%d Vp=%d ctx=%d) from %s",
    out, m.layers, m.heads, m.dim, m.vocab, m.vocab_padded, m.ctx, ckpt))
end

return cli
