-- pp_mailbox.lua — one pp=2 step; each rank prints "SHM rank bytes": the size of its
-- largest shared-memory mapping (the world's shm segment, which holds world x world
-- send/recv mailboxes: shm_seg.c), read from /proc/self/maps during the step, so that
-- pp_trace.sh can check that the mailbox grew to hold two activations (core/dist/dist.h).
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train {
  model = common.model(), data = common.data(),
  optimizer = { "sgd", lr = 1e-2 },
  batch = { micro = 1, seq = 32 }, steps = 1, threads = 1, mesh = { pp = 2 },
  microbatches = 2, log = { every = 100 },
  on_step = function(r)
    local big = 0
    for line in io.lines("/proc/self/maps") do
      local a, b = line:match("^(%x+)-(%x+) .*/dev/shm/loom%-")
      if a then big = math.max(big, tonumber(b, 16) - tonumber(a, 16)) end
    end
    print(string.format("SHM %d %d", loom.rank, big))
  end,
}
