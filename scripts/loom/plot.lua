-- loom.plot — `loom plot A.jsonl [B.jsonl ...] -o loss.svg`: a standalone SVG of one or
-- more runs' metrics files (written by loom.metrics): four stacked panels against step —
-- loss (train line, val points), gradient norm, tokens/s, learning rate — sharing one
-- step axis that ends at the last step plotted. Each run has its own colour, named by its
-- file in the legend under the title; a dotted vertical line marks where a run resumed
-- (each "run" object after a file's first). Options: smooth = N (a centred moving average
-- over N logged steps of loss, grad norm and tokens/s, the raw line drawn faint behind),
-- log = true (log-scale y for loss and grad norm). A mixture-of-experts run (train
-- records with a "moe" object) adds an expert-load panel above the learning rate: per step,
-- the most and the least loaded expert's tokens over the mean (over every MoE block: the
-- highest max, the lowest min), 1 being perfect balance.
--
-- The SVG uses no external resources (fonts are generic families), so it opens anywhere.
-- A file that is missing, empty or not JSON lines is refused naming the file and line,
-- except its last line: a crash can leave it half written, so if it is not JSON it is
-- skipped with a warning. When a step appears twice (a resumed run that repeated steps),
-- the later line wins.
local plot = {}

local decode = require("loom.json").decode

