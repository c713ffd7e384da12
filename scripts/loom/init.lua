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
-- This process's rank and the number of ranks (0 and 1 without a launcher).
loom.rank, loom.world = core.rank or 0, core.world or 1
loom.lr = require "loom.lr"

-- The recipe's directory (nil when unknown): relative paths are tried from it second.
local function recipe_dir()
  return arg and arg[0] and arg[0]:match("^(.*)/[^/]*$") or nil
end

-- A relative data path is taken from the working directory, else from the recipe's own
-- directory, so `loom run scripts/recipes/x.lua` works from anywhere.
local function find_file(path, where, what)
  local f = io.open(path, "rb")
  if f then f:close(); return path end
  local dir = recipe_dir()
  if path:sub(1, 1) ~= "/" and dir then
    local alt = dir .. "/" .. path
    f = io.open(alt, "rb")
    if f then f:close(); return alt end
  end
  schema.fail(where, "%s '%s' not found (relative paths are tried from the working "
    .. "directory, then from the recipe's directory)", what or "data file", path)
end

-- A glob, resolved as find_file resolves a path; one that matches nothing is returned
-- as given, for the opener to refuse with context.
local function find_glob(pattern)
  if pattern:sub(1, 1) == "/" or core.glob_count(pattern) > 0 then return pattern end
  local dir = recipe_dir()
  if dir and core.glob_count(dir .. "/" .. pattern) > 0 then return dir .. "/" .. pattern end
  return pattern
end

local gpt_spec = {
  vocab = { type = "integer", min = 2, required = true, help = "tokens in the vocabulary" },
  vocab_padded = { type = "integer", min = 2, help = "pad the embedding to this many rows for speed" },
  ctx = { type = "integer", min = 1, required = true, help = "maximum sequence length" },
  layers = { type = "integer", min = 1, required = true },
  heads = { type = "integer", min = 1, required = true },
  dim = { type = "integer", min = 1, required = true, help = "model width C" },
  init = { type = "string", help = "an llm.c model file: gives the shape keys left out, and "
    .. "the weights the session starts from" },
  moe = { type = "table", help = "mixture of experts: { experts = E, top_k = k, every = n, "
    .. "capacity_factor = c, aux_loss = a, z_loss = z, router = \"topk\" | \"noisy_topk\" }" },
}

-- loom.gpt{moe = {...}} (core/model/moe.h): every n-th block's MLP becomes E experts.
local moe_spec = {
  experts = { type = "integer", min = 1, max = 1024, required = true, help = "experts per MoE block" },
  top_k = { type = "integer", min = 1, help = "experts per token (default 2, or 1 with one expert)" },
  every = { type = "integer", min = 1, help = "blocks l with (l + 1) % every == 0 are MoE blocks (default 1)" },
  capacity_factor = { type = "number", min = 0, help = "slots per expert ceil(k tokens / E * c); 0: dropless (default 1.25)" },
  aux_loss = { type = "number", min = 0, help = "Switch load-balancing loss weight (default 0.01)" },
  z_loss = { type = "number", min = 0, help = "router z-loss weight (default 0.001)" },
  router = { type = "string", one_of = { "topk", "noisy_topk" } },
  noise_std = { type = "number", min = 0, help = "noisy_topk: std of the logits' noise (default 1)" },
  overlap = { type = "boolean", help = "ep: each half of the local experts' exchange runs while the "
    .. "other half computes (default false: slower on the 2-core shm measured, docs/MOE.md; the same bits either way)" },
  zero_prefetch = { type = "boolean", help = "ZeRO-3 under ep: the next unit's gather starts "
    .. "ahead (default false: no faster on the 2-core shm measured; the same bits either way)" },
}

