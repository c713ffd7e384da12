-- zero_save.lua — the imperative API under ZeRO (2 ranks): a session with zero = 1 steps,
-- then refuses s:save and s:load with a message (checkpoints under zero are not built).
-- Prints REFUSED save|load MESSAGE for tests/e2e/zero.sh.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.core.init_dist { comm = "shm", dp = 2, timeout_ms = 10000 }
local s = loom.session { model = common.model(), batch = { micro = 2, seq = 32 },
  optimizer = { "adamw", lr = 1e-3 }, strategy = { name = "dp" }, zero = 1, threads = 1 }
local data = loom.open_data(common.data())
s:step(data, 1e-3)
assert(s:info().zero == 1, "zero stage not in effect")
local dir = os.tmpname(); os.remove(dir)
for _, what in ipairs { "save", "load" } do
  local ok, err = pcall(s[what], s, dir)
  print(string.format("REFUSED %s %s", what, ok and "accepted" or tostring(err)))
end
