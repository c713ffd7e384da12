-- bench_gpt.lua — training throughput of one GPT config on synthetic tokens, for
-- scripts/bench-cpu. Shapes come from the command line, e.g.
--   build/loom run scripts/recipes/bench_gpt.lua model.vocab=50257 model.ctx=256 \
--     model.layers=6 model.heads=6 model.dim=384 batch.micro=4 batch.seq=256 steps=8
-- The first `warmup` steps are not timed. The last line is JSON for the script.
local loom = require "loom"

local warmup = 2
local timed_ms, timed_tokens = 0, 0
local cfg = {
  model     = loom.gpt { vocab = 256, vocab_padded = 256, ctx = 64, layers = 4, heads = 4, dim = 128 },
  data      = loom.data.random { vocab = 256, seed = 1 },
  optimizer = { "adamw", lr = 3e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1 },
  batch     = { micro = 8, seq = 64 },
  steps     = 20,
  threads   = 2,
  log       = { every = 1000000 },
  on_step   = function(r)
    if r.step > warmup then
      timed_ms = timed_ms + r.ms
      timed_tokens = timed_tokens + r.tokens
    end
  end,
}
-- data.vocab follows model.vocab when only the model is overridden on the command line
for _, kv in ipairs(loom.overrides()) do
  if kv[1] == "model.vocab" then cfg.data.vocab = math.tointeger(tonumber(kv[2])) end
end
local session, summary = loom.train(cfg)
print(string.format('{"impl":"loom","tokens_per_s":%.1f,"ms_per_step":%.2f,"steps":%d,"params":%d,"final_loss":%.4f}',
  timed_tokens / (timed_ms / 1000), timed_ms / math.max(1, #summary.losses - warmup),
  #summary.losses - warmup, session:info().params, summary.final_loss))
