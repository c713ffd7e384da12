-- llama_losses.lua — losses.lua's run on a small loom.llama model (grouped-query attention:
-- 4 query heads over 2 key/value heads): every step's loss as a hex float and the gradient
-- norm (NORM lines), so a test can compare layouts bit for bit.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train {
  model = loom.llama { vocab = 256, ctx = 32, layers = 2, heads = 4, kv_heads = 2, dim = 32,
                       ffn_dim = 64 },
  data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  lr = loom.lr.cosine { warmup = 3, total = 20, min = 0.1 },
  batch = { micro = 4, seq = 32 }, steps = 20, seed = 5, threads = 2,
  log = { every = 100 },
  on_step = function(r)
    print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
    print(string.format("NORM %d %a", r.step, r.grad_norm))
  end,
}
