-- bench_pp.lua — one pipeline-parallel layout's measured bubble and throughput on
-- synthetic tokens, for scripts/bench-pp. Layout and shapes come from the command line,
-- e.g.  build/loom launch -n 2 scripts/recipes/bench_pp.lua mesh.pp=2 schedule=1f1b \
--         microbatches=8 steps=6
-- The first `warmup` steps are not timed. The last line is JSON (one per rank,
-- "[rank k] "-prefixed past rank 0): bubble (the mean over the timed steps of the step's
-- measured bubble, docs/PIPELINE.md), stage_cpu_ms (this rank's CPU ms per step in
-- forward and backward: its stage's cost, whatever else shares the cores), tokens_per_s,
-- ms_per_step, param_bytes and peak_rss (this process's peak resident set, bytes).
local loom = require "loom"
local core = require "loom.core"

local warmup = 1
local timed_ms, timed_tokens, bubble, cpu, n = 0, 0, 0, 0, 0
local cfg = {
  -- Stages of equal cost at whole blocks: the LM head and loss cost one block, so the 7
  -- blocks and the head are 8 equal parts: 4 + 3 blocks at pp=2 and 2 + 2 + 2 + 1 over
  -- interleaved's 4 virtual stages (the default split, weighed by FLOPs), as Megatron-LM
  -- wants its layers divisible by pp x v when it counts the loss as a layer
  -- (account_for_loss_in_pipeline_split). An 8th block would leave the head over: 2 + 2 +
  -- 2 + 2 and the head, the last virtual stage 1.5x the others. The head's vocabulary is
  -- set by measured CPU time, not FLOPs: at 4096 (0.86 of a block by FLOPs, gpt_cost.h)
  -- the head's F + B took 0.82-0.90 of a block's (its backward is cheaper than a block's
  -- relative to its forward), stage 0 cost 3-5% more than stage 1 and that alone put
  -- 1f1b m=16 1.4 pp over its formula (pp_replay's replay_stage, docs/BENCHMARKS.md); at
  -- 4608 (0.97 by FLOPs) the stages' F + B are equal within the run-to-run spread (on the
  -- Zen 5; on an AVX-512 Xeon stage 0 was 1.5-1.8% dearer at 4608 and equal at 4864, so
  -- scripts/bench-pp calibrates the vocabulary on the machine it runs on and passes
  -- model.vocab / data.vocab; 4608 is what a run without it gets). With
  -- 256 rows and 4 blocks (this recipe before) the head was 5% of a block and stage 1 ran
  -- ~6% longer than stage 0: no split of 4 whole blocks evens that. A micro-batch is 4 x 64 tokens: at 1 x 64 its
  -- GEMMs (64 rows) were bound by reading the weights, an F took 8-10 ms of CPU and a
  -- stage's cost moved with what else had been through the caches (20% apart between
  -- the two stages of one run); at 256 rows an F is ~23 ms, costs 0.7x as much per token,
  -- and F and B are close to equal; W is 0.8 of an F (only GEMMs: docs/PIPELINE.md), so
  -- bench-pp compares zb1 with ZB-H1's bubble at the measured costs too. Its activations
  -- (micro x seq x dim floats = 384 KiB) pass in one piece: train.lua sizes shm's
  -- mailbox for two (core/dist/dist.h), so a send completes when it starts.
  model     = loom.gpt { vocab = 4608, ctx = 64, layers = 7, heads = 6, dim = 384 },
  data      = loom.data.random { vocab = 4608, seed = 1 },
  optimizer = { "adamw", lr = 3e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1 },
  batch     = { micro = 4, seq = 64 },
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
      cpu = cpu + (r.stage_cpu_ms or 0 / 0)
      n = n + 1
    end
  end,
}
local session = loom.train(cfg)
print(string.format('{"impl":"loom","rank":%d,"bubble":%.5f,"stage_cpu_ms":%.2f,"tokens_per_s":%.1f,'
  .. '"ms_per_step":%.2f,"steps":%d,"param_bytes":%d,"peak_rss":%d}', loom.rank,
  bubble / math.max(1, n), cpu / math.max(1, n),
  timed_tokens / (timed_ms / 1000), timed_ms / math.max(1, n), n, session:info().param_bytes,
  core.peak_rss()))
