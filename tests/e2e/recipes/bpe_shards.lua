-- bpe_shards.lua (BPE_OUT=DIR) — one llm.c token shard (DIR/train_000000.bin) of 4000 tokens over
-- the 27-token vocabulary of tests/fixtures/bpe, for training a model that decodes
-- through that tokenizer.
local out = assert(os.getenv("BPE_OUT"), "set BPE_OUT=DIR")
local n, toks = 4000, {}
for i = 1, n do toks[i] = string.pack("<I2", (i * 7 + i // 5) % 27) end
local f = assert(io.open(out .. "/train_000000.bin", "wb"))
f:write(string.pack("<i4i4i4", 20240520, 1, n), string.rep("\0", 1024 - 12), table.concat(toks))
f:close()
