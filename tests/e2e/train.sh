#!/usr/bin/env bash
# train.sh LOOM — end-to-end training checks on the small model:
#  - the loss falls over 20 steps, every loss finite (lib.sh refuses nan/inf);
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
fell=$(loss_fell "$tmp/a.l" 0.5) || { echo "loss did not fall enough: $fell"; exit 1; }
echo "loss $fell; two runs bitwise identical"

"$loom" run "$recipe" batch.micro=8 | grep '^LOSS' > "$tmp/big"
"$loom" run "$recipe" batch.micro=4 batch.global=8 | grep '^LOSS' > "$tmp/accum"
d=$(max_loss_diff "$tmp/big" "$tmp/accum")
echo "micro=8 vs micro=4 x accum 2: max |loss diff| $d"
below "$d" 2e-5

"$loom" run "$recipe" 'optimizer={"sgd", lr=0.5, momentum=0.9}' | grep '^LOSS' > "$tmp/sgd"
fell=$(loss_fell "$tmp/sgd" 0.3) || { echo "sgd loss did not fall: $fell"; exit 1; }
echo "sgd: loss $fell"
