-- loom.train — the declarative recipe: check everything, build a session, run the loop,
-- evaluate and sample on schedule, print a progress line per step.
--
-- The loop reads top to bottom: lr for the step, one optimizer step over `accum`
-- micro-batches (done in C), the progress line, hooks, eval and samples when due.
local schema = require "loom.schema"
local overrides = require "loom.overrides"
local lrmod = require "loom.lr"
local json = require "loom.json"
local metrics = require "loom.metrics"
local guard = require "loom.guard"
local preflight = require "loom.preflight"

local spec = {
  model = { type = "table", required = true, help = "loom.gpt{...}" },
  data = { type = "table", required = true, help = "loom.data.text{...}, loom.data.shards{...} or loom.data.random{...}" },
  optimizer = { type = { "string", "table" }, required = true, help = "{ \"adamw\", lr = 3e-4 }" },
  precision = { type = { "string", "table" }, help = "\"fp32\"" },
  lr = { type = { "number", "table", "function" }, help = "a number, loom.lr.cosine{...} or function(step)" },
  batch = { type = "table", required = true, help = "{ micro = B, seq = T, global = G }" },
  steps = { type = "integer", min = 0, required = true },
  seed = { type = "integer", min = 0 },
  grad_clip = { type = "number", min = 0, help = "clip the global grad norm; 0 turns it off" },
  on_nonfinite = { type = "string", one_of = { "skip", "stop", "rollback" },
    help = "a step with an inf or nan loss or gradient: \"skip\" its update on every rank (default), \"stop\" the run or \"rollback\" to the last good checkpoint" },
  on_spike = { type = "string", one_of = guard.policies,
    help = "a loss spike (z-score of loss or grad norm over spike.window steps above spike.threshold): \"warn\", \"skip\" its update, \"rollback\" to the last good checkpoint skipping the data since, or \"stop\" (default: not watched)" },
  spike = { type = "table", help = "{ window = 100, threshold = 6, max_rollbacks = 3 } for on_spike (and rollbacks of on_nonfinite)" },
  max_skipped = { type = "integer", min = 0, help = "this many skipped steps in a row (non-finite or spikes) stop the run as diverged (default 50; 0: never)" },
  threads = { type = "integer", min = 0, help = "compute threads, 0 = all cores" },
  backend = { type = "string" },
  mesh = { type = "table", help = "{ dp = 1, tp = 1, pp = 1 }" },
  comm = { type = "string", help = "communicator plugin for multi-rank runs (default \"shm\")" },
  host_comm = { type = "string", help = "beside comm = \"nccl\" (device memory only): the communicator for host buffers, \"shm\" (default, one node) or \"mpi\"" },
  device_wait = { type = "boolean", help = "beside comm = \"nccl\": a wait makes the backend's stream wait on the collective instead of blocking the host (compute and communication overlap on the device; a stuck peer then shows at the backend's next synchronize, with no timeout). Default false" },
  comm_timeout = { type = "positive", help = "seconds any communication may wait before the run fails (default 60)" },
  debug_desync = { type = "boolean", help = "check before every collective that all ranks of its group issue the same one (op, bytes, sequence number); stops at the first mismatch naming both ranks (slower: for debugging; also LOOM_DEBUG_DESYNC=1)" },
  strategy = { type = "table" },
  schedule = { type = { "string", "function" }, help = "with mesh.pp > 1: the sched plugin, \"1f1b\" (default), \"gpipe\", \"interleaved\" or \"zb1\"; or a Lua schedule: a file \"sched.lua\" returning function(shape) -> list, or that function" },
  microbatches = { type = "integer", min = 1, help = "with mesh.pp > 1: micro-batches per step through the pipeline" },
  pp_chunks = { type = "integer", min = 1, help = "with schedule = \"interleaved\": virtual stages per rank (default 2); with a Lua schedule: shape.chunks (default 1)" },
  pp_layers = { type = "table", help = "with mesh.pp > 1: blocks per stage (per virtual stage with interleaving), e.g. { 3, 5 }" },
  deterministic = { type = "string", one_of = { "fast", "canonical" } },
  recompute = { type = { "string", "table" }, help = "activation recomputation: \"none\" (default), \"full\", \"selective\" or a list of block indices (0-based) recomputed fully" },
  tp_sequence_parallel = { type = "boolean", help = "with mesh.tp > 1: shard layernorms and residuals over the sequence" },
  eval = { type = "table", help = "{ every = N, batches = M }" },
  sample = { type = "table", help = "{ every = N, prompt = \"...\", tokens = 200 }" },
  log = { type = "table", help = "{ every = N, jsonl = \"run/metrics.jsonl\", trace = \"run/trace\" }" },
  peak_flops = { type = "positive", help = "the device's peak FLOP/s, for MFU" },
  on_step = { type = "function" },
  checkpoint = { type = "table", help = "{ dir = \"ckpt\", every = N, keep = K }" },
  resume = { type = { "string", "boolean" }, help = "\"auto\" (newest checkpoint in checkpoint.dir) or a checkpoint path" },
  name = { type = "string" },
  teacher = { type = "table", help = "distillation: { model = loom.gpt{ init = \"teacher.bin\" } | checkpoint = DIR | cache = FILE, temperature = T, alpha = a, layers = { [student_block] = teacher_block }, hidden = beta, tp = 1 | mesh.tp | a divisor of mesh.dp } (docs/DISTILL.md)" },
}
local batch_spec = {
  micro = { type = "integer", min = 1, required = true, help = "sequences per micro-batch (B)" },
  seq = { type = "integer", min = 1, required = true, help = "tokens per sequence (T)" },
  global = { type = "integer", min = 1, help = "sequences per optimizer step = micro x accum x dp" },
}
local mesh_spec = {
  dp = { type = "integer", min = 1 }, tp = { type = "integer", min = 1 }, pp = { type = "integer", min = 1 },
  ep = { type = "integer", min = 1, help = "expert parallelism (mixture of experts): not built yet, 1 only" },
}
local eval_spec = { every = { type = "integer", min = 1, required = true }, batches = { type = "integer", min = 1 } }
local sample_spec = {
  every = { type = "integer", min = 1 }, prompt = { type = "string" }, tokens = { type = "integer", min = 1 },
  temperature = { type = "positive" }, top_k = { type = "integer", min = 0 }, seed = { type = "integer", min = 0 },
}
local log_spec = {
  every = { type = "integer", min = 1 }, jsonl = { type = "string" },
  trace = { type = "string", help = "a directory: one Chrome trace per rank, rank0.json, ..." },
  trace_steps = { type = "integer", min = 1, help = "with log.trace: trace this many steps from the first (default: all)" },
}
local spike_spec = {
  window = { type = "integer", min = 2, help = "earlier steps the z-score is measured against (default 100)" },
  threshold = { type = "positive", help = "z-score above which a step is a spike (default 6)" },
  max_rollbacks = { type = "integer", min = 1, help = "rollbacks before the run stops (default 3)" },
}
local checkpoint_spec = {
  dir = { type = "string", required = true }, every = { type = "integer", min = 1 },
  keep = { type = "integer", min = 0, help = "checkpoints kept, newest first; 0 keeps all" },
}