-- The moe table of model t, checked and with its defaults filled in; origin(key) as
-- schema.check's (loom.train checks again after command-line overrides: model.moe.*=).
local function check_moe(t, where, origin)
  local e = t.moe
  schema.check(e, moe_spec, origin and "model.moe" or "loom.gpt moe", where, origin)
  local m = { experts = e.experts, top_k = e.top_k or math.min(2, e.experts), every = e.every or 1,
    capacity_factor = e.capacity_factor or 1.25, aux_loss = e.aux_loss or 0.01,
    z_loss = e.z_loss or 0.001, router = e.router or "topk", noise_std = e.noise_std or 1.0,
    overlap = e.overlap == true, zero_prefetch = e.zero_prefetch == true }
  if m.top_k > m.experts then
    schema.fail(where, "loom.gpt moe top_k=%d is more than experts=%d (top_k may be 1 to %d)",
      m.top_k, m.experts, m.experts)
  end
  if m.every > t.layers then
    schema.fail(where, "loom.gpt moe every=%d is more than layers=%d: no block would be an MoE "
      .. "block (every may be 1 to %d)", m.every, t.layers, t.layers)
  end
  return m
end
loom._check_moe = check_moe

-- loom.gpt{init = "gpt2_124M.bin", ...}: the shape comes from the llm.c file where the
-- recipe leaves it out and must match where it gives it; loom.session loads the weights.
local function with_llmc_shape(t, where)
  local path = find_file(t.init, where, "llm.c model file")
  local ok, f = pcall(core.llmc_config, path)
  if not ok then schema.fail(where, "%s", f) end
  local m = {}
  for k, v in pairs(t) do m[k] = v end
  for _, k in ipairs { "vocab", "vocab_padded", "ctx", "layers", "heads", "dim" } do
    if m[k] == nil then
      m[k] = f[k]
    elseif m[k] ~= f[k] then
      schema.fail(where, "loom.gpt %s=%s differs from the llm.c model '%s' (%s=%d); leave it "
        .. "out to take the file's", k, tostring(m[k]), path, k, f[k])
    end
  end
  m.init = path
  return m
end

