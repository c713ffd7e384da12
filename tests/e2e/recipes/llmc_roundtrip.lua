-- llmc_roundtrip.lua ckpt=DIR bin=FILE — the same weights reached two ways: a loom
-- checkpoint (safetensors) and an llm.c model file exported from it (loom.gpt{init=}).
-- Their validation losses and samples must agree bit for bit.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
local opts = {}
for _, kv in ipairs(loom.overrides()) do opts[kv[1]] = kv[2] end
assert(opts.ckpt and opts.bin, "usage: loom run llmc_roundtrip.lua ckpt=DIR bin=FILE")

local batch = { micro = 4, seq = 32 }
local optimizer = { "adamw", lr = 1e-2, weight_decay = 0.1 }
local from_ckpt = loom.session { model = common.model(), batch = batch, optimizer = optimizer }
from_ckpt:load(opts.ckpt)
local from_llmc = loom.session { model = loom.gpt { init = opts.bin }, batch = batch, optimizer = optimizer }
local data = loom.open_data(common.data())

local a, b = from_ckpt:eval(data, 4), from_llmc:eval(data, 4)
print(string.format("val loss: checkpoint %a, llm.c file %a", a, b))
assert(a == b, "losses differ")
local sa = from_ckpt:sample("KING", 64, 0.9, 20, 3)
local sb = from_llmc:sample("KING", 64, 0.9, 20, 3)
assert(sa == sb, "samples differ")
print("ROUNDTRIP OK")
