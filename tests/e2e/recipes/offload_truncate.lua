-- offload_truncate.lua — optimizer state on disk under $OFFLOAD_DIR; after step 1 the
-- state file is truncated behind the session's back, so step 2's read comes up short and
-- must fail with a message naming the file (tests/e2e/offload.sh).
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local dir = assert(os.getenv("OFFLOAD_DIR"), "set OFFLOAD_DIR")
loom.train {
  model = common.model(), data = common.data(),
  optimizer = { "adamw", lr = 1e-2 },
  batch = { micro = 2, seq = 32 }, steps = 3, seed = 5, threads = 1,
  strategy = { offload = { optimizer = "disk", path = dir, chunk_mb = 0.01 } },
  log = { every = 100 },
  on_step = function(r)
    print(string.format("STEP %d", r.step))
    if r.step == 1 then assert(os.execute("truncate -s 0 " .. dir .. "/loom-optim-rank0-*.bin")) end
  end,
}
