-- loom.metrics — what a run shows: a progress line per step and a JSONL metrics file.
--
--   local m = metrics.new { steps = 800, every = 10, jsonl = "run/metrics.jsonl",
--     params = P, layers = L, dim = C, seq = T, device = info.backend }
--   m:step(r)  m:eval(step, val_loss)  m:print(text)  m:close()   (also `<close>`)
--
-- The line shows step, loss, lr, grad norm, ms, tokens/s, MFU, peak memory and ETA. On a
-- terminal a live line is redrawn in place every step and kept every `every` steps and at
-- the last, fitted to the terminal's width (metrics.fit: numbers shortened, then columns
-- dropped, never step, loss or eta); to a file or pipe, one line per kept step with every
-- column and no control characters. The JSONL file gets every step, whatever `every` is.
-- MFU is shown only against a peak FLOP/s that is known (the recipe's peak_flops, else
-- the table below): no MFU column beats a wrong number. Formula, table and file format:
-- docs/METRICS.md.
local core = require "loom.core"
local json = require "loom.json"
local schema = require "loom.schema"

local metrics = {}

-- Peak dense bf16/fp16 tensor FLOP/s by device name, as Lua patterns tried in order: the
-- first match wins, so specific names precede their families, and %f[%W] ends a name
-- (A100 must not match "RTX A1000"). `false` marks a part whose figure differs from its
-- family's and is not known here: MFU is n/a there rather than wrong.
metrics.peaks = {
  { "H200 NVL", false },          -- lower-power part: give peak_flops in the recipe
  { "H200%f[%W]", 989e12 },
  { "H100 NVL", false },
  { "H100 PCIe", 756e12 },
  { "H100 SXM", 989e12 },
  { "H100 80GB HBM3", 989e12 },   -- what CUDA calls the H100 SXM5
  { "A100%f[%W]", 312e12 },       -- SXM and PCIe alike
  { "L40S", 362e12 },
  { "RTX 4090 D", false },        -- fewer SMs than the RTX 4090
  { "RTX 4090 Laptop", false },   -- a different, smaller chip
  { "RTX 4090%f[%W]", 165e12 },
  { "V100%-SXM2", 125e12 },       -- fp16; V100 PCIe (112), V100S (130) and SXM3 differ
}

-- The peak FLOP/s for a device description, or nil; and the name of the entry matched.
function metrics.peak_for(device)
  for _, e in ipairs(metrics.peaks) do
    if device:find(e[1]) then return e[2] or nil, (e[1]:gsub("%%f%[%%W%]", ""):gsub("%%", "")) end
  end
  return nil
end

local spec = {
  steps = { type = "integer", min = 0, required = true, help = "the run's last step" },
  every = { type = "integer", min = 1, help = "keep a progress line every N steps" },
  jsonl = { type = "string", help = "path of the metrics file, parent dirs are created" },
  params = { type = "integer", min = 1 }, layers = { type = "integer", min = 1 },
  dim = { type = "integer", min = 1 }, seq = { type = "integer", min = 1 },
  peak_flops = { type = "positive", help = "the device's peak FLOP/s, for MFU" },
  device = { type = "string", help = "backend description, e.g. session:info().backend" },
  start_step = { type = "integer", min = 0, help = "steps done before this run (resume)" },
  quiet = { type = "boolean", help = "print nothing (ranks other than 0 of a multi-rank run)" },
  devices = { type = "integer", min = 1, help = "devices (ranks) the run uses: MFU divides the peak among them" },
}

-- loom.json writes a non-finite number as null: a field that is unknown (MFU without a
-- peak) is written as this, so that it is present and null rather than missing.
local NULL = 0 / 0

