-- loom.bpe — GPT-2 byte-level BPE decoding: token ids back to text, from the encoder.json
-- that scripts/prepare-text --gpt2 keeps beside the shards (Radford et al. 2019; OpenAI's
-- gpt-2 src/encoder.py, whose bytes_to_unicode this mirrors).
--
-- encoder.json maps each token's string to its id. The strings are written in GPT-2's
-- byte alphabet: every byte is one unicode character — bytes 33-126, 161-172 and 174-255
-- stand for themselves, the other 68 (controls, space, 127-160, 173) for U+0100 onwards
-- in byte order (so a leading space is "Ġ", U+0120). Decoding an id: its string, each
-- character back to its byte. The result is bytes; a sample cut mid-character is not
-- valid UTF-8 at its end, which is what the model produced.
-- Encoding (for a prompt) applies vocab.bpe's merges, lowest rank first, to each piece of
-- GPT-2's pre-tokenizer (encoder.py's pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
-- ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+). Lua has no unicode classes, so here a letter is an ASCII
-- letter or any non-ASCII character, a number an ASCII digit, a space ASCII whitespace:
-- exact for ASCII text (what a prompt usually is); non-ASCII punctuation, digits and
-- spaces may split differently from GPT-2's (the ids still decode to the same text).
local json = require "loom.json"
local bpe = {}

-- bytes_to_unicode's inverse: code point -> byte.
local function byte_decoder()
  local dec, n = {}, 0
  for b = 0, 255 do
    if (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or (b >= 174 and b <= 255) then
      dec[b] = b
    else
      dec[256 + n] = b
      n = n + 1
    end
  end
  return dec
end

-- The byte alphabet itself: byte (a one-byte string) -> its character (UTF-8).
local function byte_encoder()
  local enc = {}
  for cp, b in pairs(byte_decoder()) do enc[string.char(b)] = utf8.char(cp) end
  return enc
end

local Decoder = {}
Decoder.__index = Decoder

-- bpe.load(path) -> decoder, or nil and why. path: an encoder.json, or a directory that
-- holds one (a shard directory written by prepare-text --gpt2).
function bpe.load(path)
  local file = path:match("%.json$") and path or (path .. "/encoder.json")
  local f = io.open(file, "rb")
  if not f then return nil, "no GPT-2 tokenizer (" .. file .. ")" end
  local text = f:read("a")
  f:close()
  local ok, enc = pcall(json.decode, text)
  if not ok or type(enc) ~= "table" then
    return nil, file .. " is not a JSON object of token strings to ids"
  end
  local dec, pieces = byte_decoder(), {}
  for s, id in pairs(enc) do
    if math.type(id) ~= "integer" or id < 0 then
      return nil, string.format("%s: token %q has id %s (a non-negative integer expected)",
        file, s, tostring(id))
    end
    local bytes = {}
    for _, cp in utf8.codes(s) do
      local b = dec[cp]
      if not b then
        return nil, string.format("%s: token %q has character U+%04X, outside GPT-2's byte "
          .. "alphabet", file, s, cp)
      end
      bytes[#bytes + 1] = string.char(b)
    end
    pieces[id] = table.concat(bytes)
  end
  return setmetatable({ pieces = pieces, file = file, ids = enc,
    merges_file = file:gsub("encoder%.json$", "vocab.bpe") }, Decoder)
end

-- decoder:decode(ids) -> bytes. An id the file does not have is written as <|id|>.
function Decoder:decode(ids)
  local out = {}
  for i = 1, #ids do
    out[i] = self.pieces[ids[i]] or string.format("<|%d|>", ids[i])
  end
  return table.concat(out)
end

-- vocab.bpe: "#version" then one merge "a b" a line, in rank order.
local function load_ranks(self)
  if self.ranks then return self.ranks end
  local f = io.open(self.merges_file, "rb")
  if not f then error("no " .. self.merges_file .. " to encode with (it lies beside "
    .. "encoder.json where prepare-text --gpt2 wrote the shards)", 0) end
  local ranks, n = {}, 0
  for line in f:lines() do
    local a, b = line:match("^(%S+) (%S+)$")
    if a and not line:match("^#version") then
      ranks[a .. " " .. b] = n
      n = n + 1
    end
  end
  f:close()
  self.ranks, self.cache, self.benc = ranks, {}, byte_encoder()
  return ranks
end

-- The BPE of one piece (already in the byte alphabet): ids.
local function bpe_piece(self, piece)
  local hit = self.cache[piece]
  if hit then return hit end
  local ranks, word = self.ranks, {}
  for _, cp in utf8.codes(piece) do word[#word + 1] = utf8.char(cp) end
  while #word > 1 do
    local best, at = math.huge, nil
    for i = 1, #word - 1 do
      local r = ranks[word[i] .. " " .. word[i + 1]]
      if r and r < best then best, at = r, i end
    end
    if not at then break end
    -- merge every occurrence of the pair, left to right (encoder.py's loop)
    local a, b, out, i = word[at], word[at + 1], {}, 1
    while i <= #word do
      if i < #word and word[i] == a and word[i + 1] == b then
        out[#out + 1] = a .. b
        i = i + 2
      else
        out[#out + 1] = word[i]
        i = i + 1
      end
    end
    word = out
  end
  local ids = {}
  for i, w in ipairs(word) do
    ids[i] = self.ids[w] or error(string.format("%s has no token %q", self.file, w), 0)
  end
  self.cache[piece] = ids
  return ids
end

-- Character classes of the pre-tokenizer (see the opening comment).
local function class(c)
  if c:match("^%a$") or #c > 1 then return "L" end
  if c:match("^%d$") then return "N" end
  if c:match("^%s$") then return "S" end
  return "P"
end

-- GPT-2's pre-tokenizer over the characters of text: the pieces, in order.
local function pieces_of(text)
  local ch = {}
  for _, cp in utf8.codes(text) do ch[#ch + 1] = utf8.char(cp) end
  local out, i, n = {}, 1, #ch
  local function run(j, cls) -- end of the run of class cls starting at j
    while j <= n and class(ch[j]) == cls do j = j + 1 end
    return j
  end
  while i <= n do
    local c, j = ch[i], nil
    if c == "'" then
      local two, three = (ch[i + 1] or ""), (ch[i + 1] or "") .. (ch[i + 2] or "")
      if two == "s" or two == "t" or two == "m" or two == "d" then j = i + 2
      elseif three == "re" or three == "ve" or three == "ll" then j = i + 3 end
    end
    if not j then
      local k = (c == " " and i < n and class(ch[i + 1]) ~= "S") and i + 1 or i
      local cls = class(ch[k])
      if cls ~= "S" then
        j = run(k + 1, cls)
      else -- whitespace: \s+(?!\S) leaves the last space to lead the next piece
        j = run(i, "S")
        if j <= n and j - i > 1 then j = j - 1 end
      end
    end
    out[#out + 1] = table.concat(ch, "", i, j - 1)
    i = j
  end
  return out
end

-- decoder:encode(text) -> ids (needs vocab.bpe beside encoder.json).
function Decoder:encode(text)
  if not utf8.len(text) then error("the prompt is not valid UTF-8", 0) end
  load_ranks(self)
  local ids = {}
  for _, piece in ipairs(pieces_of(text)) do
    local mapped = piece:gsub(".", self.benc)
    for _, id in ipairs(bpe_piece(self, mapped)) do ids[#ids + 1] = id end
  end
  return ids
end

return bpe
