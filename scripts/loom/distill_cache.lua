-- loom.distill_cache — `loom distill-cache RECIPE --out FILE [--k K] [key=value ...]`
-- (docs/DISTILL.md): loom.train, having built the recipe's session and data, runs the
-- teacher over the micro-batches `steps` steps of this recipe draw — steps x batch.global /
-- batch.micro of them, the data stream in order — and writes each token's k largest logits
-- (core/train/kd_cache.h) instead of training. A run with teacher = { cache = FILE } of the
-- same data and batch shape then reads them back, at any dp or accumulation.
local json = require "loom.json"
local schema = require "loom.schema"
local M = {}

local function describe(v)
  local ok, text = pcall(json.encode, v)
  return ok and text or tostring(v)
end

-- session and data: loom.train's; t: the checked recipe; opts: core.distill_cache
-- ({ out = FILE, k = "K" or nil }); per_step: micro-batches per step of the whole run.
function M.write(loom, session, data, t, opts, where, per_step)
  local teacher = t.teacher
  if not teacher then
    schema.fail(where, "distill-cache: the recipe has no teacher = { checkpoint = DIR } or "
      .. "{ model = loom.gpt{ init = FILE } } to run")
  end
  if teacher.cache then
    schema.fail(where, "distill-cache: the recipe's teacher is a cache already (teacher.cache = "
      .. "\"%s\"); give the teacher's checkpoint or model to write one", teacher.cache)
  end
  if (loom.core.world or 1) > 1 then
    schema.fail(where, "distill-cache runs on one rank (got %d): every rank draws every "
      .. "micro-batch, so the cache serves any dp; run it with loom distill-cache and mesh.dp=1",
      loom.core.world)
  end
  local vocab = t.model.vocab
  local k = opts.k and math.tointeger(tonumber(opts.k)) or math.min(64, vocab)
  if not k or k < 1 or k > vocab then
    schema.fail(where, "distill-cache: --k %s must be a whole number in [1, vocab=%d]",
      tostring(opts.k), vocab)
  end
  local records = t.steps * per_step
  local t0 = loom.core.now()
  local ok, err = pcall(session.write_kd_cache, session, data, { path = opts.out, k = k,
    micro = t.batch.micro, seq = t.batch.seq, records = records, source = describe(t.data),
    teacher = teacher.checkpoint or (teacher.model and teacher.model.init) or "" })
  if not ok then schema.fail(where, "%s", err) end
  local bytes = 560 + records * (16 + 8 * t.batch.micro * t.batch.seq * k)
  print(string.format("distill-cache: %d micro-batches (%d steps x %d) of %dx%d tokens, top %d "
    .. "of %d logits -> %s (%.1f MiB, %.2f s)", records, t.steps, per_step, t.batch.micro,
    t.batch.seq, k, vocab, opts.out, bytes / 1048576, loom.core.now() - t0))
  return session, { records = records, k = k, bytes = bytes }
end

return M
