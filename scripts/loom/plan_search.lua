-- loom.plan_search — `loom plan RECIPE --world N --devices-per-node G --mem 80GiB`: every
-- layout of N ranks (dp x tp x pp, ZeRO stage, pipeline schedule, micro-batch size,
-- recomputation, optimizer offload) that the model allows and whose largest rank fits in
-- the memory given, ranked by predicted tokens/s (loom.plan costs each one).
--
-- The recipe fixes the model, the sequence length and the global batch (batch.global
-- sequences per step; else micro x accumulation x dp of the recipe): every layout trains
-- the same tokens per step, so tokens/s ranks them fairly. The seeds' rules are
-- constraints, on by default: tp inside a node (tp divides the devices per node), and
-- pipeline stages across nodes (with pp > 1, a stage's tp x dp ranks fill whole nodes,
-- unless the job is one node); rules = {tp_in_node = false, pp_across_nodes = false} lift them.
-- Micro-batch sizes tried: the powers of two up to opts.max_micro (8) that divide the batch;
-- offload only where the layout does not fit without it (it never makes a step faster).
-- A mixture of experts: every ep dividing dp and the experts, with every ZeRO stage
-- (docs/MOE.md: core/train/zero_ep*.c, also under pp), not with offload; with pp, every
-- schedule: each stage's ep group exchanges per micro-batch, fast mode.
-- ZeRO-3's parameters offloaded beside the state (docs/ZERO.md) only where the layout does
-- not fit with the state alone offloaded.
-- With tp > 1, sequence parallelism on and off (not with zb1: loom refuses that pair;
-- only where micro x seq splits over tp). ZeRO-3 with pp too (zero_pp.sh trains it;
-- plan.sh holds its plan to a run).
-- Offload to disk where the profile has disk figures (a calibrated one: `disk`), also only
-- where a layout does not fit without offload (a CPU profile counts the host pool in the
-- rank's memory, the file not).
-- What not: fp16 (same bytes as bf16), offload to disk on a profile without disk figures
-- (the bundled GPU nodes': their drives are not in the data sheets used), pp_chunks other than
-- interleaved's 2, canonical mode (a determinism choice, not a layout), layouts whose
-- pipeline needs more micro-batches than the batch has; schedule pairs loom refuses
-- (zb1 with full recomputation, zb1 with sequence parallelism).
local plan = require "loom.plan"
local search = {}

local function divisors(n)
  local out = {}
  for d = 1, n do if n % d == 0 then out[#out + 1] = d end end
  return out
end

local function copy(t)
  local o = {}
  for k, v in pairs(t) do o[k] = type(v) == "table" and copy(v) or v end
  return o
end

-- opts: world, devices_per_node, mem (bytes), machine, rules, top (rows kept, default 10),
-- recompute / zero / schedules / offload (lists to try; defaults below).
function search.run(t, machine, opts)
  local N, G = opts.world, opts.devices_per_node or machine.devices_per_node or 1
  local rules = opts.rules or {}
  local tp_in_node = rules.tp_in_node ~= false
  local pp_across = rules.pp_across_nodes ~= false
  local m = t.model
  local vp = m.vocab_padded or (m.vocab + 127) // 128 * 128
  local mesh = t.mesh or {}
  local global = t.batch.global or t.batch.micro * (mesh.dp or 1) * (t.microbatches or 1)
  local recomputes = opts.recompute or { "none", "selective", "full" }
  local zeros = opts.zero or { 0, 1, 2, 3 }
  local schedules = opts.schedules or { "1f1b", "interleaved", "zb1" }
  local offloads = opts.offload or { false, "host", machine.disk and "disk" or nil }
  local precision = t.precision or "fp32"
  local sps = opts.sp or { false, true }
  local moe = m.moe and m.moe.experts > 0 and m.moe or nil
  local rows, tried, fits, refused = {}, 0, 0, 0
  -- (one cache for all the layouts: what depends on a part of a layout only, computed once)
  local cache = {}
  for _, tp in ipairs(divisors(N)) do
    local tp_ok = m.heads % tp == 0 and vp % tp == 0 and (not tp_in_node or (tp <= G and G % tp == 0))
    for _, pp in ipairs(tp_ok and divisors(N // tp) or {}) do
      local dp = N // (tp * pp)
      local across_ok = pp == 1 or not pp_across or N <= G or (tp * dp) % G == 0
      if across_ok and m.layers >= pp and global % dp == 0 then
        local per_dp = global // dp
        for _, micro in ipairs(divisors(per_dp)) do if micro <= (opts.max_micro or 8) and micro & (micro - 1) == 0 then
          local mbs = per_dp // micro
          for _, sched in ipairs(pp > 1 and schedules or { false }) do
            local chunks = sched == "interleaved" and 2 or 1
            if not (pp > 1 and (m.layers < pp * chunks or mbs < (sched == "interleaved" and pp or 1))) then
              for _, ep in ipairs(moe and divisors(dp) or { 1 }) do
              for _, z in ipairs(zeros) do
                if not (z > 0 and dp == 1) and not (moe and moe.experts % ep ~= 0) then
                  for _, rc in ipairs(recomputes) do for _, sp in ipairs(tp > 1 and sps or { false }) do
                    if not (sched == "zb1" and (rc == "full" or sp)) and not (sp and (micro * t.batch.seq) % tp ~= 0) then
                      local fit_without, fit_state_off = false, false
                      local variants = {}
                      for _, off in ipairs(offloads) do
                        variants[#variants + 1] = { off, false }
                        if off and z == 3 then variants[#variants + 1] = { off, true } end
                      end
                      for _, v in ipairs(variants) do local off, offp = v[1], v[2]
                      if not (off and (fit_without or ep > 1)) and not (offp and fit_state_off) then
                        local r = copy(t)
                        r.mesh = { dp = dp, tp = tp, pp = pp, ep = ep > 1 and ep or nil }
                        r.batch = { micro = micro, seq = t.batch.seq, global = global }
                        r.microbatches = pp > 1 and mbs or nil
                        r.schedule = pp > 1 and sched or nil
                        r.pp_chunks = nil
                        r.pp_layers = nil
                        r.recompute = rc
                        r.tp_sequence_parallel = sp
                        r.strategy = { zero = z, offload = off and { optimizer = off, params = offp or nil } or nil }
                        r.precision = precision
                        tried = tried + 1
                        -- a layout the schedule plugin refuses (its shape rules), or a
                        -- teacher layout the session refuses (plan.lua), is skipped
                        local ok, p = pcall(plan.layout, r, machine, { devices_per_node = G, cache = cache })
                        if not ok then refused = refused + 1; p = nil end
                        local need = p and p.rss -- the largest rank, the runtime's own bytes included
                        -- (a device with its own memory beside the host's, a profile with a
                        -- host_link: what is offloaded to the host is not on the device)
                        if p and off == "host" and machine.host_link then
                          local pm = p.memory[p.peak_stage]
                          need = need - pm.optimizer_offloaded - pm.params_offloaded
                        end
                        if p and off == "host" then -- the step's state goes over the host link both ways
                          local pm = p.memory[p.peak_stage]
                          local link = machine.host_link or { busbw = 25e9 }
                          -- (offloaded parameters: also read out for each unit's two gathers a micro-batch)
                          p.time.offload_s = (2 * pm.optimizer_offloaded + (2 + 2 * p.layout.accum) * pm.params_offloaded) / link.busbw
                          p.time.step_s = p.time.step_s + p.time.offload_s
                          p.tokens_per_s = p.tokens_per_step / p.time.step_s
                          if p.mfu then p.mfu = p.flops_per_token * p.tokens_per_step / p.time.step_s / (machine.device.peak_flops[precision] * N) end
                        end
                        if p and need <= opts.mem then
                          fit_without = fit_without or not off
                          fit_state_off = fit_state_off or (off and not offp)
                          fits = fits + 1
                          p.need_bytes = need
                          rows[#rows + 1] = p
                        end
                      end end
                    end
                  end end
                end
              end end
            end
          end
        end end
      end
    end
  end
  -- fastest first; ties (within 0.1%) to the smaller memory. A cpu-clock profile (a loaded
  -- machine's calibration, plan_machine.lua) ranks by CPU time per step, the bubble (a
  -- wait) left out, since that is what it measured.
  local function speed(p) return machine.clock == "cpu" and p.tokens_per_step / p.time.busy_s or p.tokens_per_s end
  table.sort(rows, function(a, b)
    local x, y = speed(a), speed(b)
    if math.abs(x - y) > 1e-3 * math.max(x, y) then return x > y end
    return a.need_bytes < b.need_bytes
  end)
  local top = {}
  for i = 1, math.min(opts.top or 10, #rows) do top[i] = rows[i] end
  return { ranked = top, tried = tried, fit = fits, refused = refused, teacher = t.teacher ~= nil, global_batch = global, world = N,
    devices_per_node = G, mem = opts.mem, rules = { tp_in_node = tp_in_node, pp_across_nodes = pp_across } }
end

return search
