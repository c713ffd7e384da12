-- kv_sample.lua — train the small model a few steps, then sample with the key/value cache
-- and without it (the whole window recomputed per token); every rank checks the two agree
-- token for token and in every bit of the logits drawn from (a hash: a barely trained
-- model's tokens hardly depend on small differences), and rank 0 prints "KV same N HASH"
-- and the sample's bytes as hex. Run on one rank and under tensor parallelism (each rank
-- caches its own heads).
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local session = loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-2 },
  batch = { micro = 4, seq = 32 }, steps = 6, seed = 5, threads = 1, log = { every = 100 },
}
-- 7 prompt bytes + 60 tokens: the cache serves the first 25, then the window (ctx 32) slides
local function sample(cache)
  return loom.sample { session = session, prompt = "ROMEO:\n", tokens = 60, temperature = 0.9,
    top_k = 20, seed = 3, cache = cache, logits_hash = true }
end
local with, hash_with = sample(true)
local without, hash_without = sample(false)
if with ~= without then
  error(string.format("rank %d: the cached sample differs:\n%q\n%q", loom.rank, with, without))
end
if hash_with ~= hash_without then
  error(string.format("rank %d: the same tokens, but the logits differ (hash %s with the cache, "
    .. "%s without)", loom.rank, hash_with, hash_without))
end
if loom.rank == 0 then
  print("KV same " .. #with .. " " .. hash_with)
  print("SAMPLE " .. with:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end
