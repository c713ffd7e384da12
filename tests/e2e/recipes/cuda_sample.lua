-- cuda_sample.lua — one training step of a 1-block model at ctx 32, then 8 tokens after a
-- 20-byte prompt with the key/value cache and without it (every window recomputed), inside
-- ctx (no slide); the two must agree token for token and in every bit of the logits (a
-- hash), and it prints "KV same N HASH" and the activation bytes before and after sampling
-- ("ACT BEFORE AFTER"). tests/e2e/cuda_train.sh runs it with
-- LOOM_CUDA_ATTENTION=flash at micro-batch 1, where generation's batched attention over
-- 24 or more rows outgrows the blocks' att (core/model/gpt_att.c's spill).
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local session = loom.train {
  model = loom.gpt { vocab = 256, ctx = 32, layers = 1, heads = 2, dim = 32 },
  data = common.data(), optimizer = { "adamw", lr = 1e-2 },
  batch = { micro = 1, seq = 32 }, steps = 1, seed = 5, threads = 1, log = { every = 100 },
}
local function sample(cache)
  return loom.sample { session = session, prompt = "ROMEO:\nWhat say you?", tokens = 8,
    temperature = 0.9, top_k = 20, seed = 3, cache = cache, logits_hash = true }
end
local before = session:info().memory.activations
local with, hash_with = sample(true)
local without, hash_without = sample(false)
if with ~= without or hash_with ~= hash_without then
  error(string.format("the cached sample differs:\n%q %s\n%q %s", with, hash_with, without,
    hash_without))
end
print("KV same " .. #with .. " " .. hash_with)
-- the activation bytes before and after (a spill buffer, where one was needed, counts)
print(string.format("ACT %d %d", before, session:info().memory.activations))
