-- loom — the recipe API.
--
--   local loom = require "loom"
--   loom.train { model = loom.gpt{...}, data = loom.data.text{...}, optimizer = {...}, ... }
--
-- Declarative loom.train is built on an imperative session (loom.session) that a recipe
-- may use directly for a loop of its own. Every table is checked before any work is done:
-- unknown keys, wrong types and impossible values are refused naming the recipe's file
-- and line, the key and what is accepted. C does resources and speed (loom.core); Lua
-- does shape and defaults.
local core = require "loom.core"
local schema = require "loom.schema"

local loom = { core = core, version = core.version }
loom.lr = require "loom.lr"

local gpt_spec = {
  vocab = { type = "integer", min = 2, required = true, help = "tokens in the vocabulary" },
  vocab_padded = { type = "integer", min = 2, help = "pad the embedding to this many rows for speed" },
  ctx = { type = "integer", min = 1, required = true, help = "maximum sequence length" },
  layers = { type = "integer", min = 1, required = true },
  heads = { type = "integer", min = 1, required = true },
  dim = { type = "integer", min = 1, required = true, help = "model width C" },
}

-- loom.gpt{vocab, ctx, layers, heads, dim [, vocab_padded]}: a GPT-2 model description.
function loom.gpt(t)
  local where = schema.where()
  schema.check(t, gpt_spec, "loom.gpt", where)
  if t.dim % t.heads ~= 0 then
    local ok = {}
    for h = 1, math.min(t.dim, 64) do if t.dim % h == 0 then ok[#ok + 1] = h end end
    schema.fail(where, "loom.gpt heads=%d does not divide dim=%d (heads may be %s)", t.heads,
      t.dim, table.concat(ok, ", "))
  end
  local m = { kind = "gpt" }
  for k, v in pairs(t) do m[k] = v end
  return m
end

loom.data = {}
local text_spec = {
  path = { type = "string", required = true, help = "a text file; its bytes are the tokens" },
  val_fraction = { type = "number", min = 0, max = 0.99, help = "tail of the file kept for validation" },
}

-- loom.data.text{path, val_fraction=0.1}: a text file, bytes as tokens (vocab 256).
function loom.data.text(t)
  schema.check(t, text_spec, "loom.data.text", schema.where())
  return { kind = "text", path = t.path, val_fraction = t.val_fraction or 0.1 }
end

-- loom.data.random{vocab, seed=0}: synthetic uniform tokens, for benchmarks and tests.
function loom.data.random(t)
  schema.check(t, { vocab = { type = "integer", min = 2, required = true },
    seed = { type = "integer", min = 0 } }, "loom.data.random", schema.where())
  return { kind = "random", vocab = t.vocab, seed = t.seed or 0 }
end

-- A relative data path is taken from the working directory, else from the recipe's own
-- directory, so `loom run scripts/recipes/x.lua` works from anywhere.
local function find_file(path, where)
  local f = io.open(path, "rb")
  if f then f:close(); return path end
  if path:sub(1, 1) ~= "/" and arg and arg[0] then
    local dir = arg[0]:match("^(.*)/[^/]*$")
    if dir then
      local alt = dir .. "/" .. path
      f = io.open(alt, "rb")
      if f then f:close(); return alt end
    end
  end
  schema.fail(where, "data file '%s' not found (relative paths are tried from the working "
    .. "directory, then from the recipe's directory)", path)
end

-- Open a data description made by loom.data.*.
function loom.open_data(d, where)
  where = where or schema.where()
  if type(d) ~= "table" or (d.kind ~= "text" and d.kind ~= "random") then
    schema.fail(where, "data must come from loom.data.text{...} or loom.data.random{...}")
  end
  if d.kind == "random" then return core.random_data(d.vocab, d.seed) end
  local ok, data = pcall(core.text_data, find_file(d.path, where), d.val_fraction)
  if not ok then schema.fail(where, "%s", data) end
  return data
end

-- "adamw" or { "adamw", lr = ... } -> { name = "adamw", lr = ... }
function loom.plugin_table(v, what, where)
  if type(v) == "string" then return { name = v } end
  if type(v) ~= "table" then
    schema.fail(where, "%s must be a name or a table like { \"name\", key = value }", what)
  end
  local t = {}
  for k, x in pairs(v) do if k ~= 1 then t[k] = x end end
  t.name = v[1] or v.name
  if type(t.name) ~= "string" then
    schema.fail(where, "%s table needs the plugin's name first, e.g. { \"adamw\", lr = 3e-4 }", what)
  end
  return t
end

local session_spec = {
  model = { type = "table", required = true, help = "loom.gpt{...}" },
  batch = { type = "table", required = true, help = "{ micro = B, seq = T [, accum = k] }" },
  optimizer = { type = { "string", "table" }, required = true, help = "{ \"adamw\", lr = ... }" },
  precision = { type = { "string", "table" } },
  seed = { type = "integer", min = 0 },
  grad_clip = { type = "number", min = 0 },
  threads = { type = "integer", min = 0 },
  backend = { type = "string" },
}
local session_batch_spec = {
  micro = { type = "integer", min = 1, required = true },
  seq = { type = "integer", min = 1, required = true },
  accum = { type = "integer", min = 1 },
}

-- loom.session{model, batch={micro, seq, accum}, optimizer, precision, seed, grad_clip,
-- threads, backend} -> a Session with :step(data, lr), :eval(data, n), :sample(...), :info().
function loom.session(t, where)
  where = where or schema.where()
  schema.check(t, session_spec, "loom.session", where)
  schema.check(t.batch, session_batch_spec, "batch", where)
  if t.batch.seq > t.model.ctx then
    schema.fail(where, "batch.seq=%d is longer than the model's ctx=%d", t.batch.seq, t.model.ctx)
  end
  local cfg = {
    model = t.model, micro = t.batch.micro, seq = t.batch.seq, accum = t.batch.accum or 1,
    seed = t.seed or 1337, grad_clip = t.grad_clip or 1.0, threads = t.threads or 0,
    backend = t.backend or "cpu",
    optimizer = loom.plugin_table(t.optimizer, "optimizer", where),
    precision = loom.plugin_table(t.precision or "fp32", "precision", where),
  }
  local ok, s = pcall(core.session, cfg)
  if not ok then schema.fail(where, "%s", s) end
  return s
end

-- loom.sample{session, prompt, tokens=200, temperature=1, top_k=0, seed=0} -> text
local sample_spec = {
  session = { type = "userdata", required = true, help = "what loom.train or loom.session returned" },
  prompt = { type = { "string", "table" }, required = true },
  tokens = { type = "integer", min = 0 },
  temperature = { type = "positive" },
  top_k = { type = "integer", min = 0 },
  seed = { type = "integer", min = 0 },
}
function loom.sample(t)
  local where = schema.where()
  schema.check(t, sample_spec, "loom.sample", where)
  local ok, out = pcall(t.session.sample, t.session, t.prompt, t.tokens or 200,
    t.temperature or 1.0, t.top_k or 0, t.seed or 0)
  if not ok then schema.fail(where, "%s", out) end
  return out
end

-- The command line's key=value overrides ({ {key, text}, ... }).
function loom.overrides() return core.overrides or {} end

loom.train = require("loom.train")(loom)

return loom