-- The leaves of a decoded recipe as "a.b.c" -> value text, for comparing two recipes.
local function leaves(v, prefix, out)
  out = out or {}
  if type(v) == "table" then
    for k, x in pairs(v) do leaves(x, prefix and (prefix .. "." .. tostring(k)) or tostring(k), out) end
  elseif prefix then
    out[prefix] = tostring(v)
  end
  return out
end

-- The keys whose values differ between the recipe a checkpoint was saved with and this
-- one, as "steps 20 -> 40" ("resume" itself left out), sorted; empty when they agree.
local function recipe_changes(saved_json, now_json)
  local ok, saved = pcall(json.decode, saved_json or "null")
  if not ok or type(saved) ~= "table" then return {} end
  local a, b = leaves(saved), leaves(json.decode(now_json))
  local keys, seen = {}, {}
  for k in pairs(a) do if not seen[k] then seen[k] = true; keys[#keys + 1] = k end end
  for k in pairs(b) do if not seen[k] then seen[k] = true; keys[#keys + 1] = k end end
  table.sort(keys)
  local out = {}
  for _, k in ipairs(keys) do
    if a[k] ~= b[k] and k ~= "resume" and not k:match("^resume%.") then
      out[#out + 1] = string.format("%s %s -> %s", k, a[k] or "(unset)", b[k] or "(unset)")
    end
  end
  return out
end

-- The run's measured bubble: the mean over its steps after the first (which carries the
-- one-time start-up costs), or the one step's.
local function bubble_summary(b)
  if #b == 1 then return b[1] end
  local sum = 0
  for i = 2, #b do sum = sum + b[i] end
  return sum / (#b - 1)
end

local function human(n)
  if n >= 1e9 then return string.format("%.2fB", n / 1e9) end
  if n >= 1e6 then return string.format("%.2fM", n / 1e6) end
  if n >= 1e3 then return string.format("%.1fK", n / 1e3) end
  return tostring(n)
end

-- Accumulation steps from batch.global, or 1.
local function accumulation(b, dp, where, origin)
  if not b.global then return 1 end
  local per = b.micro * dp
  if b.global % per ~= 0 then
    local lo = b.global // per * per
    schema.fail(where, "batch.global=%d%s is not a multiple of micro x dp = %d (try %d or %d)",
      b.global, origin("batch.global") or "", per, math.max(lo, per), lo + per)
  end
  return b.global // per
end

-- The values in 1..limit that divide every number given, as "1, 2, 4".
local function divisors(limit, ...)
  local out = {}
  for d = 1, limit do
    local all = true
    for _, n in ipairs({ ... }) do if n % d ~= 0 then all = false end end
    if all then out[#out + 1] = tostring(d) end
  end
  return table.concat(out, ", ")
end

-- Tensor parallelism splits heads, the MLP width and the vocabulary rows; sequence
-- parallelism the token rows; canonical mode sums in 8 fixed chunks (gpt.h).
local function check_tp(t, where, origin)
  local mesh = t.mesh or {}
  local tp, m = mesh.tp or 1, t.model
  local vp = m.vocab_padded or (m.vocab + 127) // 128 * 128
  local rows = t.batch.micro * t.batch.seq
  local function need(n, what)
    if n % tp ~= 0 then
      local ok = m.family == "llama" and divisors(64, m.heads, m.kv_heads, m.ffn_dim, vp)
        or divisors(64, m.heads, vp)
      schema.fail(where, "mesh tp=%d%s does not divide %s=%d (tp may be %s)", tp,
        origin("mesh.tp") or "", what, n, ok)
    end
  end
  need(m.heads, "heads") -- loom.gpt has checked heads | dim: so tp also divides dim and 4 x dim
  if m.family == "llama" then -- each rank holds whole key/value heads
    need(m.kv_heads, "kv_heads")
    need(m.ffn_dim, "ffn_dim")
  end
  need(vp, "the padded vocabulary")
  if t.tp_sequence_parallel and tp > 1 and rows % tp ~= 0 then
    schema.fail(where, "tp_sequence_parallel splits batch.micro x batch.seq = %d token rows over "
      .. "tp=%d ranks: they must divide (tp may be %s)", rows, tp, divisors(64, rows, m.heads))
  end
  if t.deterministic == "canonical" then
    local chunks = 8
    if chunks % tp ~= 0 then
      schema.fail(where, "deterministic=\"canonical\" sums in %d fixed chunks: mesh tp=%d must "
        .. "divide %d (tp may be 1, 2, 4 or 8)", chunks, tp, chunks)
    end
    for _, v in ipairs({ { m.dim, "model dim" }, { vp, "the padded vocabulary" },
                         { rows, "batch.micro x batch.seq" } }) do
      if v[1] % chunks ~= 0 then
        schema.fail(where, "deterministic=\"canonical\" sums in %d fixed chunks: %s=%d must be a "
          .. "multiple of %d", chunks, v[2], v[1], chunks)
      end
    end
  end
end

-- Pipeline parallelism: the keys that only make sense with mesh.pp > 1, what it does not
-- combine with yet, the stage split and the schedule plugin's own shape rules (check()).
local function check_pp(t, where, origin)
  local mesh = t.mesh or {}
  local pp = mesh.pp or 1
  if pp == 1 then
    for _, k in ipairs { "schedule", "microbatches", "pp_chunks", "pp_layers" } do
      if t[k] ~= nil then
        schema.fail(where, "%s=%s%s sets up the pipeline, and this run has no pipeline (mesh.pp = 1): "
          .. "leave it out (gradient accumulation is batch.global) or set mesh.pp > 1", k,
          type(t[k]) == "table" and "{...}" or tostring(t[k]), origin(k) or "")
      end
    end
    return
  end
  local function refuse(cond, fmt, ...)
    if cond then schema.fail(where, "mesh pp=%d: " .. fmt, pp, ...) end
  end
  local name = t.schedule or "1f1b"
  refuse(t.tp_sequence_parallel and (mesh.tp or 1) > 1 and name == "zb1", "tp_sequence_parallel "
    .. "with schedule = \"zb1\": the split backward does not run under sequence parallelism yet; "
    .. "use gpipe, 1f1b or interleaved, or leave tp_sequence_parallel out")
  local dp = mesh.dp or 1
  local b = t.batch
  local m = t.microbatches
  if m and b.global and b.global ~= b.micro * m * dp then
    schema.fail(where, "batch.global=%d%s but batch.micro x microbatches x dp = %d x %d x %d = %d: "
      .. "give one of them, or make them agree", b.global, origin("batch.global") or "", b.micro, m,
      dp, b.micro * m * dp)
  end
  local chunks = t.pp_chunks or (name == "interleaved" and 2 or 1)
  local lua = require("loom.schedule").is_lua(name) -- a Lua schedule's lists say their chunks
  refuse(chunks > 1 and name ~= "interleaved" and not lua, "pp_chunks=%d%s: only schedule = "
    .. "\"interleaved\" or a Lua schedule runs virtual stages (schedule is \"%s\")", chunks,
    origin("pp_chunks") or "", name)
  local stages, layers = pp * chunks, t.model.layers
  if t.pp_layers then
    local n, sum = #t.pp_layers, 0
    if n ~= stages then
      schema.fail(where, "pp_layers has %d entries; it needs one per %s (%d)", n,
        chunks > 1 and string.format("virtual stage, pp x pp_chunks = %d x %d", pp, chunks)
          or string.format("stage, pp = %d", pp), stages)
    end
    for i, v in ipairs(t.pp_layers) do
      if math.type(v) ~= "integer" or v < 1 then
        schema.fail(where, "pp_layers[%d] = %s: every stage needs a whole number of blocks, at least 1",
          i, tostring(v))
      end
      sum = sum + v
    end
    if sum ~= layers then
      schema.fail(where, "pp_layers adds up to %d blocks, but the model has layers=%d", sum, layers)
    end
  elseif layers < stages then
    schema.fail(where, "mesh pp=%d%s: the model's layers=%d cannot give each of the %d pipeline "
      .. "stages a block (use pp <= %d%s)", pp, chunks > 1 and string.format(" x pp_chunks=%d", chunks)
      or "", layers, stages, layers // chunks, chunks > 1 and " or fewer chunks" or "")
  end
  return name, chunks
end

-- This rank's bytes by category, the start-up line (docs/ZERO.md has the formulas).
local function memory_line(info, zero, dp)
  local mem = info.memory
  local function mib(b) return string.format("%.2f MiB", b / (1 << 20)) end
  local note = ""
  if zero > 0 and info.zero == 0 then note = string.format(" (zero=%d has nothing to partition with dp=%d)", zero, dp) end
  if (mem.widen or 0) > 0 then -- 16-bit weights: the fp32 scratch they are widened into
    note = string.format(" | widen scratch %s", mib(mem.widen)) .. note
  end
  if (mem.teacher_params or 0) > 0 then -- distillation: the teacher's, beside the student's
    -- (a frozen teacher has no gradient buffer: named only where one is held)
    local grads = (mem.teacher_grads or 0) > 0 and string.format(", grads buffer %s", mib(mem.teacher_grads)) or ""
    note = string.format(" | teacher params %s%s, activations %s", mib(mem.teacher_params), grads,
      mib(mem.teacher_activations)) .. note
  end
  if (mem.distill or 0) > 0 then -- the distillation terms' own buffers (session.c)
    note = string.format(" | distillation buffers %s", mib(mem.distill)) .. note
  end
  if info.offload ~= "none" then
    note = string.format(" | optimizer offloaded (%s) %s", info.offload, mib(mem.optimizer_offloaded))
      .. ((mem.params_offloaded or 0) > 0 and string.format(" | params offloaded %s", mib(mem.params_offloaded)) or "")
      .. note
  end
  return string.format("memory/rank%s: params %s | grads %s | optimizer %s | master %s | "
    .. "activations %s | comm buffers %s%s", info.zero > 0 and string.format(" (zero=%d over dp=%d)", info.zero, dp) or "",
    mib(mem.params), mib(mem.grads), mib(mem.optimizer), mib(mem.master), mib(mem.activations),
    mib(mem.comm), note)
end

-- strategy = { zero = 0 | 1 | 2 | 3, dp = { bucket_mb = ... } } (docs/ZERO.md): ZeRO's buckets
-- are dp's bucket_mb. What is not built is refused here, before any rank starts.
local function check_zero(t, where, origin)
  local st = t.strategy or {}
  for k in pairs(st) do
    if k ~= "dp" and k ~= "zero" and k ~= "offload" and k ~= "compress" then
      schema.fail(where, "strategy.%s is not available in this build (accepted: zero = 0, 1, 2 or 3; "
        .. "dp = { bucket_mb = ... }; offload = { optimizer = ... }; compress = { \"onebit\" | "
        .. "\"topk\" | \"powersgd\", ... })", tostring(k))
    end
  end
  local z = st.zero
  if z == nil then return end
  if math.type(z) ~= "integer" or z < 0 or z > 3 then
    schema.fail(where, "strategy.zero=%s%s must be 0, 1, 2 or 3 (the ZeRO stage)", tostring(z),
      origin("strategy.zero") or "")
  end
  if z == 3 and t.model.init then
    schema.fail(where, "strategy.zero=3 with model.init (llm.c weights) is not built yet: the "
      .. "weights would have to be loaded into each rank's partition; use zero = 1 or 2")
  end
end

local function check(t, where, origin, world)
  schema.check(t, spec, "", where, origin)
  schema.check(t.batch, batch_spec, "batch", where, origin)
  local mesh = t.mesh or {}
  schema.check(mesh, mesh_spec, "mesh", where, origin)
  local ep = mesh.ep or 1
  if ep > 1 then -- docs/MOE.md: what expert parallelism composes with
    local dp, moe = mesh.dp or 1, type(t.model) == "table" and t.model.moe
    if dp % ep ~= 0 then
      schema.fail(where, "mesh ep=%d%s must divide dp=%d: experts are split over ep of the dp "
        .. "ranks", ep, origin("mesh.ep") or "", dp)
    end
    if not moe then
      schema.fail(where, "mesh ep=%d%s splits a mixture of experts, and the model has none "
        .. "(loom.gpt{moe = {...}})", ep, origin("mesh.ep") or "")
    end
    if moe.experts % ep ~= 0 then
      schema.fail(where, "mesh ep=%d%s must divide model.moe.experts=%d", ep, origin("mesh.ep") or "",
        moe.experts)
    end
    -- strategy.compress under ep: fast mode (docs/COMPRESS.md); the session refuses canonical
    -- mode, ZeRO-2/3 and 1-bit Adam with it, naming them
  end
  check_pp(t, where, origin)
  check_zero(t, where, origin)
  if t.eval then schema.check(t.eval, eval_spec, "eval", where, origin) end
  if t.sample then schema.check(t.sample, sample_spec, "sample", where, origin) end
  if t.log then
    schema.check(t.log, log_spec, "log", where, origin)
    if t.log.trace == "" then
      schema.fail(where, "log.trace%s is empty: give the directory the per-rank traces go to "
        .. "(log = { trace = \"run/trace\" })", origin("log.trace") or "")
    end
    if t.log.trace_steps and not t.log.trace then
      schema.fail(where, "log.trace_steps=%d%s bounds a trace, and log.trace is not set: add "
        .. "log.trace = \"run/trace\" or leave trace_steps out", t.log.trace_steps,
        origin("log.trace_steps") or "")
    end
  end
  if t.checkpoint then schema.check(t.checkpoint, checkpoint_spec, "checkpoint", where, origin) end
  if t.spike then
    schema.check(t.spike, spike_spec, "spike", where, origin)
    if not t.on_spike and t.on_nonfinite ~= "rollback" then
      schema.fail(where, "spike = {...} tunes the loss-spike detector, and on_spike is not set: add "
        .. "on_spike = \"warn\" (or \"skip\", \"rollback\", \"stop\") or leave spike out")
    end
  end
  for _, k in ipairs { "on_spike", "on_nonfinite" } do
    if t[k] == "rollback" and not t.checkpoint then
      schema.fail(where, "%s=\"rollback\"%s reloads the last good checkpoint, and this run saves "
        .. "none: add checkpoint = { dir = \"ckpt\", every = N }, or use \"skip\"", k, origin(k) or "")
    end
  end
  if t.resume == "auto" and not t.checkpoint then
    schema.fail(where, "resume=\"auto\" needs checkpoint = { dir = ... } to look in")
  end
  if t.model.kind ~= "gpt" then schema.fail(where, "model must come from loom.gpt{...} or loom.llama{...}") end
  -- The family is its constructor's: loom.llama{} fills kv_heads and ffn_dim and checks the
  -- rotary head size, which a family changed afterwards (model.family=llama on the command
  -- line over a loom.gpt recipe) has not had.
  local fam = t.model.family
  if fam ~= nil and fam ~= "gpt" and fam ~= "llama" then
    schema.fail(where, "model.family=%q%s is not a family (\"gpt\" from loom.gpt{...} or "
      .. "\"llama\" from loom.llama{...})", tostring(fam), origin("model.family") or "")
  end
  if fam == "llama" and (t.model.kv_heads == nil or t.model.ffn_dim == nil) then
    schema.fail(where, "model.family=\"llama\"%s on a model made by loom.gpt{...}: a Llama model "
      .. "comes from loom.llama{ vocab, ctx, layers, heads, dim, ... } in the recipe (it sets "
      .. "kv_heads and ffn_dim and checks the rotary head size)", origin("model.family") or "")
  end
  if t.batch.seq > t.model.ctx then
    schema.fail(where, "batch.seq=%d is longer than the model's ctx=%d", t.batch.seq, t.model.ctx)
  end
  if type(t.lr) == "number" and t.lr <= 0 then schema.fail(where, "lr=%g must be > 0", t.lr) end
  if type(t.lr) == "table" then lrmod.check(t.lr, where, origin) end
  check_tp(t, where, origin)
  local ranks = (mesh.dp or 1) * (mesh.tp or 1) * (mesh.pp or 1)
  if ranks ~= world then
    local tps = {}
    for tp = 1, world do
      if world % tp == 0 and t.model.heads % tp == 0 then tps[#tps + 1] = string.format("tp=%d dp=%d", tp, world // tp) end
    end
    schema.fail(where, "mesh dp=%d x tp=%d x pp=%d = %d ranks, but this run has %d (start it with "
      .. "loom launch -n %d, or use a mesh of %d: %s)", mesh.dp or 1, mesh.tp or 1, mesh.pp or 1,
      ranks, world, ranks, world, table.concat(tps, ", "))
  end
end

return function(loom)
  return function(t)
    local where = schema.where()
    local origin = overrides.apply(t, loom.overrides(), where)
    -- model.moe.*= overrides come after loom.gpt checked the table: check it again
    if type(t.model) == "table" and t.model.moe then t.model.moe = loom._check_moe(t.model, where, origin) end
    if loom.capture then -- `loom plan RECIPE`: the checked recipe, nothing run (loom.plan_cli)
      local mesh = t.mesh or {}
      check(t, where, origin, (mesh.dp or 1) * (mesh.tp or 1) * (mesh.pp or 1))
      return loom.capture(t)
    end
    check(t, where, origin, loom.core.world or 1)
    local dp = (t.mesh or {}).dp or 1
    local pp = (t.mesh or {}).pp or 1
    local accum = (pp > 1 and t.microbatches) or accumulation(t.batch, dp, where, origin)
    local schedule, chunks, lists
    if pp > 1 then
      local sched_mod = require "loom.schedule"
      local given
      given, chunks = check_pp(t, where, origin)
      schedule = sched_mod.label(given)
      local shape = { stages = pp, microbatches = accum, chunks = chunks }
      local okp, errp = pcall(sched_mod.lists, given, shape)
      if okp and sched_mod.is_lua(given) then -- refused here, before any rank starts
        lists = errp
        okp, errp = pcall(sched_mod.simulate, lists, shape)
      end
      if not okp then schema.fail(where, "schedule=\"%s\" with pp=%d, microbatches=%d: %s",
        schedule, pp, accum, (tostring(errp):gsub("^schedule: ", ""))) end
    end
    local opt = loom.plugin_table(t.optimizer, "optimizer", where)
    -- The optimizer's lr is the base a schedule scales; a number or function lr stands alone.
    if type(t.lr) == "number" then opt.lr = t.lr end
    if type(t.lr) == "function" and opt.lr == nil then opt.lr = 1.0 end
    local ok, err = pcall(loom.core.check_plugin, "optim", opt)
    if not ok then schema.fail(where, "%s", err) end
    for _, key in ipairs({ "comm", "host_comm" }) do -- on one rank too: a misspelt
      if t[key] then                                   -- communicator must not wait for the launch
        local okc, errc = pcall(loom.core.check_plugin, "comm", { name = t[key] })
        if not okc then schema.fail(where, "%s=%s%s: %s", key, t[key], origin(key) or "", errc) end
      end
    end
    if t.device_wait then -- only a comm with the key (nccl: device memory) can wait on the device
      local comm = t.comm or "shm"
      if not pcall(loom.core.check_plugin, "comm", { name = comm, device_wait = true }) then
        schema.fail(where, "device_wait=true%s goes beside a communicator that takes device memory "
          .. "(comm = \"nccl\": the backend's stream waits on each collective); comm = \"%s\" carries "
          .. "host memory, whose waits always block the host, so leave device_wait out",
          origin("device_wait") or "", comm)
      end
    end
    local base_lr = opt.lr
    local lr_of = lrmod.resolve(t.lr, base_lr)
    if t.data.kind == "random" and t.data.vocab ~= t.model.vocab then
      schema.fail(where, "loom.data.random vocab=%d differs from the model's vocab=%d",
        t.data.vocab, t.model.vocab)
    end
    if t.model.vocab ~= 256 and t.data.kind == "text" then
      schema.fail(where, "loom.data.text gives byte tokens: the model needs vocab=256, got %d",
        t.model.vocab)
    end

    -- Many ranks: all run the same recipe (checked by hash), then build the mesh.
    local rank, world = loom.core.rank or 0, loom.core.world or 1
    local canonical = t.deterministic == "canonical"
    local strategy
    if world > 1 then
      local ok, err = pcall(loom.core.check_same_config, json.encode(t),
        t.comm_timeout and math.max(1, math.floor(t.comm_timeout * 1000)) or nil)
      if not ok then -- name the keys in which this rank's recipe differs from rank 0's
        local changes = recipe_changes(loom.core.recipe_of_rank0(), json.encode(t))
        schema.fail(where, "%s%s", err, #changes > 0 and string.format("; rank %d's recipe differs "
          .. "from rank 0's in: %s (rank 0's value -> this rank's)", rank, table.concat(changes, ", ")) or "")
      end
      local pp = (t.mesh or {}).pp or 1
      ok, err = pcall(loom.core.init_dist, { comm = t.comm or "shm", host_comm = t.host_comm, device_wait = t.device_wait, dp = dp,
        tp = (t.mesh or {}).tp, pp = pp,
        timeout_ms = math.floor((t.comm_timeout or 60) * 1000),
        -- a stage's activation (micro x seq x dim fp32), so that shm's mailbox holds two
        p2p_bytes = pp > 1 and t.batch.micro * t.batch.seq * t.model.dim * 4 or nil,
        flight_dir = (t.checkpoint or {}).dir, debug_desync = t.debug_desync })
      if not ok then schema.fail(where, "%s", err) end
      strategy = { name = "dp" }
      for k, v in pairs((t.strategy or {}).dp or {}) do strategy[k] = v end
    end
    local tp = (t.mesh or {}).tp or 1
    local tensor = tp > 1 and { name = "tp", sequence_parallel = t.tp_sequence_parallel or false } or nil

    local data = loom.open_data(t.data, where)
    preflight.check(loom.core, t, data, where, origin)
    local session = loom.session({
      model = t.model, optimizer = opt, precision = t.precision, seed = t.seed,
      grad_clip = t.grad_clip, on_nonfinite = t.on_nonfinite == "rollback" and "skip" or t.on_nonfinite, threads = t.threads, backend = t.backend,
      batch = { micro = t.batch.micro, seq = t.batch.seq, accum = accum },
      strategy = strategy, tensor = tensor, canonical = canonical,
      schedule = lists or schedule, schedule_name = lists and schedule or nil, chunks = chunks,
      pp_layers = t.pp_layers, recompute = t.recompute,
      zero = (t.strategy or {}).zero, zero_bucket_mb = ((t.strategy or {}).dp or {}).bucket_mb,
      offload = (t.strategy or {}).offload, compress = (t.strategy or {}).compress,
      teacher = t.teacher, ep = (t.mesh or {}).ep,
    }, where)
    local info = session:info()
    local say = rank == 0 and print or function() end
    -- the banner names a precision other than fp32 (bf16, fp16) after the optimizer
    local precision_name = type(t.precision) == "table" and t.precision[1] or t.precision or "fp32"
    say(string.format("loom %s | " .. (t.model.family or "gpt") .. " %s params (L=%d H=%d C=%d V=%d ctx=%d) | batch %dx%d x%d accum x%d dp%s%s | %s | %s",
      loom.version, human(info.params), t.model.layers, t.model.heads, t.model.dim, t.model.vocab,
      t.model.ctx, t.batch.micro, t.batch.seq, accum, dp,
      (tp > 1 and string.format(" x%d tp%s", tp, t.tp_sequence_parallel and "+sp" or "") or "")
        .. (pp > 1 and string.format(" x%d pp (%s%s, blocks %s)", pp, schedule,
          chunks > 1 and string.format(", %d chunks", chunks) or "",
          table.concat(info.pp_layers or {}, "+")) or ""),
      canonical and " (canonical)" or "",
      opt.name .. (precision_name ~= "fp32" and " | " .. precision_name or ""), info.backend))
    say(memory_line(info, (t.strategy or {}).zero or 0, dp))
    local dc = rawget(loom.core, "distill_cache") -- loom distill-cache: the teacher's logits, no training
    if dc then return require("loom.distill_cache").write(loom, session, data, t, dc, where, accum * dp) end

    -- Resume: the newest complete checkpoint (auto) or the one named; exact by design:
    -- weights, optimizer state, step, precision state and data position all come back.
    local start = 0
    local config_json = json.encode(t)
    local g = guard.new { policy = t.on_spike, window = (t.spike or {}).window,
      threshold = (t.spike or {}).threshold, max_rollbacks = (t.spike or {}).max_rollbacks,
      nonfinite = t.on_nonfinite, max_skipped = t.max_skipped }
    if t.resume then
      local path, why = t.resume, nil
      if t.resume == "auto" then path, why = preflight.pick_checkpoint(loom.core, t.checkpoint.dir, say, where) end
      if path then
        local ok, info = pcall(session.load, session, path, data)
        if not ok then schema.fail(where, "cannot resume: %s", info) end
        start = info.step
        g:resumed(path, start)
        say(string.format("resumed from %s at step %d", path, start))
        local changes = recipe_changes(info.config_json, config_json)
        if #changes > 0 then
          say(string.format("warning: this recipe differs from the one that saved %s: %s", path,
            table.concat(changes, ", ")))
        end
        if start >= t.steps then
          say(string.format("nothing left to do: the checkpoint is at step %d and the run has "
            .. "steps=%d (raise steps to train on)", start, t.steps))
        end
      else
        say(string.format("nothing to resume (%s): starting at step 1", why or t.checkpoint.dir))
      end
    end
    -- One line per save: where, how big (the manifest's file sizes), how long it took.
    local function save(step, m)
      local t0 = loom.core.now()
      local ok, path = pcall(session.save, session, t.checkpoint.dir,
        { step = step, config_json = config_json, data = data, keep = t.checkpoint.keep or 0,
          protect = g:protected() }) -- retention keeps the last good one (loom.guard)
      if not ok then schema.fail(where, "checkpoint at step %d failed: %s", step, path) end
      g:saved(path, step)
      local bytes, f = 0, io.open(path .. "/manifest.json", "rb")
      if f then
        local text = f:read("a")
        f:close()
        bytes = #text
        local okj, man = pcall(json.decode, text)
        for _, file in pairs(okj and type(man.files) == "table" and man.files or {}) do
          bytes = bytes + (tonumber(file.bytes) or 0)
        end
      end
      if rank == 0 then
        m:print(string.format("checkpoint step %d -> %s (%s, %.2f s)", step, path,
          bytes >= 1 << 20 and string.format("%.1f MiB", bytes / (1 << 20))
            or string.format("%.1f KiB", bytes / 1024), loom.core.now() - t0))
      end
      return path
    end

    local m <close> = metrics.new {
      steps = t.steps, every = t.log and t.log.every, jsonl = rank == 0 and t.log and t.log.jsonl or nil,
      quiet = rank ~= 0,
      params = info.params, layers = t.model.layers, dim = t.model.dim, seq = t.batch.seq,
      peak_flops = t.peak_flops, device = info.backend, start_step = start, devices = world,
    }
    local trace = t.log and t.log.trace
    if trace then
      local ok, err = loom.core.mkdir_p(trace)
      if not ok then
        schema.fail(where, "log.trace=\"%s\"%s: %s (give a directory this run may create, e.g. "
          .. "\"run/trace\")", trace, origin("log.trace") or "", err)
      end
      local okt, errt = pcall(session.trace, session, string.format("%s/rank%d.json", trace, rank), rank,
        t.log.trace_steps or 0)
      if not okt then schema.fail(where, "%s", errt) end
    end
    local summary = { losses = {}, start = start }
    local bubbles = {} -- under pp: each step's measured bubble (r.bubble)
    -- SIGTERM, SIGINT, SIGUSR1 during the loop: finish the step, save, exit 128 + signo
    -- (core/base/stop_signal.h); outside it they keep their default action.
    loom.core.catch_stop_signals(true)
    local armed <close> = setmetatable({}, { __close = function() loom.core.catch_stop_signals(false) end })
    local step_ms = {} -- each step's time, for the plan's check after the run
    -- the start-up's peak resident set (VmHWM once the session is built and any resume
    -- loaded, before the first step): what ZeRO-3's partitioned construction keeps down
    local startup_peak_rss = session:info().peak_rss
    local step = start
    while step < t.steps do
      step = step + 1
      local lr = lr_of(step)
      if type(lr) ~= "number" or lr ~= lr or lr < 0 or lr == math.huge then
        schema.fail(where, "lr schedule returned %s at step %d (want a finite number >= 0)",
          tostring(lr), step)
      end
      -- on_nonfinite = "stop" raises: no save follows; g:limits() keeps a spike's update out
      local r = session:step(data, lr, step, g:limits())
      r.step = step
      local verdict = g:observe(r)
      if r.nonfinite and rank == 0 then
        io.stderr:write(string.format("loom: step %d: %s; update skipped on every rank (on_nonfinite = \"%s\")\n",
          step, r.nonfinite.message, t.on_nonfinite or "skip"))
      end
      r.tokens_per_s = r.tokens / (r.ms / 1000)
      local now = session:info()
      r.memory, r.peak_rss, r.rss = now.memory, now.peak_rss, now.rss -- VmHWM, VmRSS (bytes)
      r.startup_peak_rss = startup_peak_rss
      summary.losses[#summary.losses + 1] = r.loss
      step_ms[#step_ms + 1] = r.ms
      if r.bubble then bubbles[#bubbles + 1] = r.bubble end
      m:step(r)
      if verdict and verdict.kind == "spike" then
        if verdict.policy == "stop" then
          error(string.format("step %d: %s; the run stops (on_spike = \"stop\"), the step's update "
            .. "not applied", step, verdict.what), 0)
        end
        if rank == 0 then
          io.stderr:write(string.format("loom: step %d: %s; %s (on_spike = \"%s\")\n", step, verdict.what,
            verdict.policy == "warn" and "the update was applied" or "update skipped on every rank",
            verdict.policy))
        end
      end
      if verdict and verdict.policy == "rollback" then
        if g.rollbacks >= g.max_rollbacks then
          error(string.format("step %d: %s; %d rollbacks already (spike.max_rollbacks = %d): the run "
            .. "stops (lower the lr, or raise max_rollbacks)", step, verdict.what, g.rollbacks,
            g.max_rollbacks), 0)
        end
        if not g.last_good then
          if rank == 0 then
            io.stderr:write(string.format("loom: step %d: no good checkpoint to roll back to yet: the "
              .. "update was skipped\n", step))
          end
        else
          -- reload the last good checkpoint, then read on from here: the data window that led
          -- to the spike (the steps since that checkpoint) is skipped, not trained again
          local after = data:state()
          local okl, back = pcall(session.load, session, g.last_good, data)
          if not okl then schema.fail(where, "rollback to %s failed: %s", g.last_good, back) end
          data:set_state(after)
          if rank == 0 then
            io.stderr:write(string.format("loom: step %d: rolled back to %s (step %d) and skipped the "
              .. "data of steps %d-%d; training goes on from step %d (rollback %d of at most %d)\n",
              step, g.last_good, back.step, back.step + 1, step, back.step + 1, g.rollbacks + 1,
              g.max_rollbacks))
          end
          g:rolled_back()
          step = back.step
          goto next_step
        end
      end
      do
        local diverged = g:diverged()
        if diverged then error(diverged, 0) end
      end
      if t.eval and (step % t.eval.every == 0 or step == t.steps) then
        r.val_loss = session:eval(data, t.eval.batches or 10)
        summary.val_loss = r.val_loss
        m:eval(step, r.val_loss)
      end
      if t.sample and t.sample.every and step % t.sample.every == 0 then
        local text = loom.sample { session = session, prompt = t.sample.prompt or "\n",
          tokens = t.sample.tokens or 128, temperature = t.sample.temperature,
          top_k = t.sample.top_k, seed = t.sample.seed, tokenizer = loom.tokenizer_dir(t.data) }
        m:print(text) -- the text only (loom.sample's second result is the optional hash)
      end
      local stop = t.on_step and t.on_step(r, session) == false
      local signal = r.stop_signal -- agreed by every rank in the step's exchange
      -- collective: every rank calls save (dp rank 0 of each tp rank writes its files)
      -- with checkpoint.dir set the run always saves at its end (and when on_step or a
      -- stop signal stops it)
      local saved
      if t.checkpoint and ((t.checkpoint.every and step % t.checkpoint.every == 0)
          or step == t.steps or stop or signal) then
        saved = save(step, m)
      end
      if signal and step < t.steps then
        local name = loom.core.signal_name(signal)
        error({ stop_signal = signal, message = rank == 0 and (saved
          and string.format("%s: stopped after step %d, saved %s (resume=auto continues from it)",
            name, step, saved)
          or string.format("%s: stopped after step %d; nothing saved (no checkpoint.dir)", name,
            step)) or nil }, 0)
      end
      if stop then break end
      ::next_step::
    end
    summary.final_loss = summary.losses[#summary.losses]
    do -- the planner's own error on this run (loom.plan_cli.after_run; docs/PLAN.md)
      local ms = {}
      for i = 2, #step_ms do ms[#ms + 1] = step_ms[i] end
      table.sort(ms)
      local run_dir = t.log and t.log.jsonl and (t.log.jsonl:match("^(.*)/[^/]*$") or ".")
        or (t.checkpoint and t.checkpoint.dir)
      require("loom.plan_cli").after_run(t, rank, { peak_rss = session:info().peak_rss,
        step_ms = #ms > 0 and ms[(#ms + 1) // 2] or nil }, run_dir)
    end
    if #bubbles > 0 then
      summary.bubble = bubble_summary(bubbles)
      local f, fvalue = require("loom.schedule").formula(schedule, pp, accum, chunks)
      m:print(string.format("pipeline bubble: measured %.4f (mean of %s), schedule %s formula %s",
        summary.bubble, #bubbles > 1 and string.format("steps %d-%d", start + 2, start + #bubbles)
          or "the one step", schedule, f and string.format("%s = %.4f", f, fvalue) or "n/a"))
    end
    if trace then m:print(string.format("trace: %s/rank0.json .. rank%d.json (Perfetto: ui.perfetto.dev)", trace, world - 1)) end
    return session, summary
  end
end
