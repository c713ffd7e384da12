-- expect: heads.lua:5: loom.gpt heads=3 does not divide dim=32 (heads may be 1, 2, 4, 8, 16, 32)
local loom = require "loom"

loom.train {
  model = loom.gpt { vocab = 256, ctx = 32, layers = 2, heads = 3, dim = 32 },
}
