#!/usr/bin/env bash
# resume_auto.sh LOOM — resume=auto has one policy: walk back from the newest checkpoint to
# the newest intact one, saying what was skipped and why, for incomplete ones (a save cut
# short: no manifest, a missing or short file) and damaged ones (a checksum that fails)
# alike; the resumed losses are the uninterrupted run's bit for bit. When none is intact
# the run is refused (naming each), never restarted from step 1.
set -uo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# flip one byte in the middle of a file (same size: only the checksum can tell)
flip() { local n; n=$(stat -c %s "$1"); printf '\x5a' | dd of="$1" bs=1 seek=$((n / 2)) conv=notrunc status=none; }

"$loom" run "$recipe" steps=20 | grep '^LOSS' > "$tmp/full"
finite_losses "$tmp/full"
"$loom" run "$recipe" steps=15 checkpoint.dir="$tmp/ck" checkpoint.every=5 > /dev/null || fail "the first run failed"

case_() { # name want-step expected-fragment... ; $tmp/$name is the damaged copy
  local name=$1 k=$2; shift 2
  "$loom" run "$recipe" steps=20 checkpoint.dir="$tmp/$name" resume=auto > "$tmp/$name.out" 2>&1 ||
    { cat "$tmp/$name.out"; fail "$name: resume failed"; }
  grep -q "resumed from .*step_0*$k at step $k" "$tmp/$name.out" || { cat "$tmp/$name.out"; fail "$name: not resumed at step $k"; }
  for want in "$@"; do
    grep -qF -- "$want" "$tmp/$name.out" || { cat "$tmp/$name.out"; fail "$name: no '$want'"; }
  done
  awk -v k="$k" '$2 > k' "$tmp/full" > "$tmp/$name.want"
  grep '^LOSS' "$tmp/$name.out" > "$tmp/$name.got"
  cmp -s "$tmp/$name.want" "$tmp/$name.got" || fail "$name: resumed losses differ from the uninterrupted run"
  echo "ok $name: $(grep -o 'resume=auto: skipped.*' "$tmp/$name.out" | cut -c1-220); steps $((k + 1))-20 bitwise"
}

cp -r "$tmp/ck" "$tmp/incomplete"; rm "$tmp/incomplete/step_00000015/manifest.json"
case_ incomplete 10 "resume=auto: skipped 1 checkpoint newer than step_00000010: step_00000015 (" "manifest.json"

cp -r "$tmp/ck" "$tmp/damaged"; flip "$tmp/damaged/step_00000015/model.safetensors"
case_ damaged 10 "resume=auto: skipped 1 checkpoint newer than step_00000010: step_00000015 (" "checksum"

cp -r "$tmp/ck" "$tmp/both"; truncate -s 100 "$tmp/both/step_00000015/optim.safetensors"
flip "$tmp/both/step_00000010/optim.safetensors"
case_ both 5 "resume=auto: skipped 2 checkpoints newer than step_00000005: step_00000015 (" "; step_00000010 ("

# every one damaged: refused, each named, no step trained
cp -r "$tmp/ck" "$tmp/none"
for s in 05 10 15; do flip "$tmp/none/step_000000$s/model.safetensors"; done
out=$("$loom" run "$recipe" steps=20 checkpoint.dir="$tmp/none" resume=auto 2>&1) && fail "none intact: accepted"
grep -q '^LOSS' <<<"$out" && fail "none intact: trained"
grep -qF "resume=auto: no intact checkpoint in '$tmp/none': step_00000015 (" <<<"$out" || fail "none intact: $out"
grep -qF "step_00000005 (" <<<"$out" || fail "none intact: the oldest not named: $out"
echo "ok none intact: refused naming all 3"
