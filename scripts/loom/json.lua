-- loom.json — encoding Lua values as JSON (for the checkpoint manifest's resolved config
-- and the metrics log). Keys are sorted so the same table always gives the same text.
-- Functions and userdata are written as strings naming their type: a config that holds a
-- function(step) schedule still records that it had one.
local json = {}

local escapes = { ['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f',
  ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' }

local function string_literal(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return escapes[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

local function number_literal(n)
  if n ~= n or n == math.huge or n == -math.huge then return "null" end
  if math.type(n) == "integer" then return tostring(n) end
  return string.format("%.17g", n)
end

local function is_array(t)
  local n = #t
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 or k > n then return false end
  end
  return true
end

local function encode(v, out, depth)
  if depth > 64 then error("json: table nested more than 64 deep (a cycle?)", 0) end
  local t = type(v)
  if t == "nil" then out[#out + 1] = "null"
  elseif t == "boolean" then out[#out + 1] = tostring(v)
  elseif t == "number" then out[#out + 1] = number_literal(v)
  elseif t == "string" then out[#out + 1] = string_literal(v)
  elseif t == "table" then
    if next(v) ~= nil and is_array(v) then
      out[#out + 1] = "["
      for i = 1, #v do
        if i > 1 then out[#out + 1] = "," end
        encode(v[i], out, depth + 1)
      end
      out[#out + 1] = "]"
    else
      local keys = {}
      for k in pairs(v) do keys[#keys + 1] = tostring(k) end
      table.sort(keys)
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        out[#out + 1] = string_literal(k) .. ":"
        local val = v[k]
        if val == nil then val = v[math.tointeger(tonumber(k))] end
        encode(val, out, depth + 1)
      end
      out[#out + 1] = "}"
    end
  else
    out[#out + 1] = string_literal("<" .. t .. ">")
  end
end

function json.encode(v)
  local out = {}
  encode(v, out, 0)
  return table.concat(out)
end

return json
