#!/usr/bin/env bash
# train.sh LOOM — end-to-end training checks on the small model:
#  - the loss falls over 20 steps;
#  - the same recipe and seed run twice give bitwise-identical losses;
#  - micro=4 with 2 accumulation steps equals micro=8 within 2e-5 (one global token sum);
#  - sgd works as well as adamw (one word in the recipe).
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$loom" run "$recipe" > "$tmp/a"
"$loom" run "$recipe" > "$tmp/b"
grep '^LOSS' "$tmp/a" > "$tmp/a.l"; grep '^LOSS' "$tmp/b" > "$tmp/b.l"
[[ $(wc -l < "$tmp/a.l") -eq 20 ]] || { echo "expected 20 loss lines"; cat "$tmp/a"; exit 1; }
cmp -s "$tmp/a.l" "$tmp/b.l" || { echo "same seed, different losses:"; diff "$tmp/a.l" "$tmp/b.l"; exit 1; }
first=$(awk 'NR==1 {print $4}' "$tmp/a.l"); last=$(awk 'END {print $4}' "$tmp/a.l")
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 0.5) }' ||
  { echo "loss did not fall enough: $first -> $last"; exit 1; }
echo "loss $first -> $last; two runs bitwise identical"

"$loom" run "$recipe" batch.micro=8 | grep '^LOSS' > "$tmp/big"
"$loom" run "$recipe" batch.micro=4 batch.global=8 | grep '^LOSS' > "$tmp/accum"
d=$(max_loss_diff "$tmp/big" "$tmp/accum")
echo "micro=8 vs micro=4 x accum 2: max |loss diff| $d"
below "$d" 2e-5

"$loom" run "$recipe" 'optimizer={"sgd", lr=0.5, momentum=0.9}' | grep '^LOSS' > "$tmp/sgd"
first=$(awk 'NR==1 {print $4}' "$tmp/sgd"); last=$(awk 'END {print $4}' "$tmp/sgd")
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 0.3) }' ||
  { echo "sgd loss did not fall: $first -> $last"; exit 1; }
echo "sgd: loss $first -> $last"
