-- loom.lr — learning-rate schedules. A schedule is a table {kind=...} that loom.train
-- turns into a function(step) -> lr given the optimizer's base lr; a recipe may also give
-- any Lua function(step) -> lr directly. Steps count from 1.
local schema = require "loom.schema"
local lr = {}

local spec = {
  warmup = { type = "integer", min = 0, help = "steps of linear warm-up from 0" },
  total = { type = "integer", min = 1, help = "step at which decay ends" },
  min = { type = "number", min = 0, max = 1, help = "final lr as a fraction of the base lr" },
}

function lr.constant(t)
  t = t or {}
  schema.check(t, { warmup = spec.warmup }, "loom.lr.constant", schema.where())
  return { kind = "constant", warmup = t.warmup or 0 }
end

-- Linear warm-up, then cosine decay from the base lr to min*base at `total` (llm.c's,
-- after Loshchilov & Hutter 2017), constant after that.
function lr.cosine(t)
  local where = schema.where()
  schema.check(t or {}, spec, "loom.lr.cosine", where)
  if not t.total then schema.fail(where, "loom.lr.cosine needs total (the last step of decay)") end
  return { kind = "cosine", warmup = t.warmup or 0, total = t.total, min = t.min or 0.1 }
end

-- The keys each kind of schedule table accepts (what loom.lr.<kind>{} returns).
local kinds = {
  constant = { kind = { type = "string" }, warmup = spec.warmup },
  cosine = { kind = { type = "string" }, warmup = spec.warmup, total = spec.total, min = spec.min },
}

-- Check a schedule table as loom.train receives it: after command-line overrides
-- (lr.warmup=x, lr.foo=1, lr.kind=linear), so a typo is refused rather than ignored.
-- origin(key) may say a value came from the command line.
function lr.check(t, where, origin)
  local kind = t.kind
  if kinds[kind] == nil then
    local from = origin and origin("lr.kind") or ""
    schema.fail(where, "lr.kind=%s%s is not a schedule (accepted: constant, cosine; make one "
      .. "with loom.lr.cosine{...} or loom.lr.constant{...}, or give a number or a function)",
      tostring(kind), from)
  end
  schema.check(t, kinds[kind], "lr", where, origin)
  if kind == "cosine" then
    if t.total == nil then schema.fail(where, "lr needs key 'total' (the last step of decay)") end
    if (t.warmup or 0) > t.total then
      schema.fail(where, "lr.warmup=%d%s is past lr.total=%d%s (warm-up must end before decay does)",
        t.warmup, origin and origin("lr.warmup") or "", t.total, origin and origin("lr.total") or "")
    end
  end
end

-- The function(step) for a schedule table, a number, or a function.
function lr.resolve(s, base)
  if type(s) == "function" then return s end
  if type(s) == "number" then return function() return s end end
  if s == nil then return function() return base end end
  local warmup = s.warmup or 0
  local function warm(step, value)
    if step <= warmup then return value * step / warmup end
    return value
  end
  if s.kind == "constant" then
    return function(step) return warm(step, base) end
  end
  local min = s.min or 0.1 -- a table written out ({ kind = "cosine", ... }) may leave it out
  return function(step)
    if step <= warmup then return base * step / warmup end
    if step >= s.total then return base * min end
    local ratio = (step - warmup) / math.max(1, s.total - warmup)
    local coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return base * (min + coeff * (1.0 - min))
  end
end

return lr
