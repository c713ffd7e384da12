-- signal.lua — losses.lua's run, whose rank 0 sends itself (STOP_WHO=self, the default) or
-- its parent, the launcher (STOP_WHO=parent), the signal STOP_SIG (default TERM) STOP_N
-- times (default 1) right after step STOP_AT: a preemption at a known point, with no
-- waiting in the test. Prints every step's loss as a hex float (LOSS lines).
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local at = tonumber(os.getenv("STOP_AT") or "")
local function pid_of(who)
  local f = assert(io.open("/proc/self/stat"))
  local stat = f:read("a")
  f:close()
  local pid, ppid = stat:match("^(%d+) %b() %S+ (%d+)")
  return who == "parent" and ppid or pid
end
loom.train {
  model = common.model(), data = common.data(),
  optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 },
  lr = loom.lr.cosine { warmup = 3, total = 20, min = 0.1 },
  batch = { micro = 4, seq = 32 }, steps = 20, seed = 5, threads = 1,
  log = { every = 100 },
  on_step = function(r)
    print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
    if r.step == at and loom.rank == 0 then
      local target = pid_of(os.getenv("STOP_WHO"))
      for _ = 1, tonumber(os.getenv("STOP_N") or "1") do
        -- io.popen, not os.execute: system() ignores SIGINT in the caller while it waits
        io.popen(string.format("kill -%s %s", os.getenv("STOP_SIG") or "TERM", target)):close()
      end
    end
  end,
}
