#!/usr/bin/env bash
# recipe_errors.sh LOOM — every recipe in bad/ must be refused before any training, with
# the message its first line expects (file:line: what is wrong and what would be right).
set -uo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
fails=0 n=0
for r in "$here"/bad/*.lua; do
  n=$((n + 1))
  expect=$(sed -n '1s/^-- expect: //p' "$r")
  out=$("$loom" run "$r" 2>&1); rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "FAIL $(basename "$r"): exited 0"; fails=$((fails + 1))
  elif grep -q '^step ' <<<"$out"; then
    echo "FAIL $(basename "$r"): trained before refusing"; fails=$((fails + 1))
  elif ! grep -qF -- "$expect" <<<"$out"; then
    echo "FAIL $(basename "$r"): expected '$expect'"; echo "  got: $out"; fails=$((fails + 1))
  else
    echo "ok   $(basename "$r"): $(grep -F -- "$expect" <<<"$out" | head -1)"
  fi
done
# A malformed override is refused too.
out=$("$loom" run "$here/recipes/losses.lua" steps 2>&1) && { echo "FAIL: override without '=' accepted"; fails=$((fails + 1)); }
grep -qF "'steps' is not a key=value override" <<<"$out" || { echo "FAIL override message: $out"; fails=$((fails + 1)); }
echo "$((n + 1 - fails)) passed, $fails failed"
[[ $fails -eq 0 ]]
