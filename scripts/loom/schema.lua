-- loom.schema — checking recipe tables before any work is done.
--
-- A spec maps each accepted key to {type=..., required=, min=, max=, one_of=, help=}.
-- Unknown keys are refused with the list of accepted ones (a typo must never become a
-- silent default), wrong types and impossible values say what would be right. Errors are
-- raised with the recipe's "file:line:" prefix held in `where`.
local schema = {}

local function keys_of(spec)
  local names = {}
  for k in pairs(spec) do names[#names + 1] = k end
  table.sort(names)
  return table.concat(names, ", ")
end

-- The "file:line:" of the first stack frame outside loom's own Lua library.
function schema.where()
  for level = 2, 30 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    if info.currentline > 0 and not info.source:find("/loom/[%w_]+%.lua$") then
      return info.short_src .. ":" .. info.currentline .. ": "
    end
  end
  return ""
end

function schema.fail(where, fmt, ...)
  error(where .. string.format(fmt, ...), 0)
end

local function type_ok(v, t)
  if t == "integer" then return math.type(v) == "integer" or (type(v) == "number" and v == math.floor(v) and v == v) end
  if t == "number" then return type(v) == "number" and v == v end
  if t == "positive" then return type(v) == "number" and v > 0 end
  if t == "any" then return true end
  if t == "callable" then return type(v) == "function" end
  return type(v) == t
end

-- check(tbl, spec, path, where [, origin]): origin(key) may say where a value came from.
function schema.check(tbl, spec, path, where, origin)
  if type(tbl) ~= "table" then
    schema.fail(where, "%s must be a table, got %s", path, type(tbl))
  end
  for k, v in pairs(tbl) do
    local rule = spec[k]
    local name = path ~= "" and (path .. "." .. tostring(k)) or tostring(k)
    local from = origin and origin(name) or ""
    if not rule then
      schema.fail(where, "unknown key '%s'%s (accepted: %s)", name, from, keys_of(spec))
    end
    if v ~= v then -- nan: a computed value gone wrong (0/0), not a type mix-up
      schema.fail(where, "%s%s is nan (not a number): give a finite value", name, from)
    end
    local types = type(rule.type) == "table" and rule.type or { rule.type }
    local ok = false
    for _, t in ipairs(types) do ok = ok or type_ok(v, t) end
    if not ok then
      schema.fail(where, "%s%s must be %s, got %s %s", name, from, table.concat(types, " or "),
        type(v), tostring(v))
    end
    if type(v) == "number" then
      if rule.min and v < rule.min then
        schema.fail(where, "%s=%s%s must be >= %s%s", name, tostring(v), from, tostring(rule.min),
          rule.help and (" (" .. rule.help .. ")") or "")
      end
      if rule.max and v > rule.max then
        schema.fail(where, "%s=%s%s must be <= %s", name, tostring(v), from, tostring(rule.max))
      end
    end
    if rule.one_of then
      local found = false
      for _, choice in ipairs(rule.one_of) do found = found or choice == v end
      if not found then
        schema.fail(where, "%s=%s%s is not one of: %s", name, tostring(v), from,
          table.concat(rule.one_of, ", "))
      end
    end
  end
  for k, rule in pairs(spec) do
    if rule.required and tbl[k] == nil then
      schema.fail(where, "%s needs key '%s'%s", path ~= "" and path or "the recipe", k,
        rule.help and (" (" .. rule.help .. ")") or "")
    end
  end
end

return schema
