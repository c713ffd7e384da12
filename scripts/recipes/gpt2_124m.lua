-- gpt2_124m.lua — GPT-2 124M as llm.c trains it (its "d12" run: train_gpt2.cu with
-- -b 64 -t 1024 -d 524288 -l 0.0006 -u 700 -q 0.0 -c 0.1 -x 18865), on GPT-2 BPE shards:
--
--   scripts/prepare-text --gpt2 data/tinyshakespeare.txt data/gpt2     # or your own text
--   build/loom run scripts/recipes/gpt2_124m.lua                       # as llm.c's d12
--   build/loom run scripts/recipes/gpt2_124m.lua batch.micro=1 steps=50 # a first look on a CPU
--
-- V=50257 padded to 50304, T=1024, L=12, H=12, C=768 (124M parameters); AdamW 6e-4, betas
-- (0.9, 0.95), weight decay 0.1 on matrices, gradient clip 1.0; 700 warm-up steps, then
-- cosine decay to 0 at step 18865; 512 sequences (524,288 tokens) a step, made of
-- micro-batches of 4 (batch.global / (micro x dp) are accumulated). On a CPU a step of
-- that size takes many minutes: start with fewer steps or a smaller batch.global.
local loom = require "loom"

local session, summary = loom.train {
  model     = loom.gpt { vocab = 50257, vocab_padded = 50304, ctx = 1024, layers = 12, heads = 12, dim = 768 },
  data      = loom.data.shards { train = "../../data/gpt2/train_*.bin", val = "../../data/gpt2/val_*.bin" },
  optimizer = { "adamw", lr = 6e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1 },
  lr        = loom.lr.cosine { warmup = 700, total = 18865, min = 0.0 },
  grad_clip = 1.0,
  batch     = { micro = 4, seq = 1024, global = 512 },
  steps     = 18865,
  seed      = 1337,
  eval      = { every = 250, batches = 20 },
  log       = { every = 1, jsonl = "run/gpt2_124m.jsonl" },
  checkpoint = { dir = "ckpt/gpt2_124m", every = 1000, keep = 3 },
}
if loom.rank == 0 and #summary.losses > 0 then
  print(string.format("trained: loss %.3f -> %.3f, val loss %.3f", summary.losses[1],
    summary.final_loss, summary.val_loss or 0 / 0))
end
