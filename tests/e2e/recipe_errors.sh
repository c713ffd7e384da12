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
# Overrides of keys that loom.train checks after the recipe built them (a schedule table,
# pipeline-only keys, the communicator on one rank): each refused before any work, naming
# the recipe's file:line and the command-line value.
for case in "lr.foo=1|unknown key 'lr.foo' (from the command line: lr.foo=1) (accepted: kind, min, total, warmup)" \
            "lr.kind=linear|lr.kind=linear (from the command line: lr.kind=linear) is not a schedule (accepted: constant, cosine" \
            "lr.warmup=-3|lr.warmup=-3 (from the command line: lr.warmup=-3) must be >= 0" \
            "lr.min=5|lr.min=5 (from the command line: lr.min=5) must be <= 1" \
            "lr.warmup=x|lr.warmup (from the command line: lr.warmup=x) must be integer, got string x" \
            "lr.warmup=30|lr.warmup=30 (from the command line: lr.warmup=30) is past lr.total=20" \
            "schedule=1f1b|schedule=1f1b (from the command line: schedule=1f1b) sets up the pipeline, and this run has no pipeline (mesh.pp = 1)" \
            "microbatches=4|microbatches=4 (from the command line: microbatches=4) sets up the pipeline, and this run has no pipeline (mesh.pp = 1)" \
            "comm=foo|comm=foo (from the command line: comm=foo): no comm plugin 'foo'"; do
  n=$((n + 1))
  kv=${case%%|*}; expect="losses.lua:6: ${case#*|}"
  out=$("$loom" run "$here/recipes/losses.lua" "$kv" 2>&1); rc=$?
  if [[ $rc -eq 0 ]] || grep -q '^LOSS' <<<"$out"; then
    echo "FAIL $kv: accepted (exit $rc)"; fails=$((fails + 1))
  elif ! grep -qF -- "$expect" <<<"$out"; then
    echo "FAIL $kv: expected '$expect'"; echo "  got: $out"; fails=$((fails + 1))
  else
    echo "ok   $kv: $(grep -F -- "$expect" <<<"$out" | head -1 | cut -c1-160)"
  fi
done
echo "$((n + 1 - fails)) passed, $fails failed"
[[ $fails -eq 0 ]]
