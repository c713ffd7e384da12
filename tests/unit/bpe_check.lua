-- bpe_check.lua — loom.bpe against the hand-written tokenizer in tests/fixtures/bpe (27
-- tokens: letters, "Ġ" = a leading space, "Ċ" = a newline, the byte tokens "Ã" (0xC3) and
-- "©" (0xA9) that together are "é", merges H e / l l / He ll / Hell o / Ġ w / o r / Ã ©).
-- Run by meson: loom run bpe_check.lua, with BPE_FIXTURE=tests/fixtures/bpe. No network.
local loom = require "loom"
local bpe = require "loom.bpe"
local dir = assert(os.getenv("BPE_FIXTURE"), "set BPE_FIXTURE")
local tok = assert(bpe.load(dir))
local function ids(t) return table.concat(t, " ") end
local function eq(got, want, what)
  if got ~= want then error(string.format("%s: got %q, want %q", what, got, want), 2) end
end

-- decoding: the byte alphabet back to bytes
eq(tok:decode({ 19, 17, 18, 3, 8, 9 }), "Hello world\n", "decode Hello world")
eq(tok:decode({ 5, 6 }), " w", "decode Ġ w")
eq(tok:decode({ 15 }), "\xc3\xa9", "decode the merged byte token (é)")
eq(tok:decode({ 13 }), "\xc3", "decode a lone byte token (half of é)")
eq(tok:decode({ 16 }), "<|endoftext|>", "decode <|endoftext|>")
eq(tok:decode({ 99 }), "<|99|>", "decode an id the file lacks")
-- encoding: merges lowest rank first, a leading space joins the word after it
eq(ids(tok:encode("Hello world")), "19 17 18 3 8", "encode Hello world")
eq(ids(tok:encode("Hell")), "12", "encode Hell")
eq(ids(tok:encode("\xc3\xa9")), "15", "encode é")
eq(ids(tok:encode("He\n\nw")), "10 9 9 6", "encode newlines")
eq(tok:decode(tok:encode("fix tin\n wind doe!")), "fix tin\n wind doe!", "round trip")
-- refusals name the file and the problem
local ok, err = pcall(tok.encode, tok, "\xff")
assert(not ok and err:match("not valid UTF%-8"), err)
ok, err = pcall(tok.encode, tok, "q")
assert(not ok and err:match("has no token \"q\""), err)
local none, why = bpe.load(dir .. "/missing")
assert(not none and why:match("no GPT%-2 tokenizer"), why)
local tmp = os.tmpname()
local f = assert(io.open(tmp, "w")); f:write('{"a": 0, "\\u0800": 1}'); f:close()
none, why = bpe.load(tmp .. "")
assert(not none, "a tokenizer outside the byte alphabet was accepted")
os.remove(tmp)
-- through loom.tokenizer and loom.tokenizer_dir
assert(loom.tokenizer(dir) == loom.tokenizer(dir), "loom.tokenizer loads once per path")
eq(loom.tokenizer_dir({ kind = "shards", train = dir .. "/train_*.bin" }), dir, "tokenizer_dir")
assert(loom.tokenizer_dir({ kind = "text", path = "x" }) == nil)
print("bpe: decode, encode and refusals as expected")
