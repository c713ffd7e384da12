-- loom.plan — memory and step time of one layout before the run (docs/PLAN.md).
--
--   local p = require("loom.plan").layout(recipe, machine)   -- recipe: a loom.train table
--
-- Memory per rank comes from the model's own table and activation layout code
-- (core.footprint: loom_gpt_footprint, the code loom_gpt_create allocates with) and ZeRO's
-- partition formula (core.zero_padded); the pipeline's activation sets are the real
-- schedule's peak micro-batches in flight + 1 (core.sched_simulate, as the engine sizes
-- them). Time per step is a sum of modelled parts, each named in p.time with where its
-- figure comes from: GEMMs and attention at the machine's measured (or spec-sheet) rates
-- by size, the element-wise passes at its memory bandwidth, every collective as latency +
-- bytes x bus factor / bus bandwidth of the link its group spans, the pipeline's bubble
-- from simulating the schedule with those stage costs. p.assumptions lists what is taken
-- on trust. What not: this runs nothing on the model; see plan_machine.lua for the
-- machine model and plan_search.lua for the search over layouts.
local core = require "loom.core"
local plan = {}

local F32 = 4

-- The attention path of a run on the CUDA backend (backend "cuda", or "cudaemu": its
-- kernels emulated, the same attention_sizes): LOOM_CUDA_ATTENTION and LOOM_CUDA_FLASH_TC
-- as the backend reads them when the run starts (kernels/cuda/cuda_common.h), from this
-- process's environment, so that a plan of `LOOM_CUDA_ATTENTION=flash loom run` is
-- `LOOM_CUDA_ATTENTION=flash loom plan` (and the after-run line, in the run's own process,
-- sees what the run saw). nil: another backend (the batched path's sizes: no attention_sizes).
local function cuda_attention(t)
  if t.backend ~= "cuda" and t.backend ~= "cudaemu" then return nil end
  local v = os.getenv("LOOM_CUDA_ATTENTION")
  if v == nil or v == "" or v == "batched" then return "batched", true end
  if v ~= "flash" then
    error(string.format("backend %s: LOOM_CUDA_ATTENTION=%s; use \"batched\" (the default) or \"flash\" (the run refuses it too)", t.backend, v), 0)
  end
  return "flash", os.getenv("LOOM_CUDA_FLASH_TC") ~= "0"
end

-- The recipe's layout in plain numbers, defaults as loom.train gives them.
local resolved = setmetatable({}, { __mode = "k" })
local function shape_of(t)
  local mesh, st = t.mesh or {}, t.strategy or {}
  local dp, tp, pp, ep = mesh.dp or 1, mesh.tp or 1, mesh.pp or 1, mesh.ep or 1
  -- as train.lua counts them: under pp without microbatches, batch.global gives the count
  local accum = (pp > 1 and t.microbatches)
    or (t.batch.global and t.batch.global // (t.batch.micro * dp) or 1)
  local prec = t.precision
  -- { "bf16", reduce = "bf16" }: the dp gradient all-reduce sent as bf16 (plugins/precision)
  local reduce16 = type(prec) == "table" and prec.reduce == "bf16"
  if type(prec) == "table" then prec = prec[1] or prec.name end
  local off = st.offload and (st.offload.optimizer or st.offload) or nil
  -- ZeRO-3's parameter partition in the same place as the state (docs/ZERO.md)
  local off_params = type(st.offload) == "table" and st.offload.params == true
  local sched = pp > 1 and (t.schedule or "1f1b") or nil
  local cuda_att, flash_tc = cuda_attention(t)
  -- a distillation teacher: the keys the session is given (init.lua's resolve_teacher: the
  -- model's shape from its llm.c file or its checkpoint's manifest)
  local kd = t.teacher and resolved[t.teacher]
  if t.teacher and not kd then -- (once per teacher table: the search plans many layouts)
    kd = require("loom").resolve_teacher(t.teacher, "teacher: ", t.model)
    resolved[t.teacher] = kd
  end
  return {
    dp = dp, tp = tp, pp = pp, ep = ep, micro = t.batch.micro, seq = t.batch.seq, accum = accum,
    zero = (dp > 1 and st.zero) or 0, zero_asked = st.zero or 0,
    bucket_mb = (st.dp or {}).bucket_mb or 25, canonical = t.deterministic == "canonical",
    recompute = t.recompute or "none", sp = t.tp_sequence_parallel and tp > 1 or false,
    schedule = sched, chunks = t.pp_chunks or (sched == "interleaved" and 2 or 1),
    pp_layers = t.pp_layers, offload = off, offload_params = off_params and off ~= nil, precision = prec or "fp32",
    reduce16 = reduce16 and (prec == "bf16" or prec == "fp16"),
    optimizer = type(t.optimizer) == "table" and (t.optimizer[1] or t.optimizer.name) or t.optimizer,
    threads = t.threads or 0,
    cuda_attention = cuda_att, flash_tc = flash_tc,
    kd = kd,
  }
end
plan.shape_of = shape_of

-- teacher.layers' map as lists: the student blocks (their projections; with
-- teacher.attention the blocks that keep their probabilities) and the teacher blocks
local function kd_blocks(kd)
  if not (kd and kd.kd_layers) then return nil, nil end
  local st, te = {}, {}
  for sb, tb in pairs(kd.kd_layers) do st[#st + 1], te[#te + 1] = sb, tb end
  table.sort(st); table.sort(te)
  return st, te
end

-- Optimizer state floats per parameter (the plugins' state_per_param).
local state_slots = { adamw = 2, sgd = 1 }

-- A search's cache (plan.layout's opts.cache: plan_search.lua gives one table to all the
-- layouts of one search): what depends on a part of the layout only is computed once per
-- search, not once per layout, and is the same value: core.footprint by its arguments (a
-- ZeRO stage or an offload does not change a stage's footprint), a stage's compute by what
-- it reads, the stages' block lists, the prepared schedules and their simulations by the
-- costs, the GEMM and attention rates by shape. Without a cache, all computed each time.
-- (key_of: a table of arguments as a string, every value exactly: integers as such, floats
-- in %a, strings quoted, tables by their contents; a list the cache made, which nothing
-- changes, by the string it was given then: `listed`. The keys of an argument table are
-- plan.lua's names or list indices)
local listed = setmetatable({}, { __mode = "k" })
local mtype, fmt, concat = math.type, string.format, table.concat
local function key_of(v)
  local done = listed[v]
  if done then return done end
  local parts, n = {}, 0
  for k, x in pairs(v) do
    local tx = type(x)
    if tx == "number" then
      if mtype(x) ~= "integer" then x = fmt("%a", x) end
    elseif tx == "string" then x = fmt("%q", x)
    elseif tx == "table" then x = key_of(x)
    else x = tostring(x) end
    if type(k) ~= "string" then k = "#" .. (mtype(k) == "integer" and k or tostring(k)) end
    parts[n + 1], parts[n + 2] = k, x
    n = n + 2
  end
  return "{" .. concat(parts, "=") .. "}"
end

-- f(args) by key (key_of(args) where none is given)
local function cached(cache, what, f, args, key)
  if not cache then return f(args) end
  local c = cache[what]
  if not c then c = {}; cache[what] = c end
  key = key or key_of(args)
  local v = c[key]
  if v == nil then v = f(args); c[key] = v end
  return v
end

-- key_of(part(t, s)) once per layout (per shape table s and its model): the part of the
-- arguments every stage of the layout shares, `what` naming the part
local layout_keys = setmetatable({}, { __mode = "k" })
local function layout_key(what, t, s, part)
  local per = layout_keys[s]
  if not per or per.model ~= t.model then
    per = { model = t.model }
    layout_keys[s] = per
  end
  local k = per[what]
  if not k then
    k = key_of(part(t, s))
    per[what] = k
  end
  return k
end

local function footprint(cache, args, key) return cached(cache, "footprint", core.footprint, args, key) end

-- t[a][b][c], made where missing
local function nested(t, a, b, c)
  local x = t[a]; if not x then x = {}; t[a] = x end
  local y = x[b]; if not y then y = {}; x[b] = y end
  local z = y[c]; if not z then z = {}; y[c] = z end
  return z
end

-- The blocks each pipeline stage holds: pp_layers, else the session's default split
-- (core.pp_split: balanced by FLOPs, the embedding on the first virtual stage and the LM
-- head on the last); virtual stage k = chunk x pp + rank.
local function stage_blocks(m, s, cache)
  if cache then -- (the same lists for every layout of the split: `listed`)
    local key = key_of { m.layers, s.pp, s.chunks, s.pp_layers, m.vocab, m.vocab_padded, m.dim, m.heads, m.ctx,
      s.seq, m.family, m.kv_heads, m.ffn_dim, m.moe, s.recompute }
    cache.blocks = cache.blocks or {}
    local out = cache.blocks[key]
    if not out then
      out = stage_blocks(m, s)
      for _, list in ipairs(out) do listed[list] = "[" .. concat(list, ",") .. "]" end
      cache.blocks[key] = out
    end
    return out
  end
  local L, V = m.layers, s.pp * s.chunks
  local counts = s.pp_layers
  if not counts then
    local rc = s.recompute
    counts = core.pp_split {
      layers = L, stages = s.pp, chunks = s.chunks, vocab = m.vocab, vocab_padded = m.vocab_padded,
      dim = m.dim, heads = m.heads, ctx = m.ctx, seq = s.seq, family = m.family,
      kv_heads = m.kv_heads, ffn_dim = m.ffn_dim, moe = m.moe,
      recompute = type(rc) == "string" and rc or nil, recompute_layers = type(rc) == "table" and rc or nil,
    }
  end
  local first, at = {}, 0
  for k = 0, V - 1 do
    first[k] = at
    at = at + counts[k + 1]
  end
  first[V] = L
  local out = {}
  for r = 0, s.pp - 1 do
    local list = {}
    for c = 0, s.chunks - 1 do
      local k = c * s.pp + r
      for l = first[k], first[k + 1] - 1 do list[#list + 1] = l end
    end
    out[r + 1] = list
  end
  return out
end

-- Blocks 0 .. L-1 (one stage's list; with a search's cache the same list each time)
local function all_blocks(L, cache)
  local out = cache and cache.all_blocks and cache.all_blocks[L]
  if out then return out end
  out = {}
  for i = 0, L - 1 do out[#out + 1] = i end
  if cache then
    cache.all_blocks = cache.all_blocks or {}
    cache.all_blocks[L] = out
    listed[out] = "[" .. concat(out, ",") .. "]"
  end
  return out
end

-- Per stage: activation sets (peak in flight + 1) and whether its list splits backward.
-- (the lists of one shape are built once and kept: a search simulates each many times)
-- (with a search's cache, each shape's once per search, a shape the schedule refuses
-- too; and each simulation once per costs)
local prepared = setmetatable({}, { __mode = "v" })
local function schedule_facts(s, costs, cache)
  local key = string.format("%s/%d/%d/%d", tostring(s.schedule), s.pp, s.accum, s.chunks)
  local store = prepared
  if cache then
    store = cache.prepared or {}
    cache.prepared = store
  end
  local prep = store[key]
  if not prep then
    local sched = require "loom.schedule"
    local shape = { stages = s.pp, microbatches = s.accum, chunks = s.chunks }
    local ok, p = pcall(function()
      if sched.is_lua(s.schedule) then return core.sched_prepare(sched.lists(s.schedule, shape), s.accum, s.chunks) end
      return core.sched_prepare(s.schedule, s.accum, s.chunks, s.pp) -- (a plugin's, built in C)
    end)
    prep = ok and p or { refused = p }
    store[key] = prep
  end
  if type(prep) == "table" then error(prep.refused, 0) end
  local sim = cached(cache, "simulate", function() return prep:simulate(costs) end,
    { key, costs.fwd, costs.bwd_input, costs.bwd_weight, costs.latency })
  -- (split: stage 0's list has BWD_INPUT; the bundled schedules split on every stage or on none)
  local facts = { sim = sim, stages = {} }
  for r = 1, s.pp do
    facts.stages[r] = { slots = sim.peak[r] + 1, peak = sim.peak[r], split = sim.split }
  end
  return facts
end

-- A distillation teacher on one rank of stage r (1-based), as session.c's make_teacher
-- builds it: a second, frozen model by loom_gpt_create (its fp32 parameters, no gradient
-- buffer, forward-only activations at batch.micro x batch.seq, not its ctx: one block's set that every block
-- shares, two block outputs in turn, the mapped blocks' outputs of their own where the terms
-- run; never 16-bit), on the last stage
-- only unless teacher.pp = mesh.pp (its blocks split evenly over the stages, the first
-- L mod pp one larger: pipeline_split.h with equal costs; its own gpipe pipeline of one
-- micro-batch sets its activation sets), split by teacher.tp over the student's tp group
-- (sequence parallelism as the student's, off with teacher.layers) or across dp ranks (no
-- sequence parallelism: kd_group.c); with teacher.attention its mapped blocks keep their
-- probabilities where the terms run (the last stage). A cache runs no teacher.
-- The teacher blocks stage r (1-based) of teacher.pp = tpp holds: L // tpp each, the first
-- L mod tpp one larger (pipeline_split.h with equal costs), 0-based block indices.
local function teacher_stage_blocks(layers, tpp, r)
  local at, per, extra = 0, layers // tpp, layers % tpp
  for k = 1, r - 1 do at = at + per + (k <= extra and 1 or 0) end
  local list = {}
  for l = at, at + per + (r <= extra and 1 or 0) - 1 do list[#list + 1] = l end
  return list
end

local function teacher_memory(s, r, cache)
  local kd = s.kd
  local none = { params = 0, grads = 0, activations = 0 }
  if not kd or kd.kd_cache or not kd.teacher then return none end
  local tpp = kd.kd_teacher_pp or 1
  if s.pp > 1 and tpp <= 1 and r < s.pp then return none end
  local tm = kd.teacher
  local ttp = kd.kd_teacher_tp or 1
  -- what the session refuses (session.c teacher_stages, teacher_layout; kd_group.c), so that
  -- the search counts such a layout refused
  if tpp > 1 and tpp ~= s.pp then
    error(string.format("teacher.pp = %d with mesh.pp = %d is not built: teacher.pp = mesh.pp or 1", tpp, s.pp), 0)
  end
  if tpp > tm.layers then
    error(string.format("teacher.pp = %d: the teacher has %d blocks, fewer than the stages", tpp, tm.layers), 0)
  end
  if ttp > 1 and ((s.tp > 1 and ttp ~= s.tp) or (s.tp == 1 and s.dp % ttp ~= 0)) then
    error(string.format("teacher.tp = %d with mesh.tp = %d, mesh.dp = %d is not built: teacher.tp = mesh.tp, or with mesh.tp = 1 a divisor of mesh.dp", ttp, s.tp, s.dp), 0)
  end
  local stage, slots
  if tpp > 1 then
    stage = teacher_stage_blocks(tm.layers, tpp, r)
    slots = schedule_facts({ schedule = "gpipe", pp = tpp, accum = 1, chunks = 1 },
      { fwd = 1, bwd_input = 1, bwd_weight = 0, latency = 0 }, cache).stages[r].slots
  end
  local _, kept = kd_blocks(kd)
  local fp = footprint(cache, {
    vocab = tm.vocab, vocab_padded = tm.vocab_padded, ctx = tm.ctx, layers = tm.layers,
    heads = tm.heads, dim = tm.dim, micro = s.micro, tp = ttp,
    sequence_parallel = ttp > 1 and s.tp > 1 and s.sp and not kd.kd_layers or false,
    canonical = s.canonical, stage_layers = stage, slots = slots,
    family = tm.family, kv_heads = tm.kv_heads, ffn_dim = tm.ffn_dim, tie_embeddings = tm.tie_embeddings,
    moe = tm.moe, precision = "fp32",
    cuda_attention = s.cuda_attention, flash_tc = s.flash_tc,
    keep_attention = kd.kd_attention and r == s.pp and kept or nil,
    -- session.c make_teacher: frozen, the mapped blocks' outputs kept where the terms run,
    -- activations for the run's sequences (batch.seq), not the teacher's ctx
    frozen = true, keep_outputs = r == s.pp and kept or nil, max_T = s.seq,
  })
  -- frozen: no gradient buffer
  return { params = fp.param_floats * F32, grads = 0, activations = fp.activations }
end

-- Distillation's own buffers on one rank of stage r (loom_session_memory's distill), each
-- as its allocation sizes it: the student's terms where its head is (gpt_distill.c's
-- kd_prepare: the logit term's gradient rows R x (Vl + 2 Vp under tp) and its losses, a
-- device's second losses and, under tp, its row indices; gpt_distill_hidden.c: per mapped
-- block and activation set d h and d W, the projection's output and losses, sequence
-- parallelism's gathered rows, a device's host copies; gpt_distill_attn.c: the
-- probabilities' gradient row block, the losses and per-head sums, a device's copies),
-- R = batch.micro x the student's ctx; the session's (session.c: the step's teacher rows
-- under pp, teacher.tp's gathered rows, the terms' rows of the step under pp or on a
-- device, a cache's device rows); a teacher.tp group's across dp ranks (kd_group.c) and
-- a cache's dense rows (kd_cache.c; its record buffer, 8 B T k + 16 bytes, k from the
-- file, is not counted here).
local function distill_memory(t, s, r, slots)
  local kd = s.kd
  if not kd then return 0 end
  local m, tm = t.model, kd.teacher
  local device = t.backend == "cuda" or t.backend == "cudaemu"
  local last = r == s.pp
  local B, T, ctx, V = s.micro, s.seq, m.ctx, m.vocab
  local R, bt = B * ctx, B * s.seq
  local vps = m.vocab_padded or (V + 127) // 128 * 128
  local vpt = tm and (tm.vocab_padded or (tm.vocab + 127) // 128 * 128)
  local ttp, tpp = kd.kd_teacher_tp or 1, kd.kd_teacher_pp or 1
  local builds = kd.kd_cache or last or tpp > 1 -- (make_teacher: this stage has a teacher part)
  local st = kd_blocks(kd)
  local mapped = st and #st or 0
  local b = 0
  if last then -- the student's terms
    b = b + R * (vps // s.tp + (s.tp > 1 and 2 * vps or 0)) * F32 + (device and 2 or 1) * R * 8
    if device and s.tp > 1 then b = b + R * (s.tp + 1) * 4 end
    if kd.kd_layers then
      local C, Ct = m.dim, tm.dim
      if device then b = b + 2 * (R * C + Ct * C) * F32 end
      b = b + R * 8 + (R * Ct + (s.sp and R * C or 0)) * F32 + mapped * slots * (R * C + Ct * C) * F32
    end
    if kd.kd_attention then
      local NHl = m.heads // s.tp
      b = b + R * NHl * ctx * F32 + R * 8 + (s.tp + 1) * R * NHl * 8
      if device then b = b + 2 * R * NHl * ctx * F32 end
      if device and s.tp > 1 then b = b + (s.tp + 1) * R * NHl * 8 end -- (the tp gather's sums)
    end
  end
  if kd.kd_cache then -- (on the last stage only: make_teacher)
    if not last then return b end
    if s.pp > 1 then b = b + s.accum * bt * V * F32 end
    if device then b = b + bt * V * F32 end
    return b + bt * V * F32
  end
  if not builds then return b end
  if last and s.pp > 1 then b = b + s.accum * bt * vpt * F32 end
  if ttp > 1 and s.tp > 1 then b = b + 2 * bt * vpt * F32 end
  if last and kd.kd_layers and (s.pp > 1 or device) then
    b = b + mapped * s.accum * bt * tm.dim * F32
    if kd.kd_attention then
      local held = (ttp > 1 and s.tp > 1) and tm.heads // ttp or tm.heads
      b = b + mapped * s.accum * B * held * T * T * F32
    end
  end
  if ttp > 1 and s.tp == 1 then -- kd_group.c: teacher.tp across dp ranks
    local vp = last and vpt or 0
    b = b + 2 * s.accum * s.dp * bt * 4 + s.accum * bt * vp * F32 + 1 + 2 * bt * vp * F32 + 1
    if last and kd.kd_layers then
      local att = kd.kd_attention and bt * tm.heads * T or 0
      b = b + mapped * (s.accum * bt * tm.dim * F32 + s.accum * att * F32) + 2 * att * F32
    end
  end
  return b
end

-- The student's core.footprint arguments for a stage holding the blocks stage_layers (nil:
-- all) with `slots` activation sets (nil: 1), split_backward as its schedule; with all
-- three nil, what every stage of the layout shares.
local function footprint_args(t, s, stage_layers, slots, split_backward)
  local m = t.model
  local rc, rc_layers = s.recompute, nil
  if type(rc) == "table" then rc, rc_layers = "none", rc end
  local kd_st = kd_blocks(s.kd) -- (teacher.layers: the student's projections, kept blocks)
  return {
    vocab = m.vocab, vocab_padded = m.vocab_padded, ctx = m.ctx, layers = m.layers,
    heads = m.heads, dim = m.dim, micro = s.micro, tp = s.tp, sequence_parallel = s.sp,
    canonical = s.canonical, recompute = rc, recompute_layers = rc_layers,
    stage_layers = stage_layers, slots = slots, split_backward = split_backward,
    family = m.family, kv_heads = m.kv_heads, ffn_dim = m.ffn_dim, tie_embeddings = m.tie_embeddings,
    moe = m.moe, ep = s.ep, precision = s.precision,
    cuda_attention = s.cuda_attention, flash_tc = s.flash_tc,
    kd_proj_dim = kd_st and s.kd.teacher.dim or nil, kd_proj_layers = kd_st,
    keep_attention = s.kd and s.kd.kd_attention and kd_st or nil,
  }
end

-- Bytes by category for one rank of pipeline stage `r` (1-based).
local function stage_memory(t, s, blocks, facts, r, opts)
  local m = t.model
  local st = facts and facts.stages[r] or { slots = 1, split = false }
  local stage_layers = s.pp > 1 and blocks[r] or nil
  local key = opts.cache and layout_key("footprint", t, s, footprint_args)
    .. key_of { stage_layers, st.slots, st.split }
  local fp = footprint(opts.cache, footprint_args(t, s, stage_layers, st.slots, st.split), key)
  local psi = fp.param_floats
  local part = s.zero > 0 and core.zero_padded(psi, s.dp) // s.dp or psi
  -- ZeRO-1 under expert parallelism (core/train/zero_ep.c): the dense entries (D floats)
  -- over dp, this rank's expert entries (X) over the expert-data-parallel group (dp / ep),
  -- each padded to 16 x its group. X from the model's own table: the same footprint with
  -- every expert here (ep = 1) holds (E - E/ep) more experts' floats.
  local ep_split
  if s.zero == 1 and s.ep > 1 and m.moe and m.moe.experts > 0 then
    local fp1 = footprint(opts.cache, {
      vocab = m.vocab, vocab_padded = m.vocab_padded, ctx = m.ctx, layers = m.layers,
      heads = m.heads, dim = m.dim, micro = s.micro, tp = s.tp, sequence_parallel = s.sp,
      stage_layers = s.pp > 1 and blocks[r] or nil, family = m.family, kv_heads = m.kv_heads,
      ffn_dim = m.ffn_dim, tie_embeddings = m.tie_embeddings, moe = m.moe, ep = 1,
    })
    local E, El = m.moe.experts, m.moe.experts // s.ep
    local X = El * (fp1.param_floats - psi) // (E - El)
    local D, edp = psi - X, s.dp // s.ep
    ep_split = { D = D, X = X, edp = edp, dense_part = core.zero_padded(D, s.dp) // s.dp,
      expert_part = core.zero_padded(X, edp) // edp }
    part = ep_split.dense_part + ep_split.expert_part
  end
  local slots = state_slots[s.optimizer] or 2
  -- bf16 / fp16 (plugins/precision): the fp32 parameters (ZeRO's partition at every stage:
  -- zero_master.c below stage 3; under ep whole below stage 3, zero_ep.c) are
  -- the master copy beside a 16-bit compute copy of the whole table and the fp32 scratch it
  -- is widened through (fp.compute_params, fp.widen: the model's own gpt_precision.c
  -- layout); gradients, their buffers and the optimizer state stay fp32; the saved
  -- activations are the model's 16-bit layout (fp.activations, laid out for the precision)
  local half = s.precision == "bf16" or s.precision == "fp16"
  local pb = F32 -- bytes per parameter and gradient element in the fp32 buffers
  local mem = {
    params = ((s.zero == 3 or (half and s.zero >= 1 and not ep_split)) and part or psi) * pb,
    grads = ((s.zero >= 2 and not s.canonical) and part or psi) * pb,
    optimizer = slots * (s.zero >= 1 and part or psi) * F32,
    master = 0,
    activations = fp.activations,
    comm = 0, workspace = fp.host + fp.widen, optimizer_offloaded = 0, transient = 0,
  }
  -- ZeRO's staging (zero.c: the tail bucket, stage 3's second; stage 2 with accumulation:
  -- one receive slot per reduce-scatter in flight, at most 2 of one bucket's sub-block)
  if ep_split then
    -- zero_ep.c's one staging buffer of a bucket: touched up to the largest packed range
    -- gathered (an edp group of one gathers nothing)
    local function touched(K, n)
      if n < 2 then return 0 end
      local unit = 16 * n
      local want = math.max(unit, math.floor(s.bucket_mb * 1048576 / F32) // unit * unit)
      return math.min(core.zero_padded(K, n), want)
    end
    mem.comm = mem.comm + math.max(touched(ep_split.D, s.dp), touched(ep_split.X, ep_split.edp)) * F32
  elseif s.zero > 0 then
    local unit = 16 * s.dp
    mem.comm = mem.comm + unit * (s.zero == 3 and 2 or 1) * F32
    local bucket = math.max(unit, math.floor(s.bucket_mb * 1048576 / F32) // unit * unit)
    if s.zero >= 2 and not s.canonical and s.accum > 1 then
      -- zero_reduce_init: min(buckets, ZERO_SLOTS = 2) slots of the largest bucket's
      -- sub-block; stage 3 cuts its buckets at every unit (a block, the embeddings)
      local len, nb = math.min(bucket, psi), (psi + bucket - 1) // bucket
      if s.zero == 3 then
        local vp = m.vocab_padded or (m.vocab + 127) // 128 * 128
        len, nb = math.min(bucket, math.max(12 * m.dim * m.dim // s.tp + 13 * m.dim, vp * m.dim // s.tp + m.ctx * m.dim)), 2
      end
      mem.comm = mem.comm + math.min(2, nb) * len // s.dp * F32
    end
    -- the model's full-size buffer still backs stage 2's gradients and stage 3's
    -- parameters: pages of buckets not yet reduced (or units in use) are resident
    if s.zero >= 2 and not s.canonical then
      mem.transient = math.min(psi, 2 * bucket) * pb
    end
    if s.zero == 3 then
      local per_block = 12 * m.dim * m.dim // s.tp + 13 * m.dim
      local vp = m.vocab_padded or (m.vocab + 127) // 128 * 128
      mem.transient = mem.transient + math.min(psi, (vp * m.dim // s.tp + m.ctx * m.dim + 2 * per_block)) * pb
    end
  end
  -- the communicator's own staging: shm stages each message through SLOTS x chunk bytes per
  -- rank in a shared segment (plugins/comm/shm/shm.h), and a rank touches its own and
  -- reads its peers' slots: n x min(largest message, staging per rank) resident
  local staging = opts.staging_bytes or 0
  if staging > 0 then
    local bucket_b = math.min(psi * pb, math.floor(s.bucket_mb * 1048576))
    if s.zero == 3 then
      local vp = m.vocab_padded or (m.vocab + 127) // 128 * 128
      bucket_b = math.max(12 * m.dim * m.dim // s.tp + 13 * m.dim, (vp * m.dim // s.tp + m.ctx * m.dim)) * pb
    end
    if s.dp > 1 then mem.comm = mem.comm + s.dp * math.min(bucket_b, staging) end
    if s.tp > 1 then mem.comm = mem.comm + s.tp * math.min(s.micro * s.seq * m.dim * pb, staging) end
  end
  if s.dp > 1 then -- grad_sync: the loss blocks; canonical mode's gathered gradients
    mem.comm = mem.comm + s.dp * 8 + (s.canonical and s.dp * psi * F32 or 0)
  end
  mem.params_offloaded = 0
  if s.offload_params and s.zero == 3 then
    -- the partition lives in the offload (zero_params_store.c); each unit's gather reads
    -- its sub-blocks into a staging buffer of the unit's partition size, unmapped after
    local vp = m.vocab_padded or (m.vocab + 127) // 128 * 128
    local unit_floats = math.max(12 * m.dim * m.dim // s.tp + 13 * m.dim, vp * m.dim // s.tp + m.ctx * m.dim)
    mem.params_offloaded, mem.params = mem.params, 0
    mem.comm = mem.comm + core.zero_padded(math.min(psi, unit_floats), s.dp) // s.dp * pb
  end
  if s.offload == "disk" then
    local chunk = 64 * 1048576
    mem.optimizer_offloaded = mem.optimizer
    -- (3 chunk buffers; with the parameters offloaded each chunk carries them after the state)
    mem.optimizer = math.min(mem.optimizer + mem.params_offloaded, 3 * chunk)
  elseif s.offload == "host" then
    mem.optimizer_offloaded, mem.optimizer = mem.optimizer, 0
  end
  if half then -- session.c's loom_session_memory: master = the fp32 parameters held here
    mem.master, mem.params = mem.params, fp.compute_params
  end
  -- a distillation teacher (session.c: teacher_params, teacher_grads, teacher_activations)
  local tmem = teacher_memory(s, r, opts.cache)
  mem.teacher_params, mem.teacher_grads, mem.teacher_activations = tmem.params, tmem.grads, tmem.activations
  mem.distill = distill_memory(t, s, r, st.slots)
  mem.teacher = tmem.params + tmem.grads + tmem.activations + mem.distill
  mem.model_states = mem.params + mem.grads + mem.optimizer + mem.master
  mem.total = mem.model_states + mem.activations + mem.comm + mem.workspace + mem.transient + mem.teacher
  return mem, psi, fp, ep_split
end

-- Interpolate a measured rate over log(size): points {{size, rate}, ...} sorted by size.
local function rate_at(points, size)
  if #points == 0 then return nil end
  if size <= points[1][1] then return points[1][2] end
  for i = 2, #points do
    local a, b = points[i - 1], points[i]
    if size <= b[1] then
      local f = (math.log(size) - math.log(a[1])) / (math.log(b[1]) - math.log(a[1]))
      return a[2] + f * (b[2] - a[2])
    end
  end
  return points[#points][2]
end
plan.rate_at = rate_at

-- The device's rates for this layout's threads per rank (a CPU profile keeps one table
-- per thread count; ranks sharing the cores slow each other: `share`).
local function device_rates(machine, s, ranks_here)
  local d = machine.device
  local threads = s.threads > 0 and s.threads or (d.cores or 1)
  if d.rates and d.rates[s.precision] then return d.rates[s.precision], 1 end
  local best, key = nil, nil
  for k in pairs(d.rates or {}) do
    local n = tonumber(k)
    if not best or math.abs(n - threads) < math.abs(best - threads) then best, key = n, k end
  end
  local r = d.rates and d.rates[key] or d
  local share = 1 -- (a cpu-clock profile counts each process's own CPU time: no sharing)
  if d.cores and machine.clock ~= "cpu" then share = math.max(1, ranks_here * math.min(threads, d.cores) / d.cores) end
  -- on a CPU clock, two or more ranks here: the rates measured with the node's cores all
  -- running the bench at once (plan_machine.bench_device_shared), where the profile has them
  local shared = machine.clock == "cpu" and ranks_here > 1 and d.rates_shared and d.rates_shared[key]
  return shared or r, share, shared and true or false
end

-- Seconds for a GEMM (M,K)x(K,N), forward or backward (both input and weight gradients).
local function gemm_s(r, M, K, N, bwd, fwd_pts)
  local flops = 2 * M * K * N * (bwd and 2 or 1)
  local pts = bwd and r.gemm_bwd or fwd_pts or r.gemm_fwd
  return flops / rate_at(pts, flops), flops
end

local function attention_s(r, B, T, Cl, bwd)
  local flops = 4 * B * T * T * Cl * (bwd and 2 or 1) -- QK^T and AV (x2 for backward)
  return flops / rate_at(bwd and r.attention_bwd or r.attention_fwd, flops), flops
end

-- One collective's seconds: latency + bytes x bus factor / bus bandwidth (nccl-tests'
-- busbw convention, which `loom bench comm` reports), on the link the group spans.
local function coll_s(machine, kind, bytes, n, link)
  if n < 2 or bytes <= 0 then return 0 end
  local l = machine.links[link] or machine.links.intra
  local c = l[kind] or (kind == "alltoall" and l.allgather) or l
  local busf = kind == "allreduce" and 2 * (n - 1) / n or kind == "p2p" and 1 or (n - 1) / n
  return (c.latency_s or 0) + bytes * busf / c.busbw
end
plan.coll_s = coll_s

-- Which link a group of `n` ranks whose members are `stride` apart in rank order spans.
local function link_of(n, stride, per_node)
  return (n * stride <= per_node) and "intra" or "inter"
end

-- An MoE block's routing (docs/MOE.md): k choices for each of R rows, at most
-- ceil(k R / E c) rows per expert (c = 0: dropless); the choices assumed balanced over the
-- experts, so a rank's experts (E / ep of them) take `kept` rows in all, ep x kept / E each.
local function moe_rows(moe, R, ep)
  local A = moe.top_k * R
  local c = moe.capacity_factor or 1.25
  local kept = c > 0 and math.min(A, moe.experts * math.ceil(A / moe.experts * c)) or A
  local El = moe.experts // ep
  return kept, El, math.ceil(kept * ep / moe.experts)
end
plan.moe_rows = moe_rows

local function is_moe_block(m, l) return m.moe and m.moe.experts > 0 and (l + 1) % (m.moe.every or 1) == 0 end

-- Compute seconds of one micro-batch on a stage holding the blocks `list` (head flag).
-- An MoE block's MLP is its router's GEMM, one fc and proj GEMM per expert over the rows
-- it received, and the rows gathered and scattered back (bytes); under ep its four
-- all-to-alls (dispatch and return, forward and backward) are counted apart: ep_micro.
local function stage_compute_of(t, s, r, list, head, frozen, cache)
  local m = t.model
  local C, R, T, B = m.dim, s.micro * s.seq, s.seq, s.micro
  local Cl, Fl = C // s.tp, 4 * C // s.tp
  local vp = m.vocab_padded or (m.vocab + 127) // 128 * 128
  -- llama blocks (core/model/gpt_llama.c): one fused (Cl + 2 KVl) x C product for q, k, v
  -- (grouped-query attention), SwiGLU's fused gate-and-up (2 Fl x C) and down (Fl x C)
  -- products, RMSNorm, rotary positions on q and k, no biases
  local llama = m.family == "llama"
  local KVl = llama and (m.kv_heads or m.heads) * (C // m.heads) // s.tp or Cl
  local FFl = llama and (m.ffn_dim or 4 * C) // s.tp or Fl
  -- bf16 on a profile with the 16-bit path's figures (plan_machine.bench_device): the
  -- forward products at matmul_forward_dt's rates (vdpbf16ps, packing the widened weight
  -- back to bf16), backward at sgemm's, and the conversions around them (h16, below)
  local h16 = s.precision == "bf16" and r.bf16 or nil
  local fwd_pts = h16 and h16.gemm_fwd or nil
  local f, b, w, flops = 0, 0, 0, 0
  -- (every block of a stage has the same shapes: each shape's times are looked up in the
  -- profile's tables once a call, with a search's cache once a search; the sums stay the
  -- same, in the same order)
  local memo = cache and nested(cache, "gemm", r, fwd_pts or false) or {}
  local function gemm(Mx, K, N, times)
    local g = nested(memo, Mx, K, N)
    if not g[3] then
      local tf, ff = gemm_s(r, Mx, K, N, false, fwd_pts)
      local tb, fb = gemm_s(r, Mx, K, N, true)
      g[1], g[2], g[3] = tf, tb, ff + fb
    end
    local n = times or 1
    f, b, w, flops = f + n * g[1], b + n * g[2] / 2, w + n * g[2] / 2, flops + n * g[3]
  end
  -- attention at this stage's shape, the same for every block
  local at = nested(memo, "attention", B, T)
  local a = at[Cl]
  if not a then
    local af, aff = attention_s(r, B, T, Cl, false)
    local ab, afb = attention_s(r, B, T, Cl, true)
    a = { af, aff, ab, afb }
    at[Cl] = a
  end
  local af, aff, ab, afb = a[1], a[2], a[3], a[4]
  local blk_f, moe_blocks = 0, 0
  for _, l in ipairs(list) do
    local f0 = f
    if llama then gemm(R, C, Cl + 2 * KVl) else gemm(R, C, 3 * Cl) end
    gemm(R, Cl, C)
    local mlp_rows, moe_f = R, 0
    if is_moe_block(m, l) then
      moe_blocks = moe_blocks + 1
      local kept, El, rows_e = moe_rows(m.moe, R, s.ep)
      local fm = f
      gemm(R, C, m.moe.experts) -- the router (replicated)
      if llama then gemm(rows_e, C, 2 * FFl, El); gemm(rows_e, FFl, C, El)
      else gemm(rows_e, C, Fl, El); gemm(rows_e, Fl, C, El) end
      local rows_b = F32 * C * (2 * m.moe.top_k * R + 3 * kept) -- gather, gate and add back
      f, b = f + rows_b / r.bandwidth, b + 2 * rows_b / r.bandwidth
      mlp_rows, moe_f = kept, f - fm -- (a recomputed MoE block keeps its expert work)
    elseif llama then
      gemm(R, C, 2 * FFl); gemm(R, FFl, C)
    else
      gemm(R, C, Fl); gemm(R, Fl, C)
    end
    f, b, flops = f + af, b + ab, flops + aff + afb
    -- element-wise passes: GELU and the 2 layernorms at their measured cost per element
    -- where the profile has one (their cost is arithmetic: tanh, rsqrt), else as bytes;
    -- the residuals and bias adds as bytes read + written at the memory bandwidth
    local pe = r.per_element
    local ew = F32 * R * (2 * 3 * C + 2 * (3 * Cl + Fl + 2 * C))
    if llama then
      -- SwiGLU's silu x up over Fl (at GELU's measured cost per element: both a
      -- transcendental and a few flops), RMSNorm at layernorm's, rotary positions on q and
      -- k and the residuals as bytes (no bias adds)
      ew = F32 * R * (2 * 3 * C + 2 * 2 * (Cl + KVl))
      if pe then
        f = f + mlp_rows * FFl * pe.gelu_fwd + 2 * R * C * pe.layernorm_fwd
        b = b + mlp_rows * FFl * pe.gelu_bwd + 2 * R * C * pe.layernorm_bwd
      else
        ew = ew + F32 * R * (2 * 2 * C) + F32 * mlp_rows * 3 * FFl
      end
    elseif pe then
      f = f + mlp_rows * Fl * pe.gelu_fwd + 2 * R * C * pe.layernorm_fwd
      b = b + mlp_rows * Fl * pe.gelu_bwd + 2 * R * C * pe.layernorm_bwd
    else
      ew = ew + F32 * R * (2 * 2 * C) + F32 * mlp_rows * 2 * Fl
    end
    f, b = f + ew / r.bandwidth, b + 2 * ew / r.bandwidth
    if h16 then
      -- gpt.c / gpt_llama.c under bf16: every stored activation rounded where written
      -- (round_to: six of Rl x C, qkv (llama's twice: before and after the rotation), the
      -- attention output, fc's and GELU's / SwiGLU's outputs); what backward reads narrowed
      -- after the forward and widened before the backward (gpt_act16_sizes: none under full
      -- recomputation, fch_gelu not under selective); the block's weights widened from the
      -- 16-bit copy at the top of each pass (gpt_widen_block)
      local Rl = s.sp and R // s.tp or R
      local qkv_w, fc_w = llama and Cl + 2 * KVl or 3 * Cl, llama and 2 * FFl or Fl
      local rounds = 6 * Rl * C + R * (qkv_w * (llama and 2 or 1) + Cl + fc_w + FFl)
      local stored = s.recompute == "full" and 0
        or 3 * Rl * C + R * (qkv_w + Cl + fc_w + (s.recompute == "selective" and 0 or FFl))
      local wblk = C * qkv_w + Cl * C + C * fc_w + FFl * C
      local pe16 = h16.per_element
      f = f + rounds * pe16.round + stored * pe16.narrow + wblk * pe16.widen
      b = b + stored * pe16.widen + wblk * pe16.widen
        + (s.recompute == "selective" and R * FFl * pe16.round or 0)
    end
    blk_f = blk_f + (f - f0) - moe_f
  end
  local nb = #list
  if head then
    gemm(R, C, vp // s.tp)
    -- max, sum of exps, target, finish (read + write); a frozen teacher's forward has no
    -- targets: its logits only (gpt.c)
    local ce = frozen and 0 or F32 * R * (vp // s.tp) * 5
    f, b = f + ce / r.bandwidth, b + ce / r.bandwidth
    if h16 then -- the final norm's output and the logits rounded; backward's input gradient
      -- reads the head's weight widened band by band (gpt_precision.c)
      local pe16 = h16.per_element
      f = f + (R * C + R * (vp // s.tp)) * pe16.round
      b = b + (vp // s.tp) * C * pe16.widen
    end
  end
  -- recomputation reruns forward work in backward
  local extra = 0
  if s.recompute == "full" then extra = blk_f
  elseif type(s.recompute) == "table" then extra = blk_f * #s.recompute / math.max(1, t.model.layers)
  elseif s.recompute == "selective" then
    local g = r.per_element and R * FFl * r.per_element.gelu_fwd or F32 * R * 2 * FFl / r.bandwidth
    for _ = 1, nb do extra = extra + af + g end
  end
  return { fwd = f, bwd_input = b + extra, bwd_weight = w, flops = flops, moe_blocks = moe_blocks }
end

-- (with a search's cache, once per stage shape and rates: what stage_compute_of reads of
-- the model, the layout and the stage; a fresh table each time, the caller adds to it.
-- The key lists every field of t.model and s that stage_compute_of reads: a field it comes
-- to read must join the key, or layouts that differ in it would share one stage's times)
local function stage_compute(t, s, r, list, head, frozen, cache)
  if not cache then return stage_compute_of(t, s, r, list, head, frozen) end
  local key = layout_key("compute", t, s, function()
    local m = t.model
    return { m.dim, m.vocab, m.vocab_padded, m.family, m.kv_heads, m.heads, m.ffn_dim, m.layers,
      m.moe, s.micro, s.seq, s.tp, s.ep, s.precision, s.sp, s.recompute }
  end) .. key_of { list, head or false, frozen or false }
  local by_r = cache.compute or {}
  cache.compute = by_r
  local memo = by_r[r] or {}
  by_r[r] = memo
  local c = memo[key]
  if not c then
    c = stage_compute_of(t, s, r, list, head, frozen, cache)
    memo[key] = c
  end
  return { fwd = c.fwd, bwd_input = c.bwd_input, bwd_weight = c.bwd_weight, flops = c.flops, moe_blocks = c.moe_blocks }
end

-- A distillation teacher's time per micro-batch on each stage (1-based), as the session
-- runs it (session.c, kd_group.c; docs/DISTILL.md): its forward by stage_compute at its
-- own shape (frozen: no backward, no loss pass, fp32), its blocks where teacher_memory puts
-- them; teacher.tp = mesh.tp: 1/tp of it and 2 all-reduces of B T x C_t per block, its
-- rows gathered whole; teacher.tp across dp ranks: teacher.tp forwards (each member's
-- micro-batch) of 1/teacher.tp each, and each one's gather. A cache runs no teacher: its
-- record (16 + 8 B T k bytes, k from the file's header) read and hashed, the dense rows
-- (B T x V) written, as bytes. Then on the last stage the terms: the logit term (loom_kd_rows
-- over B T x V, on the whole rows under tp: the profile's measured kd_logits per element,
-- and the gradient blended into the logits as bytes), each mapped block's hidden term (R x
-- C x C_t at kd_hidden) and attention term (B x NH/tp x T x T at kd_attention).
-- Returns per stage { teacher = s, terms = s } and what the assumption line says.
local function teacher_time(t, s, r, share, machine, per_node, ranks_here, cache)
  local kd = s.kd
  local out = { stages = {}, notes = {} }
  for k = 1, s.pp do out.stages[k] = { teacher = 0, terms = 0 } end
  if not kd then return out end
  local m = t.model
  local B, T, V = s.micro, s.seq, m.vocab
  local bt = B * T
  local pe = r.per_element or {}
  local vps = m.vocab_padded or (V + 127) // 128 * 128
  local last = out.stages[s.pp]
  if kd.kd_cache then
    local k, f = V, io.open(kd.kd_cache, "rb")
    if f then
      local head = f:read(24)
      f:close()
      if head and #head == 24 and head:sub(1, 8) == "LOOMKDC1" then k = string.unpack("<i4", head, 21) end
    end
    last.teacher = (2 * (16 + 8 * bt * k) + F32 * bt * V) / r.bandwidth * share
    out.notes[#out.notes + 1] = string.format("reading its record (k = %d%s) and writing its dense rows as bytes", k,
      f and "" or ", the file not there: k = vocab")
  else
    local tm = kd.teacher
    local ttp, tpp = kd.kd_teacher_tp or 1, kd.kd_teacher_pp or 1
    local group = ttp > 1 and s.tp == 1 -- kd_group.c: teacher.tp across dp ranks
    local forwards = group and ttp or 1
    local ts = { micro = B, seq = T, tp = ttp, sp = false, precision = "fp32", ep = 1, recompute = "none",
      threads = s.threads }
    local tt = { model = tm }
    -- (never 16-bit: a profile with rates per precision gives the teacher its fp32 ones)
    local rt = device_rates(machine, ts, ranks_here)
    local link = link_of(ttp, 1, per_node) -- (its group's ranks adjacent: tp's, or dp's at mesh.tp = 1)
    local vpt = tm.vocab_padded or (tm.vocab + 127) // 128 * 128
    for k = 1, s.pp do
      local list
      if tpp > 1 then
        list = teacher_stage_blocks(tm.layers, tpp, k)
      elseif k == s.pp then
        list = {}
        for l = 0, tm.layers - 1 do list[#list + 1] = l end
      end
      if list then
        local f = stage_compute(tt, ts, rt, list, k == s.pp, true, cache).fwd
        if k == 1 or tpp == 1 then f = f + F32 * bt * tm.dim * 3 / rt.bandwidth end -- the embedding lookup
        local x = 0
        if ttp > 1 then
          x = 2 * #list * coll_s(machine, "allreduce", bt * tm.dim * F32, ttp, link)
            + (k == s.pp and coll_s(machine, "allgather", bt * vpt * F32, ttp, link) or 0)
        end
        out.stages[k].teacher = forwards * (f * share + x)
      end
    end
    out.notes[#out.notes + 1] = string.format("its forward (%s%s) as the student's is costed, forward only",
      tpp > 1 and string.format("its own pipeline over the %d stages before the step", tpp)
        or s.pp > 1 and "on the last stage before the step" or "each micro-batch",
      group and string.format(", %d forwards of 1/%d a micro-batch across dp ranks", ttp, ttp) or "")
  end
  -- the terms on the last stage, per micro-batch
  local x = (pe.kd_logits and bt * V * pe.kd_logits or 8 * F32 * bt * V / r.bandwidth)
    + 3 * F32 * bt * (vps // s.tp) / r.bandwidth -- the blend: logits = (1 - a) logits + grad
  if s.tp > 1 then x = x + coll_s(machine, "allgather", bt * vps * F32, s.tp, link_of(s.tp, 1, per_node)) / share end
  local st = kd_blocks(kd)
  if st and kd.teacher then
    local C, Ct = m.dim, kd.teacher.dim
    x = x + #st * (pe.kd_hidden and bt * C * Ct * pe.kd_hidden or 6 * bt * C * Ct / rate_at(r.gemm_fwd, 2 * bt * C * Ct))
    if kd.kd_attention then
      local n = B * (m.heads // s.tp) * T * T
      x = x + #st * (pe.kd_attention and n * pe.kd_attention or 3 * F32 * n / r.bandwidth)
    end
  end
  last.terms = x * share
  out.notes[#out.notes + 1] = pe.kd_logits and "the terms at the profile's measured cost per element"
    or "the terms as bytes (the profile has no kd figures: loom plan --calibrate measures them)"
  return out
end

-- The model's parameters without the vocabulary padding: what MFU counts as N, and what
-- the run's own MFU counts (loom_gpt_num_params, metrics.lua), from the model's own table
-- (core.footprint of the whole model on one rank: llama's GQA, SwiGLU, untied head and
-- experts included). (Before this a GPT-2 formula was used for every family: the llama
-- probe at kv_heads 2, ffn_dim 256 was counted 834 304 for its 656 512.)
function plan.params(m, cache)
  return footprint(cache, {
    vocab = m.vocab, vocab_padded = m.vocab_padded, ctx = m.ctx, layers = m.layers,
    heads = m.heads, dim = m.dim, micro = 1, tp = 1, family = m.family, kv_heads = m.kv_heads,
    ffn_dim = m.ffn_dim, tie_embeddings = m.tie_embeddings, moe = m.moe, ep = 1,
  }).num_params
end

-- The plan of one layout: plan.layout(recipe table, machine profile [, opts]).
function plan.layout(t, machine, opts)
  opts = opts or {}
  local s = shape_of(t)
  local m = t.model
  local per_node = opts.devices_per_node or machine.devices_per_node or 1
  local ranks = s.dp * s.tp * s.pp
  local cache = opts.cache -- (a search's: see `cached`)
  local blocks = s.pp > 1 and stage_blocks(m, s, cache) or { all_blocks(m.layers, cache) }
  local r, share, shared = device_rates(machine, s, math.min(ranks, per_node))
  local assumptions = {}
  local function assume(x) assumptions[#assumptions + 1] = x end
  -- compute per micro-batch, per stage (the slowest stage paces the pipeline)
  local comp = {}
  for k = 1, s.pp do
    comp[k] = stage_compute(t, s, r, blocks[k], k == s.pp, false, cache)
    if k == 1 then -- the embedding lookup and its gradient: element-wise
      local e = F32 * s.micro * s.seq * m.dim * 3
      comp[k].fwd, comp[k].bwd_input = comp[k].fwd + e / r.bandwidth, comp[k].bwd_input + e / r.bandwidth
      if s.precision == "bf16" and r.bf16 then -- the rows widened from the 16-bit copy, rounded
        local pe16, rows = r.bf16.per_element, s.micro * s.seq * m.dim
        comp[k].fwd = comp[k].fwd + rows * (pe16.widen + pe16.round)
      end
    end
    for _, key in ipairs { "fwd", "bwd_input", "bwd_weight" } do comp[k][key] = comp[k][key] * share end
  end
  -- distillation (teacher_time): the terms in the last stage's head forward; the teacher's
  -- forward per micro-batch on each stage that runs a part of it (kd_stage), placed below
  local kdt = teacher_time(t, s, r, share, machine, per_node, math.min(ranks, per_node), cache)
  comp[s.pp].fwd = comp[s.pp].fwd + kdt.stages[s.pp].terms
  -- tensor-parallel exchanges per micro-batch: 2 forward + 2 backward per block of R x C
  local R, C = s.micro * s.seq, m.dim
  -- (loom sends every message as fp32 whatever the precision: tp.c's exchanges,
  -- pipeline.c's sends, moe.c's rows, ZeRO's buckets; the dp gradients too unless
  -- { "bf16", reduce = "bf16" }. A profile with messages16 (the bundled GPU nodes: an
  -- assumption, as Megatron-LM sends them) sends them in 16 bits under bf16/fp16. Before
  -- this the plan sent 2 bytes an element under bf16 everywhere: the probe's dp = 2
  -- all-reduce costed at half its 3.3 MB)
  local wb = (machine.messages16 and s.precision ~= "fp32") and 2 or F32
  local act = R * C * wb
  local tp_link = link_of(s.tp, 1, per_node)
  local tp_kind = s.sp and "reduce_scatter" or "allreduce"
  local tp_one = coll_s(machine, tp_kind, act, s.tp, tp_link) + (s.sp and coll_s(machine, "allgather", act, s.tp, tp_link) or 0)
  local tp_micro = {}
  for k = 1, s.pp do tp_micro[k] = s.tp > 1 and 4 * #blocks[k] * (s.sp and tp_one / 2 or tp_one) or 0 end
  -- expert parallelism (docs/MOE.md): per MoE block and micro-batch the kept rows go to
  -- their experts' ranks and come back (all-to-all-v of kept x C), forward and again in
  -- backward, each dispatch after an all-to-all of the counts; the alltoall figures are
  -- the profile's, else its allgather's (the same (n-1)/n of each rank's bytes moved)
  local ep_micro, ep_one = {}, 0
  if s.ep > 1 and m.moe then
    local kept = moe_rows(m.moe, R, s.ep)
    local ep_link = link_of(s.ep, s.tp, per_node)
    ep_one = 4 * coll_s(machine, "alltoall", kept * C * wb, s.ep, ep_link)
      + 2 * coll_s(machine, "alltoall", 8 * s.ep, s.ep, ep_link)
  end
  local xm = {} -- each stage's exchanges per micro-batch inside its passes: tp's and ep's
  for k = 1, s.pp do ep_micro[k] = comp[k].moe_blocks * ep_one; xm[k] = tp_micro[k] + ep_micro[k] end
  -- the stage costs the schedule is simulated with
  local stage_s, mem, psi = {}, {}, {}
  local facts
  local slow = { fwd = 0, bwd_input = 0, bwd_weight = 0 }
  for k = 1, s.pp do
    local c = comp[k]
    slow.fwd = math.max(slow.fwd, c.fwd + xm[k] / 2)
    slow.bwd_input = math.max(slow.bwd_input, c.bwd_input + xm[k] / 2)
    slow.bwd_weight = math.max(slow.bwd_weight, c.bwd_weight)
  end
  local p2p = s.pp > 1 and coll_s(machine, "p2p", act, 2, link_of(2, s.dp * s.tp, per_node)) or 0
  local pipe_s, bubble_s, bubble = 0, 0, 0
  if s.pp > 1 then
    facts = schedule_facts(s, { fwd = slow.fwd / s.chunks, bwd_input = slow.bwd_input / s.chunks,
      bwd_weight = slow.bwd_weight / s.chunks, latency = p2p }, cache)
    pipe_s = facts.sim.makespan
    local busy = 0
    for k = 1, s.pp do busy = math.max(busy, facts.sim.busy[k]) end
    bubble_s = pipe_s - busy
    bubble = facts.sim.bubble
    assume(string.format("pipeline: stages costed as the slowest (F %.3g ms, B %.3g ms, W %.3g ms per micro-batch), p2p %.3g ms",
      slow.fwd * 1e3, slow.bwd_input * 1e3, slow.bwd_weight * 1e3, p2p * 1e3))
  else
    pipe_s = s.accum * (slow.fwd + slow.bwd_input + slow.bwd_weight)
  end
  -- the teacher's forward: one rank, inside each micro-batch; under pp before the
  -- student's pipeline runs the step (session.c distill_pipeline): on the last stage over
  -- the accum micro-batches while the others wait, or with teacher.pp its own pipeline of
  -- one micro-batch at a time per stage (fill and drain: accum + pp - 1 slots of its
  -- slowest stage), its activations crossing each boundary; the waits count as bubble
  local kd_busy, teacher_s = {}, 0
  for k = 1, s.pp do kd_busy[k] = s.accum * kdt.stages[k].teacher end
  if s.kd and (s.kd.kd_teacher_pp or 1) > 1 and s.pp > 1 then
    local slowest = 0
    for k = 1, s.pp do slowest = math.max(slowest, kdt.stages[k].teacher) end
    local tp2p = coll_s(machine, "p2p", s.micro * s.seq * s.kd.teacher.dim * F32, 2, link_of(2, s.dp * s.tp, per_node))
    teacher_s = (s.accum + s.pp - 1) * (slowest + tp2p)
    for k = 1, s.pp do kd_busy[k] = kd_busy[k] + s.accum * tp2p end
  else
    teacher_s = kd_busy[s.pp]
  end
  if teacher_s > 0 then
    local most = 0
    for k = 1, s.pp do most = math.max(most, kd_busy[k]) end
    pipe_s, bubble_s = pipe_s + teacher_s, bubble_s + (teacher_s - most)
  end
  local worst, ep_split, entries, att_fp = nil, {}, {}, nil
  for k = 1, s.pp do
    local fpk
    mem[k], psi[k], fpk, ep_split[k] = stage_memory(t, s, blocks, facts, k,
      { staging_bytes = (machine.links.intra or {}).staging_bytes_per_rank, cache = cache })
    entries[k] = fpk.entries or 0
    if k == 1 then att_fp = fpk end
    if not worst or mem[k].total > mem[worst].total then worst = k end
  end
  if s.cuda_attention then -- (the CUDA backend's rule: loom/plugin/cuda_attention.h)
    local T, hs = m.ctx, m.dim // m.heads
    assume(string.format("attention: %s (backend %s, LOOM_CUDA_ATTENTION=%s): each block's att %s, %d floats at micro %d x ctx %d%s",
      att_fp.att_fused and "the fused kernels" or "the batched path", t.backend, s.cuda_attention,
      att_fp.att_fused and "holds lse (B,NH,T) and out's copy (B,T,C)" or "holds the probabilities (B,NH,T,T)",
      att_fp.att_floats, s.micro, T,
      s.cuda_attention == "flash" and not att_fp.att_fused and string.format(
        " (flash keeps the batched path here: canonical mode, head size %d, or T not longer than a head%s)",
        hs, m.family == "llama" and (m.kv_heads or 0) > 0 and m.kv_heads < m.heads
          and ", or grouped-query attention off the tensor-core kernels: fp32, the head size, LOOM_CUDA_FLASH_TC=0" or "") or ""))
  end
  -- ZeRO 2/3 on host memory hand pages back to the OS and fault them in again every
  -- micro-batch (zero_reduce.c: a reduced gradient bucket; zero_params.c: a unit after
  -- each pass, gathered again before the next): the profile's measured cost per page
  -- (core.bench_refault: a gradient added into zeroed pages faults twice, a gather once)
  local refault, faults, pf = {}, {}, r.page_fault
  local disk = machine.disk -- (an offload file's measured read and write rates, if any)
  local eb = F32 -- (the gradients and ZeRO-3's gathered parameters are fp32 under bf16 too)
  for k = 1, s.pp do
    local x, n = 0, 0
    if pf and s.zero >= 2 then
      local pages = psi[k] * eb // pf.page
      if not s.canonical then x, n = pages * pf.accumulate_s, 2 * pages end
      if s.zero == 3 then x, n = x + 2 * pages * pf.write_s, n + 2 * pages end
      if s.zero == 3 and s.offload_params then
        -- each gather's staging of the unit's partition is mapped and unmapped again: its
        -- pages are written fresh on both passes, after a copy out of the offload (host:
        -- at the memory bandwidth; disk: pread from the file, at the profile's measured
        -- disk read rate where it has one, else as host memory)
        local part_b = core.zero_padded(psi[k], s.dp) // s.dp * eb
        local part_pages = part_b // pf.page
        -- where the profile measured that path itself (core.bench_bring: map, the reader
        -- thread's memcpy or pread, the two hand-offs, the unmap), per unit and per byte:
        -- the stage's units (its blocks, the embeddings on the first, the final norm on
        -- the last) on both passes
        local bring = s.offload == "disk" and disk and disk.bring or s.offload ~= "disk" and r.bring or nil
        if bring then
          local units = #blocks[k] + (k == 1 and 1 or 0) + (k == s.pp and 1 or 0)
          x = x + 2 * (units * bring.unit_s + part_b * bring.byte_s)
        else
          local copy = (s.offload == "disk" and disk) and 2 * part_b / disk.read_Bps or 2 * 2 * part_b / r.bandwidth
          x = x + 2 * part_pages * pf.write_s + copy
        end
        n = n + 2 * part_pages
      end
    end
    refault[k], faults[k] = s.accum * x * share, s.accum * n
  end
  local refault_s = 0
  for k = 1, s.pp do refault_s = math.max(refault_s, refault[k]) end
  if s.offload_params then
    local bring = s.offload == "disk" and disk and disk.bring or s.offload ~= "disk" and r.bring or nil
    assume(bring and string.format("ZeRO-3 parameters in the %s offload: each gather maps its unit's partition, has the reader thread %s it in and unmaps it, at the profile's measured %.3g us a unit + %.3g us a page (core.bench_bring)",
        s.offload, s.offload == "disk" and "pread" or "copy", bring.unit_s * 1e6, bring.byte_s * 4096 * 1e6)
      or string.format("ZeRO-3 parameters in the %s offload: each gather copies its unit's partition out (%s) into fresh pages",
      s.offload, s.offload ~= "disk" and "memory bandwidth" or disk and "the profile's disk read rate"
        or "as host memory: the profile has no disk figures (loom plan --calibrate measures them)"))
  end
  -- a disk offload (offload_disk.c): every step its I/O thread reads each chunk of the
  -- state (and the parameters it carries) from the file and writes it back, through the
  -- page cache; on a CPU clock that thread's copies are the process's time, on a wall
  -- clock they overlap the chunks' update but for the first read
  local io = {}
  for k = 1, s.pp do
    io[k] = 0
    if s.offload == "disk" and disk then
      local b = mem[k].optimizer_offloaded + mem[k].params_offloaded
      -- one pread and one pwrite per piece and slot (and the piece's parameters): a piece
      -- is a table entry's share of the partition (offload_disk.c io_chunk); each call's
      -- own cost (core.bench_disk's call_s) matters where entries are small
      local slots = state_slots[s.optimizer] or 2
      local pieces = s.zero > 0 and entries[k] // s.dp + 1 or entries[k]
      local calls = 2 * pieces * (slots + (s.offload_params and 1 or 0))
      local rd, wr = disk.read_Bps, disk.write_Bps
      if disk.sizes and #disk.sizes > 0 then -- at the bytes this stage moves (older profiles: 16 MiB's)
        local rp, wp = {}, {}
        for i, z in ipairs(disk.sizes) do rp[i], wp[i] = { z.bytes, z.read_Bps }, { z.bytes, z.write_Bps } end
        rd, wr = rate_at(rp, b), rate_at(wp, b)
      end
      io[k] = b / rd + b / wr + calls * (disk.call_s or 0)
    end
  end
  if s.offload == "disk" then
    assume(disk and string.format("disk offload: the state%s read and written every step at %.3g / %.3g GB/s (%s, in %s; a state larger than the page cache would go at the device's speed, not measured)",
      s.offload_params and " and parameters" or "", disk.read_Bps / 1e9, disk.write_Bps / 1e9, disk.source or "the profile's", disk.dir or "?")
      or "disk offload: the profile has no disk figures (loom plan --calibrate measures them): the file's I/O not costed")
  end
  if refault_s > 0 then
    assume(string.format("ZeRO-%d returns pages to the OS and faults them back every micro-batch: %.3g us a page (gradient), %.3g us (gather), measured",
      s.zero, pf.accumulate_s * 1e6, pf.write_s * 1e6))
  end
  -- data-parallel exchanges per step, on the largest stage's table
  local P = psi[worst]
  -- the gradients reduced as fp32 but with { "bf16", reduce = "bf16" } (zero <= 1: the dp
  -- strategy's bucket all-reduce); ZeRO's gathers of the stepped parameters are fp32
  local eb2 = wb
  local gred = (s.reduce16 and s.zero <= 1) and 2 or wb
  local experts_here = 0 -- under ep: this rank's expert floats, reduced over edp, not dp
  if s.ep > 1 and m.moe then
    experts_here = ep_split[worst] and ep_split[worst].X -- (exact: the table's)
      or comp[worst].moe_blocks * (m.moe.experts // s.ep) * (8 * m.dim * m.dim // s.tp + 4 * m.dim // s.tp + m.dim)
  end
  local gb = (P - experts_here) * eb2
  local dp_link = link_of(s.dp, s.tp, per_node) -- ranks: tp fastest, then dp, then pp (dist.c)
  local comm = {}
  local function add(kind, group, secs, count) if secs > 0 then comm[#comm + 1] = { kind = kind, group = group, s = secs, count = count } end end
  if s.dp > 1 then
    if s.zero <= 1 or s.canonical then add("allreduce", "dp", coll_s(machine, "allreduce", gb // eb2 * gred, s.dp, dp_link), 1)
    else add("reduce_scatter", "dp", s.accum * coll_s(machine, "reduce_scatter", gb, s.dp, dp_link), s.accum) end
    if s.zero >= 1 and s.zero <= 2 then add("allgather", "dp", coll_s(machine, "allgather", gb, s.dp, dp_link), 1) end
    if s.zero == 3 then add("allgather", "dp", 2 * s.accum * coll_s(machine, "allgather", gb, s.dp, dp_link), 2 * s.accum) end
  end
  if experts_here > 0 and s.dp // s.ep > 1 then
    local edp_link = link_of(s.dp // s.ep, s.tp * s.ep, per_node)
    add("allreduce", "edp", coll_s(machine, "allreduce", experts_here * eb2, s.dp // s.ep, edp_link), 1)
    -- ZeRO-1 under ep: the experts' stepped partitions gathered back over edp (zero_ep.c)
    if s.zero == 1 then add("allgather", "edp", coll_s(machine, "allgather", experts_here * eb2, s.dp // s.ep, edp_link), 1) end
  end
  local tp_total, ep_total, x_total = 0, 0, 0
  for k = 1, s.pp do
    tp_total, ep_total = math.max(tp_total, tp_micro[k]), math.max(ep_total, ep_micro[k])
    x_total = math.max(x_total, xm[k])
  end
  if s.tp > 1 then add(tp_kind .. (s.sp and "+allgather" or ""), "tp", tp_total * s.accum, 4 * #blocks[worst] * s.accum) end
  if ep_total > 0 then add("alltoall-v", "ep", ep_total * s.accum, 6 * comp[worst].moe_blocks * s.accum) end
  if s.pp > 1 then add("send/recv", "pp", 2 * s.accum * p2p, 2 * s.accum) end
  -- overlap: the dp reduction runs during backward on a device whose communicator has its
  -- own engine (profile.overlap_dp); shm progresses only inside test/wait: not overlapped
  local dp_s = 0
  for _, c in ipairs(comm) do if c.group == "dp" or c.group == "edp" then dp_s = dp_s + c.s end end
  local exposed_dp = dp_s
  if machine.overlap_dp and s.dp > 1 then
    exposed_dp = math.max(0, dp_s - s.accum * slow.bwd_weight)
    assume("dp gradient reduction overlapped with the last micro-batch's backward weight gradients (device communicator with its own engine)")
  end
  -- optimizer: AdamW reads p, g, m, v and writes p, m, v (28 bytes per element stepped),
  -- the norm reads g, zero_grad writes it (a profile's measured grad_pass: the norm, the
  -- non-finite check and zeroing, over the partition from stage 2 on, zero_reduce.c)
  local stepped = ep_split[worst] and ep_split[worst].dense_part + ep_split[worst].expert_part
    or s.zero >= 1 and core.zero_padded(P, s.dp) // s.dp or P
  local adam = r.per_element and r.per_element.adamw
  local gpass = r.per_element and r.per_element.grad_pass -- the norm, the non-finite check, zeroing
  local opt_s = ((adam and adam * stepped or 28 * stepped / r.bandwidth) + (gpass and gpass * (s.zero >= 2 and stepped or P) or 8 * P / r.bandwidth)) * share
  local io_s = 0 -- the disk offload's I/O per step (the largest stage's)
  if s.offload == "disk" and disk then
    local worst_io = 0
    for k = 1, s.pp do worst_io = math.max(worst_io, io[k]) end
    if machine.clock == "cpu" then io_s = worst_io
    else io_s = math.max(0, worst_io - opt_s) + math.min(mem[worst].optimizer_offloaded + mem[worst].params_offloaded, 64 * 1048576) / disk.read_Bps end
    for k = 1, s.pp do io[k] = machine.clock == "cpu" and io[k] or io_s end
  end
  local compute_s = s.pp > 1 and (pipe_s - bubble_s) or pipe_s
  -- bf16: the 16-bit copy narrowed from the fp32 parameters after each step (gpt_w16_refresh),
  -- under ZeRO-3 unit by unit after each of its gathers, two a micro-batch (gpt_w16_unit)
  local w16, w16_s = {}, 0
  for k = 1, s.pp do
    w16[k] = 0
    if s.precision == "bf16" and r.bf16 then
      w16[k] = (s.zero == 3 and 2 * s.accum or 1) * psi[k] * r.bf16.per_element.narrow * share
    end
    w16_s = math.max(w16_s, w16[k])
  end
  local step_s = pipe_s + exposed_dp + opt_s + refault_s + io_s + w16_s + (s.pp > 1 and 0 or x_total * s.accum)
  if s.pp > 1 then compute_s = compute_s - x_total * s.accum end
  local tokens = s.micro * s.seq * s.accum * s.dp
  local flops_per_token = 6 * (opts.params or plan.params(m, cache)) + 6 * m.layers * m.dim * s.seq
  local peak = machine.device.peak_flops and (machine.device.peak_flops[s.precision] or machine.device.peak_flops.fp32)
  local mfu = peak and flops_per_token > 0 and flops_per_token * tokens / step_s / (peak * ranks) or nil
  assume(string.format("GEMM and attention rates: %s%s", r.source or machine.device.source or "the profile's table",
    shared and string.format(" (each rank's, measured with %d processes at once)", machine.device.cores or 2) or ""))
  assume(string.format("element-wise passes at %.3g GB/s", r.bandwidth / 1e9))
  if share > 1 then assume(string.format("%d ranks x %s threads share %d cores: compute x %.2f", math.min(ranks, per_node),
    s.threads > 0 and tostring(s.threads) or "all", machine.device.cores, share)) end
  if s.precision ~= "fp32" then
    assume(s.precision .. ": memory from the model's own 16-bit layout (a 2-byte compute copy of the weights and its fp32 widening scratch, the fp32 parameters as master, fp32 gradients and state, 16-bit saved activations); time: " .. (machine.messages16 and "16-bit messages (the profile's messages16 assumption; loom's CPU path sends fp32)" or "fp32 messages (loom widens before it sends; the dp gradients bf16 with reduce = \"bf16\")") .. ", compute " .. ((machine.device.rates or {})[s.precision] and "at the profile's " .. s.precision .. " rates"
      or r.bf16 and s.precision == "bf16" and "with the 16-bit path's measured forward products and conversions"
      or "at the fp32 rates (the profile has no " .. s.precision .. " figures)"))
  end
  if m.family == "llama" then
    assume("llama blocks: memory from the model's own llama table and layout; time: the fused qkv product at kv_heads' width, SwiGLU's gate-and-up and down products at ffn_dim, SwiGLU's element-wise step at GELU's measured cost per element and RMSNorm at layernorm's (not calibrated apart), rotary positions as bytes")
  end
  if m.moe and m.moe.experts > 0 then
    local kept = moe_rows(m.moe, s.micro * s.seq, s.ep)
    assume(string.format("MoE: %d experts, top-%d, the choices balanced over the experts: %d of %d rows kept per micro-batch (capacity factor %g); routing on the host not costed",
      m.moe.experts, m.moe.top_k, kept, m.moe.top_k * s.micro * s.seq, m.moe.capacity_factor or 1.25))
    if s.ep > 1 and not (machine.links.intra or {}).alltoall then
      assume("ep all-to-all-v at the profile's allgather latency and bus bandwidth (it has no alltoall figures)")
    end
    if s.ep > 1 and s.canonical then
      assume("canonical ep's per-source expert gradient sums (session_ep.c) not counted in memory")
    end
  end
  if s.kd then
    local tm = s.kd.teacher
    local timed = "; step time: " .. table.concat(kdt.notes, "; ") .. " (docs/PLAN.md)"
    assume(s.kd.kd_cache and "teacher: a cache (loom distill-cache): no teacher model here; its dense rows counted, its record buffer (8 B T k + 16 bytes) not" .. timed
      or string.format("teacher: %s (L=%d C=%d ctx=%d), fp32 parameters (frozen: no gradient buffer), forward-only activations at micro %d x batch.seq %d (the sequences it is given, not its ctx)%s%s%s; the distillation buffers as allocated",
        s.kd.teacher_checkpoint or s.kd.teacher_init or "?", tm.layers, tm.dim, tm.ctx, s.micro, s.seq,
        (s.kd.kd_teacher_tp or 1) > 1 and string.format(", split by teacher.tp = %d", s.kd.kd_teacher_tp) or "",
        (s.kd.kd_teacher_pp or 1) > 1 and string.format(", its blocks over the %d stages", s.kd.kd_teacher_pp)
          or s.pp > 1 and ", on the last stage only" or "",
        s.kd.kd_attention and s.cuda_attention == "flash" and ", the mapped blocks on the batched path (teacher.attention)" or "") .. timed)
  end
  if s.zero_asked > 0 and s.zero == 0 then assume(string.format("zero=%d has nothing to partition with dp=1", s.zero_asked)) end
  -- each stage's own work per step (what its rank's CPU clock counts: its passes, its
  -- exchanges, the optimizer; not the waits of the schedule)
  local stage_busy = {}
  for k = 1, s.pp do
    local c = comp[k]
    stage_busy[k] = s.accum * (c.fwd + c.bwd_input + c.bwd_weight + xm[k]) + exposed_dp + opt_s + refault[k] + io[k] + w16[k]
      + (s.pp > 1 and 2 * s.accum * p2p or 0) + kd_busy[k]
  end
  local runtime = machine.runtime_bytes or machine.device.runtime_bytes or 0
  local rss_stage = {}
  for k = 1, s.pp do
    rss_stage[k] = mem[k].total + runtime
      + (s.offload == "host" and mem[k].optimizer_offloaded + mem[k].params_offloaded or 0)
  end
  return {
    rss_stage = rss_stage,
    layout = { dp = s.dp, tp = s.tp, pp = s.pp, ep = s.ep, zero = s.zero, micro = s.micro, accum = s.accum,
      schedule = s.schedule, chunks = s.chunks, recompute = s.recompute, offload = s.offload,
      offload_params = s.offload_params and s.zero == 3 or nil,
      sp = s.sp, precision = s.precision },
    memory = mem, peak_stage = worst, peak_bytes = mem[worst].total,
    rss = rss_stage[worst],
    time = {
      step_s = step_s, compute_s = compute_s, bubble_s = bubble_s, bubble = bubble,
      busy_s = step_s - bubble_s, -- what a rank's CPU clock sees: the bubble is waiting
      stage_busy_s = stage_busy,
      optimizer_s = opt_s, comm = comm, exposed_dp_s = exposed_dp, refault_s = refault_s,
      disk_io_s = io_s, -- a disk offload's reads and writes of its file (exposed, per step)
      w16_refresh_s = w16_s, -- bf16: the 16-bit weight copy narrowed from the fp32 parameters
      -- distillation: the teacher's forward on the step's path (a cache: reading its rows),
      -- and the terms (all the step's micro-batches, in the last stage's head forwards)
      teacher_s = teacher_s, kd_terms_s = s.accum * kdt.stages[s.pp].terms,
      page_faults = faults, -- per stage and step: what refault_s counts (a host profile's)
      per_micro = slow,
    },
    tokens_per_step = tokens, tokens_per_s = tokens / step_s, mfu = mfu,
    flops_per_token = flops_per_token, assumptions = assumptions, machine = machine.name,
  }
end

return plan
