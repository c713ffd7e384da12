-- llama_losses.lua — losses.lua's run on a small loom.llama model (grouped-query attention:
-- 4 query heads over 2 key/value heads): every step's loss as a hex float and the gradient
-- norm (NORM lines), so a test can compare layouts bit for bit.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train(common.losses_run(
  loom.llama { vocab = 256, ctx = 32, layers = 2, heads = 4, kv_heads = 2, dim = 32, ffn_dim = 64 }))
