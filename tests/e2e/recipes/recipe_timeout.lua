-- recipe_timeout.lua — one step of the small model with the recipe's own comm_timeout = 1:
-- for tests/e2e/early.sh, a rank that never arrives must be named after about 1 s, bounded
-- by the recipe (no comm_timeout on the command line, no LOOM_RENDEZVOUS_TIMEOUT_MS).
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train {
  model = common.model(), data = common.data(),
  optimizer = { "sgd", lr = 0.1 },
  batch = { micro = 4, seq = 32 }, steps = 1, seed = 5, threads = 1,
  comm_timeout = 1,
}
