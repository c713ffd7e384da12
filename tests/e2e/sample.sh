#!/usr/bin/env bash
# sample.sh LOOM FIXTURE_BPE — `loom sample` and the key/value cache end to end:
#   the command: --help (exit 0, options, an example), unknown options and a missing prompt
#   refused, the same text with and without the cache (window sliding or --shift past
#   ctx), the closing tokens/s line on stderr;
#   BPE: a model trained on shards with the fixture tokenizer beside them samples text
#   through it (found from the checkpoint's recipe, or given with --tokenizer), and without
#   one the command says what to give;
#   the cache under tensor parallelism: recipes/kv_sample.lua (tokens and a hash of the
#   logits, with and without the cache) on 1 rank, tp=2, and tp=2 in canonical mode.
set -euo pipefail
loom=$(realpath "$1") bpe=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$loom" run "$here/recipes/losses.lua" steps=2 checkpoint.dir="$tmp/ck" checkpoint.every=2 > /dev/null

"$loom" sample --help > "$tmp/help" || fail "--help exited $?"
for w in --prompt --tokens --temperature --top-k --seed --tokenizer --no-cache example:; do
  grep -q -- "$w" "$tmp/help" || fail "--help does not mention $w"
done
if "$loom" sample "$tmp/ck" --prompt x --bogus 2> "$tmp/err"; then fail "--bogus accepted"; fi
grep -q "unknown option '--bogus'" "$tmp/err" || fail "unexpected: $(cat "$tmp/err")"
if "$loom" sample "$tmp/ck" --tokens 5 2> "$tmp/err"; then fail "no prompt accepted"; fi
grep -q -- "--prompt TEXT" "$tmp/err" || fail "unexpected: $(cat "$tmp/err")"
if "$loom" sample "$tmp/ck" --prompt x --temperature 0 2> "$tmp/err"; then fail "temperature 0 accepted"; fi
grep -q "must be a number > 0" "$tmp/err" || fail "unexpected: $(cat "$tmp/err")"
echo "ok: --help, unknown options, a missing prompt and a bad temperature"

args=(--prompt "ROMEO:" --tokens 40 --temperature 0.9 --top-k 20 --seed 4)
"$loom" sample "$tmp/ck" "${args[@]}" > "$tmp/a" 2> "$tmp/a.err"
"$loom" sample "$tmp/ck" "${args[@]}" --no-cache > "$tmp/b" 2> "$tmp/b.err"
cmp -s "$tmp/a" "$tmp/b" || fail "the sample differs with --no-cache"
grep -q "^ROMEO:" "$tmp/a" || fail "the sample does not start with the prompt"
[[ $(wc -c < "$tmp/a") -eq 47 ]] || fail "expected 6 + 40 bytes and a newline, got $(wc -c < "$tmp/a")"
grep -qE "^sample: 40 tokens in [0-9.]+ s \([0-9.]+ tok/s\)$" "$tmp/a.err" ||
  fail "no closing line on stderr: $(cat "$tmp/a.err")"
"$loom" sample "$tmp/ck" "${args[@]}" --shift > "$tmp/c" 2> /dev/null
"$loom" sample "$tmp/ck" "${args[@]}" --shift --no-cache > "$tmp/d" 2> /dev/null
cmp -s "$tmp/c" "$tmp/d" || fail "the --shift sample differs with --no-cache"
echo "ok: the same 40 tokens with and without the cache (past ctx 32: sliding, --shift); $(cat "$tmp/a.err")"

# BPE through the fixture tokenizer (27 tokens, tests/fixtures/bpe)
mkdir -p "$tmp/shards"
BPE_OUT="$tmp/shards" "$loom" run "$here/recipes/bpe_shards.lua"
cp "$bpe/encoder.json" "$bpe/vocab.bpe" "$tmp/shards/"
(cd "$tmp" && BPE_SHARDS=shards BPE_CK=bck "$loom" run "$here/recipes/bpe_train.lua" > /dev/null)
(cd "$tmp" && "$loom" sample bck --prompt "Hello world" --tokens 30 --seed 1) > "$tmp/t" 2> /dev/null ||
  fail "BPE sample failed: $(cd "$tmp" && "$loom" sample bck --prompt "Hello world" --tokens 30 2>&1)"
grep -q "^Hello world" "$tmp/t" || fail "BPE sample does not start with the prompt: $(cat "$tmp/t")"
if grep -qE "[0-9]{2}" "$tmp/t"; then fail "BPE sample came back as ids: $(cat "$tmp/t")"; fi
rm "$tmp/shards/encoder.json"
if (cd "$tmp" && "$loom" sample bck --prompt "Hello" 2> "$tmp/err"); then fail "BPE without a tokenizer accepted"; fi
grep -q -- "--tokenizer DIR" "$tmp/err" || fail "unexpected: $(cat "$tmp/err")"
(cd "$tmp" && "$loom" sample bck --prompt "Hello world" --tokens 30 --seed 1 --tokenizer "$bpe") > "$tmp/t2" 2> /dev/null
cmp -s "$tmp/t" "$tmp/t2" || fail "--tokenizer gives another text"
echo "ok: BPE sample decoded to text: $(head -c 60 "$tmp/t" | tr '\n' ' ')"

"$loom" run "$here/recipes/kv_sample.lua" > "$tmp/one" || fail "kv_sample on one rank: $(cat "$tmp/one")"
grep -q "^KV same" "$tmp/one" || fail "kv_sample on one rank printed: $(cat "$tmp/one")"
"$loom" launch -n 2 "$here/recipes/kv_sample.lua" mesh.tp=2 comm_timeout=20 > "$tmp/tp" ||
  fail "kv_sample under tp=2: $(cat "$tmp/tp")"
grep -q "^KV same" "$tmp/tp" || fail "kv_sample under tp=2 printed: $(cat "$tmp/tp")"
"$loom" launch -n 2 "$here/recipes/kv_sample.lua" mesh.tp=2 deterministic=canonical comm_timeout=20 \
  > "$tmp/tpc" || fail "kv_sample under tp=2, canonical: $(cat "$tmp/tpc")"
grep -q "^KV same" "$tmp/tpc" || fail "kv_sample under tp=2, canonical printed: $(cat "$tmp/tpc")"
echo "ok: cached and recomputed samples agree (tokens and logits bits) on one rank, tp=2, tp=2 canonical"
