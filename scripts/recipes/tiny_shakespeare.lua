-- tiny_shakespeare.lua — the bundled demo: a 0.8M-parameter byte-level GPT trained on
-- tinyshakespeare (random windows) for under three minutes on 2 cores, then sampled.
--   build/loom run scripts/recipes/tiny_shakespeare.lua [steps=1300] [batch.micro=32] ...
local loom = require "loom"

local session, summary = loom.train {
  model     = loom.gpt { vocab = 256, ctx = 128, layers = 4, heads = 4, dim = 128 },
  data      = loom.data.text { path = "../../data/tinyshakespeare.txt", val_fraction = 0.1, shuffle = true },
  optimizer = { "adamw", lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 },
  lr        = loom.lr.cosine { warmup = 100, total = 1300, min = 0.1 },
  batch     = { micro = 16, seq = 128 },
  steps     = 1300,
  seed      = 1337,
  eval      = { every = 250, batches = 20 },
  log       = { every = 10 },
}

-- Every rank samples (with tensor parallelism the logits are gathered over the ranks);
-- rank 0 reports.
local text = loom.sample { session = session, prompt = "ROMEO:\n", tokens = 500,
  temperature = 0.8, top_k = 40, seed = 7 }
if loom.rank ~= 0 then return end
if #summary.losses > 0 then
  print(string.format("\ntrained: loss %.3f -> %.3f, val loss %.3f", summary.losses[1],
    summary.final_loss, summary.val_loss or 0 / 0))
else
  print("\ntrained: no steps (steps=0, or a resumed run that was already done)")
end
print("---- sample ----")
print(text)
