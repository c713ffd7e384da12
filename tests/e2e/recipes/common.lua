-- common.lua — the small model and data the end-to-end tests share.
local loom = require "loom"
local here = arg[0]:match("^(.*)/[^/]*$")
return {
  model = function() return loom.gpt { vocab = 256, ctx = 32, layers = 2, heads = 2, dim = 32 } end,
  data = function() return loom.data.text { path = here .. "/../../../data/tinyshakespeare.txt", val_fraction = 0.1 } end,
}
