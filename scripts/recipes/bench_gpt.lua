-- bench_gpt.lua — training throughput of one GPT config on synthetic tokens, for
-- scripts/bench-cpu. Shapes come from the command line, e.g.
--   build/loom run scripts/recipes/bench_gpt.lua model.vocab=50257 model.ctx=256 \
--     model.layers=6 model.heads=6 model.dim=384 batch.micro=4 batch.seq=256 steps=8
-- The first `warmup` steps are not timed. The last line is JSON for the script (with
-- loom launch, one per rank, "[rank k] "-prefixed past rank 0): tokens_per_s, ms_per_step,
-- comm_ms (mean per timed step: tensor-parallel exchanges, dp sync, grad-norm exchange),
-- comm_share (comm_ms / ms_per_step), param_bytes (this rank's parameter buffer),
-- peak_rss (this process's peak resident set, bytes), optimizer_bytes (this rank's
-- optimizer state, resident and offloaded: its ZeRO partition), losses (the first three steps') and
-- cpu_ms_per_step (os.clock: the CPU time of all the process's threads per timed step, spin-
-- waits included; at threads=1 a measure of work that a loaded machine disturbs little).
-- With BENCH_MEMORY set (bench_zero_layouts.lua) the peak resident set is reset after the
-- warm-up (Linux /proc/self/clear_refs) and a second line follows, for
-- scripts/bench-zero-layouts: {"memory":{<session:info().memory>},"startup_peak_rss":,
-- "training_peak_rss":,"rss":} (the peak before the reset, the peak after it, the end's).
local loom = require "loom"
local core = require "loom.core"

local warmup = 2
local timed_ms, timed_tokens, timed_comm = 0, 0, 0
local cpu_start, cpu_end = nil, nil
local losses = {}
local memory_line = rawget(_G, "BENCH_MEMORY")
local startup_peak_rss = 0
local cfg = {
  -- bench_llama.lua sets BENCH_MODEL (a loom.llama) and runs this file
  model     = rawget(_G, "BENCH_MODEL")
              or loom.gpt { vocab = 256, vocab_padded = 256, ctx = 64, layers = 4, heads = 4, dim = 128 },
  data      = loom.data.random { vocab = 256, seed = 1 },
  optimizer = { "adamw", lr = 3e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1 },
  batch     = { micro = 8, seq = 64 },
  steps     = 20,
  threads   = 2,
  log       = { every = 1000000 },
  on_step   = function(r)
    if r.step == warmup then cpu_start = os.clock() end
    if r.step == warmup and memory_line then -- VmHWM := VmRSS: the timed steps' peak from here
      startup_peak_rss = r.peak_rss -- VmHWM (getrusage's peak is not reset by clear_refs)
      local f = assert(io.open("/proc/self/clear_refs", "w"))
      f:write("5")
      f:close()
    end
    cpu_end = os.clock()
    if r.step > warmup then
      timed_ms = timed_ms + r.ms
      timed_tokens = timed_tokens + r.tokens
      timed_comm = timed_comm + (r.comm_ms or 0)
    end
    if #losses < 3 then losses[#losses + 1] = string.format("%.6f", r.loss) end
  end,
}
-- data.vocab follows model.vocab when only the model is overridden on the command line
for _, kv in ipairs(loom.overrides()) do
  if kv[1] == "model.vocab" then cfg.data.vocab = math.tointeger(tonumber(kv[2])) end
end
local session, summary = loom.train(cfg)
local timed = math.max(1, #summary.losses - warmup)
local info = session:info()
print(string.format('{"impl":"loom","tokens_per_s":%.1f,"ms_per_step":%.2f,"steps":%d,"params":%d,'
  .. '"final_loss":%.4f,"comm_ms":%.3f,"comm_share":%.4f,"param_bytes":%d,"peak_rss":%d,"losses":[%s],'
  .. '"cpu_ms_per_step":%.2f,"optimizer_bytes":%d}',
  timed_tokens / (timed_ms / 1000), timed_ms / timed, #summary.losses - warmup, info.params,
  summary.final_loss, timed_comm / timed, timed_ms > 0 and timed_comm / timed_ms or 0,
  info.param_bytes, core.peak_rss(), table.concat(losses, ","),
  cpu_start and (cpu_end - cpu_start) * 1000 / timed or 0,
  info.memory.optimizer + info.memory.optimizer_offloaded))
if memory_line then
  local keys = {}
  for k, v in pairs(info.memory) do keys[#keys + 1] = string.format('"%s":%d', k, v) end
  table.sort(keys)
  print(string.format('{"memory":{%s},"startup_peak_rss":%d,"training_peak_rss":%d,"rss":%d}',
    table.concat(keys, ","), startup_peak_rss, info.peak_rss, info.rss))
end
