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

return cli
