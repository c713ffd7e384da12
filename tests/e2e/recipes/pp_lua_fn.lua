-- pp_lua_fn.lua — pp_probe.lua with schedule = a function written here, for pp_lua.sh.
-- PP_LUA_FN picks it: "gpipe" (the lists of schedules/gpipe.lua), "error" (raises) or
-- "number" (returns 42, not a list). loom.train is wrapped so the probe's recipe is not
-- copied; the function is still the recipe's, and its messages name this file.
local here = arg[0]:match("^(.*)/[^/]*$")
package.path = here .. "/?.lua;" .. package.path
local loom = require "loom"
local gpipe = dofile(here .. "/../schedules/gpipe.lua")
local mode = os.getenv("PP_LUA_FN") or "gpipe"
local function schedule(shape)
  if mode == "error" then error("no list for stage " .. shape.stage) end
  if mode == "number" then return 42 end
  return gpipe(shape)
end
local train = loom.train
loom.train = function(t)
  t.schedule = schedule
  return train(t)
end
dofile(here .. "/pp_probe.lua")
