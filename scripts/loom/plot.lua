-- loom.plot — `loom plot METRICS.jsonl -o loss.svg`: a standalone SVG of a run's metrics
-- file (written by loom.metrics): three stacked panels against step — loss (train line,
-- val points), tokens/s, learning rate — sharing one step axis.
--
-- The SVG uses no external resources (fonts are generic families), so it opens anywhere.
-- A file that is missing, empty or not JSON lines is refused naming the file and line.
-- When a step appears twice (a resumed run that repeated steps), the later line wins.
local plot = {}

local decode = require("loom.json").decode

-- Read a metrics file: {run = header or nil, train = {records by step order}, val = {...}}.
function plot.load(path)
  local f, err = io.open(path, "rb")
  if not f then error("cannot read metrics file: " .. err, 0) end
  local run, train, val, n = nil, {}, {}, 0
  for line in f:lines() do
    n = n + 1
    if line:find("%S") then
      local ok, obj = pcall(decode, line)
      if not ok then -- obj is {msg, col}, or a string from Lua itself (a line nested too deep)
        f:close()
        error(string.format("%s:%d: not a JSON object (%s)", path, n,
          type(obj) == "table" and string.format("%s at column %d", obj.msg, obj.col) or tostring(obj)), 0)
      end
      local into = ({ train = train, val = val })[obj.kind]
      local step = math.tointeger(obj.step)
      local bad = obj.kind ~= "run" and (not into and string.format("unknown kind %s (expected "
        .. "\"run\", \"train\" or \"val\")", tostring(obj.kind)) or not step and "no integer \"step\"")
      if bad then f:close(); error(string.format("%s:%d: %s", path, n, bad), 0) end
      if obj.kind == "run" then run = run or obj else obj.step = step; into[step] = obj end
    end
  end
  f:close()
  if n == 0 then error(path .. ": empty file (no metrics lines)", 0) end
  local function sorted(byStep)
    local out = {}
    for _, r in pairs(byStep) do out[#out + 1] = r end
    table.sort(out, function(a, b) return a.step < b.step end)
    return out
  end
  train, val = sorted(train), sorted(val)
  if #train == 0 then error(path .. ": no training steps (no {\"kind\":\"train\"} lines)", 0) end
  return { run = run, train = train, val = val }
end

-- Axis ticks at 1, 2 or 5 x 10^k (at least min_step) covering [lo, hi]; the range is
-- widened to whole ticks.
local function ticks(lo, hi, want, min_step)
  if hi <= lo then
    local pad = lo ~= 0 and math.abs(lo) * 0.1 or 1
    lo, hi = lo - pad, hi + pad
  end
  local raw = (hi - lo) / want
  local mag = 10 ^ math.floor(math.log(raw, 10))
  local step = mag * ((raw / mag <= 1 and 1) or (raw / mag <= 2 and 2) or (raw / mag <= 5 and 5) or 10)
  step = math.max(step, min_step or 0)
  lo, hi = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
  local t = {}
  for i = 0, math.floor((hi - lo) / step + 0.5) do t[#t + 1] = lo + i * step end
  return lo, hi, t, step
end

local function label(v, step)
  local a = math.abs(v)
  if a < step * 1e-6 then return "0" end
  if a >= 1e6 then return label(v / 1e6, step / 1e6) .. "M" end
  if a >= 1e4 then return label(v / 1e3, step / 1e3) .. "k" end
  if step < 1e-3 then return (string.format("%.3g", v):gsub("e([-+])0*", "e%1")) end
  return string.format("%." .. math.max(0, -math.floor(math.log(step, 10) + 1e-9)) .. "f", v)
end

local function xml(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }))
end

-- Layout (px). Every panel shares the x mapping; y maps per panel.
local W, LEFT, RIGHT, TOP, PH, GAP = 960, 84, 24, 86, 210, 46
local PW = W - LEFT - RIGHT
local H = TOP + 3 * PH + 2 * GAP + 56
local COLOR = { train = "#1f77b4", val = "#ff7f0e", tps = "#2ca02c", lr = "#9467bd" }

