-- bench_compress.lua — one run of scripts/bench-compress: the test model of
-- tests/e2e/compress.sh (vocab 256, ctx 32, 2 layers, 2 heads, dim 32: 34688 parameters) on
-- tiny Shakespeare, SGD lr 1 with the cosine to 0.1 by step 20, 200 steps, as that test's
-- loss-gap runs; the compression comes from the command line (strategy.compress=...).
-- The last line is JSON for the script: tokens_per_s and ms_per_step over the steps after
-- step 20 (the scripts' compression warm-up: the timed steps are all compressed), comm_ms
-- (mean per timed step), link_bytes (with BENCH_NETDEV=DEV set: rank 0 reads DEV's kernel
-- counters rx_bytes + tx_bytes at step 20 and at the last step, so the traffic both ways
-- across that link during the timed steps; null without), compress_bytes (this rank's compressed message, from the session's step
-- stats, the last step's; absent without compression), grad_bytes (its fp32 equivalent),
-- params, last20 (the mean loss of the last 20 steps) and final_loss.
local loom = require "loom"
local here = arg[0]:match("^(.*)/[^/]*$")
local warmup = 20
local netdev = os.getenv("BENCH_NETDEV")
local function link_bytes() -- rx + tx of BENCH_NETDEV in this process's network namespace
  if not netdev or (loom.core.rank or 0) ~= 0 then return nil end
  local sum = 0
  for _, c in ipairs { "rx_bytes", "tx_bytes" } do
    local f = assert(io.open("/sys/class/net/" .. netdev .. "/statistics/" .. c), "bench_compress: no device " .. netdev)
    sum = sum + assert(tonumber(f:read("l")))
    f:close()
  end
  return sum
end
local link0, link1
link_bytes() -- a missing device stops rank 0 here, before any step
local timed_ms, timed_tokens, timed_comm, n = 0, 0, 0, 0
local losses, cbytes, gbytes = {}, nil, nil
local session, summary = loom.train {
  model = loom.gpt { vocab = 256, ctx = 32, layers = 2, heads = 2, dim = 32 },
  data = loom.data.text { path = here .. "/../../data/tinyshakespeare.txt", val_fraction = 0.1 },
  optimizer = { "sgd", lr = 1 },
  lr = loom.lr.cosine { warmup = 3, total = 20, min = 0.1 },
  batch = { micro = 4, seq = 32 }, steps = 200, seed = 5, threads = 1,
  log = { every = 1000000 },
  on_step = function(r)
    losses[#losses + 1] = r.loss
    if r.step == warmup then link0 = link_bytes() end
    link1 = link_bytes()
    if r.step > warmup then
      timed_ms = timed_ms + r.ms
      timed_tokens = timed_tokens + r.tokens
      timed_comm = timed_comm + (r.comm_ms or 0)
      n = n + 1
    end
    cbytes, gbytes = r.compress_bytes, r.grad_bytes
  end,
}
local s20, k = 0, 0
for i = math.max(1, #losses - 19), #losses do s20 = s20 + losses[i]; k = k + 1 end
assert(k > 0 and n > 0, "bench_compress: no steps ran")
if (loom.core.rank or 0) ~= 0 then return end -- one line per run: rank 0's
print(string.format('{"tokens_per_s":%.1f,"ms_per_step":%.3f,"comm_ms":%.3f,"compress_bytes":%s,'
  .. '"grad_bytes":%s,"link_bytes":%s,"params":%d,"last20":%.4f,"final_loss":%.4f,"steps":%d}',
  timed_tokens / (timed_ms / 1000), timed_ms / n, timed_comm / n,
  cbytes and string.format("%d", cbytes) or "null", gbytes and string.format("%d", gbytes) or "null",
  link0 and string.format("%d", link1 - link0) or "null",
  session:info().params, s20 / k, losses[#losses], #losses))
