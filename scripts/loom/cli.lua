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

return cli
