-- offload_rss.lua — a model whose AdamW state is ~55 MiB (7.2 M parameters x 8 bytes),
-- a few steps; prints the last step's optimizer bytes (resident and offloaded) and the
-- process's peak resident set, for tests/e2e/offload.sh:
--   RSS optimizer optimizer_offloaded peak_rss rss
--   PARAMS params params_offloaded peak_rss rss (zero = 3 with offload.params)
-- RSS_STEPS=N runs N steps (default 2); RSS_TRAINING_PEAK=1 resets the peak (VmHWM, via
-- /proc/self/clear_refs) after step 1, so that peak_rss is the later steps' peak rather
-- than the start-up's.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local steps = tonumber(os.getenv("RSS_STEPS") or "2")
local training_peak = os.getenv("RSS_TRAINING_PEAK") == "1"
loom.train {
  model = loom.gpt { vocab = 256, ctx = 16, layers = 4, heads = 4, dim = 384 },
  data = common.data(),
  optimizer = { "adamw", lr = 1e-3, weight_decay = 0.1 },
  batch = { micro = 1, seq = 16 }, steps = steps, seed = 5, threads = 1,
  log = { every = 100 },
  on_step = function(r)
    print(string.format("LOSS %d %a", r.step, r.loss))
    if r.step == 1 and training_peak then
      local f = assert(io.open("/proc/self/clear_refs", "w"))
      f:write("5") -- Linux: VmHWM := VmRSS
      f:close()
    end
    if r.step < steps then return end
    print(string.format("RSS %d %d %d %d", r.memory.optimizer, r.memory.optimizer_offloaded, r.peak_rss, r.rss))
    print(string.format("PARAMS %d %d %d %d", r.memory.params, r.memory.params_offloaded, r.peak_rss, r.rss))
  end,
}
