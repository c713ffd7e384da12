-- formats_check.lua — copied by test_prepare_text.sh into FORMATS_DIR (which holds in.txt
-- and shards/ from prepare-text --bytes) and run there by `loom run` from another working
-- directory, so relative paths must resolve from the recipe's directory:
--  * loom.data.shards resolves a relative glob from the recipe's directory, and with one
--    unshuffled shard it trains bitwise like loom.data.text on the same file;
--  * loom.gpt{init = "m.bin"} takes its shape from the llm.c file and starts from its
--    weights; a shape the recipe gives that differs is refused naming the field;
--  * recipe mistakes in loom.data.shards are refused.
local loom = require "loom"
local core = loom.core
local dir = assert(os.getenv("FORMATS_DIR"), "FORMATS_DIR is not set")

local function expect_error(f, want)
  local ok, err = pcall(f)
  assert(not ok, "expected an error containing: " .. want)
  assert(tostring(err):find(want, 1, true),
    "error was: " .. tostring(err) .. "\nwanted: " .. want)
end

local model = loom.gpt { vocab = 256, ctx = 16, layers = 1, heads = 2, dim = 16 }
local function session(m, seed)
  return loom.session { model = m, batch = { micro = 2, seq = 16 },
    optimizer = { "adamw", lr = 1e-2 }, seed = seed, threads = 1 }
end

-- shards vs text: same train tokens, same batches, same losses bit for bit
local shards = loom.open_data(loom.data.shards { train = "shards/train_*.bin",
  val = "shards/val_*.bin" })
local text = loom.open_data(loom.data.text { path = dir .. "/in.txt", val_fraction = 0.1 })
assert(shards:size("train") == text:size("train"), "train sizes differ")
assert(shards:size("val") == text:size("val"), "val sizes differ")
assert(shards:vocab() == 65536)
local a, b = session(model, 3), session(model, 3)
for step = 1, 3 do
  local la, lb = a:step(shards, 1e-2).loss, b:step(text, 1e-2).loss
  assert(la == lb, string.format("step %d: shards loss %a, text loss %a", step, la, lb))
end
assert(a:eval(shards, 2) == b:eval(text, 2), "val losses differ")
local st = shards:state()
assert(st.kind == "shards" and #st == 8)

-- loom.gpt{init}: shape from the file, weights loaded by loom.session
local path = dir .. "/m.bin"
core.llmc_save(a, path)
local cfg = core.llmc_config(path)
assert(cfg.vocab == 256 and cfg.vocab_padded == 256 and cfg.ctx == 16 and cfg.layers == 1 and
  cfg.heads == 2 and cfg.dim == 16)
local from_file = loom.gpt { init = "m.bin" } -- relative: found next to the recipe
assert(from_file.layers == 1 and from_file.dim == 16 and from_file.init:find("m.bin", 1, true))
local c = session(from_file, 99) -- another seed: the file's weights must win
local sa = a:sample({ 1, 2, 3 }, 8, 1.0, 0, 7)
local sc = c:sample({ 1, 2, 3 }, 8, 1.0, 0, 7)
assert(table.concat(sa, ",") == table.concat(sc, ","), "the loaded model samples differently")
expect_error(function() loom.gpt { init = "m.bin", layers = 3 } end,
  "loom.gpt layers=3 differs from the llm.c model '")
expect_error(function() loom.gpt { init = "nope.bin" } end, "llm.c model file 'nope.bin' not found")
expect_error(function() loom.gpt { init = dir .. "/shards/train_000000.bin" } end,
  "has magic 20240520 in header[0]; an llm.c model file has 20240326")

-- recipe mistakes
expect_error(function() loom.data.shards { train = "x", shufle = true } end,
  "unknown key 'loom.data.shards.shufle'")
expect_error(function() loom.data.shards { val = "x" } end, "loom.data.shards needs key 'train'")
expect_error(function() loom.open_data(loom.data.shards { train = "none_*.bin" }) end,
  "train shard glob 'none_*.bin' matches no file")
print("formats_check: ok")