-- Read a metrics file: {path, run = first header or nil, resumes = {start_step of each
-- later header}, train = {records in step order}, val = {...}}. `warn(text)` is told of a
-- half-written last line (default: stderr).
function plot.load(path, warn)
  warn = warn or function(text) io.stderr:write("loom: warning: ", text, "\n") end
  local f, err = io.open(path, "rb")
  if not f then error("cannot read metrics file: " .. err, 0) end
  local text = f:read("a")
  f:close()
  local lines = {}
  for line in text:gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  local tail = text:match("[^\n]*$")
  if tail ~= "" then lines[#lines + 1] = tail end -- no newline after it: written in part?
  local last = #lines
  while last > 0 and not lines[last]:find("%S") do last = last - 1 end
  if last == 0 then error(path .. ": empty file (no metrics lines)", 0) end
  local run, resumes, train, val = nil, {}, {}, {}
  for n = 1, last do
    local line = lines[n]
    if line:find("%S") then
      local ok, obj = pcall(decode, line)
      if ok and type(obj) ~= "table" then ok, obj = false, { msg = "not an object", col = 1 } end
      if not ok then -- obj is {msg, col}, or a string from Lua itself (a line nested too deep)
        local why = type(obj) == "table" and string.format("%s at column %d", obj.msg, obj.col) or tostring(obj)
        if n < last then error(string.format("%s:%d: not a JSON object (%s)", path, n, why), 0) end
        warn(string.format("%s:%d: last line is not a JSON object (%s), skipped: a run that stopped "
          .. "while writing it?", path, n, why))
        break
      end
      local into = ({ train = train, val = val })[obj.kind]
      local step = math.tointeger(obj.step)
      local bad = obj.kind ~= "run" and (not into and string.format("unknown kind %s (expected "
        .. "\"run\", \"train\" or \"val\")", tostring(obj.kind)) or not step and "no integer \"step\"")
      if bad then error(string.format("%s:%d: %s", path, n, bad), 0) end
      if obj.kind ~= "run" then obj.step = step; into[step] = obj
      elseif run then resumes[#resumes + 1] = math.tointeger(obj.start_step) or 0
      else run = obj end
    end
  end
  local function sorted(byStep)
    local out = {}
    for _, r in pairs(byStep) do out[#out + 1] = r end
    table.sort(out, function(a, b) return a.step < b.step end)
    return out
  end
  train, val = sorted(train), sorted(val)
  if #train == 0 then error(path .. ": no training steps (no {\"kind\":\"train\"} lines)", 0) end
  return { path = path, run = run, resumes = resumes, train = train, val = val }
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

-- Ticks for a log axis over [10^lo, 10^hi] (lo, hi in log10): over a decade or more,
-- 10^k, else 1-2-5 x 10^k, whichever first gives at least three inside; over less (a loss
-- from 2 to 7), linear ticks inside the range, as a linear axis would have them.
local function log_ticks(lo, hi)
  if hi - lo >= 1 then
    for _, mant in ipairs { { 1 }, { 1, 2, 5 } } do
      local t = {}
      for k = math.floor(lo), math.ceil(hi) do
        for _, m in ipairs(mant) do
          local v = m * 10 ^ k
          if math.log(v, 10) >= lo - 1e-9 and math.log(v, 10) <= hi + 1e-9 then t[#t + 1] = v end
        end
      end
      if #t >= 3 then return t end
    end
  end
  local _, _, lin = ticks(10 ^ lo, 10 ^ hi, 6)
  local t = {}
  for _, v in ipairs(lin) do
    if v > 0 and math.log(v, 10) >= lo - 1e-9 and math.log(v, 10) <= hi + 1e-9 then t[#t + 1] = v end
  end
  return t
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

-- Layout (px). Every panel shares the x mapping; y maps per panel. The header (title and
-- one legend row per run) grows with the number of runs.
local W, LEFT, RIGHT, PH, GAP, ROW = 960, 84, 24, 190, 40, 18
local PW = W - LEFT - RIGHT
-- Matplotlib's tab10, in its order: distinct in hue and lightness, readable on white.
local COLORS = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf" }

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
      out[#out + 1] = string.format('<circle cx="%s" cy="%s" r="2.5" fill="%s" %s/>', x, y, color, extra or "")
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

-- A centred moving average over n points ({x, y}, y nil where missing): each y becomes
-- the mean of the values present among the n points around it (fewer at the ends); a
-- missing y stays missing, so gaps stay gaps. O(points) by prefix sums.
local function smooth(pts, n)
  if not n or n <= 1 then return pts end
  local sum, cnt = { [0] = 0 }, { [0] = 0 }
  for i, p in ipairs(pts) do
    local ok = type(p[2]) == "number"
    sum[i], cnt[i] = sum[i - 1] + (ok and p[2] or 0), cnt[i - 1] + (ok and 1 or 0)
  end
  local out, before = {}, n // 2
  for i, p in ipairs(pts) do
    local a, b = math.max(1, i - before), math.min(#pts, i - before + n - 1)
    local c = cnt[b] - cnt[a - 1]
    out[i] = { p[1], type(p[2]) == "number" and c > 0 and (sum[b] - sum[a - 1]) / c or nil }
  end
  return out
end

-- One panel: frame, grid, ticks, y label, the resume markers, then the series.
-- series = { {pts, color, run, what, dots=, dashed=, faint=}, ... }; `zero` starts a linear
-- y axis at 0 (so that throughput noise is not magnified into swings); `log` makes it
-- log10, where a value <= 0 is left out. xaxis = {t = ticks, step, last = label them}.
local function panel(out, id, y0, title, series, sx, xaxis, o)
  local function ty(v)
    if type(v) ~= "number" or v ~= v or math.abs(v) == math.huge then return nil end
    if o.log then return v > 0 and math.log(v, 10) or nil end
    return v
  end
  local lo, hi = math.huge, -math.huge
  for _, s in ipairs(series) do
    local t = {}
    for i, p in ipairs(s.pts) do
      t[i] = { p[1], ty(p[2]) }
      if t[i][2] then lo, hi = math.min(lo, t[i][2]), math.max(hi, t[i][2]) end
    end
    s.tpts = t
  end
  if lo > hi then lo, hi = 0, 1 end
  -- A little headroom, so that a flat series never lies on the frame.
  local pad = (hi > lo and hi - lo or hi ~= 0 and math.abs(hi) or 1) * 0.04
  local ylo, yhi, yt, ystep
  if o.log then
    if hi - lo < 0.05 then lo, hi = lo - 0.025, hi + 0.025 end
    ylo, yhi = lo - pad, hi + pad
    yt = log_ticks(ylo, yhi)
  else
    ylo, yhi, yt, ystep = ticks((o.zero and lo >= 0) and 0 or lo - pad, hi + pad, 5)
  end
  local function sy(v) return y0 + PH - (v - ylo) / (yhi - ylo) * PH end
  out[#out + 1] = string.format('<g id="panel-%s">', id)
  out[#out + 1] = string.format('<rect x="%d" y="%d" width="%d" height="%d" fill="#fff" stroke="#444"/>', LEFT, y0, PW, PH)
  for _, v in ipairs(yt) do
    local y = sy(o.log and math.log(v, 10) or v)
    local text = o.log and (string.format("%.3g", v):gsub("e([-+])0*", "e%1")) or label(v, ystep)
    out[#out + 1] = string.format('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e4e4e4"/>', LEFT, LEFT + PW, y, y)
    out[#out + 1] = string.format('<text x="%d" y="%.1f" text-anchor="end" dy="4">%s</text>', LEFT - 6, y, xml(text))
  end
  for _, v in ipairs(xaxis.t) do
    local x = sx(v)
    out[#out + 1] = string.format('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#e4e4e4"/>', x, x, y0, y0 + PH)
    out[#out + 1] = string.format('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#444"/>', x, x, y0 + PH, y0 + PH + 4)
    if o.xlabels then
      -- Steps are whole: below ticks of 1000 they are written out (1000003, not "1M").
      local text = (v == xaxis.t.end_step or xaxis.step < 1000) and string.format("%d", v) or label(v, xaxis.step)
      out[#out + 1] = string.format('<text x="%.1f" y="%d" text-anchor="middle">%s</text>', x, y0 + PH + 17, xml(text))
    end
  end
  out[#out + 1] = string.format('<text x="%d" y="%d" text-anchor="middle" transform="rotate(-90 %d %d)" class="axis">%s</text>',
    18, y0 + PH // 2, 18, y0 + PH // 2, xml(title .. (o.log and " (log)" or "")))
  for _, m in ipairs(o.markers) do
    local x = sx(m.step)
    out[#out + 1] = string.format('<line class="resume" x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s" '
      .. 'stroke-width="1.2" stroke-dasharray="2 3"><title>%s resumed after step %d</title></line>',
      x, x, y0, y0 + PH, m.color, xml(m.name), m.step)
    if o.label_markers then
      out[#out + 1] = string.format('<text x="%.1f" y="%d" font-size="10" fill="%s">resumed</text>', x + 3, y0 + 11, m.color)
    end
  end
  for _, s in ipairs(series) do
    local extra = string.format('data-run="%s" data-what="%s"', xml(s.run), s.what)
      .. (s.dashed and ' stroke-dasharray="5 3"' or "") .. (s.faint and ' opacity="0.25"' or "")
    paths(out, s.tpts, sx, sy, s.color, extra)
    if s.dots then
      for _, p in ipairs(s.tpts) do
        if p[2] then
          out[#out + 1] = string.format('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>', sx(p[1]), sy(p[2]), s.color)
        end
      end
    end
  end
  out[#out + 1] = "</g>"
end

-- The expert-load points of records: {step, max/mean} or {step, min/mean} (which = "max"
-- or "min"), from each record's moe.load (tokens per expert, per MoE block).
local function load_ratio(records, which)
  local pts = {}
  for _, r in ipairs(records) do
    local v
    for _, load in ipairs(type(r.moe) == "table" and r.moe.load or {}) do
      local sum, lo, hi = 0, math.huge, -math.huge
      for _, n in ipairs(load) do sum, lo, hi = sum + n, math.min(lo, n), math.max(hi, n) end
      if sum > 0 then
        local x = (which == "max" and hi or lo) / (sum / #load)
        v = v and (which == "max" and math.max(v, x) or math.min(v, x)) or x
      end
    end
    if v then pts[#pts + 1] = { r.step, v } end
  end
  return pts
end

local function column(records, key)
  local pts = {}
  for i, r in ipairs(records) do pts[i] = { r.step, r[key] } end
  return pts
end

-- The key to the line styles, right-aligned above the first panel: entries {text, draw}.
local function style_key(out, y, entries)
  local x = LEFT + PW
  for i = #entries, 1, -1 do
    local e = entries[i]
    x = x - #e[1] * 7
    out[#out + 1] = string.format('<text x="%d" y="%d" dy="4" fill="#555">%s</text>', x, y, xml(e[1]))
    out[#out + 1] = e[2](x - 28, x - 6, y)
    x = x - 44
  end
end

-- One line of the header per run: its colour, file name and what it was.
local function describe(m, first, last)
  local r, sub = m.run or {}, {}
  if r.params then
    local p = r.params
    sub[#sub + 1] = string.format("%s params, L=%s C=%s T=%s", p >= 1e9 and string.format("%.2fB", p / 1e9)
      or p >= 1e6 and string.format("%.2fM", p / 1e6) or string.format("%.1fK", p / 1e3),
      tostring(r.layers), tostring(r.dim), tostring(r.seq))
  end
  sub[#sub + 1] = string.format("steps %d-%d", first, last)
  local tr, va = m.train, m.val
  if tr[#tr].loss then sub[#sub + 1] = string.format("last loss %.4f", tr[#tr].loss) end
  if #va > 0 and va[#va].val_loss then sub[#sub + 1] = string.format("val %.4f", va[#va].val_loss) end
  if #m.resumes > 0 then
    local at = {}
    for i, s in ipairs(m.resumes) do at[i] = tostring(s) end
    sub[#sub + 1] = "resumed after " .. table.concat(at, ", ")
  end
  if r.device then sub[#sub + 1] = r.device end
  local text = table.concat(sub, "  |  ")
  return #text > 130 and text:sub(1, 127) .. "..." or text
end

-- The SVG text for loaded metrics tables ({m1, m2, ...}, each with .name for the legend);
-- opts = {smooth = N, log = bool}.
function plot.svg(runs, opts)
  opts = opts or {}
  local first, last = math.huge, -math.huge
  for _, m in ipairs(runs) do
    first = math.min(first, m.train[1].step)
    last = math.max(last, m.train[#m.train].step, #m.val > 0 and m.val[#m.val].step or -math.huge)
  end
  last = math.max(last, first + 1)
  -- The step axis ends where the runs end: ticks inside, the last step labelled too.
  local _, _, _, xstep = ticks(first, last, 8, 1) -- steps are whole
  local xlo = math.floor(first / xstep) * xstep
  local xt = {}
  for v = xlo, last, xstep do xt[#xt + 1] = v end
  local function sx(v) return LEFT + (v - xlo) / (last - xlo) * PW end
  if xt[#xt] ~= last then -- the end gets a label, in place of a tick too close to it for both
    if sx(last) - sx(xt[#xt]) < 36 then xt[#xt] = nil end
    xt[#xt + 1] = last
    xt.end_step = last
  end
  local xaxis = { t = xt, step = xstep }

  local moe = {}
  for _, m in ipairs(runs) do
    local hi = load_ratio(m.train, "max")
    if #hi > 0 then
      moe[#moe + 1] = { pts = hi, color = m.color, run = m.name, what = "expert load max/mean" }
      moe[#moe + 1] = { pts = load_ratio(m.train, "min"), color = m.color, run = m.name,
        what = "expert load min/mean", dashed = true }
    end
  end
  local panels = #moe > 0 and 5 or 4
  local top = 44 + ROW * #runs + 26
  local H = top + panels * PH + (panels - 1) * GAP + 56
  local title = #runs == 1 and "loom run: " .. runs[1].name or string.format("loom: %d runs", #runs)
  local out = {
    string.format('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
      .. 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12" fill="#222">', W, H, W, H),
    "<style>.axis{font-size:13px;font-weight:bold}</style>",
    string.format('<rect width="%d" height="%d" fill="#fafafa"/>', W, H),
    string.format('<text x="%d" y="28" font-size="18" font-weight="bold">%s</text>', LEFT, xml(title)),
  }
  local markers = {}
  for i, m in ipairs(runs) do
    m.color = COLORS[(i - 1) % #COLORS + 1]
    local y = 48 + ROW * (i - 1)
    out[#out + 1] = string.format('<g class="legend" data-run="%s">', xml(m.name))
    out[#out + 1] = string.format('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/>',
      LEFT, LEFT + 22, y - 4, y - 4, m.color)
    out[#out + 1] = string.format('<text x="%d" y="%d" font-weight="bold">%s</text>', LEFT + 30, y, xml(m.name))
    out[#out + 1] = string.format('<text x="%.0f" y="%d" fill="#555">%s</text>', LEFT + 30 + 7.5 * #m.name + 12, y,
      xml(describe(m, m.train[1].step, m.train[#m.train].step)))
    out[#out + 1] = "</g>"
    for _, s in ipairs(m.resumes) do markers[#markers + 1] = { step = s, color = m.color, name = m.name } end
  end
  local n = opts.smooth
  local function series(key, what, n_smooth)
    local list = {}
    for _, m in ipairs(runs) do
      local pts = column(m.train, key)
      if n_smooth and n_smooth > 1 then
        list[#list + 1] = { pts = pts, color = m.color, run = m.name, what = what .. " raw", faint = true }
        pts = smooth(pts, n_smooth)
      end
      list[#list + 1] = { pts = pts, color = m.color, run = m.name, what = what }
      if key == "loss" and #m.val > 0 then
        list[#list + 1] = { pts = column(m.val, "val_loss"), color = m.color, run = m.name, what = "val loss",
          dots = true, dashed = true }
      end
    end
    return list
  end
  local key = {
    { n and n > 1 and string.format("train (mean of %d)", n) or "train",
      function(a, b, y) return string.format('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#555" stroke-width="2"/>', a, b, y, y) end },
  }
  local any_val, any_resume = false, #markers > 0
  for _, m in ipairs(runs) do any_val = any_val or #m.val > 0 end
  if any_val then
    key[#key + 1] = { "val", function(a, b, y)
      return string.format('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#555" stroke-width="2" stroke-dasharray="5 3"/>'
        .. '<circle cx="%d" cy="%d" r="3" fill="#555"/>', a, b, y, y, (a + b) // 2, y) end }
  end
  if any_resume then
    key[#key + 1] = { "resumed", function(a, b, y)
      return string.format('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#555" stroke-width="1.2" stroke-dasharray="2 3"/>',
        (a + b) // 2, (a + b) // 2, y - 7, y + 7) end }
  end
  style_key(out, top - 10, key)
  local y = top
  panel(out, "loss", y, "loss", series("loss", "train loss", n), sx, xaxis,
    { log = opts.log, markers = markers, label_markers = true })
  y = y + PH + GAP
  panel(out, "norm", y, "grad norm", series("grad_norm", "grad norm", n), sx, xaxis,
    { log = opts.log, zero = true, markers = markers })
  y = y + PH + GAP
  panel(out, "tokens", y, "tokens/s", series("tokens_per_s", "tokens/s", n), sx, xaxis, { zero = true, markers = markers })
  y = y + PH + GAP
  if #moe > 0 then -- colours are set above, with the legend: the series take them now
    for _, s in ipairs(moe) do
      for _, m in ipairs(runs) do if m.name == s.run then s.color = m.color end end
    end
    panel(out, "expert-load", y, "load / mean (min dashed)", moe, sx, xaxis, { zero = true, markers = markers })
    y = y + PH + GAP
  end
  panel(out, "lr", y, "learning rate", series("lr", "lr"), sx, xaxis, { zero = true, markers = markers, xlabels = true })
  out[#out + 1] = string.format('<text x="%d" y="%d" text-anchor="middle" class="axis">step</text>', LEFT + PW // 2, y + PH + 40)
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n") .. "\n"
end

-- Plot metrics files `paths` into `out`; opts as plot.svg's, and warn as plot.load's.
-- Returns the loaded metrics, in order. Names in the legend are the files' base names, or
-- the paths as given where two base names are the same.
function plot.write(paths, out, opts, warn)
  local runs, seen, clash = {}, {}, false
  for i, p in ipairs(paths) do
    runs[i] = plot.load(p, warn)
    local base = p:match("[^/]*$")
    clash = clash or seen[base]
    seen[base] = true
  end
  for i, m in ipairs(runs) do m.name = clash and paths[i] or paths[i]:match("[^/]*$") end
  local text = plot.svg(runs, opts)
  local f, err = io.open(out, "wb")
  if not f then error("cannot write plot: " .. err, 0) end
  f:write(text)
  f:close()
  return runs
end

return plot
