-- ranks.lua — a recipe for the `loom launch` tests: no training, only rank behaviour chosen
-- by key=value arguments (read from core.overrides, which `loom run` fills):
--   dir=PATH      write PATH/ready.<rank> (and PATH/job from rank 0) once running
--   nap=SECONDS   then sleep that long (the tests put a unique number here, to find leftovers)
--   fail=R:CODE   rank R exits with CODE (after the others are ready)
--   kill9=R       rank R kills itself with SIGKILL
--   mismatch=R    every rank checks its configuration; rank R's differs
--   shm=1         rank 0 creates /dev/shm/loom-<LOOM_JOB_ID>-test, as a communicator would
local core = require("loom.core")
local opt = {}
for _, kv in ipairs(core.overrides) do opt[kv[1]] = kv[2] end
local rank = core.rank

local function pid()
  local f = assert(io.open("/proc/self/stat"))
  local p = f:read("n")
  f:close()
  return p
end

print(string.format("rank %d of %d (local %d)", rank, core.world, core.local_rank))
io.stderr:write(string.format("stderr of rank %d\n", rank))
if rank == 0 then io.write("progress 1\rprogress 2\rprogress 3\n") io.flush() end

if opt.mismatch then
  core.check_same_config(rank == tonumber(opt.mismatch) and "lr=0.2" or "lr=0.1")
end
if opt.shm and rank == 0 then
  assert(io.open("/dev/shm/loom-" .. os.getenv("LOOM_JOB_ID") .. "-test", "w")):close()
end
if opt.dir then
  if rank == 0 then
    local f = assert(io.open(opt.dir .. "/job", "w")); f:write(os.getenv("LOOM_JOB_ID")); f:close()
  end
  assert(io.open(opt.dir .. "/ready." .. rank, "w")):close()
end
local function others_ready()
  for r = 0, core.world - 1 do
    local f = io.open(opt.dir .. "/ready." .. r)
    if not f then return false end
    f:close()
  end
  return true
end
local fr, code = (opt.fail or ""):match("^(%d+):(%d+)$")
if tonumber(fr) == rank or tonumber(opt.kill9) == rank then
  while opt.dir and not others_ready() do os.execute("sleep 0.05") end
  if fr then os.exit(tonumber(code)) end
  os.execute("kill -9 " .. pid())
end
if opt.nap then os.execute("sleep " .. opt.nap) end
