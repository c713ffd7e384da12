-- loom.json — encoding Lua values as JSON, and reading JSON objects back (for the checkpoint manifest's resolved config
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

local LITERALS = { ["true"] = true, ["false"] = false, null = "null" }

-- A small strict JSON reader for one object per text (a JSONL line, a manifest): objects,
-- arrays, strings, numbers, true/false/null (null reads as nil, so a null field is simply
-- absent). Errors are raised as {msg=, col=}.
function json.decode(s)
  local pos = 1
  local function fail(msg) error({ msg = msg, col = pos }, 0) end
  local function found()
    local c = s:sub(pos, pos)
    return c == "" and "end of line" or c:match("%g") and "'" .. c .. "'" or string.format("byte 0x%02x", c:byte())
  end
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local esc = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n",
    r = "\r", t = "\t" }
  local value
  local function str()
    local out = {}
    pos = pos + 1
    while true do
      local i = s:find('["\\%c]', pos)
      if not i then fail("unterminated string") end
      out[#out + 1] = s:sub(pos, i - 1)
      pos = i
      local c, e = s:sub(i, i), s:sub(i + 1, i + 1)
      if c == '"' then pos = i + 1; return table.concat(out) end
      if c ~= "\\" then fail("control character in a string") end
      local hex = e == "u" and s:match("^%x%x%x%x", i + 2)
      if hex then out[#out + 1] = utf8.char(tonumber(hex, 16)); pos = i + 6
      elseif esc[e] then out[#out + 1] = esc[e]; pos = i + 2
      else fail("bad escape in a string") end
    end
  end
  local function list(close, item)
    pos = pos + 1; ws()
    if s:sub(pos, pos) == close then pos = pos + 1; return end
    while true do
      item(); ws()
      local c = s:sub(pos, pos)
      pos = pos + 1
      if c == close then return end
      if c ~= "," then pos = pos - 1; fail("expected ',' or '" .. close .. "'") end
      ws()
    end
  end
  function value()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      local t = {}
      list("}", function()
        if s:sub(pos, pos) ~= '"' then fail("expected a string key") end
        local k = str(); ws()
        if s:sub(pos, pos) ~= ":" then fail("expected ':'") end
        pos = pos + 1
        t[k] = value()
      end)
      return t
    elseif c == "[" then
      local t = {}
      list("]", function() t[#t + 1] = value() end)
      return t
    elseif c == '"' then
      return str()
    end
    for word, v in pairs(LITERALS) do
      if s:sub(pos, pos + #word - 1) == word then
        pos = pos + #word
        if v == "null" then return nil end
        return v
      end
    end
    -- JSON's number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)?
    local num = s:match("^-?%d+", pos)
    if not num or num:match("^-?0%d") then fail("unexpected " .. found()) end
    num = num .. (s:match("^%.%d+", pos + #num) or "")
    num = num .. (s:match("^[eE][-+]?%d+", pos + #num) or "")
    pos = pos + #num
    return tonumber(num)
  end
  ws()
  if s:sub(pos, pos) ~= "{" then fail("found " .. found()) end
  local obj = value(); ws()
  if pos <= #s then fail("unexpected text after the object") end
  return obj
end

return json
