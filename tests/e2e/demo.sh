#!/usr/bin/env bash
# demo.sh LOOM RECIPE — the bundled demo (scripts/recipes/tiny_shakespeare.lua) for a few
# steps: it exits 0, every step's loss is finite and the last is below the first (by 0.1:
# 4 steps of warm-up take 5.56 to 5.23), the validation loss is finite, and it prints a
# sample of the 500 tokens (bytes) asked for after the prompt.
set -euo pipefail
loom=$1 recipe=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$loom" run "$recipe" steps=4 eval.every=4 eval.batches=2 log.every=1 > "$tmp/out"
# "step 3/4 | loss 5.3608 | ..." (plain lines into a pipe) as LOSS lines for lib.sh
sed -n 's/^step \([0-9]*\)\/4 | loss \([^ ]*\) .*/LOSS \1 - \2/p' "$tmp/out" > "$tmp/losses"
[[ $(wc -l < "$tmp/losses") -eq 4 ]] || { echo "expected 4 step lines:"; cat "$tmp/out"; exit 1; }
fell=$(loss_fell "$tmp/losses" 0.1) || { echo "the demo's loss did not fall: $fell"; cat "$tmp/out"; exit 1; }
val=$(sed -n 's/^trained: .*, val loss \(.*\)$/\1/p' "$tmp/out")
finite "$val" || { echo "no finite validation loss: '$val'"; cat "$tmp/out"; exit 1; }
sed '1,/^---- sample ----$/d' "$tmp/out" > "$tmp/sample"
head -c 7 "$tmp/sample" | cmp -s - <(printf 'ROMEO:\n') || { echo "the sample does not start with the prompt"; cat "$tmp/out"; exit 1; }
bytes=$(wc -c < "$tmp/sample")
(( bytes >= 7 + 500 )) || { echo "sample of $bytes bytes, want the prompt and 500 tokens"; cat "$tmp/out"; exit 1; }
echo "ok demo: loss $fell over 4 steps, val loss $val, a sample of $((bytes - 7)) bytes after the prompt"
