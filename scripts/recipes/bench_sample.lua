-- bench_sample.lua — generation speed with and without the key/value cache, in one run,
-- alternating, so the ratio is measured under the same load. Defaults: the demo's model
-- (4 layers, dim 128, byte-level) with ctx 512, 500 tokens from a 7-byte prompt, 3 rounds:
--   build/loom run scripts/recipes/bench_sample.lua [tokens=500] [ctx=512] [layers=4]
--     [heads=4] [dim=128] [vocab=256] [rounds=3] [threads=2] [shift=0]
-- shift=1 samples with window = "shift" (past ctx the window restarts at ctx/2 tokens).
-- The weights are a fresh init (speed does not depend on them). Prints one line per path
-- and round, then the median ratio; the two paths' tokens are checked equal.
local loom = require "loom"
local core = require "loom.core"
local o = { tokens = 500, ctx = 512, layers = 4, heads = 4, dim = 128, vocab = 256, rounds = 3,
  threads = 2, shift = 0 }
for _, kv in ipairs(loom.overrides()) do
  if o[kv[1]] == nil then error("bench_sample: unknown key '" .. kv[1] .. "'", 0) end
  o[kv[1]] = math.tointeger(tonumber(kv[2])) or error("bench_sample: " .. kv[1] .. " must be an integer", 0)
end
local session = loom.session {
  model = loom.gpt { vocab = o.vocab, ctx = o.ctx, layers = o.layers, heads = o.heads, dim = o.dim },
  batch = { micro = 1, seq = 1 }, optimizer = { "sgd", lr = 0.1 }, threads = o.threads,
}
local prompt = {}
for i = 1, 7 do prompt[i] = (i * 31) % o.vocab end
local function run(cache)
  local t0 = core.now()
  local out = loom.sample { session = session, prompt = prompt, tokens = o.tokens, cache = cache,
    temperature = 1.0, seed = 1, window = o.shift == 1 and "shift" or nil }
  return core.now() - t0, table.concat(out, ",")
end
run(true) -- warm up
local ratios = {}
print(string.format("model L=%d H=%d C=%d V=%d ctx=%d, %d tokens, window %s, threads=%d | %s",
  o.layers, o.heads, o.dim, o.vocab, o.ctx, o.tokens, o.shift == 1 and "shift" or "slide",
  o.threads, session:info().backend))
for r = 1, o.rounds do
  local s_cache, a = run(true)
  local s_full, b = run(false)
  assert(a == b, "the cached tokens differ")
  ratios[r] = s_full / s_cache
  print(string.format("round %d: cache %.3f s (%.0f tok/s), no cache %.3f s (%.0f tok/s), %.1fx",
    r, s_cache, o.tokens / s_cache, s_full, o.tokens / s_full, ratios[r]))
end
table.sort(ratios)
print(string.format("median speed-up %.1fx", ratios[(#ratios + 1) // 2]))