-- Polylines through {x, y} points, broken where y is missing (null: NaN or Inf at write).
-- Past two points per pixel column a line shows nothing more, so each column keeps only
-- its lowest and highest point, in order: a 100k-step run plots small, same envelope.
local function paths(out, pts, sx, sy, color, extra)
  local seg, col, lo, hi = {}, nil, nil, nil
  local function put(p) seg[#seg + 1] = string.format("%.1f,%.1f", sx(p[1]), sy(p[2])) end
  local function end_column()
    if lo then
      put(pts[math.min(lo, hi)])
      if lo ~= hi then put(pts[math.max(lo, hi)]) end
    end
    lo, hi = nil, nil
  end
  local function flush()
    end_column()
    if #seg > 1 then
      out[#out + 1] = string.format('<polyline fill="none" stroke="%s" stroke-width="1.6" %s points="%s"/>',
        color, extra or "", table.concat(seg, " "))
    elseif #seg == 1 then -- a lone point between gaps would otherwise not show
      local x, y = seg[1]:match("(.*),(.*)")
      out[#out + 1] = string.format('<circle cx="%s" cy="%s" r="2.5" fill="%s"/>', x, y, color)
    end
    seg = {}
  end
  for i, p in ipairs(pts) do
    if type(p[2]) == "number" then
      local c = math.floor(sx(p[1]))
      if c ~= col then end_column(); col = c end
      if not lo or p[2] < pts[lo][2] then lo = i end
      if not hi or p[2] > pts[hi][2] then hi = i end
    else
      flush()
    end
  end
  flush()
end

-- One panel: frame, grid, ticks, y label, series and a legend above the frame (where it
-- can never hide data). series = { {name, color, pts, dots=bool, dashed=bool}, ... };
-- `zero` starts the y axis at 0, so that throughput noise is not magnified into swings.
local function panel(out, id, y0, title, series, sx, xt, xstep, xlast, zero)
  local lo, hi = math.huge, -math.huge
  for _, s in ipairs(series) do
    for _, p in ipairs(s.pts) do
      if type(p[2]) == "number" then lo, hi = math.min(lo, p[2]), math.max(hi, p[2]) end
    end
  end
  if lo > hi then lo, hi = 0, 1 end
  -- A little headroom, so that a flat series never lies on the frame.
  local pad = (hi > lo and hi - lo or hi ~= 0 and math.abs(hi) or 1) * 0.04
  lo, hi = (zero and lo >= 0) and 0 or lo - pad, hi + pad
  local ylo, yhi, yt, ystep = ticks(lo, hi, 5)
  local function sy(v) return y0 + PH - (v - ylo) / (yhi - ylo) * PH end
  out[#out + 1] = string.format('<g id="panel-%s">', id)
  out[#out + 1] = string.format('<rect x="%d" y="%d" width="%d" height="%d" fill="#fff" stroke="#444"/>', LEFT, y0, PW, PH)
  for _, v in ipairs(yt) do
    local y = sy(v)
    out[#out + 1] = string.format('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e4e4e4"/>', LEFT, LEFT + PW, y, y)
    out[#out + 1] = string.format('<text x="%d" y="%.1f" text-anchor="end" dy="4">%s</text>', LEFT - 6, y, xml(label(v, ystep)))
  end
  for _, v in ipairs(xt) do
    local x = sx(v)
    out[#out + 1] = string.format('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#e4e4e4"/>', x, x, y0, y0 + PH)
    out[#out + 1] = string.format('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#444"/>', x, x, y0 + PH, y0 + PH + 4)
    if xlast then
      out[#out + 1] = string.format('<text x="%.1f" y="%d" text-anchor="middle">%s</text>', x, y0 + PH + 17, xml(label(v, xstep)))
    end
  end
  out[#out + 1] = string.format('<text x="%d" y="%d" text-anchor="middle" transform="rotate(-90 %d %d)" class="axis">%s</text>',
    18, y0 + PH // 2, 18, y0 + PH // 2, xml(title))
  for _, s in ipairs(series) do
    paths(out, s.pts, sx, sy, s.color, s.dashed and 'stroke-dasharray="5 3"' or nil)
    if s.dots then
      for _, p in ipairs(s.pts) do
        if type(p[2]) == "number" then
          out[#out + 1] = string.format('<circle cx="%.1f" cy="%.1f" r="3.2" fill="%s"/>', sx(p[1]), sy(p[2]), s.color)
        end
      end
    end
  end
  -- Legend entries right-aligned in a row just above the frame, drawn right to left.
  local lx, yy = LEFT + PW, y0 - 9
  for i = #series, 1, -1 do
    local s = series[i]
    lx = lx - #s.name * 7
    out[#out + 1] = string.format('<text x="%d" y="%d" dy="4">%s</text>', lx, yy, xml(s.name))
    out[#out + 1] = string.format('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>',
      lx - 28, lx - 6, yy, yy, s.color, s.dashed and ' stroke-dasharray="5 3"' or "")
    if s.dots then out[#out + 1] = string.format('<circle cx="%d" cy="%d" r="3.2" fill="%s"/>', lx - 17, yy, s.color) end
    lx = lx - 46
  end
  out[#out + 1] = "</g>"
end

local function column(records, key)
  local pts = {}
  for i, r in ipairs(records) do pts[i] = { r.step, r[key] } end
  return pts
end

-- The SVG text for a loaded metrics table; `name` titles it.
function plot.svg(m, name)
  local tr, va = m.train, m.val
  local first, last = tr[1].step, math.max(tr[#tr].step, #va > 0 and va[#va].step or 0)
  local xlo, xhi, xt, xstep = ticks(first, math.max(last, first + 1), 8, 1) -- steps are whole
  local function sx(v) return LEFT + (v - xlo) / (xhi - xlo) * PW end
  local out = {
    string.format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
      .. 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12" fill="#222">', W, H, W, H),
    "<style>.axis{font-size:13px;font-weight:bold}</style>",
    string.format('<rect width="%d" height="%d" fill="#fafafa"/>', W, H),
    string.format('<text x="%d" y="28" font-size="18" font-weight="bold">loom run: %s</text>', LEFT, xml(name)),
  }
  local r, sub = m.run or {}, {}
  if r.params then
    local p = r.params
    sub[#sub + 1] = string.format("%s params, L=%s C=%s T=%s", p >= 1e9 and string.format("%.2fB", p / 1e9)
      or p >= 1e6 and string.format("%.2fM", p / 1e6) or string.format("%.1fK", p / 1e3),
      tostring(r.layers), tostring(r.dim), tostring(r.seq))
  end
  sub[#sub + 1] = string.format("steps %d-%d", first, tr[#tr].step)
  local lt = tr[#tr].loss
  if lt then sub[#sub + 1] = string.format("last loss %.4f", lt) end
  if #va > 0 and va[#va].val_loss then sub[#sub + 1] = string.format("val %.4f", va[#va].val_loss) end
  out[#out + 1] = string.format('<text x="%d" y="48" fill="#555">%s</text>', LEFT, xml(table.concat(sub, "  |  ")))
  if r.device then
    local dev = #r.device > 100 and r.device:sub(1, 97) .. "..." or r.device
    out[#out + 1] = string.format('<text x="%d" y="66" fill="#777" font-size="11">%s</text>', LEFT, xml(dev))
  end
  local loss = { { name = "train loss", color = COLOR.train, pts = column(tr, "loss") } }
  if #va > 0 then
    loss[2] = { name = "val loss", color = COLOR.val, pts = column(va, "val_loss"), dots = true, dashed = true }
  end
  local y = TOP
  panel(out, "loss", y, "loss", loss, sx, xt, xstep, false)
  y = y + PH + GAP
  panel(out, "tokens", y, "tokens/s", { { name = "tokens/s", color = COLOR.tps, pts = column(tr, "tokens_per_s") } },
    sx, xt, xstep, false, true)
  y = y + PH + GAP
  panel(out, "lr", y, "learning rate", { { name = "lr", color = COLOR.lr, pts = column(tr, "lr") } }, sx, xt, xstep, true, true)
  out[#out + 1] = string.format('<text x="%d" y="%d" text-anchor="middle" class="axis">step</text>', LEFT + PW // 2, y + PH + 40)
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n") .. "\n"
end

-- Write the plot of metrics file `path` to `out`; returns the loaded metrics.
function plot.write(path, out)
  local m = plot.load(path)
  local text = plot.svg(m, path:match("[^/]*$"))
  local f, err = io.open(out, "wb")
  if not f then error("cannot write plot: " .. err, 0) end
  f:write(text)
  f:close()
  return m
end

return plot