-- loom.gpt{vocab, ctx, layers, heads, dim [, vocab_padded] [, init]}: a GPT-2 model
-- description.
function loom.gpt(t)
  local where = schema.where()
  if type(t) == "table" and type(t.init) == "string" then t = with_llmc_shape(t, where) end
  schema.check(t, gpt_spec, "loom.gpt", where)
  if t.dim % t.heads ~= 0 then
    local ok = {}
    for h = 1, math.min(t.dim, 64) do if t.dim % h == 0 then ok[#ok + 1] = h end end
    schema.fail(where, "loom.gpt heads=%d does not divide dim=%d (heads may be %s)", t.heads,
      t.dim, table.concat(ok, ", "))
  end
  local m = { kind = "gpt" }
  for k, v in pairs(t) do m[k] = v end
  if t.moe and t.init then
    schema.fail(where, "loom.gpt init=\"%s\" with moe: an llm.c model file has dense blocks "
      .. "only (leave out init, or moe)", t.init)
  end
  if t.moe then m.moe = check_moe(t, where) end
  return m
end

local llama_spec = {
  vocab = { type = "integer", min = 2, required = true, help = "tokens in the vocabulary" },
  vocab_padded = { type = "integer", min = 2, help = "pad the embedding and head to this many rows" },
  ctx = { type = "integer", min = 1, required = true, help = "maximum sequence length" },
  layers = { type = "integer", min = 1, required = true },
  heads = { type = "integer", min = 1, required = true, help = "query heads" },
  kv_heads = { type = "integer", min = 1, help = "key/value heads (grouped-query attention); default heads" },
  dim = { type = "integer", min = 1, required = true, help = "model width C" },
  ffn_dim = { type = "integer", min = 1, help = "SwiGLU hidden width; default 4 x dim" },
  rope_theta = { type = "number", min = 1, help = "rotary base; default 10000" },
  norm_eps = { type = "number", min = 0, help = "RMSNorm epsilon; default 1e-5" },
  tie_embeddings = { type = "boolean", help = "LM head = token embedding (default false)" },
  moe = { type = "table", help = "mixture of SwiGLU experts (Mixtral's layout): as loom.gpt's moe" },
}

-- loom.llama{vocab, ctx, layers, heads, dim [, kv_heads, ffn_dim, rope_theta, norm_eps,
-- tie_embeddings, vocab_padded]}: Llama/Qwen-style blocks (RMSNorm, SwiGLU, rotary
-- positions, grouped-query attention, no biases) on the GPT model's machinery.
function loom.llama(t)
  local where = schema.where()
  schema.check(t, llama_spec, "loom.llama", where)
  local function divisors(n, limit)
    local ok = {}
    for h = 1, math.min(n, limit or n) do if n % h == 0 then ok[#ok + 1] = h end end
    return table.concat(ok, ", ")
  end
  if t.dim % t.heads ~= 0 then
    schema.fail(where, "loom.llama heads=%d does not divide dim=%d (heads may be %s)", t.heads,
      t.dim, divisors(t.dim, 64))
  end
  local kv = t.kv_heads or t.heads
  if t.heads % kv ~= 0 then
    schema.fail(where, "loom.llama kv_heads=%d does not divide heads=%d (kv_heads may be %s)", kv,
      t.heads, divisors(t.heads))
  end
  if (t.dim // t.heads) % 2 ~= 0 then
    schema.fail(where, "loom.llama head size dim/heads = %d must be even (rotary embeddings "
      .. "rotate pairs)", t.dim // t.heads)
  end
  local m = { kind = "gpt", family = "llama" }
  for k, v in pairs(t) do m[k] = v end
  m.kv_heads = kv
  m.ffn_dim = t.ffn_dim or 4 * t.dim
  if t.moe then m.moe = check_moe(t, where) end
  return m
end

loom.data = {}
local text_spec = {
  path = { type = "string", required = true, help = "a text file; its bytes are the tokens" },
  val_fraction = { type = "number", min = 0, max = 0.99, help = "tail of the file kept for validation" },
  shuffle = { type = "boolean", help = "train on windows at seeded random offsets instead of in order" },
  seed = { type = "integer", min = 0 },
}

-- loom.data.text{path, val_fraction=0.1, shuffle=false, seed=0}: a text file, bytes as
-- tokens (vocab 256). In order, batches are read as llm.c reads them; shuffled, each
-- sequence is a window at an offset keyed by (seed, window index).
function loom.data.text(t)
  schema.check(t, text_spec, "loom.data.text", schema.where())
  return { kind = "text", path = t.path, val_fraction = t.val_fraction or 0.1,
    shuffle = t.shuffle or false, seed = t.seed or 0 }
end

local shards_spec = {
  train = { type = "string", required = true, help = "a glob of llm.c token shards, e.g. "
    .. "\"data/train_*.bin\"" },
  val = { type = "string", help = "a glob of llm.c token shards for evaluation" },
  shuffle = { type = "boolean", help = "permute shards and their samples each epoch, seeded" },
  seed = { type = "integer", min = 0 },
}

-- loom.data.shards{train=GLOB, val=GLOB, shuffle=false, seed=0}: llm.c token shards (uint16
-- tokens after a 256-int32 header), read in llm.c's order.
function loom.data.shards(t)
  schema.check(t, shards_spec, "loom.data.shards", schema.where())
  return { kind = "shards", train = t.train, val = t.val, shuffle = t.shuffle or false,
    seed = t.seed or 0 }
end

-- loom.data.random{vocab, seed=0}: synthetic uniform tokens, for benchmarks and tests.
function loom.data.random(t)
  schema.check(t, { vocab = { type = "integer", min = 2, required = true },
    seed = { type = "integer", min = 0 } }, "loom.data.random", schema.where())
  return { kind = "random", vocab = t.vocab, seed = t.seed or 0 }
end

-- Open a data description made by loom.data.*.
function loom.open_data(d, where)
  where = where or schema.where()
  if type(d) ~= "table" or (d.kind ~= "text" and d.kind ~= "random" and d.kind ~= "shards") then
    schema.fail(where, "data must come from loom.data.text{...}, loom.data.shards{...} or "
      .. "loom.data.random{...}")
  end
  if d.kind == "random" then return core.random_data(d.vocab, d.seed) end
  local ok, data
  if d.kind == "shards" then
    ok, data = pcall(core.shard_data, find_glob(d.train), d.val and find_glob(d.val), d.shuffle,
      d.seed)
  else
    ok, data = pcall(core.text_data, find_file(d.path, where), d.val_fraction, d.shuffle, d.seed)
  end
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
  on_nonfinite = { type = "string", one_of = { "skip", "stop" } }, -- loom.train's "rollback" arrives as "skip"
  threads = { type = "integer", min = 0 },
  backend = { type = "string" },
  strategy = { type = "table", help = "{ name = \"dp\", ... } when dp > 1" },
  tensor = { type = "table", help = "{ name = \"tp\", sequence_parallel = false } when tp > 1" },
  canonical = { type = "boolean", help = "fixed-order reductions (deterministic = \"canonical\")" },
  schedule = { type = { "string", "table" }, help = "the sched plugin when the mesh has pp > 1, or every stage's list (lists[k]: stage k-1's, a Lua schedule's)" },
  schedule_name = { type = "string", help = "with schedule = lists: their name, for messages" },
  chunks = { type = "integer", min = 1, help = "virtual stages per rank (interleaved)" },
  pp_layers = { type = "table", help = "blocks per (virtual) stage; default: as even as possible" },
  recompute = { type = { "string", "table" }, help = "\"none\", \"full\", \"selective\" or a list of block indices (0-based) recomputed fully" },
  zero = { type = "integer", min = 0, help = "ZeRO stage over the dp group: 0 (none), 1, 2 or 3 (docs/ZERO.md)" },
  zero_bucket_mb = { type = "positive", help = "ZeRO bucket size in MiB (default 25)" },
  offload = { type = "table", help = "{ optimizer = \"host\" | \"disk\", path = DIR, chunk_mb = N } (docs/ZERO.md)" },
  compress = { type = "table", help = "{ \"onebit\" | \"topk\" | \"powersgd\", ratio = r, rank = r, warmup = n, bucket_mb = m } (docs/COMPRESS.md)" },
  teacher = { type = "table", help = "{ model = loom.gpt{ init = \"teacher.bin\" } | checkpoint = DIR, temperature = T, alpha = a, layers = { [s] = t }, hidden = beta, attention = true | gamma } (docs/DISTILL.md)" },
  ep = { type = "integer", min = 1, help = "expert parallelism: a MoE model's experts split over this many dp ranks (docs/MOE.md)" },
}

local teacher_spec = {
  model = { type = "table", help = "loom.gpt{ init = \"teacher.bin\", ... }: an llm.c file's weights" },
  checkpoint = { type = "string", help = "a loom checkpoint (step_N, or a directory with `latest`): its model and weights" },
  cache = { type = "string", help = "top-k logits written by loom distill-cache, read instead of running a teacher" },
  temperature = { type = "positive", help = "T of softmax(z / T) (default 1)" },
  alpha = { type = "number", min = 0, max = 1, help = "the weight of the distillation term (default 0.5)" },
  layers = { type = "table", help = "{ [student_block] = teacher_block, ... } (0-based, as h.N): hidden-state MSE through a learned projection (docs/DISTILL.md)" },
  hidden = { type = "number", min = 0, help = "the weight beta of the hidden-state terms (default 1)" },
  attention = { type = { "boolean", "number" }, min = 0, help = "true or a weight gamma: attention-probability MSE of each teacher.layers pair (TinyBERT; docs/DISTILL.md)" },
  pp = { type = "integer", help = "the teacher's pipeline split: 1 whole on the student's last stage (default); mesh.pp: its blocks over the student's stages (docs/DISTILL.md)" },
  tp = { type = "integer", help = "the teacher's tensor-parallel split: 1 replicated (default); mesh.tp: over the student's tp group; with mesh.tp = 1 a divisor of mesh.dp: over groups of that many dp ranks (docs/DISTILL.md)" },
}

-- teacher.layers -> { [s] = t } checked against both models' depths (0-based block indices).
local function check_teacher_layers(layers, student, teacher, where)
  local n = 0
  for s, t in pairs(layers) do
    if math.type(s) ~= "integer" or s < 0 or s >= student.layers then
      schema.fail(where, "teacher.layers: student block %s is not an integer in [0, %d) (the "
        .. "student's blocks h.0 .. h.%d)", tostring(s), student.layers, student.layers - 1)
    end
    if math.type(t) ~= "integer" or t < 0 or t >= teacher.layers then
      schema.fail(where, "teacher.layers[%d] = %s: the teacher block is not an integer in [0, %d)",
        s, tostring(t), teacher.layers)
    end
    n = n + 1
  end
  if n == 0 then schema.fail(where, "teacher.layers is empty: map at least one student block, e.g. { [0] = 1 }") end
  if student.layers > 64 then schema.fail(where, "teacher.layers: a student of more than 64 blocks is not built yet") end
end

-- teacher (docs/DISTILL.md) -> the session's teacher keys; the model's shape from the
-- llm.c file (loom.gpt{init}) or from the checkpoint's manifest.
local checkpoint_model -- below: a teacher checkpoint's manifest model

local function resolve_teacher(t, where, student)
  schema.check(t, teacher_spec, "teacher", where)
  if t.attention and not t.layers then
    schema.fail(where, "teacher.attention compares the attention probabilities of the block "
      .. "pairs teacher.layers maps: give teacher.layers = { [student_block] = teacher_block } too")
  end
  if t.hidden and not t.layers then
    schema.fail(where, "teacher.hidden weighs the hidden-state terms: give teacher.layers = { [student_block] = teacher_block } too")
  end
  if t.layers and t.cache then
    schema.fail(where, "teacher.layers needs the teacher's hidden states, which a cache (loom "
      .. "distill-cache: logits only) does not hold; use teacher.model or teacher.checkpoint")
  end
  local given = (t.model and 1 or 0) + (t.checkpoint and 1 or 0) + (t.cache and 1 or 0)
  if given ~= 1 then
    schema.fail(where, "teacher needs one of model = loom.gpt{ init = \"teacher.bin\" }, "
      .. "checkpoint = \"DIR\" (a loom checkpoint) or cache = \"FILE\" (loom distill-cache)%s",
      given > 1 and " (it has more than one)" or "")
  end
  local out = { kd_temperature = t.temperature or 1.0, kd_alpha = t.alpha or 0.5, kd_teacher_tp = t.tp,
    kd_teacher_pp = t.pp }
  if t.tp ~= nil and (math.type(t.tp) ~= "integer" or t.tp < 1) then
    schema.fail(where, "teacher.tp = %s: the teacher's tensor-parallel split is an integer >= 1 "
      .. "(1: replicated on every rank; mesh.tp: over the student's tp group; with mesh.tp = 1 a "
      .. "divisor of mesh.dp: over groups of that many dp ranks)", tostring(t.tp))
  end
  if t.pp ~= nil and (math.type(t.pp) ~= "integer" or t.pp < 1) then
    schema.fail(where, "teacher.pp = %s: the teacher's pipeline split is an integer >= 1 (1: "
      .. "whole on the student's last stage; mesh.pp: over the student's stages)", tostring(t.pp))
  end
  if t.cache then
    out.kd_cache = t.cache
    return out
  end
  if t.model then
    if not t.model.init then
      schema.fail(where, "teacher.model needs weights: loom.gpt{ init = \"teacher.bin\" } (an "
        .. "llm.c file), or give teacher.checkpoint instead")
    end
    out.teacher, out.teacher_init = t.model, t.model.init
  else
    out.teacher, out.teacher_checkpoint = checkpoint_model(t.checkpoint, where)
  end
  if t.layers then
    check_teacher_layers(t.layers, student, out.teacher, where)
    out.kd_layers, out.kd_hidden = t.layers, t.hidden or 1.0
    if t.attention then
      local sh, th = student.heads or 12, out.teacher.heads
      if sh ~= th then
        schema.fail(where, "teacher.attention needs the teacher's head count: the student has "
          .. "%s heads, the teacher %s (each head's probabilities are compared)", tostring(sh), tostring(th))
      end
      out.kd_attention = t.attention == true and 1.0 or t.attention
    end
  end
  return out
end

-- (loom plan sizes the teacher from the same keys the session is given: plan.lua)
loom.resolve_teacher = resolve_teacher

-- teacher.checkpoint -> its manifest's model and the step directory.
function checkpoint_model(dir, where)
  local f = io.open(dir .. "/manifest.json", "rb")
  if not f then
    local found, why = core.find_checkpoint(dir)
    if not found then schema.fail(where, "teacher.checkpoint: %s", why) end
    dir = found
    f = assert(io.open(dir .. "/manifest.json", "rb"))
  end
  local text = f:read("a")
  f:close()
  local ok, man = pcall(require("loom.json").decode, text)
  if not ok or type(man) ~= "table" or type(man.model) ~= "table" then
    schema.fail(where, "teacher.checkpoint '%s': manifest.json has no model object", dir)
  end
  return man.model, dir
end

local compress_spec = {
  [1] = { type = "string", required = true, one_of = { "onebit", "topk", "powersgd" },
    help = "the method: onebit (sign + scale per bucket), topk (largest |g| per bucket) or powersgd (rank-r per matrix)" },
  ratio = { type = "positive", help = "topk: the fraction of each bucket sent (default 0.01)" },
  warmup = { type = "integer", min = 0, help = "steps exchanged uncompressed first (default 0)" },
  bucket_mb = { type = "positive", help = "the largest bucket in MiB of fp32 (default 4)" },
  rank = { type = "integer", min = 1, max = 1024, help = "powersgd: the rank r of each matrix's approximation (default 2)" },
  momentum = { type = "boolean", help = "1-bit Adam: exchange adamw's momentum, its variance frozen after warmup (default false)" },
}

-- strategy.compress (docs/COMPRESS.md): checked here so that a bad value names the key.
local function check_compress(c, where)
  schema.check(c, compress_spec, "strategy.compress", where)
  if c[1] ~= "topk" and c.ratio then
    schema.fail(where, "strategy.compress.ratio is for \"topk\"; \"%s\" has no ratio", c[1])
  end
  if c[1] ~= "powersgd" and c.rank then
    schema.fail(where, "strategy.compress.rank is for \"powersgd\"; \"%s\" has no rank", c[1])
  end
  if c[1] == "powersgd" and c.bucket_mb then
    schema.fail(where, "strategy.compress.bucket_mb is for \"onebit\" and \"topk\"; powersgd "
      .. "approximates each tensor whole")
  end
  if c.ratio and c.ratio > 1 then
    schema.fail(where, "strategy.compress.ratio=%g must be at most 1 (a fraction of each bucket)", c.ratio)
  end
end

-- recompute = "none" | "full" | "selective" | { block indices }: checked against the
-- model's blocks here, so the C side only sees a valid mode.
local function check_recompute(r, layers, where)
  if r == nil or type(r) == "string" then
    if r ~= nil and r ~= "none" and r ~= "full" and r ~= "selective" then
      schema.fail(where, "recompute=%q is not a mode: use \"none\", \"full\", \"selective\" or "
        .. "a list of block indices such as { 0, 2 }", r)
    end
    return
  end
  local seen = {}
  for k, l in pairs(r) do
    if math.type(k) ~= "integer" or k < 1 or k > #r then
      schema.fail(where, "recompute must be a list of block indices such as { 0, 2 }, got key %s", tostring(k))
    end
    if math.type(l) ~= "integer" or l < 0 or l >= layers then
      schema.fail(where, "recompute[%d]=%s is not a block index: the model's blocks are 0..%d",
        k, tostring(l), layers - 1)
    end
    if seen[l] then schema.fail(where, "recompute lists block %d twice", l) end
    seen[l] = true
  end
end

local offload_spec = {
  optimizer = { type = "string", required = true, one_of = { "host", "disk" },
    help = "where the optimizer state lives: a host pool, or a file per rank under path" },
  path = { type = "string", help = "disk: an existing writable directory" },
  chunk_mb = { type = "positive", help = "state streamed per chunk in MiB (default 64)" },
  params = { type = "boolean", help = "zero = 3's parameter partition offloaded too (docs/ZERO.md)" },
}

-- strategy.offload (docs/ZERO.md "Offload"): checked here so that a bad value names the key.
local function check_offload(o, where)
  schema.check(o, offload_spec, "strategy.offload", where)
  if o.optimizer == "disk" and not o.path then
    schema.fail(where, "strategy.offload.optimizer = \"disk\" needs path = \"DIR\" (a writable "
      .. "directory for the state files)")
  end
  if o.optimizer == "host" and o.path then
    schema.fail(where, "strategy.offload.path is for optimizer = \"disk\"; the host pool has no path")
  end
  if o.chunk_mb and o.chunk_mb > 4096 then
    schema.fail(where, "strategy.offload.chunk_mb=%g must be at most 4096", o.chunk_mb)
  end
end
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
  check_recompute(t.recompute, t.model.layers, where)
  local cfg = {
    model = t.model, micro = t.batch.micro, seq = t.batch.seq, accum = t.batch.accum or 1,
    seed = t.seed or 1337, grad_clip = t.grad_clip or 1.0, threads = t.threads or 0,
    on_nonfinite = t.on_nonfinite or "skip",
    backend = t.backend or "cpu",
    optimizer = loom.plugin_table(t.optimizer, "optimizer", where),
    precision = loom.plugin_table(t.precision or "fp32", "precision", where),
    strategy = t.strategy, tensor = t.tensor, canonical = t.canonical or false,
    schedule = t.schedule, schedule_name = t.schedule_name, chunks = t.chunks, pp_layers = t.pp_layers,
    zero = t.zero, zero_bucket_mb = t.zero_bucket_mb, recompute = t.recompute, ep = t.ep,
  }
  if t.offload then
    check_offload(t.offload, where)
    cfg.offload, cfg.offload_path, cfg.offload_chunk_mb = t.offload.optimizer, t.offload.path,
      t.offload.chunk_mb
    cfg.offload_params = t.offload.params
  end
  if t.compress then
    check_compress(t.compress, where)
    cfg.compress, cfg.compress_ratio, cfg.compress_warmup, cfg.compress_bucket_mb, cfg.compress_rank =
      t.compress[1], t.compress.ratio, t.compress.warmup, t.compress.bucket_mb, t.compress.rank
    cfg.compress_momentum = t.compress.momentum
  end
  if t.teacher then
    for k, v in pairs(resolve_teacher(t.teacher, where, t.model)) do cfg[k] = v end
  end
  local ok, s = pcall(core.session, cfg)
  if not ok then schema.fail(where, "%s", s) end
  if t.model.init then -- loom.gpt{init = ...}: start from the llm.c file's weights
    local loaded, err = pcall(core.llmc_load, s, t.model.init)
    if not loaded then s:close(); schema.fail(where, "%s", err) end
  end
  return s
end

-- loom.sample{session, prompt, tokens=200, temperature=1, top_k=0, seed=0, tokenizer=,
-- cache=true, progress=} -> text. A byte-level model (vocab 256) takes and returns bytes;
-- with a GPT-2 tokenizer (loom.bpe: a directory holding encoder.json and vocab.bpe, as
-- prepare-text --gpt2 leaves beside the shards, or what loom.tokenizer returned) a text
-- prompt is encoded and the tokens decoded to text; otherwise prompt and result are token
-- ids. cache = false recomputes the whole window for every token (the same tokens, slower).
-- Past ctx the window slides by one token (window = "slide": each token a full forward
-- over ctx rows) or, with window = "shift", restarts at the last ctx/2 tokens and grows
-- again, so the cache keeps working (other samples; fewer tokens of context at times).
-- progress: function(done, total) called after each token. logits_hash = true: a second
-- result, the XXH64 (hex) of every logits row drawn from (tests compare paths by it).
local sample_spec = {
  session = { type = "userdata", required = true, help = "what loom.train or loom.session returned" },
  prompt = { type = { "string", "table" }, required = true },
  tokens = { type = "integer", min = 0 },
  temperature = { type = "positive" },
  top_k = { type = "integer", min = 0 },
  seed = { type = "integer", min = 0 },
  tokenizer = { type = { "string", "table" }, help = "a GPT-2 tokenizer directory or loom.tokenizer(...)" },
  cache = { type = "boolean", help = "use the key/value cache (default true)" },
  progress = { type = "function", help = "function(done, total) after each token" },
  logits_hash = { type = "boolean", help = "also return the XXH64 (hex) of the logits drawn from" },
  window = { type = "string", help = "past ctx: \"slide\" (by one token, default) or \"shift\" "
    .. "(restart at the last ctx/2 tokens: the cache keeps working)" },
}

-- loom.tokenizer(path) -> the GPT-2 tokenizer (loom.bpe) in path (a directory or its
-- encoder.json), or nil and why. Loaded once per path.
local tokenizers = {}
function loom.tokenizer(path)
  if tokenizers[path] then return tokenizers[path] end
  local tok, why = require("loom.bpe").load(path)
  tokenizers[path] = tok
  return tok, why
end

-- The tokenizer directory of a loom.data description: the shards' directory when it holds
-- encoder.json (prepare-text --gpt2 keeps it there), else nil.
function loom.tokenizer_dir(data)
  if type(data) ~= "table" or data.kind ~= "shards" or type(data.train) ~= "string" then return nil end
  local dir = find_glob(data.train):match("^(.*)/[^/]*$") or "." -- relative to the recipe, as the shards
  local f = io.open(dir .. "/encoder.json", "rb")
  if not f then return nil end
  f:close()
  return dir
end

function loom.sample(t)
  local where = schema.where()
  schema.check(t, sample_spec, "loom.sample", where)
  local tok = t.tokenizer
  if type(tok) == "string" then
    local why
    tok, why = loom.tokenizer(tok)
    if not tok then schema.fail(where, "%s", why) end
  end
  local prompt = t.prompt
  if tok and type(prompt) == "string" then
    local ok, ids = pcall(tok.encode, tok, prompt)
    if not ok then schema.fail(where, "%s", ids) end
    prompt = ids
  end
  if t.window ~= nil and t.window ~= "slide" and t.window ~= "shift" then
    schema.fail(where, "loom.sample: window = %q; use \"slide\" or \"shift\"", t.window)
  end
  local opts = { cache = t.cache ~= false, progress = t.progress, logits_hash = t.logits_hash,
    shift_window = t.window == "shift" }
  local ok, out, hash = pcall(t.session.sample, t.session, prompt, t.tokens or 200,
    t.temperature or 1.0, t.top_k or 0, t.seed or 0, opts)
  if not ok then schema.fail(where, "%s", out) end
  if tok then out = tok:decode(out) end
  return out, hash
end

-- The command line's key=value overrides, as a list of pairs in command-line order:
-- `loom run r.lua steps=20 batch.micro=8` gives { {"steps", "20"}, {"batch.micro", "8"} }
-- (the values are the text as typed; overrides.parse turns one into a number, boolean,
-- table or string). loom.train applies them itself; a recipe with its own loop calls
-- loom.options{...} (checked) or reads this list. If nothing asks for them, `loom run`
-- warns at the end that they were never read.
function loom.overrides()
  return core.overrides or {} -- (reading core.overrides marks them read: core/lua/cli.c)
end

-- loom.options{ key = default, ... } -> the table with the command line's key=value
-- applied: for recipes with their own loop. A key not in the defaults is refused (naming
-- the accepted ones), a value of another type than its default's too; a default of
-- false/0/"" still fixes the type. Dotted keys are not nested here.
function loom.options(defaults)
  local where = schema.where()
  local out = {}
  for k, v in pairs(defaults) do out[k] = v end
  local names = {}
  for k in pairs(defaults) do names[#names + 1] = tostring(k) end
  table.sort(names)
  local parse = require("loom.overrides").parse
  for _, kv in ipairs(loom.overrides()) do
    local key, text = kv[1], kv[2]
    if defaults[key] == nil then
      schema.fail(where, "unknown option '%s' (from the command line: %s=%s) (accepted: %s)", key,
        key, text, table.concat(names, ", "))
    end
    local ok, v = pcall(parse, text)
    if not ok then schema.fail(where, "%s", v) end
    if type(defaults[key]) == "string" then v = text end -- "007" stays a string
    if type(v) ~= type(defaults[key]) then
      schema.fail(where, "option %s=%s (from the command line) must be a %s, like its default %s",
        key, text, type(defaults[key]), tostring(defaults[key]))
    end
    out[key] = v
  end
  return out
end

loom.train = require("loom.train")(loom)
-- loom.plan{recipe table as loom.train takes it [, machine = NAME], [world =, devices_per_node
-- =, mem =]} -> the plan's table (docs/PLAN.md): one layout's memory and time, or with world
-- the ranked layouts that fit.
function loom.plan(t) return require("loom.plan_cli").api(t) end

return loom
