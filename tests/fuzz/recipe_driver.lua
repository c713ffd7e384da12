-- recipe_driver.lua — run by fuzz_recipe (through the real `loom run` code, cli.c) for
-- every fuzz input: the input (file LOOM_FUZZ_INPUT) is a Lua table expression, the
-- fields of a loom.train recipe, evaluated with no globals but a tiny model M, data D
-- and loom.lr (so the fuzzer spends its time on recipe values, not on Lua syntax or on
-- the standard library); then loom.train validates and runs it. An instruction limit
-- bounds the fuzzed code (function fields like lr or on_step included); steps, batch
-- and accum are capped so that a valid recipe trains in milliseconds. Any input must end
-- in a Lua error with a message or a finished run, never a crash.
local loom = require "loom"
local f = assert(io.open(os.getenv("LOOM_FUZZ_INPUT"), "rb"))
local text = f:read("a")
f:close()
local env = {
  M = loom.gpt { vocab = 256, ctx = 16, layers = 1, heads = 1, dim = 8 },
  D = loom.data.random { vocab = 256 },
  lr = loom.lr,
  huge = math.huge,
}
local chunk = load("return " .. text, "=fuzz", "t", env)
if not chunk then return end
local function limited(fn, ...)
  debug.sethook(function() error("fuzz: instruction limit") end, "", 20000000)
  local ok, r = pcall(fn, ...)
  debug.sethook()
  return ok, r
end
local ok, t = limited(chunk)
if not ok or type(t) ~= "table" then return end
local function cap(tab, key, most)
  if type(tab) == "table" and math.type(rawget(tab, key)) == "integer" and tab[key] > most then
    tab[key] = most
  end
end
cap(t, "steps", 2)
cap(t.batch, "micro", 4)
cap(t.batch, "seq", 16)
cap(t.batch, "global", 16)
t.threads = 1
local ok2, err = limited(loom.train, t)
if not ok2 then error(err, 0) end
