-- pp_sample.lua — train the small model a few steps (or resume it: resume=PATH with
-- steps at the checkpoint's step trains nothing), then sample; rank 0 prints the sample's
-- bytes as hex ("SAMPLE ...") and the XXH64 of every logits row drawn from ("HASH ..."),
-- so runs under different pipeline layouts, or loading one checkpoint, can be compared.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local session = loom.train {
  model = common.model(), data = common.data(), optimizer = { "adamw", lr = 1e-2 },
  batch = { micro = 4, seq = 32 }, steps = 4, seed = 5, threads = 1, log = { every = 100 },
}
local text, hash = loom.sample { session = session, prompt = "ROMEO:\n", tokens = 40,
  temperature = 0.9, top_k = 20, seed = 3, logits_hash = true }
local function hex(t) return (t:gsub(".", function(c) return string.format("%02x", c:byte()) end)) end
if loom.rank == 0 then
  print("SAMPLE " .. hex(text))
  print("HASH " .. hash)
end
-- LOOM_SAMPLE_TIMES=N: N more samples with the key/value cache and N without, timed
-- ("NOCACHE" lines: the uncached sample, which must equal the cached one; "TIMES cached
-- uncached" in ms, the fastest of N each).
local n = tonumber(os.getenv("LOOM_SAMPLE_TIMES") or "")
if n then
  local core = require "loom.core"
  local best = { [true] = math.huge, [false] = math.huge }
  local plain, plain_hash
  for _ = 1, n do
    for _, cache in ipairs { true, false } do
      local t0 = core.now()
      local t, h = loom.sample { session = session, prompt = "ROMEO:\n", tokens = 40,
        temperature = 0.9, top_k = 20, seed = 3, logits_hash = true, cache = cache }
      best[cache] = math.min(best[cache], (core.now() - t0) * 1000)
      if not cache then plain, plain_hash = t, h end
    end
  end
  if loom.rank == 0 then
    print("NOCACHE SAMPLE " .. hex(plain))
    print("NOCACHE HASH " .. plain_hash)
    print(string.format("TIMES %.3f %.3f", best[true], best[false]))
  end
end
