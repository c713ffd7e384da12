-- llama_shakespeare.lua — the bundled Llama demo: a 10M-parameter loom.llama (RMSNorm,
-- SwiGLU, rotary positions, grouped-query attention 4 query heads over 2 key/value heads,
-- untied head) on tinyshakespeare in GPT-2 BPE, trained and sampled (with the key/value
-- cache) in under two minutes on a quiet 2-core machine: the whole run (400 steps, 4
-- evaluations, the sample) took 1 min 42 s with the default two threads on a quiet 2-core
-- AMD EPYC (AVX2), docs/LLAMA.md.
--
--   scripts/prepare-text --gpt2 data/tinyshakespeare.txt data/gpt2     # once
--   build/loom run scripts/recipes/llama_shakespeare.lua [steps=400] [batch.micro=8] ...
--
-- 9.7M of its 10.1M parameters are the embedding and the head (50257 x 96 each): a small
-- model with GPT-2's vocabulary is mostly vocabulary.
local loom = require "loom"

local data = loom.data.shards { train = "../../data/gpt2/train_*.bin", val = "../../data/gpt2/val_*.bin" }
local session, summary = loom.train {
  model     = loom.llama { vocab = 50257, vocab_padded = 50304, ctx = 64, layers = 4,
                           heads = 4, kv_heads = 2, dim = 96, ffn_dim = 256 },
  data      = data,
  optimizer = { "adamw", lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 },
  lr        = loom.lr.cosine { warmup = 50, total = 400, min = 0.1 },
  grad_clip = 1.0,
  batch     = { micro = 8, seq = 64 },
  steps     = 400,
  seed      = 1337,
  eval      = { every = 100, batches = 10 },
  log       = { every = 20 },
}

-- The tokenizer prepare-text left beside the shards (data.train as overridden, if it was);
-- without one (shards from elsewhere), a prompt of <|endoftext|> and the ids printed.
local dir = loom.tokenizer_dir(data)
local text = loom.sample { session = session, prompt = dir and "ROMEO:\n" or { 50256 },
  tokenizer = dir, tokens = 200, temperature = 0.8, top_k = 40, seed = 7 }
if type(text) == "table" then text = "(no tokenizer beside the shards: token ids) " .. table.concat(text, " ") end
if loom.rank ~= 0 then return end
if #summary.losses > 0 then
  print(string.format("\ntrained: loss %.3f -> %.3f, val loss %.3f", summary.losses[1],
    summary.final_loss, summary.val_loss or 0 / 0))
else
  print("\ntrained: no steps (steps=0, or a resumed run that was already done)")
end
print("---- sample ----")
print(text)
