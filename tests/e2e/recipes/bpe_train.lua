-- bpe_train.lua (BPE_SHARDS=DIR BPE_CK=DIR) — train a model of the fixture tokenizer's vocabulary
-- (27) on DIR/train_*.bin for 2 steps and checkpoint it in ck.
local loom = require "loom"
local o = { shards = assert(os.getenv("BPE_SHARDS")), ck = assert(os.getenv("BPE_CK")) }
loom.train {
  model = loom.gpt { vocab = 27, ctx = 32, layers = 1, heads = 2, dim = 16 },
  data = loom.data.shards { train = o.shards .. "/train_*.bin" },
  optimizer = { "adamw", lr = 1e-2 }, batch = { micro = 2, seq = 16 }, steps = 2, threads = 1,
  log = { every = 100 }, checkpoint = { dir = o.ck, every = 2 },
}
