#!/usr/bin/env bash
# resume.sh LOOM — exact resume: train N steps straight, or k steps + save + resume, and
# the losses of the steps after k are identical bit for bit. Cases: a stop right where the
# lr warm-up ends (k=3), a stop mid-schedule (k=10), and both with gradient accumulation.
# Then a damaged checkpoint is refused naming the file.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

check() { # name k extra-args...
  local name=$1 k=$2; shift 2
  "$loom" run "$recipe" steps=20 "$@" | grep '^LOSS' > "$tmp/$name.full"
  finite_losses "$tmp/$name.full"   # the resumed run is compared with it bit for bit
  "$loom" run "$recipe" steps=$k checkpoint.dir="$tmp/$name.ck" checkpoint.every=5 "$@" > /dev/null
  "$loom" run "$recipe" steps=20 checkpoint.dir="$tmp/$name.ck" resume=auto "$@" > "$tmp/$name.out"
  grep -q "resumed from .*step_0*$k at step $k" "$tmp/$name.out" ||
    { echo "$name: did not resume at step $k"; cat "$tmp/$name.out"; exit 1; }
  awk -v k="$k" '$2 > k' "$tmp/$name.full" > "$tmp/$name.want"
  grep '^LOSS' "$tmp/$name.out" > "$tmp/$name.got"
  [[ $(wc -l < "$tmp/$name.got") -eq $((20 - k)) ]] || { echo "$name: wrong step count"; exit 1; }
  cmp -s "$tmp/$name.want" "$tmp/$name.got" ||
    { echo "$name: resumed losses differ:"; diff "$tmp/$name.want" "$tmp/$name.got"; exit 1; }
  echo "ok $name: steps $((k + 1))-20 bitwise identical after resume at $k"
}
check warmup_end 3
check mid 10
check accum_warmup_end 3 batch.micro=2 batch.global=4
check accum_mid 10 batch.micro=2 batch.global=4
check sgd_momentum 7 'optimizer={"sgd", lr=0.5, momentum=0.9}'
check shuffled_text 6 data.shuffle=true data.seed=9

# A truncated weight file: the resume is refused naming the file, no training happens.
ck=$(ls -d "$tmp"/mid.ck/step_* | tail -1)
truncate -s 100 "$ck/model.safetensors"
rm -f "$tmp/mid.ck/latest"   # also exercise finding the newest complete one without the marker
if out=$("$loom" run "$recipe" steps=20 checkpoint.dir="$tmp/mid.ck" resume="$ck" 2>&1); then
  echo "damaged checkpoint accepted"; exit 1
fi
grep -q "model.safetensors" <<<"$out" || { echo "refusal does not name the file: $out"; exit 1; }
grep -q '^LOSS' <<<"$out" && { echo "trained before refusing"; exit 1; }
echo "ok damaged checkpoint refused: $(grep -o 'cannot resume.*' <<<"$out" | head -1)"
