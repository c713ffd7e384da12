-- loom.overrides — `loom run RECIPE key=value ...`: command-line values applied to the
-- recipe's table before it is checked, dotted keys for nesting (batch.micro=8,
-- optimizer.lr=1e-3), so one recipe serves many runs unchanged.
local overrides = {}

-- "8" -> 8, "true" -> true, "{0.9, 0.95}" -> table, anything else stays a string.
function overrides.parse(text)
  if text == "true" then return true end
  if text == "false" then return false end
  local n = math.tointeger(tonumber(text)) or tonumber(text)
  if n then return n end
  if text:match("^%s*{") then
    local chunk = load("return " .. text, "=override", "t", {})
    if chunk then
      local ok, v = pcall(chunk)
      if ok then return v end
    end
    error("override value '" .. text .. "' is not a valid Lua table", 0)
  end
  return text
end

-- Apply the list { {key, text}, ... } to tbl. Returns a lookup key -> "key=text" so error
-- messages can say a value came from the command line.
function overrides.apply(tbl, list, where)
  local seen = {}
  for _, kv in ipairs(list or {}) do
    local key, text = kv[1], kv[2]
    local ok, value = pcall(overrides.parse, text)
    if not ok then error(where .. value, 0) end
    local node, parts = tbl, {}
    for part in key:gmatch("[^.]+") do parts[#parts + 1] = part end
    for i = 1, #parts - 1 do
      local p = math.tointeger(tonumber(parts[i])) or parts[i]
      if node[p] == nil then node[p] = {} end
      if type(node[p]) ~= "table" then
        error(string.format("%soverride %s=%s: '%s' is a %s, not a table", where, key, text,
          table.concat(parts, ".", 1, i), type(node[p])), 0)
      end
      node = node[p]
    end
    local last = math.tointeger(tonumber(parts[#parts])) or parts[#parts]
    node[last] = value
    seen[key] = key .. "=" .. text
  end
  return function(name)
    return seen[name] and (" (from the command line: " .. seen[name] .. ")") or nil
  end
end

return overrides
