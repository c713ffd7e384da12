-- bench_pp.lua — one pipeline-parallel layout's measured bubble and throughput on
-- synthetic tokens, for scripts/bench-pp. Layout and shapes come from the command line,
-- e.g.  build/loom launch -n 2 scripts/recipes/bench_pp.lua mesh.pp=2 schedule=1f1b \
--         microbatches=8 steps=6
-- The first `warmup` steps are not timed. The last line is JSON (one per rank,
-- "[rank k] "-prefixed past rank 0): bubble (the mean over the timed steps of the step's
-- measured bubble, docs/PIPELINE.md), tokens_per_s, ms_per_step, param_bytes and peak_rss
-- (this process's peak resident set, bytes).
local loom = require "loom"
local core = require "loom.core"

local warmup = 1
local timed_ms, timed_tokens, bubble, n = 0, 0, 0, 0
local cfg = {
  -- One micro-batch's activations (micro x seq x dim floats = 96 KiB) fit shm's send/recv
  -- mailbox (128 KiB less a 16-byte header): a send completes when the engine starts it.
  model     = loom.gpt { vocab = 256, vocab_padded = 256, ctx = 64, layers = 4, heads = 6, dim = 384 },
  data      = loom.data.random { vocab = 256, seed = 1 },
  optimizer = { "adamw", lr = 3e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1 },
  batch     = { micro = 1, seq = 64 },
  mesh      = { pp = 2 },
  schedule  = "1f1b",
  microbatches = 4,
  steps     = 6,
  threads   = 1,
  comm_timeout = 120,
  log       = { every = 1000000 },
  on_step   = function(r)
    if r.step > warmup then
      timed_ms = timed_ms + r.ms
      timed_tokens = timed_tokens + r.tokens
      bubble = bubble + (r.bubble or 0 / 0)
      n = n + 1
    end
  end,
}
local session = loom.train(cfg)
print(string.format('{"impl":"loom","rank":%d,"bubble":%.5f,"tokens_per_s":%.1f,"ms_per_step":%.2f,'
  .. '"steps":%d,"param_bytes":%d,"peak_rss":%d}', loom.rank, bubble / math.max(1, n),
  timed_tokens / (timed_ms / 1000), timed_ms / math.max(1, n), n, session:info().param_bytes,
  core.peak_rss()))
