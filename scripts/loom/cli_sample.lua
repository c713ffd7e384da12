-- loom.cli_sample — `loom sample CKPT --prompt TEXT [--tokens N] ...`: generate from a
-- checkpoint. The session is built by loom.cli's open_checkpoint (what `loom export` uses);
-- the text goes through loom.sample (key/value cache, GPT-2 tokenizer). The sample is
-- printed to stdout; progress (on a terminal) and a closing "N tokens in X s" line go to
-- stderr, so `loom sample ... > out.txt` keeps only the text.
-- The tokenizer of a GPT-2 BPE model: --tokenizer DIR, else the directory of the shards the
-- checkpoint's recipe trained on (its manifest records the recipe), when it holds
-- encoder.json. A byte-level model (vocab 256) needs none.
local loom = require "loom"
local core = require "loom.core"

-- (its --help text is loom.help's "sample" entry: cli.c routes every -h/--help there)

local options = { -- name -> field, kind
  ["--prompt"] = { "prompt", "string" }, ["--prompt-ids"] = { "ids", "ids" },
  ["--tokens"] = { "tokens", "count" }, ["--temperature"] = { "temperature", "positive" },
  ["--top-k"] = { "top_k", "count" }, ["--seed"] = { "seed", "count" },
  ["--tokenizer"] = { "tokenizer", "string" }, ["--no-cache"] = { "no_cache", "flag" },
  ["--shift"] = { "shift", "flag" },
}

local function fail(fmt, ...)
  error("sample: " .. string.format(fmt, ...) .. "\n(loom sample --help lists the options)", 0)
end

local function parse(args)
  local o, i = {}, 1
  while i <= #args do
    local a = args[i]
    local name, inline = a:match("^(%-%-[%w-]+)=(.*)$")
    name = name or a
    local opt = options[name]
    if opt then
      local field, kind = opt[1], opt[2]
      if kind == "flag" then
        o[field] = true
      else
        local v = inline or args[i + 1]
        if not v then fail("%s needs a value", name) end
        if not inline then i = i + 1 end
        if kind == "count" then
          local n = math.tointeger(tonumber(v))
          if not n or n < 0 then fail("%s must be an integer >= 0, got '%s'", name, v) end
          v = n
        elseif kind == "positive" then
          local n = tonumber(v)
          if not n or not (n > 0) then fail("%s must be a number > 0, got '%s'", name, v) end
          v = n
        elseif kind == "ids" then
          local ids = {}
          for id in (v .. ","):gmatch("([^,]*),") do
            ids[#ids + 1] = math.tointeger(tonumber(id)) or fail("--prompt-ids: '%s' is not a token id", id)
          end
          v = ids
        end
        o[field] = v
      end
    elseif a:sub(1, 1) == "-" then
      fail("unknown option '%s'", a)
    elseif o.ckpt then
      fail("one checkpoint at a time (got '%s' and '%s')", o.ckpt, a)
    else
      o.ckpt = a
    end
    i = i + 1
  end
  return o
end

-- Progress on stderr: redrawn in place on a terminal (at most 4 times a second).
local function progress_printer(t0)
  if not core.isatty(2) then return nil end
  local last = -1
  return function(done, total)
    local now = core.now()
    if now - last < 0.25 and done < total then return end
    last = now
    local s = now - t0
    io.stderr:write(string.format("\rsample: %d/%d tokens, %.1f tok/s ", done, total,
      s > 0 and done / s or 0))
    if done == total then io.stderr:write("\r\27[K") end
  end
end

return function(args, open_checkpoint)
  local o = parse(args)
  if not o.ckpt then fail("which checkpoint? (loom sample CKPT --prompt TEXT)") end
  if (o.prompt ~= nil) == (o.ids ~= nil) then fail("give the prompt: --prompt TEXT or --prompt-ids IDS") end
  if o.prompt == "" then fail("--prompt is empty") end
  local session, manifest = open_checkpoint(o.ckpt, "sample")
  local vocab = manifest.model.vocab
  local tok = o.tokenizer
  if not tok and vocab ~= 256 then
    tok = loom.tokenizer_dir((manifest.config or {}).data)
  end
  if tok then
    local why
    tok, why = loom.tokenizer(tok)
    if not tok then fail("%s", why) end
  elseif vocab ~= 256 and o.prompt then
    fail("the model's vocabulary is %d tokens (not bytes) and no tokenizer was found beside "
      .. "its training shards: give --tokenizer DIR (encoder.json and vocab.bpe, as "
      .. "prepare-text --gpt2 writes them) or the prompt as --prompt-ids", vocab)
  end
  local n = o.tokens or 200
  local t0 = core.now()
  local ok, out = pcall(loom.sample, {
    session = session, prompt = o.ids or o.prompt, tokens = n, temperature = o.temperature,
    top_k = o.top_k, seed = o.seed, tokenizer = tok, cache = not o.no_cache,
    progress = progress_printer(t0), window = o.shift and "shift" or nil,
  })
  if not ok then error("sample: " .. tostring(out), 0) end
  local s = core.now() - t0
  if type(out) == "table" then out = table.concat(out, " ") end
  io.stdout:write(out, "\n")
  io.stdout:flush()
  io.stderr:write(string.format("sample: %d tokens in %.2f s (%.1f tok/s)%s\n", n, s,
    s > 0 and n / s or 0, o.no_cache and ", no cache" or ""))
  session:close()
end