local function duration(s)
  if not (s >= 0 and s < math.huge) then return "?" end -- a step repeated or out of order
  s = math.floor(s + 0.5)
  if s < 60 then return s .. "s" end
  if s < 3600 then return string.format("%dm%02ds", s // 60, s % 60) end
  return string.format("%dh%02dm", s // 3600, s % 3600 // 60)
end

local function mem(bytes, short)
  if bytes < 1024 ^ 3 then return string.format(short and "%.0fM" or "%.0fMiB", bytes / 1024 ^ 2) end
  return string.format(short and "%.1fG" or "%.2fGiB", bytes / 1024 ^ 3)
end

-- Columns of the terminal: $COLUMNS where set to a number (as ls(1) does, so that a user
-- or a test can choose), else the terminal's own size, else 80.
function metrics.width()
  local env = math.tointeger(tonumber(os.getenv("COLUMNS") or ""))
  if env and env > 0 then return env end
  return core.term_width(1) or 80
end

-- A number in 3 significant digits with k/M/G: 95189 -> "95.2k".
local function si(v)
  for _, u in ipairs { { 1e9, "G" }, { 1e6, "M" }, { 1e3, "k" } } do
    if math.abs(v) >= u[1] then return string.format("%.3g%s", v / u[1], u[2]) end
  end
  return string.format("%.3g", v)
end

-- 2.96e-03 -> "3.0e-3": the short form of a learning rate.
local function sci(v) return (string.format("%.1e", v):gsub("e([-+])0*(%d)", function(sign, d)
  return "e" .. (sign == "-" and "-" or "") .. d end)) end

-- The progress line's columns, in the order shown. Each has up to three forms, widest
-- first: padded (fixed width, so that a line redrawn in place does not jitter), plain
-- (no padding) and short (fewer digits); step, loss and "skipped" have a fourth, tiniest.
-- `drop` is the order in which a narrow terminal loses whole columns: mem, mfu, ms (tok/s
-- says the same, but for comm), norm, lr, tok/s. step, loss, the eta (or took) and
-- "skipped" have none: they are never dropped. MFU is left out where no peak is known
-- (the line before the first step says why), and is "n/a" only for a step whose
-- tokens/s is not a number.
local function columns(self, r, tps, mfu, rss, tail)
  local cols = {}
  local function col(drop, ...) cols[#cols + 1] = { drop = drop, ... } end
  local w = #tostring(self.steps)
  col(nil, string.format("step %" .. w .. "d/%d", r.step, self.steps), string.format("step %d/%d", r.step, self.steps),
    nil, string.format("%d/%d", r.step, self.steps))
  col(nil, string.format("loss %.4f", r.loss), nil, nil, string.format("loss %.3f", r.loss))
  col(5, string.format("lr %.2e", r.lr), nil, "lr " .. sci(r.lr))
  col(4, string.format("norm %.3f", r.grad_norm), nil, string.format("norm %.2f", r.grad_norm))
  if r.loss_scale and r.loss_scale ~= 1 then -- fp16's dynamic loss scale (after this step)
    col(4, string.format("scale %g", r.loss_scale), nil, "scale " .. si(r.loss_scale))
  end
  local comm, short_comm = "", ""
  if self.devices > 1 and r.comm_ms and r.ms > 0 then
    comm = string.format(" (comm %2.0f%%)", 100 * r.comm_ms / r.ms)
    short_comm = string.format(" (comm %.0f%%)", 100 * r.comm_ms / r.ms)
  end
  col(3, string.format("%7.1f ms", r.ms) .. comm, string.format("%.1f ms", r.ms) .. short_comm,
    string.format(r.ms >= 10 and "%.0f ms" or "%.1f ms", r.ms) .. short_comm)
  if tps == tps and math.abs(tps) < math.huge then
    col(6, string.format("%8.0f tok/s", tps), string.format("%.0f tok/s", tps), si(tps) .. " tok/s")
  else
    col(6, "     n/a tok/s", "n/a tok/s")
  end
  if self.peak and self.flops_per_token then
    local pct = mfu and 100 * mfu
    col(2, string.format("mfu %6s", pct and string.format("%.3g%%", pct) or "n/a"),
      "mfu " .. (pct and string.format("%.3g%%", pct) or "n/a"),
      "mfu " .. (pct and string.format(pct >= 10 and "%.0f%%" or "%.2g%%", pct) or "n/a"))
  end
  col(1, "mem " .. mem(rss), nil, "mem " .. mem(rss, true))
  col(nil, tail)
  if r.skipped then -- with the run's count of skipped steps so far
    local n = string.format("skipped %d", self.skips)
    col(nil, n, nil, nil, "skip")
  end
  return cols
end

-- Levels of fitting: 1 padded, 2 plain, 3 short, then 3 + k (k = 1..6): short with the
-- k first droppable columns gone, and last 10: step, loss and eta in their tiniest forms
-- ("50/300 | loss 2.957 | eta 19s"). Returns the line at the first level from `level` on
-- that fits `width` characters (level 10 if none does: under about 30 columns, more
-- with long step counts, the terminal cuts it), and that level. Without a width (a file
-- or a pipe): padded, every column.
local LAST = 10
function metrics.fit(cols, width, level)
  local function line(lv)
    local form, gone, parts = math.min(lv, 3), lv - 3, {}
    if lv == LAST then form = 4 end
    for _, c in ipairs(cols) do
      if not (c.drop and c.drop <= gone) then
        local i = form
        while not c[i] do i = i - 1 end -- a column without a shorter form keeps its longer
        parts[#parts + 1] = c[i]
      end
    end
    return table.concat(parts, " | ")
  end
  if not width then return line(1), 1 end
  local lv, text = level or 1, nil
  while true do
    text = line(lv)
    if #text <= width or lv >= LAST then return text, lv end
    lv = lv + 1
  end
end

local M = {}
M.__index = M

-- metrics.new{...}: checks its table like a recipe's, opens the JSONL file (writing a
-- "run" header object), and prints one line saying where MFU's peak comes from.
function metrics.new(t)
  local where = schema.where()
  schema.check(t, spec, "metrics", where)
  local self = setmetatable({
    steps = t.steps, every = t.every or 1, start_step = t.start_step or 0,
    tty = core.isatty(1), live = false, t0 = core.now(), quiet = t.quiet, devices = t.devices or 1,
  }, M)
  -- llm.c's count: 6N for the matmuls forward and backward, 6*L*C*T for attention.
  if t.params and t.layers and t.dim and t.seq then
    self.flops_per_token = 6 * t.params + 6 * t.layers * t.dim * t.seq
  end
  local source
  if t.peak_flops then
    self.peak, source = t.peak_flops, "recipe peak_flops"
  elseif t.device then
    local name
    self.peak, name = metrics.peak_for(t.device)
    source = name and ("table entry '" .. name .. "'")
  end
  local why
  if not self.flops_per_token then
    why = "mfu n/a (no model size given: params, layers, dim, seq)"
  elseif self.peak then
    why = string.format("mfu against %.4g TFLOP/s peak (%s)", self.peak / 1e12, source)
  elseif source then
    why = "mfu n/a (" .. source .. " has no reliable peak; set peak_flops in the recipe)"
  else
    why = "mfu n/a (no peak FLOP/s known for this device; set peak_flops in the recipe)"
  end
  if t.jsonl then
    local dir = t.jsonl:match("^(.*)/[^/]*$")
    if dir and dir ~= "" then
      local ok, err = core.mkdir_p(dir)
      if not ok then schema.fail(where, "metrics file '%s': %s", t.jsonl, err) end
    end
    -- A resumed run appends to the file of the run it continues.
    local f, err = io.open(t.jsonl, self.start_step > 0 and "a" or "w")
    if not f then schema.fail(where, "cannot open metrics file: %s", err) end
    -- each line flushed on its own (M:write): on disk at once for `tail -f` and a crash, and
    -- a failed write is seen there (a line-buffered stream hides the error of its implicit flush)
    self.file, self.jsonl = f, t.jsonl
    self:write { kind = "run", steps = t.steps, start_step = self.start_step,
      params = t.params or NULL, layers = t.layers or NULL, dim = t.dim or NULL,
      seq = t.seq or NULL, flops_per_token = self.flops_per_token or NULL,
      peak_flops = self.peak or NULL, device = t.device or NULL, devices = self.devices }
    why = why .. " | metrics to " .. t.jsonl
  end
  if not self.quiet then print(why) end
  return self
end

-- A record that cannot be written (a full disk, an I/O error) stops the run with the
-- file's name and the system's reason: a metrics file is never cut silently.
local function io_failed(self, what, err)
  local path = self.jsonl
  self.file = nil -- nothing more goes to it; close() has nothing left to report
  error(string.format("metrics file '%s': cannot %s: %s (free space on its disk or give "
    .. "log.jsonl another path; the records before it are intact)", path, what, tostring(err)), 0)
end

function M:write(obj)
  if not self.file then return end
  local ok, err = self.file:write(json.encode(obj), "\n")
  if ok then ok, err = self.file:flush() end -- each line's own flush reports its error
  if not ok then
    pcall(self.file.close, self.file)
    io_failed(self, string.format("write the %s record%s", obj.kind or "next",
      obj.step and (" of step " .. obj.step) or ""), err)
  end
end

-- Erase the live line so that other output starts at column 0.
function M:clear()
  if self.live then io.write("\r\27[K"); self.live = false end
end

-- Print other output (samples, notes) without mixing it into the live line.
function M:print(...)
  if self.quiet then return end
  self:clear()
  print(...)
end

local required = { "step", "loss", "lr", "grad_norm", "ms", "tokens" }

-- m:step(r), r = {step, loss, lr, grad_norm, ms, tokens [, tokens_per_s, skipped, memory]}
-- (memory: session:info().memory, this rank's bytes by category, written as is):
-- one JSONL object, and the progress line when due.
function M:step(r)
  for _, k in ipairs(required) do
    if type(r[k]) ~= "number" then
      error(string.format("metrics:step: r.%s must be a number, got %s", k, type(r[k])), 2)
    end
  end
  local tps = r.tokens_per_s or r.tokens / (r.ms / 1000)
  local mfu
  if self.peak and self.flops_per_token and tps == tps and tps >= 0 and tps < math.huge then
    mfu = self.flops_per_token * tps / (self.peak * self.devices)
  end
  local rss = core.peak_rss()
  local now = core.now() - self.t0
  if r.skipped then self.skips = (self.skips or 0) + 1 end
  local nf = r.nonfinite -- where a non-finite loss or gradient was found: {rank, stage, param | loss}
  self:write { kind = "train", step = r.step, loss = r.loss, lr = r.lr, grad_norm = r.grad_norm,
    ms = r.ms, comm_ms = r.comm_ms or NULL, tokens = r.tokens, tokens_per_s = tps,
    mfu = mfu or NULL, mem_bytes = rss, memory = r.memory or NULL, bubble = r.bubble or NULL,
    startup_peak_rss = r.startup_peak_rss or NULL,
    time_s = now, skipped = r.skipped and true or false, skipped_steps = self.skips or 0,
    loss_scale = r.loss_scale or NULL,
    compress_bytes = r.compress_bytes, grad_bytes = r.grad_bytes,
    compress_expert_bytes = r.compress_expert_bytes, grad_expert_bytes = r.grad_expert_bytes,
    nonfinite = nf and { rank = nf.rank, stage = nf.stage, param = nf.param, loss = nf.loss or false } or nil,
    moe = r.moe }

  -- ETA from the pace since this run's first step: that step carries one-time costs
  -- (thread start-up, allocation, kernel autotuning) that later steps do not repeat.
  local last = r.step >= self.steps
  local tail
  if last then
    tail = "took " .. duration(now)
  elseif self.first then
    tail = "eta " .. duration((now - self.first.t) / (r.step - self.first.step) * (self.steps - r.step))
  else
    tail = "eta " .. duration(now / math.max(1, r.step - self.start_step) * (self.steps - r.step))
    self.first = { step = r.step, t = now }
  end
  if self.quiet then return end
  local cols = columns(self, r, tps, mfu, rss, tail)
  local keep = r.step % self.every == 0 or last
  if self.tty then
    -- Autowrap is off while the live line is drawn: a wrapped line could not be redrawn
    -- in place with \r. The line is fitted to the terminal's width (read every step: a
    -- resized window refits), kept lines too, so that the eta is always on screen; one
    -- column short of it, since a line that ends in the last column leaves the cursor on
    -- its last character, which the clear to end of line would erase. For as long as the
    -- width holds, a run never returns to a wider level: no flicker between two levels.
    local width = metrics.width()
    if width ~= self.fit_width then self.fit_width, self.fit_level = width, 1 end
    local line
    line, self.fit_level = metrics.fit(cols, width - 1, self.fit_level)
    if keep then
      io.write("\r", line, "\27[K\n")
    else
      io.write("\r\27[?7l", line, "\27[K\27[?7h")
    end
    io.stdout:flush()
    self.live = not keep
  elseif keep then
    print((metrics.fit(cols)))
  end
  if keep and r.moe then print(metrics.moe_line(r.moe)) end
end

-- The step's expert load as a person reads it: tokens per expert of each MoE block, the
-- least and most loaded expert against the mean, the dropped fraction, the router losses.
-- "moe blk0 [8 2 6 8] min/max 0.33/1.33 of mean | dropped 25.0% | aux 0.0165 | z 0.00758"
function metrics.moe_line(moe)
  local parts = {}
  for b, load in ipairs(moe.load) do
    local sum, lo, hi = 0, math.huge, -math.huge
    for _, n in ipairs(load) do sum, lo, hi = sum + n, math.min(lo, n), math.max(hi, n) end
    local mean = sum / #load
    local counts = #load <= 16 and ("[" .. table.concat(load, " ") .. "] ") or ""
    parts[#parts + 1] = string.format("blk%d %smin/max %.2f/%.2f of mean", b - 1, counts,
      mean > 0 and lo / mean or 0, mean > 0 and hi / mean or 0)
  end
  return string.format("  moe %s | dropped %.1f%% | aux %.4g | z %.4g", table.concat(parts, ", "),
    100 * moe.dropped, moe.aux, moe.z)
end

-- m:eval(step, val_loss): the validation line, and a {"kind":"val"} JSONL object.
function M:eval(step, val_loss)
  self:write { kind = "val", step = step, val_loss = val_loss, time_s = core.now() - self.t0 }
  self:print(string.format("step %d | val loss %.4f", step, val_loss))
end

-- m:close(): keep a pending live line and close the file. Safe to call twice.
-- As a to-be-closed variable unwinding another error (err), a failing close is not reported
-- over it.
function M:close(err)
  if self.live then io.write("\n"); self.live = false end
  if self.file then
    local f = self.file
    local ok, why = f:flush()
    if ok then ok, why = f:close() else pcall(f.close, f) end
    self.file = nil
    if not ok and err == nil then io_failed(self, "flush and close it", why) end
  end
end
M.__close = M.close

return metrics
